"""Files and settings from a stranger cost work bounded by their size, and each bad one is one error line.

Each case is the real ``mtkit`` CLI in a process under an address-space limit (test_model_file_checks'
:data:`MEMORY_LIMIT`), as a stranger would run it (issue 48, item 8): JSON nested 200,000 deep in a Marian
folder, a safetensors header or an export's ``mtkit.json`` (a RecursionError traceback before); 3 GB
config, vocabulary, manifest and SentencePiece files (read whole before: a MemoryError), made sparse so
that the tests write nothing of that size; a FIFO or ``/dev/zero`` in place of a file (a hang, or a read
until memory ran out); a beam of 10^9 from a flag, an import or a manifest; closed standard streams;
invalid UTF-8 given to ``translate`` and ``score``; write errors that named a temporary; and an exported
model given to ``translate`` without ``--engine ctranslate2``. The spoiled Marian folders are imported one
after another by the CLI's entry point in one such process (:func:`test_model_file_checks.import_each`); invalid
UTF-8 in a named file is read by the CLI in this process (only standard input needs a process of its own).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import fast_first, write_tiny_checkpoint
from inprocess import run_mtkit
from test_model_file_checks import ENV, MEMORY_LIMIT, assert_one_error, import_each, write_marian

DEEP = 200_000
HUGE_FILE = 3 << 30  # bytes: the 3 GB files, sparse (no block of them is written)
MTKIT = [sys.executable, "-m", "mtkit"]


def deep_json(depth: int = DEEP) -> str:
    return '{"a": ' + "[" * depth + "]" * depth + "}"


def sparse(path: Path, size: int = HUGE_FILE, head: bytes = b"{") -> Path:
    """A file of ``size`` bytes of which only ``head`` is written (the rest is a hole)."""
    path.unlink(missing_ok=True)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def mtkit(*args, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """The CLI under the address-space limit; ``timeout``: generous, only for a hang."""
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    preexec = kwargs.pop("preexec_fn", None)

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
        if preexec is not None:
            preexec()

    return subprocess.run([*MTKIT, *map(str, args)], capture_output=True, text=True, env=ENV, timeout=timeout,
                          preexec_fn=limited, check=False, **kwargs)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny untrained mtkit checkpoint with a real SentencePiece model (its outputs do not matter here)."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny.pt")


@pytest.fixture(scope="module")
def exported(checkpoint, tmp_path_factory) -> Path:
    """``checkpoint`` exported to CTranslate2 by the CLI (a pristine copy: tests spoil copies of it)."""
    pytest.importorskip("ctranslate2")
    out = tmp_path_factory.mktemp("export") / "ct2"
    r = run_mtkit("export", "ctranslate2", checkpoint, out)  # in this process: a good model, the tests' subject after
    assert r.returncode == 0, r.stderr
    return out


def copy_dir(source: Path, target: Path) -> Path:
    target.mkdir(parents=True)
    for f in source.iterdir():
        (target / f.name).write_bytes(f.read_bytes())
    return target


# ------------------------------------------------------------------ deep, huge and special model files


def _deep_json_folder(folder: Path, name: str) -> Path:
    write_marian(folder)
    (folder / name).write_text(deep_json())
    return folder


def _deep_header_folder(folder: Path) -> Path:
    write_marian(folder)
    header = deep_json().encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    return folder


def _huge_file_folder(folder: Path, name: str, what: str) -> Path:
    write_marian(folder)
    sparse(folder / name)
    return folder


def _special_file_folder(folder: Path, name: str, special: str) -> Path:
    write_marian(folder)
    (folder / name).unlink()
    if special == "fifo":
        os.mkfifo(folder / name)
    else:
        (folder / name).symlink_to(special)
    return folder


def _generation_folder(folder: Path, generation: dict, fragment: str) -> Path:
    from test_model_file_checks import spoiled_marian

    return spoiled_marian(folder, {}, generation)


# test -> the Marian folder its case imports, from the case's parameters
SPOILED_FOLDERS = {
    "test_json_nested_200000_deep_in_a_marian_folder_is_one_error_line": _deep_json_folder,
    "test_a_safetensors_header_nested_200000_deep_is_one_error_line": _deep_header_folder,
    "test_a_3_gb_file_in_a_marian_folder_is_refused_before_it_is_read": _huge_file_folder,
    "test_a_fifo_or_a_device_in_a_marian_folder_is_not_a_regular_file": _special_file_folder,
    "test_an_imported_num_beams_of_a_billion_is_one_error_line": _generation_folder,
}


@pytest.fixture(scope="module")
def imported(request, tmp_path_factory) -> dict:
    """node id -> (what `mtkit import marian` of the case's spoiled folder gave, the folder, the output folder
    it was told to write), for every case of SPOILED_FOLDERS' tests this session runs: imported one after
    another in ONE process under the memory limit (a process per case spent most of its time importing torch
    and transformers; a FIFO read that hangs still ends at that process's timeout)."""
    root = tmp_path_factory.mktemp("spoiled-marian")
    cases, folders = [], {}
    for k, item in enumerate(i for i in request.session.items if getattr(i, "originalname", None) in SPOILED_FOLDERS):
        params = item.callspec.params if hasattr(item, "callspec") else {}
        folders[item.nodeid] = SPOILED_FOLDERS[item.originalname](root / f"{k}" / "hf", **params), root / f"{k}" / "run"
        cases.append((item.nodeid, *folders[item.nodeid]))
    said = import_each(cases)
    return {nodeid: (said[nodeid][0], *folders[nodeid]) for nodeid in folders}


@pytest.mark.parametrize("name", fast_first(["config.json", "generation_config.json", "vocab.json",
                                             "tokenizer_config.json"]))
def test_json_nested_200000_deep_in_a_marian_folder_is_one_error_line(imported, request, name):
    r, folder, out = imported[request.node.nodeid]
    assert_one_error(r, f"{folder / name}: nested more than 64 levels deep")
    assert not out.exists()


@pytest.mark.slow  # json nested deep keeps the folder's parsers in the fast tier
def test_a_safetensors_header_nested_200000_deep_is_one_error_line(imported, request):
    r, folder, _ = imported[request.node.nodeid]
    assert_one_error(r, f"{folder / 'model.safetensors'}: not readable model weights")


@pytest.mark.parametrize(("name", "what"), fast_first([("config.json", "model config"), ("vocab.json", "vocabulary"),
                                                       ("generation_config.json", "model config"),
                                                       ("source.spm", "SentencePiece model")]))
def test_a_3_gb_file_in_a_marian_folder_is_refused_before_it_is_read(imported, request, name, what):
    """Read whole, each was a MemoryError under the limit (3 GiB of address space for 3 GB)."""
    r, folder, _ = imported[request.node.nodeid]
    assert_one_error(r, f"{folder / name}: larger than a {what} can be (at most ")


@pytest.mark.slow  # a FIFO or a device as the model (test_checkpoint_bounds) is in the fast tier
@pytest.mark.parametrize(("name", "special"), [(n, s) for n in ("config.json", "vocab.json", "source.spm")
                                               for s in ("fifo", "/dev/zero", "/dev/urandom")])
def test_a_fifo_or_a_device_in_a_marian_folder_is_not_a_regular_file(imported, request, name, special):
    """A FIFO hung the read forever (no writer ever comes); a device never ends."""
    r, folder, _ = imported[request.node.nodeid]
    assert_one_error(r, f"{folder / name}: not a regular file")


def test_the_bounded_reader_refuses_each_kind_of_bad_file_in_one_line(tmp_path):
    from mtkit.errors import MtkitError
    from mtkit.io import MAX_JSON_DEPTH, read_bounded, read_json_file

    (tmp_path / "ok.json").write_text('{"a": [1, {"b": 2}]}')
    assert read_json_file(tmp_path / "ok.json", 1000, "config") == {"a": [1, {"b": 2}]}
    (tmp_path / "deep_ok.json").write_text("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)
    read_json_file(tmp_path / "deep_ok.json", 1000, "config")  # the bound itself passes
    (tmp_path / "deeper.json").write_text("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    (tmp_path / "big.json").write_text("[" + "1," * 10_000 + "1]")
    (tmp_path / "digits.json").write_text('{"a": ' + "9" * 5000 + "}")
    (tmp_path / "latin1.json").write_bytes(b'{"a": "\xe9"}')
    (tmp_path / "dir.json").mkdir()
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    cases = {"deeper.json": "nested more than 64 levels deep",
             "big.json": "larger than a config can be (at most 10000 bytes)",
             "digits.json": "not valid JSON", "latin1.json": "not valid UTF-8", "dir.json": "is a directory",
             "fifo.json": "not a regular file", "zero.json": "not a regular file", "missing.json": "no such file"}
    for name, fragment in cases.items():
        with pytest.raises(MtkitError) as e:
            read_json_file(tmp_path / name, 10_000, "config")
        message = str(e.value)
        assert message.startswith(f"{tmp_path / name}: ") and fragment in message and "\n" not in message, message
        assert len(message) < 300, message
    with pytest.raises(MtkitError, match="larger than a SentencePiece model can be"):
        read_bounded(sparse(tmp_path / "huge.spm"), 1 << 20, "SentencePiece model")


@pytest.mark.parametrize("spoil", ["huge", *fast_first(["fifo", "beam", "deep"], 0)])  # each: an mtkit process
def test_an_exported_models_mtkit_json_is_checked_in_bounded_work(exported, tmp_path, spoil):
    out = copy_dir(exported, tmp_path / "ct2")
    manifest = out / "mtkit.json"
    fragment = {"deep": "nested more than 64 levels deep", "huge": "larger than a model manifest can be",
                "fifo": None, "beam": "decode.beam: must be at most 1024, got 1000000000"}[spoil]
    if spoil == "deep":
        manifest.write_text(deep_json())
    elif spoil == "huge":
        sparse(manifest)
    elif spoil == "fifo":
        manifest.unlink()
        os.mkfifo(manifest)  # not a regular file: taken as absent (as for a model exported by other tools)
    else:
        data = json.loads(manifest.read_text())
        data["decode"]["beam"] = 10**9
        manifest.write_text(json.dumps(data))
    r = mtkit("translate", "--engine", "ctranslate2", "-m", out, input="five\n", stdin=None)
    if fragment is None:
        assert r.returncode == 0 and r.stdout.count("\n") == 1, r.stderr
    else:
        assert_one_error(r, f"{manifest}: {fragment}")


def test_an_exported_models_sentencepiece_file_is_read_bounded(exported, tmp_path):
    out = copy_dir(exported, tmp_path / "ct2")
    sparse(out / "spm.model")
    r = mtkit("translate", "--engine", "ctranslate2", "-m", out, input="five\n", stdin=None)
    assert_one_error(r, f"{out / 'spm.model'}: larger than a SentencePiece model can be")


def test_recipes_are_read_bounded_in_size_depth_and_aliases(tmp_path):
    from mtkit.config import load_config
    from mtkit.errors import MtkitError

    (tmp_path / "deep.yaml").write_text("decode: " + "[" * DEEP + "]" * DEEP + "\n")
    sparse(tmp_path / "huge.yaml", head=b"decode:\n")
    (tmp_path / "digits.yaml").write_text("decode:\n  beam: " + "1" * 10_000 + "\n")
    # "Billion laughs": 9 levels of 9 aliases each, 9^9 strings if anything walked it as a tree.
    laughs = ['l0: &l0 ["ha", "ha", "ha", "ha", "ha", "ha", "ha", "ha", "ha"]']
    laughs += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]
    (tmp_path / "laughs.yaml").write_text("expected:\n  " + "\n  ".join(laughs) + "\ndecode:\n  beam: *l9\n")
    (tmp_path / "laughs_value.yaml").write_text("decode:\n  beam: &b [*b]\n")  # a list holding itself
    # Aliases chained 40 levels at a time: each alias shallow where it is defined, 400 deep in all (a
    # recursive copy of it would reach Python's recursion limit).
    chain = ["c0: &c0 " + "[" * 40 + "]" * 40]
    chain += [f"c{i}: &c{i} " + "[" * 40 + f"*c{i - 1}" + "]" * 40 for i in range(1, 10)]
    (tmp_path / "chained.yaml").write_text("\n".join(chain) + "\n")
    cases = {"deep.yaml": "nested too deep", "huge.yaml": "larger than a YAML recipe can be",
             "digits.yaml": "decode.beam: expected an integer, got '111",
             "laughs.yaml": "expected.l0: unknown config key", "chained.yaml": "nested more than 64 levels deep",
             "laughs_value.yaml": "nested more than 64 levels deep"}
    for name, fragment in cases.items():
        with pytest.raises(MtkitError) as e:
            load_config(tmp_path / name)
        message = str(e.value)
        assert fragment in message and "\n" not in message and len(message) < 400, message


def test_a_prepared_directorys_manifest_and_piece_table_are_read_bounded(tmp_path):
    from mtkit.data.store import load_manifest
    from mtkit.data.vocab import _read_pieces
    from mtkit.errors import MtkitError

    (tmp_path / "manifest.json").write_text(deep_json())
    with pytest.raises(MtkitError, match="manifest.json: nested more than 64 levels deep"):
        load_manifest(tmp_path)
    sparse(tmp_path / "manifest.json")
    with pytest.raises(MtkitError, match="manifest.json: larger than a data manifest can be"):
        load_manifest(tmp_path)
    sparse(tmp_path / "pieces.json")
    with pytest.raises(MtkitError, match="pieces.json: larger than a piece table can be"):
        _read_pieces(tmp_path / "pieces.json")


def test_values_in_messages_are_bounded(tmp_path):
    """A huge integer or a deep list from a file is quoted through reprlib: a short line, not a traceback
    (Python refuses to print an integer of more than 4300 digits)."""
    from mtkit.config import config_from_dict
    from mtkit.errors import MtkitError, shown

    deep: list = []
    for _ in range(DEEP):
        deep = [deep]
    assert len(shown(deep)) < 100 and len(shown(10**6000)) < 100 and len(shown("x" * 10**6)) < 100
    for value in (10**6000, deep, "x" * 10**6):
        with pytest.raises(MtkitError) as e:
            config_from_dict({"decode": {"alpha": value}})
        assert len(str(e.value)) < 200, str(e.value)[:300]


# ------------------------------------------------------------------ every setting has a maximum


def test_every_integer_setting_has_a_maximum():
    """Each integer key of the config at 10^12 is refused by the config's own check, which every path
    that builds a config runs (flags, recipes, checkpoints, imports, manifests). The model's sizes are
    the exception: each is checked against the tensors that a file holds (mtkit.checkpoints.io's precheck,
    the Marian import, an export's model.bin), which bound them by the file's size."""
    import dataclasses
    import typing

    from mtkit.config import Config, ConfigError, config_from_dict, config_to_dict

    shapes_checked_by_tensors = {"model.d_model", "model.h", "model.d_ff", "model.encoder_layers",
                                 "model.decoder_layers", "model.max_positions"}
    sections = {"data.train": {"kind": "demo"}, "data.valid": {"kind": "demo"}, "data.test": {"kind": "demo"}}
    checked = []

    def walk(cls, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f"{prefix}.{f.name}" if prefix else f.name
            tp = hints[f.name]
            # Optional sections (data.train); not data.pairs, whose sources go through the same check
            inner = [a for a in typing.get_args(tp)
                     if dataclasses.is_dataclass(a) and typing.get_origin(tp) is not tuple]
            if dataclasses.is_dataclass(tp) or inner:
                walk(tp if dataclasses.is_dataclass(tp) else inner[0], key)
            elif tp is int and key not in shapes_checked_by_tensors:
                checked.append(key)

    walk(Config, "")
    assert len(checked) >= 30
    for key in checked:
        raw = config_to_dict(Config())
        for section, value in sections.items():  # optional sections, present so that their keys count
            outer, inner = section.split(".")
            raw[outer][inner] = dict(value)
        raw["data"]["clean"]["filters"] = {"repeats": {}, "copy": {}, "langid": {},  # every filter with a setting
                                           "dual_xent": {"forward": "f", "backward": "b"}}
        node = raw
        *path, last = key.split(".")
        for part in path:
            node = node[part]
        node[last] = 10**12
        with pytest.raises(ConfigError) as e:
            config_from_dict(raw)
        message = str(e.value)
        assert e.value.key == key and ("at most" in message or "between" in message), (key, message)


def test_a_beam_of_a_billion_from_a_flag_is_one_error_line(checkpoint):
    for flags, fragment in ((["--beam", "1000000000"], "--beam: must be at most 1024, got 1000000000"),
                            (["--sampling", "--nbest", "1000000000"], "--nbest: must be at most 1024"),
                            (["--max-len-b", "1000000000"], "--max-len-b: must be at most 65536")):
        r = mtkit("translate", "-m", checkpoint, *flags, input="five\n", stdin=None)
        assert_one_error(r, fragment)


def test_a_beam_of_a_billion_in_a_checkpoint_is_one_error_line(checkpoint, tmp_path):
    payload = torch.load(checkpoint, weights_only=False)
    payload["config"]["decode"]["beam"] = 10**9
    torch.save(payload, tmp_path / "beam.pt")
    r = mtkit("translate", "-m", tmp_path / "beam.pt", input="five\n", stdin=None)
    assert_one_error(r, "decode.beam: must be at most 1024, got 1000000000")


# The same bound from a flag and in a checkpoint (above) are in the fast tier.
@pytest.mark.parametrize(("generation", "fragment"), fast_first([
    ({"num_beams": 10**9}, "generation_config.json: num_beams: must be at most 1024, got 1000000000"),
    ({"max_new_tokens": 10**9}, "generation_config.json: max_new_tokens: must be at most 65536"),
    ({"no_repeat_ngram_size": 10**9}, "generation_config.json: no_repeat_ngram_size: must be at most 65536"),
], keep=0))
def test_an_imported_num_beams_of_a_billion_is_one_error_line(imported, request, generation, fragment):
    r, _, _ = imported[request.node.nodeid]
    assert_one_error(r, fragment)


# ------------------------------------------------------------------ closed standard streams


def _close(fd: int):
    return lambda: os.close(fd)


@pytest.mark.slow  # mtkit processes started with a standard stream closed
def test_translate_and_score_with_a_closed_standard_stream_say_so(checkpoint, tmp_path):
    """With descriptor 0 (or 1) closed when Python starts, sys.stdin (sys.stdout) is None: an
    AttributeError traceback before."""
    src = tmp_path / "src.txt"
    src.write_text("five\n")
    cases = [
        (["translate", "-m", checkpoint], 0, "standard input is closed"),
        (["translate", "-m", checkpoint, src], 1, "standard output is closed"),
        (["score", "-m", checkpoint, "--src", "-", "--tgt", src], 0, "standard input is closed"),
        (["score", "-m", checkpoint, "--src", src, "--tgt", src], 1, "standard output is closed"),
        (["evaluate", "--hyp", "-", "--ref", src], 0, "standard input is closed"),
    ]
    for args, fd, fragment in cases:
        r = mtkit(*args, preexec_fn=_close(fd))
        assert_one_error(r, fragment)


# ------------------------------------------------------------------ invalid UTF-8


@pytest.mark.slow  # mtkit processes that load the model (fast: test_translator's read_text_lines cases)
def test_invalid_utf8_given_to_translate_or_score_names_the_input_and_line(checkpoint, tmp_path):
    """It silently became U+FFFD; prepare and evaluate refused it with file and line, and now these too."""
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"five\nsix \xff seven\n")
    good = tmp_path / "good.txt"
    good.write_text("five\nsix\n")
    raw = bad.read_bytes().decode("latin-1")
    cases = [
        (["translate", "-m", checkpoint, bad], None, f"{bad}: line 2: invalid UTF-8 (byte 5 of the line)"),
        (["translate", "-m", checkpoint], raw, "<stdin>: line 2: invalid UTF-8 (byte 5 of the line)"),
        (["translate", "-m", checkpoint, "-o", tmp_path / "out.txt", bad], None, f"{bad}: line 2: invalid UTF-8"),
        (["score", "-m", checkpoint, "--src", bad, "--tgt", good], None, f"{bad}: line 2: invalid UTF-8"),
        (["score", "-m", checkpoint, "--src", good, "--tgt", "-"], raw, "<stdin>: line 2: invalid UTF-8"),
    ]
    for args, stdin, fragment in cases:
        if stdin is None:  # a file: what the command reads and says (in this process; no limit is the point here)
            r = run_mtkit(*args)
        else:  # standard input as a process has it: bytes decoded by mtkit, not by a test harness
            r = subprocess.run([*MTKIT, *map(str, args)], input=stdin.encode("latin-1"), capture_output=True,
                               env=ENV, timeout=120, check=False)
            r = subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(), r.stderr.decode())
        assert_one_error(r, fragment)
    assert not (tmp_path / "out.txt").exists()


# ------------------------------------------------------------------ write errors name the user's path


def _file_size_limit(limit: int):
    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return limited


def _unwritable(tmp_path: Path) -> Path:
    """A folder this process cannot create anything in: a read-only one, or, for root (whom mode bits do
    not stop), /sys, where even root cannot create a directory."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    if not Path("/sys").is_dir() or os.access("/sys", os.W_OK) and _can_mkdir(Path("/sys")):
        pytest.skip("no folder here that root cannot write in")
    return Path("/sys")


def _can_mkdir(folder: Path) -> bool:
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(dir=folder))
    except OSError:
        return False
    return True


def _written_temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(".")]


@pytest.mark.slow  # prepare and export in processes under a file-size limit
def test_a_full_disk_during_prepare_and_export_names_the_users_output(checkpoint, tmp_path):
    """RLIMIT_FSIZE makes a write fail as a full disk does (EFBIG instead of ENOSPC, the same path through
    the code); the error named the temporary (.out.tmp-PID@HOST-XXXX/spm.model) or nothing."""
    from conftest import write_reverse_corpus

    files = write_reverse_corpus(tmp_path / "text", n_train=200, n_valid=10)
    (tmp_path / "out").mkdir()
    src, tgt = files["train"]
    r = mtkit("prepare", "--src", src, "--tgt", tgt, "--src-lang", "en", "--tgt-lang", "de",
              "--set", "data.spm.vocab_size=60", "-o", tmp_path / "out" / "data", preexec_fn=_file_size_limit(2000))
    assert_one_error(r, f"error: {tmp_path / 'out' / 'data' / 'spm.model'}: File too large")
    assert not list((tmp_path / "out").iterdir())
    r = mtkit("export", "ctranslate2", checkpoint, tmp_path / "out" / "ct2", preexec_fn=_file_size_limit(2000))
    assert_one_error(r, f"error: {tmp_path / 'out' / 'ct2' / 'spm.model'}: File too large")
    assert not list((tmp_path / "out").iterdir())


@pytest.mark.slow  # prepare and export in processes
def test_an_unwritable_folder_for_prepare_and_export_names_the_users_output(checkpoint, tmp_path):
    from conftest import write_reverse_corpus

    folder = _unwritable(tmp_path)
    files = write_reverse_corpus(tmp_path / "text", n_train=200, n_valid=10)
    src, tgt = files["train"]
    before = set(folder.iterdir())
    r = mtkit("prepare", "--src", src, "--tgt", tgt, "--src-lang", "en", "--tgt-lang", "de",
              "--set", "data.spm.vocab_size=60", "-o", folder / "mtkit-data")
    assert_one_error(r, f"error: {folder / 'mtkit-data'}: ")
    r = mtkit("export", "ctranslate2", checkpoint, folder / "mtkit-ct2")
    assert_one_error(r, f"error: {folder / 'mtkit-ct2'}: ")
    assert set(folder.iterdir()) == before


# ------------------------------------------------------------------ an exported model given to the torch engine


def test_translate_on_an_exported_model_without_the_engine_flag_says_which_flag(exported):
    r = mtkit("translate", "-m", exported, input="five\n", stdin=None)
    assert_one_error(r, "(this is an exported CTranslate2 model: add --engine ctranslate2)")
