"""Language identification where users meet it: ``POST /detect`` and ``source: auto`` of LibreTranslate's
``/translate`` (routed per item to the model that translates from the item's language), and ``mtkit detect``.

The server is the real app behind the real middleware and uvicorn, in this process, serving three untrained
tiny Transformers (en -> de, fr -> de, de -> en; different shapes, so each model's output is its own): a
text sent with ``source: auto`` must come back exactly as the same text sent with its language as ``source``.
Multi30k's test captions (``../shared/data/multi30k`` beside the checkout, or ``MTKIT_MULTI30K``; skipped when
absent) measure /detect's accuracy.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("lingua", reason="lingua-language-detector (extra [serve]) not installed")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
pytest.importorskip("python_multipart")

from conftest import tiny_loaded  # noqa: E402 - after the skips
from inprocess import run_mtkit  # noqa: E402
from test_serve_libretranslate import Running  # noqa: E402

from mtkit.config import DecodeConfig  # noqa: E402
from mtkit.serve.models import ServedModel  # noqa: E402

MULTI30K = Path(os.environ.get("MTKIT_MULTI30K", Path(__file__).resolve().parents[2].parent / "shared/data/multi30k"))
EN = ["A man in a blue shirt is standing on a ladder cleaning windows.", "Two dogs are playing in the snow."]
FR = ["Un homme en chemise bleue nettoie les fenêtres.", "Deux chiens jouent dans la neige."]
DE = ["Ein Mann in einem blauen Hemd steht auf einer Leiter.", "Zwei Hunde spielen im Schnee."]
ES = "Un hombre con una camisa azul está limpiando las ventanas."
BODY_LIMIT, MAX_CHARS, MAX_SENTENCES = 2_000_000, 20_000, 256


def Served(models: list[ServedModel]) -> Running:  # noqa: N802 - a Running with this module's limits
    from mtkit.serve.service import Limits

    return Running(models, limits=Limits(max_chars=MAX_CHARS, max_sentences=MAX_SENTENCES), body_limit=BODY_LIMIT)


@pytest.fixture(scope="module")
def server():
    from mtkit.engines.torch_engine import TorchEngine

    decode = DecodeConfig(beam=1, max_len_a=0.0, max_len_b=8)

    def engine(**shape) -> TorchEngine:
        return TorchEngine(tiny_loaded(**shape), decode)

    s = Served([ServedModel("en-de", engine(), "en", "de"), ServedModel("fr-de", engine(h=2), "fr", "de"),
                ServedModel("de-en", engine(d_ff=96), "de", "en")])
    yield s
    s.stop()


def translated(server, q, source: str, target: str):
    status, answer = server.post_json("/translate", {"q": q, "source": source, "target": target})
    assert status == 200, answer
    return answer


# ------------------------------------------------------------------------------------------ /detect


def test_detect_answers_languages_best_first_on_libretranslates_scale(server):
    for text, language in ((EN[0], "en"), (FR[0], "fr"), (DE[0], "de"), (ES, "es")):
        status, answer = server.post_form("/detect", {"q": text})
        assert status == 200 and answer[0]["language"] == language, (text, answer)
        confidences = [d["confidence"] for d in answer]
        assert confidences == sorted(confidences, reverse=True) and all(0 < c <= 100 for c in confidences)
        assert set(answer[0]) == {"confidence", "language"}
    # A list: each language's mean over the items (LibreTranslate averages a list's too).
    status, answer = server.post_json("/detect", {"q": [EN[0], EN[1], FR[0]]})
    assert status == 200 and answer[0]["language"] == "en" and answer[1]["language"] == "fr"
    # No letters: no language, said as LibreTranslate says it (its default language, confidence 0).
    assert server.post_json("/detect", {"q": "1234 5678 !!"}) == (200, [{"confidence": 0.0, "language": "en"}])


def test_the_server_loads_the_identifier_before_it_serves():
    """lingua holds the GIL while it loads a language's models (seconds): left to the first /detect, every other
    request would wait as long. The server builds its detector, the models loaded, as it starts."""
    from mtkit import langid
    from mtkit.engines.torch_engine import TorchEngine

    langid.identifier.cache_clear()
    s = Served([ServedModel("en-de", TorchEngine(tiny_loaded(), DecodeConfig(beam=1, max_len_b=4)), "en", "de")])
    try:
        built = langid.identifier.cache_info()
        assert built.currsize == 1  # before any request
        status, answer = s.post_json("/detect", {"q": DE[0]})
        assert status == 200 and answer[0]["language"] == "de", answer
        assert langid.identifier.cache_info().misses == built.misses  # /detect used the one built at start
    finally:
        s.stop()


def test_detect_refuses_what_holds_no_text(server):
    assert server.post_json("/detect", {"q": ""}) == (400, {"error": "Invalid request: missing q parameter"})
    status, answer = server.post_json("/detect", {"q": " \n\t "})
    assert (status, answer) == (400, {"error": "Invalid request: q holds no text to detect a language in"})
    status, answer = server.post_json("/detect", {"q": [EN[0], "  "]})
    assert (status, answer) == (400, {"error": "Invalid request: q[1] holds no text to detect a language in"})
    status, answer = server.post_json("/detect", {"q": {"text": EN[0]}})
    assert status == 400 and "q must be a string or a list of strings" in answer["error"]
    status, _, body = server.request("POST", "/detect", b'{"q": "\\ud800 a lone surrogate"}', "application/json")
    assert 400 <= status < 500, body


def test_detect_is_right_on_multi30k_captions():
    """≥ 95 % of the first 200 test captions of each language (``/detect`` among the served languages and the
    common ones), one request per caption."""
    if not all((MULTI30K / f"test_2016_flickr.{lang}").is_file() for lang in ("en", "de", "fr")):
        pytest.skip(f"Multi30k's test captions are not in {MULTI30K} (set MTKIT_MULTI30K to its folder)")
    from mtkit.engines.torch_engine import TorchEngine

    s = Served([ServedModel("en-de", TorchEngine(tiny_loaded(), DecodeConfig(beam=1)), "en", "de")])
    try:
        for lang in ("en", "de", "fr"):
            captions = (MULTI30K / f"test_2016_flickr.{lang}").read_text(encoding="utf-8").splitlines()[:200]
            right = sum(s.post_form("/detect", {"q": caption})[1][0]["language"] == lang for caption in captions)
            assert right >= 0.95 * len(captions), (lang, right)
    finally:
        s.stop()


# ------------------------------------------------------------------------------------------ source auto


def test_auto_routes_each_item_to_the_model_of_its_language(server):
    mixed = [EN[0], FR[0], EN[1], FR[1], DE[0]]
    answer = translated(server, mixed, "auto", "de")
    by_model = {"en": translated(server, [EN[0], EN[1]], "en", "de")["translatedText"],
                "fr": translated(server, [FR[0], FR[1]], "fr", "de")["translatedText"]}
    assert answer["translatedText"] == [by_model["en"][0], by_model["fr"][0], by_model["en"][1], by_model["fr"][1],
                                        DE[0]]  # German into German: as it is, as LibreTranslate answers it
    assert by_model["en"] != by_model["fr"]  # the two models differ: the routing shows
    assert [d["language"] for d in answer["detectedLanguage"]] == ["en", "fr", "en", "fr", "de"]
    assert all(0 < d["confidence"] <= 100 for d in answer["detectedLanguage"])
    # A string: one detectedLanguage object; the other direction through the third model.
    answer = translated(server, DE[1], "auto", "en")
    assert answer["translatedText"] == translated(server, DE[1], "de", "en")["translatedText"]
    assert answer["detectedLanguage"]["language"] == "de"


def test_auto_with_markup_and_quality_estimates(server):
    """format html: each item's markup parsed for its own model; qe: none for an item kept as it is."""
    status, answer = server.post_json("/translate", {"q": [f"<p>{EN[1]}</p>", f"<p>{DE[1]}</p>", f"<b>{FR[1]}</b>"],
                                                     "source": "auto", "target": "de", "format": "html", "qe": True})
    assert status == 200, answer
    assert [d["language"] for d in answer["detectedLanguage"]] == ["en", "de", "fr"]
    assert answer["translatedText"][1] == f"<p>{DE[1]}</p>" and answer["translatedText"][0].startswith("<p>")
    assert isinstance(answer["qe"][0], float) and answer["qe"][1] is None and isinstance(answer["qe"][2], float)
    status, answer = server.post_json("/translate", {"q": [EN[1], "<b>broken"], "source": "auto", "target": "de",
                                                     "format": "html"})
    assert status == 400 and answer["error"].startswith("q[1]: ")


