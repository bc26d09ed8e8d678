"""A class on the course's hub (deploy/hub): JupyterHub, configurable-http-proxy and dask-gateway-server, all real.

Three students log in through the hub's login page, start their servers through its REST API, and run chapter 00
at the same time in real kernels, each on a gateway cluster of their own. A student's client reaches only their own
clusters; a second cluster past the per-student limit gets a clear message in the notebook; shutting down a kernel
that holds a cluster (the Jupyter server's DELETE /api/kernels/<id>, what closing a notebook and shutting its kernel
down does), stopping a server, or the gateway's idle time-out for a student who left a cluster running, leaves no
cluster and no process behind; the lecturer sees every student's clusters through the hub, and stops them all
(deploy/hub/class_clusters.py).
"""

from __future__ import annotations

import importlib.util
import re
import threading
import time

import psutil
import pytest
import requests
from gateway_support import kill_left, wait_gone
from hub_support import ROOT, Kernel, Student, chp_command, start_hub

from dsgd_teach.course_runner import COURSE_DIR

PASSWORD = "course-password-2026"
STUDENTS = ("ada", "cy", "eve")
CHAPTER = "00_live_cluster.ipynb"
#: The gateway shuts a cluster down after this many seconds without a task: the course's limit (DSGD_IDLE_TIMEOUT)
#: is long, since a chapter on a loaded machine may spend a minute without a task; a student may ask for less.
IDLE_LIMIT_S, IDLE_S = 900, 40
#: How long a kernel's shutdown, or a stop the lecturer asked for, may take to leave no cluster process.
GONE_S = 90

pytestmark = pytest.mark.skipif(chp_command() is None, reason="configurable-http-proxy is missing and could not be "
                                "installed: `make hub-deps` installs it with npm (npm missing here)")


