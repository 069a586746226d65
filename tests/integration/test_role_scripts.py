"""The role scripts run from anywhere: with only the system's PATH (no virtualenv first), from
another directory, they find the project's Python; a Python without the packages is named."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.fixtures import ROOT, database_url
from tests.support.servers import free_port, http_status, serving

pytestmark = pytest.mark.django_db(transaction=True)

BARE_PATH = "/usr/local/bin:/usr/bin:/bin"
SCRIPTS = ("start-web.sh", "start-worker.sh", "start-beat.sh", "start-flower.sh")


def test_the_web_role_starts_with_a_bare_path_from_elsewhere(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "PATH": BARE_PATH,
        "DATABASE_URL": database_url(),
        "LUMASTRA_WEB_HOST": "127.0.0.1",
        "LUMASTRA_WEB_PORT": str(port),
    }
    env.pop("VIRTUAL_ENV", None)
    url = f"http://127.0.0.1:{port}"
    with serving(
        [str(ROOT / "deploy/start-web.sh")],
        env,
        "web-bare-path",
        lambda: http_status(f"{url}/admin/login/") == 200,
    ):
        assert http_status(f"{url}/admin/login/") == 200


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_python_without_the_packages_is_named_clearly(script: str, tmp_path: Path) -> None:
    # A Python that cannot import Django (no site packages at all): the script stops at once.
    bare = tmp_path / "python"
    bare.write_text('#!/bin/sh\nexec /usr/bin/env -i python3 -S -I "$@"\n')
    bare.chmod(0o755)

    ran = subprocess.run(
        [str(ROOT / "deploy" / script)],
        env={"PATH": BARE_PATH, "LUMASTRA_PYTHON": str(bare)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert ran.returncode == 1
    assert "cannot import the project's packages" in ran.stderr
    assert "make install" in ran.stderr


def test_every_role_has_its_script_and_the_procfile_and_compose_use_them() -> None:
    procfile = (ROOT / "deploy/Procfile").read_text()
    compose = (ROOT / "deploy/docker-compose.yml").read_text()
    for script in SCRIPTS:
        assert os.access(ROOT / "deploy" / script, os.X_OK), script
        assert f"deploy/{script}" in procfile, script
        assert f"deploy/{script}" in compose, script
