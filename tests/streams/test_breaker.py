"""Fleet-wide drain breaker: the cap, tripping on a drain storm, waiting for an operator, replays, bandwidth median."""

from __future__ import annotations

import pytest

from streams.lifecycle.breaker import ALERTNAME, Breaker, BreakerConfig, add_busbw, cap, decide, reset
from tests.streams.test_lifecycle import Fleet

T0 = 200_000.0


def proposal(host: str, ts: float, pid: str | None = None) -> dict:
    return {"kind": "drain", "proposal_id": pid or f"{host}:1:p1", "host": host, "ts": ts, "repair": "reboot",
            "mode": "immediate", "reason": "fault xid:79 -> reboot", "evidence": {"code": "xid:79"}}


@pytest.mark.parametrize("nodes, expected", [(0, 3), (4, 3), (100, 5), (2048, 102), (10_000, 500)])
def test_cap_is_p_percent_of_known_nodes_but_never_below_the_minimum(nodes, expected):
    assert cap(nodes, BreakerConfig()) == expected


def storm(f: Fleet, hosts: list[str], ts: float) -> None:
    for h in hosts:
        f.health(h, ts - 60, 100.0)
    for h in hosts:  # a bad check rollout: the same hard gate on all of them at once
        f.health(h, ts, 10.0, {"gpu0/row_remap_pending": ts})


def test_a_storm_on_20_percent_of_nodes_trips_the_breaker_and_nothing_beyond_the_cap_drains():
    f = Fleet(known=100)
    hosts = [f"h{i:03d}" for i in range(20)]
    storm(f, hosts, T0)
    drained = [s.host for s in f.states if s.state == "drain_requested"]
    assert drained == hosts[:5] and [r.host for r in f.requests if r.action == "drain"] == hosts[:5]
    held = [s for s in f.states if s.state == "suspect"]
    assert [s.host for s in held] == hosts[5:]
    assert all(s.evidence["breaker"] == "open" and s.schedulable for s in held)
    assert "breaker tripped" in held[0].evidence["denied"] and "breaker open since" in held[1].evidence["denied"]
    [alert] = f.alerts
    assert (alert.alertname, alert.status, alert.value, alert.threshold) == (ALERTNAME, "firing", 6, 5)
    assert alert.evidence["fleet_nodes"] == 100 and "fleetpulse breaker reset" in alert.summary
    assert (f.breaker.open, f.breaker.trips, f.breaker.denied) == (True, 1, 15)


def test_the_breaker_stays_open_past_the_window_until_an_operator_resets_it():
    f = Fleet(known=100)
    hosts = [f"h{i:03d}" for i in range(20)]
    storm(f, hosts, T0)
    later = T0 + 2 * BreakerConfig().window_s
    f.health("h005", later, 10.0, {"gpu0/row_remap_pending": T0})  # still gated, asks again: still denied
    assert f.breaker.open and [s.state for s in f.states if s.host == "h005"] == ["suspect"]
    resolved = reset(f.breaker, {"kind": "reset", "ts": later + 1, "by": "alice", "note": "bad check rolled back"})
    assert (resolved.status, resolved.fingerprint, resolved.ends_at) == ("resolved", f.alerts[0].fingerprint, later + 1)
    assert "alice" in resolved.summary and not f.breaker.open and f.breaker.window == []
    assert reset(f.breaker, {"ts": later + 2, "by": "bob"}) is None  # already closed: nothing to resolve
    for k, h in enumerate(hosts[5:]):  # the held nodes ask again; the cap applies afresh
        f.health(h, later + 100 + k, 10.0, {"gpu0/row_remap_pending": T0})
    again = [s.host for s in f.states if s.state == "drain_requested" and s.since > later]
    assert again == hosts[5:10] and f.breaker.open and f.breaker.trips == 2


def test_a_replayed_proposal_sends_nothing_again_and_counts_once():
    b, cfg = Breaker(), BreakerConfig(min_cap=1, max_share_pct=1)
    first = decide(b, proposal("h1", T0), None, 10, cfg)
    replay = decide(b, proposal("h1", T0), first.decided, 10, cfg)
    assert first.decision["admitted"] and len(b.window) == 1
    assert (replay.decision, replay.alert, replay.decided) == (None, None, first.decided)
    other = decide(b, proposal("h2", T0 + 1), None, 10, cfg)
    assert not other.decision["admitted"] and other.alert is not None and b.denied == 1
    assert decide(b, proposal("h2", T0 + 1), other.decided, 10, cfg).alert is None and b.denied == 1
    assert decide(b, proposal("h1", T0 + 2, pid="h1:2:p2"), first.decided, 10, cfg).decision is not None


def test_the_window_slides_while_the_breaker_is_closed():
    b, cfg = Breaker(), BreakerConfig(min_cap=2, max_share_pct=1, window_s=600)
    for i, ts in enumerate((T0, T0 + 100, T0 + 700, T0 + 799)):  # never more than 2 within 600 s
        assert decide(b, proposal(f"h{i}", ts), None, 10, cfg).decision["admitted"]
    assert not b.open and [w[1] for w in b.window] == ["h2", "h3"]


