"""A store that stops answering fails a call within LUMASTRA_STORE_TIMEOUT_S (issue 26).

Before, neither client had a timeout, and a partition hung a heartbeat on an established
connection for as long as the cut lasted. A stopped Valkey (SIGSTOP: its kernel
still accepts and acknowledges, nothing answers) stands in for a dead path here; a listener
that never answers stands in for a Postgres nothing reaches. A dead path under an established
Postgres connection (tcp_user_timeout, keepalives) needs a real partition: the cluster tests."""

from __future__ import annotations

import dataclasses
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
import redis
from django.conf import settings

from orchestrator.stores import valkey
from tests.faults.servers import ValkeyServer

TIMEOUT_S = 1


@pytest.fixture
def short_timeout() -> Iterator[None]:
    config = settings.CONFIG
    settings.CONFIG = dataclasses.replace(config, store_timeout_s=TIMEOUT_S)
    try:
        yield
    finally:
        settings.CONFIG = config


def test_a_valkey_that_stops_answering_fails_the_call_within_the_timeout(
    short_timeout: None, tmp_path: Path
) -> None:
    server = ValkeyServer(aof=False, log_path=tmp_path / "valkey.log")
    server.start()
    try:
        client = redis.Redis.from_url(server.url(0), **valkey._options())
        client.set("alive", "1")
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)
        began = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            client.get("alive")
        assert time.monotonic() - began < TIMEOUT_S + 2
    finally:
        if server.process is not None:
            server.process.send_signal(signal.SIGCONT)
        server.stop()


def test_a_postgres_that_never_answers_fails_the_connection_within_the_timeout() -> None:
    # The settings as a worker gets them (its timeout shortened here), for a server that
    # accepts and never says a word.
    configured = settings.DATABASES["default"]["OPTIONS"]
    assert configured["connect_timeout"] == settings.CONFIG.store_timeout_s
    assert configured["tcp_user_timeout"] == settings.CONFIG.store_timeout_s * 1000
    assert configured["keepalives"] == 1
    options = dict(configured, connect_timeout=TIMEOUT_S)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        began = time.monotonic()
        with pytest.raises(psycopg2.OperationalError, match="timeout"):
            psycopg2.connect(
                host="127.0.0.1", port=silent.getsockname()[1], dbname="x", user="x", **options
            )
    assert time.monotonic() - began < TIMEOUT_S + 2
