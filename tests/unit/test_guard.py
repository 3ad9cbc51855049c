"""The integrity guard's text side (mtkit.text.guard): what a source protects, in which forms a translation may
keep it, whole-token multiset matching, loops, and bounded work on hostile lines."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mtkit.text.guard import MAX_PROTECTED, Protected, looping, missing, protected_tokens


def found(source, src="en", tgt="de"):
    return [(t.text, t.kind) for t in protected_tokens(source, src, tgt)]


def renderings(source, src="en", tgt="de"):
    (token,) = protected_tokens(source, src, tgt)
    return token.renderings


def lacks(source, translation, src="en", tgt="de"):
    return [t.text for t in missing(protected_tokens(source, src, tgt), translation)]


# --- what is protected ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("source, expected", [
    ("A dog with 24 balloons.", [("24", "number")]),
    ("He paid 1,250 dollars.", [("1,250", "number")]),
    ("It is 3.5 meters long.", [("3.5", "number")]),
    ("It was -5 degrees.", [("-5", "number")]),
    ("Prices fell 50% today.", [("50", "number")]),
    ("A shirt for $5 and a hat for 5 €.", [("5", "number"), ("5", "number")]),
    ("She came 21st in the race.", [("21st", "number")]),
    ("They met at 10:30.", [("10:30", "time")]),
    ("Born on 12/24/2020.", [("12/24/2020", "date")]),
    ("Born on 2020-12-24.", [("2020-12-24", "date")]),
    ("Born on 24.12.2020.", [("24.12.2020", "date")]),
    ("Photo 4711 of room A-113, ISBN 978-3-16-148410-0.",
     [("4711", "number"), ("A-113", "code"), ("978-3-16-148410-0", "number")]),
    ("See www.example.com/x, or https://example.org/a?b=1.", [("www.example.com/x", "url"),
                                                              ("https://example.org/a?b=1", "url")]),
    ("Mail john.doe+x@example.co.uk today.", [("john.doe+x@example.co.uk", "email")]),
])
def test_each_kind_is_found(source, expected):
    assert found(source) == expected


@pytest.mark.parametrize("placeholder", ["{name}", "{0}", "{}", "%s", "%d", "%(x)d", "%1$s", "{{x}}", "{{ user.name }}",
                                         '<x id="1"/>', "</g>", "$VAR", "${x}", ":name"])
def test_placeholders_are_kept_verbatim(placeholder):
    source = f"Hello {placeholder} and welcome."
    assert protected_tokens(source, "en", "de") == [Protected(placeholder, "placeholder", (placeholder,))]
    assert lacks(source, f"Hallo {placeholder} und willkommen.") == []
    assert lacks(source, "Hallo und willkommen.") == [placeholder]


def test_words_that_only_look_like_tokens_are_not_protected():
    assert found("A 3-year-old eats 50 % of the cake: well-known, e.g. a man.") == [("3", "number"),
                                                                                    ("50", "number")]
    assert found("A man in a red shirt is running.") == []


def test_every_token_is_found_in_its_own_source():
    """Each token's source form is a whole token where the source has it: a source is its own translation."""
    sources = ["Two men with 4 and 4 balloons paid 1,250.50 dollars at 10:30 pm on 12/24/2020.",
               "Room A-113, -5 degrees, 3.5 m, 50%, the 21st, www.example.com/x (a@b.org) {name} %s",
               "1,25 and 1.250 and 2 100-meter races and 05/06/2020 and 978-3-16-148410-0 and 3:2 and 1/2"]
    for source in sources:
        for src, tgt in (("en", "de"), ("en", "fr"), (None, None), ("de", "en")):
            tokens = protected_tokens(source, src, tgt)
            assert tokens and missing(tokens, source) == [], (source, src, tgt)


# --- the target's conventions --------------------------------------------------------------------------------

def test_english_numbers_in_german_and_french():
    assert renderings("It cost 1,250.50 dollars.")[0] == "1.250,50"
    assert renderings("It cost 1,250.50 dollars.", tgt="fr")[0] == "1 250,50"
    assert renderings("It is 3.5 meters.")[0] == "3,5"
    assert lacks("It cost 1,250.50 dollars.", "Es kostete 1.250,50 Dollar.") == []
    assert lacks("It cost 1,250.50 dollars.", "Es kostete 1,250.50 Dollar.") == []  # the source's form too
    for space in (" ", "\u00a0", "\u202f"):
        assert lacks("It cost 1,250.50 dollars.", f"Il a coûté 1{space}250,50 dollars.", tgt="fr") == []
    assert lacks("It cost 1,250.50 dollars.", "Es kostete 1.250 Dollar.") == ["1,250.50"]


