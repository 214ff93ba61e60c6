"""Hostile records for the raw topics: what a broken agent, a fuzzer or an attacker could publish.

Each record is derived from a good one by one mutation, drawn by a seeded RNG: truncated or invalid JSON, invalid
UTF-8, NaN and Infinity tokens, numbers past 64 bits, negative and enormous GPU indices and timestamps, wrong types,
deep nesting, values near the broker's 1 MB limit, 300 GPUs or ports, 65 failing collectors, duplicate GPU indices or ports, duplicate JSON
keys, and host names with control, bidi and SQL-looking characters, records keyed by another host, clocks a year
ahead. Some stay valid (unknown keys, duplicate keys, hostile but well-formed strings): those must be stored like any
other record; the rest must be refused, once.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from schemas.topics import AGENT, HOST_EVENTS, NCCL, NET, SAMPLES, XID, Topic

HOSTILE_NAMES = ("h'; DROP TABLE gpu_samples; --", "h\u202eevil\u202c", "h\u0000nul", "h\u001b[31mred", "h\\\\x00",
                 "h\"quote", "h" + "\u0301" * 40, "\U0001f525host", "h\ud7ff\ue000", "{{7*7}}", "h%s%n")


@dataclass(frozen=True)
class Hostile:
    topic: Topic
    key: bytes
    value: bytes
    how: str  # the mutation, for a failure message


def good_sample(rng: random.Random, now: float, n: int) -> dict:
    gpus = [{"index": i, "uuid": f"GPU-{n:05d}-{i}", "pci_bus_id": f"0000:{0x18 + i:02x}:00.0", "model": "H100",
             "power_w": 300.0 + rng.random() * 300, "gpu_temp_c": 40.0 + rng.random() * 40, "throttle_reasons": 0,
             "ecc_sbe_volatile": rng.randrange(5), "slowdown_temp_c": 89.0, "power_limit_w": 700.0}
            for i in range(8)]
    return {"host": f"hostile-{n % 7}", "rack": "r1", "cluster": "c1", "ts": now + n * 0.01, "seq": n,
            "source": "simulator", "gpus": gpus}


def good_xid(rng: random.Random, now: float, n: int) -> dict:
    return {"host": f"hostile-{n % 7}", "ts": now + n * 0.01, "code": rng.choice([13, 31, 43, 45, 63]),
            "gpu_index": rng.randrange(8), "message": "Graphics SM Warp Exception"}


def good_nccl(rng: random.Random, now: float, n: int) -> dict:
    return {"job": "hostile-job", "world_size": 16, "host": f"hostile-{n % 2}", "collective": "AllReduce", "seq": n,
            "bytes": 1 << 20, "source": "simulator",
            "ranks": [{"rank": 8 * (n % 2) + r, "gpu_index": r, "ts": now + n * 0.01, "compute_us": 900.0,
                       "collective_us": 100.0 + rng.random() * 20} for r in range(8)]}


def good_net(rng: random.Random, now: float, n: int) -> dict:
    ports = [{"device": f"mlx5_{i}", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp", "rate_gbps": 400.0,
              "rate": "400 Gb/sec (4X NDR)", "symbol_error": rng.randrange(3), "link_downed": 0} for i in range(8)]
    return {"host": f"hostile-{n % 7}", "ts": now + n * 0.01, "seq": n, "source": "simulator", "ports": ports}


def good_host_event(rng: random.Random, now: float, n: int) -> dict:
    return {"host": f"hostile-{n % 7}", "ts": now + n * 0.01, "subsystem": "storage", "code": "nvme_timeout",
            "device": "nvme0", "severity": "warning", "raw_line": f"nvme nvme0: I/O {rng.randrange(999)} QID 4 "
                                                                "timeout, aborting"}


def good_agent_status(rng: random.Random, now: float, n: int) -> dict:
    failing = {"nvml": "NVML_ERROR_GPU_IS_LOST"} if rng.random() < 0.2 else {}
    return {"host": f"hostile-{n % 7}", "rack": "r1", "ts": now + n * 0.01, "seq": n, "state": "running",
            "collectors": ["nvml", "kernel_log", "infiniband"], "failing": failing, "unsupported": {},
            "source": "simulator"}


# New topics go last: the first ones' records stay what they were for a given seed.
GOOD: dict[Topic, Callable[[random.Random, float, int], dict]] = {SAMPLES: good_sample, XID: good_xid,
                                                                   NCCL: good_nccl, NET: good_net,
                                                                   HOST_EVENTS: good_host_event,
                                                                   AGENT: good_agent_status}


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _set(record: dict, path: tuple, value) -> dict:
    target = record
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    return record


def _paths(topic: Topic, record: dict) -> list[tuple]:
    """Where a value may be replaced: top-level fields and the fields of the first nested item."""
    out = [(k,) for k in record]
    nested = {SAMPLES: "gpus", NCCL: "ranks", NET: "ports"}.get(topic)
    if nested and record[nested]:
        out += [(nested, 0, k) for k in record[nested][0]]
    return out


def _dumps(record: dict) -> bytes:
    """JSON as any producer might write it: integers past 64 bits included (orjson refuses them)."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def mutate(topic: Topic, record: dict, rng: random.Random) -> tuple[bytes, str]:
    """One hostile mutation of a good record: (bytes to publish, what was done)."""
    raw = _dumps(record)
    kind = rng.randrange(16)
    if kind == 0:
        cut = rng.randrange(len(raw))
        return raw[:cut], f"truncated at {cut}", None
    if kind == 1:
        at = rng.randrange(1, len(raw) - 1)
        return raw[:at] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x00"]) + raw[at:], f"byte at {at}", None
    if kind in (2, 3, 4, 5):
        path = rng.choice(_paths(topic, record))
        junk = rng.choice([None, True, "12", "", [], {}, -1, 0, 2**63, 2**64, -(2**63) - 1, 1e308, -1e308, 0.5,
                           10**30, "NaN", [[[]]], {"$gt": ""}, "x" * 300])
        return _dumps(_set(record, path, junk)), f"{'.'.join(map(str, path))} = {junk!r:.40}", None
    if kind == 6:
        path = rng.choice(_paths(topic, record))
        token = rng.choice([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"18446744073709551616", b"-0", b"01"])
        marker = _dumps(_set(record, path, "__TOKEN__"))
        return marker.replace(b'"__TOKEN__"', token), f"{'.'.join(map(str, path))} = {token.decode()}", None
    if kind == 7:
        depth = rng.choice([50, 1000, 100_000])
        return raw[:-1] + b',"extra":' + _deep(depth) + b"}", f"nesting {depth} deep in an unknown field", None
    if kind == 8:
        path = rng.choice([p for p in _paths(topic, record) if isinstance(record[p[0]], str)] or [("host",)])
        return _dumps(_set(record, path, _deep(5000).decode())), f"{path} as deep brackets text", None
    if kind == 9:
        size = rng.choice([300_000, 900_000])
        return _dumps({**record, "host": "h" * size}), f"host of {size} characters", None
    if kind == 10:
        size = rng.choice([200_000, 900_000])
        return _dumps({**record, "padding": "x" * size}), f"unknown field of {size} bytes (valid)", None
    if kind == 11 and topic is SAMPLES:
        gpu = record["gpus"][0]
        count = rng.choice([257, 300, 2000])
        return _dumps({**record, "gpus": [{**gpu, "index": i % 256} for i in range(count)]}), f"{count} GPUs", None
    if kind == 11 and topic is NCCL:
        return _dumps({**record, "ranks": record["ranks"] * 40}), "320 ranks", None
    if kind == 11 and topic is NET:
        return _dumps({**record, "ports": [{**record["ports"][0], "port": i % 256} for i in range(300)]}), \
            "300 ports", None
    if kind == 11 and topic is AGENT:
        return _dumps({**record, "failing": {f"c{i}": "x" * 100 for i in range(65)}}), "65 failing collectors", None
    if kind == 12 and topic is AGENT:
        state = rng.choice(["rebooting", "", "RUNNING", None])
        return _dumps({**record, "state": state}), f"state {state!r}", None
    if kind == 12 and topic is SAMPLES:
        return _dumps({**record, "gpus": record["gpus"] + record["gpus"][:1]}), "GPU 0 twice", None
    if kind == 12 and topic is NET:
        return _dumps({**record, "ports": record["ports"] + record["ports"][:1]}), "port mlx5_0/1 twice", None
    if kind == 12:
        index = rng.choice([-1, 256, 10**9])
        field = ("ranks", 0, "gpu_index") if topic is NCCL else ("gpu_index",)
        return _dumps(_set(record, field, index)), f"gpu_index {index}", None
    if kind == 13:  # a producer keys by the host it writes: valid, whatever the name holds
        name = rng.choice(HOSTILE_NAMES)
        key = name.encode("utf-8", "surrogatepass") if topic.key == "host" else None
        return _dumps({**record, "host": name}), f"host {name!r} (valid)", key
    if kind == 14:
        dup = f"dup-{rng.randrange(9)}"
        key = dup.encode() if topic.key == "host" else None
        return raw[:-1] + f',"host":"{dup}"}}'.encode(), "duplicate key host, the last one keyed (valid)", key
    if kind == 15:
        return raw, "keyed by another host", b"someone-else"
    field = ("ranks", 0, "ts") if topic is NCCL else ("ts",)
    ahead = (record["ranks"][0]["ts"] if topic is NCCL else record["ts"]) + 400 * 86_400  # a host clock a year ahead
    ts = rng.choice([-5.0, 0.0, 1e300, 2**64, 10_413_792_000.0, "2026-12-01T00:00:00Z", ahead])
    return _dumps(_set(record, field, ts)), f"ts {ts!r}", None


def corpus(per_topic: int, *, seed: int = 7, now: float, hostile_share: float = 0.5) -> list[Hostile]:
    """`per_topic` records for each raw topic, about `hostile_share` of them mutated, in a seeded order."""
    rng = random.Random(seed)
    out = []
    for topic, make in GOOD.items():
        for n in range(per_topic):
            record = make(rng, now, n)
            key = str(record["host"] if topic is not NCCL else record["job"]).encode()
            if rng.random() < hostile_share:
                value, how, keyed = mutate(topic, record, rng)
                key = key if keyed is None else keyed
            else:
                value, how = orjson.dumps(record), "good"
            out.append(Hostile(topic, key, value, how))
    return out
