"""The integrity guard's text side: what of a source sentence its translation must keep, and whether a
translation has run into a loop.

* :func:`protected_tokens`: a source's numbers (digits with their separators, decimals, negatives,
  percentages' and amounts' numbers, ordinals written with digits), times (``10:30``), dates
  (``12/24/2020``, ``2020-12-24``, ``24.12.2020``), codes (``A-113``, ``COVID-19``; runs of digits such as
  ``4711`` are numbers), URLs, e-mail addresses and placeholders (``{name}``, ``{0}``, ``{{x}}``, ``%s``,
  ``%(x)d``, ``<x id="1"/>``, ``$VAR``, ``${x}``, ``:name``), each with the forms a translation may write
  it in: the target language's convention first (en ``1,250.50`` is de ``1.250,50``, fr ``1 250,50``),
  then the other forms that mean the same (the source's own form included: many translations keep it;
  0-12 in words too, in the languages :data:`_WORDS` knows: "2 girls" is "zwei Mädchen").
* :func:`missing`: which of them a translation lacks, counted as a multiset ("4 and 4" needs two 4s),
  each rendering matched as a whole token only (``24`` is not in ``240``, ``2.24`` or ``A-24``).
* :func:`looping`: whether a translation repeats a word n-gram (or, inside a word, a few characters) in a
  loop its source does not have (``(P1 (P1 (P1 (P1``, ``der der der der``).

Reading a number follows the source language's convention (``src_lang``): en ``1,250`` is 1250, de
``1,250`` is 1.25. A form the source language cannot read (en ``1,25``), or, without ``src_lang``, a form
the conventions read as different numbers (``1,250``, ``05/06/2020``), is guarded as written only. Language
codes are ISO 639-1, a region allowed (``de-CH`` writes ``1’250.50``); an unknown target language gets the
source's forms.

Bounded work for any input: the source is scanned once, left to right, by one pattern with no quantifier
that backtracks (possessive runs, fixed-width look-arounds); a run of digits and separators longer than
:data:`MAX_NUMBER_CHARS`, or a URL, address or placeholder longer than :data:`MAX_TOKEN_CHARS`, is not
guarded, and at most :data:`MAX_PROTECTED` tokens are kept per sentence: the scan stops there and the
rest of the sentence is not guarded. :func:`missing` scans the translation once per distinct rendering;
:func:`looping` takes time linear in the text's length (times the few periods it tries).

No torch here.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

MAX_PROTECTED = 64  # tokens guarded per sentence: the scan stops at the 64th, the rest is not guarded
MAX_NUMBER_CHARS = 48  # a longer run of digits and separators is no number a translation keeps whole
MAX_TOKEN_CHARS = 256  # a longer URL, address or placeholder is not guarded
MAX_NGRAM = 8  # the longest word n-gram :func:`looping` looks for
LOOP_REPEATS = 3  # a word n-gram this many times in a row is a loop
CHAR_PERIODS = range(2, 9)  # inside a word, a unit of 2-8 characters ...
CHAR_REPEATS = 4  # ... this many times in a row is a loop ("hahaha" is not; "(P1(P1(P1(P1" is)

# Characters that join digits into one number, time, date or code: "24" is no whole token in "2.24",
# "1,24", "10:24", "12/24" or "3-24" (nor after a letter and a hyphen: "A-24").
_JOIN = ".,'’:/\\-\u00a0\u202f"
_BEFORE = rf"(?<!\w)(?<![0-9][{_JOIN}])(?<![^\W\d_]-)"
_AFTER_DIGIT = rf"(?![0-9])(?![{_JOIN}][0-9])"
_SPACES = (" ", "\u00a0", "\u202f")  # a space-grouping language's thousands: forced with U+0020 (see _render)

_SCAN = re.compile(
    r"(?P<url>(?<![\w@.])(?:(?:https?|ftp)://|www\.)[^\s<>\"]++)"
    r"|(?P<email>(?<![\w.+-])[A-Za-z0-9._+-]++@[A-Za-z0-9-]++(?:\.[A-Za-z0-9-]++)++)"
    r"|(?P<placeholder>\{\{[^{}]*+\}\}"  # {{x}}
    r"|\$?\{[^{}\s]*+\}"  # {name} {0} {} ${x}
    r"|(?<![0-9%])%(?:\([A-Za-z_]\w*+\))?(?:[0-9]++\$)?[-+#0]?[0-9]*+(?:\.[0-9]++)?[sdifuxXeEgGcr](?!\w)"  # %s %(x)d
    r"|</?[A-Za-z][^<>]*+>"  # <x id="1"/> <g> </g>
    r"|\$[A-Za-z_]\w*+"  # $VAR
    r"|(?<![\w:/]):[A-Za-z_]\w*+)"  # :name
    rf"|(?P<code>(?<![\w-])[A-Za-z]{{1,8}}+-?[0-9][A-Za-z0-9]*+(?:-[A-Za-z0-9]++)*+(?![{_JOIN}][0-9]))"
    rf"|(?P<number>{_BEFORE}[0-9]++(?:(?:[{_JOIN}]|[ ](?=[0-9]{{3}}(?![0-9])))[0-9]++)*+)"
)
_TRAILING = ".,;:!?'\")]}"  # not part of a URL at its end ("see www.x.com/a.")
_ORDINAL = re.compile(r"(?:st|nd|rd|th)(?!\w)", re.I)
_MERIDIEM = re.compile(r" ?([AaPp])\.?[Mm]\.?(?!\w)")


@dataclass(frozen=True)
class Protected:
    """A token of the source its translation must keep.

    Attributes:
        text: as written in the source.
        kind: ``number``, ``time``, ``date``, ``code``, ``url``, ``email`` or ``placeholder``.
        renderings: the forms accepted in the translation; ``[0]`` the one to force (the target's convention).
    """

    text: str
    kind: str
    renderings: tuple[str, ...]


@dataclass(frozen=True)
class _Convention:
    """How a language writes numbers: its decimal mark, the thousands separator to force and those accepted."""

    decimal: str
    group: str
    groups: tuple[str, ...]
    ordinal: str  # "en", "dot" (21.), "fr", "es", "nl", "ru", "" (none known)
    date: str  # "mdy/", "dmy.", "dmy. ", "dmy/", "dmy-", "iso"


def _languages(codes: str, convention: _Convention) -> dict[str, _Convention]:
    return dict.fromkeys(codes.split(), convention)


_POINT = _Convention(".", ",", (",",), "en", "mdy/")
_CONVENTIONS: dict[str, _Convention] = {
    "en": _POINT,
    **_languages("zh ja ko", _Convention(".", ",", (",",), "", "iso")),
    **_languages("he th hi ms ga mt", _Convention(".", ",", (",",), "", "dmy/")),
    **_languages("de da nb nn no is tr sl hr sr", _Convention(",", ".", (".",), "dot", "dmy.")),
    **_languages("es pt it ca gl el", _Convention(",", ".", (".",), "es", "dmy/")),
    "nl": _Convention(",", ".", (".",), "nl", "dmy-"),
    "ro": _Convention(",", ".", (".",), "dot", "dmy."),
    "id": _Convention(",", ".", (".",), "", "dmy/"),
    "fr": _Convention(",", " ", _SPACES, "fr", "dmy/"),
    **_languages("cs sk", _Convention(",", " ", _SPACES, "dot", "dmy. ")),
    **_languages("pl fi et lv bg", _Convention(",", " ", _SPACES, "dot", "dmy.")),
    **_languages("ru uk be kk", _Convention(",", " ", _SPACES, "ru", "dmy.")),
    **_languages("sv lt", _Convention(",", " ", _SPACES, "", "iso")),
    "hu": _Convention(",", " ", _SPACES, "dot", "iso"),
}
_SWISS = {"de", "it", "fr", "rm"}  # with region CH: 1’250.50


def _convention(lang: str | None) -> _Convention | None:
    if not lang:
        return None
    base, _, region = lang.replace("_", "-").lower().partition("-")
    found = _CONVENTIONS.get(base)
    if found is not None and region == "ch" and base in _SWISS:
        return _Convention(".", "’", ("’", "'"), found.ordinal, "dmy.")
    return found


# --- reading a number ---------------------------------------------------------------------------------------

# Separators any convention reads as thousands (never a decimal mark).
_ALWAYS_GROUPS = ("'", "’", "\u00a0", "\u202f")
# The readings tried without a source language: a decimal point, or a decimal comma.
_READINGS = (_POINT, _Convention(",", ".", (".",), "", "dmy."))
_PARTS = re.compile(r"[0-9]+|[^0-9]")


@dataclass(frozen=True)
class _Number:
    digits: str  # the integer part's digits
    fraction: str | None  # the decimal part's digits
    grouped: bool  # the source wrote thousands separators

    def value(self) -> tuple[str, str]:
        return self.digits.lstrip("0") or "0", (self.fraction or "").rstrip("0")


def _read(chunk: str, convention: _Convention) -> _Number | None:
    """``chunk`` (digits and single separators) read as one number in ``convention``; None: it reads as none."""
    parts = _PARTS.findall(chunk)
    digits, seps = parts[0::2], parts[1::2]
    fraction = None
    if seps and seps[-1] == convention.decimal:
        fraction, digits, seps = digits[-1], digits[:-1], seps[:-1]
    if not seps:
        return _Number(digits[0], fraction, False)
    if len(set(seps)) != 1 or seps[0] not in convention.groups + _ALWAYS_GROUPS:
        return None
    if not 1 <= len(digits[0]) <= 3 or digits[0][0] == "0" or any(len(d) != 3 for d in digits[1:]):
        return None
    return _Number("".join(digits), fraction, True)


def _reading(chunk: str, src: _Convention | None) -> _Number | None:
    """The one number ``chunk`` means: in the source's convention, or, without one, in every convention that
    reads it (None where they disagree or none reads it)."""
    if src is not None:
        return _read(chunk, src)
    found = [n for n in (_read(chunk, c) for c in _READINGS) if n is not None]
    return found[0] if found and all(n.value() == found[0].value() for n in found) else None


def _group(digits: str, separator: str) -> str:
    head = len(digits) % 3 or 3
    return separator.join([digits[:head], *(digits[i : i + 3] for i in range(head, len(digits), 3))])


def _render(n: _Number, sign: str, tgt: _Convention) -> list[str]:
    """The forms of ``n`` in the target's convention: grouped as the source was (the forced form groups with
    U+0020 where the target groups with spaces: the model's SentencePiece normalization writes its narrow and
    no-break spaces so), then the other separators, then without grouping."""
    fraction = "" if n.fraction is None else tgt.decimal + n.fraction
    forms = []
    if n.grouped:
        forms += [_group(n.digits, g) + fraction for g in (tgt.group, *tgt.groups)]
    forms.append(n.digits + fraction)
    return [s + f for s in ("-", "−") for f in forms] if sign else forms


# --- times, dates, ordinals ---------------------------------------------------------------------------------

_TIME = re.compile(r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?")
_DOT_TIME = re.compile(r"[0-9]{1,2}\.[0-9]{2}")
_SLASH_DATE = re.compile(r"([0-9]{1,4})/([0-9]{1,2})/([0-9]{1,4})")
_DOT_DATE = re.compile(r"([0-9]{1,2})\.([0-9]{1,2})\.([0-9]{4})")
_DASH_DATE = re.compile(r"([0-9]{1,4})-([0-9]{1,2})-([0-9]{1,4})")


def _time(chunk: str, meridiem: str | None, tgt: str | None) -> list[str] | None:
    """A time's forms: on 24 hours where the target counts so (``10:30 pm`` -> ``22:30``), then as written;
    each as written, with a leading zero, and the target's other style (de ``22.30``, fr ``22h30``)."""
    m = _TIME.fullmatch(chunk)
    if m is None or int(m[1]) > 24 or int(m[2]) > 59 or (m[3] and int(m[3]) > 59):
        return None
    hour, minute, rest = int(m[1]), m[2], f":{m[3]}" if m[3] else ""
    base = (tgt or "").split("-")[0].split("_")[0].lower()
    hours = [hour]
    if meridiem and base and base != "en" and hour <= 12:
        hours.insert(0, (hour % 12) + (12 if meridiem in "Pp" else 0))
    forms = []
    for h in dict.fromkeys(hours):
        forms += [f"{h:02d}:{minute}{rest}" if h != hour else chunk, f"{h}:{minute}{rest}", f"{h:02d}:{minute}{rest}"]
        if rest:
            continue
        if base in ("de", "da", "nb", "no", "fi", "cs", "sk"):
            forms.append(f"{h}.{minute}")
        elif base == "fr":
            forms += [f"{h}h{minute}", f"{h} h {minute}"]
    return forms


