"""A real JupyterHub for the tests (deploy/hub/jupyterhub_config.py, with the gateway as its service), and a
student who logs in through its pages, starts a server and runs cells in a kernel over the Jupyter protocol."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import requests
from browser_support import free_port
from gateway_support import kill_left, stop_process, wait_for_log, wait_gone

ROOT = Path(__file__).resolve().parents[1]
HUB_CONFIG = ROOT / "deploy" / "hub" / "jupyterhub_config.py"
#: Where `make hub-deps` installs configurable-http-proxy when it is not on PATH.
LOCAL_CHP = ROOT / ".venv" / "chp" / "node_modules" / ".bin" / "configurable-http-proxy"
START_TIMEOUT_S = 120.0


def chp_command() -> str | None:
    """configurable-http-proxy on PATH, or where `make hub-deps` put it; None when neither has it."""
    return shutil.which("configurable-http-proxy") or (str(LOCAL_CHP) if LOCAL_CHP.exists() else None)


@dataclass
class Hub:
    """A running JupyterHub: its public URL, its process and log, and the lecturer's API token."""

    proc: subprocess.Popen
    url: str
    log: Path
    admin_token: str
    gateway_http: str
    api_url: str = ""
    proxy_api_port: int = 0

    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        """A call to the hub's REST API with the lecturer's token."""
        headers = {"Authorization": f"token {self.admin_token}", **kwargs.pop("headers", {})}
        return requests.request(method, f"{self.url}/hub/api{path}", headers=headers, timeout=30, **kwargs)

    def stop(self) -> list[str]:
        """Stop the hub: it stops the students' servers and its services (the gateway stops every cluster); any
        cluster process still there after that is killed, and its command line returned."""
        stop_process(self.proc, grace_s=60.0)
        return kill_left(self.left_behind()) + kill_left(wait_gone(None, self.gateway_http, timeout_s=30.0))

    def left_behind(self, timeout_s: float = 15.0) -> list[psutil.Process]:
        """Processes of this hub still alive after it stopped: its proxy, its services (the gateway) and the
        students' servers and kernels run in sessions of their own, so a hub that died (or never finished starting)
        leaves them behind. Found by the hub's API address in their environment and the proxy's API port in its
        command line; waited for a while, since the hub stops them as it exits."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = []
            for proc in psutil.process_iter(["pid"]):
                try:
                    if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                        continue
                    line = " ".join(proc.cmdline())
                    if (self.api_url and proc.environ().get("JUPYTERHUB_API_URL", "").startswith(self.api_url)) or (
                            self.proxy_api_port and "configurable-http-proxy" in line
                            and f"--api-port {self.proxy_api_port}" in line):
                        found.append(proc)
                except (psutil.Error, OSError):
                    continue
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.3)


def start_hub(work: Path, password: str, **settings: str) -> Hub:
    """JupyterHub from the course's configuration on free ports of 127.0.0.1, the shared-password authenticator and
    the simple local-process spawner (homes under work); settings are passed on as environment variables.

    A port found free may be taken by another process before the hub binds it (the suite runs in parallel): a start
    that fails on an address in use is tried once more on new ports."""
    for attempt in (1, 2):
        try:
            return _start_hub(work, password, settings)
        except RuntimeError as exc:
            if attempt == 2 or not any(m in str(exc).lower() for m in ("address already in use", "eaddrinuse")):
                raise
    raise AssertionError("unreachable")


def _start_hub(work: Path, password: str, settings: dict[str, str]) -> Hub:
    chp = chp_command()
    if chp is None:
        raise RuntimeError("configurable-http-proxy is missing: run `make hub-deps`")
    token = uuid.uuid4().hex
    env = {**os.environ, "DSGD_HUB_PORT": str(free_port()), "DSGD_HUB_API_PORT": str(free_port()),
           "DSGD_HUB_PROXY_API_PORT": str(free_port()), "DSGD_GATEWAY_HTTP_PORT": str(free_port()),
           "DSGD_GATEWAY_TCP_PORT": str(free_port()), "DSGD_HUB_CHP": chp, "DSGD_HUB_AUTH": "shared",
           "DSGD_HUB_PASSWORD": password, "DSGD_HUB_SPAWNER": "simple", "DSGD_HUB_HOMES": str(work / "home"),
           "DSGD_HUB_ADMIN_TOKEN": token, "DSGD_GATEWAY_BACKEND": "unsafe", **settings}
    log = work / "hub.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(HUB_CONFIG)], cwd=work, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    hub = Hub(proc, f"http://127.0.0.1:{env['DSGD_HUB_PORT']}", log, token,
              f"http://127.0.0.1:{env['DSGD_GATEWAY_HTTP_PORT']}",
              api_url=f"http://127.0.0.1:{env['DSGD_HUB_API_PORT']}/", proxy_api_port=int(env["DSGD_HUB_PROXY_API_PORT"]))
    try:
        wait_for_log(log, r"JupyterHub is now running", proc, START_TIMEOUT_S)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # the gateway service answers through the hub's proxy
            try:
                if requests.get(f"{hub.url}/services/dask-gateway/api/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the gateway service never answered; hub log:\n{log.read_text()[-4000:]}")
            time.sleep(0.3)
    except BaseException:
        hub.stop()
        raise
    return hub


class Student:
    """A student's browser session on the hub: logged in through the login page, holding the hub's cookies."""

    def __init__(self, hub: Hub, name: str, password: str) -> None:
        self.hub, self.name = hub, name
        self.session = requests.Session()
        page = self.session.get(f"{hub.url}/hub/login", timeout=30)
        xsrf = re.search(r'name="_xsrf"\s+value="([^"]+)"', page.text)
        data = {"username": name, "password": password, **({"_xsrf": xsrf.group(1)} if xsrf else {})}
        reply = self.session.post(f"{hub.url}/hub/login", data=data, timeout=30, allow_redirects=False)
        if reply.status_code != 302 or "jupyterhub-hub-login" not in self.session.cookies:
            raise PermissionError(f"{name} could not log in: {reply.status_code} {reply.text[:300]}")
        self.token = self._call("POST", f"/users/{name}/tokens", json={"expires_in": 1800, "note": "test"}).json()["token"]

    def _call(self, method: str, path: str, **kwargs) -> requests.Response:
        """The hub's REST API as this student, with the login cookie and its XSRF token (as the hub's pages do)."""
        headers = {"X-XSRFToken": self.session.cookies.get("_xsrf", "")}
        reply = self.session.request(method, f"{self.hub.url}/hub/api{path}", headers=headers, timeout=30, **kwargs)
        reply.raise_for_status()
        return reply

    def start_server(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Ask the hub for this student's server and wait until it is ready."""
        self._call("POST", f"/users/{self.name}/server")
        deadline = time.monotonic() + timeout_s
        while not self._call("GET", f"/users/{self.name}").json().get("servers", {}).get("", {}).get("ready"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}'s server was not ready within {timeout_s:.0f} s")
            time.sleep(0.5)

    def stop_server(self, timeout_s: float = 60.0) -> None:
        """Ask the hub to stop this student's server and wait until it is gone."""
        self._call("DELETE", f"/users/{self.name}/server")
        deadline = time.monotonic() + timeout_s
        while self._call("GET", f"/users/{self.name}").json().get("servers", {}).get(""):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}'s server did not stop within {timeout_s:.0f} s")
            time.sleep(0.5)

    def kernel(self) -> Kernel:
        """A new python3 kernel in this student's server."""
        base = f"{self.hub.url}/user/{self.name}/api"
        headers = {"Authorization": f"token {self.token}"}
        reply = requests.post(f"{base}/kernels", json={"name": "python3"}, headers=headers, timeout=60)
        reply.raise_for_status()
        return Kernel(base, reply.json()["id"], headers)


