"""Torch threads per worker are shared out by machine, so emulated hosts on one machine do not oversubscribe it."""

from __future__ import annotations

from dsgd_teach.runtime.clusters import worker_settings


class _FakeClient:
    """Answers client.run(_machine_cores) with fixed (machine, cores) per worker address."""

    def __init__(self, cores: dict[str, tuple[str, int]]):
        self.cores = cores

    def run(self, fn):  # noqa: ANN001, ANN201 - stands in for distributed.Client.run
        assert fn is worker_settings._machine_cores
        return self.cores


def test_workers_on_emulated_hosts_of_one_machine_share_its_cores():
    client = _FakeClient({f"tcp://10.213.7.{i}:4000{i}": ("boot-a", 8) for i in range(2, 6)})
    assert worker_settings.threads_by_host(client) == {f"10.213.7.{i}": 2 for i in range(2, 6)}


def test_separate_machines_keep_their_own_cores():
    client = _FakeClient({"tcp://10.0.0.1:1": ("boot-a", 8), "tcp://10.0.0.1:2": ("boot-a", 8),
                          "tcp://10.0.0.2:1": ("boot-b", 4)})
    assert worker_settings.threads_by_host(client) == {"10.0.0.1": 4, "10.0.0.2": 4}


def test_this_machine_is_named_by_its_boot_id():
    machine, cores = worker_settings._machine_cores()
    assert machine and cores >= 1
