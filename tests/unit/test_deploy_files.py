"""The container image and the compose file, read as files (no container engine here): every
role from one image through its role script, the stores (a coord Valkey that keeps all it
holds, a cache that may lose anything), health checks, the start order, and hadolint-like
rules on the Dockerfile; the two locks (what the image installs, what development adds)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.fixtures import ROOT

DEPLOY = ROOT / "deploy"
COMPOSE: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
DOCKERFILE = (DEPLOY / "Dockerfile").read_text()

APP_IMAGE = "lumastra-tasks:local"
# Role → the script it runs; the scripts are what `make run` runs too.
ROLES = {
    "web": "deploy/start-web.sh",
    "worker": "deploy/start-worker.sh",
    "beat": "deploy/start-beat.sh",
    "flower": "deploy/start-flower.sh",
}
STORES = ("postgres", "valkey-coord", "valkey-cache")
# Started only with `--profile observability` (deploy/observability/).
OBSERVABILITY = ("prometheus", "grafana")


def _conf(name: str) -> dict[str, str]:
    lines = (DEPLOY / name).read_text().splitlines()
    pairs = (line.split(None, 1) for line in lines if line.strip() and not line.startswith("#"))
    return {key: value.strip() for key, value in pairs}


def test_every_service_is_there() -> None:
    assert set(SERVICES) == {*ROLES, "migrate", *STORES, *OBSERVABILITY}


def test_a_plain_up_starts_no_observability_service() -> None:
    for name, spec in SERVICES.items():
        assert spec.get("profiles", []) == (["observability"] if name in OBSERVABILITY else [])


@pytest.mark.parametrize("service", [*ROLES, "migrate"])
def test_every_app_service_runs_the_one_image_built_from_the_dockerfile(service: str) -> None:
    spec = SERVICES[service]
    assert spec["image"] == APP_IMAGE
    assert spec["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}


@pytest.mark.parametrize(("service", "script"), ROLES.items())
def test_each_role_starts_through_its_role_script(service: str, script: str) -> None:
    command = SERVICES[service]["command"]
    assert command[0] == script
    assert (ROOT / script).is_file()
    # The same script the Procfile (`make run`) uses for the role.
    procfile = dict(
        line.split(": ", 1) for line in (DEPLOY / "Procfile").read_text().splitlines()
        if line and not line.startswith("#")
    )  # fmt: skip
    words = shlex.split(procfile[service])
    if words[0] == "exec":  # honcho then sees the role's own exit, not its shell's
        words = words[1:]
    assert words[0] == script


def test_beat_syncs_the_static_schedules_before_it_starts() -> None:
    script = (ROOT / ROLES["beat"]).read_text()
    sync = script.index("manage.py sync_schedules")
    assert sync < script.index("celery -A lumastra beat")


def test_migrate_is_a_one_shot_that_every_role_but_flower_waits_for() -> None:
    migrate = SERVICES["migrate"]
    assert migrate["restart"] == "no"
    assert migrate["command"][:3] == ["python", "manage.py", "migrate"]
    assert "--noinput" in migrate["command"]
    for service in ("web", "worker", "beat"):
        assert SERVICES[service]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"
        }


@pytest.mark.parametrize("service", [*ROLES, "migrate"])
def test_app_services_start_after_their_stores_are_healthy(service: str) -> None:
    depends = SERVICES[service]["depends_on"]
    for store in STORES:
        assert depends[store] == {"condition": "service_healthy"}, (service, store)


def test_the_worker_writes_trickplay_sprites_to_a_volume_its_user_owns() -> None:
    worker = SERVICES["worker"]
    root = worker["environment"]["LUMASTRA_TRICKPLAY_ROOT"]
    assert root == "${LUMASTRA_TRICKPLAY_ROOT:-/srv/trickplay}"
    assert "trickplay:/srv/trickplay" in worker["volumes"] and "trickplay" in COMPOSE["volumes"]
    assert re.search(r"chown lumastra:lumastra[^\n]*/srv/trickplay", DOCKERFILE)
    assert SERVICES["web"]["environment"]["LUMASTRA_MEDIA_ROOTS"].endswith(":-/srv/media}")


def test_two_web_replicas_each_on_a_host_port() -> None:
    web = SERVICES["web"]
    assert web["deploy"]["replicas"] == 2
    assert web["ports"] == ["8000-8001:8000"]
    assert web["environment"]["LUMASTRA_WEB_HOST"] == "0.0.0.0"


@pytest.mark.parametrize("service", [*ROLES, *STORES])
def test_every_long_running_service_has_a_health_check(service: str) -> None:
    check = SERVICES[service]["healthcheck"]
    assert check["test"][0] == "CMD"
    assert "interval" in check and "retries" in check


def test_every_role_s_health_check_asks_whether_that_role_works() -> None:
    for service in ROLES:
        test = SERVICES[service]["healthcheck"]["test"]
        assert test[:6] == ["CMD", "python", "manage.py", "healthcheck", "--role", service]
    assert SERVICES["web"]["environment"]["LUMASTRA_WEB_PORT"] == "8000"  # what --role web asks
    flower = SERVICES["flower"]
    assert flower["healthcheck"]["test"][-1] == "5555" and "--port=5555" in flower["command"]
    assert (ROOT / "orchestrator/management/commands/healthcheck.py").is_file()


def test_the_roles_share_the_stores_and_a_required_secret() -> None:
    for service in ROLES:
        env = SERVICES[service]["environment"]
        assert env["VALKEY_URL"].startswith("redis://valkey-coord:")
        assert env["CELERY_BROKER_URL"].startswith("redis://valkey-coord:")
        assert env["VALKEY_CACHE_URL"].startswith("redis://valkey-cache:")
        assert env["DATABASE_URL"].startswith("postgres://") and "@postgres:" in env["DATABASE_URL"]
        assert env["LUMASTRA_SECRET_KEY"].startswith("${LUMASTRA_SECRET_KEY:?")


def test_coord_valkey_never_evicts_and_keeps_an_append_only_file() -> None:
    coord = _conf("valkey-coord.conf")
    assert coord["maxmemory-policy"] == "noeviction"
    assert coord["appendonly"] == "yes"
    assert "valkey-coord-data:/data" in SERVICES["valkey-coord"]["volumes"]
    assert any("valkey-coord.conf" in v for v in SERVICES["valkey-coord"]["volumes"])


def test_cache_valkey_evicts_least_recently_used_and_keeps_nothing() -> None:
    cache = _conf("valkey-cache.conf")
    assert cache["maxmemory-policy"] == "allkeys-lru"
    assert cache["appendonly"] == "no"
    assert any("valkey-cache.conf" in v for v in SERVICES["valkey-cache"]["volumes"])


@pytest.mark.parametrize("service", STORES)
def test_store_images_are_pinned(service: str) -> None:
    image = SERVICES[service]["image"]
    _, _, tag = image.partition(":")
    assert tag and tag != "latest" and re.match(r"\d+\.\d+", tag), image


# --- the Dockerfile, hadolint-like (hadolint itself is not installed here) ---------------


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE)
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def test_the_base_image_is_a_pinned_slim_python_3_11() -> None:
    bases = [args for word, args in _instructions() if word == "FROM"]
    assert len(bases) == 1
    image, _, tag = bases[0].partition(":")
    assert image == "python"
    assert re.fullmatch(r"3\.11\.\d+-slim(-\w+)?", tag), tag  # DL3006/DL3007: no latest


def test_the_image_runs_as_a_user_that_is_not_root() -> None:
    users = [args for word, args in _instructions() if word == "USER"]
    assert users, "no USER: every role would run as root (DL3002)"
    assert users[-1] not in ("root", "0", "0:0")
    assert re.search(rf"useradd[^\n]*\b{re.escape(users[-1])}\b", DOCKERFILE)


def test_pip_installs_the_runtime_lock_only_without_a_cache() -> None:
    pips = [args for word, args in _instructions() if word == "RUN" and "pip install" in args]
    assert pips
    for args in pips:
        assert "--no-cache-dir" in args  # DL3042
        assert "-r requirements.lock" in args
    assert "requirements-dev" not in DOCKERFILE


def test_the_image_has_debian_s_ffmpeg_without_recommends_or_package_lists() -> None:
    installs = [
        args for word, args in _instructions() if word == "RUN" and "apt-get install" in args
    ]
    assert len(installs) == 1
    (args,) = installs
    assert re.search(r"apt-get install -y --no-install-recommends ffmpeg\b", args)
    assert args.index("apt-get update") < args.index("apt-get install")  # DL3009, same layer
    assert "rm -rf /var/lib/apt/lists/*" in args
    assert "ffprobe -version" in args


# --- the locks: what the image installs, and what development adds ------------------------

# Development and CI only: none of them may reach the image (requirements.lock).
DEV_TOOL = re.compile(
    r"pytest(-.+)?|mypy(-extensions)?|ruff|playwright|schemathesis|hypothesis(-.+)?|factory-boy"
    r"|import-linter|django-stubs|celery-types|types-.+"
)


def _name(requirement: str) -> str:
    """A requirement's package name, normalised (PEP 503): no extras, bounds or pin."""
    found = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    assert found, requirement
    return re.sub(r"[-_.]+", "-", found.group()).lower()