class Kernel:
    """A kernel of a student's server, driven over its websocket with the Jupyter messaging protocol."""

    def __init__(self, base: str, kernel_id: str, headers: dict[str, str]) -> None:
        import websocket

        self.base, self.id, self.headers = base, kernel_id, headers
        url = base.replace("http://", "ws://") + f"/kernels/{kernel_id}/channels"
        self.ws = websocket.create_connection(url, header=[f"{k}: {v}" for k, v in headers.items()], timeout=30)
        self.session = uuid.uuid4().hex

    def execute(self, code: str, timeout_s: float = 300.0) -> tuple[str, list[str]]:
        """Run code; return what it printed and its errors ('ename: evalue'), failing loudly after timeout_s."""
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "username": "student", "session": self.session, "msg_type": "execute_request",
                  "version": "5.3", "date": ""}
        content = {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                   "allow_stdin": False, "stop_on_error": True}
        self.ws.send(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content,
                                 "channel": "shell", "buffers": []}))
        printed, errors, idle, replied = [], [], False, False
        deadline = time.monotonic() + timeout_s
        while not (idle and replied):
            self.ws.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                msg = json.loads(self.ws.recv())
            except Exception as exc:  # websocket's timeout or a closed socket
                raise TimeoutError(f"no answer from the kernel within {timeout_s:.0f} s ({exc!r}); "
                                   f"printed so far: {''.join(printed)[-2000:]}") from exc
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, body = msg["header"]["msg_type"], msg["content"]
            if kind == "stream":
                printed.append(body.get("text", ""))
            elif kind in ("execute_result", "display_data"):
                printed.append(body.get("data", {}).get("text/plain", ""))
            elif kind == "error":
                errors.append(f"{body.get('ename')}: {body.get('evalue')}")
            elif kind == "status" and body.get("execution_state") == "idle":
                idle = True
            elif kind == "execute_reply":
                replied = True
        return "".join(printed), errors

    def run_notebook(self, path: Path, timeout_s: float = 300.0) -> str:
        """Run a notebook's code cells in order; return all they printed; raise at the first error."""
        import nbformat

        out = []
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if cell.cell_type != "code":
                continue
            printed, errors = self.execute(cell.source, timeout_s)
            out.append(printed)
            if errors:
                raise AssertionError(f"{path.name} cell {i}: {errors}; printed: {printed[-2000:]}")
        return "".join(out)

    def shut_down(self) -> None:
        """Shut the kernel down through the Jupyter server's REST API (DELETE /api/kernels/<id>): what closing a
        notebook and choosing to shut its kernel down does."""
        self.ws.close()
        reply = requests.delete(f"{self.base}/kernels/{self.id}", headers=self.headers, timeout=60)
        reply.raise_for_status()

    def close(self) -> None:
        self.ws.close()
