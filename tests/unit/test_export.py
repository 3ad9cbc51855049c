"""CTranslate2 export: the exported model translates (and scores) like the original."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ctranslate2 = pytest.importorskip("ctranslate2")  # before torch: see mtkit.export.ctranslate2

import torch  # noqa: E402

from mtkit import __version__  # noqa: E402
from mtkit.config import BOS_ID, EOS_ID, Config, DecodeConfig, ModelConfig, SpmConfig, config_to_dict  # noqa: E402
from mtkit.data.synthetic import english, german  # noqa: E402
from mtkit.data.vocab import Vocab, train_model  # noqa: E402
from mtkit.errors import MtkitError  # noqa: E402
from mtkit.export.ctranslate2 import Ctranslate2Translator, export_model, length_penalty  # noqa: E402
from mtkit.model import Transformer  # noqa: E402
from mtkit.search import length_penalty as search_length_penalty  # noqa: E402
from mtkit.translate import Translator  # noqa: E402

torch.set_num_threads(1)
STEPS = 150
LINES = [english(n) for n in (5, 17, 342, 999, 40, 1, 77, 610, 123, 858)]
SHAPES = {
    "post-sinusoidal-tied": dict(norm="post", positions="sinusoidal", share_embeddings="all"),
    "pre-learned-untied": dict(norm="pre", positions="learned", share_embeddings="none", layer_norm_eps=1e-6),
}


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    sentences = [english(n) for n in range(0, 1000, 3)] + [german(n) for n in range(0, 1000, 3)]
    return Vocab.from_bytes(train_model(sentences, SpmConfig(vocab_size=120)))


_TRAINED: dict = {}


def tiny_model(vocab: Vocab, **shape) -> SimpleNamespace:
    """A tiny model trained for a few seconds to copy number words: varied outputs that end with EOS."""
    key = tuple(sorted(shape.items()))
    if key not in _TRAINED:
        _TRAINED[key] = _train(vocab, **shape)
    return _TRAINED[key]


def _train(vocab: Vocab, **shape) -> SimpleNamespace:
    cfg = ModelConfig(d_model=32, h=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0, max_positions=64,
                      **shape)
    torch.manual_seed(0)
    model = Transformer(cfg, vocab.src_size, vocab.tgt_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        ids = [vocab.encode_src(english(int(n))) + [EOS_ID] for n in torch.randint(0, 1000, (32,), generator=g)]
        width = max(map(len, ids))
        src = torch.tensor([x + [0] * (width - len(x)) for x in ids])
        tgt_in = torch.cat([torch.full((32, 1), BOS_ID), src[:, :-1]], dim=1)
        loss = torch.nn.functional.cross_entropy(model(src, tgt_in).transpose(1, 2), src, ignore_index=0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():  # non-trivial LayerNorm scales and biases too
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.05 * torch.randn_like(p))
    return SimpleNamespace(model=model.eval(), vocab=vocab, config=Config(model=cfg), path=Path("tiny.pt"))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_exported_model_translates_and_scores_like_mtkit(vocab, tmp_path, shape):
    loaded = tiny_model(vocab, **SHAPES[shape])
    out = export_model(loaded, tmp_path / "ct2")
    assert {"model.bin", "config.json", "spm.model", "mtkit.json"} <= {p.name for p in out.iterdir()}

    decode = DecodeConfig(beam=1, max_len_a=0.0, max_len_b=12)  # CTranslate2 has one max per batch
    ours = list(Translator(loaded, decode).translate(LINES))
    theirs = list(Ctranslate2Translator(out, decode, intra_threads=1).translate(LINES))
    assert [t.best.ids for t in theirs] == [t.best.ids for t in ours]
    assert len({tuple(t.best.ids) for t in ours}) > 3  # the outputs really vary
    for a, b in zip(ours, theirs):
        if len(a.best.ids) < 12:  # CTranslate2 scores a hypothesis cut at the maximum length without EOS
            assert a.best.score == pytest.approx(b.best.score, abs=1e-3)

    # Teacher-forced scores of arbitrary targets agree too (every weight, every position).
    translator = ctranslate2.Translator(str(out), intra_threads=1)
    source = [vocab.src_pieces(vocab.encode_src(line)) for line in LINES]
    targets = [vocab.tgt_pieces(vocab.encode_src(LINES[-1 - i])) for i in range(len(LINES))]
    scored = translator.score_batch(source, targets)
    for src_text, tgt, result in zip(LINES, targets, scored):
        src = torch.tensor([vocab.encode_src(src_text) + [EOS_ID]])
        tgt_ids = [vocab._tgt.piece_to_id(p) for p in tgt] + [EOS_ID]
        with torch.no_grad():
            lprobs = torch.log_softmax(loaded.model(src, torch.tensor([[BOS_ID, *tgt_ids[:-1]]])), dim=-1)[0]
        expected = [float(lprobs[t, y]) for t, y in enumerate(tgt_ids)]
        assert result.log_probs == pytest.approx(expected, abs=1e-3)


@pytest.mark.parametrize("penalty", ["gnmt", "power"])
def test_beam_search_through_ctranslate2(vocab, tmp_path, penalty):
    loaded = tiny_model(vocab, **SHAPES["post-sinusoidal-tied"])
    out = export_model(loaded, tmp_path / "ct2")
    decode = DecodeConfig(beam=4, alpha=0.6 if penalty == "gnmt" else 1.0, length_penalty=penalty, max_len_a=0.0,
                          max_len_b=12, nbest=2)
    ours = list(Translator(loaded, decode).translate(LINES))
    theirs = list(Ctranslate2Translator(out, decode, intra_threads=1).translate(LINES))
    assert [t.best.ids for t in theirs] == [t.best.ids for t in ours]
    assert [t.best.score for t in theirs] == pytest.approx([t.best.score for t in ours], abs=1e-3)
    assert all(len(t.candidates) == 2 for t in theirs)
    for length in (1, 9):
        assert length_penalty(length, decode.alpha, penalty) == pytest.approx(
            search_length_penalty(length, decode.alpha, penalty))


def test_int8_export_and_existing_directory(vocab, tmp_path):
    loaded = tiny_model(vocab, **SHAPES["post-sinusoidal-tied"])
    out = export_model(loaded, tmp_path / "int8", quantization="int8")
    results = list(Ctranslate2Translator(out, DecodeConfig(beam=2, max_len_b=5)).translate(["", *LINES[:3]]))
    assert [t.index for t in results] == [0, 1, 2, 3] and results[0].best.text == ""
    with pytest.raises(MtkitError, match="not empty"):
        export_model(loaded, out)


def test_ctranslate2_engine_never_imports_torch(vocab, tmp_path):
    out = export_model(tiny_model(vocab, **SHAPES["post-sinusoidal-tied"]), tmp_path / "ct2")
    (tmp_path / "in.txt").write_text("five\n\nsix\n", encoding="utf-8")
    code = (
        "import sys\n"
        "from mtkit.commands.translate import translate\n"
        "from mtkit.config import DecodeConfig\n"
        f"translate({str(out)!r}, [{str(tmp_path / 'in.txt')!r}], None, DecodeConfig(beam=2, max_len_b=4),"
        " 'text', engine='ctranslate2')\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 3


def test_export_command_from_checkpoint(vocab, tmp_path):
    from mtkit.commands.export import export_ctranslate2

    loaded = tiny_model(vocab, **SHAPES["post-sinusoidal-tied"])
    ckpt = tmp_path / "tiny.pt"
    torch.save({
        "format_version": 1, "mtkit_version": __version__, "config": config_to_dict(loaded.config),
        "model": loaded.model.state_dict(), "vocab": {"src": vocab.model_bytes()[0], "tgt": None},
        "src_vocab_size": vocab.src_size, "tgt_vocab_size": vocab.tgt_size,
    }, ckpt)
    export_ctranslate2(ckpt, tmp_path / "out", None)
    assert (tmp_path / "out" / "model.bin").is_file()
