"""NVML clocks-event (throttle) reason bits, as GpuReading.throttle_reasons carries them (REFERENCE.md section 4)."""

SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x4, 0x8, 0x20, 0x40, 0x80
