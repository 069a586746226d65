"""The SDK task authors use: declare tasks, read the run's context, signal failures, run
commands that die with the run, read media files without reaching past the media roots,
declare the catalog stages a task covers."""

from tasks.context import TaskContext
from tasks.coverage import CoverageBatch, CoverageItem, CoveredStage, ItemFacts, skipped
from tasks.definition import (
    Backpressure,
    NoInput,
    Overlap,
    Priority,
    Quotas,
    TaskDefinition,
    WatchSync,
    define_task,
    define_watch_sync,
)
from tasks.errors import (
    ErrorKind,
    FatalError,
    PermanentError,
    ProcessFailed,
    RunCancelled,
    TransientError,
)
from tasks.media import MediaFolder, MediaPath, MediaPathError, open_folder
from tasks.pipeline import Stage
from tasks.policies import Retry, Stall, Timeout
from tasks.process import ProcessResult
from tasks.resources import RESOURCE_CLASSES
from tasks.schedule import ScheduleRow, cron, dynamic, every

__all__ = [
    "RESOURCE_CLASSES",
    "Backpressure",
    "CoverageBatch",
    "CoverageItem",
    "CoveredStage",
    "ErrorKind",
    "FatalError",
    "ItemFacts",
    "MediaFolder",
    "MediaPath",
    "MediaPathError",
    "NoInput",
    "Overlap",
    "PermanentError",
    "Priority",
    "ProcessFailed",
    "ProcessResult",
    "Quotas",
    "Retry",
    "RunCancelled",
    "ScheduleRow",
    "Stage",
    "Stall",
    "TaskContext",
    "TaskDefinition",
    "Timeout",
    "TransientError",
    "WatchSync",
    "cron",
    "define_task",
    "define_watch_sync",
    "dynamic",
    "every",
    "open_folder",
    "skipped",
]