def lecturer_tool():
    spec = importlib.util.spec_from_file_location("class_clusters", ROOT / "deploy" / "hub" / "class_clusters.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The course's hub on free ports of 127.0.0.1: shared password, local-process servers and clusters, one
    cluster per student."""
    server = start_hub(tmp_path_factory.mktemp("hub"), PASSWORD, DSGD_MAX_CLUSTERS="1",
                       DSGD_IDLE_TIMEOUT=str(IDLE_LIMIT_S))
    try:
        yield server
    finally:
        left = server.stop()
    assert left == [], f"gateway clusters outlived the hub (killed now): {left}; its log: {server.log}"


def servers_of(user: str) -> list[psutil.Process]:
    """Live processes started for a student's server (JupyterHub sets JUPYTERHUB_USER in them and their kernels)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("JUPYTERHUB_USER") == user and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def processes_gone(*users: str, timeout_s: float = 60.0) -> bool:
    """Wait until no process of these students' servers is left (a server's kernels exit just after it)."""
    deadline = time.monotonic() + timeout_s
    while any(servers_of(u) for u in users):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def pid_gone(pid: int, timeout_s: float = GONE_S) -> bool:
    """Wait until the process pid has exited (or is a zombie); false at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.3)
    return False


def hold_cluster(kernel: Kernel) -> str:
    """A one-worker gateway cluster started (and held) in the kernel: its name."""
    printed, errors = kernel.execute("from dsgd_teach import start_client\nheld = start_client(1)")
    assert not errors, errors
    return re.search(r"dask-gateway cluster (\w+)", printed).group(1)


def run_chapter(student: Student, results: dict[str, object], kernels: dict[str, Kernel]) -> None:
    """The student's chapter in a kernel of their server; what it printed (or the exception) goes to results, the
    kernel (the student's tab, open after the chapter's last cell closed its client) to kernels."""
    try:
        kernel = kernels[student.name] = student.kernel()
        kernel.execute(f"import os; os.chdir({str(COURSE_DIR)!r})")
        results[student.name] = kernel.run_notebook(COURSE_DIR / CHAPTER, timeout_s=300)
    except BaseException as exc:  # reported by the main thread
        results[student.name] = exc


@pytest.mark.notebook
@pytest.mark.timeout(900)
def test_a_class_runs_a_chapter_at_once_each_on_their_own_cluster(hub):
    tool = lecturer_tool()
    gateway = f"{hub.url}/services/dask-gateway"
    students = [Student(hub, name, PASSWORD) for name in STUDENTS]
    for student in students:
        student.start_server()

    results: dict[str, object] = {}
    kernels: dict[str, Kernel] = {}
    threads = [threading.Thread(target=run_chapter, args=(s, results, kernels)) for s in students]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a chapter did not finish within 600 s"
    failed = {name: out for name, out in results.items() if isinstance(out, BaseException)}
    assert not failed, failed
    names = {s: re.findall(r"dask-gateway cluster (\w+)", results[s]) for s in STUDENTS}
    assert all(len(n) >= 1 for n in names.values()), f"a chapter did not run on the gateway: {names}"
    assert len({n[0] for n in names.values()}) == len(STUDENTS), f"students shared a cluster: {names}"
    assert tool.class_clusters(f"{hub.url}/hub/api", hub.admin_token, gateway) == {s: [] for s in STUDENTS}

    # in the tabs they ran the chapter in, cy leaves a cluster running (asking for a short idle time-out); ada can
    # neither see it nor reach it; cy's second cluster is past the limit
    ada, cy, eve = students
    ada_kernel, cy_kernel, eve_kernel = kernels["ada"], kernels["cy"], kernels["eve"]
    _, errors = ada_kernel.execute("from dask_gateway import Gateway")
    assert not errors, errors
    printed, errors = cy_kernel.execute(f"import dask\ndask.config.set({{'gateway.cluster.options': "
                                        f"{{'idle_timeout': {IDLE_S}}}}})\nfrom dsgd_teach import start_client\n"
                                        "held = start_client(1)")
    assert not errors, errors
    held = re.search(r"dask-gateway cluster (\w+)", printed).group(1)
    # its dashboard is served through the hub, at the link the notebook (and the Dask side panel) shows
    printed, errors = cy_kernel.execute("print(held.dashboard_link)")
    assert not errors and printed.strip() == f"{hub.url}/services/dask-gateway/clusters/{held}/status", (printed, errors)
    pane = requests.get(f"{hub.url}/services/dask-gateway/clusters/{held}/individual-workers", timeout=30)
    assert pane.status_code == 200 and "bokeh" in pane.text.lower(), pane.status_code
    _, errors = cy_kernel.execute("second = start_client(1)")
    assert len(errors) == 1 and "GatewayLimitError" in errors[0] and "cy already has 1 cluster" in errors[0], errors
    printed, errors = ada_kernel.execute("print(Gateway().list_clusters())")
    assert not errors and printed.strip() == "[]", (printed, errors)
    _, errors = ada_kernel.execute(f"Gateway().connect({held!r})")
    assert len(errors) == 1 and ("403" in errors[0] or "lacks permissions" in errors[0]), errors
    ada_kernel.close()
    assert tool.class_clusters(f"{hub.url}/hub/api", hub.admin_token, gateway) == {"ada": [], "cy": [held], "eve": []}

    # eve closes a notebook whose kernel holds a cluster and shuts the kernel down (DELETE /api/kernels/<id>): the
    # kernel exits, its client shuts the cluster down, and the gateway has no cluster of hers left
    eves = hold_cluster(eve_kernel)
    printed, errors = eve_kernel.execute("print(os.getpid())")
    assert not errors, errors
    eve_pid = int(printed.strip())
    start = time.monotonic()
    eve_kernel.shut_down()
    assert pid_gone(eve_pid), f"eve's kernel {eve_pid} still runs {GONE_S} s after its shutdown"
    left = wait_gone(eves, hub.gateway_http, timeout_s=GONE_S)
    assert left == [], f"eve's cluster {eves} outlived her kernel's shutdown by {GONE_S} s: {kill_left(left)}"
    assert tool.class_clusters(f"{hub.url}/hub/api", hub.admin_token, gateway, users=["eve"]) == {"eve": []}
    print(f"eve's kernel and cluster gone {time.monotonic() - start:.1f} s after DELETE /api/kernels/<id>")

    # ada stops her server: nothing of hers is left
    ada.stop_server()
    assert processes_gone("ada")

    # cy closes the tab: the kernel still holds the cluster, the gateway's idle time-out ends it
    cy_kernel.close()
    # watched on this machine (its processes), then asked of the gateway once: each question through the hub
    # borrows and revokes a token of cy's
    left = wait_gone(held, hub.gateway_http, timeout_s=IDLE_S * 3)
    assert left == [], f"cy's idle cluster {held} outlived the {IDLE_S} s idle time-out: {left}"
    assert tool.class_clusters(f"{hub.url}/hub/api", hub.admin_token, gateway, users=["cy"]) == {"cy": []}

    # the lecturer stops every student's clusters (class_clusters.py --stop): two held in open kernels, by cy and eve
    tabs = {"cy": cy.kernel(), "eve": eve.kernel()}
    held = {user: hold_cluster(kernel) for user, kernel in tabs.items()}
    listed = tool.class_clusters(f"{hub.url}/hub/api", hub.admin_token, gateway, stop=True)
    assert listed == {"ada": [], "cy": [held["cy"]], "eve": [held["eve"]]}, listed
    for user, name in held.items():
        left = wait_gone(name, hub.gateway_http, timeout_s=GONE_S)
        assert left == [], f"{user}'s cluster {name} outlived the lecturer's stop by {GONE_S} s: {kill_left(left)}"
    assert tool.class_clusters(f"{hub.url}/hub/api", hub.admin_token, gateway) == {s: [] for s in STUDENTS}
    for student in (cy, eve):
        tabs[student.name].close()
        student.stop_server()
    assert processes_gone("cy", "eve")
    assert wait_gone(None, hub.gateway_http) == []
