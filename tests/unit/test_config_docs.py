"""`docs/environment.md` lists every variable `lumastra/config/` and `coverage/config.py` read,
under the section of the roles that read it; `load` parses or refuses.

The doc is parsed, not compared against a list kept here: a variable added to the config module
without a row in the doc fails this test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from coverage import config as coverage_config
from lumastra import config, preflight
from lumastra.config import CLASS_PATTERNS, TRIGGER_SECRET, ConfigError, WorkerMode, env
from tasks.resources import RESOURCE_CLASSES

DOC = Path(__file__).resolve().parents[2] / "docs" / "environment.md"
# A table row: | `NAME` | default | meaning |
_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|([^|]*)\|([^|]*)\|\s*$")
# A row of the per-class table: | `class` | concurrency | cap | hard timeout | stall limit |
_CLASS_ROW = re.compile(r"^\|\s*`([a-z]+)`\s*\|([^|]*)\|([^|]*)\|([^|]*)\|([^|]*)\|\s*$")
_VARIABLE_NAME = re.compile(r"^[A-Z][A-Z0-9_]*(<CLASS>|<TRIGGER>)?$")
VARIABLES = {**config.VARIABLES, **coverage_config.VARIABLES}
# The doc's top-level sections, by the roles whose variables they list.
SECTIONS = {
    "Every role": env.EVERY_ROLE,
    "Web and worker roles": env.STARTERS,
    "Web role": env.WEB,
    "Flower role": env.FLOWER,
    "Worker role": env.WORKER,
}


def _rows() -> list[tuple[str, str, str]]:
    rows = []
    for line in DOC.read_text().splitlines():
        match = _ROW.match(line.strip())
        if match:
            rows.append((match.group(1), match.group(2).strip(), match.group(3).strip()))
    return rows


def _documented_variables() -> dict[str, tuple[str, str]]:
    """Variable name → (default cell, meaning cell), for every variable row of the doc."""
    found: dict[str, tuple[str, str]] = {}
    for name, default, meaning in _rows():
        if _VARIABLE_NAME.match(name):
            assert name not in found, f"{name} is listed twice in {DOC.name}"
            found[name] = (default, meaning)
    return found


def _sections() -> dict[str, str]:
    """Variable name → the `## ` section its row is in."""
    found: dict[str, str] = {}
    section = ""
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section = line.removeprefix("## ").strip()
        match = _ROW.match(line.strip())
        if match and _VARIABLE_NAME.match(match.group(1)):
            found[match.group(1)] = section
    return found


def _documented_classes() -> dict[str, tuple[str, ...]]:
    """Class name → (concurrency, queue depth cap, hard timeout, stall limit) cells."""
    found = {}
    for line in DOC.read_text().splitlines():
        match = _CLASS_ROW.match(line.strip())
        if match:
            found[match.group(1)] = tuple(cell.strip() for cell in match.groups()[1:])
    return found


def _first_code(cell: str) -> str | None:
    match = re.search(r"`([^`]*)`", cell)
    return match.group(1) if match else None


def test_the_doc_parses_into_variable_rows() -> None:
    # Guards the parser itself: a reformatted doc must not make the checks below vacuous.
    assert len(_documented_variables()) >= len(VARIABLES) // 2


def test_every_config_variable_is_documented_with_its_default() -> None:
    documented = _documented_variables()

    missing = sorted(set(VARIABLES) - set(documented))
    assert not missing, f"{DOC.name} does not list: {missing}"
    for name, var in VARIABLES.items():
        default_cell, meaning = documented[name]
        assert _first_code(default_cell) == var.default, (
            f"{name}: documented default {default_cell!r}, config default {var.default!r}"
        )
        assert meaning, f"{name}: no meaning given"


def test_every_per_class_pattern_is_documented() -> None:
    documented = _documented_variables()

    missing = sorted(p.name for p in CLASS_PATTERNS if p.name not in documented)
    assert not missing, f"{DOC.name} does not list: {missing}"


def test_the_trigger_secret_family_is_documented_under_the_web_role() -> None:
    default_cell, meaning = _documented_variables()[TRIGGER_SECRET.name]

    assert "unset" in default_cell and meaning
    assert SECTIONS[_sections()[TRIGGER_SECRET.name]] == TRIGGER_SECRET.roles == env.WEB


def test_every_variable_is_listed_under_the_roles_that_read_it() -> None:
    sections = _sections()

    for name, var in VARIABLES.items():
        assert sections[name] in SECTIONS, f"{name} is under {sections[name]!r}, not a role"
        assert SECTIONS[sections[name]] == var.roles, (
            f"{name} is read by {sorted(var.roles)} but listed under {sections[name]!r}"
        )


def test_required_variables_and_only_they_are_marked_required() -> None:
    documented = _documented_variables()

    required = {name for name, var in VARIABLES.items() if var.required}
    marked = {name for name, (_, meaning) in documented.items() if "**Required.**" in meaning}
    assert required == marked
    assert {"LUMASTRA_SECRET_KEY", "FLOWER_BASIC_AUTH"} <= required


@pytest.mark.parametrize(
    ("role", "environ", "missing"),
    [
        ("web", {}, ["LUMASTRA_SECRET_KEY"]),
        ("beat", {"LUMASTRA_SECRET_KEY": "  "}, ["LUMASTRA_SECRET_KEY"]),
        ("flower", {"LUMASTRA_SECRET_KEY": "k"}, ["FLOWER_BASIC_AUTH"]),
        ("worker", {"LUMASTRA_SECRET_KEY": "k"}, []),
    ],
)
def test_preflight_names_each_required_variable_a_role_lacks(
    role: str, environ: dict[str, str], missing: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert preflight.check_variables(role, environ) == (1 if missing else 0)

    err = capsys.readouterr().err
    for name in missing:
        assert f"{name} is required by the {role} role and is not set" in err
    if not missing:
        assert err == ""


def test_preflight_names_an_unusable_value_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    environ = {"LUMASTRA_SECRET_KEY": "k", "LUMASTRA_DEBUG": "maybe"}

    assert preflight.check_variables("worker", environ) == 1
    assert "LUMASTRA_DEBUG='maybe'" in capsys.readouterr().err


def test_the_doc_lists_no_variable_the_config_does_not_read() -> None:
    known = set(VARIABLES) | {p.name for p in CLASS_PATTERNS} | {TRIGGER_SECRET.name}

    stale = sorted(set(_documented_variables()) - known)
    assert not stale, f"{DOC.name} lists variables the settings do not declare: {stale}"


def test_the_per_class_table_matches_resource_classes() -> None:
    documented = _documented_classes()

    assert set(documented) == set(RESOURCE_CLASSES)
    for name, (concurrency_cell, cap_cell, timeout_cell, stall_cell) in documented.items():
        rc = RESOURCE_CLASSES[name]
        assert int(cap_cell.replace(",", "")) == rc.default_queue_depth_cap, name
        assert int(timeout_cell) == rc.default_hard_timeout_s, name
        assert int(stall_cell) == rc.default_stall_fail_s, name
        clamped = re.search(r"clamped to (\d+)[\u2013-](\d+)", concurrency_cell)
        if clamped:
            low, high = int(clamped.group(1)), int(clamped.group(2))
            assert rc.default_concurrency(1) == low, name
            assert rc.default_concurrency(1_000) == high, name
        else:
            fixed = int(concurrency_cell)
            assert all(rc.default_concurrency(c) == fixed for c in (1, 2, 4, 16, 64)), name


# --- load(): parsing and refusing values ---------------------------------------------------


def test_load_with_an_empty_environment_uses_every_default() -> None:
    loaded = config.load({})

    assert loaded.database_url == VARIABLES["DATABASE_URL"].default
    assert loaded.worker_mode is WorkerMode.ENABLED
    assert loaded.per_task_queues is True
    assert loaded.debug is False
    assert loaded.allowed_hosts == ("localhost", "127.0.0.1")
    assert loaded.task_modules == (
        "tasks.definitions.demo",
        "tasks.definitions.catalog",
        "tasks.definitions.catalog_media",
    )
    assert loaded.api_max_body_bytes == 262_144
    assert loaded.concurrency_overrides == {}
    assert loaded.queue_depth_cap_overrides == {}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        *[("1", True), ("TRUE", True), (" yes ", True), ("On", True)],
        *[("0", False), ("false", False), ("No", False), ("off", False)],
    ],
)
def test_booleans_accept_the_documented_spellings(raw: str, expected: bool) -> None:
    assert config.load({"LUMASTRA_DEBUG": raw}).debug is expected
    assert config.load({"LUMASTRA_PER_TASK_QUEUES": raw}).per_task_queues is expected


def test_values_are_parsed_into_their_types() -> None:
    loaded = config.load(
        {
            "LUMASTRA_WORKER_MODE": " Disabled ",
            "LUMASTRA_ALLOWED_HOSTS": " a.example , ,b.example,",
            "LUMASTRA_TASK_MODULES": "x.defs,y.defs",
            "LUMASTRA_LOG_CAP": "250",
            "LUMASTRA_CONCURRENCY_IO": "9",
            "LUMASTRA_QUEUE_DEPTH_CAP_BULK": "5000",
            "LUMASTRA_HARD_TIMEOUT_S_EMBEDDING": "86400",
            "LUMASTRA_STALL_FAIL_S_CPU": "120",
        }
    )

    assert loaded.worker_mode is WorkerMode.DISABLED
    assert loaded.allowed_hosts == ("a.example", "b.example")
    assert loaded.task_modules == ("x.defs", "y.defs")
    assert loaded.log_cap == 250
    assert loaded.concurrency_overrides == {"io": 9}
    assert loaded.queue_depth_cap_overrides == {"bulk": 5000}
    assert loaded.hard_timeout_overrides == {"embedding": 86400}
    assert loaded.stall_fail_overrides == {"cpu": 120}


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("LUMASTRA_DEBUG", "maybe"),
        ("LUMASTRA_PER_TASK_QUEUES", ""),
        ("LUMASTRA_LOG_CAP", "lots"),
        ("LUMASTRA_RUN_ACTIVE_TTL_S", "1.5"),
        ("LUMASTRA_API_MAX_BODY_BYTES", "256k"),
        ("LUMASTRA_WORKER_MODE", "sometimes"),
        ("LUMASTRA_WORKER_MODE", ""),
        ("LUMASTRA_CONCURRENCY_IO", "many"),
        ("LUMASTRA_QUEUE_DEPTH_CAP_CPU", "10.0"),
        ("LUMASTRA_HARD_TIMEOUT_S_IO", "0"),
        ("LUMASTRA_STALL_FAIL_S_CPU", "10m"),
    ],
)
def test_an_unusable_value_is_a_config_error_naming_the_variable(name: str, raw: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config.load({name: raw})

    assert str(caught.value).startswith(f"{name}={raw!r}")


@pytest.mark.parametrize("raw", ["0", "-1", "inf", "nan", "soon"])
def test_seconds_above_zero_refuse_what_is_not(raw: str) -> None:
    with pytest.raises(ConfigError):
        config.load({"LUMASTRA_PROGRESS_WRITE_S": raw})


# --- values from files (`<NAME>_FILE`: Docker's and Kubernetes' secrets) ----------------------


def test_a_value_is_read_from_the_file_its_file_twin_names(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t-from-a-file\n")

    loaded = config.load({"LUMASTRA_SECRET_KEY_FILE": str(secret)})

    assert loaded.secret_key == "s3cr3t-from-a-file"
    assert config.missing_required("web", {"LUMASTRA_SECRET_KEY_FILE": str(secret)}) == []


def test_a_variable_and_its_file_twin_both_set_is_an_error() -> None:
    with pytest.raises(ConfigError, match="LUMASTRA_SECRET_KEY and LUMASTRA_SECRET_KEY_FILE"):
        config.load({"LUMASTRA_SECRET_KEY": "a", "LUMASTRA_SECRET_KEY_FILE": "/x"})


def test_an_unreadable_file_or_a_bad_value_in_it_names_the_file_variable(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match=r"^LUMASTRA_SECRET_KEY_FILE='/nonexistent/s'"):
        config.load({"LUMASTRA_SECRET_KEY_FILE": "/nonexistent/s"})

    bad = tmp_path / "debug"
    bad.write_text("hush-hush")
    with pytest.raises(ConfigError) as caught:
        config.load({"LUMASTRA_DEBUG_FILE": str(bad)})
    assert str(caught.value).startswith("LUMASTRA_DEBUG_FILE=(from its file): expected true/false")
