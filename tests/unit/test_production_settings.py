"""Production settings from the environment: `check --deploy` is clean with the production
profile of docs/operations.md, each part of that profile is needed, and the role scripts refuse
to start without a secret key. Each case is a fresh process: settings are read once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.fixtures import ROOT

# The production profile (docs/operations.md, "Production settings").
PRODUCTION = {
    "LUMASTRA_SECRET_KEY": "k3Jx9-ZqT2vN8mWb4Lr7YpC1sF6hD0gA5uE_oKjR2tVxQ8nBzM3cW9yH1lP7dS4f",
    "LUMASTRA_DEBUG": "false",
    "LUMASTRA_ALLOWED_HOSTS": "tasks.example.org",
    "LUMASTRA_CSRF_TRUSTED_ORIGINS": "https://tasks.example.org",
    "LUMASTRA_HTTPS": "true",
    "LUMASTRA_PROXY_SSL_HEADER": "true",
    "LUMASTRA_HSTS_SECONDS": "31536000",
    "LUMASTRA_HSTS_INCLUDE_SUBDOMAINS": "true",
    "LUMASTRA_HSTS_PRELOAD": "true",
}


def _env(**overrides: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LUMASTRA_")}
    env["LUMASTRA_TASK_MODULES"] = os.environ.get("LUMASTRA_TASK_MODULES", "")
    env.update({k: v for k, v in overrides.items() if v is not None})
    return env


def _check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_is_clean_with_the_production_profile() -> None:
    done = _check_deploy(_env(**PRODUCTION))

    assert done.returncode == 0, done.stderr
    assert "System check identified no issues" in done.stdout


@pytest.mark.parametrize(
    ("change", "warning"),
    [
        ({"LUMASTRA_SECRET_KEY": None}, "security.W009"),  # the development fallback
        ({"LUMASTRA_DEBUG": "true"}, "security.W018"),
        ({"LUMASTRA_HTTPS": None}, "security.W012"),  # session cookie in clear
        ({"LUMASTRA_HTTPS": None}, "security.W016"),  # CSRF cookie in clear
        ({"LUMASTRA_HTTPS": None}, "security.W008"),  # no redirect to HTTPS
        ({"LUMASTRA_HSTS_SECONDS": None}, "security.W004"),
    ],
)
def test_each_part_of_the_profile_is_needed(change: dict[str, str | None], warning: str) -> None:
    profile: dict[str, str | None] = {**PRODUCTION, **change}

    done = _check_deploy(_env(**profile))

    assert done.returncode == 1
    assert warning in done.stderr


def test_debug_is_off_and_hosts_and_origins_come_from_the_environment() -> None:
    code = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.DEBUG, s.ALLOWED_HOSTS, s.CSRF_TRUSTED_ORIGINS, "
        "s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_PROXY_SSL_HEADER]))"
    )
    profile: dict[str, str | None] = {**PRODUCTION, "LUMASTRA_DEBUG": None}
    env = _env(**profile, DJANGO_SETTINGS_MODULE="lumastra.settings")

    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        False,
        ["tasks.example.org"],
        ["https://tasks.example.org"],
        True,
        True,
        ["HTTP_X_FORWARDED_PROTO", "https"],
    ]


@pytest.mark.parametrize(
    "script", ["start-web.sh", "start-worker.sh", "start-beat.sh", "start-flower.sh"]
)
def test_a_role_script_refuses_to_start_without_a_secret_key(script: str) -> None:
    done = subprocess.run(
        [str(ROOT / "deploy" / script)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 1
    role = script.removeprefix("start-").removesuffix(".sh")
    assert f"LUMASTRA_SECRET_KEY is required by the {role} role and is not set" in done.stderr
