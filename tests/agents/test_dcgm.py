"""dcgm-exporter scraping: the real exporter sample, blank sentinels, pod labels, HTTP transport, property tests."""

from __future__ import annotations

import http.server
import re
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.dcgm import FIELDS, DcgmExporterCollector, ExporterUnavailableError, parse_exporter_text
from schemas.telemetry import GpuReading, HostSample

T4_A, T4_B = "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e", "GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5"
A30_0, A30_1 = "GPU-265c9814-6156-355b-e589-ff2064894f16", "GPU-2d20791a-b4a6-ba59-97f1-e95b99fe5b49"
H100 = "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"
L40S = ["GPU-585834da-79ca-0599-5140-4ffdb131ae93", "GPU-8f8001ff-73ba-2e83-3cdc-4156ae4f3912",
        "GPU-5bd39b62-f1d2-21f3-d9d5-24cf8d513c73"]
LABELS = ('gpu="0",UUID="GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77",pci_bus_id="00000000:1A:00.0",device="nvidia0",'
          'modelName="NVIDIA H100 80GB HBM3",Hostname="gsrh100-074",DCGM_FI_DRIVER_VERSION="535.129.03"')


@pytest.fixture
def sample_text(reference_dir: Path) -> str:
    return (reference_dir / "dcgm_exporter_sample.txt").read_text()


def sections(text: str) -> list[str]:
    """The reference file holds four real scrapes, each introduced by a '# source:' line."""
    return [s for s in re.split(r"^# source:.*$", text, flags=re.M) if s.strip()]


def parse(text: str, **kw):
    scrape = parse_exporter_text(text, host="node-1", ts=1_760_000_000.0, **kw)
    assert HostSample.model_validate_json(scrape.sample.model_dump_json(), strict=True) == scrape.sample
    return scrape


def by_uuid(scrape, uuid):
    return next(g for g in scrape.sample.gpus if g.uuid == uuid)


def of_host(text: str, hostname: str) -> str:
    """The lines of one exporter host (Datadog's T4 fixture holds two hosts' scrapes, both GPUs labelled gpu="0")."""
    return "\n".join(line for line in text.splitlines() if f'Hostname="{hostname}"' in line)


def test_t4_scrape_values_match_the_text(sample_text):
    both = parse(sections(sample_text)[0])
    assert [g.uuid for g in both.sample.gpus] == [T4_A] and both.skipped == {"duplicate_index": 1}
    scrape = parse(of_host(sections(sample_text)[0], "424773df46e0"))
    assert [g.uuid for g in scrape.sample.gpus] == [T4_A]
    a = by_uuid(scrape, T4_A)
    assert (a.index, a.model, a.sm_clock_mhz, a.mem_clock_mhz, a.gpu_temp_c) == (0, "Tesla T4", 300, 405, 25)
    assert a.power_w == 8.969 and a.energy_mj == 128996013 and a.pcie_replay_count == 0
    assert (a.gpu_util_pct, a.mem_util_pct, a.mem_used_mib) == (0, 0, 0)
    assert a.mem_total_mib == 15109  # FB_USED + FB_FREE when FB_TOTAL is not exported
    assert a.last_xid is None  # DCGM_FI_DEV_XID_ERRORS 0 = no XID since start
    assert a.pci_bus_id == "unknown"  # this exporter version emits no pci_bus_id label
    assert scrape.other[T4_A]["DCGM_FI_DEV_FB_FREE"] == 15109
    assert scrape.sample.driver_version == "460.106.00" and scrape.sample.source == "dcgm"
    assert scrape.pods == {} and scrape.skipped == {}
    other = parse(of_host(sections(sample_text)[0], "551bdf382151"))
    b = by_uuid(other, T4_B)
    assert (b.index, b.throttle_reasons, b.slowdown_temp_c, b.mem_total_mib) == (0, 1, 93, 15109)
    assert b.power_limit_w is None  # POWER_MGMT_LIMIT is the requested limit, not the enforced one
    assert other.other[T4_B] == {"DCGM_FI_DEV_POWER_MGMT_LIMIT": 70.0, "DCGM_FI_DEV_PSTATE": 8.0}