def test_absolute_caps_hold_a_large_fleet_to_so_many_nodes_and_gpus():
    """5 % of 10,000 nodes is 500 within 15 minutes; max_nodes holds it to 20, max_gpus to 64 GPUs whatever the
    share says, and each trip says which cap it was."""
    cfg = BreakerConfig(max_nodes=20)
    assert cap(10_000, cfg) == 20 and cap(100, cfg) == 5  # the smaller of the two
    b = Breaker()
    for i in range(20):
        assert decide(b, proposal(f"h{i}", T0 + i), None, 10_000, cfg, 8).decision["admitted"]
    v = decide(b, proposal("h20", T0 + 20), None, 10_000, cfg, 8)
    assert not v.decision["admitted"] and b.open
    assert "reached the cap of 20 (max_nodes 20, under 5% of 10000 nodes)" in b.reason
    assert (v.alert.evidence["max_nodes"], v.alert.evidence["window_gpus"]) == (20, 160.0)

    b, cfg = Breaker(), BreakerConfig(max_gpus=64)
    for i in range(8):  # 8 nodes of 8 GPUs: 64
        d = decide(b, proposal(f"h{i}", T0 + i), None, 10_000, cfg, 8).decision
        assert d["admitted"] and d["reason"].endswith(f", {8 * (i + 1)} of 64 GPUs"), d
    v = decide(b, proposal("h8", T0 + 8), None, 10_000, cfg, 8)
    assert not v.decision["admitted"] and b.reason == ("64 GPUs drained within 900s and 8 more would pass the cap of "
                                                        "64 GPUs (max_gpus)")
    assert v.alert.evidence["max_gpus"] == 64 and v.alert.evidence["drain_gpus"] == 8
    old = Breaker(window=[[T0, "h0"]])  # state written before the GPU cap: its drains count as nodes only
    assert decide(old, proposal("h1", T0 + 1), None, 100, cfg, 8).decision["admitted"]


def test_the_fleet_step_weighs_a_drain_by_the_node_s_installed_gpus():
    """Through the stage's own fleet step: a node's installed GPUs come from its usable-compute share."""
    import orjson

    from schemas.topics import LIFECYCLE_DECISIONS, LIFECYCLE_FLEET
    from streams import registry
    from streams.runtime.offline import offline_steps
    from streams.runtime.spec import Record
    from streams.settings import streams_settings

    settings = streams_settings(None, breaker=BreakerConfig(max_gpus=16))
    [step] = [s for s in offline_steps([registry.STAGES["lifecycle"]], settings) if s.step.run.__name__ == "fleet_step"]
    records = [{"kind": "share", "host": h, "ts": T0, "share": [8, 8, 0, 0, 0, 0, 0, 0, 0]} for h in ("a", "b", "c")]
    records += [proposal(h, T0 + k + 1) for k, h in enumerate(("a", "b", "c"))]
    answers = []
    for offset, rec in enumerate(records):
        for e in step.run([Record("fleet", rec, rec["host"], LIFECYCLE_FLEET.name, 0, offset, 0)]):
            if e.to is LIFECYCLE_DECISIONS:
                answers.append((orjson.loads(e.value)["host"], orjson.loads(e.value)["admitted"]))
    assert answers == [("a", True), ("b", True), ("c", False)]  # 8 + 8 GPUs, a third node's 8 would pass 16


def test_an_admitted_drain_carries_the_breakers_reason_and_the_fleet_median():
    b = Breaker()
    for i, gbs in enumerate((380.0, 400.0, 420.0)):
        assert add_busbw(b, {"ts": T0 + i, "host": f"v{i}", "gbs": gbs}, BreakerConfig())
    assert not add_busbw(b, {"ts": T0, "host": "v0", "gbs": 380.0}, BreakerConfig())  # a replay
    d = decide(b, proposal("h1", T0 + 10), None, 50, BreakerConfig()).decision
    assert (d["admitted"], d["event_id"], d["busbw_median_gbs"], d["busbw_n"]) == (True, "h1:1:p1:drain", 400.0, 3)
    assert d["reason"] == "1 of 3 drains allowed within 900s"
    f = Fleet(known=50)
    f.fault("h1", T0, "reboot")
    [drain] = f.requests
    assert (drain.action, drain.event_id, drain.evidence["code"], drain.evidence["mode"]) == (
        "drain", "h1:1:p1:drain", "xid:79", "immediate")
    assert drain.evidence["breaker"] == "1 of 3 drains allowed within 900s"


def test_the_median_covers_the_most_recent_validations():
    b, cfg = Breaker(), BreakerConfig(busbw_kept=3)
    for i, gbs in enumerate((100.0, 400.0, 410.0, 420.0)):
        add_busbw(b, {"ts": T0 + i, "host": "v", "gbs": gbs}, cfg)
    assert b.median() == (410.0, 3)
    assert Breaker.from_json(b.to_json()) == b
