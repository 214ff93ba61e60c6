"""The agent's on-disk spool (segment files of framed records) and the publisher that falls back on it."""

from agents.spool.publisher import SpoolingPublisher
from agents.spool.record import Spooled, SpoolRecord
from agents.spool.store import FsyncPolicy, Spool, SpoolUnwritable

__all__ = ["FsyncPolicy", "Spool", "SpoolRecord", "SpoolUnwritable", "Spooled", "SpoolingPublisher"]
