"""Text that must not steer or break decoding: phrases the vocabulary cannot write are never forced
(no `` ⁇ ``), an exclude phrase keeps out every word it begins however it is spelt in pieces, typed
tags and special tokens are plain text, outputs are trimmed, and lone surrogates are one-line errors."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import number_vocab, tiny_loaded

from mtkit.config import BOS_ID, EOS_ID, DecodeConfig, SpmConfig
from mtkit.data.synthetic import english
from mtkit.data.vocab import Vocab, train_model
from mtkit.decoding.constrained import constrained_beam_search
from mtkit.decoding.options import SearchOptions
from mtkit.engines.constraints import Constraints, encode_constraints, read_constraints
from mtkit.engines.torch_engine import TorchEngine
from mtkit.errors import MtkitError
from mtkit.text.glossary import Glossary
from mtkit.text.lines import clean_output


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    """German and English number words: ``▁fünf`` and ``▁fünfhundert`` are pieces; no capitals, no ``,``."""
    return number_vocab(300)


@pytest.fixture(scope="module")
def loaded(vocab):
    return tiny_loaded(vocab)


def translate(loaded, lines, wanted, **decode):
    translator = TorchEngine(loaded, DecodeConfig(**{"beam": 4, "max_len_b": 12, **decode}))
    return list(translator.translate(lines, constraints=lambda i, line: wanted[i]))


# ------------------------------------------------------------------ item 4: phrases it cannot write


@pytest.mark.parametrize("beam", [1, 4])
def test_a_phrase_the_model_cannot_write_is_never_forced_and_warned_about_once(loaded, beam, caplog):
    caplog.set_level("INFO", logger="mtkit")  # the engine's warnings: the mtkit logger's
    lines = [english(5), english(17), english(342)]
    wanted = [Constraints(include=("SIEBZIG", "hundert")), Constraints(include=("1,000", "😀")),
              Constraints(include=("SIEBZIG",))]
    found = translate(loaded, lines, wanted, beam=beam)
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("mtkit")]
    assert all("⁇" not in c.text for t in found for c in t.candidates)
    assert "hundert" in found[0].best.text  # the writable phrase is still forced
    assert found[0].unmet == ["SIEBZIG"] and found[2].unmet == ["SIEBZIG"]
    assert found[1].unmet == ["1,000", "😀"]
    assert "'S'" in found[0].unwritable["SIEBZIG"] and "','" in found[1].unwritable["1,000"]
    warned = [m for m in messages if "cannot write" in m]
    assert len(warned) == 3, messages  # once per phrase: SIEBZIG on line 1 only
    assert warned[0].startswith("warning: line 1: include phrase 'SIEBZIG': the model cannot write 'S'")
    nothing = translate(loaded, lines[:1], [Constraints(include=("\u200b",))], beam=beam)
    assert nothing[0].unmet == ["\u200b"] and "writes nothing" in nothing[0].unwritable["\u200b"]
    plain = translate(loaded, lines[1:2], [None], beam=beam)
    assert found[1].best.ids == plain[0].best.ids  # nothing writable left: searched as without constraints


@pytest.mark.parametrize("phrase", ["<2de>", "</s>", "x <unk>", "<pad>", "<s>", "a\ud800b"])
def test_reserved_pieces_and_lone_surrogates_are_refused_as_phrases(tmp_path, phrase):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"include": [phrase]}) + "\n", encoding="utf-8")
    with pytest.raises(MtkitError, match=rf"^--constraints {path}: line 1: include phrase ") as e:
        read_constraints(path)
    assert ("lone surrogate" if "\ud800" in phrase else "reserved piece") in str(e.value)
    with pytest.raises(MtkitError, match=r"^g.tsv: line 3: target term"):
        Glossary([("a", "b", "g.tsv: line 2"), ("term", phrase, "g.tsv: line 3")])
    assert Constraints.from_json({"include": ["<b>", "2 < 3 > 1"]}, "x").include == ("<b>", "2 < 3 > 1")


# ------------------------------------------------------------------ item 5: exclude keeps out the words it begins


class BigramModel:
    """The search protocol with logits that depend on the last token only: ``prefer[last]`` lists the
    next tokens best first (everything else, EOS included, far below), so a test knows what search picks."""

    def __init__(self, V: int, prefer: dict[int, list[int]]) -> None:
        self.table = torch.full((V, V), -20.0)
        self.table[:, EOS_ID] = -10.0
        for last, tokens in prefer.items():
            for rank, token in enumerate(tokens):
                self.table[last, token] = -float(rank)

    def encode(self, src):
        return src, None

    def init_cache(self, memory, src_mask, K=1):
        return self

    def reorder(self, rows):
        return self

    def select_sentences(self, keep):
        return self

    def decode_step(self, last, cache):
        return self.table[last], self


def test_an_exclude_phrase_keeps_out_every_word_it_begins_in_any_spelling(vocab):
    piece = {p: i for i, p in enumerate(vocab.tgt_pieces(range(vocab.tgt_size)))}
    words = [piece[p] for p in ("▁fünfhundert", "▁fünfhundertvier", "▁f", "▁sieben")]
    # Best first: one-piece words that begin with "fünf", then ▁f + ünf (+ hundert), then a harmless word.
    model = BigramModel(vocab.tgt_size, {BOS_ID: words, piece["▁f"]: [piece["ünf"]], piece["ünf"]: [piece["hundert"]]})
    src = torch.tensor([[5, 6, EOS_ID]])
    for phrase in ("fünf", "fünfhundert"):
        exclude = encode_constraints(Constraints(exclude=(phrase,)), vocab).exclude
        for beam in (1, 3):
            options = SearchOptions(beam=beam, nbest=1, max_len_b=4)
            (best, *_), = constrained_beam_search(model, src, [[]], [exclude], options)
            text = vocab.decode_tgt(best.tokens)
            assert not any(w.startswith(phrase) for w in text.split()), (phrase, beam, vocab.tgt_pieces(best.tokens))
            assert beam == 1 or text == "sieben"
    exclude = encode_constraints(Constraints(exclude=("sieben", "vier")), vocab).exclude
    (best, *_), = constrained_beam_search(model, src, [[]], [exclude], SearchOptions(beam=2, nbest=1, max_len_b=4))
    assert vocab.decode_tgt(best.tokens) == "fünfhundert"  # words that do not begin with them stay


def test_the_matcher_lists_the_pieces_that_complete_the_phrase(vocab):
    from mtkit.engines.constraints import PieceIndex, matcher

    piece = {p: i for i, p in enumerate(vocab.tgt_pieces(range(vocab.tgt_size)))}
    m = matcher(PieceIndex(vocab), "▁fünf")
    at_start = {i for k, i in m.bans if k == 0}
    assert {piece["▁fünf"], piece["▁fünfhundert"], piece["▁fünfzehn"]} <= at_start
    assert piece["▁four"] not in at_start and piece["fünfzig"] not in at_start  # not at a word start
    assert (1, piece["fünfzig"]) in m.bans and (0, piece["▁f"], 2) in m.steps  # after "▁"; "▁f" goes on
    assert m.start == 1  # an output's start is a word start
    two = matcher(PieceIndex(vocab), "▁sieben▁fünf")  # a phrase of two words: the last one as a prefix, after the first
    assert (len("▁sieben"), piece["▁fünfhundert"]) in two.bans and (0, piece["▁fünfhundert"]) not in two.bans


def test_excluded_words_stay_out_of_real_translations(loaded):
    lines = [english(n) for n in (5, 15, 55, 505, 515, 555, 105, 342, 999, 40)]
    plain = translate(loaded, lines, [None] * len(lines), beam=4, max_len_b=10)
    # The first four letters of each translation's longest word: the word must go, and every word so begun.
    prefixes = [max(t.best.text.split() or ["-"], key=len)[:4] for t in plain]
    wanted = [Constraints(exclude=(p,)) if len(p) == 4 else None for p in prefixes]
    for beam in (1, 4):
        found = translate(loaded, lines, wanted, beam=beam, max_len_b=10)
        for t, c in zip(found, wanted):
            for phrase in c.exclude if c else ():
                assert not any(w.startswith(phrase) for w in t.best.text.split()), (phrase, t.best.text)


# ------------------------------------------------------------------ item 10: text is not a control channel


def test_typed_tags_and_special_tokens_encode_as_plain_text():
    from mtkit.data.languages import TaggedVocab, tag_piece

    text = [f"{w} {v} <x> a/b" for w in ("one", "two", "three", "four") for v in ("eins", "zwei", "drei")]
    for kind in ("bpe", "unigram"):
        vocab = Vocab.from_bytes(train_model(text * 5, SpmConfig(vocab_size=50, model_type=kind), 1,
                                             [tag_piece("de"), tag_piece("fr")]))
        fr = TaggedVocab(vocab, "fr")
        reserved = {0, 1, 2, 3} - {1} | {vocab.src_piece_id("<2de>"), fr.tag}
        for line in ("<2fr> one eins", "one<2de>two", "one </s> eins <s>", "<pad> <unk> two"):
            for ids in (vocab.encode_src(line), vocab.encode_tgt(line), vocab.encode_src_batch([line] * 20)[0],
                        vocab.sample_batch("src", [line], 0.1)[0], fr.encode_src(line)[1:]):
                assert not reserved & set(ids), (kind, line, vocab.src_pieces(ids))
        assert fr.encode_src("one eins")[0] == fr.tag  # the tag itself still comes, by id
        for line in text:  # ordinary text encodes as the model always did
            assert vocab.encode_src(line) == vocab._src.encode(line)


# ------------------------------------------------------------------ item 11: trimmed outputs


def test_outputs_never_begin_or_end_with_whitespace(vocab):
    space = vocab.tgt_piece_id("▁")
    ids = vocab.encode_tgt("fünf sieben")
    assert vocab.decode_tgt([space, *ids, space]) == "fünf sieben"
    assert clean_output(" a b\n") == "a b" and clean_output("\u2028x ") == "x"


# ------------------------------------------------------------------ item 1: lone surrogates


def test_a_lone_surrogate_is_found_and_a_line_holding_one_is_an_error(loaded):
    from mtkit.data.vocab import first_lone_surrogate

    assert first_lone_surrogate("abc") is None and first_lone_surrogate("ab\udc80c") == 2
    assert first_lone_surrogate("a😀b") is None
    translator = TorchEngine(loaded, DecodeConfig(beam=2, max_len_b=4))
    with pytest.raises(MtkitError, match=r"^line 2: character 3 is a lone surrogate \(U\+D800\)"):
        list(translator.translate(["fine", "ab\ud800"]))


def test_scoring_a_pair_with_a_lone_surrogate_is_an_error_naming_the_line(loaded):
    from mtkit.engines.pair_scoring import PairScorer

    scorer = PairScorer(loaded)
    assert len(list(scorer.score([("fünf", "five")]))) == 1
    with pytest.raises(MtkitError, match=r"^line 2: target: character 1 is a lone surrogate"):
        list(scorer.score([("fünf", "five"), ("sechs", "\udc80six")]))
