"""`make lab` in a real browser: the committed workspace docks the dask panes beside chapter 00, and they show the
chapter's live cluster.

The server starts the way `make lab` starts it (the recipe is read from `make -n lab`: its workspace import, its
environment, its root and its start URL). The browser may reach only the notebook server, as on Binder: any request
to another port is refused, so the panes must reach the dashboard through jupyter-server-proxy. The test runs
chapter 00's first cells, presses the search button of the Dask side panel (what a student does), and waits until
the Workers pane lists the workers the notebook printed and, after the chapter's tasks ran, the Task Stream and
Progress panes hold them. A fast test checks binder/start: it imports the same layout as Binder's default workspace.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from browser_support import chromium, chromium_missing_reason, jupyter_lab
from lab_support import PANES, column, connected_panes, open_workspace, pane_data, printed, run_cells, wait

REPO = Path(__file__).resolve().parent.parent
SCREENSHOTS = REPO / "build" / "screenshots"
CHAPTER = "00_live_cluster.ipynb"


def make_lab_recipe() -> dict:
    """What `make lab` runs, from `make -n lab`: the workspace file it imports, its environment, root and URL."""
    dry = subprocess.run(["make", "-n", "lab"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, f"make -n lab failed:\n{dry.stdout}\n{dry.stderr}"
    lines = [shlex.split(line) for line in dry.stdout.replace("\\\n", " ").splitlines() if "bin/jupyter lab" in line]
    imports = [argv for argv in lines if argv[argv.index(_jupyter(argv)) + 1 : argv.index(_jupyter(argv)) + 3]
               == ["lab", "workspaces"]]  # fmt: skip
    servers = [argv for argv in lines if argv not in imports]
    assert len(imports) == 1 and len(servers) == 1, f"make lab should import one workspace, then start one server:\n{dry.stdout}"
    imp, srv = imports[0], servers[0]
    assert imp[imp.index(_jupyter(imp)) + 3 :][0] == "import", imp
    workspace = REPO / imp[-1]
    i = srv.index(_jupyter(srv))
    env = dict(a.split("=", 1) for a in srv[:i])
    options = dict(a[2:].split("=", 1) for a in srv[i + 2 :])
    unknown = set(options) - {"ServerApp.root_dir", "LabApp.default_url"}
    assert not unknown, f"make lab passes options this test does not reproduce: {sorted(unknown)}"
    return {"workspace": workspace, "env": env, "root": REPO / options["ServerApp.root_dir"],
            "url": options.get("LabApp.default_url", "/lab")}  # fmt: skip


def _jupyter(argv: list[str]) -> str:
    return next(a for a in argv if a.endswith("bin/jupyter"))


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.browser
@pytest.mark.timeout(240)
def test_make_lab_workspace_shows_the_live_cluster(tmp_path):
    """Opened as `make lab` opens it, the workspace docks three dask panes beside chapter 00; once the chapter
    started its cluster, the side panel's search connects them and they show its workers and its tasks."""
    reason = chromium_missing_reason()
    if reason:
        pytest.skip(reason)
    recipe = make_lab_recipe()
    work = tmp_path / "lab"
    (work / "workspaces").mkdir(parents=True)
    imported = subprocess.run(
        [sys.executable, "-m", "jupyter", "lab", "workspaces", "import", str(recipe["workspace"])],
        env={**os.environ, "JUPYTERLAB_WORKSPACES_DIR": str(work / "workspaces")},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert imported.returncode == 0, f"jupyter lab workspaces import failed:\n{imported.stderr}"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    original = (recipe["root"] / CHAPTER).read_bytes()
    dashboard_port = None
    with jupyter_lab(recipe["root"], work, {**recipe["env"], "DSGD_SMOKE": "1"}) as server, \
            chromium(work / "profile") as browser:  # fmt: skip
        lab, refused = urlsplit(server.url).netloc, []

        def refuse(route) -> None:  # noqa: ANN001 - playwright Route
            """As on Binder, the browser reaches the notebook server and nothing else on the machine."""
            refused.append(route.request.url)
            route.abort()

        page = browser.new_page()
        # the browser itself matches each request against the pattern: the notebook server's own requests (the
        # hundreds of JupyterLab's page) go straight through, every other http(s) address is handed to refuse
        page.route(re.compile(rf"^https?://(?!{re.escape(lab)}/)"), refuse)
        try:
            page.goto(f"{server.url}{recipe['url']}?token={server.token}", timeout=120_000)
            layout = open_workspace(page, CHAPTER, 120)
            panes = {p["title"]: p for p in layout["panes"]}
            notebook = layout["notebook"]
            for title, pane in panes.items():
                box = pane["box"]
                assert box["left"] >= notebook["right"] - 2, f"{title} is not beside the notebook: {layout}"
                assert box["width"] > 200 and box["height"] > 100, f"{title} is too small to read: {box}"
            search = page.locator(".dask-URLInput [title='Auto-detect dashboard URL']")
            page.screenshot(path=str(SCREENSHOTS / "lab_workspace_opened.png"))

            run_cells(page, CHAPTER, "notebook:run-all-above", 5, 5)  # start_client() and the workers' pids
            server.remember_processes()
            search.click()
            link = page.locator(".dask-URLInput input")
            wait(page, "a dashboard URL found by the side panel's search", lambda: link.input_value())
            active = wait(page, "the three panes connected to a dashboard", lambda: connected_panes(page, CHAPTER))
            found = re.search(r"(?:/proxy/|:)(\d+)/?$", link.input_value())
            dashboard_port = int(found.group(1)) if found else None
            srcs = {p["title"]: p["src"] for p in active}
            shown = printed(page, CHAPTER, 4)
            expected = sorted(set(re.findall(r"tcp://127\.0\.0\.1:\d+", shown)))
            assert len(expected) >= 2, f"cell 4 printed no workers of the chapter's cluster: {shown!r}"

            def workers() -> list[str]:
                addresses = sorted(a for a in column(pane_data(page, PANES["Workers"]), "address") if "://" in a)
                return addresses if addresses == expected else []

            try:
                addresses = wait(page, f"the Workers pane listing the notebook's {len(expected)} workers", workers)
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}\nsearch found {link.input_value()!r}; panes load {srcs}; requests the browser could "
                    f"not make (it reaches only the notebook server, as on Binder): {refused[:5]}"
                ) from None

            run_cells(page, CHAPTER, "notebook:run-cell", 7, 8)  # one client.submit
            run_cells(page, CHAPTER, "notebook:run-cell", 9, 10)  # client.map over the workers
            tasks = wait(
                page, "the chapter's slow_square tasks in the Task Stream pane",
                lambda: [n for n in column(pane_data(page, PANES["Task Stream"]), "name") if "slow_square" in str(n)],
            )  # fmt: skip
            progress = wait(
                page, "the slow_square tasks in the Progress pane",
                lambda: [n for n in column(pane_data(page, PANES["Progress"]), "name") if "slow_square" in str(n)],
            )  # fmt: skip
            page.screenshot(path=str(SCREENSHOTS / "lab_workspace_live.png"))
            print(f"workers {addresses}; {len(tasks)} task(s) in the task stream; progress rows {progress}; "
                  f"panes {srcs}")  # fmt: skip
        except Exception:
            page.screenshot(path=str(SCREENSHOTS / "lab_workspace_failure.png"))
            raise
        finally:
            page.close()
            if (recipe["root"] / CHAPTER).read_bytes() != original:
                (recipe["root"] / CHAPTER).write_bytes(original)
                pytest.fail(f"{CHAPTER} was saved during the test (restored)")
    if dashboard_port is not None:
        assert _port_closed(dashboard_port), f"the dashboard port {dashboard_port} is still open after shutdown"


