"""The stragglers stage: NCCL timings scored per job (scoring, windows) and explained by GPU condition (cause)."""
