"""Helpers for the browser tests: a throw-away JupyterLab server and a headless Chromium driven by Playwright."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: Lab settings for a test session: never save (the chapters are committed without outputs), render every cell
#: (no virtual windowing), no news or update pop-ups.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


def chromium_missing_reason() -> str | None:
    """Why the browser test cannot run here (None when Chromium and Playwright are both available)."""
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing (install Debian's chromium: `make browser-deps` as root)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]')"
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LabServer:
    """A running JupyterLab: its base URL, token, process and log file."""

    url: str
    token: str
    proc: subprocess.Popen
    log_path: Path
    seen: dict[int, psutil.Process] = field(default_factory=dict)

    def api(self, method: str, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        """Call the server's REST API with the token; returns (status, body)."""
        req = urllib.request.Request(
            f"{self.url}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def remember_processes(self) -> None:
        """Record the server's descendants (kernels, dask workers) so shutdown can make sure they are gone."""
        with contextlib.suppress(psutil.NoSuchProcess):
            for p in psutil.Process(self.proc.pid).children(recursive=True):
                self.seen.setdefault(p.pid, p)

    def log_tail(self, n: int = 60) -> str:
        """The last lines of the server's (and its kernels') output."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def log_size(self) -> int:
        """Bytes in the log so far (to look only at what a chapter added)."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def tracebacks_since(self, offset: int) -> list[str]:
        """Tracebacks the server or a kernel wrote to the log after offset (each with a few following lines)."""
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return reported_tracebacks(f.read().decode(errors="replace").splitlines())

    def shutdown_kernels(self) -> None:
        """Ask the server to shut every kernel down (each closes its cluster in its atexit handler)."""
        self.remember_processes()
        with contextlib.suppress(OSError, ValueError):
            status, body = self.api("GET", "/api/kernels")
            if status == 200:
                for kernel in json.loads(body):
                    self.api("DELETE", f"/api/kernels/{kernel['id']}", timeout=30)


#: What asyncio logs when the server wrote to the websocket of a browser page that had closed (the tests close each
#: chapter's page): tornado's write future fails and nobody awaits it. Not an error of the course; it is logged when
#: the future is collected, often during the next chapter.
CLOSED_PAGE_WRITE = ("WebSocketProtocol13.write_message", "exception=WebSocketClosedError()")
#: What jupyter_server logs when GET /api/kernels lists a kernel that is still starting: kernel_model reads the
#: kernel's last_activity, which the server sets only once the kernel is ready (its race, not the course's; the same
#: as enterprise_gateway issue 1395). Seen once beside a busy loop, as JupyterLab polled while a chapter's kernel
#: started; the page's next poll lists the kernel.
KERNEL_STILL_STARTING = ("in list_kernels", "kernel.last_activity")
#: Lines that join a traceback to the one before it (Python's chained exceptions).
CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


def reported_tracebacks(lines: list[str]) -> list[str]:
    """Each traceback in the log lines with the 25 lines from it, except the chains of a write to a closed page and
    of a kernel listed while it starts."""
    chains: list[tuple[str, list[str]]] = []  # (the line that logged the chain, its tracebacks)
    for i, line in enumerate(lines):
        if "Traceback" not in line:
            continue
        if not chains or not any(lines[j].lstrip().startswith(CHAINED) for j in range(max(0, i - 2), i)):
            chains.append((lines[i - 1] if i else "", []))
        chains[-1][1].append("\n".join(lines[i : i + 25]))
    found = []
    for header, tracebacks in chains:
        starting = all(mark in "\n".join(tracebacks) for mark in KERNEL_STILL_STARTING)
        if not starting and not all(mark in header for mark in CLOSED_PAGE_WRITE):
            found.extend(tracebacks)
    return found


def _write_settings(settings_dir: Path) -> None:
    for rel, values in LAB_SETTINGS.items():
        path = settings_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


@contextlib.contextmanager
def jupyter_lab(root_dir: Path, work_dir: Path, env: dict[str, str], start_timeout: float = 120.0) -> Iterator[LabServer]:
    """Start JupyterLab on a free 127.0.0.1 port with a random token; stop it and all its descendants after."""
    token = secrets.token_hex(16)
    port = free_port()
    for sub in ("settings", "workspaces", "runtime", "config", "checkpoints"):
        (work_dir / sub).mkdir(parents=True, exist_ok=True)
    _write_settings(work_dir / "settings")
    cmd = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root_dir}",
        "--LabApp.expose_app_in_browser=True",
        f"--LabApp.user_settings_dir={work_dir / 'settings'}",
        f"--LabApp.workspaces_dir={work_dir / 'workspaces'}",
        f"--FileCheckpoints.root_dir={work_dir / 'checkpoints'}",  # no .ipynb_checkpoints/ in course/
    ]  # fmt: skip
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # containers and CI runners often run as root
    full_env = {
        **os.environ,
        **env,
        "JUPYTER_RUNTIME_DIR": str(work_dir / "runtime"),
        "JUPYTER_CONFIG_DIR": str(work_dir / "config"),
        "PYTHONUNBUFFERED": "1",
    }
    log_path = work_dir / "jupyter-lab.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=root_dir)
    server = LabServer(f"http://127.0.0.1:{port}", token, proc, log_path)
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{server.log_tail()}")
            with contextlib.suppress(OSError):
                if server.api("GET", "/api/status", timeout=5)[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"jupyter lab not ready after {start_timeout:.0f} s:\n{server.log_tail()}")
            time.sleep(0.5)
        yield server
    finally:
        stop_server(server)


def stop_server(server: LabServer, timeout: float = 30.0) -> None:
    """Shut kernels and server down politely, then terminate (and finally kill) anything of theirs still alive."""
    server.shutdown_kernels()
    server.remember_processes()
    with contextlib.suppress(OSError):
        server.api("POST", "/api/shutdown")
    try:
        server.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        server.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.proc.wait(10)
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait(10)
    left = [p for p in server.seen.values() if p.is_running()]
    for p in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(left, timeout=10)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=5)


@contextlib.contextmanager
def chromium(user_data_dir: Path, viewport: tuple[int, int] = (1400, 1000)) -> Iterator[object]:
    """A fresh headless Chromium (Playwright BrowserContext) with its own user-data directory."""
    from playwright.sync_api import sync_playwright

    if user_data_dir.exists():
        shutil.rmtree(user_data_dir)
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(user_data_dir),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": viewport[0], "height": viewport[1]},
            device_scale_factor=1,
        )
        try:
            yield context
        finally:
            context.close()
