"""Checkpoints from strangers cost work and memory bounded by their size, and fail with one line.

Each crafted file is refused by the torch-free reading (mtkit.checkpoints.file) before torch.load
sees it: memo amplification, a huge integer, nesting 200,000 deep, a zip bomb, views that repeat their
data where a config asks for 17 GB of weights, special files, fields of the wrong type. The CLI cases run
under an address-space limit (tests/integration/test_model_file_checks.py's :data:`MEMORY_LIMIT`), and the
bounds are tested by counts, never by the clock (a timeout here only guards against a hang).
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import fast_first, zip_bomb
from test_model_file_checks import ENV, _limited, assert_one_error, run_limited, tiny_checkpoint

from mtkit.checkpoints import file as checkpoint_file
from mtkit.checkpoints.io import load_checkpoint, precheck
from mtkit.errors import MtkitError, shown

# ---------------------------------------------------------------- crafting files


def rewrite(path: Path, out: Path, pickle_bytes: bytes | None = None, entries: dict[str, bytes] | None = None,
            compress: dict[str, int] | None = None) -> Path:
    """``path``'s zip with data.pkl replaced by ``pickle_bytes`` and ``entries`` added (stored, unless
    ``compress`` names an entry's method)."""
    compress = compress or {}
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        prefix = src.namelist()[0].split("/")[0]
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/data.pkl") and pickle_bytes is not None:
                data = pickle_bytes
            dst.writestr(info.filename, data, compress_type=compress.get(info.filename, zipfile.ZIP_STORED))
        for name, data in (entries or {}).items():
            dst.writestr(f"{prefix}/{name}", data, compress_type=compress.get(name, zipfile.ZIP_STORED))
    return out


def data_pkl(path: Path) -> bytes:
    with zipfile.ZipFile(path) as archive:
        return archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))


def with_item(path: Path, out: Path, key: str, value_ops: bytes) -> Path:
    """``path`` with one more top-level item ``key`` whose value the pickle opcodes ``value_ops`` build
    (torch.save's pickle ends SETITEMS STOP with the payload dict on top of the stack)."""
    original = data_pkl(path)
    assert original.endswith(b"u.")
    key_ops = pickle.BINUNICODE + struct.pack("<I", len(key.encode())) + key.encode()
    return rewrite(path, out, original[:-1] + key_ops + value_ops + pickle.SETITEM + pickle.STOP)


def int_list(n: int, memo: int) -> bytes:
    """Opcodes of a list of ``n`` small ints, put in memo slot ``memo``."""
    return (pickle.EMPTY_LIST + pickle.LONG_BINPUT + struct.pack("<I", memo) + pickle.MARK
            + (pickle.BININT1 + b"\x07") * n + pickle.APPENDS)


def get(memo: int) -> bytes:
    return pickle.LONG_BINGET + struct.pack("<I", memo)


MEMO = 900_000  # a memo slot torch.save's pickle does not use


def storage_pid(key: str = "crafted", numel: int = 1) -> bytes:
    """A persistent id as torch.save writes one: ('storage', torch.FloatStorage, key, 'cpu', numel)."""
    return (pickle.MARK + pickle.BINUNICODE + struct.pack("<I", 7) + b"storage" + pickle.GLOBAL
            + b"torch\nFloatStorage\n" + pickle.BINUNICODE + struct.pack("<I", len(key)) + key.encode()
            + pickle.BINUNICODE + struct.pack("<I", 3) + b"cpu" + pickle.BININT + struct.pack("<i", numel)
            + pickle.TUPLE + pickle.BINPERSID)


def rebuild(size_ops: bytes, key: str = "crafted", numel: int = 1) -> bytes:
    """Opcodes of a call of torch._utils._rebuild_tensor_v2 whose size is what ``size_ops`` push."""
    return (pickle.GLOBAL + b"torch._utils\n_rebuild_tensor_v2\n" + pickle.MARK + storage_pid(key, numel)
            + pickle.BININT1 + b"\x00" + size_ops + size_ops + pickle.NEWFALSE + pickle.GLOBAL
            + b"collections\nOrderedDict\n" + pickle.EMPTY_TUPLE + pickle.REDUCE + pickle.TUPLE + pickle.REDUCE)


@pytest.fixture
def good(tmp_path) -> Path:
    return tiny_checkpoint(tmp_path / "good.pt")


