"""Recorded Kubernetes API server responses served over real HTTP to the official client (tests/bots/kubernetes_api/).

Each route (verb and path) has its responses in order; the last one repeats for polls. Every request is kept with
its query, content type and JSON body, so a test asserts what the bot asked of the API server. A request no route
expects is answered 500 and kept in `unexpected`.
"""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

RECORDED = Path(__file__).resolve().parent / "kubernetes_api"


def recorded(name: str) -> dict:
    return json.loads((RECORDED / name).read_text())


class RecordedApi:
    def __init__(self):
        self.routes: dict[tuple[str, str], list[tuple[int, dict]]] = {}
        self.requests: list[dict] = []
        self.unexpected: list[dict] = []
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                seen = {"method": self.command, "path": url.path, "query": parse_qs(url.query),
                        "content_type": self.headers.get("Content-Type"),
                        "body": json.loads(raw) if raw else None}
                with api._lock:
                    api.requests.append(seen)
                    queue = api.routes.get((self.command, url.path))
                    if not queue:
                        api.unexpected.append(seen)
                        status, body = 500, {"kind": "Status", "status": "Failure", "code": 500,
                                             "message": f"no recorded answer for {self.command} {url.path}"}
                    else:
                        status, body = queue.pop(0) if len(queue) > 1 else queue[0]
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def on(self, method: str, path: str, *answers: tuple[int, dict]) -> RecordedApi:
        self.routes[(method, path)] = [(status, copy.deepcopy(body)) for status, body in answers]
        return self

    def asked(self, method: str, path_part: str = "") -> list[dict]:
        return [r for r in self.requests if r["method"] == method and path_part in r["path"]]

    def __enter__(self) -> RecordedApi:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
