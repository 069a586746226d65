from django.contrib import admin
from django.urls import path, re_path

from coverage import api as coverage_api
from coverage import outbox_api
from orchestrator.api import errors, health, v1
from orchestrator.api.metrics import metrics_view
from tasks import registry

# The catalog's API sits above the engine: it joins the engine's v1 API here, at the root.
v1.api.add_router("", coverage_api.router)
v1.api.add_router("", outbox_api.router)
# The registry's features (`tasks.define_feature`), each under its own prefix, behind the API's
# authentication; built when a process first serves a request, so only web processes mount them.
for feature in registry.get().features.values():
    v1.api.add_router(feature.prefix, feature.router)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", v1.urls()),
    path("metrics", metrics_view),
    # Probes (also answered by health.ProbeMiddleware before host validation).
    path("healthz", health.healthz),
    path("readyz", health.readyz),
    # Last: API clients get the error shape for any path no operation serves, not HTML.
    re_path(r"^api/", errors.no_endpoint),
]
