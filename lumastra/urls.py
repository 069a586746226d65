from django.contrib import admin
from django.urls import path, re_path

from orchestrator.api import errors, v1

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", v1.urls()),
    # Last: API clients get the error shape for any path no operation serves, not HTML.
    re_path(r"^api/", errors.no_endpoint),
]
