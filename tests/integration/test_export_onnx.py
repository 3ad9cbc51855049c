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
from inprocess import run_mtkit  # noqa: E402
from test_export_hf import SENTENCES, TARGETS, tiny_checkpoint  # noqa: E402

from mtkit.checkpoints.io import load_model  # noqa: E402
from mtkit.config import BOS_ID, EOS_ID, PAD_ID  # noqa: E402
from mtkit.decoding import search  # noqa: E402
from mtkit.decoding.options import SearchOptions  # noqa: E402
from mtkit.engines.onnx_engine import OnnxModel  # noqa: E402
from mtkit.export.onnx import export_model  # noqa: E402
from mtkit.text.pipeline import translate_lines  # noqa: E402


def padded(rows: list[list[int]]) -> torch.Tensor:
    width = max(map(len, rows))
    return torch.tensor([r + [PAD_ID] * (width - len(r)) for r in rows])


def mtkit_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process: what the command does is the subject here (a graph that may never end runs
    in a process of its own, bounded in time)."""
    return run_mtkit(*args, stdin=stdin)


VARIANTS = {
    "post-norm": {},
    "pre-norm, Marian's options": {"norm": "pre", "sinusoid_layout": "concatenated", "activation": "swish",
                                   "output_bias": True, "scale_embedding": False},
    "learned positions, two vocabularies": {"positions": "learned", "share_embeddings": "none", "separate": True},
}


@pytest.mark.parametrize("variant", [pytest.param(v, marks=pytest.mark.slow) if i >= 1 else v  # ~12 s of CPU each
                                     for i, v in enumerate(VARIANTS)])
def test_the_graphs_compute_mtkits_logits_step_by_step_and_search_as_mtkit(tmp_path, variant, request):
    if variant == "post-norm":  # tiny_checkpoint's defaults: the module's tiny_export is this model's (one trace less)
        folder = request.getfixturevalue("tiny_export")
        loaded = load_model(folder.parent / "m.pt")
    else:
        loaded = load_model(tiny_checkpoint(tmp_path / "m.pt", **VARIANTS[variant]))
        folder = export_model(loaded, tmp_path / "onnx")
    onnx = OnnxModel(folder)
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
    from mtkit.engines.inference import InferenceModel

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
    from mtkit.engines.torch_engine import TorchEngine

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
        ours = mtkit_cli("translate", "-m", str(reverse_run), "--beam", beam, stdin=text)
        theirs = mtkit_cli("translate", "--engine", "onnx", "-m", str(tmp_path / "onnx"), "--beam", beam, stdin=text)
        assert theirs.returncode == 0 and "(ONNX Runtime, exported from" in theirs.stderr, theirs.stderr
        pairs = list(zip(ours.stdout.splitlines(), theirs.stdout.splitlines(), strict=True))
        assert sum(a == b for a, b in pairs) >= len(lines) - 1
    import mtkit

    onnx_model, torch_model = mtkit.load(tmp_path / "onnx"), mtkit.load(reverse_run)
    assert onnx_model.kind == "onnx"
    assert [r.hypotheses[0].text for r in onnx_model.translate(lines[:8])] == \
        [r.hypotheses[0].text for r in torch_model.translate(lines[:8])]


@pytest.mark.slow  # an mtkit process (fast: test_cli_in_process)
def test_the_onnx_engine_takes_an_onnx_export_only(tmp_path):
    ckpt = tiny_checkpoint(tmp_path / "m.pt")
    done = mtkit_cli("translate", "--engine", "onnx", "-m", str(ckpt), stdin="one two\n")
    assert done.returncode == 1
    assert done.stderr == "error: --engine onnx takes one folder written by mtkit export onnx\n"


@pytest.mark.slow  # mtkit processes (fast: test_cli_in_process)
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
def tiny_export_said(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A tiny random model exported by ``mtkit export onnx``, once (tracing takes most of a test's time), and
    what the command said."""
    root = tmp_path_factory.mktemp("onnx-export")
    done = mtkit_cli("export", "onnx", str(tiny_checkpoint(root / "m.pt")), str(root / "onnx"))
    assert done.returncode == 0, done.stderr
    return root / "onnx", done


@pytest.fixture(scope="module")
def tiny_export(tiny_export_said) -> Path:
    """A tiny random model's ONNX export, made once (each test changes a copy)."""
    return tiny_export_said[0]


