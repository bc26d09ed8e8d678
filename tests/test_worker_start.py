"""Workers of a cluster the course starts are forked from one server that imported torch (runtime/clusters/worker_start.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from dsgd_teach.runtime.clusters.cluster import start_client
from dsgd_teach.runtime.clusters.worker_start import (
    remove_stale_server_folders,
    start_method,
    worker_start_settings,
)


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


def _listener(folder: Path, keep_bound: bool) -> socket.socket:
    """A pymp-style folder holding one listener socket, still bound or (like a killed process's) not."""
    folder.mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(folder / "listener-abc"))
    if not keep_bound:
        sock.close()
    return sock


def test_only_folders_of_servers_no_longer_listening_are_removed(tmp_path: Path) -> None:
    _listener(tmp_path / "pymp-dead", keep_bound=False)
    live = _listener(tmp_path / "pymp-live", keep_bound=True)
    _listener(tmp_path / "pymp-more", keep_bound=False)
    (tmp_path / "pymp-more" / "other").write_text("not multiprocessing's")
    (tmp_path / "pymp-file").mkdir()
    (tmp_path / "pymp-file" / "listener-abc").write_text("a file, not a socket")
    try:
        removed = remove_stale_server_folders(str(tmp_path))
    finally:
        live.close()
    assert removed == [tmp_path / "pymp-dead"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pymp-file", "pymp-live", "pymp-more"]


def test_a_killed_process_leaves_its_server_folder_and_the_next_start_removes_it(fresh_client) -> None:
    if start_method() != "forkserver":
        pytest.skip("this platform has no forkserver")
    killed = (
        "import os, multiprocessing.util as util\nfrom dsgd_teach.runtime.clusters.cluster import start_client\n"
        "client = start_client(1, quiet=True, use_gpu=False)\nprint(util.get_temp_dir(), flush=True)\n"
        "os._exit(0)  # as a killed kernel: no atexit\n"
    )
    done = subprocess.run([sys.executable, "-c", killed], check=True, timeout=120, capture_output=True, text=True)
    left = Path(done.stdout.strip().splitlines()[-1])
    assert left.name.startswith("pymp-") and any(left.glob("listener-*")), "the killed process left no server folder"
    worker_start_settings()  # what the next cluster start runs
    assert not left.exists()
    fresh_client.resize(3)  # this process's own server still forks workers
    assert len(fresh_client.run(_parent_command)) == 3


BIND_AND_WAIT = """
import socket, sys
sock = socket.socket(socket.AF_UNIX)
sock.bind(sys.argv[1])
print("bound", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a network namespace needs root")
def test_a_server_listening_from_another_network_namespace_keeps_its_folder(tmp_path: Path) -> None:
    (tmp_path / "pymp-other-net").mkdir()
    command = ["unshare", "--net", sys.executable, "-c", BIND_AND_WAIT, str(tmp_path / "pymp-other-net" / "listener-x")]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "bound"
        assert remove_stale_server_folders(str(tmp_path)) == []  # its own namespace lists the socket, ours does not
        assert (tmp_path / "pymp-other-net" / "listener-x").exists()
    finally:
        proc.communicate(timeout=30)  # closes its stdin: it exits
    assert remove_stale_server_folders(str(tmp_path)) == [tmp_path / "pymp-other-net"]  # now nobody listens
