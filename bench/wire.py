"""The raw topics' wire encoding: bytes and CPU per record of today's JSON beside two compact MessagePack encodings,
each decoded and checked as strictly as the topic's validator (JSON out).

    python bench/wire.py [--hosts 1000] [--ticks 10] [--repeat 5]

Records are a simulated fleet's host samples and NCCL steps, as the agents publish them. Per topic and encoding:
- bytes per record, and per record once a batch of --batch records is zstd-compressed (what the broker stores and
  ships: the producers compress with zstd);
- encode: µs of CPU to encode a record as a producer would hold it (a dict; a typed row for the array encoding);
- decode+check: µs to decode and check it: today's validator (schemas/validate.py, msgspec over JSON); the same
  msgspec types over MessagePack maps; over MessagePack arrays (field order as the model's, typed rows out, which
  the stages, written against dicts, would have to read differently; without the validator's checks after the
  pass, which read dicts: a lower bound);
- to_sink: µs to turn the record back into the JSON line the sink hands to ClickHouse (JSONEachRow), which today
  costs nothing: the sink passes the record's own bytes (for arrays, JSON arrays, not the objects JSONEachRow reads:
  a lower bound).
CPU time of this process, medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import typing
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cramjam  # noqa: E402  aiokafka's zstd
import msgspec  # noqa: E402
import orjson  # noqa: E402

from report import save  # noqa: E402  bench/report.py, beside this script

from schemas.codec import encode  # noqa: E402
from schemas.topics import NCCL, SAMPLES, Topic  # noqa: E402
from schemas.validate import lean_type, validator  # noqa: E402


def _row_type(t: typing.Any) -> typing.Any:
    """A lean annotation with each TypedDict swapped for an array-like Struct of the same fields and bounds."""
    if typing.is_typeddict(t):
        return row_struct(t)
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (typing.NotRequired, typing.Required):  # presence is the Struct field's default
        return _row_type(args[0])
    if origin is typing.Annotated:
        return typing.Annotated[(_row_type(args[0]), *t.__metadata__)]
    if origin is list:
        return list[_row_type(args[0])]
    if origin is typing.Union:
        return typing.Union[tuple(_row_type(a) for a in args)]
    return t


def row_struct(td: type) -> type:
    """The array-like msgspec Struct of a validator's TypedDict: required fields first, optional ones default None."""
    hints = typing.get_type_hints(td, include_extras=True)
    required = [(n, _row_type(t)) for n, t in hints.items() if n in td.__required_keys__]
    optional = [(n, _row_type(t), None) for n, t in hints.items() if n not in td.__required_keys__]
    return msgspec.defstruct(f"{td.__name__}Row", [*required, *optional], array_like=True)


def as_array(value: typing.Any, info: msgspec.inspect.Type) -> typing.Any:
    """A decoded record (dicts) as the nested lists an array-like Struct of `info` reads, absent fields None."""
    if isinstance(info, msgspec.inspect.UnionType):
        info = next((t for t in info.types if not isinstance(t, msgspec.inspect.NoneType)), info)
    if isinstance(info, msgspec.inspect.StructType) and isinstance(value, dict):
        return [as_array(value.get(f.name), f.type) for f in info.fields]
    if isinstance(info, msgspec.inspect.ListType) and isinstance(value, list):
        return [as_array(v, info.item_type) for v in value]
    return value


def _cpu_us(fn, items: list) -> float:
    t0 = time.process_time()
    for x in items:
        fn(x)
    return 1e6 * (time.process_time() - t0) / len(items)


def measure(topic: Topic, records: list[dict], batch: int) -> dict[str, dict[str, float]]:
    """One run over `records`: per encoding, bytes and µs per record."""
    check = validator(topic.model)
    mp_decoder = msgspec.msgpack.Decoder(lean_type(topic.model))
    row = row_struct(lean_type(topic.model))
    row_decoder = msgspec.msgpack.Decoder(row)
    info = msgspec.inspect.type_info(row)
    rows = [msgspec.convert(as_array(r, info), row) for r in records]
    mp_enc = msgspec.msgpack.Encoder()
    wires = {"json": [encode(r) for r in records], "msgpack_map": [mp_enc.encode(r) for r in records],
             "msgpack_array": [mp_enc.encode(r) for r in rows]}
    assert check.decode(wires["json"][0]) == check._finish(mp_decoder.decode(wires["msgpack_map"][0]))
    costs = {
        "json": (lambda r: encode(r), records, check.decode, lambda raw: raw),
        "msgpack_map": (mp_enc.encode, records, lambda raw: check._finish(mp_decoder.decode(raw)),
                        lambda raw: orjson.dumps(msgspec.msgpack.decode(raw))),
        "msgpack_array": (mp_enc.encode, rows, row_decoder.decode,
                          lambda raw: msgspec.json.encode(msgspec.to_builtins(row_decoder.decode(raw)))),
    }
    out = {}
    for name, (enc, held, dec, to_sink) in costs.items():
        raw = wires[name]
        zipped = sum(len(bytes(cramjam.zstd.compress(b"".join(raw[i:i + batch]))))
                     for i in range(0, len(raw), batch))
        out[name] = {"bytes": sum(map(len, raw)) / len(raw), "zstd_bytes": zipped / len(raw),
                     "encode_us": _cpu_us(enc, held), "decode_check_us": _cpu_us(dec, raw),
                     "to_sink_us": _cpu_us(to_sink, raw)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--ticks", type=int, default=10)
    p.add_argument("--batch", type=int, default=500, help="records per zstd-compressed batch")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("bench/results/wire.json"))
    args = p.parse_args()
    from agents.simulator.simulate import FleetSimulator

    sim = FleetSimulator(args.hosts, seed=7, start_ts=time.time() - args.ticks - 60, nccl_interval=1.0)
    ticks = [sim.step() for _ in range(args.ticks)]
    data = {SAMPLES: [s for t in ticks for s in t.samples], NCCL: [n for t in ticks for n in t.nccl]}
    result: dict = {"data": {"hosts": args.hosts, "ticks": args.ticks, "batch": args.batch, "repeat": args.repeat,
                             "records": {t.name: len(r) for t, r in data.items()},
                             "units": "bytes and µs of CPU per record, medians"}}
    for topic, records in data.items():
        runs = [measure(topic, records, args.batch) for _ in range(args.repeat)]
        result[topic.name] = {enc: {k: round(statistics.median(r[enc][k] for r in runs), 1) for k in runs[0][enc]}
                              for enc in runs[0]}
    per_sample = len(data[NCCL]) / len(data[SAMPLES])  # NCCL step records per host sample
    result["per_host_sample"] = {  # a host sample with its share of NCCL steps, as bench/throughput.py counts
        enc: {k: round(result[SAMPLES.name][enc][k] + per_sample * result[NCCL.name][enc][k], 1)
              for k in ("bytes", "zstd_bytes", "decode_check_us")} for enc in result[SAMPLES.name]}
    save(result, args.out)


if __name__ == "__main__":
    main()