def test_a30_mig_rows_fold_into_their_gpu(sample_text):
    scrape = parse(sections(sample_text)[1])
    assert [(g.index, g.uuid, g.sm_clock_mhz) for g in scrape.sample.gpus] == [(0, A30_0, 1440), (1, A30_1, 1440)]


def test_h100_mig_keeps_pods_and_instances(sample_text):
    scrape = parse(sections(sample_text)[2])
    (g,) = scrape.sample.gpus
    assert (g.uuid, g.pci_bus_id, g.model) == (H100, "0000:1a:00.0", "NVIDIA H100 80GB HBM3")
    assert scrape.sample.driver_version == "535.129.03"
    assert scrape.pods[H100] == [
        {"namespace": "model-playground-stg", "pod": "text-embedding-predictor-00008-deployment-57946f6c67-vdtjl",
         "container": "kserve-container", "gpu_instance": "7"},
        {"namespace": "model-playground-stg", "pod": "tts-predictor-00011-deployment-5554f75554-8j8pl",
         "container": "kserve-container", "gpu_instance": "9"}]
    assert scrape.mig[H100] == {i: {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.0} for i in ("7", "8", "9")}


def test_l40s_three_gpus_with_pci_ids_and_pods(sample_text):
    scrape = parse(sections(sample_text)[3])
    assert [(g.index, g.uuid, g.pci_bus_id) for g in scrape.sample.gpus] == [
        (0, L40S[0], "0000:4e:00.0"), (1, L40S[1], "0000:62:00.0"), (2, L40S[2], "0000:c9:00.0")]
    assert scrape.pods[L40S[0]] == [{"namespace": "redacted", "pod": "tensorflow-0", "container": "tensorflow"}]
    assert L40S[2] not in scrape.pods
    assert scrape.other[L40S[1]] == {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.0}


def test_whole_file_parses_every_gpu(sample_text):
    t4, *others = sections(sample_text)
    scrapes = [parse(of_host(t4, name)) for name in ("424773df46e0", "551bdf382151")] + [parse(s) for s in others]
    assert sum(len(s.sample.gpus) for s in scrapes) == 8 and all(s.skipped == {} for s in scrapes)


def test_scrapes_of_several_hosts_run_together_keep_one_gpu_per_index(sample_text):
    scrape = parse(sample_text)  # five hosts' scrapes as if one exporter printed them: indices 0, 1 and 2 repeat
    assert [g.index for g in scrape.sample.gpus] == [0, 1, 2] and scrape.skipped == {"duplicate_index": 5}


@pytest.mark.parametrize("value, expect_unsupported", [
    ("9223372036854775794", True),  # INT64_BLANK + 2 = NOT_SUPPORTED (the DCGM README's memory-temperature value)
    ("9223372036854775795", True),  # + 3 = NOT_PERMISSIONED
    ("9223372036854775792", False),  # plain blank
    ("140737488355330.000000", True),  # FP64_BLANK + 2, printed as a float
    ("2147483632", False),  # INT32_BLANK on a temperature
])
def test_blank_sentinels_are_missing(value, expect_unsupported):
    text = f"DCGM_FI_DEV_MEMORY_TEMP{{{LABELS}}} {value}\nDCGM_FI_DEV_GPU_TEMP{{{LABELS}}} 61\n"
    scrape = parse(text)
    (g,) = scrape.sample.gpus
    assert g.hbm_temp_c is None and g.gpu_temp_c == 61 and scrape.skipped["blank"] == 1
    assert ("hbm_temp_c" in g.unsupported) is expect_unsupported


