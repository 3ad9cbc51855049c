"""CTranslate2 export: the exported model translates (and scores) like the original."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ctranslate2 = pytest.importorskip("ctranslate2")  # before torch: see mtkit.export.ctranslate2

import torch  # noqa: E402
from conftest import number_vocab  # noqa: E402

from mtkit.config import BOS_ID, EOS_ID, Config, DecodeConfig, ModelConfig, config_to_dict  # noqa: E402
from mtkit.data.synthetic import english  # noqa: E402
from mtkit.data.vocab import Vocab  # noqa: E402
from mtkit.decoding.penalties import length_penalty as search_length_penalty  # noqa: E402
from mtkit.engines.ctranslate2_engine import CpuThreads, Ctranslate2Engine, exported_decode, length_penalty  # noqa: E402
from mtkit.engines.engine import EngineOptions  # noqa: E402
from mtkit.engines.torch_engine import TorchEngine  # noqa: E402
from mtkit.errors import MtkitError  # noqa: E402
from mtkit.export.ctranslate2 import export_model  # noqa: E402
from mtkit.model import Transformer  # noqa: E402

STEPS = 150
LINES = [english(n) for n in (5, 17, 342, 999, 40, 1, 77, 610, 123, 858)]
SHAPES = {
    "post-sinusoidal-tied": dict(norm="post", positions="sinusoidal", share_embeddings="all"),
    "pre-learned-untied": dict(norm="pre", positions="learned", share_embeddings="none", layer_norm_eps=1e-6),
}


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return number_vocab(120)


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

    decode = DecodeConfig(beam=1, max_len_a=0.0, max_len_b=12)
    ours = list(TorchEngine(loaded, decode).translate(LINES))
    theirs = list(Ctranslate2Engine(out, decode, threads=CpuThreads(intra=1)).translate(LINES))
    assert [t.best.ids for t in theirs] == [t.best.ids for t in ours]
    assert len({tuple(t.best.ids) for t in ours}) > 3  # the outputs really vary
    assert [t.best.score for t in theirs] == pytest.approx([t.best.score for t in ours], abs=1e-3)

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
@pytest.mark.parametrize("max_len", [(0.0, 12), (1.0, -3), (0.5, 0)], ids=["fixed", "per-sentence", "cut"])
def test_beam_search_through_ctranslate2(vocab, tmp_path, penalty, max_len):
    """The same best hypothesis and score as mtkit's beam search, also where the maximum length
    differs within a batch (one CTranslate2 call has one) or cuts the outputs (mtkit forces EOS)."""
    loaded = tiny_model(vocab, **SHAPES["post-sinusoidal-tied"])
    out = export_model(loaded, tmp_path / "ct2")
    decode = DecodeConfig(beam=4, alpha=0.6 if penalty == "gnmt" else 1.0, length_penalty=penalty,
                          max_len_a=max_len[0], max_len_b=max_len[1], nbest=2)
    ours = list(TorchEngine(loaded, decode).translate(LINES))
    theirs = list(Ctranslate2Engine(out, decode, threads=CpuThreads(intra=1)).translate(LINES))
    assert [t.best.ids for t in theirs] == [t.best.ids for t in ours]
    assert [t.best.score for t in theirs] == pytest.approx([t.best.score for t in ours], abs=1e-3)
    assert all(len(t.candidates) == 2 for t in theirs)
    if max_len == (0.5, 0):  # the case really cuts: some outputs stop at their own limit
        assert any(len(t.best.ids) == int(0.5 * len(t.src_ids)) for t in ours)
    for length in (1, 9):
        assert length_penalty(length, decode.alpha, penalty) == pytest.approx(
            search_length_penalty(length, decode.alpha, penalty))


def test_int8_export_and_existing_directory(vocab, tmp_path):
    loaded = tiny_model(vocab, **SHAPES["post-sinusoidal-tied"])
    out = export_model(loaded, tmp_path / "int8", quantization="int8")
    results = list(Ctranslate2Engine(out, DecodeConfig(beam=2, max_len_b=5)).translate(["", *LINES[:3]]))
    assert [t.index for t in results] == [0, 1, 2, 3] and results[0].best.text == ""
    with pytest.raises(MtkitError, match="not empty"):
        export_model(loaded, out)


def test_exporting_leaves_the_models_weights_as_they_were(vocab, tmp_path):
    """CTranslate2 optimizes the spec's arrays in place (int8, the embeddings' scale): the export hands it copies,
    so that the model, and a second export of it, keep the weights they had."""
    loaded = copy.deepcopy(tiny_model(vocab, **SHAPES["post-sinusoidal-tied"]))  # the shared one stays untouched
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    export_model(loaded, tmp_path / "int8", quantization="int8")
    export_model(loaded, tmp_path / "fp32")
    after = loaded.model.state_dict()
    assert [k for k in before if not torch.equal(before[k], after[k])] == []


def test_ctranslate2_engine_never_imports_torch(vocab, tmp_path):
    out = export_model(tiny_model(vocab, **SHAPES["post-sinusoidal-tied"]), tmp_path / "ct2")
    (tmp_path / "in.txt").write_text("five\n\nsix\n", encoding="utf-8")
    code = (
        "import sys\n"
        "from mtkit.logs import to_stderr\n"
        "to_stderr()  # as the CLI does: what was loaded is said through the mtkit logger\n"
        "from mtkit.commands.translate import TranslateOptions, translate\n"
        "from mtkit.config import DecodeConfig\n"
        "from mtkit.logs import to_stderr\n"
        "to_stderr()\n"  # what the library says, on stderr, as the CLI has it
        f"translate({str(out)!r}, [{str(tmp_path / 'in.txt')!r}], TranslateOptions("
        "decode_settings=DecodeConfig(beam=2, max_len_b=4), output_format='text', engine='ctranslate2'))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)  # a hang guard
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 3
    assert f"loaded {out} (CTranslate2, exported from tiny.pt)" in done.stderr
    from mtkit.export.cache import cached_export

    ckpt = save_tiny_checkpoint(tiny_model(vocab, **SHAPES["post-sinusoidal-tied"]), tmp_path / "run" / "last.pt")
    cached_export(ckpt, None, quiet=True)  # then a run on the checkpoint finds its export: no torch either
    done = subprocess.run([sys.executable, "-c", code.replace(repr(str(out)), repr(str(ckpt)))], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 3, done.stderr


def save_tiny_checkpoint(loaded: SimpleNamespace, path: Path) -> Path:
    from mtkit.checkpoints.io import model_payload, save_checkpoint, vocab_entry

    path.parent.mkdir(parents=True, exist_ok=True)
    return save_checkpoint(model_payload(config_to_dict(loaded.config), loaded.model.state_dict(),
                                         vocab_entry(loaded.vocab), loaded.vocab.src_size, loaded.vocab.tgt_size), path)


def test_ctranslate2_engine_decodes_with_the_exported_settings(vocab, tmp_path):
    loaded = tiny_model(vocab, **SHAPES["post-sinusoidal-tied"])
    recipe = DecodeConfig(beam=3, length_penalty="power", alpha=1.0, max_len_a=0.5, max_len_b=2)
    out = export_model(SimpleNamespace(**{**vars(loaded), "config": Config(model=loaded.config.model, decode=recipe)}),
                       tmp_path / "ct2")
    assert exported_decode(out) == recipe
    (tmp_path / "in.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    code = (
        "from mtkit.commands.translate import TranslateOptions, translate\n"
        f"translate({str(out)!r}, [{str(tmp_path / 'in.txt')!r}], TranslateOptions(engine='ctranslate2'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)  # a hang guard
    assert done.returncode == 0, done.stderr
    ours = [t.best.text for t in TorchEngine(loaded, recipe).translate(LINES)]
    assert done.stdout.splitlines() == ours


def test_export_command_from_checkpoint(vocab, tmp_path):
    from mtkit.commands.export import export_ctranslate2

    ckpt = save_tiny_checkpoint(tiny_model(vocab, **SHAPES["post-sinusoidal-tied"]), tmp_path / "tiny.pt")
    export_ctranslate2(ckpt, tmp_path / "out", None)
    assert (tmp_path / "out" / "model.bin").is_file()


def test_maximum_length_is_mtkits(vocab, tmp_path):
    """Per source length, the output limit the CTranslate2 engine applies is mtkit.decoding.search's."""
    from mtkit.decoding.search import max_lengths

    out = export_model(tiny_model(vocab, **SHAPES["post-sinusoidal-tied"]), tmp_path / "ct2")
    for a, b in ((1.0, 50), (0.5, 0), (1.2, -3), (0.0, 12), (2.0, 100)):
        translator = Ctranslate2Engine(out, DecodeConfig(max_len_a=a, max_len_b=b), threads=CpuThreads(intra=1))
        for n in (1, 2, 5, 17, 40):
            src = torch.tensor([[5] * (n - 1) + [EOS_ID]])
            limit = int(max_lengths(src, a, b, translator.max_out_len)[0])
            assert translator.max_length(n, translator.decode) == limit, (a, b, n)


