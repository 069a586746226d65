"""kombu's Redis transport, holding one client per channel instead of one per command.

kombu's Redis channel builds a new `redis.Redis` for every command it sends outside the
consumer's BRPOP (`Channel.conn_or_acquire`): the reservation of each delivered message in
the unacked hash, its acknowledgement, its restore. redis-py fills a case-insensitive table
of about 330 response callbacks in every client's constructor, so a worker's main process
spent about a quarter of its CPU per message building and dropping two clients
(docs/benchmarks.md, issue 9). A client is only a view of a connection pool, so one held
client per pool does the same work; it is built again whenever the channel replaces its pool
(after a fork or a lost connection), so it never outlives the connections it stands for.

Selected by `CELERY_BROKER_TRANSPORT` for `redis://` and `rediss://` broker URLs; everything
else is kombu's own transport.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
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


class Transport(kombu_redis.Transport):
    Channel = Channel
