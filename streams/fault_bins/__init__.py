"""The fault-bin stage: its rules (rules.py, counters.py, host_state.py), parameters (config.py) and step (stage.py)."""