def test_forced_lengths(vocab, tmp_path):
    """EOS banned up to the limit (how benchmarks force output lengths): every output has exactly that
    length in both engines (the tokens may differ: CTranslate2 renormalizes what it bans, mtkit does not)."""
    loaded = tiny_model(vocab, **SHAPES["post-sinusoidal-tied"])
    out = export_model(loaded, tmp_path / "ct2")
    decode = DecodeConfig(beam=3, length_penalty="power", alpha=1.0, max_len_a=0.0, max_len_b=6, min_len=6)
    ours = list(TorchEngine(loaded, decode).translate(LINES))
    theirs = list(Ctranslate2Engine(out, decode, EngineOptions(), CpuThreads(intra=1)).translate(LINES))
    assert {len(t.best.ids) for t in ours} == {len(t.best.ids) for t in theirs} == {6}


def test_sampling_through_ctranslate2_keeps_every_sample_within_its_limit(vocab, tmp_path):
    loaded = tiny_model(vocab, **SHAPES["post-sinusoidal-tied"])
    out = export_model(loaded, tmp_path / "ct2")
    decode = DecodeConfig(sampling=True, nbest=5, beam=2, top_k=10, max_len_a=0.5, max_len_b=0)
    for t in Ctranslate2Engine(out, decode, threads=CpuThreads(intra=1)).translate(LINES):
        assert len(t.candidates) == 5
        assert all(len(c.ids) <= max(1, int(0.5 * len(t.src_ids))) for c in t.candidates)
        assert [c.score for c in t.candidates] == sorted((c.score for c in t.candidates), reverse=True)


