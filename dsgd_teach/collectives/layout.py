"""How the hand-written allreduces cut a vector and pair ranks: ring chunks, and folding to a power of two."""

from __future__ import annotations


def chunk_sizes(k: int, n: int) -> list[int]:
    """Sizes of the n ring chunks of a length-k vector: k // n each, the first k % n one element longer."""
    return [k // n + (1 if i < k % n else 0) for i in range(n)]


def chunk_offsets(k: int, n: int) -> list[int]:
    """Start index of each chunk (len n + 1, the last entry is k)."""
    out = [0]
    for size in chunk_sizes(k, n):
        out.append(out[-1] + size)
    return out


def doubling_layout(n: int) -> tuple[int, int]:
    """(p, extra): the largest power of two p <= n, and extra = n - p ranks that fold into a partner first."""
    p = 1
    while p * 2 <= n:
        p *= 2
    return p, n - p


def folded_rank(rank: int, n: int) -> int | None:
    """This rank's index among the p ranks that take part after folding, or None if it sits out.

    Of the first 2 * extra ranks, each even one hands its vector to the odd one after it and sits out (as MPICH
    does); the odd ones and every rank from 2 * extra on take part.
    """
    _, extra = doubling_layout(n)
    if rank < 2 * extra:
        return None if rank % 2 == 0 else rank // 2
    return rank - extra


def unfolded_rank(vrank: int, n: int) -> int:
    """The real rank of the participant with index vrank (inverse of folded_rank)."""
    _, extra = doubling_layout(n)
    return vrank * 2 + 1 if vrank < extra else vrank + extra


def tree_rounds(n: int) -> int:
    """ceil(log2 n): the depth of a binomial tree over n ranks."""
    return max(0, (n - 1).bit_length())
