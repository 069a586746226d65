"""The registry: imports the definition modules named in settings, validates, then freezes.

Definitions are module-level values: `TaskDefinition` (or `WatchSync`) ones, inbound triggers
(`TriggerDefinition`, `Registry.triggers`), named limits (`LimitDefinition`,
`Registry.limits`), features (`Registry.features`), metadata providers (`Registry.providers`)
and the trickplay provider (`Registry.trickplay`); importing a module is all it takes to
declare them. After `load` the registry is read-only.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, TypeVar

from tasks.definition import TaskDefinition, WatchSync
from tasks.errors import ManifestError
from tasks.features import FeatureDefinition
from tasks.limits import LimitDefinition
from tasks.providers import ProviderDefinition, UnknownProvider
from tasks.trickplay import TrickplayDefinition
from tasks.triggers import TriggerDefinition


class RegistryError(RuntimeError):
    """Startup cannot continue: a definition module or manifest is invalid."""


class UnknownTaskError(KeyError):
    # A KeyError so the Mapping protocol (`in`, `.get`) treats an unknown id as absent.
    def __init__(self, task_id: str) -> None:
        super().__init__(task_id)
        self.task_id = task_id

    def __str__(self) -> str:
        return f"unknown task {self.task_id!r}"


class UnknownTriggerError(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown trigger {self.name!r}"


class Registry(Mapping[str, TaskDefinition]):
    def __init__(
        self,
        definitions: Iterable[TaskDefinition],
        triggers: Iterable[TriggerDefinition] = (),
        limits: Iterable[LimitDefinition] = (),
        features: Iterable[FeatureDefinition] = (),
        providers: Iterable[ProviderDefinition] = (),
        trickplay: Iterable[TrickplayDefinition] = (),
    ) -> None:
        by_id: dict[str, TaskDefinition] = {}
        for definition in definitions:
            if definition.id in by_id and by_id[definition.id] is not definition:
                raise RegistryError(
                    str(ManifestError(definition.id, "id", "is defined more than once"))
                )
            by_id[definition.id] = definition
        for definition in by_id.values():
            for other in definition.exclusive_with:
                if other not in by_id:
                    raise RegistryError(
                        str(ManifestError(definition.id, "exclusive_with", f"{other!r} unknown"))
                    )
        covering: dict[str, str] = {}
        for definition in by_id.values():
            for stage in definition.covers_stages:
                if stage.id in covering:
                    problem = f"stage {stage.id!r} is covered by task {covering[stage.id]!r} too"
                    raise RegistryError(str(ManifestError(definition.id, "covers_stages", problem)))
                covering[stage.id] = definition.id
        self._by_id = MappingProxyType(by_id)
        self._triggers = MappingProxyType(_checked_triggers(triggers, by_id))
        self._limits = MappingProxyType(_checked_limits(limits, by_id))
        self._features = MappingProxyType(_checked_features(features))
        self._providers = MappingProxyType(_checked_providers(providers, self._limits))
        self._trickplay = _checked_trickplay(trickplay, by_id)

    def __getitem__(self, task_id: str) -> TaskDefinition:
        try:
            return self._by_id[task_id]
        except KeyError:
            raise UnknownTaskError(task_id) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    @property
    def triggers(self) -> Mapping[str, TriggerDefinition]:
        """The inbound triggers, by name (read-only)."""
        return self._triggers

    @property
    def limits(self) -> Mapping[str, LimitDefinition]:
        """The named limits, by id (read-only)."""
        return self._limits

    @property
    def features(self) -> Mapping[str, FeatureDefinition]:
        """The features (HTTP routes under /api/v1/features/<id>/), by id (read-only)."""
        return self._features

    @property
    def providers(self) -> Mapping[str, ProviderDefinition]:
        """The metadata providers (`providers.call`), by id (read-only)."""
        return self._providers

    @property
    def trickplay(self) -> TrickplayDefinition | None:
        """The trickplay provider (`define_trickplay`), if a module declares one."""
        return self._trickplay

    def provider(self, provider_id: str) -> ProviderDefinition:
        try:
            return self._providers[provider_id]
        except KeyError:
            raise UnknownProvider(provider_id) from None

    def trigger(self, name: str) -> TriggerDefinition:
        try:
            return self._triggers[name]
        except KeyError:
            raise UnknownTriggerError(name) from None


def _checked_triggers(
    triggers: Iterable[TriggerDefinition], tasks: Mapping[str, TaskDefinition]
) -> dict[str, TriggerDefinition]:
    by_name: dict[str, TriggerDefinition] = {}
    for trigger in triggers:
        problem = None
        if trigger.name in by_name and by_name[trigger.name] is not trigger:
            problem = ("name", "is defined more than once")
        elif trigger.task not in tasks:
            problem = ("task", f"{trigger.task!r} is not a registered task")
        if problem is not None:
            raise RegistryError(str(ManifestError(trigger.name, *problem, what="trigger")))
        by_name[trigger.name] = trigger
    return by_name


class _Declaration(Protocol):
    @property
    def id(self) -> str: ...


D = TypeVar("D", bound=_Declaration)


def _by_id(
    declared: Iterable[D], what: str, twice: str = "is defined more than once"
) -> dict[str, D]:
    """Declarations by id; RegistryError naming the first id declared twice."""
    by_id: dict[str, D] = {}
    for one in declared:
        if one.id in by_id and by_id[one.id] is not one:
            raise RegistryError(str(ManifestError(one.id, "id", twice, what=what)))
        by_id[one.id] = one
    return by_id


def _checked_limits(
    limits: Iterable[LimitDefinition], tasks: Mapping[str, TaskDefinition]
) -> dict[str, LimitDefinition]:
    by_id = _by_id(limits, "limit")
    for task in tasks.values():
        for name in task.limits:
            if name not in by_id:
                problem = f"{name!r} is not a declared limit (define_limit)"
                raise RegistryError(str(ManifestError(task.id, "limits", problem)))
    return by_id


def _checked_features(features: Iterable[FeatureDefinition]) -> dict[str, FeatureDefinition]:
    return _by_id(features, "feature", "is defined more than once: its routes would collide")


def _checked_providers(
    providers: Iterable[ProviderDefinition], limits: Mapping[str, LimitDefinition]
) -> dict[str, ProviderDefinition]:
    by_id = _by_id(providers, "provider")
    for provider in by_id.values():
        if unknown := [name for name in provider.limits if name not in limits]:
            problem = f"{unknown[0]!r} is not a declared limit (define_limit)"
            raise RegistryError(str(ManifestError(provider.id, "limits", problem, what="provider")))
    return by_id


def _checked_trickplay(
    declared: Iterable[TrickplayDefinition], tasks: Mapping[str, TaskDefinition]
) -> TrickplayDefinition | None:
    found = list(dict.fromkeys(declared))
    problem = None
    if len(found) > 1:
        problem = ("task", "a second trickplay provider is declared: there is one")
    elif found and found[0].task not in tasks:
        problem = ("task", f"{found[0].task!r} is not a registered task")
    if problem is not None:
        raise RegistryError(str(ManifestError("trickplay", *problem, what="trickplay provider")))
    return found[0] if found else None


@dataclass
class Declared:
    """What the definition modules declare, by kind."""

    tasks: list[TaskDefinition] = field(default_factory=list)
    triggers: list[TriggerDefinition] = field(default_factory=list)
    limits: list[LimitDefinition] = field(default_factory=list)
    features: list[FeatureDefinition] = field(default_factory=list)
    providers: list[ProviderDefinition] = field(default_factory=list)
    trickplay: list[TrickplayDefinition] = field(default_factory=list)

    def add(self, value: object) -> None:
        if isinstance(value, TaskDefinition):
            self.tasks.append(value)
        elif isinstance(value, WatchSync):
            self.tasks.extend((value.push, value.pull))
        elif isinstance(value, TriggerDefinition):
            self.triggers.append(value)
        elif isinstance(value, LimitDefinition):
            self.limits.append(value)
        elif isinstance(value, FeatureDefinition):
            self.features.append(value)
        elif isinstance(value, ProviderDefinition):
            self.providers.append(value)
        elif isinstance(value, TrickplayDefinition):
            self.trickplay.append(value)


def _declare_from(module_name: str, declared: Declared) -> None:
    try:
        module = importlib.import_module(module_name)
    except ManifestError as exc:
        raise RegistryError(f"in {module_name}: {exc}") from exc
    except ImportError as exc:
        raise RegistryError(f"cannot import task module {module_name!r}: {exc}") from exc
    for value in vars(module).values():
        declared.add(value)


# Registered in every process before the configured modules (LUMASTRA_TASK_MODULES): the
# engine's own upkeep, which an operator's list must not be able to leave out by accident.
BUILT_IN_MODULES = ("tasks.definitions.maintenance",)


def load(module_names: Iterable[str]) -> Registry:
    declared = Declared()
    for name in module_names:
        _declare_from(name, declared)
    return Registry(
        declared.tasks,
        declared.triggers,
        declared.limits,
        declared.features,
        declared.providers,
        declared.trickplay,
    )


_registry: Registry | None = None


def install(registry: Registry) -> None:
    """Make `registry` the process's registry; called once at startup."""
    global _registry
    _registry = registry


def get() -> Registry:
    if _registry is None:
        raise RegistryError("the task registry has not been loaded (Django not set up?)")
    return _registry
