"""The lifecycle stage: node state machine (rules.py), drain breaker (breaker.py), usable compute (usable_compute.py),
and its two steps for the stream runtime (stage.py)."""
