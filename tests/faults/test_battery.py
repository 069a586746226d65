"""The fault battery: each scenario of `tests/faults/scenarios.py` on real worker subprocesses,
its own Valkey and the reconciler, checked by `tests/faults/checker.py`.

Each scenario runs in a driver subprocess (`python -m tests.faults.driver`), which starts its
own `redis-server` before Django loads its settings (see the driver's docstring), and for a
scenario that crashes Postgres itself its own Postgres server too; this test only gives it the
test database and reads its figures. FAULTS_SCALE multiplies the loads for a
soak (docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.scenarios import SCENARIOS
from tests.support import categories
from tests.support.fixtures import ROOT, database_url

pytestmark = [pytest.mark.faults, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

# Generous: a scenario takes under a minute here; its own bound decides what is stuck.
TIMEOUT_S = 900


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(name: str, tmp_path: Path) -> None:
    scenario = SCENARIOS[name]
    for category in (*scenario.needs, *(("partitions",) if scenario.hosts else ())):
        categories.require(category)
    report_path = tmp_path / "report.json"
    env = {**os.environ, "DATABASE_URL": database_url()}
    finished = subprocess.run(
        [sys.executable, "-m", "tests.faults.driver", name, "--report", str(report_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    print(finished.stdout)
    assert report_path.exists(), f"driver failed (exit {finished.returncode}):\n{finished.stderr}"
    report = json.loads(report_path.read_text())
    assert report["problems"] == [], report["problems"]
    assert report["ok"] and finished.returncode == 0
