"""The admin site itself: its titles, its first page (the overview, `overview`), and a login
that counts failed sign-ins."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from orchestrator.admin import overview
from orchestrator.api import throttle

admin.site.site_header = "Lumastra Tasks"
admin.site.site_title = "Lumastra Tasks"


def _throttled_login(login: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The admin login with its failures counted against the client address's sign-in budget
    (shared with API tokens); past it, a sign-in is refused with 429 before it is checked."""

    @functools.wraps(login)
    def view(request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if request.method != "POST":
            return login(request, extra_context)
        address = throttle.client_address(request)
        wait = throttle.blocked_for(address)
        if wait is not None:
            context = {
                **admin.site.each_context(request),
                "title": "Log in",
                "detail": throttle.refusal(wait),
            }
            refused = TemplateResponse(
                request, "admin/orchestrator/login_throttled.html", context, status=429
            )
            refused["Retry-After"] = str(math.ceil(wait.total_seconds()))
            return refused
        response = login(request, extra_context)
        # Django's LoginView redirects after a sign-in and shows the form again after a
        # failed one (wrong credentials, or an account that may not use the admin).
        if response.status_code == 200:
            throttle.record_failure(address)
        return response

    return view


# The admin site builds its URLs from this attribute, after the apps (and so this module) load.
admin.site.login = _throttled_login(admin.site.login)  # type: ignore[method-assign]

# The site's index is the console's first page: the overview above Django's list of apps. Its
# panels' own URLs come before the site's, whose catch-all would otherwise answer them.
admin.site.index_template = overview.TEMPLATE
admin.site.index = overview.first_page(admin.site.index)  # type: ignore[method-assign,assignment]
_site_urls = admin.site.get_urls
admin.site.get_urls = lambda: [*overview.urls(), *_site_urls()]  # type: ignore[method-assign]
