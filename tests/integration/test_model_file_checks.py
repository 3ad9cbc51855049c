"""Model files whose config disagrees with their tensors are refused before a model is built.

A Marian folder's ``config.json`` and an mtkit checkpoint's stored ``config`` say how large a model to
build; the tensors say how large it is. ``encoder_layers: 100000000`` over a one-layer file used to
allocate until the machine ran out of memory. Each case here is the real ``mtkit`` CLI in a process under
an address-space limit (:data:`MEMORY_LIMIT`, which torch's import survives and no such model fits in):
exit code 1, one ``error:`` line naming the key, no traceback, nothing written. The Marian folders' cases
are imported one after another by the CLI's entry point in one such process (:func:`run_each`).

The folders are made by hand, tensor by tensor, in the layout ``MarianMTModel.save_pretrained`` writes
(:func:`test_the_handmade_folder_has_the_huggingface_layout` checks that against transformers where it is
installed), so that the table of tests/integration/test_bad_inputs.py can use them too
(:func:`bad_model_cases`).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import fast_first

MEMORY_LIMIT = 3 << 30  # bytes of address space: `import torch` takes about 0.6 GiB here
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MTKIT_DEBUG": "", "CUDA_VISIBLE_DEVICES": ""}
HUGE = 100_000_000
# A tiny Marian model: V pieces (</s> 0, <unk> 1, ..., <pad> V-1), one layer on each side.
V, D_MODEL, FFN, HEADS, POSITIONS = 12, 8, 16, 2, 32


def marian_config(**overrides) -> dict:
    config = {"model_type": "marian", "architectures": ["MarianMTModel"], "vocab_size": V, "decoder_vocab_size": V,
              "d_model": D_MODEL, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": HEADS,
              "decoder_attention_heads": HEADS, "encoder_ffn_dim": FFN, "decoder_ffn_dim": FFN,
              "max_position_embeddings": POSITIONS, "activation_function": "swish", "scale_embedding": True,
              "pad_token_id": V - 1, "eos_token_id": 0, "decoder_start_token_id": V - 1, "forced_eos_token_id": 0,
              "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True, "dropout": 0.0}
    config.update(overrides)
    return config


def marian_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """The tensors of a one-layer MarianMTModel by Hugging Face's names (as save_pretrained keeps them:
    the shared embeddings once, no position table)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.1

    t = {"final_logits_bias": r(1, V), "model.shared.weight": r(V, D_MODEL)}
    for side in ("encoder", "decoder"):
        p = f"model.{side}.layers.0"
        attentions = ["self_attn"] + (["encoder_attn"] if side == "decoder" else [])
        for a in attentions:
            for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                t[f"{p}.{a}.{proj}.weight"], t[f"{p}.{a}.{proj}.bias"] = r(D_MODEL, D_MODEL), r(D_MODEL)
            t[f"{p}.{a}_layer_norm.weight"], t[f"{p}.{a}_layer_norm.bias"] = 1 + r(D_MODEL), r(D_MODEL)
        t[f"{p}.fc1.weight"], t[f"{p}.fc1.bias"] = r(FFN, D_MODEL), r(FFN)
        t[f"{p}.fc2.weight"], t[f"{p}.fc2.bias"] = r(D_MODEL, FFN), r(D_MODEL)
        t[f"{p}.final_layer_norm.weight"], t[f"{p}.final_layer_norm.bias"] = 1 + r(D_MODEL), r(D_MODEL)
    return t


