"""What the hand-written allreduces accept: any shape or strides, and exactly the dtypes gloo can sum.

Every algorithm works on a private contiguous 1-D copy (flat_copy) and gives the caller back a tensor of the
input's shape and dtype (restore). A tensor gloo cannot reduce is refused with a ValueError before any message
is sent, so a bad input is an error on the caller's rank, never a worker abort or a timeout on its peers.
"""

from __future__ import annotations

import torch

from ..runtime.ranks.comm import Comm

#: dtypes that torch.distributed.all_reduce(SUM) accepts on gloo (checked against torch 2.x; int16 and the
#: unsigned types wider than 8 bits are refused there with "Invalid scalar type").
REDUCIBLE_DTYPES: tuple[torch.dtype, ...] = (
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.int8, torch.uint8, torch.int32, torch.int64,
    torch.bool, torch.complex64, torch.complex128,
)


def check_reducible(comm: Comm, x: object, who: str = "allreduce") -> None:
    """Raise ValueError naming the problem if x is not a dense tensor of a reducible dtype on this rank's device."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{who}: expected a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided:
        raise ValueError(f"{who}: cannot reduce a tensor with layout {x.layout}; convert it with .to_dense()")
    if x.dtype not in REDUCIBLE_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in REDUCIBLE_DTYPES)
        raise ValueError(f"{who}: dtype {x.dtype} cannot be summed by the gloo backend; supported dtypes: {names}")
    if x.device.type != comm.device.type:
        raise ValueError(f"{who}: tensor is on {x.device}, but this rank communicates on {comm.device}")


def flat_copy(comm: Comm, x: torch.Tensor, who: str = "allreduce") -> torch.Tensor:
    """A contiguous 1-D copy of x that the algorithm may overwrite (complex numbers as pairs of reals)."""
    check_reducible(comm, x, who)
    x = x.detach()
    if x.is_complex():
        x = torch.view_as_real(x.resolve_conj())
    return x.reshape(-1).clone(memory_format=torch.contiguous_format)


def restore(flat: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The summed flat copy in the shape and dtype of the caller's tensor `like` (always a fresh tensor)."""
    if like.is_complex():
        return torch.view_as_complex(flat.view(-1, 2)).view(like.shape)
    return flat.view(like.shape)
