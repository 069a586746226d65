"""Tracing's settings (issue 42): when `orchestrator.tracing` sets up an exporter, how a run's
page reads the trace id its row keeps, and the variables' refusals."""

from __future__ import annotations

import pytest

from lumastra.config import ConfigError, load
from orchestrator import tracing

SECRET = {"LUMASTRA_SECRET_KEY": "x" * 50}


@pytest.mark.parametrize(
    ("setting", "environ", "mode"),
    [
        ("", {}, "off"),
        ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "otlp"),
        ("", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, "otlp"),
        ("console", {}, "console"),
        ("otlp", {}, "otlp"),
        ("off", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "off"),
        ("console", {"OTEL_SDK_DISABLED": "true"}, "off"),
        ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"}, "off"),
    ],
)
def test_what_is_exported_follows_lumastra_otel_and_the_standard_variables(
    setting: str, environ: dict[str, str], mode: str
) -> None:
    assert tracing.exporter_mode(setting, environ) == mode


def test_the_suite_runs_untraced() -> None:
    assert tracing.ON is False


@pytest.mark.parametrize(
    ("traceparent", "trace_id"),
    [
        (
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "4bf92f3577b34da6a3ce929d0e0e4736",
        ),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),  # invalid by W3C
        ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", None),  # lower case only
        ("00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01", None),
        ("<script>", None),
        (None, None),
        (17, None),
    ],
)
def test_a_runs_page_reads_only_a_well_formed_traceparent(
    traceparent: object, trace_id: str | None
) -> None:
    assert tracing.trace_id(traceparent) == trace_id


def test_lumastra_otel_takes_its_modes_and_refuses_others() -> None:
    assert load({**SECRET, "LUMASTRA_OTEL": " Console "}).otel == "console"
    assert load(SECRET).otel == ""
    with pytest.raises(ConfigError, match="LUMASTRA_OTEL"):
        load({**SECRET, "LUMASTRA_OTEL": "jaeger"})


def test_a_trace_url_must_say_where_the_trace_id_goes() -> None:
    url = "http://jaeger:16686/trace/{trace_id}"
    assert load({**SECRET, "LUMASTRA_TRACE_URL": url}).trace_url == url
    with pytest.raises(ConfigError, match="LUMASTRA_TRACE_URL"):
        load({**SECRET, "LUMASTRA_TRACE_URL": "http://jaeger:16686/trace/"})