def write_marian(folder: Path, config: dict | None = None, generation: dict | None = None) -> Path:
    """A Marian folder with a one-layer model.safetensors and the given config.json / generation_config.json
    (the SentencePiece files are placeholders: every check here comes before they are read)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(marian_config() if config is None else config))
    (folder / "generation_config.json").write_text(json.dumps(
        {"num_beams": 4, "max_length": 20, "bad_words_ids": [[V - 1]], "forced_eos_token_id": 0,
         "eos_token_id": 0, "pad_token_id": V - 1, "decoder_start_token_id": V - 1, "renormalize_logits": True}
        if generation is None else generation))
    save_file(marian_tensors(), str(folder / "model.safetensors"), metadata={"format": "pt"})
    pieces = ["</s>", "<unk>", *(f"▁w{i}" for i in range(V - 3)), "<pad>"]
    (folder / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))
    for name in ("source.spm", "target.spm"):
        (folder / name).write_bytes(b"not read before the checks")
    return folder


# name -> (config.json overrides, generation_config.json overrides, the key the error names)
MARIAN_CASES = {
    "encoder_layers": ({"encoder_layers": HUGE}, {},
                       "encoder_layers is 100000000 but model.safetensors has 1 encoder layer"),
    "decoder_layers": ({"decoder_layers": HUGE}, {},
                       "decoder_layers is 100000000 but model.safetensors has 1 decoder layer"),
    "ffn_dim": ({"encoder_ffn_dim": HUGE, "decoder_ffn_dim": HUGE}, {}, "encoder_ffn_dim is 100000000"),
    "d_model": ({"d_model": HUGE}, {}, "d_model is 100000000"),
    "vocab_size": ({"vocab_size": 10 * HUGE, "decoder_vocab_size": 10 * HUGE}, {}, "vocab_size is 1000000000"),
    "max_position_embeddings": ({"max_position_embeddings": HUGE}, {}, "max_position_embeddings is 100000000"),
    "heads do not divide d_model": ({"encoder_attention_heads": 3, "decoder_attention_heads": 3}, {},
                                    "encoder_attention_heads (3) must divide d_model (8)"),
    "num_beams a string": ({}, {"num_beams": "4"}, "generation_config.json: num_beams must be an integer, got '4'"),
    "max_length a string": ({}, {"max_length": "20"}, "generation_config.json: max_length must be an integer"),
    "length_penalty a string": ({}, {"length_penalty": "1.0"},
                                "generation_config.json: length_penalty must be a number"),
    "renormalize_logits a string": ({}, {"renormalize_logits": "yes"}, "renormalize_logits must be true or false"),
    "early_stopping a number": ({}, {"early_stopping": 3}, "early_stopping must be one of"),
    "pad_token_id a list": ({"pad_token_id": [V - 1]}, {}, "config.json: pad_token_id must be an integer"),
    "scale_embedding a string": ({"scale_embedding": "true"}, {}, "config.json: scale_embedding must be true or false"),
    "dropout a string": ({"dropout": "0.1"}, {}, "config.json: dropout must be a number"),
    "encoder_layers a float": ({"encoder_layers": 1.0}, {}, "config.json: encoder_layers must be an integer"),
}


def spoiled_marian(folder: Path, config: dict, generation: dict) -> Path:
    base_generation = {"num_beams": 4, "max_length": 20, "forced_eos_token_id": 0, "eos_token_id": 0,
                       "pad_token_id": V - 1, "decoder_start_token_id": V - 1}
    return write_marian(folder, marian_config(**config), {**base_generation, **generation})


def tiny_checkpoint(path: Path, positions: str = "sinusoidal", **model_overrides) -> Path:
    """An mtkit checkpoint of a one-layer model whose stored config then says ``model_overrides``."""
    from mtkit.checkpoints.io import CHECKPOINT_FORMAT
    from mtkit.config import config_from_dict, config_to_dict
    from mtkit.model import Transformer

    model = {"d_model": 8, "h": 2, "d_ff": 16, "encoder_layers": 1, "decoder_layers": 1, "max_positions": 32,
             "positions": positions}
    config = config_from_dict({"model": model})
    torch.manual_seed(0)
    state = Transformer(config.model, 12, 12).state_dict()
    stored = config_to_dict(config)
    src_size = model_overrides.pop("src_vocab_size", 12)
    stored["model"].update(model_overrides)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format_version": CHECKPOINT_FORMAT, "config": stored, "model": state,
                "vocab": {"src": b"not read before the checks", "tgt": None}, "src_vocab_size": src_size,
                "tgt_vocab_size": 12, "step": 1}, path)
    return path


# name -> (checkpoint options, the fragment the error names)
CHECKPOINT_CASES = {
    "encoder_layers": ({"encoder_layers": HUGE},
                       "model.encoder_layers is 100000000 but its weights have 1 encoder layer"),
    "decoder_layers": ({"decoder_layers": HUGE},
                       "model.decoder_layers is 100000000 but its weights have 1 decoder layer"),
    "d_ff": ({"d_ff": HUGE}, "model.d_ff is 100000000"),
    "d_model": ({"d_model": HUGE}, "model.d_model is 100000000"),
    "h does not divide d_model": ({"h": 3}, "model.h"),
    "max_positions sinusoidal": ({"max_positions": HUGE}, "model.max_positions is 100000000"),
    "max_positions learned": ({"positions": "learned", "max_positions": HUGE}, "model.max_positions is 100000000"),
    "src_vocab_size": ({"src_vocab_size": 10 * HUGE}, "src_vocab_size is 1000000000"),
    "src_vocab_size a string": ({"src_vocab_size": "12"}, "src_vocab_size must be a positive integer"),
}


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_limited(*args: str, stdin: str = "") -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "mtkit", *map(str, args)], capture_output=True, text=True, env=ENV,
                       input=stdin, timeout=300, preexec_fn=_limited, check=False)
    return r, time.monotonic() - start


def assert_one_error(r: subprocess.CompletedProcess, fragment: str) -> str:
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert len(errors) == 1, r.stderr
    assert fragment in errors[0], errors[0]
    return errors[0]


@pytest.mark.slow  # mtkit processes under a memory limit
def test_the_memory_limit_leaves_room_for_a_good_import(tmp_path):
    """The limit is no cause of the failures below: a good folder imports under it and translates."""
    pytest.importorskip("safetensors")
    folder = write_marian(tmp_path / "hf")
    # Only the placeholder SentencePiece files are wrong: the import gets past every check to them.
    r, _ = run_limited("import", "marian", folder, "-o", tmp_path / "run")
    assert_one_error(r, "source.spm")
    ckpt = tiny_checkpoint(tmp_path / "good.pt")
    from mtkit.checkpoints.io import checkpoint_config, load_checkpoint

    checkpoint_config(load_checkpoint(ckpt), ckpt)  # a checkpoint whose config fits passes the check


# `mtkit ARGS` of each case in turn, through the CLI's entry point, in one process (under the limit).
RUN_EACH = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from inprocess import run_mtkit
said = {}
for name, args, stdin in json.loads(sys.argv[2]):
    start = time.monotonic()
    done = run_mtkit(*args, stdin=stdin)
    said[name] = [done.returncode, done.stdout, done.stderr, time.monotonic() - start]
print(json.dumps(said))
"""