def test_auto_names_a_language_no_model_translates(server):
    status, answer = server.post_json("/translate", {"q": [EN[0], ES], "source": "auto", "target": "de"})
    assert status == 400
    assert answer["error"].startswith("q[1] is Spanish (es) (detected, confidence ")
    assert answer["error"].endswith("this server translates into German (de) from English (en), French (fr) only: "
                                    "give source")
    status, answer = server.post_json("/translate", {"q": FR[0], "source": "auto", "target": "en"})
    assert status == 400 and answer["error"].startswith("q is French (fr) (detected")
    assert "from German (de) only" in answer["error"]
    # No model translates into the target at all: said before any detection.
    status, answer = server.post_json("/translate", {"q": EN[0], "source": "auto", "target": "fr"})
    assert status == 400 and "auto-fr is not supported" in answer["error"]


def test_auto_with_items_too_short_to_tell_translates_them(server):
    """A text lingua is unsure of goes to the likeliest language a model translates from (rather than a 400);
    one without letters goes with the request's language, at confidence 0."""
    answer = translated(server, [EN[0], "1234", "OK"], "auto", "de")
    assert answer["detectedLanguage"][1] == {"confidence": 0.0, "language": "en"}
    assert answer["detectedLanguage"][2]["language"] in ("en", "fr")
    assert answer["translatedText"][1] == translated(server, "1234", "en", "de")["translatedText"]


