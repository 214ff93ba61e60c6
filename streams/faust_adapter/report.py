"""What the worker's consumer holds, partition by partition: for an operator asking why a partition's lag stands still
(`kill -USR2 <worker pid>` logs it). Reads faust's and aiokafka's bookkeeping as it is (faust is pinned,
pyproject.toml); a field faust or aiokafka does not keep reads "?".
"""

from __future__ import annotations

from collections.abc import Iterable


def _get(f, default="?"):
    try:
        return f()
    except Exception:  # noqa: BLE001 - a diagnostic: what cannot be read is shown as unknown
        return default


def partition_rows(app, tps: Iterable | None = None) -> list[dict]:
    """One row per assigned partition of the streams' input topics (changelogs left out), or per partition of `tps`:
    faust's view (active, paused, buffered, read, committed, acknowledged and not yet committed), aiokafka's (fetch
    position, paused, high watermark) and, for a changelog in recovery, the last record recovery applied."""
    consumer = app.consumer
    acking = app.topics.acks_enabled_for
    client = _get(lambda: consumer._thread._ensure_consumer(), None)
    active = _get(lambda: consumer._active_partitions, None)  # None: not worked out yet (reading it would set it)
    applied = _get(lambda: app.tables.recovery.active_offsets, {})
    rows = []
    for tp in sorted(_get(consumer.assignment, set()) if tps is None else tps):
        if tps is None and not acking(tp.topic):
            continue
        state = _get(lambda: client._subscription.subscription.assignment.state_value(tp), None)
        acked = _get(lambda: consumer._acked.get(tp) or [], [])
        rows.append({
            "topic": tp.topic, "partition": tp.partition, "active": "?" if active is None else tp in active,
            "paused": tp in _get(lambda: consumer._paused_partitions, ()),
            "buffered": tp in _get(lambda: consumer._buffered_partitions, ()),
            "read": _get(lambda: consumer._read_offset.get(tp)),
            "committed": _get(lambda: consumer._committed_offset.get(tp)),
            "acked": len(acked), "acked_min": min(acked) if acked else None,
            "position": _get(lambda: state.position if state.has_valid_position else None),
            "fetch_paused": _get(lambda: state.paused),
            "highwater": _get(lambda: consumer.highwater(tp)),
        })
        if tp in applied:
            rows[-1]["applied"] = applied[tp]
    return rows


def row_lines(app, tps: Iterable | None = None) -> list[str]:
    """partition_rows as text, a line each."""
    return [" ".join(f"{k}={v}" for k, v in r.items()) for r in partition_rows(app, tps)]


def partitions_report(app, tps: Iterable) -> str:
    """The rows of the partitions `tps` (a stalled recovery's changelogs), as text."""
    return "\n".join(row_lines(app, tps))


def report(app, lanes: Iterable = ()) -> str:
    """The rows as text, then each direct lane's inbox size and the consumer's flow state."""
    lines = [f"consumer flow_active={_get(lambda: app.consumer.flow_active)} "
             f"generation={_get(lambda: app.consumer_generation_id)} "
             f"flow_control_active={_get(lambda: app.flow_control.is_active())} "
             f"unacked={_get(lambda: len(app.consumer._unacked_messages))}"]
    lines += row_lines(app)
    for lane in lanes:
        inbox = getattr(lane, "inbox", None)
        if inbox is not None:
            lines.append(f"lane {lane.name}: inbox {len(inbox)}/{inbox.maxsize}")
    return "\n".join(lines)
