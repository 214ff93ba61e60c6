"""`fleetpulse schemas export`: JSON Schema of every topic's value, for non-Python consumers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from schemas.topics import TOPICS


def json_schemas() -> dict[str, dict]:
    """Topic name -> JSON Schema of its value, with the key field and topic facts alongside."""
    out = {}
    for topic in TOPICS.values():
        schema = topic.model.model_json_schema()
        schema["x-kafka"] = {
            "topic": topic.name, "key": topic.key, "partitions": topic.partitions,
            "compacted": topic.compacted, "retention_ms": topic.retention_ms,
        }
        out[topic.name] = schema
    return out


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["export"], help="every topic's JSON Schema, on stdout or as files (--out)")
    p.add_argument("--out", type=Path, help="write one <topic>.schema.json per topic here (default: stdout)")


def run(args: argparse.Namespace) -> int:
    schemas = json_schemas()
    if args.out is None:
        print(json.dumps(schemas, indent=2))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, schema in schemas.items():
        (args.out / f"{name}.schema.json").write_text(json.dumps(schema, indent=2) + "\n")
    print(f"wrote {len(schemas)} schemas to {args.out}")
    return 0
