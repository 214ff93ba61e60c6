"""The health stage: its scoring rules (rules.py) and its step for the stream runtime (stage.py)."""
