"""What each engine can do is declared once (mtkit.engines.capabilities), read without loading torch or an
engine, and every refusal of what an engine cannot do is built from it, word for word as before."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mtkit.config import DecodeConfig
from mtkit.engines.capabilities import CAPABILITIES, ENGINES, engines_with, include_refusal, no_alignments
from mtkit.errors import MtkitError


def test_capabilities_and_the_engines_classes_are_read_without_torch():
    code = ("import sys\n"
            "from mtkit.engines.capabilities import CAPABILITIES\n"
            "from mtkit.engines.ctranslate2_engine import Ctranslate2Engine\n"
            "assert Ctranslate2Engine.capabilities is CAPABILITIES['ctranslate2']\n"
            "print(sorted(CAPABILITIES), CAPABILITIES['onnx'].alignments, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['ctranslate2', 'onnx', 'torch'] False False"


def test_each_engine_class_declares_its_own():
    from mtkit.engines.onnx_engine import OnnxEngine
    from mtkit.engines.torch_engine import TorchEngine

    assert ENGINES == ("torch", "ctranslate2", "onnx")
    assert TorchEngine.capabilities is CAPABILITIES["torch"] and OnnxEngine.capabilities is CAPABILITIES["onnx"]
    assert [c.name for c in engines_with("alignments")] == ["torch", "ctranslate2"]
    assert [c.name for c in engines_with("include")] == [c.name for c in engines_with("forced_scoring")] == ["torch"]
    assert CAPABILITIES["onnx"].devices == ("cpu",) and "int8" in CAPABILITIES["ctranslate2"].quantizations


def test_the_refusals_read_as_they_always_have():
    assert include_refusal("ctranslate2") == (
        "--engine ctranslate2 cannot force phrases into a translation (include constraints, glossaries): "
        "CTranslate2 has no constrained search; use --engine torch (exclude works with both)")
    assert include_refusal("torch") is None and include_refusal("onnx") is None  # ONNX: the engine refuses
    assert no_alignments() == "a CTranslate2 model exported by mtkit declares its alignment head; ONNX gives none"

    from mtkit.engines.engine import Engine

    class Plain(Engine):
        description = "plain"

    with pytest.raises(MtkitError) as e:
        Plain(None, DecodeConfig()).alignment_source(DecodeConfig())
    assert str(e.value) == ("plain: gives no word alignments (a CTranslate2 model exported by mtkit declares its "
                            "alignment head; ONNX gives none)")


@pytest.mark.parametrize(("flags", "message"), [
    (["--engine", "onnx", "--alignments"],
     "--alignments needs --engine torch or ctranslate2 (the ONNX export's graphs give no attention)"),
    (["--engine", "onnx", "--protect", "x"],
     "--protect needs word alignments: --engine torch or ctranslate2 (ONNX gives none)"),
    (["--engine", "ctranslate2", "--attention-png", "{tmp}/a.png"], "--attention-png needs --engine torch"),
    (["--engine", "ctranslate2", "--glossary", "{tmp}/g.tsv"],
     "--glossary: --engine ctranslate2 cannot force phrases into a translation (include constraints, glossaries): "
     "CTranslate2 has no constrained search; use --engine torch (exclude works with both)"),
    (["--engine", "torch", "--quantization", "int8"],
     "--quantization needs --engine ctranslate2 (which exports a checkpoint on first use)"),
])
def test_the_cli_refuses_what_an_engine_cannot_do_before_any_model_loads(flags, message, tmp_path, monkeypatch,
                                                                          capsys):
    from mtkit.cli import main

    (tmp_path / "in.txt").write_text("a b\n", encoding="utf-8")
    (tmp_path / "g.tsv").write_text("a\tb\n", encoding="utf-8")
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    monkeypatch.setattr(sys, "argv", ["mtkit", "translate", "-m", str(tmp_path / "none"), *flags,
                                      str(tmp_path / "in.txt")])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 1
    assert capsys.readouterr().err == f"error: {message}\n"
