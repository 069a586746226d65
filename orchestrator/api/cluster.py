"""`/cluster`: who is alive and who leads, read-only (view), as the console's Cluster page shows.

- `GET /cluster/nodes`: the node roster (`cluster.roster`): every worker-role process that
  announced itself in the last NODE_TTL_S, with how long ago it last did and whether it holds
  the cluster seat.
- `GET /cluster/leaders`: every leader seat and its holder (`cluster.leaders`). There is one
  seat, the cluster's (`lock:orch:cluster`); a seat with no holder, or whose holder is not in
  the roster (its announcement expired), says so.
"""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest
from ninja import Field, Router, Schema

from orchestrator.api.auth import VIEW
from orchestrator.api.errors import answers
from orchestrator.cluster import leaders, roster
from orchestrator.stores import keys

router = Router(tags=["cluster"])


class NodeOut(Schema):
    instance_id: str
    host: str
    pid: int
    role: str = Field(description="worker (one Celery worker) or loops (the orchestrator loops)")
    pools: list[str]
    queues: list[str]
    version: str
    started_at: datetime | None
    last_beat_s: float | None = Field(
        description="seconds since the node last announced itself (null: it just expired)"
    )
    leads: bool = Field(description="this node holds the cluster seat")


class SeatOut(Schema):
    seat: str
    key: str = Field(description="the Valkey lock that is the seat")
    holder: str | None = Field(description="the instance id holding it; null: nobody")
    holder_live: bool = Field(description="the holder is in the node roster")


@router.get("/cluster/nodes", auth=VIEW, response=answers({200: list[NodeOut]}))
def list_nodes(request: HttpRequest) -> list[NodeOut]:
    """The live nodes, by role, host and pid."""
    nodes = sorted(roster.roster(), key=lambda n: (n.role, n.host, n.pid))
    beats = roster.last_beats(nodes)
    leader = leaders.leader()
    return [
        NodeOut(
            instance_id=n.instance_id,
            host=n.host,
            pid=n.pid,
            role=n.role,
            pools=list(n.pools),
            queues=list(n.queues),
            version=n.version,
            started_at=n.started,
            last_beat_s=beats[n.instance_id].total_seconds() if n.instance_id in beats else None,
            leads=n.instance_id == leader,
        )
        for n in nodes
    ]


@router.get("/cluster/leaders", auth=VIEW, response=answers({200: list[SeatOut]}))
def list_seats(request: HttpRequest) -> list[SeatOut]:
    """Each leader seat and who holds it now: the cluster's, the only one the elector races
    for (its holder runs the once-per-cluster loops)."""
    holder = leaders.leader()
    live = {n.instance_id for n in roster.roster()}
    return [
        SeatOut(
            seat=leaders.CLUSTER,
            key=keys.orchestrator_lock(leaders.CLUSTER),
            holder=holder,
            holder_live=holder in live,
        )
    ]