@pytest.mark.parametrize("breakage", ["truncated graph", "bad manifest",
                                      pytest.param("graph of another model", marks=pytest.mark.slow)])
@pytest.mark.slow  # the module's tiny_export (an ONNX export, ~10 s of CPU) and mtkit processes
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
    done = mtkit_cli("translate", "--engine", "onnx", "-m", str(folder), stdin="one two\n")
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(expected), done.stderr


@pytest.mark.slow  # tiny_export and mtkit processes
def test_the_onnx_engine_translates_markup_between_tags_and_refuses_alignments(tiny_export, tmp_path):
    """ONNX's graphs give no attention: --format html translates the text between tags (as LibreTranslate),
    and --alignments or --protect are one-line errors."""
    def run(*args: str) -> subprocess.CompletedProcess:
        return mtkit_cli("translate", "--engine", "onnx", "-m", str(tiny_export), *args,
                         stdin="two <b>hundred</b> five\n")

    done = run("--format", "html")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("<b>") == 1 and done.stdout.count("</b>") == 1
    for flags, message in ((["--alignments"], "--alignments needs --engine torch or ctranslate2"),
                           (["--protect", "x"], "--protect needs word alignments")):
        bad = run(*flags)
        assert bad.returncode != 0 and message in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def graph_with_engine_names(nodes: list, result: str, name: str, inputs: list[str], outputs: list[str]):
    """An ONNX model of ``nodes`` with the engine's input names (token ids int64, masks bool, the rest
    float) whose every output is a copy of ``result``."""
    from onnx import TensorProto, helper

    nodes = nodes + [helper.make_node("Identity", [result], [output]) for output in outputs]
    kinds = {"src": TensorProto.INT64, "tokens": TensorProto.INT64, "src_mask": TensorProto.BOOL}
    graph = helper.make_graph(nodes, name,
                              [helper.make_tensor_value_info(n, kinds.get(n, TensorProto.FLOAT), None) for n in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def endless_graph(inputs: list[str], outputs: list[str]):
    """A graph with the engine's input and output names whose every output comes out of a Loop that never
    ends (no trip count, a condition always true): a program, as any ONNX graph may be."""
    from onnx import TensorProto, helper

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", ["x_in"], ["x_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, [1])])
    nodes = [helper.make_node("Constant", [], ["true"], value=helper.make_tensor("t", TensorProto.BOOL, [], [True])),
             helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", TensorProto.FLOAT, [1], [0.0])),
             helper.make_node("Loop", ["", "true", "zero"], ["looped"], body=body)]
    return graph_with_engine_names(nodes, "looped", "endless", inputs, outputs)


def failing_graph(inputs: list[str], outputs: list[str]):
    """A graph with the engine's names that fails when it runs: its outputs reshape its first input to 7
    elements."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Constant", [], ["seven"], value=helper.make_tensor("s", TensorProto.INT64, [1], [7])),
             helper.make_node("Reshape", [inputs[0], "seven"], ["reshaped"]),
             helper.make_node("Cast", ["reshaped"], ["floats"], to=TensorProto.FLOAT)]
    return graph_with_engine_names(nodes, "floats", "failing", inputs, outputs)


def hostile_export(tiny_export, folder: Path, graph: str, make) -> Path:
    """A copy of ``tiny_export`` whose ``graph`` (encoder.onnx or decoder_step.onnx) is ``make``'s, with the
    names the engine expects."""
    import shutil

    import onnx

    from mtkit.engines.onnx_engine import graph_names, read_manifest

    shutil.copytree(tiny_export, folder)
    names = graph_names(read_manifest(folder)["model"]["decoder_layers"])["encoder" if graph == "encoder.onnx"
                                                                          else "step"]
    onnx.save(make(names["inputs"], names["outputs"]), str(folder / graph))
    return folder


NEVER_ENDS = """
import sys, time
from mtkit.errors import MtkitError
from mtkit.engines import onnx_engine
from mtkit.engines.engine import Stopped
from mtkit.engines.onnx_engine import OnnxEngine, exported_decode