def refused(path: Path, fragment: str) -> str:
    """``path`` is refused by the torch-free reading, by the precheck and by load_checkpoint alike."""
    with pytest.raises(MtkitError) as caught:
        checkpoint_file.read_payload(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and fragment in message and "\n" not in message, message
    assert len(message) < 400, message
    for check in (precheck, load_checkpoint):
        with pytest.raises(MtkitError) as again:
            check(path)
        assert str(again.value) == message
    return message


def test_a_rewritten_checkpoint_still_loads(good, tmp_path):
    """The crafting above is no cause of the refusals below: an innocuous item added the same way loads."""
    path = with_item(good, tmp_path / "plus.pt", "note", pickle.NONE)
    precheck(path)
    ckpt = load_checkpoint(path)
    name = "output_projection.weight"
    assert ckpt["note"] is None and torch.equal(ckpt["model"][name], torch.load(good, weights_only=True)["model"][name])


# ---------------------------------------------------------------- the pickle's work


def test_the_unpickler_stops_after_its_budget_of_operations(monkeypatch):
    """Work by a count: a pickle of 10,000 ints against a budget of 1,000 operations stops at the 1,001st."""
    monkeypatch.setattr(checkpoint_file, "MAX_PICKLE_OPS", 1000)
    data = pickle.PROTO + b"\x02" + int_list(10_000, 0) + pickle.STOP
    reader = checkpoint_file._Unpickler(data)
    with pytest.raises(checkpoint_file.Unreadable, match="more than 1,000 operations"):
        reader.load()
    assert reader.ops == 1001
    monkeypatch.setattr(checkpoint_file, "MAX_PICKLE_OPS", 20_000)
    assert checkpoint_file.unpickle(data)[0] == [7] * 10_000  # within the budget: read whole


READER_MEMORY = 1 << 30  # address space for the torch-free reading alone: the worst pickle within budget fits


def _reader_limited() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (READER_MEMORY, READER_MEMORY))


