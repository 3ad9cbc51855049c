"""`mtkit export onnx`: the encoder and one decoding step (its key/value cache in and out) as ONNX graphs, run by
ONNX Runtime under mtkit's own search loops, computing and translating as mtkit's model does."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import torch  # noqa: E402
from test_export_hf import SENTENCES, TARGETS, tiny_checkpoint  # noqa: E402

from mtkit.config import BOS_ID, EOS_ID, PAD_ID  # noqa: E402
from mtkit.decoding import search  # noqa: E402
from mtkit.decoding.options import SearchOptions  # noqa: E402
from mtkit.export.onnx import export_model  # noqa: E402
from mtkit.runtime.checkpoint import load_model  # noqa: E402
from mtkit.runtime.onnx_engine import OnnxModel  # noqa: E402


def padded(rows: list[list[int]]) -> torch.Tensor:
    width = max(map(len, rows))
    return torch.tensor([r + [PAD_ID] * (width - len(r)) for r in rows])


def mtkit_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtkit", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ})


VARIANTS = {
    "post-norm": {},
    "pre-norm, Marian's options": {"norm": "pre", "sinusoid_layout": "concatenated", "activation": "swish",
                                   "output_bias": True, "scale_embedding": False},
    "learned positions, two vocabularies": {"positions": "learned", "share_embeddings": "none", "separate": True},
}


@pytest.mark.parametrize("variant", [pytest.param(v, marks=pytest.mark.slow) if i == 2 else v
                                     for i, v in enumerate(VARIANTS)])
def test_the_graphs_compute_mtkits_logits_step_by_step_and_search_as_mtkit(tmp_path, variant):
    loaded = load_model(tiny_checkpoint(tmp_path / "m.pt", **VARIANTS[variant]))
    export_model(loaded, tmp_path / "onnx")
    onnx = OnnxModel(tmp_path / "onnx")
    src = padded([loaded.vocab.encode_src(s) + [EOS_ID] for s in SENTENCES])
    tgt = padded([[BOS_ID, *loaded.vocab.encode_tgt(t)] for t in TARGETS])
    with torch.no_grad():
        ours = loaded.model(src, tgt)
    memory, mask = onnx.encode(src)
    cache = onnx.init_cache(memory, mask)
    for i in range(tgt.size(1)):  # the cache in and out, one token at a time, against the teacher-forced pass
        logits, cache = onnx.decode_step(tgt[:, i], cache)
        assert (logits - ours[:, i]).abs().max() <= 1e-4
    assert ours.std() > 0.1
    options = SearchOptions(beam=3, nbest=1, length_penalty="power", alpha=1.0, max_len_a=0.0, max_len_b=12)
    from mtkit.runtime.inference import InferenceModel

    reference = InferenceModel(loaded.model)
    for find in (search.greedy_search, search.beam_search):
        with torch.inference_mode():
            want = [h[0].tokens for h in find(reference, src, options)]
            got = [h[0].tokens for h in find(onnx, src, options)]
        assert got == want, find.__name__


@pytest.mark.slow
def test_the_exported_run_translates_as_mtkit(reverse_run, reverse_data, tmp_path):
    data_dir, data = reverse_data
    lines = open(data["test"]["src"]).read().splitlines()
    done = mtkit_cli("export", "onnx", str(reverse_run), str(tmp_path / "onnx"))
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == f"exported {load_model(reverse_run).path} to {tmp_path / 'onnx'} " \
                                          "(ONNX: encoder.onnx, decoder_step.onnx)"
    loaded = load_model(reverse_run)
    onnx = OnnxModel(tmp_path / "onnx")
    from mtkit.runtime.torch_engine import TorchEngine

    for beam in (1, 4):
        engine = TorchEngine(loaded, loaded.config.decode)
        call = engine.call(dataclasses.replace(loaded.config.decode, beam=beam, nbest=1))
        batch = [loaded.vocab.encode_src(line) + [EOS_ID] for line in lines]
        want = [h[0][0] for h in engine.search_batch(batch, call)]
        options = engine.search_options(call)
        with torch.inference_mode():
            find = search.greedy_search if beam == 1 else search.beam_search
            got = [h[0].tokens for h in find(onnx, padded(batch), options)]
        assert sum(a == b for a, b in zip(got, want, strict=True)) >= len(lines) - 1
        assert len({tuple(w) for w in want}) > len(lines) // 2  # outputs that vary
    # the engine: `mtkit translate --engine onnx` and mtkit.load, on the folder
    text = "".join(line + "\n" for line in lines)
    for beam in ("1", "4"):
        ours = subprocess.run([sys.executable, "-m", "mtkit", "translate", "-m", str(reverse_run), "--beam", beam],
                              input=text, capture_output=True, text=True, timeout=600)
        theirs = subprocess.run([sys.executable, "-m", "mtkit", "translate", "--engine", "onnx", "-m",
                                 str(tmp_path / "onnx"), "--beam", beam], input=text, capture_output=True, text=True,
                                timeout=600)
        assert theirs.returncode == 0 and "(ONNX Runtime, exported from" in theirs.stderr, theirs.stderr
        pairs = list(zip(ours.stdout.splitlines(), theirs.stdout.splitlines(), strict=True))
        assert sum(a == b for a, b in pairs) >= len(lines) - 1
    import mtkit

    onnx_model, torch_model = mtkit.load(tmp_path / "onnx"), mtkit.load(reverse_run)
    assert onnx_model.kind == "onnx"
    assert [r.hypotheses[0].text for r in onnx_model.translate(lines[:8])] == \
        [r.hypotheses[0].text for r in torch_model.translate(lines[:8])]


def test_the_onnx_engine_takes_an_onnx_export_only(tmp_path):
    ckpt = tiny_checkpoint(tmp_path / "m.pt")
    done = subprocess.run([sys.executable, "-m", "mtkit", "translate", "--engine", "onnx", "-m", str(ckpt)],
                          input="one two\n", capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr == "error: --engine onnx takes one folder written by mtkit export onnx\n"


@pytest.mark.parametrize("problem", ["not empty", "no onnxscript"])
def test_what_cannot_be_exported_is_one_line_and_writes_nothing(tmp_path, problem):
    ckpt = tiny_checkpoint(tmp_path / "m.pt")
    out = tmp_path / "onnx"
    if problem == "not empty":
        out.mkdir()
        (out / "keep.txt").write_text("mine\n")
        done = mtkit_cli("export", "onnx", str(ckpt), str(out))
        expected = f"error: {out}: already exists and is not empty; remove it or choose another directory"
    else:
        code = ("import sys; sys.modules['onnxscript'] = None; from mtkit.cli import main; "
                f"sys.argv = ['mtkit', 'export', 'onnx', {str(ckpt)!r}, {str(out)!r}]; main()")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        expected = "error: exporting to ONNX needs onnx and onnxscript (pip install 'mtkit[onnx]')"
    assert done.returncode == 1 and done.stderr.splitlines()[-1] == expected, done.stderr
    assert "Traceback" not in done.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"] if problem == "not empty" else not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == (["m.pt", "onnx"] if problem == "not empty" else ["m.pt"])


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    """A tiny random model's ONNX export, made once (each test changes a copy)."""
    root = tmp_path_factory.mktemp("onnx-export")
    return export_model(load_model(tiny_checkpoint(root / "m.pt")), root / "onnx")


