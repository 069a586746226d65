"""A feature the test suite mounts (issue 41): one route under /api/v1/features/test-feature/."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Router, Schema

from orchestrator.api.errors import answers
from tasks import define_feature

router = Router(tags=["features"])


class PingOut(Schema):
    feature: str
    user: str


@router.get("/ping", response=answers({200: PingOut}))
def ping(request: HttpRequest) -> PingOut:
    """Answers who asked: the API's authentication has run."""
    return PingOut(feature="test-feature", user=request.auth.username)  # type: ignore[attr-defined]


test_feature = define_feature("test-feature", router=router)
