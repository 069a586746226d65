"""What tracing costs a run: bench/throughput.py untraced, then traced, in one invocation.

    .venv/bin/python bench/tracing.py [-n 2000] [--rounds 1]

Each pass is a whole `bench/throughput.py --json` (its own workers, its own bare Celery side
measured in the same pass), so each ratio is against bare Celery measured beside it. The traced
pass exports every span over OTLP/HTTP (`OTEL_EXPORTER_OTLP_ENDPOINT`, as an operator sets it)
to a sink in this process that decodes each export and counts its spans; the start side
(`start_run` in the bench's process) and the worker's pool processes are both traced.

Prints each pass's ratio, start_run p50, the spans the sink received, and what tracing costs:
1 - traced ratio / untraced ratio. docs/benchmarks.md ("Traces") records results.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)


class Sink:
    """An OTLP/HTTP trace endpoint that counts the spans it is sent."""

    def __init__(self) -> None:
        self.spans = 0
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp

                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = otlp.ExportTraceServiceRequest.FromString(body)
                count = sum(
                    len(scope.spans)
                    for resource in request.resource_spans
                    for scope in resource.scope_spans
                )
                with sink.lock:
                    sink.spans += count
                reply = otlp.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


def throughput(runs: int, rounds: int, env: dict[str, str]) -> dict[str, float]:
    """One `bench/throughput.py --json` pass; its medians."""
    out = subprocess.run(
        [sys.executable, "bench/throughput.py", "-n", str(runs), "--rounds", str(rounds), "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode:
        sys.exit(f"bench/throughput.py failed:\n{out.stdout}\n{out.stderr}")
    print(out.stdout, end="")
    medians: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return medians


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", "--runs", type=int, default=2000, help="runs per side")
    parser.add_argument("--rounds", type=int, default=1, help="rounds per pass")
    args = parser.parse_args()

    untraced_env = {
        k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "LUMASTRA_OTEL"
    }
    print("--- untraced")
    untraced = throughput(args.runs, args.rounds, untraced_env)
    sink = Sink()
    print(f"--- traced (OTLP/HTTP to {sink.url})")
    # Exported every 5 s as by default; a flush at each pool process's exit sends the rest.
    traced = throughput(
        args.runs, args.rounds, {**untraced_env, "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url}
    )
    cost = 1 - traced["ratio"] / untraced["ratio"]
    print(
        f"ratio lumastra/bare: untraced {untraced['ratio']:.2f}, traced {traced['ratio']:.2f}; "
        f"start_run p50 {untraced['start_run_p50_ms']:.3f} → {traced['start_run_p50_ms']:.3f} ms; "
        f"{sink.spans} spans received (the admission figure's starts among them); "
        f"tracing costs {cost:.0%} of throughput"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
