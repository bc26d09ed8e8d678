"""A real dask-gateway-server for the tests, started from the course's deploy/hub/gateway_config.py on 127.0.0.1."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
GATEWAY_CONFIG = ROOT / "deploy" / "hub" / "gateway_config.py"
#: A gateway started on free ports (port 0: it picks them) prints where it listens; at most this long to start.
START_TIMEOUT_S = 90.0


@dataclass
class GatewayServer:
    """A running dask-gateway-server: its HTTP address, its scheduler proxy, its process and log."""

    proc: subprocess.Popen
    address: str
    proxy_address: str
    log: Path
    env: dict[str, str] = field(default_factory=dict)

    def client_env(self, user: str, password: str) -> dict[str, str]:
        """The dask configuration, as environment variables, of a student `user` using this gateway."""
        return {
            "DASK_GATEWAY__ADDRESS": self.address,
            "DASK_GATEWAY__PROXY_ADDRESS": self.proxy_address,
            "DASK_GATEWAY__AUTH__TYPE": "basic",
            "DASK_GATEWAY__AUTH__KWARGS__USERNAME": user,
            "DASK_GATEWAY__AUTH__KWARGS__PASSWORD": password,
        }

    def stop(self) -> list[str]:
        """SIGINT (the gateway stops every cluster it runs), then the process group; any cluster process still
        there after that is killed, and its command line returned (a leak the caller reports)."""
        stop_process(self.proc)
        return kill_left(wait_gone(None, self.address, timeout_s=30.0))


def stop_process(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Interrupt a server started in a session of its own, then terminate and kill its group if it lingers."""
    for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    try:  # whatever is left of its group (the proxy is a child in the same session)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def wait_for_log(log: Path, pattern: str, proc: subprocess.Popen, timeout_s: float) -> re.Match:
    """The first match of pattern in a server's log; a loud failure with the log's tail if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        found = re.search(pattern, text)
        if found:
            return found
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}; its log ends:\n{text[-3000:]}")
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    raise TimeoutError(f"no {pattern!r} in the server's log within {timeout_s:.0f} s; it ends:\n{tail}")


def start_gateway(work: Path, **settings: str) -> GatewayServer:
    """dask-gateway-server from the course's configuration on free ports of 127.0.0.1, with settings as env."""
    env = {**os.environ, "DSGD_GATEWAY_HTTP": "127.0.0.1:0", "DSGD_GATEWAY_TCP": "127.0.0.1:0", **settings}
    log = work / "gateway.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "dask_gateway_server", "-f", str(GATEWAY_CONFIG)], cwd=work,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        http = wait_for_log(log, r"HTTP routes listening at (http://[\d.]+:\d+)", proc, START_TIMEOUT_S).group(1)
        tcp = wait_for_log(log, r"Scheduler routes listening at (gateway://[\d.]+:\d+)", proc, START_TIMEOUT_S).group(1)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # the proxy answers once it has its routes
            try:
                with urllib.request.urlopen(f"{http}/api/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the gateway at {http} never answered; log:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
    except BaseException:
        stop_process(proc)
        raise
    return GatewayServer(proc, http, tcp, log, settings)


def cluster_processes(name: str | None = None, gateway: str | None = None) -> list[psutil.Process]:
    """Live processes of dask-gateway clusters on this machine: of the cluster `name` only, and of the gateway whose
    HTTP address is `gateway` only, if given. Every scheduler and worker the local backend starts has the cluster's
    name and its gateway's API address in its environment (DASK_GATEWAY_CLUSTER_NAME, DASK_GATEWAY_API_URL)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            env = proc.environ()
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.Error, OSError):
            continue
        cluster = env.get("DASK_GATEWAY_CLUSTER_NAME")
        if not cluster or (name is not None and cluster != name):
            continue
        if gateway is None or env.get("DASK_GATEWAY_API_URL", "").startswith(gateway):
            found.append(proc)
    return found


def wait_gone(name: str | None, gateway: str | None = None, timeout_s: float = 60.0) -> list[psutil.Process]:
    """Wait until no process of the cluster (of the gateway) is left; return those still there at the deadline."""
    deadline = time.monotonic() + timeout_s
    left = cluster_processes(name, gateway)
    while left and time.monotonic() < deadline:
        time.sleep(0.3)
        left = cluster_processes(name, gateway)
    return left


def kill_left(procs: list[psutil.Process]) -> list[str]:
    """SIGKILL each process left behind (by its pid); their command lines, for the failure message."""
    lines = []
    for proc in procs:
        try:
            lines.append(" ".join(proc.cmdline())[:200])
            proc.kill()
        except psutil.Error:
            continue
    return lines