for folder in sys.argv[1:]:
    engine = OnnxEngine(folder, exported_decode(folder))
    started = time.monotonic()
    try:
        list(engine.translate(["one two"], should_stop=lambda: time.monotonic() - started > 0.5))
    except Stopped:
        print("stopped", "in time" if time.monotonic() - started < 5 else "late")
    onnx_engine.RUN_SECONDS = 1.0
    started = time.monotonic()
    try:
        engine.translate_text(["one two"])
    except MtkitError as e:
        print("in time" if time.monotonic() - started < 5 else "late", e)
    onnx_engine.RUN_SECONDS = 10.0
"""


@pytest.mark.slow  # tiny_export, a process and its deadlines
def test_a_graph_that_never_ends_stops_at_its_deadline_or_when_told_in_one_line(tiny_export, tmp_path):
    """Every run has a deadline: an endless Loop in either graph ends there, as one error line naming the
    graph; a call's should_stop ends it sooner (Stopped), while the graph runs. In a subprocess bounded in
    time (a run that never ends fails the test)."""
    folders = [hostile_export(tiny_export, tmp_path / graph, graph, endless_graph)
               for graph in ("encoder.onnx", "decoder_step.onnx")]
    done = subprocess.run([sys.executable, "-c", NEVER_ENDS, *map(str, folders)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    want = []
    for folder in folders:
        graph = folder / folder.name
        want += ["stopped in time",  # the deadline (10 s) never came: should_stop ended the run
                 f"in time {graph}: ONNX Runtime did not finish a run within 1 s (the graph may loop forever)"]
    assert done.stdout.splitlines() == want


@pytest.mark.slow  # tiny_export and an mtkit process
def test_a_graph_that_fails_as_it_runs_is_one_line_naming_it(tiny_export, tmp_path):
    """ONNX Runtime's error at run time (not at loading) is one line naming the graph, no traceback."""
    folder = hostile_export(tiny_export, tmp_path / "onnx", "encoder.onnx", failing_graph)
    done = mtkit_cli("translate", "--engine", "onnx", "-m", str(folder), stdin="one two\n")
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 3, done.stderr  # loaded, threads, error
    assert done.stderr.splitlines()[-1].startswith(f"error: {folder / 'encoder.onnx'}: ONNX Runtime failed to run "
                                                   "it ("), done.stderr


@pytest.mark.slow
def test_translate_on_a_graph_that_never_ends_exits_1_at_the_deadline(tiny_export, tmp_path):
    folder = hostile_export(tiny_export, tmp_path / "onnx", "decoder_step.onnx", endless_graph)
    done = subprocess.run([sys.executable, "-m", "mtkit", "translate", "--engine", "onnx", "-m", str(folder)],
                          input="one two\n", capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MTKIT_DEBUG": ""})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"error: {folder / 'decoder_step.onnx'}: ONNX Runtime did not "
                                                   "finish a run within 10 s (the graph may loop forever)"), done.stderr


@pytest.mark.slow
def test_a_server_on_a_graph_that_never_ends_answers_and_stops_at_sigterm(tiny_export, tmp_path):
    """The request gets its 504 at --decode-timeout (the run ends as the job's deadline passes), the server
    stays healthy, and SIGTERM stops it promptly: no decoding thread stays stuck in the graph."""
    pytest.importorskip("uvicorn")
    import signal
    import time

    from test_serve import Server

    folder = hostile_export(tiny_export, tmp_path / "onnx", "decoder_step.onnx", endless_graph)
    server = Server(tmp_path, "--engine", "onnx", "-m", folder, "--decode-timeout", 2, "--src-lang", "en",
                    "--tgt-lang", "de")
    try:
        started = time.monotonic()
        status, body = server.post_json("/translate", {"q": "one two", "source": "en", "target": "de"})
        assert status == 504 and time.monotonic() - started < 8, (status, body)
        assert server.get("/health")[0] == 200
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=20) == 0, server.log.read_text()
    finally:
        server.stop()


