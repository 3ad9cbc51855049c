"""The vocabulary shortlist: its builder, its file and reader, and search restricted to each sentence's ids."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import number_vocab, random_search_model, random_sources, tiny_loaded

from mtkit.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, DecodeConfig
from mtkit.decoding.ensemble import Ensemble
from mtkit.decoding.options import SearchOptions
from mtkit.decoding.search import beam_search, greedy_search, sample
from mtkit.decoding.shortlist import Shortlisted, ShortlistModel, vocabularies
from mtkit.engines.capabilities import shortlist_refusal
from mtkit.engines.factory import torch_engine
from mtkit.engines.inference import InferenceModel
from mtkit.errors import MtkitError
from mtkit.shortlist import (
    count_cooccurrence,
    read_shortlist,
    select,
    shortlist_path,
    shortlist_text,
    write_shortlist,
)

V = 40
SPECIAL = {PAD_ID, UNK_ID, BOS_ID, EOS_ID}


@pytest.fixture(scope="module")
def model() -> InferenceModel:
    return InferenceModel(random_search_model(V))


def masks(rows: int, seed: int = 0, keep: float = 0.4) -> torch.Tensor:
    """(rows, V) random allowed ids, each row with the special ids and about ``keep`` of the others."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.rand(rows, V, generator=g) < keep
    allowed[:, sorted(SPECIAL)] = True
    return allowed


def tokens(found) -> list[list[int]]:
    return [s[0].tokens for s in found]


def shortlisted(search, model, src, allowed, options, **kw):
    """``search`` over each sentence's shortlist, its hypotheses in target ids."""
    short = Shortlisted(model, allowed, options)
    found = search(short.model, src, short.options, **kw)
    return [[dataclasses.replace(h, tokens=short.ids(b, h.tokens)) for h in s] for b, s in enumerate(found)]


# ------------------------------------------------------------------- search


def test_each_sentence_has_its_vocabulary_with_the_special_ids_and_the_start_first():
    allowed = torch.zeros(2, V, dtype=torch.bool)
    allowed[0, [7, 30, 9]] = True
    allowed[1, [12]] = True
    vocab = vocabularies(allowed, (0, 1, 2, 3, 33))
    assert vocab.tolist() == [[0, 1, 2, 3, 33, 7, 9, 30], [0, 1, 2, 3, 33, 12, -1, -1]]


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_everything_allowed_is_full_search(model, search):
    src = random_sources(V)
    allowed = torch.ones(src.size(0), V, dtype=torch.bool)
    options = SearchOptions(max_len_b=8) if search == "greedy" else SearchOptions(beam=4, nbest=2, max_len_b=8)
    run = greedy_search if search == "greedy" else beam_search
    full, short = run(model, src, options), shortlisted(run, model, src, allowed, options)
    assert [[h.tokens for h in s] for s in full] == [[h.tokens for h in s] for s in short]
    for a, b in zip(full, short):
        assert [h.logprob for h in a] == pytest.approx([h.logprob for h in b], abs=1e-4)


@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_outputs_hold_only_allowed_ids(model, search):
    src = random_sources(V)
    allowed = masks(src.size(0))
    if search == "greedy":
        found = shortlisted(greedy_search, model, src, allowed, SearchOptions(max_len_b=8))
    elif search == "beam":
        found = shortlisted(beam_search, model, src, allowed, SearchOptions(beam=5, nbest=5, max_len_b=8))
    else:
        found = shortlisted(sample, model, src, allowed, SearchOptions(max_len_b=8),
                            generator=torch.Generator().manual_seed(1))
    full = tokens(greedy_search(model, src, SearchOptions(max_len_b=8)))
    assert any(not allowed[b, full[b]].all() for b in range(len(full)))  # the full search strays: a real test
    for b, sentence in enumerate(found):
        for h in sentence:
            assert allowed[b, h.tokens].all(), (b, h.tokens)


def test_a_forced_start_and_prefix_keep_their_ids():
    """The call's start and prefix are fed as the model's ids: alike with everything allowed and in full search."""
    model = InferenceModel(random_search_model(V))
    src = random_sources(V)
    options = SearchOptions(beam=3, max_len_b=8, start=17, prefix=(23, 5))
    allowed = torch.ones(src.size(0), V, dtype=torch.bool)
    assert tokens(shortlisted(beam_search, model, src, allowed, options)) == tokens(beam_search(model, src, options))


