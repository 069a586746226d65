"""The partition scenarios' registry (LUMASTRA_TASK_MODULES for their hosts and driver): the
battery's slow-progress task and its pipeline, so each host's real worker role plans two
pools (io, cpu) rather than one per class of the whole test registry."""

from tests.support.task_defs import fault_pipe, fault_resume

__all__ = ["fault_pipe", "fault_resume"]
