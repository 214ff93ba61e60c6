"""NvmlXidCollector against the fake NVML: registration, draining, attribution (MIG, lost GPU), limits."""

from __future__ import annotations

import copy

import pynvml
import pytest

from agents.nvml import NvmlCollector, NvmlUnavailableError, NvmlXidCollector
from agents.nvml.fake import FakeNvml, load_readings
from schemas.events import XidEvent


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml()


@pytest.fixture
def xids(fake) -> NvmlXidCollector:
    c = NvmlXidCollector(fake, host="gpu-node-0001", rack="r01", clock=lambda: 1_760_000_000.5)
    assert c.is_supported()
    yield c
    c.close()


def test_no_event_means_an_empty_poll(xids, fake):
    assert xids.sample() == []
    assert fake.calls["nvmlEventSetWait_v2"] == 1 and xids.errors == {}


def test_events_are_drained_in_order_and_attributed(xids, fake):
    fake.xid(1, 13)
    fake.double_bit_error(4)  # the DBE event is not an XID event: only Xid 48 comes through
    fake.row_remap(4)
    events = xids.sample()
    assert [(e.code, e.gpu_index) for e in events] == [(13, 1), (48, 4), (63, 4)]
    e = events[1]
    assert isinstance(e, XidEvent) and e.source == "nvml" and e.kind == "xid" and e.host == "gpu-node-0001"
    assert e.gpu_uuid == fake.gpus[4]["uuid"] and e.pci_bus_id == "0000:9a:00.0" and e.gpu_instance is None
    assert e.ts == 1_760_000_000.5 and e.rack == "r01"
    XidEvent.model_validate_json(e.model_dump_json(), strict=True)
    assert xids.last_xid == {fake.gpus[1]["uuid"]: 13, fake.gpus[4]["uuid"]: 63}
    assert xids.sample() == []


def test_mig_instance_is_attributed(xids, fake):
    fake.enable_mig(0)
    fake.xid(0, 94, gpu_instance=5)
    (event,) = xids.sample()
    assert (event.code, event.gpu_index, event.gpu_instance) == (94, 0, 5)


def test_xid_79_of_a_lost_gpu_is_still_attributed(xids, fake):
    fake.lose_gpu(2)
    (event,) = xids.sample()
    assert (event.code, event.gpu_index, event.gpu_uuid) == (79, 2, fake.gpus[2]["uuid"])


def test_poll_is_bounded(fake):
    xids = NvmlXidCollector(fake, host="h", max_events=5)
    xids.is_supported()
    for code in range(31, 43):
        fake.xid(0, code)
    assert [e.code for e in xids.sample()] == [31, 32, 33, 34, 35]
    assert [e.code for e in xids.sample()] == [36, 37, 38, 39, 40]
    assert [e.code for e in xids.sample()] == [41, 42]


def test_waits_only_on_the_first_call_of_a_poll(fake):
    waits = []
    wait = fake.nvmlEventSetWait_v2
    fake.nvmlEventSetWait_v2 = lambda s, ms: (waits.append(ms), wait(s, ms))[1]
    xids = NvmlXidCollector(fake, host="h", timeout_ms=25)
    xids.is_supported()
    fake.xid(3, 45)
    fake.xid(3, 13)
    xids.sample()
    assert waits == [25, 0, 0]


def test_gpu_without_xid_events_is_listed_and_others_still_register():
    readings = copy.deepcopy(load_readings())
    readings["gpus"][6]["supported_event_types"] = pynvml.nvmlEventTypeSingleBitEccError
    fake = FakeNvml(readings)
    xids = NvmlXidCollector(fake, host="h")
    assert xids.is_supported() and xids.unregistered == {6: "XID events not supported"}
    fake.xid(6, 31)
    fake.xid(5, 31)
    assert [e.gpu_index for e in xids.sample()] == [5]


def test_lost_at_start_and_no_library():
    fake = FakeNvml()
    fake.lose_gpu(0)
    xids = NvmlXidCollector(fake, host="h")
    assert xids.is_supported() and xids.unregistered == {0: "NVMLError_GpuIsLost"}
    absent = NvmlXidCollector(FakeNvml(library_present=False), host="h")
    assert not absent.is_supported() and absent.unsupported_reason == "init: NVMLError_LibraryNotFound"
    with pytest.raises(NvmlUnavailableError):
        absent.sample()


def test_wait_errors_are_counted_and_a_driver_loss_is_raised(xids, fake):
    fake.nvmlEventSetWait_v2 = lambda s, ms: (_ for _ in ()).throw(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))
    assert xids.sample() == [] and xids.errors == {"NVMLError_GpuIsLost": 1}
    fake.nvmlEventSetWait_v2 = lambda s, ms: (_ for _ in ()).throw(pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED))
    with pytest.raises(NvmlUnavailableError):
        xids.sample()


def test_telemetry_takes_last_xid_from_the_event_channel(fake):
    xids = NvmlXidCollector(fake, host="h")
    telemetry = NvmlCollector(fake, host="h", last_xid=xids.last_xid.get)
    xids.is_supported()
    fake.row_remap(7, failure=True)
    xids.sample()
    sample = telemetry.sample().sample
    assert sample.gpus[7].last_xid == 64 and sample.gpus[7].row_remap_failure is True
    assert sample.gpus[0].last_xid is None
    xids.close()
    telemetry.close()
    assert fake._refcount == 0 and fake.calls["nvmlEventSetFree"] == 1