def _date_parts(chunk: str, src: str | None) -> tuple[str, int, int, bool] | None | bool:
    """(year as written, month, day, whether day or month was written with a leading zero) of a date; None: no
    date; False: a date whose day and month could be either (en 05/06/2020, or any without a source language)."""
    base = (src or "").split("-")[0].split("_")[0].lower()
    if m := _DOT_DATE.fullmatch(chunk):
        year, month, day = m[3], m[2], m[1]
    elif m := (_SLASH_DATE.fullmatch(chunk) or _DASH_DATE.fullmatch(chunk)):
        a, b, c = m[1], m[2], m[3]
        if len(a) == 4 and len(c) <= 2:
            year, month, day = a, b, c
        elif len(a) <= 2 and len(c) in (2, 4):
            year = c
            if int(a) > 12 >= int(b) or (int(a) <= 12 and int(b) <= 12 and base and base != "en"):
                month, day = b, a  # d/m/y: its day says so, or the source language writes so
            elif int(b) > 12 >= int(a) or a == b:
                month, day = a, b
            else:
                return False
        else:
            return None
    else:
        return None
    if not (1 <= int(month) <= 12 and 1 <= int(day) <= 31):
        return None
    return year, int(month), int(day), any(len(x) == 2 and x[0] == "0" for x in (month, day))