@pytest.mark.parametrize("group", [1, 2, 32])
@pytest.mark.parametrize("beam", [1, 4])
def test_a_sentence_translates_alike_alone_and_in_any_batch(model, beam, group, monkeypatch):
    """Per sentence, never per batch: the others' shortlists widen the union the logits are computed for (their
    group's: ``GROUP`` sentences at a time, groups shrinking as sentences finish), never the distribution a
    sentence's rows are normalized over."""
    import mtkit.decoding.shortlist as shortlist

    monkeypatch.setattr(shortlist, "GROUP", group)
    src = random_sources(V)
    assert src.size(0) > 2 * group or group == 32  # several groups, some losing sentences as they finish
    allowed = masks(src.size(0), seed=3, keep=0.3)
    options = SearchOptions(beam=beam, max_len_b=8)
    search = greedy_search if beam == 1 else beam_search
    batch = shortlisted(search, model, src, allowed, options)
    for b in range(src.size(0)):
        row = src[b: b + 1]
        row = row[:, : int((row != PAD_ID).sum())]
        alone = shortlisted(search, model, row, allowed[b: b + 1], options)
        assert not torch.equal(allowed[b], allowed.any(dim=0))  # the batch's union is larger than its own
        assert alone[0][0].tokens == batch[b][0].tokens
        assert alone[0][0].logprob == pytest.approx(batch[b][0].logprob, abs=1e-4)


def test_an_ensemble_is_restricted_member_by_member(model):
    src = random_sources(V)
    allowed = masks(src.size(0), seed=5)
    other = InferenceModel(random_search_model(V))
    restricted = Shortlisted(Ensemble([model, other]), allowed, SearchOptions())
    assert isinstance(restricted.model, Ensemble)
    assert all(isinstance(m, ShortlistModel) for m in restricted.model.models)
    found = shortlisted(beam_search, Ensemble([model, other]), src, allowed, SearchOptions(beam=3, max_len_b=8))
    for b, sentence in enumerate(found):
        assert allowed[b, sentence[0].tokens].all()
    everything = torch.ones(src.size(0), V, dtype=torch.bool)
    assert tokens(shortlisted(beam_search, Ensemble([model, other]), src, everything,
                              SearchOptions(beam=3, max_len_b=8))) == tokens(
        beam_search(Ensemble([model, other]), src, SearchOptions(beam=3, max_len_b=8)))


# ------------------------------------------------------------------ building


def test_the_builder_keeps_what_cooccurs_most_after_the_frequent_pieces():
    # Source pieces 10, 11, 12; target pieces 20..24. By hand: 24 is in every target (frequent); given 10 the
    # others co-occur 20: 3, 21: 1, 22: 1, 23: 1; given 11, 20: 2, 21: 2, 23: 1; given 12 (one pair), 22: 1, 24: 1.
    pairs = [([10, 11], [20, 21, 24]), ([10], [20, 22, 24, 24]), ([10, 11, 11], [20, 21, 23, 24]),
             ([12], [22, 24, EOS_ID]), ([UNK_ID], [24])]
    counts = count_cooccurrence(pairs, src_size=13, tgt_size=25)
    assert counts.pairs == 5
    assert counts.source_pairs[[10, 11, 12]].tolist() == [3, 2, 1]
    assert counts.target_tokens[24] == 6 and counts.target_tokens[EOS_ID] == 0
    shortlist = select(counts, per_source=2, frequent=1)
    assert shortlist.always.tolist() == [24]
    assert shortlist.candidates(10).tolist() == [20, 21]  # 20 (3 pairs), then 21 and 22 tie at 1: the lower id
    assert shortlist.candidates(11).tolist() == [20, 21]  # 23 (1 pair) left out
    assert shortlist.candidates(12).tolist() == [22]
    assert shortlist.candidates(UNK_ID).tolist() == []  # specials are never counted
    # A sentence's ids: the always-candidates, its pieces' candidates, its own pieces, the specials, the call's.
    assert set(shortlist.allowed([12, 5], extra=[7])) == {24, 22, 12, 5, 7} | SPECIAL
    wide = select(counts, per_source=10, frequent=0)
    assert wide.candidates(10).tolist() == [20, 24, 21, 22, 23]  # by co-occurrence: 24 in all three pairs of 10


