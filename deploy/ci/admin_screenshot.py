"""A screenshot of the admin as a containerised web replica serves it (docs/screenshots/).

    .venv/bin/python deploy/ci/admin_screenshot.py <replica address:port> <user> <password> <png>

Run it against a stack deploy/ci/compose-check.sh left up (LUMASTRA_CI_KEEP=1), after
`createsuperuser` in a web container. The replica is reached through a port on 127.0.0.1
forwarded to its address, so the browser's Host is one the compose file allows; the browser
is Debian's chromium, driven by Playwright (as tests/browser does).
"""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path

from playwright.sync_api import sync_playwright

CHROMIUM = "/usr/bin/chromium"


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        sink.close()


def _forward(target: tuple[str, int]) -> int:
    """A port on 127.0.0.1 whose connections go on to `target`; returns the port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            client, _ = listener.accept()
            upstream = socket.create_connection(target)
            threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return int(listener.getsockname()[1])


def main(address: str, user: str, password: str, png: str) -> None:
    host, _, port = address.rpartition(":")
    base = f"http://127.0.0.1:{_forward((host, int(port)))}"
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{base}/admin/login/")
        page.fill("#id_username", user)
        page.fill("#id_password", password)
        page.click("input[type=submit]")
        page.wait_for_url(f"{base}/admin/")
        page.screenshot(path=png, full_page=True)
        browser.close()
    print(f"{png}: the admin at {address}, {Path(png).stat().st_size} bytes")


if __name__ == "__main__":
    main(*sys.argv[1:5])
