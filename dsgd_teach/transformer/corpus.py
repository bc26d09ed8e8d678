"""A synthetic language the package makes from a seed (no downloads), with structure a small GPT can learn.

The corpus is a stream of documents. Each starts with the marker token 0, then walks a random sparse Markov chain
(every token has `SUCCESSORS` likely next tokens, with skewed probabilities) for `n` tokens, then repeats those
`n` tokens once. A bigram model learns the walk; only attention (looking back to the first copy, an "induction"
pattern) predicts the repeat, so the loss keeps falling once the model uses its attention.

`batch_at` cuts the global batch of step t into windows of s + 1 tokens, deterministically from (seed, t), so every
rank of every strategy reads the same rows the single-process oracle reads.
"""

from __future__ import annotations

import numpy as np
import torch

from ..config import check_int, check_seed

#: Likely next tokens of each token in the Markov chain.
SUCCESSORS = 3
#: Shortest and longest walk of one document (each document is 1 + 2n tokens).
WALK_MIN, WALK_MAX = 4, 12


def make_corpus(seed: int, tokens: int, vocab: int) -> torch.Tensor:
    """A int64 tensor of `tokens` tokens in [0, vocab): documents `0, walk, walk` of a seeded Markov chain."""
    check_seed(seed)
    check_int("tokens", tokens, 2, 100_000_000)
    check_int("vocab", vocab, SUCCESSORS + 1, 65_536)
    rng = np.random.default_rng(seed)
    successors = np.stack([rng.choice(np.arange(1, vocab), SUCCESSORS, replace=False) for _ in range(vocab)])
    cumulative = np.cumsum(rng.dirichlet(np.full(SUCCESSORS, 0.5), size=vocab), axis=1)
    docs = tokens // (1 + 2 * WALK_MIN) + 1
    walks = np.empty((docs, WALK_MAX), dtype=np.int64)
    walks[:, 0] = rng.integers(1, vocab, docs)
    for i in range(1, WALK_MAX):  # all documents' walks advance one token at a time, vectorised over documents
        prev = walks[:, i - 1]
        pick = (rng.random(docs)[:, None] > cumulative[prev]).sum(axis=1).clip(max=SUCCESSORS - 1)
        walks[:, i] = successors[prev, pick]
    lengths = rng.integers(WALK_MIN, WALK_MAX + 1, docs)
    marker = np.zeros(1, dtype=np.int64)
    stream = np.concatenate([np.concatenate([marker, w[:n], w[:n]]) for w, n in zip(walks, lengths, strict=True)])
    return torch.from_numpy(stream[:tokens].copy())


def batch_at(
    corpus: torch.Tensor, step: int, rank_rows: slice | None, batch: int, seq_len: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s global batch of `batch` windows (rows `rank_rows` of it, or all): inputs, targets [rows, s]."""
    if not isinstance(corpus, torch.Tensor) or corpus.dim() != 1:
        raise ValueError("corpus must be a 1-d tensor of tokens (make_corpus's)")
    check_int("step", step, 0)
    check_int("batch", batch, 1, 1_000_000)
    check_int("seq_len", seq_len, 1, 1_000_000)
    check_seed(seed)
    if len(corpus) < seq_len + 1:
        raise ValueError(f"seq_len must be below the corpus length {len(corpus)}, got {seq_len}")
    if rank_rows is not None and not isinstance(rank_rows, slice):
        raise ValueError(f"rank_rows must be a slice of the batch's rows or None, got {rank_rows!r}")
    starts = np.random.default_rng([seed, step]).integers(0, len(corpus) - seq_len, batch)
    if rank_rows is not None:
        starts = starts[rank_rows]
        if len(starts) == 0:
            raise ValueError(f"rank_rows={rank_rows} selects no row of a batch of {batch}")
    index = torch.from_numpy(starts)[:, None] + torch.arange(seq_len + 1)
    windows = corpus[index]
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
