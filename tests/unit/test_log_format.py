"""LUMASTRA_LOG_FORMAT=json: one JSON object per record, with the run's fields when bound."""

from __future__ import annotations

import io
import json
import logging
import logging.config

import pytest
import structlog

from lumastra import config
from lumastra.logs import logging_config


def _logged(log_format: str, emit: object) -> str:
    stream = io.StringIO()
    settings = logging_config(log_format)
    formatter = logging.config.DictConfigurator(settings).configure_formatter(  # type: ignore[attr-defined]
        settings["formatters"][log_format]
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger("tests.log_format")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        emit(logger)  # type: ignore[operator]
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_json_lines_carry_the_run_bound_around_a_handler() -> None:
    def emit(logger: logging.Logger) -> None:
        with structlog.contextvars.bound_contextvars(run_id="run_X", task="t", stage="s"):
            logger.warning("something %s", "happened")
        logger.info("outside any run")

    first, second = (json.loads(line) for line in _logged("json", emit).splitlines())

    assert first["event"] == "something happened"
    assert (first["level"], first["logger"]) == ("warning", "tests.log_format")
    assert (first["run_id"], first["task"], first["stage"]) == ("run_X", "t", "s")
    assert first["timestamp"].endswith("Z") and first["instance"]
    assert "run_id" not in second


def test_plain_is_the_default_and_a_bad_format_is_refused() -> None:
    assert config.load({}).log_format == "plain"
    line = _logged("plain", lambda logger: logger.warning("hello"))
    assert "WARNING tests.log_format hello" in line
    with pytest.raises(config.ConfigError, match="LUMASTRA_LOG_FORMAT"):
        config.load({"LUMASTRA_LOG_FORMAT": "xml"})