@pytest.fixture(scope="module")
def marian_imports(request, tmp_path_factory) -> dict:
    """name -> (the CompletedProcess of `mtkit import marian` of the case's spoiled folder, its seconds, the output
    folder it was told to write), for the cases of MARIAN_CASES this session runs: all in ONE process under the
    memory limit (an mtkit process per case spent most of its time importing torch and transformers)."""
    pytest.importorskip("safetensors")
    names = [item.callspec.params["name"] for item in request.session.items
             if getattr(item, "originalname", None) == "test_import_marian_refuses_a_config_its_weights_disagree_with"]
    root = tmp_path_factory.mktemp("marian-imports")
    cases = []
    for k, name in enumerate(names):
        config, generation, _ = MARIAN_CASES[name]
        cases.append((name, spoiled_marian(root / f"{k}" / "hf", config, generation), root / f"{k}" / "run"))
    said = import_each(cases)
    return {name: (*said[name], out) for name, _, out in cases}


def import_each(cases: list[tuple[str, Path, Path]]) -> dict[str, tuple[subprocess.CompletedProcess, float]]:
    """name -> (what `mtkit import marian FOLDER -o OUT` gave, its seconds) for each (name, FOLDER, OUT) of
    ``cases``, imported one after another by the CLI's entry point in ONE process under the memory limit."""
    return run_each([(name, ["import", "marian", folder, "-o", out], None) for name, folder, out in cases])


def run_each(cases: list[tuple[str, list, str | None]], env: dict | None = None,
             ) -> dict[str, tuple[subprocess.CompletedProcess, float]]:
    """name -> (what `mtkit ARGS` gave with STDIN as its standard input, its seconds) for each (name, ARGS, STDIN)
    of ``cases``, run one after another by the CLI's entry point (tests/integration/inprocess.py) in ONE process
    under the memory limit, with ``env`` (default :data:`ENV`); its timeout only guards against a hang."""
    listed = [(name, [str(a) for a in args], stdin) for name, args, stdin in cases]
    done = subprocess.run([sys.executable, "-c", RUN_EACH, str(Path(__file__).parent), json.dumps(listed)],
                          capture_output=True, text=True, env=ENV if env is None else env, timeout=600,
                          preexec_fn=_limited, check=False)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.splitlines()[-1])
    return {name: (subprocess.CompletedProcess(["mtkit", *args], *said[name][:3]), said[name][3])
            for name, args, _ in listed}


@pytest.mark.parametrize("name", fast_first(MARIAN_CASES))
def test_import_marian_refuses_a_config_its_weights_disagree_with(marian_imports, name):
    r, seconds, out = marian_imports[name]
    line = assert_one_error(r, MARIAN_CASES[name][2])
    print(f"{name}: {seconds:.2f} s: {line}")
    assert not out.exists()


