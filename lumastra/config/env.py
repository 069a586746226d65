"""How a variable is declared and read: its name, default, parser, help and the roles that read
it.

A settings class is a frozen dataclass whose fields are `variable(...)`s; `read` builds it from
an environment, so every settings class (the engine's `lumastra.config.Config`, the catalog's
`coverage.config.CoverageConfig`) parses and refuses the same way.

A variable has one name: Lumastra has no release yet, so a renamed variable keeps no old name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

# The project directory: relative media roots are taken from it (the demo's default is one).
_PROJECT_DIR = Path(__file__).resolve().parents[2]

# The roles, each a kind of process (deploy/start-<role>.sh), and the sets of them a variable
# matters to; docs/environment.md has one section per set used here.
ROLES = ("web", "worker", "beat", "flower")
WEB = frozenset({"web"})
WORKER = frozenset({"worker"})
FLOWER = frozenset({"flower"})
STARTERS = WEB | WORKER  # both start runs and read their live state
EVERY_ROLE = frozenset(ROLES)


class ConfigError(ValueError):
    """A variable holds a value the system cannot use."""


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str
    help: str
    roles: frozenset[str] = EVERY_ROLE
    # The role scripts refuse to start a role in `roles` without it (`lumastra.preflight`).
    required: bool = False


def variable(
    name: str,
    default: str,
    parse: Callable[[str], Any],
    help: str,
    *,
    roles: frozenset[str] = EVERY_ROLE,
    required: bool = False,
) -> Any:
    """A settings field read from variable `name`; its metadata is the documentation."""
    var = EnvVar(name, default, help, roles, required)
    return field(metadata={"var": var, "parse": parse})


def declared(settings: type) -> dict[str, EnvVar]:
    """The variables a settings class reads, by name."""
    return {
        f.metadata["var"].name: f.metadata["var"] for f in fields(settings) if "var" in f.metadata
    }


Settings = TypeVar("Settings")


def lookup(var: EnvVar, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """Where `var`'s value comes from, and the value: the variable itself, or the file its
    `_FILE` twin names (Docker's and Kubernetes' secrets, mounted as files); None when neither
    is set."""
    file_name = f"{var.name}_FILE"
    if var.name in environ and file_name in environ:
        raise ConfigError(f"{var.name} and {file_name} are both set: set one")
    if var.name in environ:
        return var.name, environ[var.name]
    if file_name in environ:
        path = environ[file_name]
        try:
            # A secret file's trailing newline is the editor's, not the secret's.
            return file_name, Path(path).read_text().rstrip("\r\n")
        except OSError as exc:
            raise ConfigError(f"{file_name}={path!r}: cannot read it ({exc.strerror})") from None
    return None


def read(settings: type[Settings], environ: Mapping[str, str], **extra: Any) -> Settings:
    """`settings` from `environ`: each variable's value (`lookup`) parsed, or its default."""
    values: dict[str, Any] = {}
    for f in fields(settings):  # type: ignore[arg-type]
        if "var" not in f.metadata:
            continue
        var: EnvVar = f.metadata["var"]
        name, raw = lookup(var, environ) or (var.name, var.default)
        try:
            values[f.name] = f.metadata["parse"](raw)
        except ValueError as exc:
            shown = "(from its file)" if name.endswith("_FILE") else repr(raw)
            raise ConfigError(f"{name}={shown}: {exc}") from None
    return settings(**values, **extra)


def parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {raw!r}")


def parse_list(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def parse_words(raw: str) -> tuple[str, ...]:
    # Space-separated: a URL may hold a comma (an e-mail URL's `to=a,b`), never a space.
    return tuple(raw.split())


def parse_url(raw: str) -> str:
    value = raw.strip().rstrip("/")
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"expected an http:// or https:// URL, got {raw!r}")
    return value


def parse_paths(raw: str) -> tuple[Path, ...]:
    # Colon-separated like PATH: a comma is more likely than a colon in a media folder's name.
    parts = (part.strip() for part in raw.split(":"))
    return tuple(Path(os.path.normpath(_PROJECT_DIR / part)) for part in parts if part)


def parse_path(raw: str) -> Path:
    if not raw.strip():
        raise ValueError("expected a folder, got nothing")
    return Path(os.path.normpath(_PROJECT_DIR / raw.strip()))


def positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


def non_negative_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError(f"must be at least 0, got {value}")
    return value


def one_of(*choices: str, upper: bool = False) -> Callable[[str], str]:
    """A parser taking one of `choices` (blanks and case ignored)."""

    def parse(raw: str) -> str:
        value = raw.strip().upper() if upper else raw.strip().lower()
        if value not in choices:
            listed = ", ".join(choices[:-1]) + f" or {choices[-1]}"
            raise ValueError(f"expected {listed}, got {raw!r}")
        return value

    return parse


def positive_seconds(raw: str) -> float:
    value = float(raw)
    if not value > 0 or value == float("inf"):
        raise ValueError(f"expected seconds above 0, got {raw!r}")
    return value


def non_negative_seconds(raw: str) -> float:
    value = float(raw)
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"expected seconds, 0 or more, got {raw!r}")
    return value
