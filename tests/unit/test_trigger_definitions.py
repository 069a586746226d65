"""`define_trigger` and the registry's triggers: a bad trigger fails startup naming the trigger
and the field; the secrets of triggers come from the environment, one variable each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from lumastra import config
from lumastra.config import ConfigError
from orchestrator.apps import _refuse_unknown_trigger_secrets
from tasks import Priority, define_task, define_trigger
from tasks import registry as registry_module
from tasks.errors import ManifestError
from tasks.registry import Registry, RegistryError, UnknownTriggerError
from tasks.triggers import whole_body

SUPPORT = "tests.support"


def _noop(ctx: object, params: object) -> None:
    return None


TASK = define_task(id="target-task", resource_class="io", execute=_noop)


def _rejected(field: str, **options: Any) -> ManifestError:
    with pytest.raises(ManifestError) as caught:
        define_trigger(**{"name": "a-hook", "task": "target-task", **options})
    error = caught.value
    assert (error.task_id, error.field) == (options.get("name", "a-hook"), field), str(error)
    assert str(error).startswith("trigger ")
    return error


def test_a_minimal_trigger_takes_the_body_as_the_input() -> None:
    trigger = define_trigger(name="a-hook", task="target-task")

    assert trigger.input_from is whole_body
    assert trigger.input_from({"a": 1}) == {"a": 1}
    assert trigger.priority is None and trigger.idempotency_key_from is None


def test_a_triggers_priority_is_a_priority() -> None:
    assert define_trigger(name="a-hook", task="t", priority=7).priority is Priority.BACKGROUND
    _rejected("priority", priority=4)


@pytest.mark.parametrize("name", ["", "Upper", "9-starts-with-a-digit", "has space", 3])
def test_a_malformed_name_is_refused(name: object) -> None:
    _rejected("name", name=name)


def test_a_name_ending_in_file_is_refused_for_its_secrets_sake() -> None:
    error = _rejected("name", name="new-file")
    assert "_FILE" in str(error)


def test_the_task_must_be_named() -> None:
    _rejected("task", task="")


@pytest.mark.parametrize("field", ["input_from", "idempotency_key_from"])
def test_a_mapper_must_be_callable_with_the_body(field: str) -> None:
    assert "callable" in str(_rejected(field, **{field: "body['x']"}))
    assert "one argument" in str(_rejected(field, **{field: lambda: {}}))
    assert "one argument" in str(_rejected(field, **{field: lambda body, other: {}}))


def test_the_registry_holds_the_triggers_of_its_modules() -> None:
    loaded = registry_module.load([f"{SUPPORT}.registry_defs_triggers"])

    assert set(loaded.triggers) == {"a-hook"}
    assert loaded.trigger("a-hook").task == "hooked-task"
    assert loaded.trigger("a-hook").priority is Priority.EVENT
    with pytest.raises(TypeError):
        loaded.triggers["other"] = loaded.trigger("a-hook")  # type: ignore[index]
    with pytest.raises(UnknownTriggerError, match="unknown trigger 'nope'"):
        loaded.trigger("nope")


def test_a_trigger_naming_an_unknown_task_fails_startup() -> None:
    with pytest.raises(RegistryError) as caught:
        registry_module.load([f"{SUPPORT}.registry_defs_trigger_unknown_task"])

    message = str(caught.value)
    assert "trigger 'stray-hook'" in message and "'task'" in message and "no-such-task" in message


def test_two_triggers_of_one_name_fail_startup() -> None:
    first = define_trigger(name="twice", task="target-task")
    second = define_trigger(name="twice", task="target-task")

    with pytest.raises(RegistryError, match=r"trigger 'twice', field 'name'"):
        Registry([TASK], [first, second])
    assert set(Registry([TASK], [first, first]).triggers) == {"twice"}


def test_the_process_registry_holds_the_demo_trigger() -> None:
    demo = registry_module.get().trigger("download-finished")

    assert demo.task == "media-probe"
    assert demo.input_from({"item_id": 7}) == {"stage": "probe", "item_id": 7}
    assert demo.idempotency_key_from is not None
    assert demo.idempotency_key_from({"item_id": 7}) == "coverage:probe:7"


# --- the secrets: LUMASTRA_TRIGGER_SECRET_<TRIGGER> -------------------------------------------


def test_each_triggers_secret_is_a_variable_named_after_it(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-a-file\n")

    loaded = config.load(
        {
            "LUMASTRA_TRIGGER_SECRET_DOWNLOAD_FINISHED": "s3cret",
            "LUMASTRA_TRIGGER_SECRET_OTHER_HOOK_FILE": str(secret_file),
            "LUMASTRA_TRIGGER_SECRET_EMPTY": "",
            "LUMASTRA_TRIGGER_SECRET_FILE": "not a trigger's: no name",
        }
    )

    assert loaded.trigger_secrets == {"download-finished": "s3cret", "other-hook": "from-a-file"}
    assert config.trigger_variable("download-finished") == (
        "LUMASTRA_TRIGGER_SECRET_DOWNLOAD_FINISHED"
    )


def test_a_secret_and_its_file_both_set_is_a_config_error() -> None:
    environ = {"LUMASTRA_TRIGGER_SECRET_HOOK": "a", "LUMASTRA_TRIGGER_SECRET_HOOK_FILE": "/x"}

    with pytest.raises(ConfigError, match="both set"):
        config.load(environ)


def test_a_secret_naming_no_declared_trigger_stops_startup() -> None:
    loaded = config.load({"LUMASTRA_TRIGGER_SECRET_DOWNLOAD_FINISHD": "typo"})

    with pytest.raises(ImproperlyConfigured) as caught:
        _refuse_unknown_trigger_secrets(loaded, ["download-finished"])

    assert "LUMASTRA_TRIGGER_SECRET_DOWNLOAD_FINISHD" in str(caught.value)
    _refuse_unknown_trigger_secrets(config.load({}), ["download-finished"])
