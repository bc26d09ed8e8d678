"""Chapter 02 without a cluster: configs, kernels against the plain-Python oracle, the shared block, the mutex."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from dataclasses import replace

import numpy as np
import pytest

from dsgd_teach.hogwild import CountingConfig, HogwildConfig, kernels, leftover_blocks, reference
from dsgd_teach.hogwild.mutex import ROBUST
from dsgd_teach.hogwild.problem import (
    DataSpec,
    epoch_order,
    kernel_arrays,
    load_data,
    shard_rows,
    sparsity_stats,
)
from dsgd_teach.hogwild.shm import attach_block, create_block

pytestmark = pytest.mark.timeout(120)

SPARSE = DataSpec("sparse", 1500, 400, 0.02, 5)
DENSE = DataSpec("dense", 800, 12, 1.0, 5)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"workers": 0}, "workers"),
        ({"workers": -2}, "workers"),
        ({"density": 0.0}, "density"),
        ({"density": 1.5}, "density"),
        ({"density": -0.1}, "density"),
        ({"lr": 0.0}, "lr"),
        ({"epochs": 0}, "epochs"),
        ({"backend": "gpu"}, "backend"),
        ({"dataset": "digits"}, "dataset"),
        ({"lock": "yes"}, "lock"),
        ({"round_robin": 1}, "round_robin"),
        ({"round_robin": True, "lock": True}, "round_robin=True and lock=True"),
        ({"skew": -0.5}, "skew"),
        ({"skew": 3.5}, "skew"),
        ({"n_samples": 1_000_000, "density": 1.0}, "n_samples * n_features * density"),
    ],
)
def test_bad_config_names_the_field(changes: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace("*", r"\*")):
        HogwildConfig(**changes)


def test_sparsity_stats_match_a_count_over_the_rows() -> None:
    data = load_data(SPARSE)
    rows = [set(data.X.indices[data.X.indptr[i] : data.X.indptr[i + 1]]) for i in range(data.n_train)]
    busiest = max(sum(j in r for r in rows) for j in range(data.n_features))
    stats = sparsity_stats(data)
    assert stats["omega"] == max(len(r) for r in rows)
    assert stats["delta"] == busiest / data.n_train
    assert stats["mean_row_features"] == pytest.approx(sum(map(len, rows)) / data.n_train)
    assert sparsity_stats(load_data(DENSE))["delta"] == 1.0


def test_skew_sets_how_popular_the_busiest_feature_is() -> None:
    spec = HogwildConfig(n_samples=4_000, n_features=20_000, density=0.001).data_spec
    even, wordlike = (sparsity_stats(load_data(replace(spec, skew=s)))["delta"] for s in (0.0, 1.1))
    assert even < 0.01 < 0.5 < wordlike  # evenly used features vs a feature in most rows
    dense = HogwildConfig(dataset="dense", n_samples=1_000)
    assert dense.replace(skew=0.3).data_spec == dense.data_spec  # skew means nothing for dense rows


def test_counting_config_validates_too() -> None:
    with pytest.raises(ValueError, match="passes"):
        CountingConfig(passes=0)
    with pytest.raises(ValueError, match="density"):
        CountingConfig(density=2.0)


@pytest.mark.parametrize("spec", [SPARSE, DENSE], ids=["sparse", "dense"])
def test_kernel_reproduces_the_python_oracle_bit_for_bit(spec: DataSpec) -> None:
    data = load_data(spec)
    w = np.zeros(data.n_features)
    kernel = kernels.sparse_sgd if data.sparse else kernels.dense_sgd
    for epoch in range(2):
        kernel(w, *kernel_arrays(data), epoch_order(0, data.n_train, epoch, 9, 0), 0.7)
    oracle = reference.sequential_sgd(data, 0.7, epochs=2, seed=9)
    assert np.array_equal(w, oracle)
    assert kernels.mean_loss(w, data.X, data.y) < np.log(2) - 0.05  # it learned something


def test_locked_kernel_equals_lock_free_kernel_on_one_thread() -> None:
    data = load_data(SPARSE)
    order = epoch_order(0, data.n_train, 0, 1, 0)
    with create_block([("w", "f8", data.n_features)]) as block:
        free = np.zeros(data.n_features)
        kernels.sparse_sgd(free, *kernel_arrays(data), order, 0.5)
        kernels.sparse_sgd_locked(block["w"], *kernel_arrays(data), order, 0.5, np.uint64(block.mutex_address))
        assert np.array_equal(block["w"], free)


def _turn_cells(world: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(1, np.int64), np.zeros(world, np.int64), np.zeros(1, np.int64)


@pytest.mark.parametrize("spec", [SPARSE, DENSE], ids=["sparse", "dense"])
def test_round_robin_kernels_on_one_thread_equal_the_lock_free_kernels(spec: DataSpec) -> None:
    data = load_data(spec)
    order = epoch_order(0, data.n_train, 0, 1, 0)
    free, turns = np.zeros(data.n_features), np.zeros(data.n_features)
    lock_free = kernels.sparse_sgd if data.sparse else kernels.dense_sgd
    taking_turns = kernels.sparse_sgd_round_robin if data.sparse else kernels.dense_sgd_round_robin
    loss = lock_free(free, *kernel_arrays(data), order, 0.5)
    cells = _turn_cells(1)
    assert taking_turns(turns, *kernel_arrays(data), order, 0.5, cells, 0, True) == (loss, len(order))
    assert np.array_equal(turns, free)
    assert cells[1][0] == 1 and cells[0][0] == 0  # done, and the turn came back to the only rank


@pytest.mark.parametrize("world", [2, 3])
def test_threads_taking_turns_apply_the_interleaved_sequence_exactly(world: int) -> None:
    """Round-robin is deterministic: rank 0's first update, rank 1's first, ..., with uneven shards too."""
    data = load_data(SPARSE)
    shards = [epoch_order(*shard_rows(data.n_train - 1, r, world), 0, 3, r) for r in range(world)]
    w, cells, made = np.zeros(data.n_features), _turn_cells(world), {}

    def body(rank: int) -> None:
        made[rank] = kernels.sparse_sgd_round_robin(w, *kernel_arrays(data), shards[rank], 0.5, cells, rank, True)[1]

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    interleaved = [s[k] for k in range(max(map(len, shards))) for s in shards if k < len(s)]
    expected = np.zeros(data.n_features)
    kernels.sparse_sgd(expected, *kernel_arrays(data), np.array(interleaved, dtype=np.int64), 0.5)
    assert made == {r: len(s) for r, s in enumerate(shards)}
    assert len({len(s) for s in shards}) > 1  # the shards really were uneven
    assert np.array_equal(w, expected)


def test_a_rank_waiting_for_a_turn_that_never_comes_is_released_by_abort() -> None:
    data = load_data(SPARSE)
    order = epoch_order(0, 50, 0, 1, 0)
    w, cells, out = np.zeros(data.n_features), _turn_cells(2), []
    waiter = threading.Thread(
        target=lambda: out.append(kernels.sparse_sgd_round_robin(w, *kernel_arrays(data), order, 0.5, cells, 1, True))
    )
    waiter.start()  # rank 1 waits for rank 0, which never runs
    waiter.join(0.5)
    assert waiter.is_alive() and not w.any()
    cells[2][0] = 1
    waiter.join(30)
    assert not waiter.is_alive() and out == [(0.0, 0)]


def test_a_rank_that_stops_releases_the_rank_waiting_for_its_turn() -> None:
    """Rank 0 stops after its first chunk; rank 1, which never sees a stop request, must not wait for ever."""
    from dsgd_teach.hogwild.tasks import block_arrays
    from dsgd_teach.hogwild.worker import rank_loop

    config = HogwildConfig(n_samples=2_000, n_features=500, density=0.02, epochs=50, report_every=100,
                           round_robin=True)
    stats: dict[int, dict] = {}
    with create_block(block_arrays(config, config.data_spec.n_features)) as block:

        def body(rank: int) -> None:
            stop = (lambda: block["progress"][0] > 0) if rank == 0 else (lambda: False)  # not at the barrier
            stats[rank] = rank_loop(config, block, rank, 2, lambda **e: None, stop, 0.0)

        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(2)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(20)
            assert not any(t.is_alive() for t in threads), "a rank is still waiting for a turn"
        finally:
            block["abort"][0] = 1  # free a stuck rank before the block goes away
            for t in threads:
                t.join(10)
    assert stats[0]["stopped"] and stats[1]["stopped"]
    assert stats[0]["updates"] == 100 and 100 <= stats[1]["updates"] < 200


def test_shards_are_disjoint_and_orders_are_permutations() -> None:
    bounds = [shard_rows(1001, r, 3) for r in range(3)]
    assert bounds[0][0] == 0 and bounds[-1][1] == 1001
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    order = epoch_order(10, 50, 3, 0, 1)
    assert sorted(order) == list(range(10, 50))
    assert not np.array_equal(order, epoch_order(10, 50, 4, 0, 1))


def test_block_is_shared_zeroed_and_unlinked() -> None:
    before = leftover_blocks(os.getpid())
    with create_block([("w", "f8", 10), ("ready", "i8", 3)]) as block:
        name = block.spec.name
        assert name in leftover_blocks(os.getpid()) and name in leftover_blocks()
        assert not block["w"].any() and block["ready"].shape == (3,)
        with attach_block(block.spec) as other:
            other["w"][4] = 2.5
        assert block["w"][4] == 2.5
    assert name not in leftover_blocks()
    assert leftover_blocks(os.getpid()) == before


def test_block_is_unlinked_when_the_body_raises() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with create_block([("w", "f8", 10)]) as block:
            name = block.spec.name
            raise RuntimeError("boom")
    assert name not in leftover_blocks()
    with pytest.raises(RuntimeError, match="no longer exists"):
        with attach_block(block.spec):
            pass


def test_an_independent_process_attaching_neither_unlinks_nor_warns(tmp_path) -> None:  # noqa: ANN001
    """A process with its own resource tracker (like a worker of an external cluster) must leave the block be."""
    with create_block([("w", "f8", 4)]) as block:
        script = textwrap.dedent(
            f"""
            from dsgd_teach.hogwild.shm import BlockSpec, attach_block

            with attach_block(BlockSpec({block.spec.name!r}, (("w", "f8", 4),))) as block:
                block["w"][0] += 1.0
            print("ok")
            """
        )
        path = tmp_path / "attach_child.py"
        path.write_text(script)
        for _ in range(2):
            out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=90)
            assert out.returncode == 0, out.stderr
            assert "ok" in out.stdout
            assert "resource_tracker" not in out.stderr and "leaked" not in out.stderr, out.stderr
            assert block.spec.name in leftover_blocks()
        assert block["w"][0] == 2.0
    assert block.spec.name not in leftover_blocks()


def _count_in_threads(locked: bool, threads: int, passes: int) -> tuple[int, int]:
    data = load_data(DataSpec("sparse", 4000, 50, 0.2, 0))
    indptr, indices = kernel_arrays(data)[:2]
    with create_block([("counts", "i8", data.n_features)]) as block:
        mutex = np.uint64(block.mutex_address)

        def work(rank: int, counts: np.ndarray) -> None:
            start, stop = shard_rows(data.n_train, rank, threads)
            rows = np.arange(start, stop, dtype=np.int64)
            for _ in range(passes):
                if locked:
                    kernels.count_hits_locked(counts, indptr, indices, rows, mutex)
                else:
                    kernels.count_hits(counts, indptr, indices, rows)

        pool = [threading.Thread(target=work, args=(r, block["counts"])) for r in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        del pool
        landed = int(block["counts"].sum())
    return int(reference.sequential_counts(data, passes).sum()), landed


def test_locked_counter_loses_nothing_across_threads() -> None:
    intended, landed = _count_in_threads(locked=True, threads=4, passes=30)
    assert landed == intended


def test_lock_free_counter_never_gains_and_one_thread_is_exact() -> None:
    intended, landed = _count_in_threads(locked=False, threads=4, passes=30)
    assert 0 < landed <= intended
    assert _count_in_threads(locked=False, threads=1, passes=3)[1] == _count_in_threads(False, 1, 3)[0]


@pytest.mark.skipif(not ROBUST, reason="robust mutexes are a Linux feature")
@pytest.mark.timeout(90)
def test_a_lock_whose_holder_died_is_recovered_not_waited_for(tmp_path) -> None:  # noqa: ANN001
    """A worker killed while holding the lock must not hang the others (the mutex is robust)."""
    with create_block([("counts", "i8", 4)]) as block:
        script = textwrap.dedent(
            f"""
            import os
            import numpy as np
            from dsgd_teach.hogwild.mutex import acquire
            from dsgd_teach.hogwild.shm import BlockSpec, attach_block

            with attach_block(BlockSpec({block.spec.name!r}, (("counts", "i8", 4),))) as block:
                acquire(np.uint64(block.mutex_address))
                block["counts"][0] = 7
                os._exit(0)  # dies holding the lock
            """
        )
        path = tmp_path / "die_holding_lock.py"
        path.write_text(script)
        out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert block["counts"][0] == 7
        rows = np.array([0], dtype=np.int64)
        indptr, indices = np.array([0, 2], dtype=np.int32), np.array([1, 2], dtype=np.int32)
        kernels.count_hits_locked(block["counts"], indptr, indices, rows, np.uint64(block.mutex_address))
        kernels.count_hits_locked(block["counts"], indptr, indices, rows, np.uint64(block.mutex_address))
        assert list(block["counts"]) == [7, 2, 2, 0]
