"""Stream stages: pure vectorised computations wrapped by thin faust stages (see registry.py)."""
