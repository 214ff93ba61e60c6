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
    assert not b.open and [h for _, h in b.window] == ["h2", "h3"]


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
