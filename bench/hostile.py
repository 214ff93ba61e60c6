"""The hostile-input suite at length: the seeded hostile corpus through the real stream worker and sink.

    python bench/hostile.py --per-topic 3000 [--seed 7] [--out bench/results/hostile.json]

Per raw topic: records tried, stored rows vs expected, dead letters vs refused records (one each, the very offsets),
the worker's exit status after SIGTERM, peak resident memory of the worker and of this process (the sink runs here),
and the mutations drawn. Uses KAFKA_BOOTSTRAP_SERVERS when set, else starts the project's local broker (and stops it).
CI runs the same with 40 records per topic (tests/test_hostile_end_to_end.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.logs import quiet_transient_client_logs  # noqa: E402
from fleetpulse.broker import broker_for  # noqa: E402
from tests.hostile_pipeline import through_pipeline  # noqa: E402
from report import save  # noqa: E402 - bench/report.py, beside this script


async def main(args) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="fleetpulse-hostile-"))
    os.environ.update({"FLEETPULSE_TOPIC_PREFIX": f"hostile{uuid.uuid4().hex[:6]}.",
                       "FLEETPULSE_CLICKHOUSE_URL": f"chdb://{tmp / 'chdb'}", "FLEETPULSE_DATA_DIR": str(tmp / "d")})
    async with broker_for(tmp / "data", port=39093):
        report = await through_pipeline(args.per_topic, args.seed, tmp / "worker.log", timeout=args.timeout)
    checks = {}
    for topic, stats in report["stats"].items():
        expected, letters = report["expected"][topic], [tuple(x) for x in report["dead_letters"][topic]]
        refused = [tuple(x) for x in report["refused_at"][topic]]
        checks[topic] = {"tried": args.per_topic, "stored_rows": stats["rows"], "expected_rows": expected["rows"],
                         "records": expected["records"], "dead_letters": stats["dead_letters"],
                         "refused": expected["refused"], "dead_letters_are_the_refused_records": letters == refused}
        if letters != refused:  # (partition, offset): refused without a dead letter, dead-lettered more than once
            checks[topic]["refused_not_dead_lettered"] = sorted(set(refused) - set(letters))[:20]
            checks[topic]["dead_lettered_not_refused"] = sorted(set(letters) - set(refused))[:20]
            checks[topic]["dead_lettered_twice"] = sorted(p for p, n in Counter(letters).items() if n > 1)[:20]
    return {"per_topic": args.per_topic, "seed": args.seed, "seconds": report["seconds"], "topics": checks,
            "worker_exit": report["worker_exit"], "peak_rss_mb": report["peak_rss_mb"],
            "mutations": report["mutations"]}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--per-topic", type=int, default=3000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out", type=Path, default=Path("bench/results/hostile.json"))
    a = p.parse_args()
    quiet_transient_client_logs()
    save(asyncio.run(main(a)), a.out)
