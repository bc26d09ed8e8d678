"""The course on a real dask-gateway-server (the course's deploy/hub/gateway_config.py, local-process backend).

start_client asks the gateway for a cluster of the student's own, grows it as a chapter asks, and shuts it down on
close; another student can neither see nor stop it; a request past the per-student limits gets a clear error.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import nbformat
import pytest
from dask_gateway import BasicAuth, Gateway, GatewayCluster
from gateway_support import start_gateway, wait_gone
from hub_support import chp_command

from dsgd_teach.course_runner import COURSE_DIR, execute
from dsgd_teach.memory import WorkerMemoryError, min_worker_limit
from dsgd_teach.runtime.clusters.cluster import start_client
from dsgd_teach.runtime.clusters.gateway import GatewayLimitError, close_once, gateway_address
from dsgd_teach.runtime.clusters.workers import get_workers, scalable_cluster

PASSWORD = "course-password"
#: The chapter run on the gateway: short in smoke mode, and it grows its cluster.
CHAPTER = "00_live_cluster.ipynb"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """A gateway on free ports of 127.0.0.1: one cluster per student, at most 4 cores a cluster (3 workers and the
    scheduler), workers of at most 4 GiB."""
    server = start_gateway(tmp_path_factory.mktemp("gateway"), DSGD_GATEWAY_AUTH="simple",
                           DSGD_GATEWAY_PASSWORD=PASSWORD, DSGD_GATEWAY_BACKEND="unsafe", DSGD_MAX_CLUSTERS="1",
                           DSGD_MAX_CORES="4", DSGD_MAX_WORKER_MEMORY="4")
    try:
        yield server
    finally:
        left = server.stop()
    assert left == [], f"gateway clusters outlived the gateway (killed now): {left}; its log: {server.log}"


def as_student(monkeypatch, gateway, user: str) -> None:
    for name, value in gateway.client_env(user, PASSWORD).items():
        monkeypatch.setenv(name, value)


@contextmanager
def gateway_as(gateway, user: str) -> Iterator[Gateway]:
    """A dask_gateway.Gateway client authenticated as user."""
    gw = Gateway(gateway.address, proxy_address=gateway.proxy_address, auth=BasicAuth(user, PASSWORD))
    try:
        yield gw
    finally:
        close_once(gw)


def running(gateway, user: str) -> list[str]:
    """Names of the user's pending or running clusters, asked of the gateway as that user."""
    with gateway_as(gateway, user) as gw:
        return [c.name for c in gw.list_clusters(status=["pending", "running"])]


def test_start_client_asks_the_gateway_for_a_cluster_of_the_students_own(gateway, monkeypatch):
    as_student(monkeypatch, gateway, "alice")
    assert gateway_address() == gateway.address
    with start_client(quiet=True) as client:
        cluster = scalable_cluster(client)
        assert client.info.kind == "gateway" and isinstance(cluster, GatewayCluster)
        assert running(gateway, "alice") == [cluster.name]
        limits = {w["memory_limit"] for w in client.scheduler_info(n_workers=-1)["workers"].values()}
        assert len(limits) == 1 and min_worker_limit() <= limits.pop() <= min_worker_limit() + 0.01 * 2**30
        assert set(client.run(lambda: __import__("torch").get_num_threads()).values()) == {1}
        grown = get_workers(client, 3)
        assert grown.enough and len(grown.addresses) == 3

        # another student sees nothing of it and can neither reach nor stop it
        assert running(gateway, "bob") == []
        with gateway_as(gateway, "bob") as bob:
            with pytest.raises(Exception, match="403|lacks permissions"):
                bob.connect(cluster.name)
            with pytest.raises(Exception, match="403|lacks permissions"):
                bob.stop_cluster(cluster.name)
        assert running(gateway, "alice") == [cluster.name]

        # past the per-student limits: a second cluster, more workers than the gateway's cap
        with pytest.raises(GatewayLimitError, match="alice already has 1 cluster.*allows 1 per student"):
            start_client(1, quiet=True)
        with pytest.raises(GatewayLimitError, match="exceed resource limit of 3 workers"):
            get_workers(client, 5)
    assert running(gateway, "alice") == []
    assert wait_gone(cluster.name, gateway.address) == []


def test_a_worker_larger_than_the_gateway_offers_is_refused_before_anything_starts(gateway, monkeypatch):
    as_student(monkeypatch, gateway, "carol")
    with pytest.raises(WorkerMemoryError, match="offers at most 4.0 GiB per worker.*asks 8192 MiB"):
        start_client(2, memory_limit="8GiB", quiet=True)
    assert running(gateway, "carol") == []
    monkeypatch.setenv("DSGD_GATEWAY", "off")
    assert gateway_address() is None


#: test_hub.py's test, which runs this chapter on the same gateway configuration (behind the hub) for two students
#: at once and checks the same outcomes.
HUB_TEST = "test_a_class_runs_a_chapter_at_once_each_on_their_own_cluster"


@pytest.mark.notebook
@pytest.mark.timeout(420)
def test_a_chapter_runs_on_the_gateway_and_leaves_no_cluster(gateway, monkeypatch, tmp_path, request):
    """Chapter 00 in smoke mode on the gateway, as a student's kernel runs it; skipped where this session runs it on
    the hub (test_hub.py: the chapter's output names a gateway cluster, no cluster and no process is left)."""
    if chp_command() is not None and any(item.name == HUB_TEST for item in request.session.items):
        pytest.skip("test_hub.py runs chapter 00 on the course's gateway in this session")
    as_student(monkeypatch, gateway, "dave")
    monkeypatch.setenv("DSGD_SMOKE", "1")
    execute(COURSE_DIR / CHAPTER, tmp_path, timeout_s=300, html=False)
    nb = nbformat.read(tmp_path / CHAPTER, as_version=4)
    errors = [f"{o.get('ename')}: {o.get('evalue')}" for c in nb.cells for o in c.get("outputs", [])
              if o.output_type == "error"]
    assert not errors, errors
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "dask-gateway cluster" in text, "the chapter did not run on the gateway"
    assert running(gateway, "dave") == []
    assert wait_gone(None, gateway.address) == []


class _Session:
    """Stands for a Gateway's aiohttp session: its close is what the gateway's cleanup awaits."""

    closed = False

    async def close(self) -> None:
        self.closed = True


def test_a_gateway_collected_on_its_own_event_loop_thread_does_not_hang_the_loop():
    """A Gateway whose __del__ runs on the thread of the event loop it would wait on (where the garbage collector
    ran it during another student's stop_cluster) returns at once and its session is still closed: unguarded, the
    loop waited on itself and every later gateway call hung (test_start_client_... once never ended). No gateway
    server is needed: nothing is sent."""
    import asyncio

    from dsgd_teach.runtime.clusters.gateway import guard_gateway_finalizers

    guard_gateway_finalizers()
    owner = Gateway("http://127.0.0.1:9", auth=BasicAuth("nobody", PASSWORD))
    victim = Gateway("http://127.0.0.1:9", auth=BasicAuth("nobody", PASSWORD), loop=owner.loop)
    session = _Session()
    victim._session = session  # a session to close, as a gateway that has made a request holds

    async def collect_here() -> None:
        victim.__del__()  # what the collector does on this thread

    done = asyncio.run_coroutine_threadsafe(collect_here(), owner.loop.asyncio_loop)
    done.result(timeout=10)  # unguarded: the loop thread waits on itself and this times out
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0.1), owner.loop.asyncio_loop).result(timeout=10)
    assert session.closed, "the session was left open (aiohttp warns 'Unclosed client session' in the notebook)"
    close_once(victim)
    close_once(owner)
