"""mtkit.langid (lingua, among candidate languages) and the line reader of ``mtkit detect``, which keeps a
bounded prefix of each line."""

from __future__ import annotations

import io
import tracemalloc

import pytest

from mtkit import langid
from mtkit.commands.detect import PIECE_BYTES, bounded_lines, format_detection, parse_languages
from mtkit.errors import MtkitError

pytest.importorskip("lingua", reason="lingua-language-detector (extra [serve] or [clean]) not installed")

EN, DE, FR = "Two dogs are playing in the snow.", "Zwei Hunde spielen im Schnee.", "Deux chiens jouent dans la neige."


def test_detect_gives_each_text_its_languages_best_first():
    found = langid.detect([EN, DE, FR], ["en", "de", "fr"])
    assert [values[0][0] for values in found] == ["en", "de", "fr"]
    for values in found:
        confidences = [v for _, v in values]
        assert confidences == sorted(confidences, reverse=True) and all(0 < v <= 1 for v in confidences)
        assert sum(confidences) == pytest.approx(1.0, abs=1e-6)  # lingua's relative confidences
    assert langid.best(DE) == "de" and langid.best(EN, ("en", "de", "fr")) == "en"


def test_a_text_without_letters_has_no_language():
    assert langid.detect(["", "  ", "1234 5678", "!?"], ["en", "de"]) == [[], [], [], []]
    assert langid.best("42") is None


def test_one_candidate_is_every_text_s_language_and_codes_are_their_base_language():
    assert langid.detect([EN, "123"], ["de"]) == [[("de", 1.0)], []]
    assert langid.detect([FR], ["pt-BR", "fr_CA"])[0][0][0] == "fr"
    assert langid.candidates_of(["pt-BR", "pt", "EN", "de"]) == ("de", "en", "pt")


def test_an_unknown_code_is_an_error_naming_where_it_came_from():
    with pytest.raises(MtkitError, match=r"^--languages: lingua does not identify the language 'xx'$"):
        langid.candidates_of(["en", "xx"], "--languages")
    with pytest.raises(MtkitError, match="languages: give at least one language"):
        langid.detect([EN], [])
    assert langid.knows("de") and langid.knows("zh-Hant") and not langid.knows("qq")


