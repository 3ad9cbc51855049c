"""The options objects: one typed decoding-options object (:class:`mtkit.config.DecodeOptions`) from the flags to
the search, checked once; commands that take one options object each, whose ``check()`` holds every rule; and no
function in mtkit/ with more than 8 parameters but the CLI's Typer flag declarations."""

import ast
import dataclasses
import math
from pathlib import Path

import pytest

from mtkit.commands.evaluate import EvaluateOptions
from mtkit.commands.serve import ServeOptions
from mtkit.commands.translate import TranslateOptions
from mtkit.config import FINITE_RULE, DecodeConfig, DecodeOptions
from mtkit.errors import MtkitError

PACKAGE = Path(__file__).resolve().parents[2] / "mtkit"
MAX_PARAMETERS = 8


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> int:
    """Parameters as a reader counts them: ``self``/``cls`` out, ``*args`` and ``**kwargs`` one each."""
    a = fn.args
    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    first = (a.posonlyargs + a.args)[:1]
    return n - (in_class and bool(first) and first[0].arg in ("self", "cls"))


def _is_typer_command(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A function decorated ``@app.command()`` (or a sub-app's, ``@export_app.command("hf")``) or
    ``@app.callback()``: its parameters are the flag declarations."""
    for decorator in fn.decorator_list:
        call = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(call, ast.Attribute) and call.attr in ("command", "callback"):
            return True
    return False


def _functions(tree: ast.AST, prefix: str, in_class: bool = False):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}.{node.name}", node, in_class
            yield from _functions(node, f"{prefix}.{node.name}")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}.{node.name}", in_class=True)
        else:
            yield from _functions(node, prefix, in_class)


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_function_takes_more_than_eight_parameters_but_the_typer_flag_declarations():
    over = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name, fn, in_class in _functions(ast.parse(path.read_text(encoding="utf-8")), _module(path)):
            if path.name == "cli.py" and _is_typer_command(fn):
                continue
            if (n := _parameters(fn, in_class)) > MAX_PARAMETERS:
                over[name] = n
    assert over == {}, (
        "group them into an options object (a frozen dataclass): STYLE.md, example 15")


def test_the_counting_sees_what_it_should():
    tree = ast.parse("class A:\n    def f(self, a, b, *c, d, **e): ...\n"
                     "def g(a, b, c, d, e, f, g, h, i): ...\n"
                     "@app.command()\ndef h(a, b, c, d, e, f, g, h, i): ...\n")
    found = {name: (_parameters(fn, in_class), _is_typer_command(fn)) for name, fn, in_class in _functions(tree, "m")}
    assert found == {"m.A.f": (5, False), "m.g": (9, False), "m.h": (9, True)}


def test_no_dict_of_decoding_overrides_is_left():
    hits = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "decode_overrides" in p.read_text("utf-8")]
    assert hits == []


def test_decode_options_are_the_decode_config_fields_each_unset():
    assert [f.name for f in dataclasses.fields(DecodeOptions)] == [f.name for f in dataclasses.fields(DecodeConfig)]
    options = DecodeOptions()
    assert all(getattr(options, f.name) is None for f in dataclasses.fields(DecodeOptions))
    assert options.given() == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.beam = 2  # type: ignore[misc]
    assert DecodeOptions(beam=3).replace(nbest=2).given() == {"beam": 3, "nbest": 2}
    assert DecodeOptions(beam=5, alpha=1.0).apply(DecodeConfig()) == dataclasses.replace(DecodeConfig(), beam=5,
                                                                                         alpha=1.0)
    assert DecodeOptions().apply(DecodeConfig(beam=2)) == DecodeConfig(beam=2)


@pytest.mark.parametrize(("options", "message"), [
    (DecodeOptions(beam=0), "--beam: must be >= 1, got 0"),
    (DecodeOptions(batch_tokens=0), "--batch-tokens: must be >= 1, got 0"),
    (DecodeOptions(top_p=2.0, sampling=True), "--top-p: must be in (0, 1], got 2.0"),
    (DecodeOptions(top_k=-5, sampling=True), "--top-k: must be >= 0 (0: off), got -5"),
    (DecodeOptions(temperature=0.0, sampling=True), "--temperature: must be > 0, got 0.0"),
    (DecodeOptions(alpha=math.nan), f"--alpha: {FINITE_RULE}, got nan"),
    (DecodeOptions(nbest=3, beam=2), "--nbest: must be between 1 and --beam (2), got 3"),
])
def test_check_names_the_flag(options, message):
    with pytest.raises(MtkitError) as error:
        options.check()
    assert str(error.value) == message


@pytest.mark.parametrize(("options", "message"), [
    # a model's own setting keeps its config key; the flag given is named as a flag
    (DecodeOptions(nbest=3), "--nbest: must be between 1 and decode.beam (2), got 3"),
    (DecodeOptions(top_p=0.9), "--top-p needs --sampling (it shapes sampling; search ignores it)"),
    (DecodeOptions(epsilon=0.02, temperature=0.5), "--temperature needs --sampling (it shapes sampling; search "
                                                   "ignores it)"),
    (DecodeOptions(mbr_comet_model="x"), "--mbr-comet-model needs --mbr comet (the model of its utility)"),
    (DecodeOptions(mbr="chrf", mbr_comet_model="x"), "--mbr-comet-model needs --mbr comet (the model of its utility)"),
])
def test_apply_checks_against_the_model_settings_naming_the_flags(options, message):
    with pytest.raises(MtkitError) as error:
        options.apply(DecodeConfig(beam=2))
    assert str(error.value) == message


def test_set_on_keeps_the_config_keys_for_the_server():
    with pytest.raises(MtkitError, match=r"^decode\.nbest: must be between 1 and decode\.beam \(2\), got 3$"):
        DecodeOptions(nbest=3).set_on(DecodeConfig(beam=2))
    assert DecodeOptions(sampling=True, top_p=0.5).set_on(DecodeConfig()).top_p == 0.5


@pytest.mark.parametrize(("options", "message"), [
    (dict(output_format="csv"), "--format csv: expected one of text, tokens, scores, nbest, json, html, xml"),
    (dict(protect=r"\{\w+\}", output_format="json"), "--protect takes placeholders out of plain text (--format "
                                                      "text), not --format json"),
    (dict(protect="(", output_format="text"), "--protect '(': not a regular expression"),
    (dict(output_format="html", decode=DecodeOptions(alignments="hard")),
     "--format html translates markup, a line of it per input line: drop --alignments"),
    (dict(output_format="xml", decode=DecodeOptions(nbest=2, beam=4)),
     "--format xml translates markup, a line of it per input line: drop --nbest"),
    (dict(protect="%s", qe=True), "--protect carries placeholders, a line of it per input line: drop --qe"),
    (dict(protect="%s", engine="onnx"), "--protect needs word alignments: --engine torch or ctranslate2 (ONNX gives "
                                        "none)"),
    (dict(engine="marian"), "--engine marian: expected one of torch, ctranslate2, onnx"),
    (dict(precision="fp64"), "--precision fp64: expected one of"),
    (dict(buffer_size=0), "--buffer-size: must be >= 1, got 0"),
    (dict(threads=-1), "--threads: must be >= 0 (0: one per CPU other work leaves free), got -1"),
    (dict(attention_layer=1), "--attention-layer needs --attention-png"),
    (dict(decode=DecodeOptions(beam=0)), "--beam: must be >= 1, got 0"),
    (dict(decode=DecodeOptions(alignment_layer=1)), "--alignment-layer needs --alignments (or "
                                                    "--alignment-threshold, --alignments-out)"),
    (dict(decode=DecodeOptions(alignments="hard"), output_format="scores"),
     "--alignments: word alignments go with --format text, nbest or json (or to --alignments-out), not with "
     "--format scores"),
    (dict(alignments_out=Path("a.txt"), engine="onnx"), "--alignments needs --engine torch or ctranslate2"),
    (dict(qe=True, output_format="tokens"), "--qe adds a column to --format text or a key to json, not to --format "
                                            "tokens"),
    (dict(decode=DecodeOptions(nbest=3), output_format="text"), "--nbest 3 lists hypotheses with --format nbest or "
                                                                "json; --format text prints the best one only"),
    (dict(attention_png=Path("a.png"), engine="ctranslate2"), "--attention-png needs --engine torch"),
])
def test_translate_options_check_names_the_flag(options, message):
    with pytest.raises(MtkitError) as error:
        TranslateOptions(**options).check()
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_translate_options_check_the_documented_order():
    """The first mistake in the order of the rules is the one said (the format, then the engine, then its
    settings, then the decoding options)."""
    with pytest.raises(MtkitError, match="^--format"):
        TranslateOptions(output_format="csv", engine="marian").check()
    with pytest.raises(MtkitError, match="^--engine"):
        TranslateOptions(engine="marian", buffer_size=0, decode=DecodeOptions(beam=0)).check()
    with pytest.raises(MtkitError, match="^--buffer-size"):
        TranslateOptions(buffer_size=0, decode=DecodeOptions(beam=0)).check()
    TranslateOptions().check()  # the defaults pass


def test_the_output_implies_alignments():
    assert TranslateOptions().decoding() == DecodeOptions()
    assert TranslateOptions(output_format="html").decoding() == DecodeOptions(alignments="hard")
    assert TranslateOptions(protect="%s").decoding() == DecodeOptions(alignments="hard")
    assert TranslateOptions(output_format="html", engine="onnx").decoding() == DecodeOptions()  # between tags
    assert TranslateOptions(alignments_out=Path("a")).decoding() == DecodeOptions(alignments="hard")
    soft = DecodeOptions(alignments="soft", alignment_threshold=0.3)
    assert TranslateOptions(alignments_out=Path("a"), decode=soft).decoding() == soft
    assert TranslateOptions(protect="%s").markup == "text" and TranslateOptions(output_format="xml").markup == "xml"


@pytest.mark.parametrize(("options", "message"), [
    (dict(metrics=[]), "--metrics: no metric given"),
    (dict(metrics=["meteor"]), "--metrics: unknown metric 'meteor'"),
    (dict(metrics=["confidence"]), "the metric confidence is the translating model's own: it needs --model"),
    (dict(hyp=[Path("h")], ref=[Path("r")], engine="onnx"), "--engine onnx needs --model"),
    (dict(testset="wmt14/full"), "--testset needs --langpair, e.g. --langpair en-de"),
    (dict(model=[Path("m")], src=Path("s")), "--model needs --src and --ref (or --testset and --langpair)"),
    (dict(model=[Path("m")], src=Path("s"), ref=[Path("r")], decode=DecodeOptions(beam=0)),
     "--beam: must be >= 1, got 0"),
])
def test_evaluate_options_check_names_the_flag(options, message):
    with pytest.raises(MtkitError) as error:
        EvaluateOptions(**options).check()
    assert str(error.value).startswith(message)


def test_evaluate_ignores_decoding_flags_without_a_model():
    EvaluateOptions(hyp=[Path("h")], ref=[Path("r")], decode=DecodeOptions(beam=0)).check()


def test_serve_options_check_the_decoding_options_and_the_beam_bound():
    with pytest.raises(MtkitError, match=r"^--beam: must be >= 1, got 0$"):
        ServeOptions(decode=DecodeOptions(beam=0)).check()
    with pytest.raises(MtkitError, match=r"^--beam 9: above --max-beam 8$"):
        ServeOptions(decode=DecodeOptions(beam=9)).check()
    with pytest.raises(MtkitError, match=r"^--batch-tokens: must be >= 1, got 0$"):
        ServeOptions(decode=DecodeOptions(batch_tokens=0)).check()
    ServeOptions(decode=DecodeOptions(beam=8, batch_tokens=100)).check()
