"""Constraint files and glossaries (issue #24): what they accept, what they match, and one-line errors
that name the file and line."""

from __future__ import annotations

import pytest

from mtkit.engines.constraints import Constraints, constraint_source, encode_constraints, read_constraints, unmet
from mtkit.errors import MtkitError
from mtkit.text.glossary import Glossary


def test_constraints_file_one_object_per_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"include": ["Kaffeetasse"], "exclude": ["Tasse"]}\n{}\n{"exclude": ["a b", "a b"]}\n',
                    encoding="utf-8")
    assert read_constraints(path) == [Constraints(("Kaffeetasse",), ("Tasse",)), Constraints(),
                                      Constraints((), ("a b",))]
    assert not Constraints() and Constraints(("x",))


@pytest.mark.parametrize("line,problem", [
    ('{"include": ["x"]', "malformed JSON"),
    ('["x"]', "expected a JSON object"),
    ('{"include": "x"}', "include must be a list of strings"),
    ('{"include": ["  "]}', "empty phrase"),
    ('{"inclde": ["x"]}', "unknown key 'inclde'"),
    ('{"include": ["x"], "exclude": ["x"]}', "both included and excluded"),
    ("", "empty; write {} for a line without constraints"),
])
def test_a_bad_line_is_one_error_naming_file_and_line(tmp_path, line, problem):
    path = tmp_path / "c.jsonl"
    path.write_text("{}\n" + line + "\n{}\n", encoding="utf-8")
    with pytest.raises(MtkitError) as e:
        read_constraints(path)
    message = str(e.value)
    assert message.startswith(f"--constraints {path}: line 2: ") and problem in message
    assert "\n" not in message


def test_a_missing_line_is_an_error_naming_the_flag():
    source = constraint_source([Constraints(("a",))], None, "--constraints c.jsonl")
    assert source(0, "x") == Constraints(("a",))
    with pytest.raises(MtkitError, match=r"--constraints c.jsonl: has 1 line, but the input has more \(line 2\)"):
        source(1, "y")


def test_glossary_matches_whole_words_in_any_case_the_longest_first(tmp_path):
    path = tmp_path / "g.tsv"
    path.write_text("# terms\ncoffee cup\tKaffeetasse\ncup\tTasse\ncafé\tCafé\n\nÜber\tvia\n", encoding="utf-8")
    g = Glossary.read(path)
    assert len(g) == 4
    assert g.constraints("A COFFEE CUP and a Cup.").include == ("Kaffeetasse", "Tasse")
    assert g.constraints("cupboards and teacups").include == ()  # not inside a longer word
    assert g.constraints("Le Café-bar").include == ("Café",)
    assert g.constraints("cafés").include == ()  # é and s are word characters
    assert g.constraints("über alles").include == ("via",)
    assert g.constraints("nothing here") == Constraints()


@pytest.mark.parametrize("text,problem", [
    ("a\tb\tc\n", "line 1: expected 'source term<TAB>target term', found 3 tab-separated fields"),
    ("a b\n", "line 1: expected 'source term<TAB>target term', found 1 tab-separated field"),
    ("x\ty\n\ta\n", "line 2: expected a source term and a target term"),
    ("Cup\tTasse\ncup\tBecher\n", "line 2: 'cup' already has the target term 'Tasse' (--glossary"),
])
def test_a_bad_glossary_line_is_one_error_naming_it(tmp_path, text, problem):
    path = tmp_path / "g.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(MtkitError) as e:
        Glossary.read(path)
    assert str(e.value).startswith(f"--glossary {path}: ") and problem in str(e.value)


class CharVocab:
    """Encodes text as its characters' code points, lowercased (as a case-folding SentencePiece model)."""

    def encode_tgt(self, text: str) -> list[int]:
        return [ord(c) for c in text.lower()]

    def decode_tgt(self, ids) -> str:
        return "".join(map(chr, ids))


def test_encoding_keeps_what_the_model_writes_and_drops_phrases_inside_others():
    c = Constraints(include=("Cup", "coffee cup", "CUP", "tea"), exclude=("mug",))
    encoded = encode_constraints(c, CharVocab())
    assert encoded.texts == ("coffee cup", "tea")  # "Cup" comes with "coffee cup"; "CUP" is "cup" again
    assert encoded.include == (tuple(map(ord, "coffee cup")), tuple(map(ord, "tea")))
    assert encoded.exclude == (tuple(map(ord, "mug")),)
    assert encode_constraints(Constraints(), CharVocab()) is None
    assert unmet(encoded, "a coffee cup of tea") == []
    assert unmet(encoded, "a coffee cup") == ["tea"]


def test_a_line_holds_a_bounded_number_of_phrases(tmp_path):
    """More than MAX_LINE_PHRASES phrases on one line, in a constraints file (counted before any phrase
    is checked) or with a glossary's matches, is one error naming the file and line, or the input line."""
    import json

    from mtkit.engines.constraints import MAX_LINE_PHRASES

    path = tmp_path / "c.jsonl"
    many = [f"w{i}" for i in range(MAX_LINE_PHRASES + 1)]
    path.write_text("{}\n" + json.dumps({"include": many[:100], "exclude": many[100:]}) + "\n")
    with pytest.raises(MtkitError, match=rf"^--constraints {path}: line 2: {len(many)} constraint phrases, more than "
                                         rf"the {MAX_LINE_PHRASES} a line may hold"):
        read_constraints(path)
    path.write_text(json.dumps({"include": many[1:]}) + "\n")
    assert len(read_constraints(path)[0].include) == MAX_LINE_PHRASES
    source = constraint_source(read_constraints(path), Glossary([("alpha", "w0", "glossary line 1")]))
    assert len(source(0, "bravo").include) == MAX_LINE_PHRASES
    with pytest.raises(MtkitError, match=r"^input line 1 \(with the glossary's matches\): 257 constraint phrases"):
        source(0, "alpha bravo")