@pytest.mark.timeout(120)
def test_binder_start_imports_the_layout_as_the_default_workspace(tmp_path):
    """binder/start makes the same layout Binder's default workspace, its notebook under course/, and sends the
    dashboard link through the proxy under the hub's prefix."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"), "JUPYTERHUB_SERVICE_PREFIX": "/user/ada/"}  # fmt: skip
    env.pop("DASK_DISTRIBUTED__DASHBOARD__LINK", None)
    probe = "import dask, distributed; print(dask.config.get('distributed.dashboard.link'))"
    run = subprocess.run(["bash", str(REPO / "binder" / "start"), sys.executable, "-c", probe], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=90)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "/user/ada/proxy/{port}/status", run.stdout
    saved = list((tmp_path / "workspaces").glob("default-*.jupyterlab-workspace"))
    assert len(saved) == 1, f"binder/start imported no default workspace:\n{run.stderr}"
    binder = json.loads(saved[0].read_text())["data"]
    committed = json.loads(make_lab_recipe()["workspace"].read_text())["data"]
    notebooks = {k: v["data"]["path"] for k, v in committed.items() if k.startswith("notebook:")}
    assert notebooks, "the committed workspace opens no notebook"
    for path in notebooks.values():
        assert (REPO / "course" / path).is_file(), f"the workspace opens {path}, which course/ does not have"
        assert binder[f"notebook:course/{path}"]["data"]["path"] == f"course/{path}"
    dask_panes = sorted(k for k in binder if k.startswith("dask-dashboard-launcher:"))
    assert dask_panes == sorted(f"dask-dashboard-launcher:{r}" for r in PANES.values()), dask_panes
    dock = json.dumps(binder["layout-restorer:data"]["main"])
    assert all(f"notebook:course/{p}" in dock for p in notebooks.values()) and all(k in dock for k in dask_panes), dock
