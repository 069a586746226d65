"""Hosts on one machine for the partition scenarios (issue 26): network namespaces on a bridge,
and the cuts between them.

The stores (the scenario's own Valkey and Postgres) listen on the bridge's address in the root
namespace; each host is a network namespace with one veth on the bridge and a hostname of its
own (a UTS namespace per process it runs: `argv`), so its worker's instance ids name it as a
real host's would. A cut is an nftables table inside the host's namespace that drops its
packets to and from chosen store ports, all of them or a random share (`numgen`): the host's
connections see silence, not a reset, as on a dead network path. This kernel has no netem
qdisc, so loss is dropped by nftables rather than by `tc netem`.

Only 10.77.0.0/24 (the bridge and the namespaces made here) and loopback are used; the subnet
is refused if anything on the machine already routes it. `down()` removes every namespace and
the bridge, also after a failure (the driver calls it in a `finally`); namespaces left by a
killed earlier run (named `lmf-*`) are removed first. Needs root, `ip` (iproute2) and `nft`
(nftables), which `make test` installs when missing (deploy/system-deps.sh).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field

SUBNET = "10.77.0"
STORES_ADDRESS = f"{SUBNET}.1"  # the bridge's, in the root namespace
BRIDGE = "lmf-br0"
NAMESPACE_PREFIX = "lmf-"
CUT_TABLE = "lumastra_cut"


@dataclass(frozen=True)
class Host:
    name: str  # also its hostname
    netns: str
    address: str


@dataclass
class Network:
    hosts: dict[str, Host] = field(default_factory=dict)

    def up(self) -> None:
        _remove_leftovers()
        routes = _run("ip", "-4", "route", "show").stdout
        if f"{SUBNET}." in routes:
            raise RuntimeError(f"{SUBNET}.0/24 is already routed on this machine: {routes}")
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{STORES_ADDRESS}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")

    def add_host(self, name: str) -> Host:
        index = len(self.hosts) + 11
        host = Host(name, f"{NAMESPACE_PREFIX}{name}", f"{SUBNET}.{index}")
        outside, inside = f"lmf-v{index}", f"lmf-h{index}"
        _run("ip", "netns", "add", host.netns)
        _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        _run("ip", "link", "set", inside, "netns", host.netns)
        _run("ip", "link", "set", outside, "master", BRIDGE)
        _run("ip", "link", "set", outside, "up")
        self._in(host, "ip", "addr", "add", f"{host.address}/24", "dev", inside)
        self._in(host, "ip", "link", "set", inside, "up")
        self._in(host, "ip", "link", "set", "lo", "up")
        self.hosts[name] = host
        return host

    def argv(self, host: Host, command: list[str]) -> list[str]:
        """`command` run on `host`: in its network namespace, with its own hostname."""
        return [
            "ip", "netns", "exec", host.netns, "unshare", "--uts", "--",
            "sh", "-c", 'hostname "$0" && exec "$@"', host.name, *command,
        ]  # fmt: skip

    def cut(self, host: Host, ports: Iterable[int], *, loss_percent: int = 100) -> None:
        """Drop `host`'s packets to and from the stores on `ports` (a share of them, at
        random, below 100 %). Replaces the host's earlier cut."""
        self.heal(host)
        port_set = "{ " + ", ".join(str(p) for p in ports) + " }"
        drop = "drop" if loss_percent >= 100 else f"numgen random mod 100 < {loss_percent} drop"
        rules = (
            f"table inet {CUT_TABLE} {{\n"
            "  chain out { type filter hook output priority 0; policy accept;\n"
            f"    ip daddr {STORES_ADDRESS} tcp dport {port_set} {drop}\n  }}\n"
            "  chain in { type filter hook input priority 0; policy accept;\n"
            f"    ip saddr {STORES_ADDRESS} tcp sport {port_set} {drop}\n  }}\n"
            "}\n"
        )
        subprocess.run(
            ["ip", "netns", "exec", host.netns, "nft", "-f", "-"],
            input=rules,
            text=True,
            check=True,
            capture_output=True,
        )

    def heal(self, host: Host) -> None:
        subprocess.run(
            ["ip", "netns", "exec", host.netns, "nft", "delete", "table", "inet", CUT_TABLE],
            capture_output=True,
        )

    def down(self) -> None:
        """Every namespace and the bridge (a namespace's veth goes with it). The processes run
        in them must be ended first: a namespace outlives its name while one still runs."""
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
        self.hosts.clear()
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)

    @staticmethod
    def _in(host: Host, *command: str) -> None:
        _run("ip", "netns", "exec", host.netns, *command)


def _remove_leftovers() -> None:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(NAMESPACE_PREFIX):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()}")
    return done
