"""Shared fixtures: one small cluster for the whole session, and a check that nothing is left behind."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import psutil
import pytest

from dsgd_teach.runtime.clusters.cluster import start_client

os.environ.setdefault("DSGD_SMOKE", "1")


#: multiprocessing's own long-lived helpers: they end with the process that started them, not with a test.
HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def is_helper(proc: psutil.Process) -> bool:
    """True for multiprocessing's resource tracker and fork server (dsgd_teach/runtime/clusters/worker_start.py); not for
    the workers forked from that server, which carry its command line too."""
    if not any(helper in " ".join(proc.cmdline()) for helper in HELPERS):
        return False
    parent = proc.parent()
    return parent is None or "multiprocessing.forkserver" not in " ".join(parent.cmdline())


def _children() -> list[psutil.Process]:
    """Child processes of this test process, ignoring multiprocessing's helpers."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if not is_helper(proc):
                out.append(proc)
        except psutil.NoSuchProcess:  # gone, or a zombie (ZombieProcess is a NoSuchProcess)
            continue
    return out


def shm_blocks() -> set[str]:
    """Names of the POSIX shared-memory blocks on this host."""
    root = Path("/dev/shm")
    return {p.name for p in root.iterdir()} if root.exists() else set()


def held_by_others(names: set[str]) -> set[str]:
    """The blocks among names that a process outside this one's tree maps or holds open (another pytest-xdist
    worker's running test, say): they are not this session's to answer for."""
    ours = {os.getpid(), *(p.pid for p in _children())}
    paths = {f"/dev/shm/{n}": n for n in names}
    held: set[str] = set()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid in ours:
            continue
        try:
            maps = Path(f"/proc/{proc.pid}/maps").read_text()
            fds = [os.readlink(f) for f in Path(f"/proc/{proc.pid}/fd").iterdir()]
        except (OSError, psutil.Error):
            continue
        held |= {n for path, n in paths.items() if path in maps or path in fds}
    return held


@pytest.fixture(scope="session")
def client():
    """A two-worker local cluster shared by the tests that only need *a* cluster (closed at the end)."""
    with start_client(2, quiet=True, use_gpu=False) as c:
        yield c


@pytest.fixture(scope="module")
def cluster4():
    """Four workers grown from two (what chapter 05's panel does), one cluster per test module."""
    with start_client(2, quiet=True, use_gpu=False) as c:
        c.resize(4)
        yield c


@pytest.fixture
def fresh_client():
    """A private two-worker cluster, for tests that resize, kill workers or check clean-up."""
    with start_client(2, quiet=True, use_gpu=False) as c:
        yield c


@pytest.fixture(scope="module")
def gpu_client():
    """A GPU cluster (one worker per GPU, at most two) for a module of `gpu` tests; they skip without CUDA."""
    import torch

    with start_client(min(2, torch.cuda.device_count()), quiet=True, use_gpu=True) as c:
        yield c


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind():
    """After the whole session: no stray child processes or new shared-memory blocks."""
    shm_before = shm_blocks()
    yield
    import gc
    import time

    gc.collect()
    deadline = time.monotonic() + 20
    while _children() and time.monotonic() < deadline:
        time.sleep(0.2)
    leftover = _children()
    new_shm = {n for n in shm_blocks() - shm_before if n.startswith(("psm_", "dsgd"))}
    new_shm -= held_by_others(new_shm)
    assert not leftover, f"child processes left behind: {[p.cmdline() for p in leftover]}"
    assert not new_shm, f"shared-memory blocks left behind: {sorted(new_shm)}"
    names = [t.name for t in threading.enumerate() if t.name.startswith("dsgd")]
    assert not names, f"course threads left running: {names}"


# The modules that take minutes each, longest first: `make test` runs them first so that its two pytest-xdist
# workers (one file per worker at a time) finish together instead of one waiting on a long file started last.
SLOW_MODULES = ("test_browser.py", "test_nbgrader_route.py", "test_grading_batch.py",
                "test_grading_hostile.py", "test_grading_sandbox.py", "test_hub.py", "test_multihost.py",
                "test_slides_browser.py", "test_lab_workspace.py", "test_hub_browser.py")


# Last: the book test builds the book from the chapters test_browser.py executed in this run, in full mode (it
# executes those missing itself), so it goes after everything else.
LAST_MODULES = ("test_book.py",)


def slow_first(items: list[pytest.Item]) -> None:
    """Reorder items in place: SLOW_MODULES first in their listed order, then the rest as collected, LAST_MODULES
    at the end."""
    rank = {name: i for i, name in enumerate(SLOW_MODULES)}
    rank.update({name: len(SLOW_MODULES) + 1 for name in LAST_MODULES})
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_MODULES)))


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what they will
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the slow modules first, and skip a chapter's plain smoke-mode run when this session also runs it in
    JupyterLab.

    test_browser.py executes the chapter in full mode in a real kernel and fails on the same things (an error
    output, a traceback on stderr) and more; test_external_deployment.py runs it in smoke mode on a CLI deployment
    (in the compat stage under `make test`). Without Chromium, or with the browser tests deselected, the plain run
    stays.
    """
    from browser_support import chromium_missing_reason

    slow_first(items)
    in_lab = {item.callspec.id for item in items
              if getattr(item, "originalname", "") == "test_chapter_in_jupyterlab" and hasattr(item, "callspec")}
    if not in_lab or chromium_missing_reason():
        return
    for item in items:
        if (getattr(item, "originalname", "") == "test_chapter_executes_in_smoke_mode"
                and item.callspec.id in in_lab):
            item.add_marker(pytest.mark.skip(reason="run in JupyterLab by test_browser.py this session"))
