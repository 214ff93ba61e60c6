"""Self-healing Kafka client states stay out of an operator's way; real faults and long outages do not."""

from __future__ import annotations

import logging

from core.logs import TransientClientNoise


def record(msg: str, *args, level: int = logging.ERROR, name: str = "aiokafka.consumer.fetcher") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_a_new_topics_leader_election_is_debug_and_a_lasting_one_is_shown_once_a_minute():
    now = [0.0]
    noise = TransientClientNoise(grace_s=60, every_s=60, clock=lambda: now[0])
    shown = []
    for t in range(0, 200, 5):  # the same condition every 5 s for 200 s
        now[0] = float(t)
        r = record("Failed fetch offsets from 1: [Error 6] NotLeaderForPartitionError: %s", "tp")
        if noise.filter(r) and r.levelno >= logging.WARNING:
            shown.append((t, r.getMessage()))
    assert [t for t, _ in shown] == [60, 120, 180]
    assert shown[0][1].startswith("[NotLeaderForPartition for 60 s, 13 times] Failed fetch offsets")
    assert noise.demoted == 40 - 3


def test_after_a_quiet_spell_the_same_condition_starts_a_new_grace_period():
    now = [0.0]
    noise = TransientClientNoise(grace_s=60, every_s=60, clock=lambda: now[0])
    for t in (0.0, 30.0, 200.0, 230.0):
        now[0] = t
        r = record("Got error produce response on topic-partition %s, retrying. Error: NotLeaderForPartitionError", "x",
                   level=logging.WARNING, name="aiokafka.producer.sender")
        noise.filter(r)
        assert r.levelno == logging.DEBUG


def test_brief_states_a_minute_apart_are_separate_episodes_not_one_long_outage():
    """A benchmark's runs, or a pipeline creating topics now and then: each new topic's leader election is a blip of
    well under a second. Blips ~50 s apart once chained into one episode and were shown as "[NotLeaderForPartition for
    140 s]", an outage that never was."""
    now = [0.0]
    noise = TransientClientNoise(grace_s=60, every_s=60, clock=lambda: now[0])
    for start in range(0, 400, 50):
        for dt in (0.0, 0.1, 0.2, 0.4):
            now[0] = start + dt
            r = record("Got error produce response on topic-partition %s, retrying. Error: NotLeaderForPartitionError",
                       "x", level=logging.WARNING, name="aiokafka.producer.sender")
            noise.filter(r)
            assert r.levelno == logging.DEBUG, r.getMessage()


def test_what_an_operator_must_see_passes_untouched():
    noise = TransientClientNoise(clock=lambda: 0.0)
    for msg in ("Authentication failed for user fleetpulse: SaslAuthenticationFailed",
                "MessageSizeTooLargeError: the message is 2000000 bytes"):
        r = record(msg)
        assert noise.filter(r) and r.levelno == logging.ERROR and r.getMessage() == msg
    info = record("Joined group %s", "g", level=logging.INFO)
    assert noise.filter(info) and info.levelno == logging.INFO


def test_a_record_shown_on_its_logger_is_not_judged_again_on_the_roots_handlers():
    now = [0.0]
    noise = TransientClientNoise(grace_s=60, every_s=60, clock=lambda: now[0])
    for now[0] in (0.0, 10.0, 20.0, 30.0, 40.0, 50.0):
        noise.filter(record("Unable connect to node with id 1: Connect call failed"))
    now[0] = 61.0
    r = record("Unable connect to node with id 1: Connect call failed")
    assert noise.filter(r) and noise.filter(r) and r.levelno == logging.ERROR


def test_a_flood_of_one_kind_of_line_is_held_to_a_budget_and_what_was_held_is_said():
    from core.logs import LogBudget

    now = [0.0]
    budget = LogBudget(per_minute=3, clock=lambda: now[0])
    shown = []
    for t in range(0, 120, 2):  # one a second... every 2 s for two minutes
        now[0] = float(t)
        ok, held = budget.take()
        if ok:
            shown.append((t, held))
    assert shown == [(0, 0), (2, 0), (4, 0), (60, 27), (62, 0), (64, 0)]
