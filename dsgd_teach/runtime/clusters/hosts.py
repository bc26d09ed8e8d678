"""Emulated hosts on one Linux machine: network namespaces on a private bridge, each with its own /dev/shm.

Host i is the network namespace `<tag>-h<i>` with one interface, eth0, at 10.213.<net>.<i+1>/24, joined by a veth
pair to a bridge inside a switch namespace `<tag>-sw`; those addresses exist only inside these namespaces, so no
traffic leaves them. Every process started "on" host i runs in that namespace and in a mount namespace whose
/dev/shm is host i's own tmpfs, so shared memory works between processes of one host and not across hosts, as on
real machines. Links can be shaped with a token bucket (tc tbf; netem is not available everywhere). Needs root.

Used by the multi-host tests, chapter 05's shaped-links measurement (dsgd_teach/collectives/shaped_links.py, also
run by the benchmark) through `shaped_deployment`, and `python -m dsgd_teach.runtime.clusters.hosts up|down` for lecturers.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_DIR = Path("/run/dsgd-hosts")
NET_PREFIX = "10.213"


def available() -> str | None:
    """None when namespaces can be made here, else the reason (for skips)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    missing = [t for t in ("ip", "tc", "unshare", "mount") if shutil.which(t) is None]
    if missing:
        return f"missing tools: {', '.join(missing)}"
    return None


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=30)


@dataclass
class Hosts:
    """A set of emulated hosts; ips[i] is host i's address; down() removes everything up() made."""

    tag: str
    net: int
    namespaces: list[str]
    ips: list[str]
    shm_dirs: list[str]
    rate: str | None = None
    made: list[str] = field(default_factory=list)  # what exists, for teardown: "ns:NAME", "mount:DIR", "dir:DIR"

    @property
    def switch(self) -> str:
        """The namespace holding the bridge."""
        return f"{self.tag}-sw"

    def prefix(self, i: int) -> list[str]:
        """Command prefix running a command on host i (its network namespace and its own /dev/shm)."""
        script = f'mount --bind {shlex.quote(self.shm_dirs[i])} /dev/shm && exec "$@"'
        return ["ip", "netns", "exec", self.namespaces[i], "unshare", "--mount", "--propagation", "private",
                "sh", "-c", script, "sh"]

    def run(self, i: int, *cmd: str, **kwargs) -> subprocess.CompletedProcess:  # noqa: ANN003 - subprocess's
        """Run a command on host i and wait for it."""
        return subprocess.run([*self.prefix(i), *cmd], **kwargs)

    def down(self) -> None:
        """Delete namespaces (which removes their veths and bridge), unmount and remove the /dev/shm dirs."""
        for item in reversed(self.made):
            kind, name = item.split(":", 1)
            if kind == "ns":
                _sh("ip", "netns", "del", name, check=False)
            elif kind == "mount":
                _sh("umount", "-l", name, check=False)
            elif kind == "dir":
                shutil.rmtree(name, ignore_errors=True)
        self.made.clear()
        state = STATE_DIR / f"{self.tag}.json"
        state.unlink(missing_ok=True)


