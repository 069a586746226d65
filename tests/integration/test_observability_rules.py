"""deploy/observability/: the alert rules pass Debian's `promtool check rules` and their unit
tests (`promtool test rules`), which make every alert fire and stay quiet; the Prometheus
configuration scrapes what the compose file serves; and every metric the dashboard's panels,
the rules and their tests name is one a live /metrics serves."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import settings
from django.test import Client

from tests.support.fixtures import ROOT

OBSERVABILITY = ROOT / "deploy" / "observability"
RULES = OBSERVABILITY / "rules.yml"
RULE_TESTS = OBSERVABILITY / "rules.test.yml"
PROMETHEUS = OBSERVABILITY / "prometheus.yml"
DASHBOARD = OBSERVABILITY / "grafana" / "dashboards" / "lumastra-tasks.json"
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
TOKEN = "observability-test-token"


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


def _load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


def _alerts() -> list[dict[str, Any]]:
    return [rule for group in _load(RULES)["groups"] for rule in group["rules"] if "alert" in rule]


@pytest.mark.needs("alerts")
def test_promtool_finds_the_rules_clean() -> None:
    checked = _promtool("check", "rules", RULES)

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in checked.stdout


@pytest.mark.needs("alerts")
def test_the_rules_unit_tests_pass() -> None:
    tested = _promtool("test", "rules", RULE_TESTS)

    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_has_a_case_where_it_fires_and_one_where_it_does_not() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in _load(RULE_TESTS)["tests"]:
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in _alerts()}

    assert len(names) == 6
    assert fires == names
    assert quiet == names


def test_every_alert_says_how_bad_and_what_happened() -> None:
    for rule in _alerts():
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


@pytest.mark.needs("alerts")
def test_prometheus_scrapes_the_web_role_with_the_token_the_compose_file_passes() -> None:
    checked = _promtool("check", "config", "--syntax-only", PROMETHEUS)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    config = _load(PROMETHEUS)
    (job,) = config["scrape_configs"]
    service = COMPOSE["services"]["prometheus"]

    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"] == [{"targets": ["web:8000"]}]
    assert COMPOSE["services"]["web"]["environment"]["LUMASTRA_WEB_PORT"] == "8000"
    token_file = job["authorization"]["credentials_file"]
    assert f'"$$LUMASTRA_METRICS_TOKEN" >{token_file} ' in service["entrypoint"][2]
    assert service["environment"]["LUMASTRA_METRICS_TOKEN"] == "${LUMASTRA_METRICS_TOKEN:-}"
    # The rule file, named relative to the configuration, mounted beside it.
    assert config["rule_files"] == ["rules.yml"]
    assert "./observability/rules.yml:/etc/prometheus/rules.yml:ro" in service["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in service["command"]


def test_grafana_loads_the_dashboard_from_the_prometheus_service() -> None:
    grafana = COMPOSE["services"]["grafana"]
    provisioning = OBSERVABILITY / "grafana" / "provisioning"
    (provider,) = _load(provisioning / "dashboards" / "lumastra.yml")["providers"]
    (source,) = _load(provisioning / "datasources" / "prometheus.yml")["datasources"]

    assert (
        f"./observability/grafana/dashboards:{provider['options']['path']}:ro"
        in (grafana["volumes"])
    )
    assert source["url"] == "http://prometheus:9090" and source["type"] == "prometheus"
    assert json.loads(DASHBOARD.read_text())["uid"] == "lumastra-tasks"


# --- every metric named is served ----------------------------------------------------------

_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_VARIABLES = re.compile(r"\$\{?\w+\}?")  # Grafana's ($__rate_interval, ${datasource})
# An identifier not inside a number or a duration (`15m`, `1e3`).
_IDENTIFIER = re.compile(r"(?<![\w:.])[A-Za-z_:][\w:]*")
_KEYWORDS = {"and", "or", "unless", "offset", "bool", "inf", "nan", "group_left", "group_right"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: what is left of it once strings, label
    matchers, ranges, grouping clauses and Grafana's variables are taken out, but functions
    and aggregations (followed by a parenthesis) and keywords."""
    text = _VARIABLES.sub(" ", _STRINGS.sub('""', expr))
    text = _GROUPING.sub(" ", _RANGES.sub(" ", _MATCHERS.sub(" ", text)))
    return {
        found.group()
        for found in _IDENTIFIER.finditer(text)
        if not text[found.end() :].lstrip().startswith("(")
        and found.group().lower() not in _KEYWORDS
    }


def test_metric_names_finds_selectors_only() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (task, le) (rate(a_bucket{kind="b c", d=~"e"}'
        "[$__rate_interval]))) / on (resource_class) group_left b_total offset 15m > bool 1e3"
        ' and c unless sum without (x) (d{e!="f"}[5m:1m])'
    )

    assert metric_names(expr) == {"a_bucket", "b_total", "c", "d"}


def _exprs() -> dict[str, str]:
    """Every PromQL expression shipped, by where it is."""
    found: dict[str, str] = {}

    def panels(items: list[dict[str, Any]]) -> None:
        for panel in items:
            panels(panel.get("panels", []))
            for target in panel.get("targets", []):
                found[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]

    panels(json.loads(DASHBOARD.read_text())["panels"])
    for rule in _alerts():
        found[f"rule {rule['alert']}"] = rule["expr"]
    for case in _load(RULE_TESTS)["tests"]:
        for n, series in enumerate(case["input_series"]):
            found[f"rule test {case['name']!r} series {n}"] = series["series"]
    return found


@pytest.fixture
def _metrics_on() -> Iterator[None]:
    config = settings.CONFIG
    settings.CONFIG = dataclasses.replace(config, metrics_token=TOKEN, metrics_cache_s=0)
    yield
    settings.CONFIG = config


def _served() -> set[str]:
    """Each name a sample of /metrics may have: a gauge's own, a counter's (`_total`, as
    exposed), a histogram's `_bucket`, `_sum` and `_count`; from the TYPE lines, so a family
    with no sample yet counts too."""
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    names = set()
    for line in response.content.decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
            names.update(name + suffix for suffix in suffixes)
    return names


@pytest.mark.django_db
@pytest.mark.usefixtures("_metrics_on")
def test_every_metric_a_panel_a_rule_or_a_rule_test_names_is_served() -> None:
    served = _served()
    exprs = _exprs()

    named = {where: metric_names(expr) for where, expr in exprs.items()}
    assert all(named.values()), [where for where, names in named.items() if not names]
    missing = {where: names - served for where, names in named.items() if names - served}
    assert not missing, missing
    # The dashboard shows what the issue asks for.
    shown = set().union(*(names for where, names in named.items() if where.startswith("panel")))
    assert {
        "lumastra_task_runs_total",
        "lumastra_task_queue_depth",
        "lumastra_task_queue_wait_seconds",
        "lumastra_task_duration_seconds_bucket",
        "lumastra_dead_letters",
        "lumastra_task_circuit_state",
        "lumastra_paused_runs",
        "lumastra_window_held_runs",
        "lumastra_drain_entries",
        "lumastra_roster_nodes",
    } <= shown