def _date(chunk: str, src: str | None, tgt: str | None) -> list[str] | None | bool:
    """A date's forms: the target's (padded as the source was, then not), as written, ISO 8601; None: no date;
    False: an ambiguous one (see :func:`_date_parts`)."""
    parts = _date_parts(chunk, src)
    if not parts:
        return parts
    year, month, day, padded = parts
    conv = _convention(tgt)
    style = conv.date if conv is not None else ""
    forms = []
    for pad in (padded, not padded):
        d, m = (f"{day:02d}", f"{month:02d}") if pad else (str(day), str(month))
        forms += {"mdy/": [f"{m}/{d}/{year}", f"{d}/{m}/{year}"], "dmy.": [f"{d}.{m}.{year}"],
                  "dmy. ": [f"{d}. {m}. {year}", f"{d}.{m}.{year}"], "dmy/": [f"{d}/{m}/{year}"],
                  "dmy-": [f"{d}-{m}-{year}", f"{d}/{m}/{year}"]}.get(style, [])
    iso = [f"{year}-{month:02d}-{day:02d}"] if len(year) == 4 else []
    return iso + [chunk] if style == "iso" else forms + [chunk] + iso


def _ordinal(n: int, kind: str) -> list[str]:
    if kind == "en":
        suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
        return [f"{n}{suffix}"]
    return {"dot": [f"{n}."], "fr": ([f"{n}er", f"{n}re"] if n == 1 else [f"{n}e", f"{n}ème"]),
            "es": [f"{n}º", f"{n}ª", f"{n}.º", f"{n}.ª", f"{n}°"], "nl": [f"{n}e", f"{n}ste", f"{n}de"],
            "ru": [f"{n}-й", f"{n}-я", f"{n}-е", f"{n}-го", f"{n}."]}.get(kind, [])