def test_int32_window_does_not_hide_a_large_counter():
    scrape = parse(f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{LABELS}}} 2147483640\n")
    assert scrape.sample.gpus[0].energy_mj == 2147483640


def test_new_field_names_and_crc_sum():
    text = "\n".join(f"{name}{{{LABELS}}} {value}" for name, value in [
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "72"), ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", "91"),
        ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", "96"), ("DCGM_FI_DEV_BOARD_POWER_WATTS", "699.812000"),
        ("DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS", "700.000000"), ("DCGM_FI_DEV_XID_ERROR", "79"),
        ("DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF", "700.000000"),
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "5"), ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "3"),
        ("DCGM_FI_DEV_ROW_REMAP_PENDING", "1"), ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "0"),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "2"), ("DCGM_FI_DEV_GPU_RECOVERY_ACTION", "1"),
        ("DCGM_FI_PROF_SM_ACTIVE", "0.873000"), ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.412000"),
        ("DCGM_FI_DEV_FB_TOTAL", "81559"), ("DCGM_FI_DEV_FB_USED", "74213")]) + "\n"
    g = parse(text).sample.gpus[0]
    assert (g.throttle_reasons, g.gpu_temp_c, g.hbm_temp_c, g.power_w, g.power_limit_w) == (72, 91, 96, 699.812, 700)
    assert g.power_default_limit_w == 700
    assert (g.last_xid, g.nvlink_crc_errors, g.remapped_rows_uncorrectable) == (79, 8, 2)
    assert (g.row_remap_pending, g.row_remap_failure, g.recovery_action) == (True, False, 1)
    assert (g.sm_active, g.tensor_active, g.mem_total_mib, g.mem_used_mib) == (0.873, 0.412, 81559, 74213)


def test_shared_gpu_series_repeated_per_pod_count_once():
    pods = [',namespace="a",pod="p1",container="c"', ',namespace="b",pod="p2",container="c"']
    text = "".join(f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{LABELS}{p}}} 5\n" for p in pods)
    scrape = parse(text)
    assert scrape.sample.gpus[0].nvlink_crc_errors == 5 and len(scrape.pods[H100]) == 2


def test_out_of_range_values_become_none_and_are_counted():
    scrape = parse(f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}} 140\nDCGM_FI_DEV_POWER_USAGE{{{LABELS}}} -3.0\n")
    g = scrape.sample.gpus[0]
    assert g.gpu_util_pct is None and g.power_w is None
    assert scrape.skipped["invalid:gpu_util_pct"] == 1 and scrape.skipped["invalid:power_w"] == 1


def test_odd_gpu_labels_are_skipped():
    text = 'DCGM_FI_DEV_GPU_TEMP{gpu="²",UUID="GPU-a"} 5\nDCGM_FI_DEV_GPU_TEMP{gpu="0"} 5\n'
    assert parse(text).skipped["no_gpu_label"] == 2


def test_a_malformed_line_costs_only_that_line():
    text = f"DCGM_FI_DEV_GPU_TEMP{{{LABELS}}} 61\nDCGM_FI_DEV_SM_CLOCK{{gpu=\"0\" 1980\n"
    scrape = parse(text)
    assert scrape.sample.gpus[0].gpu_temp_c == 61 and scrape.skipped["bad_line"] == 1


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path != "/metrics":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def exporter(sample_text):
    handler = type("H", (_Handler,), {"body": sections(sample_text)[3].encode()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_scrapes_a_real_http_endpoint(exporter):
    collector = DcgmExporterCollector(host="l40s", url=f"{exporter}/metrics", clock=lambda: 1_760_000_000.0)
    assert collector.is_supported()
    first, second = collector.sample(), collector.sample()
    assert [g.uuid for g in first.sample.gpus] == L40S and (first.sample.seq, second.sample.seq) == (0, 1)
    assert first.sample.host == "l40s"
    wrong = DcgmExporterCollector(host="l40s", url=f"{exporter}/nope")
    assert not wrong.is_supported() and "404" in wrong.unsupported_reason
    with pytest.raises(ExporterUnavailableError) as err:
        wrong.sample()
    assert err.value.retryable


def test_endpoint_down_or_without_gpus_is_unsupported():
    down = DcgmExporterCollector(host="h", url="http://127.0.0.1:9/metrics", timeout_s=0.5)
    assert not down.is_supported()
    empty = DcgmExporterCollector(host="h", fetch=lambda url: "# HELP go_goroutines x\ngo_goroutines 12\n")
    assert not empty.is_supported() and "no DCGM GPU metrics" in empty.unsupported_reason


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400))
def test_arbitrary_text_never_crashes(text):
    parse(text)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.sampled_from('DCGM_FI_DEV_GPU_TEMP{gpu="0²٣",UUID="G"} 1.5e9#\n\\'), max_size=200))
