"""Workers of a cluster the course starts are forked from one server that imported torch (runtime/worker_start.py)."""

from __future__ import annotations

import psutil
import pytest

from dsgd_teach.runtime.cluster import start_client
from dsgd_teach.runtime.worker_start import start_method


def _parent_command() -> str:
    """The command line of this worker process's parent."""
    import psutil

    return " ".join(psutil.Process().parent().cmdline())


def test_workers_and_the_ones_a_resize_adds_are_forked_from_the_preloading_server(fresh_client) -> None:
    if start_method() != "forkserver":
        pytest.skip("this platform has no forkserver")
    fresh_client.resize(3)
    parents = fresh_client.run(_parent_command)
    assert len(parents) == 3
    for address, command in parents.items():
        assert "multiprocessing.forkserver" in command, (address, command)
        assert "'torch'" in command, command  # the server imported torch before forking the worker


def test_spawn_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSGD_WORKER_START", "spawn")
    with start_client(2, quiet=True, use_gpu=False) as client:
        parents = client.run(_parent_command)
    me = " ".join(psutil.Process().cmdline())
    assert set(parents.values()) == {me}  # children of this process (its nannies), started afresh


def test_a_bad_worker_start_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSGD_WORKER_START", "fork")
    with pytest.raises(ValueError, match="DSGD_WORKER_START must be 'forkserver' or 'spawn'"):
        start_method()
