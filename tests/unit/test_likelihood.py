"""Forced decoding (mtkit.decoding.forced, mtkit.engines.pair_scoring): the teacher-forced pass equals incremental
decoding, padding and batching change nothing, every line pair gets its score, in input order."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import incremental_logprob, tiny_loaded, tiny_transformer

from mtkit.data.synthetic import english, german
from mtkit.decoding import forced
from mtkit.decoding.ensemble import Ensemble
from mtkit.decoding.forced import pad_pairs, token_log_probs
from mtkit.engines.pair_scoring import PairScorer
from mtkit.model import Transformer

V = 50
PAIRS = [([5, 6, 7], [8, 9]), ([10], [11, 12, 13, 14, 15, 16]), ([], []), ([20, 21, 22, 23, 24, 25, 26, 27], [30]),
         ([4, 4, 4, 4], [9, 9, 9, 9, 9, 9, 9, 9, 9, 9])]


@pytest.fixture(scope="module")
def models() -> list[Transformer]:
    """Two untrained models of positions up to 24, with peakier distributions than the default init."""
    return [tiny_transformer(V, seed=seed, sharpen=3.0, max_positions=24).eval() for seed in (0, 1)]


def scorer(models, **kwargs) -> PairScorer:
    members = models if isinstance(models, list) else [models]
    vocab = SimpleNamespace(model_bytes=lambda: (b"one vocabulary", None))
    return PairScorer([SimpleNamespace(model=m, vocab=vocab, path=Path("m.pt")) for m in members], **kwargs)


def test_teacher_forcing_equals_incremental_decoding(models):
    model = models[0]
    src, tgt_in, tgt_out = pad_pairs(PAIRS)
    with torch.inference_mode():
        found = token_log_probs(model, src, tgt_in, tgt_out)  # (B, T)
    assert found.dtype == torch.float32 and found.shape == tgt_out.shape
    assert torch.all(found[tgt_out == 0] == 0)  # padding contributes nothing
    for row, (s, t) in enumerate(PAIRS):
        assert found[row].sum().item() == pytest.approx(incremental_logprob(model, s, t), abs=1e-4)


def test_an_ensemble_scores_what_its_search_decodes(models):
    sums = scorer(models).score_ids(PAIRS)
    for (s, t), total in zip(PAIRS, sums):
        assert total == pytest.approx(incremental_logprob(Ensemble(models), s, t), abs=1e-4)
    assert scorer(models[:1]).score_ids(PAIRS) == pytest.approx(scorer(models[0]).score_ids(PAIRS), abs=1e-6)


def test_padding_and_batching_change_nothing(models, monkeypatch):
    alone = [scorer(models[0]).score_ids([pair])[0] for pair in PAIRS]
    for batch_tokens in (1, 20, 10_000):  # one pair per batch ... everything in one padded batch
        assert scorer(models[0], batch_tokens=batch_tokens).score_ids(PAIRS) == pytest.approx(alone, abs=1e-4)
    monkeypatch.setattr(forced, "CHUNK_CELLS", 3 * V)  # the log-softmax three positions at a time
    assert scorer(models[0]).score_ids(PAIRS) == pytest.approx(alone, abs=1e-4)


def test_batches_respect_the_token_budget(models):
    pairs = [([1] * n, [2] * (9 - n)) for n in range(10)]
    batches = scorer(models[0], batch_tokens=25).batches(pairs)
    assert sorted(i for b in batches for i in b) == list(range(10))
    for b in batches:
        width = max(max(len(pairs[i][0]), len(pairs[i][1])) + 1 for i in b)
        assert len(b) == 1 or width * len(b) <= 25


def test_bf16_stays_close_to_fp32(models):
    fp32 = scorer(models[0]).score_ids(PAIRS)
    bf16 = scorer(models[0], precision="bf16").score_ids(PAIRS)
    for a, b in zip(fp32, bf16):
        assert b == pytest.approx(a, abs=0.1 + 0.05 * abs(a))


@pytest.fixture(scope="module")
def loaded():
    return tiny_loaded(sharpen=None, max_positions=24)


def test_one_score_per_line_pair_in_input_order(loaded, caplog):
    caplog.set_level("INFO", logger="mtkit")  # the scorer's warnings: the mtkit logger's
    lines = [(english(n), german(n)) for n in (5, 342, 17, 999)] + [("", ""), ("   ", "")]
    long_line = " ".join(english(n) for n in range(900, 910))  # far beyond max_positions
    lines.insert(2, (english(3), long_line))
    found = list(PairScorer(loaded, batch_tokens=30).score(lines, chunk_size=3))
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("mtkit")]
    assert [s.index for s in found] == list(range(len(lines)))
    vocab = loaded.vocab
    for s, (_src, tgt) in zip(found, lines):
        assert s.tokens == len(vocab.encode_tgt(tgt)) + 1
    fitting = [(vocab.encode_src(a), vocab.encode_tgt(b)) for a, b in lines if b != long_line]
    expected = PairScorer(loaded).score_ids(fitting)
    assert [s.logprob for s in found if s.index != 2] == pytest.approx(expected, abs=1e-4)
    assert found[-1].tokens == found[-2].tokens == 1  # an empty pair scores EOS alone
    assert found[2].logprob != found[2].logprob  # nan: the model cannot hold it
    assert len(warnings) == 1 and warnings[0].startswith("warning: line 3: target has")