def _spoil_manifest(out: Path, **changes) -> None:
    import json

    manifest = json.loads((out / "mtkit.json").read_text())
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            manifest[section][field] = value
        else:
            manifest[section] = value
    (out / "mtkit.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"model__encoder_layers": 100_000_000}, "model.encoder_layers is 100000000 but model.bin has 2 encoder layers"),
    ({"model__decoder_layers": 1}, "model.decoder_layers is 1 but model.bin has 2 decoder layers"),
    ({"model__d_model": 64, "model__h": 8}, "model.d_model is 64 but model.bin has encoder/embeddings_0/weight of"),
    ({"model__d_ff": 100_000_000}, "model.d_ff is 100000000 but model.bin has encoder/layer_0/ffn/linear_0/weight"),
    ({"model__max_positions": 100_000_000}, "model.max_positions is 100000000 but model.bin has encoder/position_enc"),
    ({"model__h": 8}, "model.h is 8 but model.bin has encoder/num_heads 4"),
    ({"model__d_model": "32"}, "model.d_model"),
    ({"decode__beam": "4"}, "decode.beam"),
    ({"model": "transformer"}, "model must be a mapping"),
    ({"step": "7"}, "step must be an integer"),
    ({"tag_side": "left"}, "tag_side must be 'source', 'target' or 'codes'"),
], ids=["encoder_layers", "decoder_layers", "d_model", "d_ff", "max_positions", "h", "d_model a string",
        "beam a string", "model a string", "step a string", "tag_side"])
def test_a_manifest_that_disagrees_with_model_bin_is_one_error(vocab, tmp_path, changes, fragment):
    out = export_model(tiny_model(vocab, **SHAPES["post-sinusoidal-tied"]), tmp_path / "ct2", quantization="int8")
    _spoil_manifest(out, **changes)
    with pytest.raises(MtkitError) as e:
        Ctranslate2Engine(out, exported_decode(out))
    message = str(e.value)
    assert message.startswith(f"{out / 'mtkit.json'}: ") and fragment in message and "\n" not in message, message


