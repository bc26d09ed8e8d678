"""The chapter's GPT and corpus: validated shapes, deterministic weights and batches, causal attention, it learns."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from dsgd_teach.transformer.corpus import batch_at, make_corpus
from dsgd_teach.transformer.experiment import FULL_SHAPE, SMOKE_SHAPE, chapter_shape
from dsgd_teach.transformer.model import (
    GPTShape,
    build_gpt,
    causal_attention,
    count_params,
    lm_loss,
)

TINY = GPTShape(vocab=32, seq_len=16, width=32, heads=4, layers=2)


@pytest.mark.parametrize(
    ("field", "value"),
    [("vocab", 1), ("seq_len", 0), ("width", 0), ("heads", 0), ("heads", 5), ("layers", 0), ("mlp_ratio", 0),
     ("experts", -1), ("top_k", 2), ("capacity_factor", 0.0), ("vocab", 2.5), ("layers", True)],
)
def test_a_bad_shape_names_its_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        GPTShape(**{field: value})


def test_bad_corpus_and_batch_arguments_name_their_field() -> None:
    with pytest.raises(ValueError, match="tokens"):
        make_corpus(0, 1, 32)
    with pytest.raises(ValueError, match="vocab"):
        make_corpus(0, 100, 3)
    corpus = make_corpus(0, 100, 32)
    for kwargs, field in [({"step": -1}, "step"), ({"batch": 0}, "batch"), ({"seq_len": 100}, "seq_len"),
                          ({"rank_rows": slice(8, 9)}, "rank_rows"), ({"rank_rows": [0]}, "rank_rows")]:
        args = {"step": 0, "rank_rows": None, "batch": 4, "seq_len": 8, "seed": 0, **kwargs}
        with pytest.raises(ValueError, match=field):
            batch_at(corpus, **args)


def test_the_chapter_runs_the_advertised_sizes(monkeypatch) -> None:
    """A few hundred thousand parameters in smoke mode, a few million in full mode (what the issue asks; Binder's
    memory test holds the full chapter to 2 GiB): the shapes the chapter runs, not another pair."""
    monkeypatch.setenv("DSGD_SMOKE", "1")
    assert chapter_shape() == SMOKE_SHAPE and 200_000 <= count_params(build_gpt(SMOKE_SHAPE, 0)) < 1_000_000
    monkeypatch.setenv("DSGD_SMOKE", "0")
    assert chapter_shape() == FULL_SHAPE and 2_000_000 <= count_params(build_gpt(FULL_SHAPE, 0)) < 10_000_000


def test_same_seed_same_weights_in_another_process_and_torch_rng_untouched() -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    model = build_gpt(TINY, 7)
    assert torch.equal(torch.rand(1), before)  # build_gpt forks the RNG
    here = sum(float(p.detach().double().sum()) for p in model.parameters())
    code = ("from dsgd_teach.transformer.model import GPTShape, build_gpt;"
            "m = build_gpt(GPTShape(vocab=32, seq_len=16, width=32, heads=4, layers=2), 7);"
            "print(repr(sum(float(p.double().sum()) for p in m.parameters())))")
    there = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                 timeout=120).stdout)
    assert here == there
    other = build_gpt(TINY, 8)
    assert not torch.equal(model.head.weight, other.head.weight)


def test_threads_building_at_once_get_the_same_weights() -> None:
    """Ranks that are threads of one process (runtime/ranks/thread_group.py) build their models at the same time."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    start = threading.Barrier(4)

    def build(_: int) -> torch.nn.Module:
        start.wait(timeout=60)
        return build_gpt(SMOKE_SHAPE, 5)

    with ThreadPoolExecutor(4) as pool:
        models = list(pool.map(build, range(4)))
    for model in models[1:]:
        for a, b in zip(models[0].parameters(), model.parameters(), strict=True):
            assert torch.equal(a, b)


def test_corpus_and_batches_are_deterministic_and_rank_rows_cut_the_global_batch() -> None:
    corpus = make_corpus(3, 5000, 32)
    assert torch.equal(corpus, make_corpus(3, 5000, 32)) and not torch.equal(corpus, make_corpus(4, 5000, 32))
    assert corpus.dtype == torch.int64 and len(corpus) == 5000 and 0 <= int(corpus.min()) <= int(corpus.max()) < 32
    x, y = batch_at(corpus, 5, None, 8, 16, 0)
    assert x.shape == y.shape == (8, 16) and torch.equal(x[:, 1:], y[:, :-1])
    x_half, y_half = batch_at(corpus, 5, slice(4, 8), 8, 16, 0)
    assert torch.equal(x_half, x[4:]) and torch.equal(y_half, y[4:])
    assert not torch.equal(batch_at(corpus, 6, None, 8, 16, 0)[0], x)


def test_attention_is_causal_a_later_token_never_changes_earlier_logits() -> None:
    model = build_gpt(TINY, 0)
    tokens = make_corpus(0, 1000, TINY.vocab)[: TINY.seq_len][None]
    changed = tokens.clone()
    changed[0, 9] = (changed[0, 9] + 1) % TINY.vocab
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.equal(a[0, :9], b[0, :9])
    assert not torch.allclose(a[0, 9:], b[0, 9:])


def test_causal_attention_equals_torchs_scaled_dot_product_attention() -> None:
    q, k, v = torch.randn(3, 2, 4, 10, 8, generator=torch.Generator().manual_seed(0)).unbind(0)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(causal_attention(q, k, v), expected)


def test_loss_falls_in_a_few_steps() -> None:
    model = build_gpt(TINY, 0)
    corpus = make_corpus(0, 20_000, TINY.vocab)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for step in range(30):
        x, y = batch_at(corpus, step, None, 16, TINY.seq_len, 0)
        loss = lm_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[0] == pytest.approx(torch.log(torch.tensor(32.0)).item(), abs=0.1)  # uniform at the start
    assert sum(losses[-5:]) / 5 < 0.7 * losses[0]
