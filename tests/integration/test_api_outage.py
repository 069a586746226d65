"""A store the API needs is unreachable: a 503 in the error shape with Retry-After, not a 500.

The web role runs as a real subprocess whose VALKEY_URL names a port nobody listens on."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fixtures import ROOT, database_url
from tests.support.servers import free_port, http_status, serving

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def web_without_valkey(transactional_db: None) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "DATABASE_URL": database_url(),
        "VALKEY_URL": f"redis://127.0.0.1:{free_port()}/0",
        "LUMASTRA_WEB_HOST": "127.0.0.1",
        "LUMASTRA_WEB_PORT": str(port),
    }
    base_url = f"http://127.0.0.1:{port}"
    argv = [str(ROOT / "deploy/start-web.sh")]
    login = f"{base_url}/admin/login/"
    with serving(argv, env, "web-no-valkey", lambda: http_status(login) is not None):
        yield base_url


def test_valkey_unreachable_is_a_503_in_the_error_shape(web_without_valkey: str) -> None:
    request = urllib.request.Request(
        f"{web_without_valkey}/api/v1/tasks", headers={"Authorization": "Bearer lmt_anything"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)

    assert refused.value.code == 503
    assert refused.value.headers["Retry-After"] == "5"
    body = json.loads(refused.value.read())
    assert body["code"] == "unavailable"
    assert "unreachable" in body["detail"]


def test_the_overview_shows_what_it_can_when_valkey_is_unreachable(web_without_valkey: str) -> None:
    """The console's first page: a panel that needs Valkey says it is unavailable, the others
    (from Postgres alone) are drawn, and the page is not a 500."""
    from django.test import Client

    from tests.support.users import operator

    client = Client()
    client.force_login(operator("outage-ops"))  # a session in Postgres, which the role shares
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    request = urllib.request.Request(f"{web_without_valkey}/admin/", headers={"Cookie": cookie})
    with urllib.request.urlopen(request, timeout=30) as response:
        page = response.read().decode()

    assert response.status == 200
    assert "Workers: unavailable just now" in page
    assert 'id="minutes-chart"' in page