@pytest.mark.parametrize("breakage", ["truncated graph", "bad manifest",
                                      pytest.param("graph of another model", marks=pytest.mark.slow)])
def test_a_broken_export_is_one_line(tmp_path, tiny_export, breakage):
    import json
    import shutil

    folder = Path(shutil.copytree(tiny_export, tmp_path / "onnx"))
    if breakage == "truncated graph":
        data = (folder / "decoder_step.onnx").read_bytes()
        (folder / "decoder_step.onnx").write_bytes(data[: len(data) // 3])
        expected = f"error: {folder / 'decoder_step.onnx'}: ONNX Runtime could not load it ("
    elif breakage == "bad manifest":
        manifest = json.loads((folder / "mtkit.json").read_text())
        manifest["model"]["h"] = "4"
        (folder / "mtkit.json").write_text(json.dumps(manifest))
        expected = f"error: {folder / 'mtkit.json'}: model.h must be a positive integer, got '4'"
    else:  # the step graph of a model with one decoder layer less
        other = export_model(load_model(tiny_checkpoint(tmp_path / "o.pt", decoder_layers=1)), tmp_path / "other")
        shutil.copy(other / "decoder_step.onnx", folder / "decoder_step.onnx")
        expected = f"error: {folder / 'decoder_step.onnx'}: its inputs and outputs are not those of a model of 2"
    done = subprocess.run([sys.executable, "-m", "mtkit", "translate", "--engine", "onnx", "-m", str(folder)],
                          input="one two\n", capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(expected), done.stderr


def test_the_onnx_engine_translates_markup_between_tags_and_refuses_alignments(tiny_export, tmp_path):
    """ONNX's graphs give no attention: --format html translates the text between tags (as LibreTranslate),
    and --alignments or --protect are one-line errors."""
    env = {**os.environ, "MTKIT_DEBUG": ""}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "mtkit", "translate", "--engine", "onnx", "-m", str(tiny_export),
                               *args], input="two <b>hundred</b> five\n", capture_output=True, text=True, env=env,
                              timeout=300)

    done = run("--format", "html")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("<b>") == 1 and done.stdout.count("</b>") == 1
    for flags, message in ((["--alignments"], "--alignments needs --engine torch or ctranslate2"),
                           (["--protect", "x"], "--protect needs word alignments")):
        bad = run(*flags)
        assert bad.returncode != 0 and message in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
