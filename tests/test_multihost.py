"""The course on several emulated hosts: network namespaces with their own /dev/shm, dask started with its CLI.

The scheduler runs on host 0, one worker on host 1, two workers and the notebook kernel on host 2 (addresses in
10.213.x.0/24, which exists only inside the namespaces). The host-aware chapters run in smoke mode (every chapter
with DSGD_MULTIHOST_ALL=1); Hogwild's ranks share host 2 (the kernel's, not the first in address order), chapter
05's process group spans hosts 1 and 2, and the deployment is left exactly as it was. Needs root (CI runs as
root); everything made is removed in the fixture's finally.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from dsgd_teach.course_runner import chapters
from dsgd_teach.runtime.clusters import deployment, hosts

REASON = hosts.available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"multi-host test skipped: {REASON}")
ROOT = Path(__file__).resolve().parent.parent
KERNEL_HOST = 2  # has two workers; host 1's single worker comes first in address order

PROBE = """
import json
from dsgd_teach import start_client
from dsgd_teach.collectives import AllreduceConfig, run_allreduce
from dsgd_teach.hogwild import HogwildConfig, run_hogwild
from dsgd_teach.ps import DownpourConfig, ShardedServer
import numpy as np

with start_client(quiet=True) as client:
    hog = run_hogwild(HogwildConfig(n_samples=2_000, n_features=500, density=0.02, epochs=2, workers=2), client)
    ring = run_allreduce(AllreduceConfig(workers=2, algorithm="ring", elements=10_000, repeats=2), client)
    server = ShardedServer.start(client, np.zeros(6, dtype=np.float32), n_shards=2, lr=0.5)
    shards = sorted({i.address.split("//")[1].split(":")[0] for i in server.infos})
    server.close()
print("PROBE " + json.dumps({"hogwild": hog.summary["hosts"], "allreduce": ring.summary["hosts"],
                             "shards": shards}))
"""


class Cluster:
    """Three emulated hosts and a dask deployment on them; python(...) runs on the kernel's host (host 2)."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.hosts = hosts.up(3)
        self.dep: deployment.Deployment | None = None

    def start(self) -> None:
        h = self.hosts
        self.dep = deployment.start_scheduler(self.work, host=h.ips[0], prefix=h.prefix(0),
                                              log=self.work / "scheduler.log")
        for i, host in enumerate((1, 2, 2)):
            deployment.start_worker(self.dep, host=h.ips[host], prefix=h.prefix(host),
                                    log=self.work / f"worker{i}.log")
        self.python("-m", "dsgd_teach.runtime.clusters.deployment", "wait", self.dep.address, "3", timeout=180)

    def python(self, *args: str, timeout: float, env: dict[str, str] | None = None) -> str:
        """Run this interpreter with args on host 2 (the kernel's host); returns stdout, fails with the logs."""
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        proc = self.hosts.run(KERNEL_HOST, sys.executable, *args, env=full_env, capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT)
        assert proc.returncode == 0, f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        return proc.stdout

    def fingerprint(self) -> dict:
        assert self.dep is not None
        return json.loads(self.python("-m", "dsgd_teach.runtime.clusters.deployment", "fingerprint", self.dep.address, timeout=60))

    def stop(self) -> None:
        try:
            if self.dep is not None:
                self.dep.stop()
        finally:
            self.hosts.down()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("multihost"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.mark.timeout(300)
def test_placement_knows_about_hosts(cluster):
    before = cluster.fingerprint()
    out = cluster.python("-c", PROBE, timeout=240, env={"DSGD_SCHEDULER": cluster.dep.address})
    probe = json.loads(out.split("PROBE ", 1)[1])
    ips = cluster.hosts.ips
    assert probe["hogwild"] == ips[KERNEL_HOST], "Hogwild's ranks must share one host: the kernel's"
    assert probe["allreduce"] == f"{ips[1]},{ips[2]}", "the process group must span both worker hosts"
    assert probe["shards"] == sorted([ips[1], ips[2]]), "parameter shards must spread over hosts"
    assert cluster.fingerprint() == before


#: Chapters whose placement depends on hosts: Hogwild's shared memory (02), parameter-server shards and their
#: checkpoints (03), process groups (05). The others only submit tasks and actors, which dask places anywhere;
#: they run on a CLI deployment in test_external_deployment.py. DSGD_MULTIHOST_ALL=1 runs every chapter here too.
HOST_AWARE = ("02", "03", "05")


def _chapters_here() -> list[Path]:
    if os.environ.get("DSGD_MULTIHOST_ALL") == "1":
        return chapters()
    return [p for p in chapters() if p.name.startswith(HOST_AWARE)]


@pytest.mark.notebook
@pytest.mark.timeout(1800)
def test_chapters_on_three_hosts(cluster):
    before = cluster.fingerprint()
    out = cluster.work / "course"
    todo = _chapters_here()
    # the executed notebooks only: the HTML pages and panel snapshots (each panel's run once more) go unread here
    cluster.python("-m", "dsgd_teach.course_runner", "--smoke", "--notebooks-only", "--out", str(out),
                   "--only", *[p.name[:2] for p in todo], timeout=1700, env={"DSGD_SCHEDULER": cluster.dep.address})
    for path in todo:
        nb = nbformat.read(out / path.name, as_version=4)
        errors = [f"cell {i}: {o.get('ename')}: {o.get('evalue')}" for i, c in enumerate(nb.cells)
                  for o in c.get("outputs", []) if o.output_type == "error"]
        assert not errors, (path.name, errors)
    text = "".join(o.get("text", "") for c in nbformat.read(out / "05_allreduce.ipynb", as_version=4).cells
                   for o in c.get("outputs", []))
    ips = cluster.hosts.ips
    assert f"on host(s) {ips[1]},{ips[2]}" in text, "chapter 05's group must span both worker hosts"
    assert cluster.fingerprint() == before


def test_hosts_are_gone_after_down(tmp_path):
    h = hosts.up(2, rate="200mbit")
    names = list(h.namespaces) + [h.switch]
    h.down()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(n in listed for n in names)
    assert not any(Path(d).exists() for d in h.shm_dirs)
