"""What the fault battery owns and breaks: its own Valkey/Redis server, its own PostgreSQL
server, and a TCP proxy in front of Postgres that it can make unreachable.

The shared Redis on 6379 and the shared Postgres are never stopped: the battery starts a
`redis-server` of its own on a free port (crashed with SIGKILL and started again on the same
port and directory, with or without an append-only file), points workers at the proxy
when Postgres has to go away, and starts a Postgres cluster of its own (`initdb`, `pg_ctl`)
when Postgres itself has to crash.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from contextlib import suppress
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ValkeyServer:
    """A `redis-server` the battery starts on a free port and may crash and restart.

    `aof=True`: `--appendonly yes --appendfsync always`, so every write acknowledged before a
    crash is there after the restart. `aof=False`: no persistence at all, so a restart is a
    Valkey that lost everything (live hashes, locks, the broker's queues)."""

    def __init__(self, *, aof: bool, log_path: Path, host: str = "127.0.0.1") -> None:
        self.aof = aof
        # Where clients reach it: loopback, or also the partition scenarios' bridge
        # (`tests.faults.netns`), which their hosts reach it by.
        self.host = host
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="lumastra-faults-valkey-"))
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, db: int) -> str:
        return f"redis://{self.host}:{self.port}/{db}"

    def argv(self) -> list[str]:
        binary = shutil.which("redis-server") or shutil.which("valkey-server")
        if binary is None:
            raise RuntimeError("the fault battery needs redis-server (or valkey-server) on PATH")
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.aof
            else ["--appendonly", "no"]
        )
        return [
            binary,
            "--port",
            str(self.port),
            "--bind",
            " ".join(dict.fromkeys(("127.0.0.1", self.host))),
            # Clients on the bridge are the scenario's own hosts, not the internet.
            "--protected-mode",
            "no",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--maxmemory-policy",
            "noeviction",
            "--logfile",
            str(self.log_path),
            *persistence,
        ]

    def start(self) -> None:
        self.process = subprocess.Popen(self.argv(), stdout=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 20
        while True:
            try:
                # An AOF being loaded answers LOADING: not ready yet.
                if client.ping():
                    break
            except (redis.ConnectionError, redis.BusyLoadingError):
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"redis-server on {self.port} did not start; see {self.log_path}"
                )
            time.sleep(0.05)
        client.close()

    def crash(self) -> None:
        """SIGKILL: no shutdown save, no goodbye to clients."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def restart(self) -> float:
        """Crash and start again on the same port and directory; returns seconds it was down."""
        began = time.monotonic()
        self.crash()
        self.start()
        return time.monotonic() - began

    def script_flush(self) -> None:
        client = redis.Redis(port=self.port)
        client.script_flush()
        client.close()

    def stop(self) -> None:
        self.crash()
        shutil.rmtree(self.dir, ignore_errors=True)


class PostgresServer:
    """A PostgreSQL cluster of the battery's own: `initdb` into a temporary directory, served
    by `pg_ctl start` on a free port of 127.0.0.1 (trust authentication, user `postgres`), with
    the server's default durability (`fsync`, `synchronous_commit` and `wal_writer_delay` as
    shipped; only `shared_buffers` is small). `crash()` is `pg_ctl stop -m immediate`: every
    process ends at once, without a checkpoint, and WAL still in Postgres's buffers is lost
    (WAL written out but not yet fsynced survives: the kernel holds it); `start()` starts it
    again on the same port and directory, and crash recovery replays the WAL that was written.
    `stop()` ends it and removes the directory.

    Postgres refuses to run as root: as root (CI and this machine), the binaries run as the
    `postgres` OS user (`runuser`), which owns the directory; otherwise as the current user.
    The binaries are found in /usr/lib/postgresql/<newest version>/bin, or on PATH."""

    def __init__(self, *, log_path: Path, host: str = "127.0.0.1") -> None:
        self.host = host  # as for ValkeyServer
        self.bin = postgres_bin()
        self._as: list[str] = []
        owner = None
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError(
                    "running as root, the battery's own Postgres needs a `postgres` OS user"
                ) from None
            self._as = ["runuser", "-u", "postgres", "--"]
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="lumastra-faults-pg-"))
        if owner is not None:
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
        self.data = self.dir / "data"
        self.server_log = self.dir / "server.log"
        self.log_path = log_path
        self.running = False

    def url(self, database: str) -> str:
        return f"postgres://postgres@{self.host}:{self.port}/{database}"

    def init(self) -> None:
        """`initdb`: a new cluster, UTF-8, trust authentication for local connections."""
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
            "--locale=C.UTF-8", "--no-instructions",
        )  # fmt: skip
        if self.host != "127.0.0.1":
            # The scenario's hosts, on its bridge's /24 (`tests.faults.netns`).
            subnet = self.host.rsplit(".", 1)[0] + ".0/24"
            with open(self.data / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {subnet} trust\n")

    def start(self) -> None:
        """`pg_ctl start`, waiting until it accepts connections (after crash recovery)."""
        options = (
            f"-p {self.port} -k {self.dir} "
            f"-c listen_addresses={','.join(dict.fromkeys(('127.0.0.1', self.host)))} -c fsync=on "
            "-c shared_buffers=32MB -c max_connections=100"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.server_log), "-w", "-t", "60",
            "-o", options, "start",
        )  # fmt: skip
        self.running = True

    def crash(self) -> None:
        """`pg_ctl stop -m immediate`: no checkpoint, no flush, every connection cut. Done as
        pg_ctl does it (SIGQUIT to the postmaster named in postmaster.pid, then wait until the
        file is gone), but without starting a process first, so the crash lands at the moment
        the caller chose, not some milliseconds later."""
        pid_file = self.data / "postmaster.pid"
        os.kill(int(pid_file.read_text().split()[0]), signal.SIGQUIT)
        deadline = time.monotonic() + 30
        while pid_file.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Postgres did not stop; see {self.server_log}")
            time.sleep(0.01)
        self.running = False

    def create_database(self, name: str) -> None:
        self._run(
            "psql", "-h", self.host, "-p", str(self.port), "-U", "postgres", "-d", "postgres",
            "-v", "ON_ERROR_STOP=1", "-q", "-c", f'CREATE DATABASE "{name}"',
        )  # fmt: skip

    def stop(self) -> None:
        """End it if it runs (`-m immediate`: nothing to keep), keep its log beside the
        battery's others, remove its directory."""
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"the battery's own Postgres did not stop: {exc}", flush=True)
        finally:
            self.running = False
            with suppress(OSError):
                shutil.copyfile(self.server_log, self.log_path)
            shutil.rmtree(self.dir, ignore_errors=True)

    def _run(self, program: str, *args: str) -> None:
        binary = self.bin / program
        argv = [*self._as, str(binary if binary.exists() else program), *args]
        done = subprocess.run(argv, cwd=self.dir, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(
                f"{program} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}"
                f"; server log {self.server_log}"
            )


def postgres_bin() -> Path:
    """The newest /usr/lib/postgresql/<version>/bin, or the directory of `pg_ctl` on PATH."""
    versions = []
    for found in Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"):
        with suppress(ValueError):
            versions.append((int(found.parent.parent.name), found.parent))
    if versions:
        return max(versions)[1]
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl is None:
        raise RuntimeError("the fault battery's own Postgres needs initdb and pg_ctl")
    return Path(pg_ctl).parent


class PgProxy:
    """A TCP proxy in front of Postgres, run on its own event loop in a thread.

    `cut()` makes Postgres unreachable through it, honestly: every connection is aborted
    (the clients see a reset connection mid-statement or at their next one) and the listening
    socket is closed, so new connections are refused, as during a Postgres restart or a lost
    route. `restore()` listens again on the same port."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="pg-proxy", daemon=True)
        self.server: asyncio.base_events.Server | None = None
        self.transports: set[asyncio.BaseTransport] = set()
        self.connections = 0

    def start(self) -> None:
        self.thread.start()
        self._call(self._listen())

    def cut(self) -> None:
        self._call(self._cut())

    def restore(self) -> None:
        self._call(self._listen())

    def close(self) -> None:
        self._call(self._cut())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)

    def _call(self, coroutine: object) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=10)  # type: ignore[arg-type]

    async def _listen(self) -> None:
        if self.server is None:
            self.server = await asyncio.start_server(
                self._serve, "127.0.0.1", self.port, reuse_address=True
            )

    async def _cut(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for transport in list(self.transports):
            transport.abort()
        self.transports.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self.connections += 1
        pair = (writer.transport, up_writer.transport)
        self.transports.update(pair)
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            for transport in pair:
                self.transports.discard(transport)
                transport.abort()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.transport.abort()
