"""Manifest validation and the registry: a bad definition fails startup naming task and field."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from tasks import (
    Backpressure,
    Priority,
    Quotas,
    Retry,
    Stage,
    Timeout,
    define_task,
    define_watch_sync,
)
from tasks import registry as registry_module
from tasks.definition import NoInput, TaskDefinition
from tasks.errors import ManifestError
from tasks.pipeline import PipelineError, stage_order
from tasks.registry import Registry, RegistryError, UnknownTaskError
from tasks.resources import default_timeout

SUPPORT = "tests.support"


def _noop(ctx: object, params: object) -> None:
    return None


def _define(**options: Any) -> TaskDefinition:
    # A pipeline task's stages carry the bodies; it has no execute of its own.
    body = {} if "pipeline" in options else {"execute": _noop}
    return define_task(**{"id": "sample-task", "resource_class": "io", **body, **options})


def S(name: str, after: tuple[str, ...] = (), **options: Any) -> Stage:
    """A stage with a no-op body: these tests are about the shape of the graph."""
    return Stage(name=name, execute=_noop, after=after, **options)


def _rejected(field: str, task_id: str = "sample-task", **options: Any) -> ManifestError:
    with pytest.raises(ManifestError) as caught:
        _define(id=task_id, **options)
    error = caught.value
    assert (error.task_id, error.field) == (task_id, field), str(error)
    assert repr(task_id) in str(error) and repr(field) in str(error)
    return error


def test_a_minimal_definition_gets_the_documented_defaults() -> None:
    definition = _define()

    assert definition.id == "sample-task"
    assert definition.input_model is NoInput
    assert definition.task_priority is None
    assert definition.timeout == default_timeout(definition.resource_class)
    assert definition.processing_version == 1
    assert definition.quotas == Quotas()
    assert definition.schedule is None
    assert definition.pipeline == () and definition.stage_order == ()
    assert definition.backpressure is Backpressure.FAIL_FAST
    assert definition.exclusive_with == ()
    assert definition.retry_on_worker_loss is True


def test_options_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        define_task("sample-task", "io", _noop)


def test_a_full_definition_is_normalised() -> None:
    definition = _define(
        task_priority=3,
        timeout=Timeout(soft=timedelta(seconds=50), hard=timedelta(minutes=1)),
        processing_version=4,
        quotas=Quotas(max_runs_per_day=10, max_concurrent=2, rate="60/m"),
        backpressure="shed-oldest",
        exclusive_with=["other-task"],
    )

    assert definition.task_priority is Priority.EVENT
    assert definition.backpressure is Backpressure.SHED_OLDEST
    assert definition.exclusive_with == ("other-task",)
    rate = definition.quotas.parsed_rate()
    assert rate is not None and (rate.count, rate.per) == (60, timedelta(minutes=1))


@pytest.mark.parametrize(
    "bad_id",
    ["", "Sample", "1st-task", "-task", "has space", "has.dot", "has_underscore", "a" * 64],
)
def test_bad_id(bad_id: str) -> None:
    _rejected("id", task_id=bad_id)


def test_non_string_id() -> None:
    with pytest.raises(ManifestError) as caught:
        define_task(id=5, resource_class="io", execute=_noop)
    assert caught.value.field == "id"


@pytest.mark.parametrize("resource_class", ["gpu", "IO", "", "cpu "])
def test_unknown_resource_class(resource_class: str) -> None:
    error = _rejected("resource_class", resource_class=resource_class)
    assert "cpu" in error.problem  # lists the known classes


def test_execute_must_be_callable() -> None:
    _rejected("execute", execute="not callable")


def test_input_model_must_be_a_pydantic_model() -> None:
    _rejected("input_model", input_model=dict)


def test_identity_for_must_be_callable() -> None:
    _rejected("identity_for", identity_for="x")


@pytest.mark.parametrize("priority", [0, 4, 6, 8, -1, "2", "high"])
def test_bad_priority(priority: object) -> None:
    _rejected("task_priority", task_priority=priority)


@pytest.mark.parametrize("priority", [1, 2, 3, 5, 7])
def test_each_priority_value(priority: int) -> None:
    assert _define(task_priority=priority).task_priority == priority


@pytest.mark.parametrize(
    "timeout",
    [
        Timeout(soft=timedelta(minutes=10), hard=timedelta(minutes=5)),  # soft > hard
        Timeout(soft=timedelta(0), hard=timedelta(minutes=5)),  # zero soft
        Timeout(soft=timedelta(seconds=-1), hard=timedelta(minutes=5)),
        Timeout(soft=60, hard=120),  # not timedeltas
        timedelta(minutes=5),  # not a Timeout
        300,
    ],
)
def test_bad_timeout(timeout: object) -> None:
    _rejected("timeout", timeout=timeout)


def test_soft_may_equal_hard() -> None:
    equal = Timeout(soft=timedelta(minutes=1), hard=timedelta(minutes=1))
    assert _define(timeout=equal).timeout == equal


@pytest.mark.parametrize("version", [0, -1, "2", 1.5, None])
def test_bad_processing_version(version: object) -> None:
    _rejected("processing_version", processing_version=version)


@pytest.mark.parametrize(
    ("quotas", "field"),
    [
        (Quotas(max_runs_per_day=0), "quotas.max_runs_per_day"),
        (Quotas(max_runs_per_day=-5), "quotas.max_runs_per_day"),
        (Quotas(max_runs_per_day="10"), "quotas.max_runs_per_day"),
        (Quotas(max_concurrent=0), "quotas.max_concurrent"),
        (Quotas(max_concurrent=1.5), "quotas.max_concurrent"),
        (Quotas(rate="60/min"), "quotas.rate"),
        (Quotas(rate="60"), "quotas.rate"),
        (Quotas(rate="fast"), "quotas.rate"),
        (Quotas(rate="-1/s"), "quotas.rate"),
        (Quotas(rate="60/d"), "quotas.rate"),
    ],
)
def test_bad_quotas(quotas: Quotas, field: str) -> None:
    _rejected(field, quotas=quotas)


@pytest.mark.parametrize("policy", ["block", "DROP", "", None])
def test_unknown_backpressure(policy: object) -> None:
    error = _rejected("backpressure", backpressure=policy)
    assert "fail-fast" in error.problem


@pytest.mark.parametrize("policy", ["drop", "fail-fast", "shed-oldest", Backpressure.DROP])
def test_known_backpressure(policy: object) -> None:
    assert _define(backpressure=policy).backpressure is Backpressure(policy)


@pytest.mark.parametrize("value", [None, 0, 1, "no", "False"])
def test_retry_on_worker_loss_is_a_bool(value: object) -> None:
    error = _rejected("retry_on_worker_loss", retry_on_worker_loss=value)
    assert "True or False" in error.problem


def test_a_task_may_opt_out_of_resuming_after_a_lost_worker() -> None:
    assert _define(retry_on_worker_loss=False).retry_on_worker_loss is False


@pytest.mark.parametrize("others", [["Not An Id"], [""], [5]])
def test_exclusive_with_names_task_ids(others: list[object]) -> None:
    _rejected("exclusive_with", exclusive_with=others)


@pytest.mark.parametrize("commands", ["ffmpeg", ["/usr/bin/ffmpeg"], [""], [5]])
def test_requires_commands_names_programs(commands: object) -> None:
    _rejected("requires_commands", requires_commands=commands)


def test_requires_commands_is_kept_as_a_tuple() -> None:
    assert _define(requires_commands=["ffmpeg", "ffprobe"]).requires_commands == (
        "ffmpeg",
        "ffprobe",
    )


# --- pipelines: Kahn's algorithm --------------------------------------------------------------


def test_kahn_ordering_returns_dependency_order() -> None:
    # Declared out of order on purpose: each stage must come after everything it depends on.
    stages = [
        S("publish", after=("thumbnails", "probe")),
        S("thumbnails", after=("decode",)),
        S("probe"),
        S("decode"),
    ]

    order = stage_order(stages)

    assert sorted(order) == sorted(s.name for s in stages)
    for stage in stages:
        for dep in stage.after:
            assert order.index(dep) < order.index(stage.name), order
    # Among stages ready together, declaration order decides (FIFO), so the order is stable.
    assert order == ["probe", "decode", "thumbnails", "publish"]
    assert _define(pipeline=stages).stage_order == tuple(order)


def test_a_chain_and_independent_roots_are_allowed() -> None:
    assert stage_order([S("c", ("b",)), S("b", ("a",)), S("a")]) == ["a", "b", "c"]
    # Two independent roots joining is a fan-in, not a diamond.
    assert stage_order([S("x"), S("y"), S("join", ("x", "y"))]) == ["x", "y", "join"]


def test_a_sync_when_predicate_is_allowed() -> None:
    definition = _define(pipeline=[S("only", when=lambda params: True)])
    assert definition.stage_order == ("only",)


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ([S("a", ("b",)), S("b", ("a",))], "cycle"),
        ([S("a", ("c",)), S("b", ("a",)), S("c", ("b",)), S("d")], "cycle"),
        ([S("a", ("a",))], "cycle"),
        (
            [S("a"), S("b", ("a",)), S("c", ("a",)), S("d", ("b", "c"))],
            "diamond",
        ),
        ([S("a"), S("b", ("a",)), S("c", ("a", "b"))], "diamond"),
        ([S("a", ("missing",))], "unknown stage"),
        ([S("a"), S("a")], "twice"),
        ([S("")], "empty name"),
    ],
    ids=["two-cycle", "three-cycle", "self", "diamond", "shortcut", "unknown", "dup", "empty"],
)
def test_bad_pipeline(stages: list[Stage], message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        stage_order(stages)
    error = _rejected("pipeline", pipeline=stages)
    assert message in error.problem


def test_a_stage_that_awaits_children_needs_what_it_awaits_and_no_diamond() -> None:
    assert stage_order([S("scan"), S("collect", ("scan",), await_children=True)]) == [
        "scan",
        "collect",
    ]
    with pytest.raises(PipelineError, match="`await_children` needs the stages"):
        stage_order([S("collect", await_children=True)])
    diamond = [
        S("scan"),
        S("left", ("scan",)),
        S("right", ("scan",)),
        S("collect", ("left", "right"), await_children=True),
    ]
    with pytest.raises(PipelineError, match="diamond"):
        stage_order(diamond)


def test_an_async_when_predicate_is_rejected() -> None:
    async def decide(params: object) -> bool:
        return True

    async def decide_gen(params: object) -> Any:
        yield True

    for predicate in (decide, decide_gen):
        error = _rejected("pipeline", pipeline=[S("extract", when=predicate)])
        assert "'extract'" in error.problem and "async" in error.problem


def test_a_pipeline_task_has_no_execute_of_its_own() -> None:
    with pytest.raises(ManifestError, match="its stages do the work"):
        define_task(id="sample-task", resource_class="io", execute=_noop, pipeline=[S("a")])


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"resource_class": "gpu-farm"}, "unknown resource_class"),
        ({"timeout": Timeout(soft=timedelta(0), hard=timedelta(1))}, "timeout"),
        ({"retry": Retry(max_attempts=0)}, "retry"),
        ({"execute": "not callable"}, "callable"),
    ],
)
def test_a_stage_option_is_checked(options: dict[str, Any], problem: str) -> None:
    stage = Stage(**{"name": "probe", "execute": _noop, **options})
    error = _rejected("pipeline", pipeline=[stage])
    assert "'probe'" in error.problem and problem in error.problem


# --- define_watch_sync ------------------------------------------------------------------------


def test_watch_sync_declares_push_and_pull() -> None:
    def push(ctx: object, params: object) -> None:
        return None

    def pull(ctx: object, params: object) -> None:
        return None

    pair = define_watch_sync("library", push=push, pull=pull, task_priority=3)

    assert (pair.push.id, pair.pull.id) == ("library-push", "library-pull")
    assert (pair.push.execute, pair.pull.execute) == (push, pull)
    assert pair.push.resource_class == pair.pull.resource_class == "io"
    assert pair.push.task_priority == pair.pull.task_priority == Priority.EVENT
    assert set(Registry([pair.push, pair.pull])) == {"library-push", "library-pull"}


def test_watch_sync_options_are_validated_per_task() -> None:
    with pytest.raises(ManifestError) as caught:
        define_watch_sync("library", push=_noop, pull=_noop, task_priority=4)
    assert (caught.value.task_id, caught.value.field) == ("library-push", "task_priority")


# --- registry.load ----------------------------------------------------------------------------


def test_load_registers_every_definition_of_its_modules() -> None:
    loaded = registry_module.load([f"{SUPPORT}.registry_defs_valid"])

    assert set(loaded) == {
        "alpha-task",
        "beta-task",
        "ghost-task",
        "library-sync-push",
        "library-sync-pull",
    }
    assert loaded["alpha-task"].exclusive_with == ("beta-task",)


def test_the_process_registry_holds_the_built_in_tasks_beside_the_configured_ones() -> None:
    # The demo pack and the test tasks are what LUMASTRA_TASK_MODULES names here; retention is
    # the engine's own and comes from the built-in module, not from the demo pack.
    installed = registry_module.get()

    assert installed["history-retention"].execute is not None
    assert installed["history-retention"].execute.__module__ == "tasks.definitions.maintenance"
    assert "hash-folder" in installed


def test_duplicate_ids_across_modules_fail_startup() -> None:
    modules = [f"{SUPPORT}.registry_defs_dup_a", f"{SUPPORT}.registry_defs_dup_b"]

    with pytest.raises(RegistryError) as caught:
        registry_module.load(modules)

    assert "'dup-task'" in str(caught.value) and "'id'" in str(caught.value)


def test_duplicate_ids_in_one_list_fail() -> None:
    with pytest.raises(RegistryError, match=r"'same-task'.*'id'"):
        Registry([_define(id="same-task"), _define(id="same-task")])


def test_unknown_exclusive_with_fails_startup() -> None:
    with pytest.raises(RegistryError) as caught:
        registry_module.load([f"{SUPPORT}.registry_defs_exclusive"])

    message = str(caught.value)
    assert "'lonely-task'" in message and "'exclusive_with'" in message
    assert "ghost-task" in message


def test_exclusive_with_may_name_a_task_of_another_module() -> None:
    loaded = registry_module.load(
        [f"{SUPPORT}.registry_defs_exclusive", f"{SUPPORT}.registry_defs_valid"]
    )
    assert loaded["lonely-task"].exclusive_with == ("ghost-task",)


def test_an_invalid_manifest_fails_startup_naming_module_task_and_field() -> None:
    with pytest.raises(RegistryError) as caught:
        registry_module.load([f"{SUPPORT}.registry_defs_broken"])

    message = str(caught.value)
    assert f"{SUPPORT}.registry_defs_broken" in message
    assert "'broken-task'" in message and "'resource_class'" in message


def test_a_missing_module_fails_startup() -> None:
    with pytest.raises(RegistryError, match="cannot import task module"):
        registry_module.load([f"{SUPPORT}.no_such_module"])


# --- read-only after load ---------------------------------------------------------------------


def test_the_registry_is_a_read_only_mapping() -> None:
    loaded = registry_module.load([f"{SUPPORT}.registry_defs_valid"])

    assert isinstance(loaded, Mapping)
    assert not isinstance(loaded, MutableMapping)
    with pytest.raises(TypeError):
        loaded["new-task"] = _define(id="new-task")
    with pytest.raises(TypeError):
        del loaded["alpha-task"]
    with pytest.raises(TypeError):
        loaded._by_id["new-task"] = _define(id="new-task")
    for method in ("update", "pop", "setdefault", "clear"):
        assert not hasattr(loaded, method)
    with pytest.raises(AttributeError):
        loaded["alpha-task"].id = "renamed"  # frozen manifest


def test_an_unknown_id_raises_unknown_task_error() -> None:
    loaded = registry_module.load([f"{SUPPORT}.registry_defs_valid"])

    with pytest.raises(UnknownTaskError) as caught:
        loaded["nope"]
    assert caught.value.task_id == "nope"


def test_membership_and_get_of_an_unknown_id() -> None:
    loaded = registry_module.load([f"{SUPPORT}.registry_defs_valid"])

    assert "alpha-task" in loaded
    assert "nope" not in loaded
    assert loaded.get("nope") is None


# --- shape checks define_task does not make yet (tasks/definition.py) -------------------------


def test_bool_processing_version_is_rejected() -> None:
    _rejected("processing_version", processing_version=True)


def test_zero_rate_is_rejected() -> None:
    _rejected("quotas.rate", quotas=Quotas(rate="0/m"))


def test_quotas_must_be_a_quotas_value() -> None:
    _rejected("quotas", quotas={"max_concurrent": 2})


def test_exclusive_with_must_not_be_a_bare_string() -> None:
    _rejected("exclusive_with", exclusive_with="abc")


def test_a_long_identity_is_stored_as_its_digest() -> None:
    class PathInput(BaseModel):
        path: str

    definition = define_task(
        id="long-identity",
        resource_class="io",
        execute=lambda ctx, params: None,
        input_model=PathInput,
        identity_for=lambda params: params.path,
    )
    deep = "/media/" + "sub/" * 100

    identity = definition.identity(PathInput(path=deep))

    assert identity.startswith("sha256:") and len(identity) == 71
    assert identity == definition.identity(PathInput(path=deep))
    assert definition.identity(PathInput(path="/media/a")) == "/media/a"


def test_a_task_may_set_its_own_stall_limits() -> None:
    from tasks import Stall

    stall = Stall(warn=timedelta(minutes=5), fail=timedelta(minutes=30))
    assert _define(stall=stall).stall == stall
    assert _define().stall == Stall()  # the worker's defaults
    assert _define(stall=Stall(auto=True)).stall.auto


@pytest.mark.parametrize(
    "stall",
    [
        "10m",
        "Stall(warn=0)",
    ],
)
def test_a_malformed_stall_is_refused(stall: str) -> None:
    from tasks import Stall

    bad = {
        "10m": "10m",
        "Stall(warn=0)": Stall(warn=timedelta(0)),
    }[stall]
    _rejected("stall", stall=bad)


def test_stall_warn_must_come_before_fail() -> None:
    from tasks import Stall

    error = _rejected("stall", stall=Stall(warn=timedelta(minutes=5), fail=timedelta(minutes=1)))
    assert "warn must come before fail" in str(error)
