"""A stage that fails with a vote on stopping in flight leaves its process group promptly (pipeline/engine.py).

The default group of a pipeline is joined with a long timeout (a rank's task may start late on a busy machine); a
collective still in flight on it when a stage fails held `destroy_process_group` up for that long (30 s: seen when
a test froze a neighbouring stage on a loaded machine). The votes now travel on a group with the training timeout.
"""

from __future__ import annotations

import datetime
import multiprocessing
import queue

import torch
import torch.distributed as dist

from dsgd_teach.runtime.ranks.group import host_store

JOIN_TIMEOUT_S = 600.0  # the default group's: far longer than the test waits
TRAINING_TIMEOUT_S = 1.0
LEAVE_WITHIN_S = 60.0  # generous: the group is left after about TRAINING_TIMEOUT_S


def _rank(rank: int, port: int, report: multiprocessing.Queue, done: multiprocessing.Event) -> None:
    from dsgd_teach.pipeline.engine import own_group
    from dsgd_teach.pipeline.rank_support import StopVote
    from dsgd_teach.runtime.ranks.comm import Comm
    from dsgd_teach.runtime.ranks.group import join_store

    dist.init_process_group("gloo", store=join_store("127.0.0.1", port, 2), rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S))
    vote = StopVote(Comm(rank, 2, torch.device("cpu"), TRAINING_TIMEOUT_S), TRAINING_TIMEOUT_S,
                    own_group(TRAINING_TIMEOUT_S))
    if rank == 1:  # a stage that stalls: it never casts its vote, and stays alive until the test ends
        done.wait(LEAVE_WITHIN_S + 30)
        return
    vote.cast(False)  # posted, never answered
    try:
        vote.close()
    except TimeoutError:
        report.put("vote timed out")
    dist.destroy_process_group()  # what process_group() does when a rank's loop raised
    report.put("left")


def test_a_stage_failing_with_a_vote_in_flight_leaves_its_group_within_the_training_timeout() -> None:
    ctx = multiprocessing.get_context("spawn")
    report, done = ctx.Queue(), ctx.Event()
    store = host_store(2)  # listening before the ranks start: no other test's group can take its port
    port = store.port
    ranks = [ctx.Process(target=_rank, args=(r, port, report, done), daemon=True) for r in range(2)]
    for p in ranks:
        p.start()
    try:
        said = [report.get(timeout=120)]  # the vote's own wait fails first (rank 0's imports and join included)
        try:
            said.append(report.get(timeout=LEAVE_WITHIN_S))
        except queue.Empty:
            pass
        assert said == ["vote timed out", "left"], f"rank 0 did not leave its group within {LEAVE_WITHIN_S:.0f} s"
    finally:
        done.set()
        for p in ranks:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