def test_a_model_bin_cut_short_is_one_error(vocab, tmp_path):
    out = export_model(tiny_model(vocab, **SHAPES["pre-learned-untied"]), tmp_path / "ct2")
    data = (out / "model.bin").read_bytes()
    (out / "model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(MtkitError, match=r"model\.bin: not a readable CTranslate2 model \(.*cut short\)"):
        exported_decode(out)


def test_a_spoiled_manifest_is_one_error_line_from_the_cli(vocab, tmp_path):
    out = export_model(tiny_model(vocab, **SHAPES["post-sinusoidal-tied"]), tmp_path / "ct2")
    _spoil_manifest(out, model__encoder_layers=100_000_000)
    r = subprocess.run([sys.executable, "-m", "mtkit", "translate", "--engine", "ctranslate2", "-m", str(out)],
                       input="five\n", capture_output=True, text=True, timeout=120, check=False)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 1 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "model.encoder_layers is 100000000 but model.bin has 2 encoder layers" in errors[0]


def test_the_exported_engine_takes_one_thread_per_free_cpu_unless_told(vocab, tmp_path, monkeypatch, capsys):
    """CTranslate2 fixes its count when it loads a model: mtkit chooses it from the CPUs other work leaves
    free (the reading spans the process's start), says it, and leaves a user's count and int8 models alone."""
    from mtkit.engines import factory
    from mtkit.engines.threads import LoadProbe
    from mtkit.logs import to_stderr

    to_stderr()  # what the library says, on stderr, as the CLI has it
    out = export_model(tiny_model(vocab, **SHAPES["post-sinusoidal-tied"]), tmp_path / "ct2")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(factory, "usable_cpus", lambda: 2)
    busy = {"others": 1.0}
    monkeypatch.setattr(LoadProbe, "others", lambda self, now="now": busy["others"])
    ct2 = factory.LoadOptions(engine="ctranslate2", device="cpu", threads=0, any_target=False)  # the CLI's
    translator = factory.build_translator([out], ct2)
    assert translator.intra_threads == 1
    assert "threads: 1 (2 usable CPUs, 1.0 busy with other work)" in capsys.readouterr().err
    busy["others"] = 0.0
    assert factory.build_translator([out], ct2).intra_threads == 2
    three = factory.LoadOptions(engine="ctranslate2", device="cpu", threads=3, any_target=False)
    assert factory.build_translator([out], three).intra_threads == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert factory.build_translator([out], ct2).intra_threads == 0  # OpenMP's: 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    int8 = export_model(tiny_model(vocab, **SHAPES["post-sinusoidal-tied"]), tmp_path / "int8", quantization="int8")
    assert factory.build_translator([int8], ct2).intra_threads == 1
    assert "threads: 1 (an int8 model: fastest with one)" in capsys.readouterr().err


def test_the_api_loads_an_exported_folder_with_ctranslate2(vocab, tmp_path):
    import mtkit

    out = export_model(tiny_model(vocab, **SHAPES["post-sinusoidal-tied"]), tmp_path / "ct2")
    model = mtkit.load(out, device="cpu", threads=1)
    assert model.kind == "ctranslate2"
    decode = exported_decode(out)
    theirs = list(Ctranslate2Engine(out, decode, threads=CpuThreads(intra=1)).translate(LINES))
    ours = model.translate(LINES)
    assert [r.text for r in ours] == [t.best.text for t in theirs]
    assert [r.score for r in ours] == pytest.approx([t.best.score for t in theirs])
    pipe = mtkit.pipeline("translation", model=out, device="cpu", threads=1)
    assert [a["translation_text"] for a in pipe(LINES)] == [r.text for r in ours]
    with pytest.raises(MtkitError, match="score needs the torch engine"):
        model.score(LINES[:1], ["x"])
    with pytest.raises(MtkitError, match="glossary: --engine ctranslate2 cannot force"):
        model.translate(LINES[:1], glossary={"one": "eins"})


def test_a_run_directory_is_exported_once_and_again_when_its_checkpoint_changes(vocab, tmp_path, monkeypatch,
                                                                                 caplog):
    """--engine ctranslate2 on a run directory: exported on first use beside the checkpoint, the export kept while
    the checkpoint stays as it is, made again (in place) when training or averaging rewrites it; each said on the
    mtkit logger, which ``quiet`` silences."""
    import logging

    from mtkit.export.cache import FOLDER, cached_export, ctranslate2_model

    caplog.set_level(logging.INFO, logger="mtkit")

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name.startswith("mtkit.export")]

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    loaded = tiny_model(vocab, **SHAPES["post-sinusoidal-tied"])
    last = save_tiny_checkpoint(loaded, tmp_path / "run" / "checkpoints" / "last.pt")
    first = ctranslate2_model(tmp_path / "run", None)
    assert first == last.parent / FOLDER / "last.float32" and said()[-1].startswith("exporting")
    made = (first / "model.bin").stat().st_mtime_ns
    assert cached_export(tmp_path / "run", None) == first and said()[-1] == (
        f"CTranslate2 export of {last} (float32): {first}")
    count = len(said())
    assert ctranslate2_model(tmp_path / "run", None, quiet=True) == first and len(said()) == count
    assert (first / "model.bin").stat().st_mtime_ns == made
    engine = Ctranslate2Engine(first, loaded.config.decode, threads=CpuThreads(intra=1))
    assert [t.best.text for t in engine.translate(LINES)] == [
        t.best.text for t in TorchEngine(loaded, loaded.config.decode).translate(LINES)]
    import mtkit

    api = mtkit.load(tmp_path / "run", engine="ctranslate2", device="cpu", threads=1)  # the API takes the same path
    assert api.kind == "ctranslate2" and api.path == first
    assert [r.text for r in api.translate(LINES)] == [t.best.text for t in engine.translate(LINES)]

    changed = tiny_model(vocab, **SHAPES["pre-learned-untied"])  # another model under the same name
    save_tiny_checkpoint(changed, last)
    assert cached_export(tmp_path / "run", None) == first and said()[-1].startswith("exporting")
    again = Ctranslate2Engine(first, loaded.config.decode, threads=CpuThreads(intra=1))
    assert [t.best.text for t in again.translate(LINES)] == [
        t.best.text for t in TorchEngine(changed, loaded.config.decode).translate(LINES)]
    assert sorted(p.name for p in first.parent.iterdir()) == ["last.float32"]  # no temporaries left

    int8 = cached_export(tmp_path / "run", "int8")
    assert int8.name == "last.int8" and (first / "model.bin").stat().st_size > (int8 / "model.bin").stat().st_size


