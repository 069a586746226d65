"""The web role refuses oversized and slow requests before they cost it anything (issue #15).

Each test talks to `deploy/start-web.sh` as a subprocess (the real uvicorn, our HTTP protocol
and the ASGI body limit in front of Django) over raw sockets, so it controls every byte sent
and when. The server runs with a short read timeout and a small concurrency limit, so the
slow-client cases take seconds, not the production defaults' minutes.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lumastra import config
from orchestrator.api.limits import too_large
from tests.support.fixtures import ROOT, database_url
from tests.support.servers import free_port, http_status, serving

READ_TIMEOUT_S = 2
LIMIT_CONCURRENCY = 4
LIMIT = config.current().api_max_body_bytes
CHUNK = 16 * 1024
Address = tuple[str, int]


@pytest.fixture(scope="module")
def server() -> Iterator[Address]:
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "DATABASE_URL": database_url(),
        "LUMASTRA_WEB_HOST": "127.0.0.1",
        "LUMASTRA_WEB_PORT": str(port),
        "LUMASTRA_WEB_READ_TIMEOUT_S": str(READ_TIMEOUT_S),
        "LUMASTRA_WEB_LIMIT_CONCURRENCY": str(LIMIT_CONCURRENCY),
    }
    login = f"http://127.0.0.1:{port}/admin/login/"
    argv = [str(ROOT / "deploy/start-web.sh")]
    with serving(argv, env, "web-limits", lambda: http_status(login) == 200):
        yield ("127.0.0.1", port)


def _connect(address: Address) -> socket.socket:
    return socket.create_connection(address, timeout=10)


def _head(method: str, path: str, *headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers, "", ""]
    return "\r\n".join(lines).encode()


def _send(sock: socket.socket, data: bytes) -> None:
    # The server may close a refused request's connection while the rest is still being sent;
    # its answer is already on the way.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(data)


def _response(sock: socket.socket, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of the next response (the body by its Content-Length)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(status_line.split()[1]), headers, body


def _readable_within(sock: socket.socket, seconds: float) -> bool:
    return bool(select.select([sock], [], [], seconds)[0])


def _padded_body(size: int) -> bytes:
    body = json.dumps({"task": "test-noop"}).encode()
    return body + b" " * (size - len(body))


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


# --- request bodies -------------------------------------------------------------------------


def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_read(
    server: Address,
) -> None:
    with _connect(server) as sock:
        started = time.monotonic()
        _send(sock, _head("POST", "/api/v1/runs", f"Content-Length: {64 * 1024 * 1024}"))
        _send(sock, b" " * (1024 * 1024))  # the rest of the 64 MiB never comes

        status, headers, body = _response(sock)

    # Well inside the read timeout: nothing waited for the missing 63 MiB.
    assert time.monotonic() - started < READ_TIMEOUT_S / 2
    assert status == 413
    assert json.loads(body) == {"detail": too_large(LIMIT)}
    assert headers["connection"] == "close"


def test_a_chunked_body_is_cut_off_once_it_passes_the_limit(server: Address) -> None:
    sent = 0
    with _connect(server) as sock:
        _send(sock, _head("POST", "/api/v1/runs", "Transfer-Encoding: chunked"))
        while sent <= LIMIT:
            _send(sock, _chunk(b" " * CHUNK))
            sent += CHUNK
        # No terminating chunk: the answer must come from what was received.
        assert _readable_within(sock, READ_TIMEOUT_S / 2), "no answer to an oversized body"
        status, _, body = _response(sock)

    assert sent <= LIMIT + CHUNK
    assert status == 413
    assert json.loads(body) == {"detail": too_large(LIMIT)}


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_of_exactly_the_limit_reaches_the_api(server: Address, chunked: bool) -> None:
    body = _padded_body(LIMIT)
    with _connect(server) as sock:
        if chunked:
            framing = "Transfer-Encoding: chunked"
            data = b"".join(_chunk(body[i : i + CHUNK]) for i in range(0, LIMIT, CHUNK))
            data += b"0\r\n\r\n"
        else:
            framing, data = f"Content-Length: {LIMIT}", body
        _send(sock, _head("POST", "/api/v1/runs", "Content-Type: application/json", framing))
        _send(sock, data)

        status, _, _ = _response(sock)

    # The API itself answered: no credentials were sent.
    assert status == 401


def test_admin_pages_are_held_to_the_site_limit_before_reading(server: Address) -> None:
    with _connect(server) as sock:
        _send(sock, _head("POST", "/admin/login/", f"Content-Length: {64 * 1024 * 1024}"))

        status, headers, body = _response(sock, timeout=READ_TIMEOUT_S / 2)

    assert status == 413
    assert headers["content-type"].startswith("text/plain")
    assert body.decode() == too_large(LIMIT)


def test_a_body_that_does_not_arrive_in_time_is_a_408(server: Address) -> None:
    with _connect(server) as sock:
        started = time.monotonic()
        _send(sock, _head("POST", "/api/v1/runs", "Content-Length: 100") + b'{"task"')

        status, _, body = _response(sock)

    assert READ_TIMEOUT_S - 0.5 < time.monotonic() - started < READ_TIMEOUT_S + 3
    assert status == 408
    assert "did not arrive within" in json.loads(body)["detail"]


# --- slow and greedy clients ------------------------------------------------------------------


def test_a_client_sending_its_headers_a_byte_a_second_is_cut_off_without_blocking_others(
    server: Address,
) -> None:
    head = _head("GET", "/admin/login/")
    served_meanwhile = False
    sent = 0
    with _connect(server) as slow:
        started = time.monotonic()
        for byte in head:
            _send(slow, bytes([byte]))
            sent += 1
            if not served_meanwhile:
                with _connect(server) as other:
                    other.sendall(_head("GET", "/admin/login/"))
                    assert _response(other, timeout=READ_TIMEOUT_S / 2)[0] == 200
                served_meanwhile = True
            if _readable_within(slow, 1.0):
                break
        status, _, _ = _response(slow)

    assert sent < len(head), "the whole head got through"
    assert status == 408
    assert time.monotonic() - started < READ_TIMEOUT_S + 3


def test_idle_connections_hold_the_concurrency_limit_only_until_the_read_timeout(
    server: Address,
) -> None:
    idle = [_connect(server) for _ in range(LIMIT_CONCURRENCY)]
    try:
        with _connect(server) as sock:
            sock.sendall(_head("GET", "/admin/login/"))
            assert _response(sock)[0] == 503  # refused at once, not queued behind the idle

        # The server drops each connection that sent no request within the read timeout.
        for conn in idle:
            assert _readable_within(conn, READ_TIMEOUT_S + 3)
            assert conn.recv(1) == b""
        with _connect(server) as sock:
            sock.sendall(_head("GET", "/admin/login/"))
            assert _response(sock)[0] == 200
    finally:
        for conn in idle:
            conn.close()


@pytest.mark.parametrize("pieces", [1, 4], ids=["one-read", "several-reads"])
def test_request_headers_over_the_limit_are_a_431(server: Address, pieces: int) -> None:
    limit = config.current().web_max_header_bytes
    value = b"a" * (limit + 1)
    with _connect(server) as sock:
        _send(sock, _head("GET", "/admin/login/")[:-2] + b"X-Big: ")
        step = len(value) // pieces + 1
        for i in range(0, len(value), step):
            _send(sock, value[i : i + step])
            time.sleep(0.05)
        _send(sock, b"\r\n\r\n")

        status, headers, _ = _response(sock)

    assert status == 431
    assert headers["connection"] == "close"