def test_a_number_written_the_targets_way_is_kept_as_is():
    assert lacks("Es kostete 1.250,50 Euro.", "It cost 1,250.50 euros.", src="de", tgt="en") == []
    assert lacks("Es kostete 1.250,50 Euro.", "It cost 1.250,50 euros.", src="de", tgt="en") == []
    assert renderings("Il a coûté 1 250,50 euros.", src="fr", tgt="en")[0] == "1,250.50"


def test_the_source_language_decides_what_a_separator_means():
    assert renderings("1,250 people", src="en", tgt="de")[0] == "1.250"  # thousands in English
    assert renderings("1,25 Meter", src="de", tgt="en")[0] == "1.25"  # a decimal in German
    assert renderings("1.250 Leute", src="de", tgt="en")[0] == "1,250"
    assert renderings("1.250 liters", src="en", tgt="de")[0] == "1,250"  # English 1.250 is 1.25
    assert renderings("1,25 apples", src="en", tgt="de") == ("1,25",)  # no English number: as written
    assert renderings("1,250 people", src=None, tgt="de") == ("1,250",)  # 1250 or 1.25: as written only
    assert renderings("1,250.50 people", src=None, tgt="de")[0] == "1.250,50"  # only one reading
    assert renderings("1'250.50 Franken", src="de-CH", tgt="en")[0] == "1,250.50"


def test_times_dates_ordinals_in_the_target_convention():
    assert renderings("at 10:30 pm")[0] == "22:30"
    assert "10:30" in renderings("at 10:30 pm")
    assert "10h30" in renderings("at 10:30", tgt="fr")
    assert renderings("at 7.45 pm")[0] == "19:45" and "7.45" in renderings("at 7.45 pm")  # a British time
    assert renderings("for 7.45 dollars")[0] == "7,45"  # a decimal
    assert renderings("on 12/24/2020")[0] == "24.12.2020"
    assert renderings("on 12/24/2020", tgt="fr")[0] == "24/12/2020"
    assert {"12/24/2020", "2020-12-24"} <= set(renderings("on 12/24/2020"))
    assert renderings("on 05/06/2020") == ("05/06/2020",)  # US or British: as written only
    assert renderings("le 05/06/2020", src="fr", tgt="de")[0] == "05.06.2020"  # French is d/m
    assert renderings("the 21st")[:1] == ("21.",)
    assert renderings("the 1st", tgt="fr")[0] == "1er"
    assert lacks("the 21st runner", "der 21. Läufer") == []
    assert lacks("the 21st runner", "der 21 Läufer") == ["21st"]


def test_small_counts_may_be_written_in_words():
    assert lacks("2 girls and 1 boy.", "Zwei Mädchen und ein Junge.") == []
    assert lacks("2 girls and 2 boys.", "Zwei Mädchen und zweite Jungen.") == ["2"]  # "zweite" is no "zwei"
    assert lacks("3 dogs", "trois chiens", tgt="fr") == []
    assert lacks("30 dogs", "dreißig Hunde") == ["30"]  # beyond twelve: digits
    assert lacks("for 2.00 euros", "für 2 Euro") == []  # a zero fraction may go
    assert renderings("2 girls")[0] == "2"  # the form to force stays the digits


# --- matching ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("translation", ["240 Ballons", "2.24 Ballons", "2,24 Ballons", "A-24", "324", "24.5",
                                         "10:24", "12/24", "x24"])
def test_a_rendering_matches_only_as_a_whole_token(translation):
    assert lacks("with 24 balloons", translation) == ["24"]


@pytest.mark.parametrize("translation", ["24 Ballons", "(24)", "24.", "24, 25", "24%", "$24", "24km", "-24-"])
def test_a_whole_token_may_stand_beside_punctuation(translation):
    assert lacks("with 24 balloons", translation) == []


def test_tokens_are_counted_as_a_multiset():
    assert lacks("4 and 4 dogs", "4 und 4 Hunde") == []
    assert lacks("4 and 4 dogs", "4 Hunde") == ["4"]
    assert lacks("4 and 4 dogs", "44 Hunde") == ["4", "4"]
    assert lacks("{x} {x}", "{x}") == ["{x}"]
    # one occurrence serves one token, assigned so that the most are met: 1250 may be 1,250's or 1250's
    tokens = [Protected("1,250", "number", ("1250", "1.250")), Protected("1250", "number", ("1250",))]
    assert missing(tokens, "1250 und 1.250") == []  # the first token's first choice moves over to 1.250
    assert len(missing(tokens, "1250")) == 1


