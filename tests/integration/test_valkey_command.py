"""`valkey.command`: one command on this thread's own connection to the coordination Valkey
(the scripts every run sends), with what the pool would have done for it: a connection the
server closed is connected again, and one cut short mid-command never hands its unread reply
to the next command."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from redis.exceptions import ResponseError

from orchestrator.stores import valkey


def test_a_connection_the_server_closed_is_connected_again() -> None:
    own_id = valkey.command("CLIENT", "ID")
    assert valkey.client().client_kill_filter(_id=own_id) == 1

    assert valkey.command("ECHO", "after") == "after"
    assert valkey.command("CLIENT", "ID") != own_id


def test_a_command_cut_short_leaves_no_reply_for_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    valkey.command("PING")
    conn = valkey._held.conn
    read = conn.read_response

    def cut(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(conn, "read_response", read)
        raise KeyboardInterrupt  # a signal's exception between the send and the read

    monkeypatch.setattr(conn, "read_response", cut)
    with pytest.raises(KeyboardInterrupt):
        valkey.command("ECHO", "first")

    assert valkey.command("ECHO", "second") == "second"


def test_each_thread_has_its_own_connection() -> None:
    ids: list[int] = [valkey.command("CLIENT", "ID")]
    other = threading.Thread(target=lambda: ids.append(valkey.command("CLIENT", "ID")))
    other.start()
    other.join()

    assert len(set(ids)) == 2
    assert valkey.command("CLIENT", "ID") == ids[0]  # and keeps it


def test_an_error_reply_is_raised_as_the_client_raises_it_and_keeps_the_connection() -> None:
    own_id = valkey.command("CLIENT", "ID")
    with pytest.raises(ResponseError, match="unknown command"):
        valkey.command("NOT-A-COMMAND")

    assert valkey.command("ECHO", "still usable") == "still usable"
    assert valkey.command("CLIENT", "ID") == own_id  # a refusal (PAUSED, FENCED) is no outage
