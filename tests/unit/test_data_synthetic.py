"""The demo corpus: correct number words, deterministic, disjoint splits, short sentences."""

import pytest

from mtkit.data.synthetic import demo_pairs, english, german


@pytest.mark.parametrize(
    "n, en, de",
    [
        (0, "zero", "null"),
        (1, "one", "eins"),
        (17, "seventeen", "siebzehn"),
        (21, "twenty-one", "einundzwanzig"),
        (30, "thirty", "dreißig"),
        (100, "one hundred", "einhundert"),
        (101, "one hundred one", "einhunderteins"),
        (342, "three hundred forty-two", "dreihundertzweiundvierzig"),
        (999, "nine hundred ninety-nine", "neunhundertneunundneunzig"),
    ],
)
def test_number_words(n, en, de):
    assert english(n) == en
    assert german(n) == de


def test_deterministic_in_seed():
    assert list(demo_pairs(200, seed=3)) == list(demo_pairs(200, seed=3))
    assert list(demo_pairs(200, seed=3)) != list(demo_pairs(200, seed=4))


def test_splits_are_disjoint_and_short():
    train = {en for en, _ in demo_pairs(5000, seed=1, split="train")}
    valid = {en for en, _ in demo_pairs(500, seed=1, split="valid")}
    test = {en for en, _ in demo_pairs(500, seed=1, split="test")}
    assert not train & valid and not train & test and not valid & test
    for en, de in demo_pairs(2000):
        assert len(en.split()) <= 15
        assert en.count(" and ") == de.count(" und ")