# --- loops ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("translation", ["(P1 (P1 (P1 (P1", "Ein Mann der der der der Hund", "a b c a b c a b c",
                                         "Ein Hund Ein Hund Ein Hund läuft.", "(P1(P1(P1(P1"])
def test_loops_are_found(translation):
    assert looping(translation, "A man with a dog.")


@pytest.mark.parametrize("translation", ["Ein Mann mit einem Hund.", "Die Frau, die die Zeitung liest.",
                                         "Haha, ein Hund.", "Er sagte: nein, nein!", ""])
def test_normal_sentences_do_not_loop(translation):
    assert not looping(translation, "A man with a dog.")


def test_a_loop_the_source_has_is_no_loop():
    assert not looping("Ha ha ha, sagte er.", "Ha ha ha, he said.")
    assert not looping("Los, los, los!", "Go, go, go!")
    assert not looping("hahahaha", "hahahaha")
    assert looping("Ha ha ha ha ha ha ha ha", "Ha ha ha, he said.")


# --- hostile input -------------------------------------------------------------------------------------------

HOSTILE = {
    "a 1 MB line of digits and separators": '"1,234.5 6\'7 8.9:10/11-12 " * 40000',
    "1,1,1,... (1 MB)": '"1," * 500000',
    "one run of a million digits": '"1" * 1000000',
    "10,000 placeholders": '"{x} %s " * 10000',
    "nested braces": '"{" * 300000 + "x" + "}" * 300000',
    "a 1 MB e-mail local part": '"a.b+c-" * 170000',
    "a 1 MB URL": '"www." + "a/" * 500000',
    "percent signs": '"%(" * 500000',
    "an open tag": '"<a " * 300000',
    "codes": '"A-1-" * 250000',
    "space-grouped digits": '"1 " + "234 " * 250000',
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_lines_finish_with_a_bounded_result(name):
    """Each runs in its own process under a time limit (a pattern that backtracks would hang, not fail)."""
    code = textwrap.dedent(f"""
        from mtkit.text.guard import MAX_PROTECTED, looping, missing, protected_tokens
        line = {HOSTILE[name]}
        tokens = protected_tokens(line, "en", "de")
        assert len(tokens) <= MAX_PROTECTED, len(tokens)
        assert sum(len(r) for t in tokens for r in t.renderings) <= 64 * 4096
        assert missing(tokens, line) == []
        looping(line, line[:1000])
        print(len(tokens))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_cap_is_respected_and_keeps_the_first_tokens():
    line = " ".join(f"{{p{i}}}" for i in range(10_000))
    tokens = protected_tokens(line)
    assert len(tokens) == MAX_PROTECTED
    assert [t.text for t in tokens[:3]] == ["{p0}", "{p1}", "{p2}"]


# --- the test set (benchmarks/real_text_sets.py) --------------------------------------------------------------

def _sets():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import real_text_sets
    finally:
        sys.path.pop(0)
    return real_text_sets


def test_the_number_captions_are_the_same_on_every_run_and_each_protects_something():
    sets = _sets()
    captions = ["A man in an orange hat starring at something.", "Two dogs run on the grass!", "A girl jumps"]
    made = sets.number_captions(300, seed=1, captions=captions)
    code = ("import sys; sys.path.insert(0, 'benchmarks'); from real_text_sets import number_captions; "
            f"print(repr(number_captions(300, seed=1, captions={captions!r})))")
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                           cwd=Path(__file__).resolve().parents[2])
    assert repr(made) == again.stdout.strip()  # another process (another hash seed) makes the same set
    assert len(made) == 300 and made != sets.number_captions(300, seed=2, captions=captions)
    assert all(protected_tokens(line, "en", "de") for line in made)
    kinds = {t.kind for line in made for t in protected_tokens(line, "en", "de")}
    assert kinds == {"number", "time", "date", "code", "url", "email", "placeholder"}
    assert made[0].startswith("A man in an orange hat starring at something ") and made[0].endswith(".")


def test_paragraphs_join_consecutive_lines():
    sets = _sets()
    assert sets.paragraphs(["a.", "b.", "c.", "d."], k=3) == ["a. b. c.", "d."]
    assert sets.paragraphs([], k=3) == []