def test_a_shortlist_file_reads_back_as_written(tmp_path):
    vocab = number_vocab()
    g = np.random.default_rng(0)
    pairs = [(g.integers(4, vocab.src_size, 6).tolist(), g.integers(4, vocab.tgt_size, 7).tolist())
             for _ in range(200)]
    shortlist = select(count_cooccurrence(pairs, vocab.src_size, vocab.tgt_size), per_source=5, frequent=8)
    path = tmp_path / "run" / "shortlist.txt"
    write_shortlist(path, shortlist, vocab)
    text = path.read_text(encoding="utf-8")
    assert text.startswith("\t") and text == shortlist_text(shortlist, vocab)
    back = read_shortlist(path, vocab)
    assert back.always.tolist() == shortlist.always.tolist()
    assert back.offsets.tolist() == shortlist.offsets.tolist() and back.targets.tolist() == shortlist.targets.tolist()
    assert list(tmp_path.joinpath("run").iterdir()) == [path]  # no temporary left
    assert shortlist_path(tmp_path / "run") == path
    assert shortlist_path(tmp_path / "run" / "checkpoints" / "best.pt") == path


@pytest.mark.parametrize(("text", "line", "problem"), [
    ("\t▁one\n▁two\t▁three ▁four\n▁two\t▁one\n", 3, "has a line already"),
    ("\t▁one\n\t▁two\n", 2, "a second line of always-candidates"),
    ("\t▁one\n▁two ▁three\n", 2, "one tab"),
    ("\t▁one\n▁two\t▁three\tx\n", 2, "one tab"),
    ("\t▁one\nnot-a-piece\t▁one\n", 2, "no source piece"),
    ("\t▁one\n▁two\t▁one zzzz\n", 2, "no target piece"),
    ("\t▁one\n▁two\t\xff\n", 2, "not UTF-8"),
])
def test_the_reader_refuses_a_bad_line_in_one_line(tmp_path, text, line, problem):
    vocab = number_vocab()
    path = tmp_path / "shortlist.txt"
    path.write_bytes(text.encode("utf-8").replace("\xff".encode(), b"\xff"))
    with pytest.raises(MtkitError) as e:
        read_shortlist(path, vocab)
    assert str(e.value).startswith(f"{path}:{line}: ") and problem in str(e.value)
    assert "\n" not in str(e.value)


def test_the_reader_refuses_what_is_no_shortlist_file(tmp_path, monkeypatch):
    vocab = number_vocab()
    with pytest.raises(MtkitError, match="no such file"):
        read_shortlist(tmp_path / "missing.txt", vocab)
    with pytest.raises(MtkitError, match="is a directory"):
        read_shortlist(tmp_path, vocab)
    big = tmp_path / "big.txt"
    big.write_text("\t▁one\n" * 50)
    monkeypatch.setattr("mtkit.shortlist.MAX_SHORTLIST_BYTES", 100)
    with pytest.raises(MtkitError, match="larger than a shortlist can be"):
        read_shortlist(big, vocab)


# ------------------------------------------------------------------ the engine


def test_the_torch_engine_translates_each_line_within_its_shortlist(loaded):
    vocab = loaded.vocab
    lines = ["one hundred two", "seven", "nine hundred ninety nine", "forty"]
    srcs = vocab.encode_src_batch(lines)
    pairs = [(s, vocab.encode_tgt(t)) for s, t in zip(srcs, ["hundert zwei", "sieben", "neunhundert", "vierzig"])]
    shortlist = select(count_cooccurrence(pairs, vocab.src_size, vocab.tgt_size), per_source=3, frequent=2)
    decode = DecodeConfig(beam=3, max_len_b=6, guard=False, split="none")
    engine = torch_engine([loaded], decode, shortlist=shortlist)
    short = list(engine.translate(lines, options=DecodeConfig(**{**decode.__dict__, "shortlist": True})))
    full = list(engine.translate(lines))
    for t in short:
        assert set(t.best.ids) <= set(shortlist.allowed(t.src_ids))
    assert any(not set(t.best.ids) <= set(shortlist.allowed(t.src_ids)) for t in full)  # the full search strays
    with pytest.raises(MtkitError, match="mtkit shortlist RUN"):
        torch_engine([loaded], DecodeConfig(shortlist=True))


@pytest.fixture(scope="module")
def loaded():
    return tiny_loaded()


def test_the_engines_without_a_shortlist_refuse_it_in_one_line():
    assert shortlist_refusal("torch") is None and shortlist_refusal("ctranslate2") is None
    assert shortlist_refusal("onnx") == ("--shortlist needs --engine torch or ctranslate2: ONNX has no vocabulary "
                                         "shortlist")
