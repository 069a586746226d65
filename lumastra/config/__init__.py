"""The engine's typed view of the environment.

Every variable the engine reads is declared once, with its default, its parser and the roles
it matters to, in the module of those roles; the catalog's own settings are declared beside
the catalog, in `coverage/config.py`. `docs/environment.md` lists the same names under the
same roles (`tests/unit/test_config_docs.py` keeps the two in step). The roles read the
settings built from these; only process plumbing reads `os.environ` itself (the role scripts,
the pool settings a worker hands its children, a command's marks).

- `env`: how a variable is declared and read: parsers, `ConfigError`
- `common`: every role's settings, and those of both roles that start runs (web and worker)
- `web`: the web role's settings, and Flower's
- `worker`: the worker role's settings: running runs and the loops
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cache

from lumastra.config import env
from lumastra.config.common import EveryRole, Starters, WorkerMode, namespace_of
from lumastra.config.env import ConfigError, EnvVar
from lumastra.config.web import Flower, Web
from lumastra.config.worker import Worker
from tasks.window import Window, WindowError

__all__ = [
    "CLASS_PATTERNS",
    "TRIGGER_SECRET",
    "VARIABLES",
    "Config",
    "ConfigError",
    "WorkerMode",
    "current",
    "load",
    "trigger_variable",
]

# Per-class overrides are a family of variables; the docs list them by this pattern.
CLASS_PATTERNS = (
    EnvVar("LUMASTRA_CONCURRENCY_<CLASS>", "see RESOURCE_CLASSES", "worker processes of a pool"),
    EnvVar("LUMASTRA_QUEUE_DEPTH_CAP_<CLASS>", "see RESOURCE_CLASSES", "waiting messages cap"),
    EnvVar("LUMASTRA_HARD_TIMEOUT_S_<CLASS>", "see RESOURCE_CLASSES", "default hard timeout"),
    EnvVar("LUMASTRA_STALL_FAIL_S_<CLASS>", "see RESOURCE_CLASSES", "default stall limit"),
    EnvVar("LUMASTRA_WINDOW_<CLASS>", "", "the class's run window (tasks.window.Window.parse)"),
)
# Each inbound trigger's signing secret is a variable of its own, named after the trigger
# (upper case, dashes as underscores), so a secret store can hand out one per integration;
# with `_FILE` like any other.
WINDOW_PREFIX = "LUMASTRA_WINDOW_"
TRIGGER_SECRET_PREFIX = "LUMASTRA_TRIGGER_SECRET_"  # noqa: S105 (a name, not a secret)
TRIGGER_SECRET = EnvVar(
    f"{TRIGGER_SECRET_PREFIX}<TRIGGER>",
    "",
    "the secret that signs the trigger's requests; unset: a bearer token only",
    roles=env.WEB,
)


@dataclass(frozen=True)
class Config(Worker, Starters, Flower, Web, EveryRole):
    """Every role's settings in one object (`settings.CONFIG`), whichever role this process is."""

    concurrency_overrides: Mapping[str, int] = field(default_factory=dict)
    queue_depth_cap_overrides: Mapping[str, int] = field(default_factory=dict)
    hard_timeout_overrides: Mapping[str, int] = field(default_factory=dict)
    stall_fail_overrides: Mapping[str, int] = field(default_factory=dict)
    # Resource class → its run window (LUMASTRA_WINDOW_<CLASS>).
    class_windows: Mapping[str, Window] = field(default_factory=dict)
    # Trigger name → its signing secret (LUMASTRA_TRIGGER_SECRET_<TRIGGER>).
    trigger_secrets: Mapping[str, str] = field(default_factory=dict)


VARIABLES: dict[str, EnvVar] = env.declared(Config)


def _per_class(environ: Mapping[str, str], prefix: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for key, raw in environ.items():
        if key.startswith(prefix):
            try:
                found[key.removeprefix(prefix).lower()] = int(raw)
            except ValueError:
                raise ConfigError(f"{key}={raw!r}: expected an integer") from None
            if int(raw) < 1:
                raise ConfigError(f"{key}={raw!r}: must be at least 1")
    return found


def _class_windows(environ: Mapping[str, str]) -> dict[str, Window]:
    found: dict[str, Window] = {}
    for key, raw in environ.items():
        if not key.startswith(WINDOW_PREFIX) or not raw.strip():
            continue
        try:
            found[key.removeprefix(WINDOW_PREFIX).lower()] = Window.parse(raw)
        except WindowError as exc:
            raise ConfigError(f"{key}={raw!r}: {exc}") from None
    return found


def trigger_variable(name: str) -> str:
    """The variable holding trigger `name`'s secret."""
    return TRIGGER_SECRET_PREFIX + name.upper().replace("-", "_")


def _trigger_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for key in environ:
        variable = key.removesuffix("_FILE")
        if not variable.startswith(TRIGGER_SECRET_PREFIX):
            continue
        name = variable.removeprefix(TRIGGER_SECRET_PREFIX).lower().replace("_", "-")
        if not name or name in found:
            continue
        _, secret = env.lookup(EnvVar(variable, "", TRIGGER_SECRET.help), environ) or ("", "")
        if secret:  # empty is unset: that trigger takes bearer tokens only
            found[name] = secret
    return found


def load(environ: Mapping[str, str]) -> Config:
    found = env.read(
        Config,
        environ,
        concurrency_overrides=_per_class(environ, "LUMASTRA_CONCURRENCY_"),
        queue_depth_cap_overrides=_per_class(environ, "LUMASTRA_QUEUE_DEPTH_CAP_"),
        hard_timeout_overrides=_per_class(environ, "LUMASTRA_HARD_TIMEOUT_S_"),
        stall_fail_overrides=_per_class(environ, "LUMASTRA_STALL_FAIL_S_"),
        trigger_secrets=_trigger_secrets(environ),
        class_windows=_class_windows(environ),
    )
    if found.namespace:
        return found
    return replace(found, namespace=namespace_of(found.valkey_url))


@cache
def current() -> Config:
    """The process's configuration, read once from its environment."""
    return load(os.environ)


def missing_required(role: str, environ: Mapping[str, str]) -> list[EnvVar]:
    """The variables `role` cannot start without that `environ` leaves unset or empty."""
    return [
        var
        for var in VARIABLES.values()
        if var.required
        and role in var.roles
        and not (env.lookup(var, environ) or ("", ""))[1].strip()
    ]
