"""A Content-Security-Policy on every HTML page the web role renders (the admin, the API docs).

Everything a page loads comes from this site: scripts only from files (no inline script, no
`eval`; Django's admin and ninja's local Swagger UI template have none), no plugins, no
foreign form targets, no framing. The API docs page also allows `data:` images, which
Swagger UI's stylesheet uses. (Swagger UI's inline styles are set from script, which
`style-src` does not restrict.) JSON responses carry no policy: a browser does not run them.

A response that already has a policy keeps it.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.urls import reverse

_BASE = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self'",
    "font-src": "'self'",
    "connect-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'self'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}
_DOCS = {**_BASE, "img-src": "'self' data:"}


def _header(policy: dict[str, str]) -> str:
    return "; ".join(f"{directive} {sources}" for directive, sources in policy.items())


PAGE_POLICY = _header(_BASE)
DOCS_POLICY = _header(_DOCS)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self._docs_path: str | None = None

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if "Content-Security-Policy" in response or not response.get("Content-Type", "").startswith(
            "text/html"
        ):
            return response
        if self._docs_path is None:
            self._docs_path = reverse("api-v1:openapi-view")
        is_docs = request.path == self._docs_path
        response["Content-Security-Policy"] = DOCS_POLICY if is_docs else PAGE_POLICY
        return response
