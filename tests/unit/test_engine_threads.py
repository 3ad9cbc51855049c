"""One engine used by several threads at once gives exactly what each call gives alone: engines take
their options per call and are never changed after construction; the piece index they share (exclude
phrases) is a bounded memo behind a lock. An untrained tiny multilingual model is enough: whatever its
weights, a concurrent call must equal the serial one (text and score)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from mtkit.config import Config, DecodeConfig, ModelConfig, SpmConfig
from mtkit.data.languages import Pair
from mtkit.data.synthetic import english
from mtkit.data.vocab import Vocab, train_model
from mtkit.engines import constraints as constraints_module
from mtkit.engines.constraints import Constraints, PieceIndex, encode_constraints
from mtkit.engines.engine import Stopped
from mtkit.engines.torch_engine import TorchEngine
from mtkit.model import Transformer

CFG = ModelConfig(d_model=32, h=4, d_ff=64, encoder_layers=1, decoder_layers=2, dropout=0.0, max_positions=64)
LINES = [english(n) for n in (5, 17, 342, 999, 40, 77, 610, 123)]


@pytest.fixture(scope="module")
def engine():
    """An untrained en->{de, fr} engine (tags lead the sources, as a multilingual model's)."""
    vocab = Vocab.from_bytes(train_model([english(n) for n in range(0, 1000, 3)], SpmConfig(vocab_size=120),
                                         user_symbols=["<2de>", "<2fr>"]))
    torch.manual_seed(0)
    model = Transformer(CFG, vocab.src_size, vocab.tgt_size).eval()
    with torch.no_grad():
        model.output_projection.weight.mul_(3.0)  # more varied outputs than the default init
    loaded = SimpleNamespace(model=model, vocab=vocab, config=Config(model=CFG))
    return TorchEngine(loaded, DecodeConfig(beam=2, max_len_b=10), languages=([Pair("en", "de"), Pair("en", "fr")],
                                                                              None))


def test_one_engine_translates_for_several_threads_at_once_exactly_as_serially(engine, monkeypatch):
    """Calls with other targets, beams and constraints (include, and exclude phrases distinct per call,
    through a piece index small enough to evict entries while others read it), from four threads at
    once on one engine, give exactly what each gives alone."""
    for name in constraints_module.MEMO_ENTRIES:
        monkeypatch.setitem(constraints_module.MEMO_ENTRIES, name, 3)
    plain = {target: engine.translate_text(LINES, target=target) for target in ("de", "fr")}
    words = sorted({w for found in plain.values() for out in found for w in out.split()})
    assert len(words) > 6

    def wanted(target: str, kind: str):
        if kind == "none":
            return None
        if kind == "exclude":  # each line's first output word, and words of other lines: the index evicts
            return lambda i, line: Constraints(exclude=tuple(dict.fromkeys(
                [plain[target][i].split()[0]] if plain[target][i] else []) | dict.fromkeys(words[i: i + 4])))
        return lambda i, line: Constraints(include=(words[i % len(words)],))

    def run(job):
        target, beam, kind = job
        options = replace(engine.decode, beam=beam, nbest=1)
        return [(t.best.text, t.best.score)
                for t in engine.translate(LINES, constraints=wanted(target, kind), options=options, target=target)]

    jobs = [(target, beam, kind) for target in ("de", "fr") for beam in (1, 3) for kind in ("none", "exclude",
                                                                                           "include")]
    serial = [run(job) for job in jobs]
    assert len({tuple(s) for s in serial}) > len(jobs) // 2  # targets, beams and constraints change outputs
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(run, jobs * 3)) == serial * 3
    assert all(len(memo) <= 3 for memo in engine.pieces().memos().values())


def test_a_call_told_to_stop_stops_between_search_steps(engine):
    """``should_stop`` is asked before every search step: answering True at the third question stops the
    call there (Stopped), after exactly three questions, with and without constraints."""
    for constraints in (None, lambda i, line: Constraints(include=("hundred",))):
        for beam in (1, 3):
            asked = []

            def should_stop(asked=asked) -> bool:
                asked.append(1)
                return len(asked) >= 3

            options = replace(engine.decode, beam=beam, nbest=1, max_len_b=30)
            with pytest.raises(Stopped):
                list(engine.translate(LINES[:1], constraints=constraints, options=options, target="de",
                                      should_stop=should_stop))
            assert len(asked) == 3
    # Never told to stop: the same as without the hook.
    assert [t.best.text for t in engine.translate(LINES, target="fr", should_stop=lambda: False)] == \
        engine.translate_text(LINES, target="fr")


class _Pieces:
    """A vocabulary of many pieces: enough of mtkit's Vocab for a PieceIndex."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = ["<pad>", "<unk>", "<s>", "</s>", *pieces]
        self.tgt_size = len(self.pieces)
        self.index = {p: i for i, p in enumerate(self.pieces)}

    def tgt_pieces(self, ids):
        return [self.pieces[i] for i in ids]

    def encode_tgt(self, text: str) -> list[int]:
        out = []
        for word in text.split():
            piece = "\u2581" + word
            out += [self.index[piece]] if piece in self.index else [self.index["\u2581" + c] for c in word]
        return out

    def decode_tgt(self, ids) -> str:
        return "".join(self.pieces[i] for i in ids).replace("\u2581", " ").strip()


def test_the_piece_index_never_holds_more_entries_than_its_bounds():
    """A stream of distinct exclude phrases (each a few words, from several threads at once) leaves each
    of the index's memos at its entry bound, and what it keeps is what it would compute afresh."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = _Pieces([f"\u2581{c}" for c in letters] + [f"\u2581{a}{b}" for a in letters for b in letters[:10]]
                    + [c for c in letters])
    bounds = {"segmentations": 40, "inner": 5, "matchers": 30, "sequences": 20}
    table = PieceIndex(vocab, bounds)

    def phrases(seed: int):
        for n in range(seed, 3000, 4):
            words = [letters[(n * 7 + k) % 26] + letters[(n // 26 + k) % 10] + letters[(n + k * 3) % 26]
                     for k in range(3)]
            yield " ".join(words)

    errors = []

    def work(seed: int) -> None:
        try:
            for phrase in phrases(seed):
                encode_constraints(Constraints(exclude=(phrase,)), vocab, lambda: table)
                sizes = {name: len(memo) for name, memo in table.memos().items()}
                assert all(sizes[name] <= bounds[name] for name in bounds), sizes
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert all(len(memo) == bounds[name] for name, memo in table.memos().items() if name != "inner")
    phrase = next(phrases(1))
    kept = encode_constraints(Constraints(exclude=(phrase,)), vocab, lambda: table)
    fresh = encode_constraints(Constraints(exclude=(phrase,)), vocab, lambda: PieceIndex(vocab))
    assert kept == fresh and kept.exclude.matchers == fresh.exclude.matchers
