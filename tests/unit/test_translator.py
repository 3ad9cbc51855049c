"""The translation pipeline: one output per input line, order restored, batch-size invariance, formats."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mtkit.config import Config, DecodeConfig, DecodeOptions, SpmConfig, config_to_dict
from mtkit.data.synthetic import english
from mtkit.data.vocab import Vocab, train_model
from mtkit.engines.torch_engine import TorchEngine
from mtkit.errors import MtkitError
from mtkit.text.lines import format_translation, read_text_lines
from mtkit.version import __version__

LINES = [english(n) + (" and " + english(n // 3) if n % 2 else "") for n in (5, 17, 342, 999, 40, 1, 77, 610)]


def translate(loaded, lines, buffer_size=1000, **decode):
    decode = DecodeConfig(**{"beam": 3, "max_len_b": 8, **decode})
    return list(TorchEngine(loaded, decode).translate(lines, buffer_size=buffer_size))


def test_same_output_whatever_the_batching(loaded):
    reference = [t.best.ids for t in translate(loaded, LINES)]
    for batch_tokens, buffer_size in ((1, 1000), (12, 3), (40, 1), (10_000, 5)):
        found = translate(loaded, LINES, buffer_size=buffer_size, batch_tokens=batch_tokens)
        assert [t.best.ids for t in found] == reference
        assert [t.index for t in found] == list(range(len(LINES)))


def test_input_order_restored(loaded):
    one_by_one = [translate(loaded, [line])[0].best.ids for line in LINES]
    assert [t.best.ids for t in translate(loaded, LINES)] == one_by_one


def test_messy_input_stays_line_aligned(loaded, caplog):
    caplog.set_level("INFO", logger="mtkit")  # the engine's warnings: the mtkit logger's
    raw = b"".join([
        b"five\n",
        b"\n",  # empty
        b"   \n",  # blank
        "non-ascii \u00fc \u20ac \U0001f600\n".encode(),
        "control \x0b\x0c\x1c\x85 chars\r\n".encode(),
        (" ".join(["seven hundred"] * 40)).encode() + b"\n",  # over-long
        b"no final newline",
    ])
    lines = list(read_text_lines(io.BytesIO(raw)))
    assert len(lines) == 7
    with pytest.raises(MtkitError, match=r"^in\.txt: line 2: invalid UTF-8 \(byte 5 of the line\)$"):
        list(read_text_lines(io.BytesIO(b"fine\nbad \xff\xfe utf-8\n"), "in.txt"))  # never a silent U+FFFD
    decode = DecodeConfig(beam=2, max_len_b=5, max_input_len=10)
    results = list(TorchEngine(loaded, decode).translate(lines, buffer_size=3))
    assert [t.index for t in results] == list(range(7))
    assert results[1].best.text == "" and results[2].best.text == ""
    assert len(results[5].src_ids) == 10
    assert "line 6" in caplog.text
    for fmt in ("text", "tokens", "scores"):
        out = "".join(line + "\n" for t in results for line in format_translation(t, fmt))
        assert len(out.splitlines()) == 7


def test_nbest_format(loaded):
    results = translate(loaded, LINES[:3] + [""], beam=4, nbest=3)
    lines = [line for t in results for line in format_translation(t, "nbest", 3)]
    assert len(lines) == 12
    assert [line.split(" ||| ")[0] for line in lines] == [str(i) for i in range(4) for _ in range(3)]
    for t in results[:3]:
        scores = [c.score for c in t.candidates]
        assert scores == sorted(scores, reverse=True) and len(t.candidates) == 3


def test_ensemble_needs_one_vocabulary(loaded):

    other_vocab = Vocab.from_bytes(train_model(LINES * 3, SpmConfig(vocab_size=40)))
    other = SimpleNamespace(model=loaded.model, vocab=other_vocab, path=Path("other.pt"))
    with pytest.raises(MtkitError, match="one vocabulary"):
        TorchEngine([loaded, other], DecodeConfig())
    ensemble = [t.best.ids for t in TorchEngine([loaded, loaded], DecodeConfig(beam=3, max_len_b=8)).translate(LINES)]
    assert ensemble == [t.best.ids for t in translate(loaded, LINES)]


def save_checkpoint(loaded, path: Path) -> Path:
    torch.save({
        "format_version": 1, "mtkit_version": __version__,
        "config": config_to_dict(Config(model=loaded.config.model, decode=DecodeConfig(beam=2, max_len_b=6))),
        "model": loaded.model.state_dict(),
        "vocab": {"src": loaded.vocab.model_bytes()[0], "tgt": None},
        "src_vocab_size": loaded.vocab.src_size, "tgt_vocab_size": loaded.vocab.tgt_size,
    }, path)
    return path


def test_command_end_to_end(loaded, tmp_path):
    from mtkit.commands.translate import TranslateOptions
    from mtkit.commands.translate import translate as translate_command

    ckpt = save_checkpoint(loaded, tmp_path / "tiny.pt")
    src = tmp_path / "in.txt"
    src.write_bytes("five\n\nthree hundred\n\u00fc\n".encode())
    out = tmp_path / "out.txt"
    translate_command(ckpt, [str(src)], TranslateOptions(output=out, output_format="scores",
                                                         attention_png=tmp_path / "att.png"))
    assert len(out.read_text(encoding="utf-8").splitlines()) == 4
    assert (tmp_path / "att.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    translate_command([ckpt, ckpt], [str(src)], TranslateOptions(output=out, output_format="nbest",
                                                                 decode_settings=DecodeConfig(beam=3, nbest=2,
                                                                                              max_len_b=4)))
    assert len(out.read_text(encoding="utf-8").splitlines()) == 8
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_ready_lines_of_a_pipe_as_they_arrive():
    import os

    from mtkit.text.lines import read_ready_lines

    r, w = os.pipe()
    waits = []
    lines = read_ready_lines(r, before_wait=lambda: waits.append(True), chunk_size=4)
    os.write(w, b"one\ntwo\r\nthr")
    assert [next(lines), next(lines)] == ["one", "two"]  # across 4-byte reads
    assert next(lines) is None and not waits  # nothing more ready: translate what you hold
    os.write(w, "ee\n\u00fc\n".encode())
    assert next(lines) == "three" and waits == [True]  # the output is flushed before blocking
    assert next(lines) == "\u00fc"
    os.write(w, b"no newline\r")
    os.close(w)
    assert [line for line in lines if line is not None] == ["no newline\r"]  # as read_text_lines keeps it
    os.close(r)
    r, w = os.pipe()
    os.write(w, b"one\ntwo \xff\n")
    os.close(w)
    with pytest.raises(MtkitError, match=r"^<stdin>: line 2: invalid UTF-8 \(byte 5 of the line\)$"):
        list(read_ready_lines(r))
    os.close(r)


def test_a_pause_in_the_input_ends_the_chunk(loaded):
    """Each line before a pause (None) is translated before the next one is even read."""
    events = []

    def lines():
        for line in (LINES[0], LINES[1], None, LINES[2], None):
            events.append(("read", line))
            yield line

    translator = TorchEngine(loaded, DecodeConfig(beam=2, max_len_b=6))
    for t in translator.translate(lines(), buffer_size=1000):
        events.append(("out", t.index))
    assert [e for e in events if e[1] is not None] == [
        ("read", LINES[0]), ("read", LINES[1]), ("out", 0), ("out", 1), ("read", LINES[2]), ("out", 2)]
    reference = [t.best.ids for t in translate(loaded, LINES[:3], beam=2, max_len_b=6)]
    assert [t.best.ids for t in translator.translate(lines())] == reference


def test_an_output_limit_below_one_token_warns_once(loaded, caplog):
    caplog.set_level("INFO", logger="mtkit")  # the engine's warnings: the mtkit logger's
    results = translate(loaded, LINES[:4], max_len_a=0.0, max_len_b=-2)
    assert all(len(t.best.ids) <= 1 for t in results)
    err = caplog.text
    assert err.count("warning:") == 1 and "line 1" in err and "--max-len-b" in err
    caplog.clear()
    translate(loaded, LINES[:4], max_len_a=0.0, max_len_b=1)
    assert "warning" not in caplog.text


def test_command_checks_everything_before_loading_the_model(tmp_path):
    """Each mistake is a one-line error naming its flag, raised before the (missing) model would load."""
    from mtkit.commands.translate import TranslateOptions
    from mtkit.commands.translate import translate as translate_command

    src = tmp_path / "in.txt"
    src.write_text("five\n")
    missing = tmp_path / "no-such-model.pt"
    cases = [
        (dict(decode=DecodeOptions(top_p=2.0, sampling=True)), "--top-p: must be in (0, 1], got 2.0"),
        (dict(decode=DecodeOptions(top_k=-5, sampling=True)), "--top-k: must be >= 0 (0: off), got -5"),
        (dict(decode=DecodeOptions(temperature=0.0, sampling=True)), "--temperature: must be > 0, got 0.0"),
        (dict(decode=DecodeOptions(batch_tokens=0)), "--batch-tokens: must be >= 1, got 0"),
        (dict(decode=DecodeOptions(beam=0)), "--beam: must be >= 1, got 0"),
        (dict(buffer_size=0), "--buffer-size: must be >= 1, got 0"),
        (dict(buffer_size=-3), "--buffer-size"),
        (dict(output=tmp_path), "--output"),
        (dict(attention_png=tmp_path / "a.png", attention_layer=None, output=None, inputs=[str(tmp_path)]),
         "is a directory"),
        (dict(attention_layer=1), "--attention-layer needs --attention-png"),
        (dict(decode=DecodeOptions(nbest=3), output_format="text"), "--nbest 3"),
        (dict(device="gpu"), "--device gpu"),
        (dict(precision="fp64"), "--precision fp64"),
        (dict(inputs=[str(tmp_path / "missing.txt")]), "missing.txt: no such file"),
    ]
    for kwargs, expected in cases:
        kwargs = {"inputs": [str(src)], **kwargs}
        inputs = kwargs.pop("inputs")
        with pytest.raises(MtkitError) as error:
            translate_command(missing, inputs, TranslateOptions(**kwargs))
        assert expected in str(error.value) and "\n" not in str(error.value), (kwargs, str(error.value))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_cuda_device_without_cuda_names_the_flag(tmp_path):
    from mtkit.commands.translate import TranslateOptions
    from mtkit.commands.translate import translate as translate_command

    with pytest.raises(MtkitError, match=r"^--device cuda: .*no usable CUDA device"):
        translate_command(tmp_path / "missing.pt", [], TranslateOptions(device="cuda"))


def test_command_checks_decoding_against_the_checkpoint(loaded, tmp_path):
    from mtkit.commands.translate import TranslateOptions
    from mtkit.commands.translate import translate as translate_command

    ckpt = save_checkpoint(loaded, tmp_path / "tiny.pt")  # decode: beam 2
    src = tmp_path / "in.txt"
    src.write_text("five\nsix\n")
    out = tmp_path / "out.txt"
    for kwargs, expected in [
        (dict(decode=DecodeOptions(nbest=3)), r"^--nbest: .*decode\.beam \(2\)"),  # fairseq's rule: nbest <= beam
        (dict(decode=DecodeOptions(nbest=3, beam=2)), r"^--nbest: .*--beam \(2\)"),
        (dict(decode=DecodeOptions(top_p=0.9)), r"^--top-p needs --sampling"),
        (dict(attention_png=tmp_path / "a.png", attention_layer=99), r"^--attention-layer 99: the model has 2 decoder"),
    ]:
        with pytest.raises(MtkitError, match=expected):
            translate_command(ckpt, [str(src)], TranslateOptions(output=out, **kwargs))
    assert not out.exists() and not (tmp_path / "a.png").exists()
    # --nbest alone lists the hypotheses; --attention-layer counts from the end too.
    translate_command(ckpt, [str(src)], TranslateOptions(output=out, decode=DecodeOptions(nbest=2),
                                                         attention_png=tmp_path / "a.png", attention_layer=-1))
    assert [line.split(" ||| ")[0] for line in out.read_text().splitlines()] == ["0", "0", "1", "1"]
