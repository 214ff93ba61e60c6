"""Host silence, broken monitors and job stalls (rules.py: what they mean; stage.py: the steps)."""
