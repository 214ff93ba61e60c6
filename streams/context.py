"""What a stage's wiring is handed: its settings, counters, producer and logger (no stage imports another for it)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from streams.emit import Emitter
from streams.metrics import StageMetrics
from streams.settings import StreamsSettings


@dataclass
class StageContext:
    """What a stage's wiring gets: its settings, its counters, where it produces, and its logger."""

    name: str
    settings: StreamsSettings
    metrics: StageMetrics
    emitter: Emitter
    log: logging.LoggerAdapter
