"""Features (issue 41, `tasks.define_feature`): a definitions module's django-ninja routes,
mounted under /api/v1/features/<id>/ behind the API's authentication; a feature whose id
another takes, whose router is not a Router, or whose route turns authentication off is refused
when the registry loads."""

from __future__ import annotations

import pytest
from django.test import Client
from ninja import Router

from orchestrator.api import tokens
from tasks import define_feature
from tasks.errors import ManifestError
from tasks.registry import Registry, RegistryError
from tests.support.users import operator

pytestmark = [pytest.mark.django_db]


def test_a_feature_route_is_mounted_and_authenticated() -> None:
    user = operator()
    client = Client(headers={"Authorization": f"Bearer {tokens.issue(user)[1]}"})
    answer = client.get("/api/v1/features/test-feature/ping")
    assert answer.status_code == 200
    assert answer.json() == {"feature": "test-feature", "user": user.username}
    assert Client().get("/api/v1/features/test-feature/ping").status_code == 401
    spec = client.get("/api/v1/openapi.json").json()
    assert "/api/v1/features/test-feature/ping" in spec["paths"]


def test_a_colliding_or_open_feature_is_refused_at_load() -> None:
    first = define_feature("library-stats", router=Router())
    second = define_feature("library-stats", router=Router())
    with pytest.raises(RegistryError, match=r"'library-stats'.*defined more than once"):
        Registry([], features=[first, second])

    open_router = Router()

    @open_router.get("/open", auth=None)
    def anyone(request: object) -> dict[str, str]:
        return {}

    with pytest.raises(ManifestError, match="authentication off"):
        define_feature("open-feature", router=open_router)
    with pytest.raises(ManifestError, match="field 'id'"):
        define_feature("Not An Id", router=Router())
    with pytest.raises(ManifestError, match="django-ninja Router"):
        define_feature("no-router", router=object())