def test_an_export_that_cannot_go_beside_the_checkpoint_goes_to_the_users_cache(vocab, tmp_path, monkeypatch):
    from mtkit.export.cache import FOLDER, cached_export

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ckpt = save_tiny_checkpoint(tiny_model(vocab, **SHAPES["post-sinusoidal-tied"]), tmp_path / "models" / "m.pt")
    (ckpt.parent / FOLDER).write_text("not a folder")  # as a read-only model folder refuses it (root ignores modes)
    out = cached_export(ckpt, None, quiet=True)
    assert out.parent.parent == tmp_path / "cache" / "mtkit" / "ctranslate2" and out.name == "m.float32"
    assert cached_export(ckpt, None, quiet=True) == out


@pytest.mark.parametrize(("args", "message"), [
    (["--quantization", "int8"], "error: --quantization needs --engine ctranslate2 (which exports a checkpoint on "
                                 "first use)"),
    (["--engine", "ctranslate2", "--quantization", "int9"], "error: --quantization int9: expected one of int8, "),
])
def test_quantization_flag_errors(vocab, tmp_path, args, message):
    ckpt = save_tiny_checkpoint(tiny_model(vocab, **SHAPES["post-sinusoidal-tied"]), tmp_path / "m.pt")
    done = subprocess.run([sys.executable, "-m", "mtkit", "translate", "-m", str(ckpt), *args], input="one\n",
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and done.stderr.startswith(message) and len(done.stderr.splitlines()) == 1, done.stderr