# 0-12 in words, as translations often write small counts ("2 girls" is "zwei Mädchen"); variants by "|".
_WORDS = {
    "en": "zero one two three four five six seven eight nine ten eleven twelve",
    "de": "null ein|eine|einen|einem|einer|eines|eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf",
    "fr": "zéro un|une deux trois quatre cinq six sept huit neuf dix onze douze",
    "es": "cero uno|una|un dos tres cuatro cinco seis siete ocho nueve diez once doce",
    "it": "zero uno|una|un|un' due tre quattro cinque sei sette otto nove dieci undici dodici",
    "pt": "zero um|uma dois|duas três quatro cinco seis sete oito nove dez onze doze",
    "nl": "nul een|één twee drie vier vijf zes zeven acht negen tien elf twaalf",
    "cs": "nula jeden|jedna|jedno|jednoho|jedné|jednu|jedním|jednom|jednou dva|dvě|dvou|dvěma tři|tří|třem|třemi "
          "čtyři|čtyř|čtyřem|čtyřmi pět|pěti šest|šesti sedm|sedmi osm|osmi devět|devíti deset|deseti jedenáct "
          "dvanáct",
}


def _in_words(n: int, lang: str | None) -> list[str]:
    words = _WORDS.get((lang or "").replace("_", "-").split("-")[0].lower())
    if words is None or not 0 <= n <= 12:
        return []
    forms = words.split()[n].split("|")
    return forms + [f[0].upper() + f[1:] for f in forms]


# --- the source's tokens ------------------------------------------------------------------------------------


def _unique(forms) -> tuple[str, ...]:
    return tuple(dict.fromkeys(f for f in forms if f))