@pytest.mark.parametrize("kind", ["objects", "memo entries"])
@pytest.mark.slow  # a process under a memory limit (fast: test_the_unpickler_stops_after_its_budget_of_operations)
def test_the_most_a_pickle_within_budget_can_build_fits_a_fixed_memory_bound(good, tmp_path, kind):
    """Memory by a limit: a pickle that spends its whole budget of operations on the costliest objects (an
    empty dict per opcode, or a dict and a memo entry per two) is read in a process limited to 1 GiB of
    address space, without torch; the payload (a list, not a checkpoint) then fails the field checks."""
    n = checkpoint_file.MAX_PICKLE_OPS - 10
    body = pickle.EMPTY_DICT * n if kind == "objects" else (pickle.EMPTY_DICT + pickle.MEMOIZE) * (n // 2)
    data = pickle.PROTO + b"\x04" + pickle.EMPTY_LIST + pickle.MARK + body + pickle.APPENDS + pickle.STOP
    path = rewrite(good, tmp_path / "costly.pt", data)
    code = ("import sys\nfrom mtkit.errors import MtkitError\nfrom mtkit.checkpoints.io import precheck\n"
            f"try:\n    precheck({str(path)!r})\nexcept MtkitError as e:\n    print(e)\n"
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300,
                       preexec_fn=_reader_limited, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"{path}: not an mtkit checkpoint (no format_version)", "False"], r.stdout


def test_a_memoized_list_handed_to_rebuild_tensor_2000_times_is_refused_at_once(good, tmp_path):
    """The issue's file: one list of 10⁶ ints, memoized, as the size of 2,000 tensors. A size is a short
    tuple of small non-negative ints: the first call is refused, whatever follows."""
    calls = pickle.EMPTY_LIST + pickle.MARK + rebuild(get(MEMO)) * 2000 + pickle.APPENDS
    path = with_item(good, tmp_path / "amplified.pt", "x", int_list(1_000_000, MEMO) + pickle.POP + calls)
    message = refused(path, "not a readable mtkit checkpoint (a tensor's size is [7, 7, 7, 7, 7, 7, ...], not a tuple")
    r, _ = run_limited("translate", "-m", path, stdin="w1 w2\n")
    assert assert_one_error(r, "a tensor's size is") == f"error: {message}"


def test_a_memoized_list_named_2000_times_counts_2000_times(good, tmp_path):
    """A container shared through the memo is counted each time it is reached: 2,000 × 10⁵ elements
    are over the walk's budget, though the pickle built only 10⁵."""
    shared = int_list(100_000, MEMO) + pickle.POP + pickle.EMPTY_LIST + pickle.MARK + get(MEMO) * 2000 + pickle.APPENDS
    path = with_item(good, tmp_path / "shared.pt", "x", shared)
    refused(path, f"more than {checkpoint_file.MAX_VISITS:,} values")
    r, _ = run_limited("translate", "-m", path, stdin="w1 w2\n")
    assert_one_error(r, "containers counted each time they are named")


def test_size_tuples_of_many_or_huge_dimensions_are_refused(good, tmp_path):
    many = pickle.MARK + (pickle.BININT1 + b"\x01") * 9 + pickle.TUPLE
    path = with_item(good, tmp_path / "dims.pt", "x", rebuild(many))
    refused(path, "not a tuple of at most 8 small non-negative integers")
    huge = pickle.LONG1 + bytes([126]) + (1 << 1000).to_bytes(126, "little") + pickle.TUPLE1
    refused(with_item(good, tmp_path / "huge.pt", "x", rebuild(huge)), "a tensor's size is (<an integer")
    negative = pickle.BININT + struct.pack("<i", -1) + pickle.TUPLE1
    refused(with_item(good, tmp_path / "negative.pt", "x", rebuild(negative)), "a tensor's size is (-1,)")


def test_a_huge_integer_is_one_line(good, tmp_path):
    """A config value of 10**6000 (whose str() Python refuses) is one short line, CLI included."""
    ckpt = torch.load(good, weights_only=True)
    ckpt["config"]["model"]["d_model"] = 10**6000
    torch.save(ckpt, tmp_path / "huge.pt")
    refused(tmp_path / "huge.pt", "not a readable mtkit checkpoint (an integer of 19932 bits)")
    r, _ = run_limited("translate", "-m", tmp_path / "huge.pt", stdin="w1 w2\n")
    assert_one_error(r, "an integer of 19932 bits")
    assert shown(10**6000) == "<an integer of 19932 bits>"


def test_a_list_nested_200000_deep_is_one_line(good, tmp_path):
    """The pickle builds nesting without recursion; what walks it afterwards stops at MAX_DEPTH."""
    n = 200_000
    path = with_item(good, tmp_path / "deep.pt", "x", pickle.EMPTY_LIST * n + pickle.APPEND * (n - 1))
    refused(path, f"values nested more than {checkpoint_file.MAX_DEPTH} deep")
    r, _ = run_limited("translate", "-m", path, stdin="w1 w2\n")
    assert_one_error(r, "nested more than")
    deep: list = []
    for _ in range(n):
        deep = [deep]
    assert shown(deep) == "[[[[[[[...]]]]]]]"


@pytest.mark.parametrize("ops, fragment", [
    (pickle.GLOBAL + b"os\nsystem\n", "names 'os'.'system', which no mtkit checkpoint holds"),
    (pickle.GLOBAL + b"builtins\nset\n", "names 'builtins'.'set'"),
    (pickle.EMPTY_LIST + pickle.EMPTY_TUPLE + pickle.NEWOBJ, "an opcode or memo entry mtkit does not read"),
    (pickle.EMPTY_SET, "an opcode or memo entry"),
    (pickle.EMPTY_DICT + pickle.MARK + pickle.MARK + pickle.BININT1 + b"\x01" + pickle.TUPLE + pickle.NONE
     + pickle.SETITEMS, "a mapping key (1,)"),
    (pickle.EMPTY_DICT + pickle.BINUNICODE + struct.pack("<I", 5000) + b"k" * 5000 + pickle.NONE + pickle.SETITEM,
     "a mapping key of 5000 characters"),
    (pickle.GLOBAL + b"collections\nOrderedDict\n" + pickle.BINUNICODE + struct.pack("<I", 1) + b"a"
     + pickle.TUPLE1 + pickle.REDUCE, "TypeError"),
    (pickle.EMPTY_LIST + pickle.EMPTY_DICT + pickle.BUILD, "sets the state of []"),
])
def test_a_pickle_that_would_run_or_hash_anything_is_refused(good, tmp_path, ops, fragment):
    refused(with_item(good, tmp_path / "odd.pt", "x", ops), fragment)


# ---------------------------------------------------------------- the archive


def test_a_zip_bomb_is_refused_before_torch_load(good, tmp_path):
    """A data.pkl deflated from 200 MB of zeros into ~200 KB: refused from the zip's directory, before a
    byte of it is inflated (torch.save stores every entry); through the CLI under the memory limit, one line."""
    bomb = zip_bomb(good, tmp_path / "bomb.pt")
    assert bomb.stat().st_size < 2 << 20
    assert zipfile.ZipFile(bomb).getinfo(next(n for n in zipfile.ZipFile(bomb).namelist()
                                              if n.endswith("data.pkl"))).file_size == 200 << 20
    refused(bomb, "data.pkl' is compressed; torch.save stores every entry as it is")
    r, _ = run_limited("translate", "-m", bomb, stdin="w1 w2\n")
    assert_one_error(r, "is compressed")

    names = zipfile.ZipFile(good).namelist()
    deflated = rewrite(good, tmp_path / "deflated.pt", compress={n: zipfile.ZIP_DEFLATED for n in names})
    refused(deflated, "is compressed")  # even at a ratio of 1: nothing mtkit reads is inflated


def test_the_pickle_is_read_within_its_bound_whatever_the_zip_declares(good, monkeypatch):
    """Declared sizes can lie: data.pkl is read with a bound of its own (MAX_PICKLE_BYTES + 1 bytes at most)."""
    asked = []
    original = zipfile.ZipExtFile.read

    def spy(self, n=-1):
        asked.append(n)
        return original(self, n)

    monkeypatch.setattr(zipfile.ZipExtFile, "read", spy)
    checkpoint_file.read_payload(good)
    assert asked == [checkpoint_file.MAX_PICKLE_BYTES + 1]
    monkeypatch.setattr(checkpoint_file, "MAX_PICKLE_BYTES", 4096)
    refused(good, "a pickle of")


def test_entries_that_overlap_or_are_not_a_zip_are_refused(good, tmp_path):
    outside = rewrite(good, tmp_path / "outside.pt")
    with zipfile.ZipFile(outside, "a") as archive:
        archive.writestr("elsewhere/data.bin", b"x")
    refused(outside, "entries outside its archive's folder")
    (tmp_path / "text.pt").write_text("not a zip")
    refused(tmp_path / "text.pt", "(not a zip archive, as torch.save writes)")
    # Two directory records for the same bytes: each would be read (and allocated) once more.
    plain = rewrite(good, tmp_path / "plain.pt")  # Python's zipfile: no zip64 records to keep in step
    with zipfile.ZipFile(plain) as archive:
        a, b = (i for i in archive.infolist() if i.filename.endswith(("/data/2", "/data/4")))
    assert a.file_size == b.file_size
    raw = bytearray(plain.read_bytes())
    record = raw.index(b.filename.encode(), raw.index(b"PK\x01\x02")) - 46  # b's directory record
    assert raw[record: record + 4] == b"PK\x01\x02"
    raw[record + 42: record + 46] = struct.pack("<I", a.header_offset)
    (tmp_path / "doubled.pt").write_bytes(bytes(raw))
    with zipfile.ZipFile(tmp_path / "doubled.pt") as archive:
        assert archive.getinfo(b.filename).header_offset == a.header_offset
    refused(tmp_path / "doubled.pt", "overlaps another or ends beyond the file")


# ---------------------------------------------------------------- tensors and the config


def test_zero_stride_views_cannot_stand_for_a_huge_config(tmp_path):
    """The issue's 6 MB file: d_model 65,536, the four tensors the earlier check read present as zero-stride
    views of one element. Every tensor the config implies must be there with its shape (the first check
    that fails says which is missing), and views may not describe more bytes than their storages hold."""
    from mtkit.checkpoints.io import CHECKPOINT_FORMAT
    from mtkit.config import config_from_dict, config_to_dict

    d = 65_536
    config = config_to_dict(config_from_dict({"model": {"d_model": d, "h": 8, "d_ff": d, "encoder_layers": 1,
                                                        "decoder_layers": 1, "max_positions": 32}}))
    one = torch.zeros(1)

    def fake(*shape):
        return one.expand(*shape)  # a zero-stride view of one element

    few = {"encoder.embeddings.tokens.weight": fake(12, d), "output_projection.weight": fake(12, d),
           "encoder.layers.0.feed_forward.w_1.weight": fake(d, d),
           "decoder.layers.0.feed_forward.w_1.weight": fake(d, d)}
    payload = {"format_version": CHECKPOINT_FORMAT, "config": config, "model": few,
               "vocab": {"src": b"not read", "tgt": None}, "src_vocab_size": 12, "tgt_vocab_size": 12}
    torch.save(payload, tmp_path / "few.pt")
    assert (tmp_path / "few.pt").stat().st_size < 1 << 20
    refused(tmp_path / "few.pt", "its tensors describe 17,183,014,912 bytes but their storages hold 4: views")

    from mtkit.model_spec import parameter_shapes

    shapes = parameter_shapes(config_from_dict({"model": config["model"]}).model, 12, 12)
    full = {k: fake(*s) for k, s in shapes.items()}
    torch.save({**payload, "model": full}, tmp_path / "full.pt")
    refused(tmp_path / "full.pt", "views that repeat their data")
    r, _ = run_limited("translate", "-m", tmp_path / "full.pt", stdin="w1 w2\n")
    assert_one_error(r, "views that repeat their data")


def test_every_tensor_the_config_implies_must_be_there(good, tmp_path):
    """The earlier check read four tensors; now a missing layer norm or a wrong bias is refused before
    anything is built, without torch (precheck) and after torch.load alike."""
    ckpt = torch.load(good, weights_only=True)
    del ckpt["model"]["decoder.layers.0.feed_forward_norm.bias"]
    torch.save(ckpt, tmp_path / "missing.pt")
    with pytest.raises(MtkitError, match="do not fit its config: no 'decoder.layers.0.feed_forward_norm.bias'$"):
        precheck(tmp_path / "missing.pt")
    ckpt = torch.load(good, weights_only=True)
    ckpt["model"]["encoder.layers.0.self_attn.w_k.bias"] = torch.zeros(9)
    ckpt["model"]["an.extra.weight"] = torch.zeros(2)
    torch.save(ckpt, tmp_path / "odd.pt")
    with pytest.raises(MtkitError, match=r"its weights do not fit its config: an unexpected 'an.extra.weight' "
                                         r"\(and 1 more\)$"):
        precheck(tmp_path / "odd.pt")
    r, _ = run_limited("translate", "-m", tmp_path / "odd.pt", stdin="w1 w2\n")
    assert_one_error(r, "an unexpected 'an.extra.weight'")


# ---------------------------------------------------------------- fields


def _field_case(ckpt: dict, name: str) -> None:
    if name == "pieces a string":
        ckpt["vocab"]["pieces"] = "abc"
    elif name == "pieces.src a dict":
        ckpt["vocab"]["pieces"] = {"src": {"a": 1}, "tgt": None}
    elif name == "pieces too short":
        ckpt["vocab"]["pieces"] = {"src": ["a", "b"], "tgt": None}
    elif name == "vocab.tgt a list":
        ckpt["vocab"]["tgt"] = [1, 2]
    elif name == "vocab.src a string":
        ckpt["vocab"]["src"] = "spm"
    elif name == "format_version a string":
        ckpt["format_version"] = "1"
    elif name == "step a string":
        ckpt["step"] = "7"
    elif name == "a model key an int":
        ckpt["model"][3] = torch.zeros(1)
    elif name == "vocab.src too large":
        ckpt["vocab"]["src"] = bytes(33 << 20)


FIELD_CASES = {
    "pieces a string": "its vocab.pieces must be a mapping of piece tables, got 'abc'",
    "pieces.src a dict": "its vocab.pieces.src must be a list of pieces, got {'a': 1}",
    "pieces too short": "its vocab.pieces.src has 2 pieces, its vocabulary 12 ids",
    "vocab.tgt a list": "its vocab.tgt must be a SentencePiece model's bytes, got [1, 2]",
    "vocab.src a string": "no 'vocab.src' SentencePiece model",
    "format_version a string": "its format_version must be a positive integer, got '1'",
    "step a string": "its step must be an integer, got '7'",
    "a model key an int": "its model holds 3, which is not a tensor name",
    "vocab.src too large": "its vocab.src is 34,603,008 bytes, more than the 32 MiB of a SentencePiece model",
}


@pytest.mark.parametrize("name", list(FIELD_CASES))
def test_a_field_of_the_wrong_type_is_one_line(good, tmp_path, name):
    ckpt = torch.load(good, weights_only=True)
    _field_case(ckpt, name)
    path = tmp_path / "field.pt"
    torch.save(ckpt, path)
    for check in (precheck, load_checkpoint):
        with pytest.raises(MtkitError) as caught:
            check(path)
        assert str(caught.value).startswith(f"{path}: ") and FIELD_CASES[name] in str(caught.value)
    if name == "pieces a string":  # the case, through the CLI
        r, _ = run_limited("translate", "-m", path, stdin="w1 w2\n")
        assert_one_error(r, "its vocab.pieces must be a mapping")


@pytest.mark.slow  # an mtkit process, for what it prints
def test_torch_s_protocol_warning_is_not_printed(good, tmp_path):
    """torch's "Detected pickle protocol 4" warning no longer comes before the one error line."""
    import warnings

    ckpt = torch.load(good, weights_only=True)
    path = tmp_path / "p4.pt"
    torch.save(ckpt, path, pickle_protocol=4)
    assert data_pkl(path)[:2] == b"\x80\x04"
    checkpoint_file.read_payload(path)  # protocol 4's opcodes pass the torch-free reading...
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ...and torch's, which warns of protocol 4, refuses its FRAMEs
        with pytest.raises(MtkitError, match=r"p4.pt: not a readable mtkit checkpoint \(UnpicklingError\)$"):
            load_checkpoint(path)
    r, _ = run_limited("translate", "-m", path, stdin="w1 w2\n")
    line = assert_one_error(r, "not a readable mtkit checkpoint (UnpicklingError)")
    assert r.stderr.strip() == line, r.stderr  # no warning before it


# ---------------------------------------------------------------- special files


def _special_files(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo.pt"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.pt"
    zero.symlink_to("/dev/zero")
    return {"fifo": fifo, "/dev/zero": zero}


COMMANDS = {
    "translate": lambda m, src: ["translate", "-m", m, src],
    "score": lambda m, src: ["score", "-m", m, "--src", src, "--tgt", src],
    "evaluate": lambda m, src: ["evaluate", "-m", m, "--src", src, "--ref", src],
    "serve": lambda m, src: ["serve", "-m", m, "--port", "0"],
}


@pytest.mark.parametrize("command", fast_first(COMMANDS))  # each: an mtkit process
def test_a_fifo_or_a_device_as_the_model_is_not_a_regular_file(tmp_path, command):
    """A FIFO hung every command in zipfile; a symlink to /dev/zero read until memory ran out. The timeout
    only guards against a hang."""
    src = tmp_path / "in.txt"
    src.write_text("w1 w2\n")
    for kind, path in _special_files(tmp_path).items():
        r = subprocess.run([sys.executable, "-m", "mtkit", *map(str, COMMANDS[command](path, src))],
                           capture_output=True, text=True, env=ENV, stdin=subprocess.DEVNULL, timeout=300,
                           preexec_fn=_limited, check=False)
        assert assert_one_error(r, "not a regular file") == f"error: {path}: not a regular file", (kind, r.stderr)
        path.unlink()


def test_the_reading_never_waits_for_a_fifo(tmp_path):
    fifo = tmp_path / "fifo.pt"
    os.mkfifo(fifo)
    with pytest.raises(MtkitError, match="fifo.pt: not a regular file$"):
        checkpoint_file.read_payload(fifo)  # opened without blocking, then refused
    with pytest.raises(MtkitError, match="not a regular file$"):
        load_checkpoint(tmp_path)  # a directory is not a checkpoint file either


def test_config_values_are_quoted_short(good, tmp_path):
    """A config value of any size is quoted through reprlib (mtkit.errors.shown): one short line."""
    from mtkit.config import config_from_dict

    ckpt = torch.load(good, weights_only=True)
    ckpt["config"]["model"]["norm"] = "x" * 100_000
    torch.save(ckpt, tmp_path / "long.pt")
    with pytest.raises(MtkitError) as caught:
        precheck(tmp_path / "long.pt")
    assert str(caught.value) == (f"{tmp_path / 'long.pt'}: its config: model.norm: expected one of 'post' | 'pre', "
                                 f"got {shown('x' * 100_000)}")
    assert len(str(caught.value)) < 300
    with pytest.raises(MtkitError, match=r"^train.lr: must be a finite number \(not nan or inf\), got <an integer "
                                         r"of 19932 bits>$"):
        config_from_dict({"train": {"lr": 10**6000}})
    with pytest.raises(MtkitError, match=r"^train.betas: expected a list of 2 values, got \[0, 1, 2, 3, 4, 5, "
                                         r"\.\.\.\]$"):
        config_from_dict({"train": {"betas": list(range(10**6))}})
