"""The oracle: every hand-written allreduce equals torch.distributed.all_reduce on every input class, N = 2, 3, 4.

One process group per world size runs all algorithms on all input classes (shapes, strides, dtypes), so the whole
check takes a few seconds per N; refused dtypes must be a ValueError raised before any message.
"""

from __future__ import annotations

import pytest
from distributed import Client

from dsgd_teach.collectives import HAND_WRITTEN
from dsgd_teach.collectives.oracle import ORACLE_DTYPES, REFUSED_DTYPES, run_oracle


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_allreduce_matches_the_library_on_every_input(cluster4: Client, world: int) -> None:
    table = run_oracle(cluster4, world, HAND_WRITTEN, seed=world)
    compared = table[table.case != "refused dtype"]
    assert set(compared.algorithm) == set(HAND_WRITTEN)
    assert len(compared) == len(HAND_WRITTEN) * 8 * len(ORACLE_DTYPES) * world
    refused = table[table.case == "refused dtype"]
    assert len(refused) == (len(HAND_WRITTEN) + 1) * len(REFUSED_DTYPES) * world
    bad = table[~table.ok]
    assert bad.empty, bad[["algorithm", "case", "dtype", "rank", "problem"]].drop_duplicates().to_string()
