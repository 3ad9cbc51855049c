"""The cleaning filters of ``data.clean.filters``: each drops what it should and keeps what it should; the dual
cross-entropy ranking; the report."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mtkit.config import FiltersConfig, LangIdFilter, load_config
from mtkit.data import filters as F
from mtkit.data.report import cleaning_report, render_markdown, render_text, share_warnings, write_report
from mtkit.errors import MtkitError

GOOD = ("A man rides a bike down the street in 2014.", "Ein Mann fährt 2014 mit dem Fahrrad die Straße entlang.")


def test_nonprinting_drops_replacement_private_use_and_format_characters_and_keeps_joiners_and_nbsp():
    assert F.nonprinting(*GOOD) is None
    assert F.nonprinting("a\u00a0b c", "नमस्\u200dते") is None  # no-break space, zero-width joiner
    assert F.nonprinting("Das\ufffd Haus", "x") == "U+FFFD in the source"
    assert F.nonprinting("a", "b\ue000") == "U+E000 in the target"
    assert F.nonprinting("a\u200bb", "c") == "U+200B in the source"  # zero-width space (Cf)
    assert F.nonprinting("a\x07", "c") == "U+0007 in the source"


def test_alpha_drops_a_side_with_too_few_letters():
    test = F.alpha(0.5)
    assert test(*GOOD) is None
    assert test("Call 555 now", "Ruf 555 an") is None  # 7 letters of 10 characters
    assert test("#*%$ 12 @@ 99 !!", "Hallo") == "source 0% letters"
    assert test("Hello", "== 12.5 % ==") == "target 0% letters"
    assert F.alpha(0.0)("%%%", "###") is None


def test_repeats_drops_a_word_repeated_more_than_max_times_in_a_row_only():
    test = F.repeats(3)
    assert test("very very very good", "sehr sehr sehr gut") is None
    assert test("a b a b a b a b", "x") is None  # not in a row
    assert test("Hello", "Piste. piste. PISTE. Piste.") == "'piste.' over 3 times in a row in the target"


def test_copy_drops_a_target_equal_to_its_source_case_spaces_and_punctuation_aside():
    assert F.copy(1)(*GOOD) is None
    assert F.copy(1)("Two dogs play.", "two dogs play") == "target = source"
    assert F.copy(1)("Berlin", "Berlin!") == "target = source"
    assert F.copy(10)("Berlin", "Berlin") is None  # a name: under min_chars letters and digits
    assert F.copy(1)("...", "!!!") is None  # nothing to compare


def test_numbers_compares_digit_runs_with_separators_and_decimal_marks_aside():
    assert F.numbers(*GOOD) is None
    assert F.numbers("It costs 1,000.50 dollars", "Es kostet 1.000,50 Dollar") is None
    assert F.numbers("3 dogs and 12 cats", "12 Katzen und 3 Hunde") is None  # order aside
    assert F.numbers("3 dogs", "zwei Hunde") == "numbers 3 | (none)"
    assert F.numbers("in 2014", "im Jahr 2015") == "numbers 2014 | 2015"


def test_urls_compares_urls_and_email_addresses():
    assert F.urls(*GOOD) is None
    assert F.urls("See https://example.com/a.", "Siehe https://example.com/a") is None
    assert F.urls("Write to Ann@Example.org", "Schreib an ann@example.org.") is None
    assert F.urls("see www.a.com", "siehe www.b.com") == "URLs/e-mails www.a.com | www.b.com"
    assert F.urls("mail me", "mail an x@y.de") == "URLs/e-mails (none) | x@y.de"


def test_langid_drops_a_side_in_another_language_and_keeps_short_or_right_ones():
    pytest.importorskip("lingua", reason="lingua-language-detector (extra [clean]) not installed")
    test = F.langid(LangIdFilter(), "en", "de")
    assert test(*GOOD) is None
    assert test(GOOD[0], "Un homme fait du vélo dans la rue.") == "target is fr"
    assert test("Ein Mann fährt mit dem Fahrrad.", GOOD[1]) == "source is de"
    assert test("OK", "Oui") is None  # under min_chars letters: not judged
    # a language only the candidates list knows: Czech is not among the defaults, Italian is
    assert test(GOOD[0], "Un uomo va in bicicletta lungo la strada.") == "target is it"
    czech = F.langid(LangIdFilter(languages=("cs",)), "en", "de")
    assert czech(GOOD[0], "Muž jede na kole po ulici a usmívá se.") == "target is cs"


def test_langid_names_a_language_lingua_does_not_know():
    pytest.importorskip("lingua", reason="lingua-language-detector (extra [clean]) not installed")
    with pytest.raises(MtkitError, match="data.tgt_lang: lingua does not identify the language 'xx'"):
        F.langid(LangIdFilter(), "en", "xx")
    with pytest.raises(MtkitError, match="languages: lingua does not identify the language 'qq'"):
        F.langid(LangIdFilter(languages=("qq",)), "en", "de")
    assert F.langid(LangIdFilter(), "en-US", "pt_BR")("Hello there, my friend.", "Olá, meu amigo, tudo bem?") is None


def test_make_filters_runs_them_in_order_and_only_those_given():
    config = load_config(None, ["data.clean.filters={urls: {}, copy: {}, nonprinting: {}}"]).data.clean.filters
    assert [name for name, _ in F.make_filters(config, "en", "de")] == ["nonprinting", "copy", "urls"]
    assert F.filter_names(config) == ("nonprinting", "copy", "urls")
    assert F.make_filters(None, "en", "de") == [] and F.make_filters(FiltersConfig(), "en", "de") == []


@pytest.mark.parametrize(("sets", "problem"), [
    (["data.clean.filters={alpha: {min: 1.5}}"], "must be in [0, 1], got 1.5"),
    (["data.clean.filters={repeats: {max: 0}}"], "must be between 1 and 65536, got 0"),
    (["data.clean.filters={langid: {languages: [english]}}"],
     "must be ISO 639-1 codes such as [en, fr], got ['english']"),
    (["data.clean.filters={dual_xent: {forward: a.txt}}"],
     "must be a file of `mtkit score` output for data.train, got ''"),
    (["data.clean.filters={dual_xent: {forward: a, backward: b, keep: 0}}"], "must be in (0, 1], got 0.0"),
    (["data.clean.filters={copyy: {}}"], "unknown config key (did you mean 'copy'?)"),
    (["data.clean.warn_share=0"], "must be in (0, 1], got 0.0"),
])
def test_bad_filter_settings_are_one_line_errors_naming_the_key(sets, problem):
    with pytest.raises(MtkitError) as error:
        load_config(None, sets)
    assert str(error.value) == f"--set {sets[0]}: {problem}"


# ------------------------------------------------------------------ dual cross-entropy


def test_dual_xent_score_is_junczys_dowmunts_and_ranks_disagreement_and_entropy():
    forward = np.array([-1.0, -1.0, -4.0, -1.0, math.nan])
    backward = np.array([-1.0, -3.0, -4.0, -1.2, -1.0])
    score = F.dual_xent_scores(forward, backward)
    np.testing.assert_allclose(score[:4], [1.0, 2.0 + 2.0, 4.0, 0.2 + 1.1])
    assert score[4] == math.inf  # a pair the model could not score is last


def test_dual_xent_keep_keeps_the_best_share_from_score_files_of_either_format(tmp_path):
    fwd = tmp_path / "fwd.txt"
    fwd.write_text("-3.0\t-1.0\t3\n-20.0\t-5.0\t4\n-2.0\t-0.5\t4\n-9.0\t-3.0\t3\n")
    bwd = tmp_path / "bwd.jsonl"
    bwd.write_text("".join(json.dumps({"line": i + 1, "logprob": 0.0, "mean": m, "tokens": 3}) + "\n"
                           for i, m in enumerate([-1.0, -1.0, -0.5, None])))
    mask, score = F.dual_xent_keep(fwd, bwd, 0.5)
    assert mask.tolist() == [True, False, True, False]
    assert score[3] == math.inf
    items = list(F.with_dual_xent(iter("abcd"), mask, score, "where"))
    assert [(x, kept) for x, (kept, _) in items] == [("a", True), ("b", False), ("c", True), ("d", False)]
    with pytest.raises(MtkitError, match="where: scores 4 pairs, but data.train has more"):
        list(F.with_dual_xent(iter("abcde"), mask, score, "where"))
    with pytest.raises(MtkitError, match="where: scores 4 pairs, but data.train has 3"):
        list(F.with_dual_xent(iter("abc"), mask, score, "where"))


@pytest.mark.parametrize(("text", "problem"), [
    ("-1.0\t-0.5\n", "line 1: not a line of `mtkit score` output"),
    ("-1.0\t-0.5\t2\nnope\n", "line 2: not a line"),
    ('{"line": 1}\n', "line 1: not a line"),
    ("-1.0\t0.5\t2\n", "line 1: a mean log-probability must be <= 0"),
    ("-1.0\t-inf\t2\n", "line 1: a mean log-probability must be <= 0"),
])
def test_score_files_that_are_not_mtkit_score_output_are_one_line_errors(tmp_path, text, problem):
    path = tmp_path / "scores.txt"
    path.write_text(text)
    with pytest.raises(MtkitError, match=f"scores.txt: {problem}"):
        F.read_scores(path)
    other = tmp_path / "other.txt"
    other.write_text("-1\t-1\t1\n")
    with pytest.raises(MtkitError, match="has 1 line,"):
        F.dual_xent_keep(other, tmp_path / "two.txt" if (tmp_path / "two.txt").write_text("-1\t-1\t1\n" * 2)
                         else other, 0.5)


# ------------------------------------------------------------------ the report


def _manifest() -> dict:
    return {"splits": {"train": {"read": 10, "pairs": 6}},
            "dropped": {"train": {"empty": 1, "copy": 3, "duplicate": 0}},
            "examples": {"train": {"empty": [{"pair": 2, "src": "", "tgt": "x | y", "why": "source empty"}],
                                   "copy": [{"pair": 5, "src": "Hi", "tgt": "Hi", "why": "target = source"}]}}}


def test_the_report_has_each_rule_with_count_share_and_examples_and_warns_over_the_share(tmp_path):
    sections = cleaning_report(_manifest())
    assert [(r["rule"], r["dropped"], r["share"]) for r in sections[0]["rules"]] == \
        [("empty", 1, 0.1), ("copy", 3, 0.3), ("duplicate", 0, 0.0)]
    text = render_text(sections)
    assert "train: kept 6 of 10 pairs" in text and "copy" in text and "pair 5: target = source: 'Hi' | 'Hi'" in text
    markdown = render_markdown(sections)
    assert "| copy | 3 | 30.00% |" in markdown and "| 2 | source empty |  | x \\| y |" in markdown
    assert share_warnings(sections, 0.2) == ["warning: train: copy dropped 3 of 10 pairs (30.0%, over "
                                       "data.clean.warn_share 0.2): check its settings against the examples in "
                                       "the report"]
    write_report(sections, tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text()) == sections
    write_report(sections, tmp_path / "r.md")
    assert (tmp_path / "r.md").read_text() == markdown


def test_the_examples_kept_are_the_first_few_and_clipped():
    from mtkit.data.encode import EXAMPLE_CHARS, _Drops

    drops = _Drops(2)
    for n in range(5):
        drops.add("alpha", n + 1, "#" * 100_000, "ok", "source 0% letters")
    drops.add("duplicate", 9, None, None, "an earlier pair again")
    assert drops.counts == {"alpha": 5, "duplicate": 1}
    assert [e["pair"] for e in drops.examples["alpha"]] == [1, 2]
    assert len(drops.examples["alpha"][0]["src"]) == EXAMPLE_CHARS and drops.examples["alpha"][0]["tgt"] == "ok"
    assert drops.examples["duplicate"] == [{"pair": 9, "why": "an earlier pair again"}]
