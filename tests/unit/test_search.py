"""Search invariants: beam 1 = greedy, beam beats greedy where it should, scores are what they claim."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from conftest import random_search_model, random_sources

from mtkit.config import BOS_ID, EOS_ID, PAD_ID, ModelConfig
from mtkit.decoding.ensemble import Ensemble
from mtkit.decoding.options import SearchOptions
from mtkit.decoding.penalties import length_penalty
from mtkit.decoding.search import beam_search, greedy_search, sample
from mtkit.model import Transformer

V = 40


@pytest.fixture(scope="module")
def model() -> Transformer:
    return random_search_model(V)


@pytest.fixture(scope="module")
def src() -> torch.Tensor:
    return random_sources(V)


def teacher_forced_logprob(model, src_row: torch.Tensor, tokens: list[int]) -> float:
    """log P(tokens + EOS | src) by one full (uncached) forward pass."""
    src_row = src_row[src_row != PAD_ID].unsqueeze(0)
    tgt = torch.tensor([[BOS_ID, *tokens]])
    with torch.no_grad():
        lprobs = torch.log_softmax(model(src_row, tgt).float(), dim=-1)[0]  # (T, V)
    targets = [*tokens, EOS_ID]
    return float(sum(lprobs[t, y] for t, y in enumerate(targets)))


def test_length_penalty_formula():
    assert length_penalty(10, 0.6) == pytest.approx(((5 + 10) / 6) ** 0.6)
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(7, 0.0) == 1.0
    # fairseq's --lenpen / Marian's --normalize: the score is logprob / L^alpha.
    assert length_penalty(10, 1.0, "power") == pytest.approx(10.0)
    assert length_penalty(10, 0.6, "power") == pytest.approx(10**0.6)
    with pytest.raises(ValueError, match="unknown length penalty"):
        length_penalty(3, 1.0, "linear")


@pytest.mark.parametrize("alpha", [0.6, 1.0])
def test_power_penalty_scores_and_ranks_by_logprob_per_length(model, src, alpha):
    hyps = beam_search(model, src, SearchOptions(beam=5, alpha=alpha, max_len_a=1.0, max_len_b=6, nbest=5,
                                                 length_penalty="power"))
    for sentence in hyps:
        for h in sentence:
            assert h.score == pytest.approx(h.logprob / (len(h.tokens) + 1) ** alpha)
        assert [h.score for h in sentence] == sorted((h.score for h in sentence), reverse=True)
    for sentence in greedy_search(model, src, SearchOptions(max_len_a=1.0, max_len_b=6, alpha=alpha,
                                                            length_penalty="power")):
        assert sentence[0].score == pytest.approx(sentence[0].logprob / (len(sentence[0].tokens) + 1) ** alpha)
    # Among the same finished hypotheses, normalizing by length never prefers a shorter one.
    plain = beam_search(model, src, SearchOptions(beam=5, alpha=0.0, max_len_a=1.0, max_len_b=6, nbest=5))
    for sentence in plain:
        most_probable = max(sentence, key=lambda h: h.logprob)
        per_token = max(sentence, key=lambda h: h.logprob / (len(h.tokens) + 1) ** alpha)
        assert len(per_token.tokens) >= len(most_probable.tokens)


def test_beam_size_one_equals_greedy(model, src):
    for kwargs in (dict(), dict(no_repeat_ngram_size=2), dict(min_len=4)):
        greedy = greedy_search(model, src, SearchOptions(max_len_a=1.0, max_len_b=5, alpha=0.6, **kwargs))
        beam = beam_search(model, src, SearchOptions(beam=1, alpha=0.6, max_len_a=1.0, max_len_b=5, **kwargs))
        for g, b in zip(greedy, beam):
            assert g[0].tokens == b[0].tokens
            assert g[0].score == b[0].score


def test_scores_are_normalized_model_logprobs(model, src):
    hyps = beam_search(model, src, SearchOptions(beam=4, alpha=0.6, max_len_a=1.0, max_len_b=4, nbest=3))
    for i, sentence in enumerate(hyps):
        for h in sentence:
            assert h.logprob == pytest.approx(teacher_forced_logprob(model, src[i], h.tokens), abs=1e-4)
            assert h.score == pytest.approx(h.logprob / length_penalty(len(h.tokens) + 1, 0.6))


def test_nbest_distinct_and_sorted(model, src):
    hyps = beam_search(model, src, SearchOptions(beam=5, alpha=0.6, max_len_a=1.0, max_len_b=4, nbest=5))
    for sentence in hyps:
        assert len(sentence) == 5
        assert len({tuple(h.tokens) for h in sentence}) == 5
        scores = [h.score for h in sentence]
        assert scores == sorted(scores, reverse=True)


def test_max_length_and_min_length(model, src):
    for h, _row in zip(greedy_search(model, src, SearchOptions(max_len_a=0.0, max_len_b=3, min_len=3)), src):
        assert len(h[0].tokens) == 3
    lengths = (src != PAD_ID).sum(1).tolist()
    found = beam_search(model, src, SearchOptions(beam=3, max_len_a=0.5, max_len_b=2, nbest=3))
    for sentence, n in zip(found, lengths):
        assert all(len(h.tokens) <= int(0.5 * n + 2) for h in sentence)


def test_no_repeat_ngram(model, src):
    options = SearchOptions(beam=3, max_len_a=2.0, max_len_b=5, nbest=3, no_repeat_ngram_size=2)
    for sentence in beam_search(model, src, options):
        for h in sentence:
            bigrams = list(zip(h.tokens, h.tokens[1:]))
            assert len(bigrams) == len(set(bigrams))


def test_ensemble_of_one_model_twice_equals_the_model(model, src):
    single = beam_search(model, src, SearchOptions(beam=3, max_len_b=4))
    double = beam_search(Ensemble([model, model]), src, SearchOptions(beam=3, max_len_b=4))
    assert [s[0].tokens for s in single] == [s[0].tokens for s in double]


def test_sampling_seeded_and_top_k_one_is_greedy(model, src):
    a = sample(model, src, SearchOptions(max_len_b=5), generator=torch.Generator().manual_seed(3))
    b = sample(model, src, SearchOptions(max_len_b=5), generator=torch.Generator().manual_seed(3))
    assert [x[0].tokens for x in a] == [x[0].tokens for x in b]
    top1 = sample(model, src, SearchOptions(top_k=1, max_len_b=5), generator=torch.Generator().manual_seed(3))
    assert [x[0].tokens for x in top1] == [x[0].tokens for x in greedy_search(model, src, SearchOptions(max_len_b=5))]
    nucleus = sample(model, src, SearchOptions(top_p=1e-6, max_len_b=5), generator=torch.Generator().manual_seed(4))
    assert [x[0].tokens for x in nucleus] == [x[0].tokens for x in top1]


# A model whose next-token distribution is a hand-set table over the last token.
A, B = 4, 5
TABLE = {  # last token -> {next token: probability}
    BOS_ID: {A: 0.6, B: 0.4},
    A: {A: 0.5, EOS_ID: 0.3, B: 0.2},
    B: {EOS_ID: 0.95, A: 0.05},
}


@dataclass
class TableCache:
    beam: int
    step: int = 0

    def reorder(self, indices):
        return self

    def select_sentences(self, sentences):
        return self


class TableModel:
    """encode / init_cache / decode_step over TABLE; the cache holds nothing but the step."""

    def encode(self, src):
        return src, (src != PAD_ID)[:, None, None, :]

    def init_cache(self, memory, src_mask, beam=1):
        return TableCache(beam)

    def decode_step(self, tokens, cache):
        logits = torch.full((tokens.size(0), 6), -math.inf)
        for row, last in enumerate(tokens.tolist()):
            for tok, p in TABLE[last].items():
                logits[row, tok] = math.log(p)
        return logits, TableCache(cache.beam, cache.step + 1)


def test_beam_finds_what_greedy_misses():
    src = torch.tensor([[7, EOS_ID], [8, EOS_ID]])
    greedy = greedy_search(TableModel(), src, SearchOptions(max_len_a=0.0, max_len_b=3, alpha=0.0))
    beam = beam_search(TableModel(), src, SearchOptions(beam=2, alpha=0.0, max_len_a=0.0, max_len_b=3))
    assert greedy[0][0].tokens == [A, A, A]  # 0.6 * 0.5 * 0.5 * 0.3 (EOS at max length)
    assert greedy[0][0].logprob == pytest.approx(math.log(0.6 * 0.5 * 0.5 * 0.3))
    assert beam[0][0].tokens == [B]  # 0.4 * 0.95 = 0.38 beats everything
    assert beam[0][0].score == pytest.approx(math.log(0.38))
    assert beam[1][0].tokens == [B]


def test_beam_search_fast_top_k_equals_plain_top_k():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, h=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0, max_positions=64)
    big = Transformer(cfg, 640, 640).eval()  # V = 640: chunks of 160, so the fast path runs
    with torch.no_grad():
        big.output_projection.weight.mul_(3.0)
    src = torch.randint(4, 640, (5, 8), generator=torch.Generator().manual_seed(2))
    src[:, -1] = EOS_ID
    src[1, 4:] = PAD_ID
    src[1, 3] = EOS_ID
    fast = beam_search(big, src, SearchOptions(beam=4, max_len_a=1.0, max_len_b=4, nbest=4), kernels="auto")
    plain = beam_search(big, src, SearchOptions(beam=4, max_len_a=1.0, max_len_b=4, nbest=4), kernels="reference")
    assert [[(h.tokens, h.score) for h in s] for s in fast] == [[(h.tokens, h.score) for h in s] for s in plain]


def test_search_options_come_from_the_decode_config_with_overrides():
    """SearchOptions.from_decode copies every search field of DecodeConfig (none dropped on the way) and
    takes the engine's per-call fields on top."""
    import dataclasses

    from mtkit.config import DecodeConfig

    decode = DecodeConfig(beam=6, nbest=2, alpha=1.0, length_penalty="power", max_len_a=1.5, max_len_b=7, min_len=2,
                          forced_eos="zero", no_repeat_ngram_size=3, sampling=True, temperature=0.5, top_k=4,
                          top_p=0.9, epsilon=0.02)
    options = SearchOptions.from_decode(decode, max_len_limit=30, start=9)
    batching = {"batch_tokens", "max_input_len", "mbr", "mbr_candidates", "mbr_comet_model",  # the engine's
                "alignments", "alignment_layer", "alignment_threshold", "shortlist",
                "split", "guard"}  # (and the line pipeline's)
    for f in dataclasses.fields(DecodeConfig):
        if f.name not in batching:
            assert getattr(options, f.name) == getattr(decode, f.name), f.name
    assert (options.max_len_limit, options.min_len, options.start) == (30, 2, 9)
    assert SearchOptions.from_decode(DecodeConfig()) == SearchOptions()  # the same defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.beam = 1  # type: ignore[misc]