@pytest.mark.slow  # an mtkit process that reads torch's pickle (fast: the safetensors cases)
def test_a_pytorch_model_bin_is_checked_as_well(tmp_path):
    pytest.importorskip("safetensors")
    folder = spoiled_marian(tmp_path / "hf", {"encoder_layers": HUGE}, {})
    torch.save(marian_tensors(), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    r, _ = run_limited("import", "marian", folder, "-o", tmp_path / "run")
    assert_one_error(r, "encoder_layers is 100000000 but pytorch_model.bin has 1 encoder layer")


@pytest.mark.parametrize("name", fast_first(CHECKPOINT_CASES, 2))  # each case: an mtkit process
def test_a_checkpoint_whose_config_disagrees_with_its_tensors_is_refused(tmp_path, name):
    options, fragment = CHECKPOINT_CASES[name]
    ckpt = tiny_checkpoint(tmp_path / "model.pt", **options)
    r, seconds = run_limited("translate", "-m", ckpt, stdin="w1 w2\n")
    line = assert_one_error(r, fragment)
    print(f"{name}: {seconds:.2f} s: {line}")
    assert str(ckpt) in line


@pytest.mark.parametrize("name", fast_first(CHECKPOINT_CASES, 2))  # each case: an mtkit process
def test_a_checkpoint_whose_config_disagrees_is_refused_before_torch_is_imported(tmp_path, name):
    """The precheck reads the checkpoint's pickle without torch and without running its code (only
    containers and shapes are built), so a file that cannot be loaded fails before torch's own import."""
    options, fragment = CHECKPOINT_CASES[name]
    ckpt = tiny_checkpoint(tmp_path / "model.pt", **options)
    code = ("import sys\nfrom mtkit.errors import MtkitError\nfrom mtkit.checkpoints.io import precheck\n"
            f"try:\n    precheck({str(ckpt)!r})\nexcept MtkitError as e:\n    print(e)\n"
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120,
                       preexec_fn=_limited, check=False)
    assert r.returncode == 0, r.stderr
    message, torch_loaded = r.stdout.strip().splitlines()
    assert fragment in message and str(ckpt) in message and torch_loaded == "False", r.stdout


def test_the_precheck_reads_the_shapes_torch_loads_and_passes_a_good_checkpoint(tmp_path):
    from mtkit.checkpoints.io import _payload_without_torch, load_checkpoint, precheck

    ckpt = tiny_checkpoint(tmp_path / "model.pt")
    precheck(ckpt)  # no error
    cheap, real = _payload_without_torch(ckpt), load_checkpoint(ckpt)
    assert {k: tuple(v) for k, v in cheap["model"].items()} == {k: tuple(v.shape) for k, v in real["model"].items()}
    assert cheap["config"] == real["config"] and cheap["src_vocab_size"] == real["src_vocab_size"]
    assert cheap["vocab"] == real["vocab"]  # protocol 2's bytes (_codecs.encode) read as bytes
    from mtkit.errors import MtkitError

    with pytest.raises(MtkitError, match="nothing.pt: no such checkpoint$"):
        _payload_without_torch(tmp_path / "nothing.pt")
    (tmp_path / "text.pt").write_text("not a zip")  # what torch.load would be left to decide is refused
    with pytest.raises(MtkitError, match=r"text.pt: not a readable mtkit checkpoint \(not a zip archive"):
        _payload_without_torch(tmp_path / "text.pt")


def test_the_handmade_folder_has_the_huggingface_layout(tmp_path):
    """What save_pretrained writes for the same config: the same tensor names and shapes."""
    transformers = pytest.importorskip("transformers")
    from mtkit.importers.marian import _safetensors_shapes

    config = {k: v for k, v in marian_config().items() if k not in ("model_type", "architectures")}
    transformers.MarianMTModel(transformers.MarianConfig(**config)).save_pretrained(tmp_path / "theirs")
    ours = write_marian(tmp_path / "ours")
    assert (_safetensors_shapes(ours / "model.safetensors")
            == _safetensors_shapes(tmp_path / "theirs" / "model.safetensors"))


def bad_model_cases(d: dict) -> dict[str, tuple[list[str], str]]:
    """Cases for the table of tests/integration/test_bad_inputs.py (its ``d``: ``tmp`` a directory to
    write in, made only when it exists: the table is also built with placeholder paths)."""
    tmp = Path(d["tmp"]) / "model-file-checks"
    folders = {"layers": ({"encoder_layers": HUGE}, {}), "beams": ({}, {"num_beams": "4"})}
    checkpoint = tmp / "layers.pt"
    if Path(d["tmp"]).is_dir() and not tmp.exists():
        for name, (config, generation) in folders.items():
            spoiled_marian(tmp / name, config, generation)
        tiny_checkpoint(checkpoint, decoder_layers=HUGE)
    return {
        "import: encoder_layers the weights do not have": (
            ["import", "marian", str(tmp / "layers"), "-o", str(tmp / "out1")], "encoder_layers is 100000000"),
        "import: num_beams a string": (
            ["import", "marian", str(tmp / "beams"), "-o", str(tmp / "out2")], "num_beams must be an integer"),
        "translate: checkpoint config with layers its tensors lack": (
            ["translate", "-m", str(checkpoint), str(tmp / "layers" / "vocab.json")], "model.decoder_layers"),
    }