def test_a_text_is_judged_on_its_prefix():
    """The first PREFIX_CHARS characters decide: German first, then a long English tail, is German."""
    german = (DE + " ") * (langid.PREFIX_CHARS // len(DE) + 1)
    assert langid.best(german + (EN + " ") * 5000, ("en", "de")) == "de"
    assert langid.best(" " * langid.PREFIX_CHARS + EN, ("en", "de")) is None  # nothing in the prefix


def test_a_detector_is_built_once_per_candidate_set():
    assert langid.identifier(("de", "en")) is langid.identifier(("de", "en"))
    assert langid.identifier(("de", "en")) is not langid.identifier(("de", "en", "fr"))


def test_prepare_builds_the_detector_detect_then_uses():
    langid.prepare(["it", "es"])
    misses = langid.identifier.cache_info().misses
    assert langid.detect(["Un uomo con un cappello rosso."], ["es", "it"])[0][0][0] == "it"
    langid.prepare(["pl"])  # one language: lingua is given it and a second, as detect gives them
    assert langid.detect(["Mężczyzna w czerwonym kapeluszu."], ["pl"]) == [[("pl", 1.0)]]
    assert langid.identifier.cache_info().misses == misses + 1  # built by prepare, never by detect


def _detect_in_child(texts: list[str], candidates: list[str]) -> list:
    return langid.detect(texts, candidates)


def test_a_process_forked_after_lingua_used_its_threads_still_detects():
    """prepare's cleaning workers are forked: lingua's thread pool, started here by loading models and by
    detecting several texts at once, has no threads there; lingua waiting for them would hang the worker."""
    import multiprocessing

    texts = ["Un homme avec un chapeau rouge.", "A man with a red hat.", "Ein Mann mit einem roten Hut."]
    langid.prepare(["de", "en", "fr"])
    here = langid.detect(texts, ["de", "en", "fr"])
    assert [found[0][0] for found in here] == ["fr", "en", "de"]
    with multiprocessing.get_context("fork").Pool(1) as pool:
        # a bound on a hang, not a timing assertion
        there = pool.apply_async(_detect_in_child, (texts, ["de", "en", "fr"])).get(timeout=120)
        assert [[code for code, _ in found] for found in there] == [[code for code, _ in found] for found in here]
        assert [value for found in there for _, value in found] == pytest.approx(
            [value for found in here for _, value in found], abs=1e-6)
        assert pool.apply_async(_detect_in_child, (texts, ["de", "en", "fr", "it"])).get(timeout=120)[0][0][0] == "fr"


def test_the_default_candidates_are_all_known_to_lingua():
    assert all(langid.knows(code) for code in langid.COMMON) and len(set(langid.COMMON)) == len(langid.COMMON)


# ------------------------------------------------------------------------------------------ mtkit detect's reader


def test_bounded_lines_keeps_a_prefix_and_strips_line_ends():
    data = f"{EN}\r\n\n{DE}\nno newline at the end".encode()
    assert list(bounded_lines(io.BytesIO(data), "x")) == [EN, "", DE, "no newline at the end"]
    assert list(bounded_lines(io.BytesIO(b"abcdef\n"), "x", keep=3)) == ["abc"]
    assert list(bounded_lines(io.BytesIO(b""), "x")) == []


def test_bounded_lines_reads_a_huge_line_in_pieces():
    """A 16 MB line (multi-byte characters across the piece boundaries): its prefix, then the next line, in
    memory far below the line's size."""
    line = "é" * (8 << 20)  # 16 MB of UTF-8
    data = (line + "\n" + EN + "\n").encode()
    stream = io.BytesIO(data)
    tracemalloc.start()
    try:
        got = list(bounded_lines(stream, "x"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == ["é" * langid.PREFIX_CHARS, EN]
    assert peak < 8 * PIECE_BYTES  # a few pieces, not the 16 MB line


def test_bounded_lines_names_invalid_utf8_even_past_the_prefix():
    tail = b"a" * (3 * PIECE_BYTES) + b"\xff"
    with pytest.raises(MtkitError, match=r"^in.txt: line 2: invalid UTF-8 \(byte 196609 of the line\)$"):
        list(bounded_lines(io.BytesIO(b"ok\n" + tail + b"\nnext\n"), "in.txt"))
    with pytest.raises(MtkitError, match="line 1: invalid UTF-8"):  # a character cut by the end of the input
        list(bounded_lines(io.BytesIO("é".encode()[:1]), "in.txt"))


def test_formatting_and_flags():
    assert format_detection([("de", 0.9234), ("en", 0.07)]) == "de\t92.3"
    assert format_detection([]) == ""
    assert parse_languages(" en, de ,fr,") == ("en", "de", "fr")
    assert parse_languages(None) == langid.COMMON
    with pytest.raises(MtkitError, match="--languages: give ISO 639-1 codes"):
        parse_languages(",")


def test_the_python_api_detects_a_text_or_a_list():
    import mtkit

    assert mtkit.detect("Ein Hund rennt durch den Schnee und bellt.")[0][0] == "de"
    found = mtkit.detect(["A dog runs through the snow.", "Un chien court dans la neige.", "42 !"], ["en", "fr"])
    assert [f[0][0] if f else None for f in found] == ["en", "fr", None]
    assert all(abs(sum(c for _, c in f) - 1) < 1e-6 for f in found if f)  # a distribution over the candidates
    with pytest.raises(MtkitError, match="expected a string or a list of strings"):
        mtkit.detect(["fine", 3])
