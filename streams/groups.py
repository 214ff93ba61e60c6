"""The stream workers' names on the cluster: the namespace their changelogs and internal topics live under, and each
worker's consumer group (what the lag watch, `up` and the breaker look for)."""

from __future__ import annotations

from streams import registry

APP_ID = "fleetpulse-streams"


def app_id(prefix: str = "") -> str:
    """The streams namespace: changelogs and internal topics are named under it, whichever worker writes them; the
    topic prefix keeps namespaces on one cluster apart."""
    return f"{prefix}{APP_ID}"


def group_id(prefix: str = "", worker: str = registry.WORKERS[0]) -> str:
    """A worker's consumer group (faust's app id): the namespace for the first worker, `<namespace>-<worker>` else."""
    return app_id(prefix) if worker == registry.WORKERS[0] else f"{app_id(prefix)}-{worker}"


def worker_groups(prefix: str = "", stages: list[str] | None = None) -> list[tuple[str, list[str]]]:
    """Per worker the chosen stages need: its consumer group and the registry topics it reads (its lag's inputs)."""
    return [(group_id(prefix, worker), sorted({t.full(prefix) for st in chosen for t in st.topics()}))
            for worker, chosen in registry.workers(registry.select(stages)).items()]