def test_near_miss_exposition_never_crashes(text):
    parse(text)


_KIND_VALUES = {
    "float": st.floats(min_value=0, max_value=100, allow_nan=False).map(lambda v: round(v, 6)),
    "ratio": st.floats(min_value=0, max_value=1, allow_nan=False).map(lambda v: round(v, 6)),
    "int": st.integers(min_value=0, max_value=2**40), "int_small": st.integers(min_value=0, max_value=0x7FF),
    "bool": st.integers(min_value=0, max_value=1), "xid": st.integers(min_value=1, max_value=200),
    "recovery": st.integers(min_value=0, max_value=7),
}


def _values(kind: str, target: str):
    """The kind's values, within the bound the schema gives the field (a value past it is a glitch: test_dcgm's
    out-of-range tests cover those)."""
    le = next((m.le for m in GpuReading.model_fields[target].metadata if getattr(m, "le", None) is not None), None)
    return _KIND_VALUES[kind] if le is None or kind in ("float", "ratio") else _KIND_VALUES[kind].map(
        lambda v: min(v, le))


_BY_TARGET: dict[str, list[str]] = {}
for _name, (_target, _kind) in FIELDS.items():
    _BY_TARGET.setdefault(_target, []).append(_name)


@st.composite
def exposition(draw):
    """Several GPUs, each with random DCGM metrics (old or new names), rendered the way dcgm-exporter prints."""
    gpus = draw(st.lists(st.integers(min_value=0, max_value=15), min_size=1, max_size=8, unique=True))
    expected, series = {}, {}
    for index in gpus:
        uuid = f"GPU-{index:08x}-0000-4000-8000-{index:012x}"
        labels = f'gpu="{index}",UUID="{uuid}",pci_bus_id="00000000:{index + 16:02X}:00.0",modelName="NVIDIA H100"'
        targets = draw(st.lists(st.sampled_from(sorted(_BY_TARGET)), unique=True, min_size=1, max_size=12))
        expected[uuid] = {}
        for target in targets:
            name = draw(st.sampled_from(_BY_TARGET[target]))
            kind = FIELDS[name][1]
            value = draw(_values(kind, target))
            text = f"{value:f}" if kind in ("float", "ratio") else str(value)
            series.setdefault(name, []).append(f"{name}{{{labels}}} {text}")
            expected[uuid][target] = (bool(value) if kind == "bool" else value)
    lines = []
    for name, rows in series.items():
        lines += [f"# HELP {name} generated", f"# TYPE {name} {'counter' if FIELDS[name][1] == 'int' else 'gauge'}"]
        lines += rows
    return "\n".join(lines) + "\n", expected


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(exposition())
def test_generated_exposition_maps_back(case):
    text, expected = case
    scrape = parse(text)
    assert sorted(g.uuid for g in scrape.sample.gpus) == sorted(expected)
    for g in scrape.sample.gpus:
        for target, value in expected[g.uuid].items():
            assert getattr(g, target) == pytest.approx(value, abs=1e-6), target