def _numbers(source: str, start: int, end: int, src_lang: str | None, tgt_lang: str | None) -> list[Protected]:
    """The tokens of the run of digits and separators ``source[start:end]``."""
    chunk = source[start:end]
    src, tgt = _convention(src_lang), _convention(tgt_lang)
    if " " in chunk and not (src is not None and " " in src.groups):  # "2 100-meter races": two numbers
        tokens: list[Protected] = []
        at = start
        while at < end and len(tokens) < MAX_PROTECTED:
            stop = source.find(" ", at, end)
            stop = end if stop < 0 else stop
            tokens += _numbers(source, at, stop, src_lang, tgt_lang)
            at = stop + 1
        return tokens
    if len(chunk) > MAX_NUMBER_CHARS:
        return []
    meridiem = _MERIDIEM.match(source, end)
    if ":" in chunk or (meridiem and _DOT_TIME.fullmatch(chunk)):  # 10:30, and 7.45 pm (British)
        forms = _time(chunk.replace(".", ":"), meridiem[1] if meridiem else None, tgt_lang)
        if forms and "." in chunk:
            forms.append(chunk)
        return [Protected(chunk, "time", _unique(forms)) if forms else Protected(chunk, "number", (chunk,))]
    if "/" in chunk or "-" in chunk or chunk.count(".") == 2:
        forms = _date(chunk, src_lang, tgt_lang)
        if forms:
            return [Protected(chunk, "date", _unique(forms))]
        if forms is False or "/" in chunk or ":" in chunk:
            return [Protected(chunk, "number", (chunk,))]
        if "-" in chunk:  # a range, a phone number, an ISBN: as written (a range's dash may become an en dash)
            return [Protected(chunk, "number", _unique([chunk, chunk.replace("-", "–")]))]
    sign = ""
    if start and source[start - 1] in "-−" and _starts_token(source, start - 1):
        sign = source[start - 1]
    text = sign + chunk
    number = _reading(chunk, src)
    ordinal = _ORDINAL.match(source, end) if number is not None and number.fraction is None else None
    if ordinal is not None:
        text += ordinal[0]
        n = int(number.digits)
        forms = _ordinal(n, (tgt or src).ordinal) if (tgt or src) is not None else []
        return [Protected(text, "number", _unique([*forms, text]))]
    if number is None:
        return [Protected(text, "number", (text,))]
    if not number.grouped and (len(number.digits) > 4 or number.digits[0] == "0") and number.fraction is None:
        return [Protected(text, "number", (text,))]  # a code such as 4711 or 007: as written
    forms = _render(number, sign, tgt or src) if (tgt or src) is not None else []
    if number.fraction is not None and not number.fraction.strip("0"):  # 2.00 euros may be 2 Euro
        forms.append(sign + number.digits)
    if not sign and number.fraction is None and not number.grouped:
        forms += _in_words(int(number.digits), tgt_lang or src_lang)
    return [Protected(text, "number", _unique([*forms, text]))]


def _starts_token(text: str, at: int) -> bool:
    """Whether a token may start at ``text[at]`` (what :data:`_BEFORE` says about the characters before it)."""
    return _BEFORE_AT.match(text, at) is not None


_BEFORE_AT = re.compile(_BEFORE)


def protected_tokens(source: str, src_lang: str | None = None, tgt_lang: str | None = None) -> list[Protected]:
    """The tokens of ``source`` a translation into ``tgt_lang`` must keep, in order (at most
    :data:`MAX_PROTECTED`: the rest of a longer sentence is not guarded).

    Args:
        source: one sentence (or line) of the source text.
        src_lang: the source's language (ISO 639-1, a region allowed): how its numbers and dates read; None:
            only forms every convention reads alike are converted, the rest kept as written.
        tgt_lang: the target's language: the forms to accept and force; None: the source's own.
    """
    tokens: list[Protected] = []
    for m in _SCAN.finditer(source):
        kind = m.lastgroup
        if kind == "number":
            found = _numbers(source, m.start(), m.end(), src_lang, tgt_lang)
        else:
            text = m[0]
            if kind == "url":
                while text and text[-1] in _TRAILING and not (text[-1] == ")" and "(" in text):
                    text = text[:-1]
            found = [Protected(text, kind, (text,))] if len(text) <= MAX_TOKEN_CHARS else []
        tokens += found
        if len(tokens) >= MAX_PROTECTED:
            return tokens[:MAX_PROTECTED]
    return tokens


# --- matching the translation -------------------------------------------------------------------------------


