"""The project's local ClickHouse server: the engine of the installed chdb-core (ClickHouse 26.9) serving ClickHouse's
own HTTP and native protocols on loopback, its config, data, log and role passwords under data_dir/clickhouse/.

Any ClickHouse client reaches it as it would a production server (clickhouse-connect, curl, Grafana's plugin,
clickhouse-client on the native port). Users come from its config.xml, written at each start from the settings:
`fleetpulse_writer` (the sink: select, insert, and deleting a recreated topic's watermark), `fleetpulse_owner` (DDL
and migrations) and `fleetpulse_analyst` (read-only, with the settings' limits on time, result size and memory as
constraints ClickHouse enforces; no table function that reads outside the store). Each role's password is the
setting's where one is set, else made at the first start and kept in passwords/<role> (mode 0600), where every
fleetpulse process on the machine reads it. `default` is the user chdb logs in as inside the server's own process: it
keeps no password (chdb offers none) and may only start the listeners.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from core.clickhouse import ROLES, QueryLimits
from core.errors import StoreError
from core.settings import CommonSettings
from fleetpulse.local_process import LocalProcess, listening, log_tail


@dataclass(frozen=True)
class Quota:
    """A cap on one role's inserts per interval (ClickHouse answers QUOTA_EXCEEDED past it)."""

    role: str
    interval_s: int
    inserts: int


GRANTS = {
    "writer": ["SELECT, INSERT ON *.*", "ALTER DELETE ON *.*"],
    "owner": ["SELECT, INSERT, ALTER, CREATE DATABASE, CREATE TABLE, CREATE VIEW, DROP DATABASE, DROP TABLE, "
              "DROP VIEW, TRUNCATE, OPTIMIZE, SHOW, SYSTEM MERGES, SYSTEM SYNC REPLICA ON *.*",
              "TABLE ENGINE ON *", "REMOTE ON *.*"],
    "analyst": ["SELECT, SHOW ON *.*"],
}


