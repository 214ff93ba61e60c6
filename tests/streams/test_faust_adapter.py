"""The faust adapter (streams/faust_adapter/, docs/faust-adapter.md) is the one place that knows faust: no other module
imports faust (or mode, its service library) or reads a private attribute of another object, and every private part
of faust the adapter relies on is checked here against the installed faust, so an upgrade that renames or drops one
fails this test instead of a worker."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import faust
import pytest

from core.settings import load
from streams.faust_adapter.delivery import FAUST_VERSION
from streams.settings import StreamsSettings
from tests.conftest import REPO

ADAPTER = REPO / "streams" / "faust_adapter"
PACKAGES = ("core", "schemas", "agents", "streams", "sinks", "bots", "fleetpulse", "bench")

# What the adapter overrides or calls on faust's classes (module:class -> attributes).
CLASS_PARTS = {
    "faust.transport.consumer:Consumer": ["_drain_messages", "_new_offset", "_add_gap", "wait_first", "unacked",
                                          "highwater", "seek_wait"],
    "faust.transport.drivers.aiokafka:Consumer": ["_new_consumer_thread", "perform_seek", "seek"],
    "faust.transport.drivers.aiokafka:AIOKafkaConsumerThread": ["seek_to_committed", "call_thread",
                                                                "_ensure_consumer"],
    "faust.transport.drivers.aiokafka:Producer": ["_settings_extra", "send"],
    "faust.transport.drivers.aiokafka:Transport": ["Producer", "Consumer"],
    "faust.tables.table:Table": ["_changelog_topic_name", "changelog_topic"],
    "faust.agents.agent:Agent": ["_replace_actor", "_start_one", "_start_one_supervised"],
    "mode.supervisors:OneForOneSupervisor": ["restart_service"],
    "faust.sensors:Monitor": ["on_message_in", "on_stream_event_in", "on_stream_event_out", "on_message_out"],
    "faust.types.tuples:Message": ["ack"],
    "faust:Worker": ["on_stop", "execute_from_commandline", "_on_sigusr2"],
}
# What the adapter reads on a consumer faust made (its state, set when it is built).
CONSUMER_STATE = ["_read_offset", "_committed_offset", "_acked", "_acked_index", "_unacked_messages", "_n_acked",
                  "_waiting_for_ack", "_commit_every", "_stopped", "_paused_partitions", "_buffered_partitions",
                  "_thread"]
MESSAGE_STATE = ["acked", "tracked", "refcount", "generation_id", "tp", "topic", "partition", "offset", "timestamp"]


def _modules_outside_the_adapter() -> list[Path]:
    return [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py") if ADAPTER not in p.parents]


def test_faust_is_the_version_the_adapter_was_written_for():
    assert faust.__version__ == FAUST_VERSION, "read docs/faust-adapter.md before moving faust: each part says why"


@pytest.mark.parametrize("where", sorted(CLASS_PARTS))
def test_every_part_of_faust_the_adapter_overrides_or_calls_is_there(where):
    module, name = where.split(":")
    cls = getattr(importlib.import_module(module), name)
    assert [a for a in CLASS_PARTS[where] if not hasattr(cls, a)] == []


def test_the_consumer_and_message_state_the_adapter_reads_is_there(tmp_path):
    from streams.faust_adapter.app import create_app

    app = create_app(load(StreamsSettings, kafka_bootstrap_servers="k1:9092", data_dir=tmp_path),
                     stages=["fault_bins"])
    assert [a for a in CONSUMER_STATE if not hasattr(app.consumer, a)] == []
    message = faust.types.tuples.Message("t", 0, 1, 0.0, 0, None, b"k", b"v", None)
    assert [a for a in MESSAGE_STATE if not hasattr(message, a)] == []
    assert hasattr(app, "flow_control") and hasattr(app, "consumer_generation_id")
    recovery = app.tables.recovery
    assert [a for a in ("active_offsets", "active_remaining", "in_recovery", "_active_events_received_at",
                        "_recovery_started_at") if not hasattr(recovery, a)] == []


def test_no_module_outside_the_adapter_imports_faust():
    found = []
    for path in _modules_outside_the_adapter():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] in ("faust", "mode")]
    assert found == []


def test_no_stream_module_outside_the_adapter_reads_another_objects_private_attribute():
    found = []
    for path in _modules_outside_the_adapter():
        if path.relative_to(REPO).parts[0] != "streams":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls", "os", "sys")):
                found.append(f"{path.relative_to(REPO)}:{node.lineno} .{node.attr}")
    assert found == []
