"""The SDK task authors use: declare tasks, read the run's context, signal failures, run
commands that die with the run, read media files without reaching past the media roots,
declare the catalog stages a task covers.

The names task authors use are exported here. The modules:

Declaring a task:
- `definition`: `define_task` and the immutable manifest it returns, every option checked
- `policies`: `Timeout`, `Retry`, `Stall`: how long a task or stage may run, is watched, is retried;
  `Debounce`, `Throttle`, `WhileActive`: how the starts of one identity coalesce; `Concurrency`:
  how many runs of one key run at once
- `resources`: the resource classes (the worker pools) with their default budgets and limits
- `schedule`: schedule declarations: `every('15m')`, a cron expression, or `dynamic(loader)`
- `window`: `Window`, the local hours a task's or a class's runs may start in (quiet hours)
- `pipeline`: a pipeline task's stages (`Stage`) and their order
- `retention`: `Retention`, how long a task's ended runs are kept before `history-retention`
  deletes them
- `coverage`: the catalog stages a task covers (`CoveredStage`), and its runs' items
- `triggers`: `define_trigger`, an inbound trigger: a name integrations POST to that starts a task
- `limits`: `define_limit`, a named limit (a rate, a concurrency, per key) tasks share
- `features`: `define_feature`, HTTP routes (a django-ninja Router) under /api/v1/features/<id>/
- `providers`: `define_provider` and `providers.call`: a remote API's answers, cached, under a
  circuit breaker, named limits and a timeout
- `trickplay`: `define_trickplay`: the task that makes an item's trickplay, and where its files
  are, for the API that serves them to players

In the handler:
- `context`: `TaskContext`, what a handler sees of its run (the engine implements it), and
  `ChildRun`, a spawned child as `ctx.children` gives it
- `errors`: the errors a task raises to tell the engine what went wrong, and their kinds
- `media`: `MediaPath` and `open_folder`: media files read without leaving the media roots
- `process`: `ProcessResult`, what `ctx.run_process` returns

Loading:
- `registry`: imports the definition modules named in settings, validates, then freezes
- `definitions`: the task definitions that ship with the project (maintenance, the demo)
- `apps`: the SDK's Django app
"""

from tasks.context import ChildRun, TaskContext
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
    LimitReached,
    PermanentError,
    ProcessFailed,
    RunCancelled,
    TransientError,
)
from tasks.features import FeatureDefinition, define_feature
from tasks.limits import LimitDefinition, define_limit
from tasks.media import MediaFolder, MediaPath, MediaPathError, open_folder
from tasks.pipeline import Stage
from tasks.policies import Concurrency, Debounce, Retry, Stall, Throttle, Timeout, WhileActive
from tasks.process import ProcessResult
from tasks.providers import ProviderDefinition, ProviderUnavailable, define_provider
from tasks.resources import RESOURCE_CLASSES
from tasks.retention import Retention
from tasks.schedule import ScheduleRow, cron, dynamic, every
from tasks.trickplay import TrickplayDefinition, define_trickplay
from tasks.triggers import TriggerDefinition, define_trigger
from tasks.window import OnClose, Window

__all__ = [
    "RESOURCE_CLASSES",
    "Backpressure",
    "ChildRun",
    "Concurrency",
    "CoverageBatch",
    "CoverageItem",
    "CoveredStage",
    "Debounce",
    "ErrorKind",
    "FatalError",
    "FeatureDefinition",
    "ItemFacts",
    "LimitDefinition",
    "LimitReached",
    "MediaFolder",
    "MediaPath",
    "MediaPathError",
    "NoInput",
    "OnClose",
    "Overlap",
    "PermanentError",
    "Priority",
    "ProcessFailed",
    "ProcessResult",
    "ProviderDefinition",
    "ProviderUnavailable",
    "Quotas",
    "Retention",
    "Retry",
    "RunCancelled",
    "ScheduleRow",
    "Stage",
    "Stall",
    "TaskContext",
    "TaskDefinition",
    "Throttle",
    "Timeout",
    "TransientError",
    "TrickplayDefinition",
    "TriggerDefinition",
    "WatchSync",
    "WhileActive",
    "Window",
    "cron",
    "define_feature",
    "define_limit",
    "define_provider",
    "define_task",
    "define_trickplay",
    "define_trigger",
    "define_watch_sync",
    "dynamic",
    "every",
    "open_folder",
    "skipped",
]