class LocalClickHouse(LocalProcess):
    """One server process whose config, data and log live under `home`."""

    def __init__(self, home: Path, http_port: int = 18123, tcp_port: int = 19000,
                 users: dict[str, tuple[str, str | None]] | None = None, limits: QueryLimits = QueryLimits(),
                 quotas: tuple[Quota, ...] = (), extra_config: str = "", database: str = "fleetpulse"):
        self.home = Path(home).resolve()
        self.http_port, self.tcp_port = http_port, tcp_port
        self.users = users or {role: (f"fleetpulse_{role}", None) for role in ROLES}
        self.limits = limits
        self.quotas = quotas
        self.extra_config = extra_config  # more server config, e.g. a cluster's remote_servers
        self.database = database  # made at start, and every role's own: a client that names none lands there
        self.config = self.home / "config.xml"
        self.data = self.home / "data"
        self.pid_file = self.home / "server.pid"
        self.log_file = self.home / "server.log"
        self.url = f"http://127.0.0.1:{http_port}"
        self._proc: subprocess.Popen | None = None

    @classmethod
    def of(cls, settings: CommonSettings, **more) -> LocalClickHouse:
        users = {}
        for role in ROLES:  # the users the settings name (the local server's own names by default); a password set
            secret = getattr(settings, f"clickhouse_{role}_password")  # there, else made at the first start
            users[role] = (settings.clickhouse_credentials(role)[0],
                           secret.get_secret_value() if secret is not None else None)
        return cls(settings.local_clickhouse_home, settings.local_clickhouse_http_port,
                   settings.local_clickhouse_tcp_port, users, QueryLimits.of(settings),
                   database=settings.clickhouse_database, **more)

    def password(self, role: str) -> str:
        """The role's password: the one set, else the one kept under passwords/ (made once, mode 0600)."""
        given = self.users[role][1]
        if given is not None:
            return given
        path = self.home / "passwords" / role
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(18) + "\n")
        return path.read_text().strip()

    def start(self, timeout: float = 60) -> str:
        """Start the server (or find ours running), wait for a query round trip as every role; its HTTP URL."""
        with self._locked():
            pid = self._running_pid()
            if pid is None:
                self._launch()
            elif self._read_pid_file().get("http_port") != self.http_port:
                raise StoreError(f"the ClickHouse server of {self.home} already runs (pid {pid}) on other ports; "
                                 "stop it first (fleetpulse clickhouse stop)")
            return self._ready(timeout)

    def status(self) -> dict:
        pid = self._running_pid()
        version = self._round_trip("owner", 5) if pid is not None else None
        return {"running": pid is not None, "pid": pid, "ready": version is not None, "version": version,
                "http": self.url, "native": f"127.0.0.1:{self.tcp_port}", "home": str(self.home),
                "users": {role: user for role, (user, _) in self.users.items()},
                "passwords": {role: str(self.home / "passwords" / role) for role, (_, given) in self.users.items()
                              if given is None}}

    # -- the process ---------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self):
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one starter per home, across processes
            yield

    def _launch(self) -> None:
        for port, name in ((self.http_port, "FLEETPULSE_LOCAL_CLICKHOUSE_HTTP_PORT"),
                           (self.tcp_port, "FLEETPULSE_LOCAL_CLICKHOUSE_TCP_PORT")):
            if listening(port):
                raise StoreError(f"port {port} on 127.0.0.1 is already in use by another process; stop it or "
                                 f"choose another {name}")
        self.data.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # password hashes inside
        with os.fdopen(fd, "w") as out:
            out.write(self.config_xml())
        if self.log_file.exists():
            self.log_file.replace(self.log_file.with_suffix(".log.1"))
        with open(self.log_file, "wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "fleetpulse.clickhouse_process", str(self.data), self.database],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.home,
                start_new_session=True, env={**os.environ, "PYTHONPATH": _import_root()})
        self.pid_file.write_text(json.dumps({"pid": self._proc.pid, "http_port": self.http_port}))

    def _ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._running_pid() is None:
                raise StoreError(f"ClickHouse exited during start-up; {self.log_file}:\n{log_tail(self.log_file)}")
            if listening(self.http_port) and listening(self.tcp_port) and all(
                    self._round_trip(role, 5) for role in self.users):
                return self.url
            time.sleep(0.1)
        raise StoreError(f"ClickHouse on {self.url} did not answer within {timeout:.0f}s; "
                         f"{self.log_file}:\n{log_tail(self.log_file)}")

    def _round_trip(self, role: str, timeout: float) -> str | None:
        """The server's version, asked over HTTP as `role`; None while it does not answer."""
        import urllib.request

        request = urllib.request.Request(f"{self.url}/?query=SELECT%20version()", headers={
            "X-ClickHouse-User": self.users[role][0], "X-ClickHouse-Key": self.password(role)})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return answer.read().decode().strip() or None
        except OSError:
            return None

    def config_xml(self) -> str:
        users = [_DEFAULT_USER.format(database=self.database)]
        for role, (user, _) in self.users.items():
            digest = hashlib.sha256(self.password(role).encode()).hexdigest()
            grants = "".join(f"<query>GRANT {g}</query>" for g in GRANTS[role])
            quota = next((f"quota_{q.role}" for q in self.quotas if q.role == role), "default")
            users.append(f"<{escape(user)}><password_sha256_hex>{digest}</password_sha256_hex>{_LOOPBACK}"
                         f"<profile>{'analyst' if role == 'analyst' else 'default'}</profile><quota>{quota}</quota>"
                         f"<default_database>{self.database}</default_database>"
                         f"<grants>{grants}</grants></{escape(user)}>")
        analyst = {name: f"{value:g}" if isinstance(value, float) else value
                   for name, value in self.limits.settings().items()}
        profile = "".join(f"<{k}>{v}</{k}>" for k, v in analyst.items())
        constraints = "".join(f"<{k}><max>{v}</max></{k}>" for k, v in analyst.items())
        quotas = "".join(f"<quota_{q.role}><interval><duration>{q.interval_s}</duration>"
                         f"<query_inserts>{q.inserts}</query_inserts></interval></quota_{q.role}>"
                         for q in self.quotas)
        return f"""<clickhouse>
  <!-- written by fleetpulse clickhouse start at each start: change the settings, not this file -->
  <http_port>{self.http_port}</http_port>
  <tcp_port>{self.tcp_port}</tcp_port>
  <listen_host>127.0.0.1</listen_host>
  <logger><level>warning</level><log>{self.home}/clickhouse.log</log><errorlog>{self.home}/clickhouse.err.log</errorlog>
    <size>50M</size><count>3</count><console>0</console></logger>
  <user_directories><users_xml><path>{self.config}</path></users_xml></user_directories>
  <users>{"".join(users)}</users>
  <profiles>
    <default/>
    <analyst><readonly>2</readonly>{profile}<result_overflow_mode>throw</result_overflow_mode>
      <constraints>{constraints}<result_overflow_mode><const/></result_overflow_mode></constraints></analyst>
  </profiles>
  <quotas><default/>{quotas}</quotas>
  {self.extra_config}
</clickhouse>
"""

    def _marker(self) -> bytes:
        return f"fleetpulse.clickhouse_process\0{self.data}\0".encode()

    def ports(self) -> tuple[int, ...]:
        return (self.http_port, self.tcp_port)


# chdb logs in as `default` when imported in the server's own process: it keeps no password, and may only make the
# roles' database and start the listeners (anyone on loopback who logs in as it can do no more).
_LOOPBACK = "<networks><ip>127.0.0.1</ip><ip>::1</ip></networks>"
_DEFAULT_USER = (f"<default><password></password>{_LOOPBACK}<profile>default</profile><quota>default</quota>"
                 "<grants><query>GRANT SYSTEM LISTEN ON *.*</query><query>GRANT CREATE DATABASE ON {database}.*"
                 "</query></grants></default>")


def _import_root() -> str:
    """Where `fleetpulse` is importable from, for the server process (whose working directory is its home)."""
    root = str(Path(__file__).resolve().parents[1])
    return os.pathsep.join([root, os.environ["PYTHONPATH"]]) if os.environ.get("PYTHONPATH") else root


def ensure_clickhouse(settings: CommonSettings, timeout: float = 60) -> str | None:
    """Make sure the configured store answers: start the local server (its URL), verify another server (its URL,
    credentials left out), or nothing for the embedded store (None)."""
    if settings.embedded_store:
        return None
    if settings.uses_local_clickhouse:
        return LocalClickHouse.of(settings).start(timeout)
    from core.clickhouse import connect, redact

    deadline = time.monotonic() + timeout
    while True:
        try:
            connect(settings, "analyst", database="system").close()
            return redact(settings.clickhouse_dsn)
        except StoreError as exc:
            if exc.action != StoreError.WAIT or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
