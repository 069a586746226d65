"""The API docs work offline, and the admin and docs pages carry a Content-Security-Policy
that nothing on them breaks (issue #15).

"Nothing breaks" is checked on the HTML: a policy of `script-src 'self'` and `style-src
'self'` blocks inline scripts, event-handler attributes, `<style>` elements and `style`
attributes, and every asset must come from this site. (Checked once by hand in headless
Chromium too: the docs render their operations and the console reports no violation.)
"""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import urlsplit

from django.contrib import admin
from django.test import Client
from django.urls import reverse

from lumastra.csp import DOCS_POLICY, PAGE_POLICY
from orchestrator.runs.start import start_run
from orchestrator.triggers import TriggerKind

DOCS = "/api/v1/docs"
# Executable types a browser would run; anything else (application/json) is data.
SCRIPT_TYPES = {"", "text/javascript", "application/javascript", "module"}


class _Page(HTMLParser):
    """What a page loads, and what on it a strict policy would block."""

    def __init__(self) -> None:
        super().__init__()
        self.assets: list[str] = []
        self.blocked: list[str] = []
        self._in_inline_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        for name in values:
            if name.startswith("on"):
                self.blocked.append(f"<{tag} {name}=…>")
        if "style" in values:
            self.blocked.append(f"<{tag} style=…>")
        if tag == "style":
            self.blocked.append("<style>")
        if tag == "script":
            if "src" in values:
                self.assets.append(values["src"])
            elif values.get("type", "").lower() in SCRIPT_TYPES:
                self._in_inline_script = True
        if tag in ("img", "iframe", "embed", "source") and "src" in values:
            self.assets.append(values["src"])
        if tag == "link" and "href" in values:
            self.assets.append(values["href"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._in_inline_script:
            self.blocked.append("inline <script>")
            self._in_inline_script = False


def _parse(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    return page


def test_the_docs_page_loads_everything_from_this_site(client: Client) -> None:
    response = client.get(DOCS)

    assert response.status_code == 200
    page = _parse(response.content.decode())
    assert any("swagger-ui-bundle" in asset for asset in page.assets)
    for asset in page.assets:
        parts = urlsplit(asset)
        assert not parts.scheme and not parts.netloc, f"{asset} comes from another host"
        assert client.get(asset).status_code == 200, f"{asset} is not served"


def test_the_docs_page_carries_its_policy(client: Client) -> None:
    response = client.get(DOCS)

    assert response["Content-Security-Policy"] == DOCS_POLICY
    directives = dict(d.split(" ", 1) for d in DOCS_POLICY.split("; "))
    assert directives["script-src"] == "'self'"
    assert directives["default-src"] == "'self'"
    assert not _parse(response.content.decode()).blocked


def test_the_login_page_carries_the_policy_and_nothing_it_blocks(client: Client) -> None:
    response = client.get(reverse("admin:login"))

    assert response["Content-Security-Policy"] == PAGE_POLICY
    assert "'unsafe-inline'" not in PAGE_POLICY and "'unsafe-eval'" not in PAGE_POLICY
    assert not _parse(response.content.decode()).blocked


def _admin_pages(client: Client) -> list[str]:
    """The admin's own pages, and every registered model's list and (if allowed) add form."""
    pages = [
        reverse("admin:index"),
        reverse("admin:orchestrator_taskhistory_start"),
        reverse("admin:orchestrator_tasks"),
        reverse("admin:orchestrator_nodes"),
        reverse("admin:orchestrator_limits"),
    ]
    for model, model_admin in admin.site._registry.items():
        name = f"admin:{model._meta.app_label}_{model._meta.model_name}"
        changelist = reverse(f"{name}_changelist")
        pages.append(changelist)
        if model_admin.has_add_permission(client.get(changelist).wsgi_request):
            pages.append(reverse(f"{name}_add"))
    return pages


def test_every_admin_page_carries_the_policy_and_nothing_it_blocks(admin_client: Client) -> None:
    # A run's own page too, with a pipeline's stages (it is not a model form).
    pipeline_run = start_run("test-pipe", {}, trigger=TriggerKind.API).run_id
    pages = [
        *_admin_pages(admin_client),
        reverse("admin:orchestrator_taskhistory_change", args=[pipeline_run]),
    ]
    assert len(pages) > 8

    for path in pages:
        response = admin_client.get(path)

        assert response.status_code == 200, path
        assert response["Content-Security-Policy"] == PAGE_POLICY, path
        page = _parse(response.content.decode())
        assert not page.blocked, f"{path}: {page.blocked}"
        for asset in page.assets:
            assert not urlsplit(asset).netloc, f"{path}: {asset} comes from another host"


def test_api_responses_carry_no_policy(client: Client) -> None:
    response = client.get("/api/v1/openapi.json")

    assert response.status_code == 200
    assert "Content-Security-Policy" not in response
