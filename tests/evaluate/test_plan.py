"""`--set` overrides and the plan a scenario file gives."""

from __future__ import annotations

import pytest

from core.errors import ConfigError
from fleetpulse.evaluate.plan import apply_override, plan_from


def test_override_sets_json_values_along_dotted_paths_creating_objects():
    doc = {"faults": [{"kind": "slow_rank", "slowdown_pct": 10}]}
    apply_override(doc, "faults.0.slowdown_pct=20")
    apply_override(doc, "fleet.hosts=256")
    apply_override(doc, "name=custom")
    assert doc == {"faults": [{"kind": "slow_rank", "slowdown_pct": 20}], "fleet": {"hosts": 256}, "name": "custom"}


@pytest.mark.parametrize("assignment, message", [
    ("faults.3.at=1", "has no item 3"), ("nothing", "expected PATH=VALUE"), ("name.x=1", "is a value")])
def test_bad_override_names_the_path(assignment, message):
    doc = {"name": "x", "faults": [{"kind": "xid"}]}
    with pytest.raises(ConfigError, match=message):
        apply_override(doc, assignment)


def test_plan_takes_fleet_and_run_from_the_scenario_and_overrides_win():
    plan = plan_from("straggler", ["faults.0.slowdown_pct=20", "run.duration_s=300"], seed=4)
    assert plan.hosts == 128 and plan.duration_s == 300 and plan.seed == 4
    assert plan.scenario.faults[0].slowdown_pct == 20


def test_plan_refuses_an_override_the_scenario_model_rejects():
    with pytest.raises(ConfigError, match="faults.0"):
        plan_from("straggler", ["faults.0.slowdown_pct=-5"])


def test_pipeline_block_becomes_worker_variables_and_a_typo_is_named():
    plan = plan_from("drain-storm", ['pipeline.breaker={"max_share_pct": 10}'])
    assert plan.streams_env == {"FLEETPULSE_BREAKER": '{"max_share_pct": 10}',  # and every evaluation's (plan.py)
                                "FLEETPULSE_SILENCE": '{"wall_wait_s": 1.0}',
                                "FLEETPULSE_LIFECYCLE": '{"minute_lateness_s": 120.0}'}
    with pytest.raises(ConfigError, match="pipeline.breaker.max_share: Extra inputs"):
        plan_from("drain-storm", ['pipeline.breaker={"max_share": 10}'])
    with pytest.raises(ConfigError, match="pipeline.kafka: not one of"):
        plan_from("drain-storm", ['pipeline.kafka={}'])
    # the silence stage's thresholds too
    assert plan_from("host-silence", ['pipeline.silence={"rack_share": 0.6}']).streams_env["FLEETPULSE_SILENCE"] == \
        '{"wall_wait_s": 1.0, "rack_share": 0.6}'
    with pytest.raises(ConfigError, match="pipeline.silence.*report_s"):
        plan_from("host-silence", ['pipeline.silence={"report_s": 90}'])


def test_bot_block_sets_the_simulated_bots_delays_and_a_typo_is_named():
    plan = plan_from("demo")
    assert plan.bot.drain_s == 5 and plan.bot.repair_s["reset"] == 10 and plan.bot.out_s("reset") == 27
    assert plan_from("drain-storm").bot.drain_s == 60  # no bot block: production-like defaults
    with pytest.raises(ConfigError, match="bot.drain: Extra inputs"):
        plan_from("demo", ['bot={"drain": 5}'])