def _rendering_pattern(rendering: str) -> re.Pattern[str]:
    """``rendering`` as a whole token: no letter, digit or digit-joining separator glued to either end."""
    before = _BEFORE if rendering[0].isalnum() or rendering[0] in "-−" else ""
    last = rendering[-1]
    after = _AFTER_DIGIT if last.isdigit() else r"(?!\w)" if last.isalnum() else "(?![0-9])" if last in _JOIN else ""
    return re.compile(before + re.escape(rendering) + after)


def token_regex(rendering: str) -> str:
    """The regular expression of ``rendering`` as a whole token (as :func:`missing` matches it)."""
    return _rendering_pattern(rendering).pattern


def occurrences(text: str, rendering: str, limit: int) -> list[tuple[int, int]]:
    """The (start, end) of ``rendering``'s first ``limit`` occurrences in ``text`` as a whole token."""
    return _occurrences(text, rendering, limit)


def _occurrences(translation: str, rendering: str, limit: int) -> list[tuple[int, int]]:
    found = []
    for m in _rendering_pattern(rendering).finditer(translation):
        found.append(m.span())
        if len(found) >= limit:
            break
    return found


def missing(tokens: list[Protected], translation: str) -> list[Protected]:
    """The tokens ``translation`` lacks, in their order: each token needs an occurrence of one of its
    renderings (as a whole token) of its own, so a token written twice in the source needs two (the most
    tokens that can be given distinct occurrences are, a maximum bipartite matching)."""
    spans: dict[str, list[tuple[int, int]]] = {}
    options = []
    for token in tokens:
        found: list[tuple[int, int]] = []
        for rendering in token.renderings:
            if rendering not in spans:
                spans[rendering] = _occurrences(translation, rendering, len(tokens)) if rendering else []
            found += spans[rendering]
        options.append(list(dict.fromkeys(found)))
    owner: dict[tuple[int, int], int] = {}  # an occurrence -> the token it serves
    held: list[tuple[int, int] | None] = [None] * len(tokens)
    for i in range(len(tokens)):  # an augmenting path from token i, breadth first
        reached: dict[tuple[int, int], int] = {}
        queue, seen, free = deque([i]), {i}, None
        while queue and free is None:
            j = queue.popleft()
            for span in options[j]:
                if span in reached:
                    continue
                reached[span] = j
                if span not in owner:
                    free = span
                    break
                if owner[span] not in seen:
                    seen.add(owner[span])
                    queue.append(owner[span])
        span = free
        while span is not None:
            j = reached[span]
            previous = held[j]
            owner[span], held[j] = j, span
            span = None if j == i else previous
    return [t for t, h in zip(tokens, held) if h is None]


# --- loops --------------------------------------------------------------------------------------------------

_WORD_EDGES = "".join(chr(c) for c in range(33, 127) if not chr(c).isalnum()) + "„“”‚‘’«»…–—"
_CHAR_LOOPS = tuple(re.compile(rf"(\S{{{p}}})\1{{{CHAR_REPEATS - 1},}}") for p in CHAR_PERIODS)


def _word_repeats(text: str) -> int:
    """The most times in a row a word n-gram (n <= :data:`MAX_NGRAM`) repeats (case and the punctuation at
    words' edges aside): positions where a word equals the word n further on, counted in runs."""
    words = [w for w in (w.strip(_WORD_EDGES).lower() for w in text.split()) if w]
    best = 1
    for n in range(1, min(MAX_NGRAM, len(words) // 2) + 1):
        run = 0
        for a, b in zip(words, words[n:]):
            run = run + 1 if a == b else 0
            best = max(best, (run + n) // n)
    return best


def _char_repeats(text: str) -> int:
    """The most times in a row a unit of 2-8 characters repeats inside a word."""
    best = 1
    for period, pattern in zip(CHAR_PERIODS, _CHAR_LOOPS):
        for m in pattern.finditer(text):
            best = max(best, len(m[0]) // period)
    return best


def looping(translation: str, source: str) -> bool:
    """Whether ``translation`` repeats a word n-gram at least :data:`LOOP_REPEATS` times in a row (or a few
    characters inside a word :data:`CHAR_REPEATS` times) more often in a row than anything in ``source`` does
    (a source that says "ha ha ha" may be translated so)."""
    words = _word_repeats(translation)
    if words >= LOOP_REPEATS and words > _word_repeats(source):
        return True
    chars = _char_repeats(translation)
    return chars >= CHAR_REPEATS and chars > _char_repeats(source)
