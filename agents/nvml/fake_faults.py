"""Fault injection for FakeNvml: lost GPUs, ECC errors, throttling, row remaps, PCIe and NVLink links, the fabric, MIG,
XID events."""

from __future__ import annotations

import threading

import pynvml

UNATTRIBUTED = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId when an event belongs to no MIG instance
# Clocks-event reason bits (REFERENCE.md section 4).
SW_POWER_CAP = pynvml.nvmlClocksEventReasonSwPowerCap
HW_SLOWDOWN = pynvml.nvmlClocksEventReasonHwSlowdown
SW_THERMAL = pynvml.nvmlClocksEventReasonSwThermalSlowdown
HW_THERMAL = pynvml.nvmlClocksEventReasonHwThermalSlowdown


class FaultInjection:
    """Mixin of FakeNvml: each method changes what NVML answers the way the real fault shows up there."""

    gpus: list[dict]
    _device_errors: dict[int, int]
    _function_errors: dict[tuple[int, str], int]

    def _emit(self, index: int, event_type: int, data: int, gpu_instance: int = UNATTRIBUTED) -> None:
        raise NotImplementedError

    def fail(self, index: int, function: str, code: int = pynvml.NVML_ERROR_NOT_SUPPORTED) -> None:
        """Make one pynvml function fail on one GPU with an NVML return code (e.g. NO_PERMISSION, TIMEOUT)."""
        if not hasattr(pynvml, function):
            raise ValueError(f"pynvml has no function {function!r}")
        self._function_errors[(index, function)] = code

    def unsupported(self, index: int, *functions: str) -> None:
        for function in functions:
            self.fail(index, function, pynvml.NVML_ERROR_NOT_SUPPORTED)

    def hang(self, index: int, function: str) -> None:
        """One pynvml function on one GPU blocks (a wedged GPU or driver: the call never returns) until `release`."""
        if not hasattr(pynvml, function):
            raise ValueError(f"pynvml has no function {function!r}")
        self._hangs[(index, function)] = threading.Event()

    def release(self) -> None:
        """Every hung call returns (and no call hangs any more)."""
        hangs, self._hangs = self._hangs, {}
        for event in hangs.values():
            event.set()

    def heal(self, index: int) -> None:
        """Undo every per-function failure injected on this GPU."""
        for key in [k for k in self._function_errors if k[0] == index]:
            del self._function_errors[key]

    def lose_gpu(self, index: int) -> None:
        """The GPU falls off the bus: Xid 79 is delivered, then every call on it answers GPU_IS_LOST."""
        self.xid(index, 79)
        self._device_errors[index] = pynvml.NVML_ERROR_GPU_IS_LOST

    def require_reset(self, index: int, xid: int = 95) -> None:
        """A fatal error (default Xid 95, uncontained ECC) leaves the GPU answering RESET_REQUIRED."""
        self.xid(index, xid)
        self.gpus[index]["recovery_action"] = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
        self._device_errors[index] = pynvml.NVML_ERROR_RESET_REQUIRED

    def wedge(self, index: int) -> None:
        """The driver answers UNKNOWN for the GPU (seen before it is declared lost)."""
        self._device_errors[index] = pynvml.NVML_ERROR_UNKNOWN

    def restore_gpu(self, index: int) -> None:
        """A GPU reset or reboot brought it back: calls work again, volatile ECC counts restart, no action pending."""
        self._device_errors.pop(index, None)
        g = self.gpus[index]
        g["recovery_action"] = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
        g["ecc"]["sbe_volatile"] = g["ecc"]["dbe_volatile"] = 0
        if g["remapped_rows"]["pending"]:
            g["remapped_rows"]["pending"] = 0  # a pending remap activates on reset

    def double_bit_error(self, index: int, count: int = 1) -> None:
        """Uncorrectable ECC error: DBE counters grow, the DBE event and Xid 48 are delivered."""
        ecc = self.gpus[index]["ecc"]
        ecc["dbe_volatile"] += count
        ecc["dbe_aggregate"] += count
        self._emit(index, pynvml.nvmlEventTypeDoubleBitEccError, 0)
        self.xid(index, 48)

    def row_remap(self, index: int, *, failure: bool = False) -> None:
        """A row is marked for remapping (pending until reset, Xid 63) or the remap failed (Xid 64)."""
        rows = self.gpus[index]["remapped_rows"]
        rows["uncorrectable"] += 1
        if failure:
            rows["failure"] = 1
            self._emit(index, pynvml.nvmlEventTypeDramRetirementFailure, 0)
            self.xid(index, 64)
        else:
            rows["pending"] = 1
            self._emit(index, pynvml.nvmlEventTypeDramRetirementEvent, 0)
            self.xid(index, 63)

    def corrected_errors(self, index: int, count: int) -> None:
        """Corrected (single-bit) ECC errors: both counters grow, nothing else tells (DCGM issue 313's GPU)."""
        ecc = self.gpus[index]["ecc"]
        ecc["sbe_volatile"] += count
        ecc["sbe_aggregate"] += count

    def spend_spare_rows(self, index: int, banks: int, *, to: str = "none") -> None:
        """`banks` memory banks move from 'max' (every spare row left) to level `to` of the remapper histogram."""
        hist = self.gpus[index]["remap_histogram"]
        moved = min(banks, hist["max"])
        hist["max"] -= moved
        hist[to] += moved

    def pcie_train_down(self, index: int, *, width: int | None = None, gen: int | None = None) -> None:
        """The GPU's PCIe link retrained at fewer lanes or a lower generation (a bad riser, slot or card edge)."""
        link = self.gpus[index]["pcie_link"]
        link["width"] = link["width"] if width is None else width
        link["gen"] = link["gen"] if gen is None else gen

    def nvlink_down(self, index: int, *links: int) -> None:
        """NVLink links go inactive (every link when none is named), as after a failed training or a bad tray."""
        nv = self.gpus[index]["nvlink"]
        nv["inactive"] = sorted(set(nv.get("inactive", [])) | set(links or range(nv["links"])))

    def fabric_failure(self, index: int, status: int = pynvml.NVML_ERROR_UNKNOWN, health_mask: int = 0) -> None:
        """The GPU's fabric training completed with an error (Fabric Manager down or the NVSwitch tray failed)."""
        fabric = self.gpus[index]["fabric"]
        fabric["state"], fabric["status"] = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, status
        fabric["health_mask"] = health_mask

    def throttle(self, index: int, reasons: int, *, temp_c: int | None = None, hbm_temp_c: int | None = None,
                 power_w: float | None = None, sm_clock_mhz: int | None = None) -> None:
        """Set the clocks-event reason bits, with the readings that go with them (e.g. HW thermal: hot, half clock)."""
        g = self.gpus[index]
        g["clocks_event_reasons"] = reasons
        if temp_c is not None:
            g["temperature_c"] = temp_c
        if hbm_temp_c is not None:
            g["memory_temperature_c"] = hbm_temp_c
        if power_w is not None:
            g["power_mw"] = int(round(power_w * 1000))
        if sm_clock_mhz is not None:
            g["clocks_mhz"]["sm"] = sm_clock_mhz

    def enable_mig(self, index: int, enabled: bool = True) -> None:
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        self.gpus[index]["mig_mode"] = [mode, mode]

    def xid(self, index: int, code: int, *, gpu_instance: int | None = None) -> None:
        """Deliver an Xid through nvmlEventTypeXidCriticalError to every event set registered for it."""
        self._emit(index, pynvml.nvmlEventTypeXidCriticalError, code,
                   UNATTRIBUTED if gpu_instance is None else gpu_instance)

    def advance(self, seconds: float) -> None:
        """Let time pass: energy integrates power, throttle-time counters grow while their reason bit is set."""
        ns = int(seconds * 1e9)
        for g in self.gpus:
            g["total_energy_mj"] += int(g["power_mw"] * seconds)
            reasons = g["clocks_event_reasons"]
            if reasons & SW_POWER_CAP:
                g["violation_ns"]["power"] += ns
            if reasons & (SW_THERMAL | HW_THERMAL):
                g["violation_ns"]["thermal"] += ns