@pytest.mark.slow  # tiny_export and mtkit processes
def test_a_fifo_or_dev_zero_in_place_of_a_graph_is_one_line(tiny_export, tmp_path):
    """A FIFO would block ONNX Runtime's open forever, /dev/zero never end: each is refused as not a regular
    file, in one subprocess bounded in time (a hang fails it)."""
    import shutil

    cases = []
    for graph in ("encoder.onnx", "decoder_step.onnx"):
        for kind in ("fifo", "zero"):
            folder = Path(shutil.copytree(tiny_export, tmp_path / f"{kind}-{graph}"))
            (folder / graph).unlink()
            os.mkfifo(folder / graph) if kind == "fifo" else os.symlink("/dev/zero", folder / graph)
            cases.append(folder / graph)
    code = ("import sys\nfrom mtkit.errors import MtkitError\nfrom mtkit.engines.onnx_engine import OnnxModel\n"
            "for path in sys.argv[1:]:\n    try:\n        OnnxModel(path.rsplit('/', 1)[0])\n"
            "    except MtkitError as e:\n        print(e)\n    else:\n        print('loaded')\n")
    done = subprocess.run([sys.executable, "-c", code, *map(str, cases)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{path}: not a regular file" for path in cases]


@pytest.mark.slow  # tiny_export (an ONNX export, ~10 s of CPU)
def test_the_onnx_engine_sets_torchs_threads_as_its_sessions(tiny_export):
    """threads=1: ONNX Runtime's sessions (intra and inter-op) and torch, which runs the search, all one
    thread, also in a thread that translates."""
    import threading

    from mtkit.engines.onnx_engine import OnnxEngine, exported_decode

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        engine = OnnxEngine(tiny_export, exported_decode(tiny_export), threads=1)
        assert torch.get_num_threads() == 1
        for session in (engine.model.encoder, engine.model.step):
            options = session.get_session_options()
            assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 1)
        seen = []

        def translate():
            torch.set_num_threads(2)
            engine.translate_text(["one two"])
            seen.append(torch.get_num_threads())

        worker = threading.Thread(target=translate)
        worker.start()
        worker.join(timeout=120)
        assert seen == [1]
    finally:
        torch.set_num_threads(before)


def test_translate_and_evaluate_help_name_onnx_exports():
    """``-m``'s help names the ONNX folders --engine onnx takes; evaluate has --engine too."""
    for command in ("translate", "evaluate"):
        done = mtkit_cli(command, "-h")
        assert done.returncode == 0, done.stderr
        text = " ".join(done.stdout.replace("│", " ").split())
        model_help = text[text.index("-m, --model"): text.index("-m, --model") + 400]
        assert "--engine" in model_help, model_help
        assert "--engine <str> What runs --model" in text or command == "translate"
    assert "with --engine onnx, a folder mtkit export onnx wrote" in " ".join(
        mtkit_cli("translate", "-h").stdout.replace("│", " ").split())


@pytest.mark.slow
def test_evaluate_scores_an_onnx_export_with_engine_onnx(tiny_export, tmp_path):
    """``evaluate -m EXPORT`` says to add --engine onnx, and with it translates as the ONNX engine does."""
    from mtkit.engines.onnx_engine import OnnxEngine, exported_decode

    lines = ["one two", "three four five", "six"]
    (tmp_path / "src.txt").write_text("".join(line + "\n" for line in lines))
    (tmp_path / "ref.txt").write_text("one two\nthree four five\nsix\n")
    args = ["evaluate", "-m", str(tiny_export), "--src", str(tmp_path / "src.txt"), "--ref", str(tmp_path / "ref.txt")]
    done = mtkit_cli(*args)
    assert done.returncode == 1 and done.stderr.splitlines()[-1].endswith("(this is an ONNX export: add --engine onnx)")
    done = mtkit_cli(*args, "--engine", "onnx", "--hyp-out", str(tmp_path / "hyp.txt"), "--json")
    assert done.returncode == 0, done.stderr
    assert "(ONNX Runtime" in done.stderr
    want = [t.best.text for t in translate_lines(OnnxEngine(tiny_export, exported_decode(tiny_export)), lines)]
    assert (tmp_path / "hyp.txt").read_text().splitlines() == want


@pytest.mark.slow
def test_export_onnx_says_each_stage_on_stderr(tiny_export_said):
    """Tracing takes tens of seconds: each stage is a line on stderr as it starts."""
    _, done = tiny_export_said
    said = done.stderr.splitlines()
    assert said[0].startswith("loaded ") and said[-1].startswith("exported ")
    assert [line.split(" (")[0] for line in said[1:-2]] == [
        "tracing the encoder graph", "tracing the decoding step graph",
        "checking the graphs in ONNX Runtime against mtkit's logits"], said
    assert said[-2].startswith("ONNX graphs checked against mtkit: largest logit difference ")
