"""Getting workers and placing ranks by host: pure placement rules, and a cluster object handed in by the user."""

from __future__ import annotations

import logging
import time

import pytest
from distributed import LocalCluster

from dsgd_teach.ps.server import default_placement
from dsgd_teach.runtime.clusters.cluster import start_client, worker_addresses
from dsgd_teach.runtime.clusters.workers import (
    by_host,
    capacity,
    get_workers,
    interleave_hosts,
    rendezvous_host,
)

A = ["tcp://10.0.0.1:4001", "tcp://10.0.0.1:4002", "tcp://10.0.0.2:4001", "tcp://10.0.0.2:4002"]


def test_by_host_groups_and_interleave_alternates():
    assert by_host(A) == {"10.0.0.1": A[:2], "10.0.0.2": A[2:]}
    assert interleave_hosts(A) == [A[0], A[2], A[1], A[3]]
    one_host = ["tcp://127.0.0.1:3", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]
    assert interleave_hosts(one_host) == sorted(one_host)  # one host: the order every chapter already relies on


def test_parameter_shards_spread_over_hosts():
    def hosts(placement: list[str]) -> set[str]:
        return {a.split("//")[1].split(":")[0] for a in placement}

    assert len(hosts(default_placement(A, 2))) == 2
    uneven = ["tcp://10.0.0.1:4001", "tcp://10.0.0.2:4001", "tcp://10.0.0.2:4002"]
    assert len(hosts(default_placement(uneven, 2))) == 2
    one_host = ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "tcp://127.0.0.1:3"]
    assert default_placement(one_host, 2) == one_host[::-1][:2]  # one host: from the last worker, as before


def test_rendezvous_refuses_loopback_across_hosts():
    assert rendezvous_host(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]) == "127.0.0.1"
    assert rendezvous_host(["tcp://10.0.0.1:1", "tcp://10.0.0.2:1"]) == "10.0.0.1"
    with pytest.raises(ValueError, match="cannot reach"):
        rendezvous_host(["tcp://127.0.0.1:1", "tcp://10.0.0.2:1"])


def test_get_workers_rejects_bad_counts(client):
    with pytest.raises(ValueError, match=r"n must be an integer in \[1, 64\]"):
        get_workers(client, 0)
    with pytest.raises(ValueError, match=r"policy must be one of \('fit', 'all', 'present', 'this_host'\), got 'most'"):
        get_workers(client, 2, policy="most")


def test_each_policy_gets_its_workers_or_says_what_is_short(client):
    """One function, four answers when the two-worker cluster has too few: 'present' refuses without growing (the
    cluster keeps its 2 workers), 'this_host' refuses naming this machine, and with enough both give the workers."""
    assert get_workers(client, 2, policy="present").addresses == tuple(worker_addresses(client))
    here = get_workers(client, 2, policy="this_host")
    assert here.enough and len(here.addresses) == 2 and set(here.addresses) == set(worker_addresses(client))
    with pytest.raises(ValueError, match=r"replicas=3 needs 3 worker processes running at once .* has 2; .*, or "
                                         r"use fewer replicas"):
        get_workers(client, 3, policy="present", what="replicas=3", instead="use fewer replicas")
    assert len(worker_addresses(client)) == 2  # 'present' never grows the cluster
    with pytest.raises(ValueError, match="3 ranks sharing memory need 3 workers on this machine"):
        get_workers(client, 3, policy="this_host")


@pytest.mark.timeout(240)
def test_a_handed_cluster_is_scaled_and_given_back_at_its_size():
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR)
    try:
        with start_client(cluster=cluster, quiet=True) as client:
            assert client.info.kind == "handed"
            assert capacity(client, 4) == 4
            got = get_workers(client, 2, why="two ranks")
            assert got.enough and len(worker_addresses(client)) == 2
        assert cluster.status.name == "running"  # handed in: never closed by the course
        end = time.monotonic() + 60
        while len(cluster.scheduler_info["workers"]) != 1 and time.monotonic() < end:
            time.sleep(0.2)
        assert len(cluster.scheduler_info["workers"]) == 1
    finally:
        cluster.close()


@pytest.mark.parametrize("kind", ["gateway", "local"])
def test_shared_memory_on_workers_elsewhere_says_what_the_deployment_can_do(kind, monkeypatch):
    """Hogwild's ranks share this machine's memory: workers on other hosts are refused with what to do instead;
    on a dask-gateway, which cannot promise workers on the notebook's machine, that is DSGD_GATEWAY=off."""
    from types import SimpleNamespace

    from dsgd_teach.runtime.clusters import workers as workers_module

    elsewhere = ["tcp://10.9.8.7:4001", "tcp://10.9.8.7:4002", "tcp://10.9.8.6:4003"]
    monkeypatch.setattr(workers_module, "worker_addresses", lambda client: elsewhere)
    client = SimpleNamespace(info=SimpleNamespace(kind=kind)) if kind == "gateway" else SimpleNamespace()
    with pytest.raises(ValueError, match="2 ranks sharing memory need 2 workers on this machine") as caught:
        workers_module._this_host(client, 2)
    message = str(caught.value)
    assert "10.9.8.7: 2" in message and "backend='threads'" in message
    if kind == "gateway":
        assert "DSGD_GATEWAY=off" in message and "cannot promise" in message
    else:
        assert "start 2 workers on the machine running this notebook" in message and "GATEWAY" not in message
