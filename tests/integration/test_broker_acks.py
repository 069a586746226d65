"""The broker transport sends each acknowledgement with the next reservation
(orchestrator/stores/broker.py): one transaction per message, not two, and no
acknowledgement waits past an idle BRPOP or the channel's close."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from django.conf import settings
from kombu import Connection
from kombu.simple import SimpleQueue

from orchestrator.stores import broker
from orchestrator.stores.broker import Transport
from tests.support.round_trips import recording

UNACKED, INDEX = "unacked", "unacked_index"


@pytest.fixture
def queue() -> Iterator[SimpleQueue]:
    with Connection(settings.CONFIG.celery_broker_url, transport=Transport) as connection:
        simple = connection.SimpleQueue(f"test-acks-{uuid.uuid4().hex}")
        try:
            yield simple
        finally:
            simple.clear()
            simple.close()


def _held(tag: str) -> bool:
    client = broker.client()
    return client.hexists(UNACKED, tag) or client.zscore(INDEX, tag) is not None


def test_an_ack_goes_with_the_next_reservation(queue: SimpleQueue) -> None:
    queue.put({"n": 1})
    queue.put({"n": 2})
    first = queue.get(timeout=2)
    first.ack()
    assert _held(first.delivery_tag)  # waits for the next reservation

    with recording() as reserved:
        second = queue.get(timeout=2)

    assert not _held(first.delivery_tag)
    assert _held(second.delivery_tag)
    # The BRPOP and one transaction with the reservation and the waiting removal.
    assert reserved.counts().broker == 2, reserved.steps_table()


def test_an_idle_brpop_sends_what_waits(queue: SimpleQueue) -> None:
    queue.put({"n": 1})
    message = queue.get(timeout=2)
    message.ack()

    with pytest.raises(SimpleQueue.Empty):
        queue.get(timeout=1.5)

    assert not _held(message.delivery_tag)


def test_closing_the_channel_sends_what_waits() -> None:
    with Connection(settings.CONFIG.celery_broker_url, transport=Transport) as connection:
        simple = connection.SimpleQueue(f"test-acks-{uuid.uuid4().hex}")
        simple.put({"n": 1})
        message = simple.get(timeout=2)
        message.ack()
        simple.close()
        connection.release()

    assert not _held(message.delivery_tag)