def test_hostile_sizes_get_a_4xx_or_a_bounded_answer(server):
    """A 1 MB q (within this server's body limit): /detect judges its prefix; /translate holds to --max-chars."""
    megabyte = "Zwei Hunde spielen im Schnee. " * 35_000
    status, answer = server.post_json("/detect", {"q": megabyte})
    assert status == 200 and answer[0]["language"] == "de"
    status, answer = server.post_json("/detect", {"q": [megabyte[:60_000]] * 16})  # a list: each item's prefix
    assert status == 200 and answer[0]["language"] == "de"
    status, answer = server.post_json("/translate", {"q": megabyte, "source": "auto", "target": "en"})
    assert (status, answer) == (400, {"error": f"Invalid request: request ({len(megabyte)}) exceeds text limit "
                                               f"({MAX_CHARS})"})
    many = ["a"] * 10_000
    for path in ("/detect", "/translate"):
        status, answer = server.post_json(path, {"q": many, "source": "auto", "target": "de"})
        assert (status, answer) == (400, {"error": f"Invalid request: request (10000) exceeds text limit "
                                                   f"({MAX_SENTENCES})"}), path


# ------------------------------------------------------------------------------------------ mtkit detect


def test_mtkit_detect_prints_a_language_and_a_confidence_per_line(tmp_path):
    text = tmp_path / "mixed.txt"
    text.write_text("\n".join([EN[0], "", DE[0], "12 34", FR[0]]) + "\n", encoding="utf-8")
    result = run_mtkit("detect", text)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert len(lines) == 6 and lines[-1] == ""  # one output line per input line
    assert [line.split("\t")[0] for line in lines[:5]] == ["en", "", "de", "", "fr"]
    for line in (lines[0], lines[2], lines[4]):
        value = line.split("\t")[1]
        assert 0 < float(value) <= 100 and len(value.split(".")[1]) == 1
    # stdin, and the candidates restricted: Spanish among en and fr only is one of them
    result = run_mtkit("detect", "--languages", "en,fr", stdin=ES + "\n")
    assert result.returncode == 0 and result.stdout.split("\t")[0] in ("en", "fr")
    result = run_mtkit("detect", "-l", "de", stdin=EN[0] + "\n\n")
    assert result.stdout == "de\t100.0\n\n"  # one candidate: every line with letters is in it


def test_mtkit_detect_names_bad_input(tmp_path):
    from conftest import one_error

    bad = tmp_path / "bad.txt"
    bad.write_bytes(EN[0].encode() + b"\n" + b"caf\xe9\n" + DE[0].encode() + b"\n")
    result = run_mtkit("detect", bad)
    assert one_error(result) == f"error: {bad}: line 2: invalid UTF-8 (byte 4 of the line)"
    assert result.stdout.split("\t")[0] == "en"  # the line before it was answered
    assert one_error(run_mtkit("detect", "-l", "en,xx", bad)) == (
        "error: --languages: lingua does not identify the language 'xx'")
    assert one_error(run_mtkit("detect", "-l", " , ", bad)).startswith("error: --languages: give ISO 639-1 codes")
    assert one_error(run_mtkit("detect", tmp_path / "missing.txt")).startswith("error: ")


def test_mtkit_detect_holds_a_huge_line_to_a_prefix(tmp_path):
    """A 20 MB line without a newline: answered from its prefix, the lines after it too (the tail is read in
    pieces: the process keeps no 20 MB string, which the unit tests check on the reader itself)."""
    huge = tmp_path / "huge.txt"
    with huge.open("w", encoding="utf-8") as f:
        f.write("Zwei Hunde spielen im Schnee. " * 700_000)
        f.write("\n" + EN[1] + "\n")
    result = run_mtkit("detect", huge)
    assert result.returncode == 0, result.stderr
    assert [line.split("\t")[0] for line in result.stdout.splitlines()] == ["de", "en"]


def test_the_spec_describes_detect(server):
    status, spec = server.json("GET", "/spec")
    assert status == 200
    detect = spec["paths"]["/detect"]["post"]
    assert "best first" in detect["responses"]["200"]["description"]
    assert "no detection" not in json.dumps(detect)
