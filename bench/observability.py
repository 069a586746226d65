"""What seeing work costs per run: the live log, progress and webhooks, against no-op runs.

    .venv/bin/python bench/observability.py [-n 1000] [--rounds 2] [--concurrency 2|io]

Each round drains, through the same kind of fresh worker (bench/throughput.py's Lumastra
side: enqueue all, then open the queue; first to last `finished_at`):
- N no-op runs (`bench-noop`), the baseline;
- N runs that each write 100 log lines and 100 progress reports (`bench-chatty`);
- N no-op runs with two webhook endpoints enabled (every state change written to the outbox
  by the trigger), while a webhook loop in this process delivers them to a local receiver.
It prints each rate and the cost of a run's logs and progress, and of its webhook events, in
ms per run over the baseline, and how many deliveries reached the receiver.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.throughput import (  # noqa: E402
    load_average,
    lumastra_side,
    pool_concurrency,
    setup,
)


class _Receiver:
    def __init__(self) -> None:
        self.count = 0
        lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    receiver.count += 1
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _endpoints(url: str) -> None:
    from orchestrator.webhooks.delivery import create_endpoint

    for _ in range(2):
        create_endpoint(url, states=[], tasks=[])


def _deliver(stop: threading.Event) -> None:
    """The webhook loop, as the worker role runs it, beside the drain."""
    from django.db import connection

    from orchestrator.webhooks.delivery import Deliverer

    deliverer = Deliverer()
    try:
        while not stop.wait(0.5):
            deliverer.tick()
    finally:
        connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", default="2", help="worker processes, or 'io'")
    parser.add_argument("--loglevel", default="WARNING")
    args = parser.parse_args(argv)
    os.environ["LUMASTRA_WEBHOOK_ALLOW_PRIVATE"] = "true"  # the receiver is on this machine
    setup()
    args.concurrency = pool_concurrency(args.concurrency)
    from orchestrator.models import WebhookDelivery
    from orchestrator.webhooks.delivery import Deliverer

    receiver = _Receiver()
    costs: dict[str, list[float]] = {"logs+progress": [], "webhooks": []}
    print(f"N={args.runs} runs per side, concurrency={args.concurrency}")
    for round_no in range(args.rounds):
        print(f"round {round_no + 1}  (load {load_average()})")
        noop = lumastra_side(args.runs, args)
        chatty = lumastra_side(args.runs, args, task_id="bench-chatty")
        stop = threading.Event()
        before = receiver.count
        loop = threading.Thread(target=_deliver, args=(stop,), daemon=True)
        loop.start()
        hooked = lumastra_side(args.runs, args, prepare=lambda: _endpoints(receiver.url))
        stop.set()
        loop.join()
        began = time.perf_counter()
        while (
            Deliverer().tick().fanned_out
            or WebhookDelivery.objects.filter(status="pending").exists()
        ):
            pass
        backlog_s = time.perf_counter() - began
        delivered = receiver.count - before
        pending = WebhookDelivery.objects.exclude(status="delivered").count()
        for name, side in (("logs+progress", chatty), ("webhooks", hooked)):
            costs[name].append((1 / side.rate - 1 / noop.rate) * 1000)
        print(f"  no-op runs            {noop.rate:7.0f} runs/s")
        print(f"  100 logs + progress   {chatty.rate:7.0f} runs/s")
        print(
            f"  two webhook endpoints {hooked.rate:7.0f} runs/s "
            f"({delivered} deliveries received, the last {backlog_s:.1f} s after the runs; "
            f"{pending} not delivered)"
        )
    for name, values in costs.items():
        print(f"median extra cost of {name}: {statistics.median(values):.2f} ms per run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