def up(n_hosts: int, rate: str | None = None, tag: str | None = None) -> Hosts:
    """Make n_hosts emulated hosts on a private bridge (links shaped to `rate`, e.g. "200mbit", if given)."""
    reason = available()
    if reason:
        raise RuntimeError(f"cannot make emulated hosts: {reason}")
    if not 1 <= n_hosts <= 8:
        raise ValueError(f"n_hosts must be an integer in [1, 8], got {n_hosts}")
    tag = tag or f"dsgd{uuid.uuid4().hex[:6]}"
    net = 100 + int(uuid.uuid4().int % 150)  # 10.213.<net>.0/24; the tag keeps names unique
    hosts = Hosts(tag, net, [f"{tag}-h{i}" for i in range(n_hosts)],
                  [f"{NET_PREFIX}.{net}.{i + 1}" for i in range(n_hosts)], [], rate)
    try:
        for ns in [hosts.switch, *hosts.namespaces]:
            _sh("ip", "netns", "add", ns)
            hosts.made.append(f"ns:{ns}")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            # a ring step reuses a connection idle since the last step: keep its window instead of slow-starting
            _sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=0")
        _sh("ip", "-n", hosts.switch, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", hosts.switch, "link", "set", "br0", "up")
        root = STATE_DIR / tag
        root.mkdir(parents=True, exist_ok=True)
        hosts.made.append(f"dir:{root}")
        for i, (ns, ip) in enumerate(zip(hosts.namespaces, hosts.ips, strict=True)):
            # created directly inside the namespaces: no interface ever appears in the machine's own namespace
            _sh("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}", "netns",
                hosts.switch)
            _sh("ip", "-n", hosts.switch, "link", "set", f"p{i}", "master", "br0")
            _sh("ip", "-n", hosts.switch, "link", "set", f"p{i}", "up")
            _sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            if rate:
                shape(ns, "eth0", rate)
                shape(hosts.switch, f"p{i}", rate)
            shm = root / f"h{i}-shm"
            shm.mkdir()
            _sh("mount", "-t", "tmpfs", "-o", "size=512m,mode=1777", "tmpfs", str(shm))
            hosts.made.append(f"mount:{shm}")
            hosts.shm_dirs.append(str(shm))
        (STATE_DIR / f"{tag}.json").write_text(json.dumps(asdict(hosts)))
    except BaseException:
        hosts.down()
        raise
    return hosts


#: Token-bucket depth (4 KB). A deeper bucket (64 KB) lets short transfers run above the rate, so the α-β fit
#: of dsgd_teach/collectives/shaped_links.py would read a faster link for small messages than for large ones.
BURST = "32kbit"


def shape(namespace: str, dev: str, rate: str) -> None:
    """Token-bucket rate limit on dev's egress (tbf rate RATE burst BURST latency 50ms), TCP ACKs exempt.

    Packets shorter than 128 bytes (TCP's pure ACKs) go to a class without the bucket (an htb root with two
    classes and a u32 filter; the prio qdisc is not available everywhere). Without that, a host that sends and
    receives at once (every step of a ring) queues the ACKs of its incoming flow behind its own outgoing data,
    up to the bucket's 50 ms, and each short transfer crawls through TCP slow start at that round trip: measured
    here, a ring step of 1.3 MiB at 200 Mbit/s took five times what the link allows.
    """
    tc = ["ip", "netns", "exec", namespace, "tc"]
    _sh(*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "20", "r2q", "1000")
    _sh(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit")
    _sh(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:20", "htb", "rate", "10gbit")
    _sh(*tc, "qdisc", "add", "dev", dev, "parent", "1:20", "handle", "20:", "tbf", "rate", rate,
        "burst", BURST, "latency", "50ms")
    # IPv4 total length (bytes 2-3 of the header) below 128: a pure ACK, no payload
    _sh(*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
        "match", "u16", "0x0000", "0xff80", "at", "2", "flowid", "1:10")


def retransmits(hosts: Hosts) -> int:
    """TCP segments retransmitted on all hosts so far (from each namespace's /proc/net/snmp)."""
    total = 0
    for ns in hosts.namespaces:
        lines = [line.split() for line in _sh("ip", "netns", "exec", ns, "cat", "/proc/net/snmp").stdout.splitlines()
                 if line.startswith("Tcp:")]
        total += int(lines[1][lines[0].index("RetransSegs")])
    return total


def load(tag: str) -> Hosts:
    """The hosts made by `up` under tag (from their state file), e.g. to take them down from another shell."""
    return Hosts(**json.loads((STATE_DIR / f"{tag}.json").read_text()))


@contextmanager
def shaped_deployment(n_hosts: int, rate: str | None) -> Iterator[tuple[Hosts, Any]]:
    """n_hosts emulated hosts with links shaped to rate (None: unshaped), a dask scheduler on host 0 started with
    dask's command line and one single-threaded worker on each other host; all of it stopped and removed on the way
    out."""
    import tempfile

    from . import deployment

    work = Path(tempfile.mkdtemp(prefix="dsgd-shaped-"))
    h = up(n_hosts, rate=rate)
    dep = None
    try:
        dep = deployment.start_scheduler(work, host=h.ips[0], prefix=h.prefix(0))
        for i in range(1, len(h.ips)):  # all the emulated hosts share this machine's cores: one thread each
            deployment.start_worker(dep, host=h.ips[i], prefix=h.prefix(i), env={"OMP_NUM_THREADS": "1"})
        yield h, dep
    finally:
        try:
            if dep is not None:
                dep.stop()
        finally:
            h.down()
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m dsgd_teach.runtime.clusters.hosts up [--hosts 3] [--rate 200mbit]` / `down TAG`: emulated hosts for a lecture."""
    parser = argparse.ArgumentParser(prog="python -m dsgd_teach.runtime.clusters.hosts", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="make the hosts and print how to start dask on them")
    p_up.add_argument("--hosts", type=int, default=3)
    p_up.add_argument("--rate", default="200mbit", help="per-link token-bucket rate ('none' for unshaped)")
    p_down = sub.add_parser("down", help="remove the hosts made under TAG")
    p_down.add_argument("tag")
    args = parser.parse_args(argv)
    if args.cmd == "down":
        load(args.tag).down()
        print(f"removed {args.tag}")
        return 0
    hosts = up(args.hosts, None if args.rate == "none" else args.rate)
    run = " ".join(shlex.quote(a) for a in hosts.prefix(0))
    print(f"hosts {hosts.tag}: " + ", ".join(f"{ns} = {ip}" for ns, ip in zip(hosts.namespaces, hosts.ips, strict=True)))
    print(f"on host 0:  {run} dask scheduler --host {hosts.ips[0]} --port 8786")
    for i in range(len(hosts.ips)):  # two workers on host 0, where the notebook runs (Hogwild shares its memory)
        pre = " ".join(shlex.quote(a) for a in hosts.prefix(i))
        print(f"on host {i}:  {pre} dask worker tcp://{hosts.ips[0]}:8786 --host {hosts.ips[i]} --nthreads 1")
    print(f"notebook:   DSGD_SCHEDULER=tcp://{hosts.ips[0]}:8786 {run} jupyter lab --allow-root")
    print(f"when done:  python -m dsgd_teach.runtime.clusters.hosts down {hosts.tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
