"""kombu's Redis transport, holding one client per channel instead of one per command, and
sending each acknowledgement with the next reservation.

kombu's Redis channel builds a new `redis.Redis` for every command it sends outside the
consumer's BRPOP (`Channel.conn_or_acquire`): the reservation of each delivered message in
the unacked hash, its acknowledgement, its restore. redis-py fills a case-insensitive table
of about 330 response callbacks in every client's constructor, so a worker's main process
spent about a quarter of its CPU per message building and dropping two clients
(docs/benchmarks.md, issue 9). A client is only a view of a connection pool, so one held
client per pool does the same work; it is built again whenever the channel replaces its pool
(after a fork or a lost connection), so it never outlives the connections it stands for.

kombu sends a message's acknowledgement (its removal from the unacked hash and index) in a
transaction of its own, after its run ended; a worker that drains a queue then reserves the
next message in another (issue 37). Here an acknowledgement waits for the next reservation
and goes in its transaction: one broker round trip per message fewer. It never waits longer
than the consumer's next BRPOP (one second when the queues are empty: `Channel._brpop_read`
sends what waits when nothing came) and it is sent before the channel restores or closes. What
it costs: a worker killed in that second leaves its last acknowledged messages in the unacked
hash, restored after the visibility timeout; their runs have ended, and their redelivery is
dropped as a duplicate (`runs.runner`), as a kill between a run's end and kombu's own ack
already did.

Selected by `CELERY_BROKER_TRANSPORT` for `redis://` and `rediss://` broker URLs; everything
else is kombu's own transport.
"""

from __future__ import annotations

import logging
from time import time
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps

log = logging.getLogger(__name__)


class QoS(kombu_redis.QoS):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._acked: list[str] = []  # acknowledged, still in the unacked hash and index

    def append(self, message: Any, delivery_tag: str) -> None:
        """kombu's reservation (index and hash, one transaction), with the removals of the
        acknowledgements that wait."""
        delivery = message.delivery_info
        raw = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
        with self.pipe_or_acquire() as pipe:
            self._remove_acked(pipe)
            pipe.zadd(self.unacked_index_key, {delivery_tag: time()})
            pipe.hset(self.unacked_key, delivery_tag, raw)
            pipe.execute()
        self._acked.clear()
        virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        self._acked.append(delivery_tag)
        virtual.QoS.ack(self, delivery_tag)

    def send_acks(self) -> None:
        """The acknowledgements that wait, in one transaction now."""
        if not self._acked:
            return
        with self.pipe_or_acquire() as pipe:
            self._remove_acked(pipe)
            pipe.execute()
        self._acked.clear()

    def _remove_acked(self, pipe: Any) -> None:
        for tag in self._acked:
            pipe.zrem(self.unacked_index_key, tag)
            pipe.hdel(self.unacked_key, tag)

    def restore_unacked(self, client: Any = None) -> None:
        self.send_acks()
        super().restore_unacked(client)


class Channel(kombu_redis.Channel):
    QoS = QoS
    _held_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            # (kombu's stubs in celery-types leave the private method out)
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        pool = self.pool
        held = self._held_client
        if held is None or held.connection_pool is not pool:
            held = self._held_client = self.Client(connection_pool=pool)
        return held

    def _brpop_read(self, **options: Any) -> bool:
        try:
            return bool(super()._brpop_read(**options))  # type: ignore[misc]
        except virtual.Empty:
            # Nothing came within the BRPOP's timeout: no reservation will carry them.
            self._send_acks()
            raise

    def close(self) -> None:
        if not self.closed:
            try:
                self._send_acks()
            except (redis.ConnectionError, redis.TimeoutError):
                # The broker is gone: those messages come back after the visibility timeout,
                # and their ended runs drop them.
                log.warning("broker unreachable at close: acknowledgements not sent")
        super().close()

    def _send_acks(self) -> None:
        if isinstance(self._qos, QoS):
            self._qos.send_acks()


class Transport(kombu_redis.Transport):
    Channel = Channel
