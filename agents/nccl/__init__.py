"""NCCL timing sources: the Inspector plugin's dump files, an in-process step timer, and nccl-tests output."""

from agents.nccl.inspector import InspectorCollector
from agents.nccl.step_timer import BufferSink, StepTimer
from schemas.nccl_tests import BusBandwidth, NcclTestsRun, busbw_factor, parse_nccl_tests, parse_nccl_tests_run

__all__ = ["BufferSink", "BusBandwidth", "InspectorCollector", "NcclTestsRun", "StepTimer", "busbw_factor",
           "parse_nccl_tests", "parse_nccl_tests_run"]
