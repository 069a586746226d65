"""HTTP routes a definitions module adds to the API (issue 41): `define_feature`.

    from ninja import Router

    router = Router()

    @router.get("/summary")
    def summary(request): ...

    library_stats = define_feature("library-stats", router=router)

The registry mounts each feature's django-ninja `Router` at `/api/v1/features/<id>/` when the
web role builds its URLs, behind the API's own authentication (a route that turns it off,
`auth=None`, is refused at load), and refuses two features with one id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tasks.errors import ManifestError

_FEATURE_ID = re.compile(r"^[a-z][a-z0-9-]{0,62}$")


@dataclass(frozen=True)
class FeatureDefinition:
    id: str
    router: Any  # a `ninja.Router`; typed loosely so the SDK imports no web framework

    @property
    def prefix(self) -> str:
        return f"/features/{self.id}/"


def define_feature(id: str, *, router: Any) -> FeatureDefinition:
    """Declare a feature. Assign the result to a module-level name in a module the registry
    loads."""

    def fail(field: str, problem: str) -> ManifestError:
        return ManifestError(id, field, problem, what="feature")

    if not isinstance(id, str) or not _FEATURE_ID.match(id):
        raise fail("id", "must be lowercase letters, digits and dashes, starting with a letter")
    from ninja import Router  # here: ninja reads Django's settings when imported

    if not isinstance(router, Router):
        raise fail("router", "must be a django-ninja Router")
    for path, view in router.path_operations.items():
        for operation in view.operations:
            if operation.auth_param is None:
                problem = f"{path} turns the API's authentication off (auth=None)"
                raise fail("router", problem)
    return FeatureDefinition(id, router)
