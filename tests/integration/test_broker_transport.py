"""The broker transport holds one Redis client per channel pool (issue 9): kombu's own builds
a new one for every command a worker's main process sends per message."""

from __future__ import annotations

from lumastra.celery import app
from orchestrator.stores.broker import Transport


def test_the_worker_app_uses_the_held_client_transport() -> None:
    with app.connection_for_read() as conn:
        assert isinstance(conn.transport, Transport)


def test_a_channel_reuses_its_client_until_its_pool_is_replaced() -> None:
    with app.connection_for_read() as conn:
        channel = conn.default_channel
        first = channel._create_client()
        assert channel._create_client() is first
        assert first.ping()

        channel._disconnect_pools()  # what a lost connection or a fork does

        again = channel._create_client()
        assert again is not first
        assert again.connection_pool is channel.pool
        assert again.ping()


def test_a_held_client_delivers_and_acknowledges_messages() -> None:
    queue = "test.transport.roundtrip"
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        channel.queue_declare(queue=queue, auto_delete=False)
        channel.basic_publish(channel.prepare_message("hello"), exchange="", routing_key=queue)
        message = channel.basic_get(queue, no_ack=False)
        assert message is not None and message.body == b"hello"
        message.ack()
        assert channel.basic_get(queue) is None
        channel.queue_delete(queue)
