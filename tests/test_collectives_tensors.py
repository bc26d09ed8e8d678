"""What the hand-written allreduces accept, without a process group: flat copies, restoring shape, refusals."""

from __future__ import annotations

import pytest
import torch

from dsgd_teach.collectives.oracle import ORACLE_DTYPES, compare, input_cases
from dsgd_teach.collectives.tensors import REDUCIBLE_DTYPES, check_reducible, flat_copy, restore
from dsgd_teach.runtime.ranks.comm import Comm


@pytest.fixture
def comm() -> Comm:
    return Comm(rank=0, world=3, device=torch.device("cpu"), timeout_s=5.0)


def test_every_input_class_round_trips_through_a_flat_copy(comm: Comm) -> None:
    cases = input_cases(seed=1, rank=0, world=3)
    assert {dtype for _, dtype in cases} == {str(d).removeprefix("torch.") for d in ORACLE_DTYPES}
    assert set(ORACLE_DTYPES) <= set(REDUCIBLE_DTYPES)
    for (case, dtype), x in cases.items():
        flat = flat_copy(comm, x)
        assert flat.dim() == 1 and flat.is_contiguous(), (case, dtype)
        if x.numel():
            assert flat.data_ptr() != x.data_ptr()  # a private copy: the caller's tensor is never written
        back = restore(flat, x)
        assert back.shape == x.shape and back.dtype == x.dtype
        assert compare(back, x)[0], (case, dtype)
    assert not input_cases(1, 0, 3)[("transposed 3x4", "float32")].is_contiguous()


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint16, torch.uint32])
def test_dtypes_gloo_cannot_sum_are_named(comm: Comm, dtype: torch.dtype) -> None:
    with pytest.raises(ValueError, match=str(dtype).removeprefix("torch.")):
        check_reducible(comm, torch.ones(3, dtype=dtype), "ring_allreduce")


def test_sparse_tensors_and_non_tensors_are_refused(comm: Comm) -> None:
    with pytest.raises(ValueError, match="layout torch.sparse_coo"):
        flat_copy(comm, torch.eye(3).to_sparse())
    with pytest.raises(ValueError, match="expected a torch.Tensor, got list"):
        flat_copy(comm, [1.0, 2.0])  # type: ignore[arg-type]


def test_compare_uses_the_dtype_tolerance() -> None:
    x = torch.tensor([1.0, 2.0], dtype=torch.float16)
    assert compare(x + 0.001, x)[0] and not compare(x + 0.1, x)[0]
    assert not compare(torch.tensor([3]), torch.tensor([4]))[0]  # integers: exactly
    assert not compare(torch.ones(2, 3), torch.ones(3, 2))[0]  # shapes must match