def _requirements(name: str) -> list[str]:
    lines = (ROOT / name).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _pins(name: str) -> dict[str, str]:
    pins = {}
    for line in _requirements(name):
        if line.startswith("-"):
            continue
        package, _, version = line.partition("==")
        assert version, f"{name}: {line} is not pinned"
        pins[_name(package)] = version
    return pins


def test_the_runtime_lock_holds_no_development_tool() -> None:
    pins = _pins("requirements.lock")
    assert {"django", "celery", "uvicorn", "flower", "django-stubs-ext"} <= set(pins)
    assert [package for package in pins if DEV_TOOL.fullmatch(package)] == []


def test_the_dev_lock_adds_to_the_runtime_lock_without_repeating_a_pin() -> None:
    runtime, dev = _pins("requirements.lock"), _pins("requirements-dev.lock")
    assert _requirements("requirements-dev.lock")[0] == "-r requirements.lock"
    assert set(runtime).isdisjoint(dev)
    assert {"pytest", "mypy", "ruff", "playwright", "schemathesis", "django-stubs"} <= set(dev)


def test_each_top_level_requirement_is_pinned_in_its_own_lock() -> None:
    runtime, dev = _pins("requirements.lock"), _pins("requirements-dev.lock")
    wanted = [_name(line) for line in _requirements("requirements.in")]
    assert set(wanted) <= set(runtime)
    dev_in = _requirements("requirements-dev.in")
    assert dev_in[0] == "-r requirements.in"
    assert {_name(line) for line in dev_in[1:]} <= set(dev)


