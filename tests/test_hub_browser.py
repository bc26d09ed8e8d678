"""A student on the course's hub, in a real browser: the login page, the course's workspace, and the dask panes
filled from that student's own gateway cluster, all through the hub's one address.

The hub (deploy/hub, started by hub_support.start_hub: JupyterHub, configurable-http-proxy and dask-gateway-server,
all real) serves everything the browser may reach: any request to another address is refused, so the login, the
student's JupyterLab and the dashboard panes must all come through the hub's proxy. The student logs in at
/hub/login, and the hub starts their server, which opens the course's workspace (deploy/hub/start_server.py):
chapter 00 beside the Task Stream, Progress and Workers panes. The test runs the chapter's first cells (start_client
asks the gateway for the student's cluster), presses the Dask side panel's search button (what a student does),
and waits until the panes load that cluster's pages at /services/dask-gateway/clusters/<name>/, the Workers pane
lists the workers the notebook printed and the Task Stream shows the chapter's tasks. Stopping the student's server
leaves no cluster process behind.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
from browser_support import LAB_SETTINGS, chromium, chromium_missing_reason
from gateway_support import kill_left, wait_gone
from hub_support import chp_command, start_hub
from lab_support import PANES, column, connected_panes, open_workspace, pane_data, printed, run_cells, wait

PASSWORD = "course-password-2026"
STUDENT = "ada"
CHAPTER = "course/00_live_cluster.ipynb"  # where the student's server has it: ~/course, from start_server.py
SCREENSHOTS = Path(__file__).resolve().parents[1] / "build" / "screenshots"
#: Each wait for the panes (the gateway's workers import torch on a loaded machine first).
PANE_WAIT_S = 120

pytestmark = pytest.mark.skipif(chp_command() is None, reason="configurable-http-proxy is missing and could not be "
                                "installed: `make hub-deps` installs it with npm (npm missing here)")


def prepare_home(home: Path) -> None:
    """The student's Jupyter settings, as a test session needs them: the page exposes its JupyterLab app (the test
    reads the layout through it), nothing is saved, every cell is rendered, no news pop-ups."""
    config = home / ".jupyter"
    config.mkdir(parents=True, exist_ok=True)
    (config / "jupyter_server_config.json").write_text(json.dumps({"LabApp": {"expose_app_in_browser": True}}))
    for rel, values in LAB_SETTINGS.items():
        path = config / "lab" / "user-settings" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


@pytest.mark.browser
@pytest.mark.timeout(900)
def test_a_student_sees_their_gateway_cluster_in_the_workspace_through_the_hub(tmp_path):
    reason = chromium_missing_reason()
    if reason:
        pytest.skip(reason)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    prepare_home(tmp_path / "home" / STUDENT)
    hub = start_hub(tmp_path, PASSWORD, DSGD_MAX_CLUSTERS="1", DSGD_SMOKE="1")
    cluster, left = None, []
    try:
        hub_netloc, refused = urlsplit(hub.url).netloc, []

        def refuse(route) -> None:  # noqa: ANN001 - playwright Route
            """The browser reaches the hub's address and nothing else on the machine."""
            refused.append(route.request.url)
            route.abort()

        with chromium(tmp_path / "profile") as browser:
            page = browser.new_page()
            page.route(re.compile(rf"^https?://(?!{re.escape(hub_netloc)}/)"), refuse)
            try:
                page.goto(f"{hub.url}/hub/login", timeout=60_000)
                page.fill("input[name=username]", STUDENT)
                page.fill("input[name=password]", PASSWORD)
                page.click("input[type=submit], button[type=submit]")
                # the hub starts the server and sends the browser on to its default URL, /user/<name>/lab
                page.wait_for_url(re.compile(rf"/user/{STUDENT}/lab"), timeout=180_000)
                open_workspace(page, CHAPTER, 180)
                search = page.locator(".dask-URLInput [title='Auto-detect dashboard URL']")

                run_cells(page, CHAPTER, "notebook:run-all-above", 5, 5, timeout_s=300)  # start_client() and the workers' pids
                started = re.search(r"dask-gateway cluster (\w+)", printed(page, CHAPTER, 2))
                assert started, f"start_client did not ask the gateway for a cluster: {printed(page, CHAPTER, 2)!r}"
                cluster = started.group(1)
                expected = sorted(set(re.findall(r"'((?:tls|tcp)://[\d.]+:\d+)'", printed(page, CHAPTER, 4))))
                assert expected, f"cell 4 printed no workers: {printed(page, CHAPTER, 4)!r}"
                dashboard = f"{hub.url}/services/dask-gateway/clusters/{cluster}"

                search.click()
                link = page.locator(".dask-URLInput input")
                wait(page, "a dashboard URL found by the side panel's search", lambda: link.input_value())
                found = urljoin(f"{hub.url}/", link.input_value()).rstrip("/")
                assert found == dashboard, \
                    f"the search found {link.input_value()!r}, not {cluster}'s dashboard through the hub ({dashboard})"

                srcs = {p["title"]: p["src"] for p in wait(page, "the three panes connected",
                                                           lambda: connected_panes(page, CHAPTER))}
                for title, src in srcs.items():
                    assert src.startswith(f"{dashboard}/"), f"{title} loads {src}, not {cluster}'s dashboard"

                def workers() -> list[str]:
                    addresses = sorted(a for a in column(pane_data(page, PANES["Workers"]), "address") if "://" in a)
                    return addresses if addresses == expected else []

                try:
                    addresses = wait(page, f"the Workers pane listing the notebook's {len(expected)} workers",
                                      workers, PANE_WAIT_S)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}\nthe panes load {srcs}; requests refused (the browser reaches "
                                         f"only the hub): {refused[:5]}") from None
                run_cells(page, CHAPTER, "notebook:run-cell", 7, 8, timeout_s=300)  # one client.submit
                run_cells(page, CHAPTER, "notebook:run-cell", 9, 10, timeout_s=300)  # client.map over the workers
                tasks = wait(
                    page, "the chapter's slow_square tasks in the Task Stream pane",
                    lambda: [n for n in column(pane_data(page, PANES["Task Stream"]), "name")
                             if "slow_square" in str(n)], PANE_WAIT_S,
                )  # fmt: skip
                page.screenshot(path=str(SCREENSHOTS / "hub_workspace_live.png"))
                print(f"{STUDENT}'s cluster {cluster}: workers {addresses}; {len(tasks)} task(s) in the task "
                      f"stream; panes {srcs}")
            except Exception:
                page.screenshot(path=str(SCREENSHOTS / "hub_workspace_failure.png"))
                raise
            finally:
                page.close()
        # stopping the student's server ends the kernel, whose client shuts the cluster down
        hub.api("DELETE", f"/users/{STUDENT}/server")
        if cluster is not None:
            start = time.monotonic()
            still = wait_gone(cluster, hub.gateway_http, timeout_s=90)
            assert still == [], f"{cluster} outlived {STUDENT}'s server by {time.monotonic() - start:.0f} s: " \
                                f"{kill_left(still)}"
    finally:
        left = hub.stop()
    assert left == [], f"gateway clusters outlived the hub (killed now): {left}; its log: {hub.log}"
