"""The power/thermal stage: its rules (rules.py, racks.py) and its step for the stream runtime (stage.py)."""