def test_make_install_installs_both_locks() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^\$\(STAMP\): requirements\.lock requirements-dev\.lock$", makefile, re.M)
    assert "pip install --quiet -r requirements-dev.lock" in makefile


def test_static_files_are_collected_at_build_time() -> None:
    runs = [args for word, args in _instructions() if word == "RUN"]
    assert any("manage.py collectstatic --noinput" in args for args in runs)
    # ...before the image drops to its user, who may not write to /app.
    order = [word for word, _ in _instructions()]
    collect = next(i for i, (w, a) in enumerate(_instructions()) if "collectstatic" in a)
    assert collect < order.index("USER")


def test_no_instruction_uses_latest_sudo_or_add() -> None:
    for word, args in _instructions():
        assert ":latest" not in args
        assert "sudo " not in args  # DL3004
        assert word != "ADD"  # DL3020: COPY for local files
    assert (DEPLOY / "Dockerfile.dockerignore").read_text().count(".venv") == 1


def test_the_image_and_its_role_scripts_agree_on_the_python() -> None:
    # No virtualenv in the image: deploy/python.sh then takes python3 from PATH.
    assert ".venv" in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    assert "command -v python3" in (DEPLOY / "python.sh").read_text()


def test_every_role_script_is_executable_and_named_in_the_image_notes() -> None:
    for script in ROLES.values():
        path = ROOT / script
        assert path.stat().st_mode & 0o111, script
        assert Path(script).name in DOCKERFILE
