"""A user's lines to the engine's sentences and back: sentence splitting and the integrity guard.

Every path that translates a user's text goes through :func:`translate_lines` (``mtkit translate``, ``evaluate``,
``run``, the Python API, both server APIs, markup): it takes lines and gives one
:class:`mtkit.engines.engine.Translation` per line, in order, as :meth:`mtkit.engines.engine.Engine.translate`
does, with two steps around the engine, each a decoding setting:

``decode.split`` (``sentences``, the default; ``none``)
    a line is split into its sentences (:func:`mtkit.text.sentences.sentence_spans`, in the model's source
    language); the sentences of a chunk of lines are decoded together, in the engine's batches, and each line's
    translations are joined with the whitespace the line has between its sentences. For a line of several
    sentences:

    * ``text``: the sentences' best translations, joined; ``score`` and ``logprob``: the sums of theirs (each
      sentence's EOS counted), ``confidence``: the log-probability per token, every sentence's EOS a token;
    * ``nbest``: hypothesis *k* joins each sentence's *k*-th hypothesis (its last when it has fewer);
    * ``alignments``: word indices into the whole line and the whole translation (words split at whitespace);
    * ``json``: a key ``sentences`` with each sentence's source and translation (and the guard's findings);
    * constraints: glossary terms are looked for in each sentence and forced into its translation; exclude
      phrases hold for every sentence; a line given include phrases of its own is translated whole (an include
      phrase belongs to the line, not to one of its sentences).

    A line of one sentence goes to the engine exactly as it was given.

``decode.guard`` (on by default)
    after search, each sentence's best translation is checked (:mod:`mtkit.text.guard`) for the protected
    tokens of its source (numbers, in the target's conventions where they differ, URLs, e-mail addresses,
    placeholders) and for a repetition loop its source does not have. A sentence that lacks some is searched
    again with the missing ones as include phrases (in the target's form, :data:`MAX_FORCED` at most; engines
    that take include phrases: :mod:`mtkit.engines.capabilities`), a loop again without repeating 3-grams; the
    new translation is kept when it lacks fewer, or as few and loops no more; what forcing could not put back is
    carried by the word alignment (its translation of the rest, too, searched again without repeating 3-grams when
    it loops). What is repaired and what still fails is in
    :attr:`Translation.checks` (a :class:`Checked` per sentence) and in the :class:`GuardCounts` a caller passes.
    Sampling is not searched again (its draws are the point); nor are the n-best list's other hypotheses.

With both off, the engine's own pipeline runs unchanged.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import regex

from mtkit.config import DecodeConfig
from mtkit.engines.constraints import Constraints, ConstraintSource
from mtkit.engines.engine import Candidate, Engine, Translation, chunks
from mtkit.text.guard import Protected, looping, missing, occurrences, protected_tokens, token_regex
from mtkit.text.lines import clean_output
from mtkit.text.markup import split_protected
from mtkit.text.sentences import sentence_spans

LOOP_NGRAM = 3  # a looping sentence is searched again without repeating n-grams of this size
MAX_FORCED = 8  # lost tokens forced back into one sentence at most (constrained search's work grows with them)


@dataclass(frozen=True)
class Checked:
    """What the integrity guard found in one sentence's best translation.

    Attributes:
        repaired: protected tokens of the source that the first search lost and the second put back (as
            written in the source).
        missing: those the translation still lacks.
        loop: whether the translation is still caught in a repetition loop its source does not have.
        looped: whether the first search's translation was (the second search then forbade repeated 3-grams).
    """

    repaired: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    loop: bool = False
    looped: bool = False

    def as_json(self) -> dict:
        return {"repaired": list(self.repaired), "missing": list(self.missing), "loop": self.loop}


@dataclass
class GuardCounts:
    """The integrity guard's tally over a call (or a command's whole input)."""

    sentences: int = 0  # sentences checked
    protected: int = 0  # protected tokens in their sources
    repaired: int = 0  # tokens put back by a second search
    missing: int = 0  # tokens still missing
    loops_fixed: int = 0
    loops: int = 0  # translations still in a loop

    def add(self, checked: Checked, protected: int) -> None:
        self.sentences += 1
        self.protected += protected
        self.repaired += len(checked.repaired)
        self.missing += len(checked.missing)
        self.loops_fixed += checked.looped and not checked.loop
        self.loops += checked.loop

    def summary(self) -> str:
        """One line for stderr: ``guard: 12 of 340 protected tokens repaired, 1 still missing; 2 loops fixed``."""
        return (f"guard: {self.repaired} of {self.protected} protected tokens repaired, {self.missing} still missing; "
                f"{self.loops_fixed} repetition loops fixed, {self.loops} left")


@dataclass
class _Line:
    """One input line on its way through: its sentences (the line itself when it has one) and what came back."""

    index: int
    text: str
    spans: list[tuple[int, int]]
    sentences: list[str]
    whole: bool  # translated as given (one sentence, or splitting off, or include phrases of its own)
    first: int = 0  # index of its first sentence in the chunk's sentence list
    results: list[Translation] = field(default_factory=list)


@dataclass(frozen=True)
class _Call:
    """One :func:`translate_lines` call: the engine and what every engine call of it goes with."""

    engine: Engine
    decode: DecodeConfig
    constraints: ConstraintSource | None
    target: str | None
    should_stop: Callable[[], bool] | None
    pair: tuple[str | None, str | None]  # the (source, target) languages
    counts: GuardCounts | None

    def run(self, sentences: list[str], constraints: ConstraintSource | None, numbering: Callable[[int], int],
            options: DecodeConfig | None = None) -> list[Translation]:
        """``sentences`` through the engine in one call (``numbering``: the input line of each)."""
        return list(self.engine.translate(sentences, buffer_size=max(1, len(sentences)), options=options or self.decode,
                                          target=self.target, constraints=constraints, should_stop=self.should_stop,
                                          numbering=numbering))


def languages(engine: Engine, target: str | None) -> tuple[str | None, str | None]:
    """The (source, target) language codes of a call: the model's pair, or a multilingual model's pair into
    ``target`` (the engine's default target when None); None where the model does not say."""
    pairs, single = engine.languages
    target = engine.target if target is None else target
    if single is not None and target in (None, single[1]):
        return single[0], single[1]
    for pair in pairs:
        if getattr(pair, "tgt", None) == target:
            return getattr(pair, "src", None), target
    sources = {getattr(pair, "src", None) for pair in pairs}
    return (sources.pop() if len(sources) == 1 else None), target


def translate_lines(engine: Engine, lines: Iterable[str | None], *, buffer_size: int = 1000,
                    constraints: ConstraintSource | None = None, options: DecodeConfig | None = None,
                    target: str | None = None, should_stop: Callable[[], bool] | None = None,
                    counts: GuardCounts | None = None) -> Iterator[Translation]:
    """Translate ``lines`` as :meth:`Engine.translate` does (the same arguments; one :class:`Translation` per line,
    in order, a chunk of ``buffer_size`` lines at a time, a None ending a chunk early), each line split into
    sentences and each sentence checked by the integrity guard as ``options`` (default: the engine's) say; see
    the module docstring. ``counts``: the guard's tally, added to."""
    decode = engine.decode if options is None else options
    if decode.split == "none" and not decode.guard:
        yield from engine.translate(lines, buffer_size=buffer_size, constraints=constraints, options=options,
                                    target=target, should_stop=should_stop)
        return
    call = _Call(engine, decode, constraints, target, should_stop, languages(engine, target), counts)
    start = 0
    for chunk in chunks(lines, buffer_size):
        yield from _chunk(call, chunk, start)
        start += len(chunk)


def _has_own_includes(constraints: ConstraintSource | None, index: int) -> bool:
    """Whether line ``index`` was given include phrases of its own (a glossary's are found in text: none in "")."""
    if constraints is None:
        return False
    own = constraints(index, "")
    return bool(own and own.include)


def _split(index: int, text: str, decode: DecodeConfig, lang: str | None, constraints) -> _Line:
    spans = sentence_spans(text, lang) if decode.split == "sentences" else []
    spans = _merged(text, spans)
    if len(spans) <= 1 or _has_own_includes(constraints, index):
        return _Line(index, text, [(0, len(text))], [text], True)
    return _Line(index, text, spans, [text[a:b] for a, b in spans], False)


def _merged(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` with neighbours that no whitespace separates made one (a translation joined to the next
    without a space would merge two words: ``Ende.Nächste``)."""
    out: list[tuple[int, int]] = []
    for a, b in spans:
        if out and not text[out[-1][1]:a]:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _chunk(call: _Call, chunk: list[str], start: int) -> Iterator[Translation]:
    constraints = call.constraints
    items = [_split(start + k, text, call.decode, call.pair[0], constraints) for k, text in enumerate(chunk)]
    sentences: list[str] = []
    owner: list[_Line] = []
    for item in items:
        item.first = len(sentences)
        sentences += item.sentences
        owner += [item] * len(item.sentences)

    def source(i: int, sentence: str) -> Constraints | None:
        return None if constraints is None else constraints(owner[i].index, sentence)

    def numbering(i: int) -> int:
        return owner[i].index + 1

    own = None if constraints is None else source
    found = call.run(sentences, own, numbering)
    checks: list[Checked] = []
    if call.decode.guard:
        found, checks = _guard(call, sentences, found, own, numbering)
    for item in items:
        item.results = found[item.first:item.first + len(item.sentences)]
        mine = checks[item.first:item.first + len(item.sentences)] if checks else []
        yield _joined(item, mine)


def _guard(call: _Call, sentences: list[str], found: list[Translation], source: ConstraintSource | None,
           numbering: Callable[[int], int]) -> tuple[list[Translation], list[Checked]]:
    """Each sentence's translation checked; those that lack protected tokens or loop searched again (see the
    module docstring). Returns the translations (some replaced) and a :class:`Checked` per sentence."""
    engine, decode = call.engine, call.decode
    protected = [protected_tokens(s, call.pair[0], call.pair[1]) for s in sentences]
    lost = [_lost(p, t.best.text, s) for p, t, s in zip(protected, found, sentences, strict=True)]
    loops = [bool(t.src_ids) and looping(t.best.text, s) for s, t in zip(sentences, found, strict=True)]
    forcing = engine.capabilities is None or engine.capabilities.include  # include phrases: the torch engine
    redo = [i for i, t in enumerate(found)
            if t.src_ids and not decode.sampling and ((lost[i] and forcing) or loops[i])]
    found = list(found)
    if redo:
        for looped in (False, True):
            group = [i for i in redo if loops[i] == looped]
            if not group:
                continue
            again = _search_again(call, [sentences[i] for i in group], group,
                                  [lost[i] if forcing else [] for i in group], source, numbering, looped)
            for i, t in zip(group, again, strict=True):
                still = _lost(protected[i], t.best.text, sentences[i])
                loop = looping(t.best.text, sentences[i])
                if (len(still), loop) < (len(lost[i]), loops[i]) or (len(still) <= len(lost[i]) and loops[i]
                                                                      and not loop):
                    found[i] = t
    if engine.gives_alignments and not decode.sampling:  # what forcing could not put back: carried by alignment
        def state(i: int, t: Translation) -> tuple[int, bool]:
            return len(_lost(protected[i], t.best.text, sentences[i])), looping(t.best.text, sentences[i])

        carry = [i for i, t in enumerate(found) if t.src_ids and protected[i] and state(i, t) != (0, False)]
        for i, t in zip(carry, _carried(call, [sentences[i] for i in carry], carry, [protected[i] for i in carry],
                                        source, numbering), strict=True):
            if state(i, t) < state(i, found[i]):
                found[i] = t
    checks = []
    for i, t in enumerate(found):
        still = _lost(protected[i], t.best.text, sentences[i]) if t.src_ids else []
        gone = {id(p) for p in still}
        repaired = tuple(p.text for p in lost[i] if id(p) not in gone)
        loop = bool(t.src_ids) and looping(t.best.text, sentences[i])
        checked = Checked(repaired, tuple(p.text for p in still), loop, loops[i])
        checks.append(checked)
        if call.counts is not None:
            call.counts.add(checked, len(protected[i]))
    return found, checks


_GLUED = re.compile(r"(?<=[0-9])(?=[^\W\d_])")  # a digit and a letter after it


def _lost(tokens: list[Protected], text: str, source: str) -> list[Protected]:
    """The tokens ``text`` lacks (:func:`mtkit.text.guard.missing`), a number glued to the letters of the word after
    it counting as lacking (``10:30der``: constrained search forces a number's pieces, and may go on writing a
    word in the same one) unless the source glued it so too (``5km``)."""
    if not _GLUED.search(text):
        return missing(tokens, text)
    spaced = [t for t in tokens if t.text[-1:].isdigit()
              and not any(source[b:b + 1].isalpha() for _, b in occurrences(source, t.text, MAX_FORCED))]
    lacking = missing(tokens, text)
    if not spaced:
        return lacking
    glued = missing(tokens, _GLUED.sub("0", text))  # a digit after it: no whole token ends there
    return [t for t in tokens if t in lacking or (t in glued and t in spaced)]


def _search_again(call: _Call, sentences: list[str], indices: list[int], lost: list[list[Protected]],
                  source: ConstraintSource | None, numbering: Callable[[int], int], looped: bool) -> list[Translation]:
    """``sentences`` (items ``indices`` of the chunk) searched again: each lost token forced as an include phrase
    (its target form), beside the sentence's own constraints; ``looped``: without repeating 3-grams. On the
    full vocabulary: a shortlist (``decode.shortlist``) may be what lost the token."""
    options = dataclasses.replace(call.decode, shortlist=False)
    if looped and not options.no_repeat_ngram_size:
        options = dataclasses.replace(options, no_repeat_ngram_size=LOOP_NGRAM)

    def forced(k: int, sentence: str) -> Constraints | None:
        own = source(indices[k], sentence) if source is not None else None
        wanted = Constraints(tuple(dict.fromkeys(p.renderings[0] for p in lost[k]))[:MAX_FORCED])
        return wanted.merged(own) if wanted else own

    return call.run(sentences, forced, lambda k: numbering(indices[k]), options)


def _carried(call: _Call, sentences: list[str], indices: list[int], lost: list[list[Protected]],
             source: ConstraintSource | None, numbering: Callable[[int], int]) -> list[Translation]:
    """``sentences`` translated with their protected tokens (``lost``) taken out and put back beside the target
    words aligned to their neighbours (in the target's form; :func:`mtkit.text.markup.split_protected`, as
    ``--protect`` carries placeholders; a token glued to a word there is spaced from it), each as a
    :class:`Translation` whose best hypothesis is the rebuilt text (its ids, pieces and scores the translation of
    the rest; its alignment, when asked, that of the rebuilt text)."""
    decode = call.decode
    forms = [_target_forms(sentence, tokens) for sentence, tokens in zip(sentences, lost, strict=True)]
    split = [split_protected(line, pattern) for line, pattern, _ in forms]
    bodies = [(k, body) for k, (texts, _) in enumerate(split) for body in texts]
    options = dataclasses.replace(decode, alignments="hard", nbest=1)

    def own(j: int, body: str) -> Constraints | None:
        return source(indices[bodies[j][0]], body) if source is not None else None

    done = call.run([body for _, body in bodies], own if source is not None else None,
                    lambda j: numbering(indices[bodies[j][0]]), options) if bodies else []
    # A body whose translation runs into a loop is searched again without repeating 3-grams, as a sentence is.
    again = [j for j, t in enumerate(done) if looping(t.best.text, bodies[j][1])]
    if again and not options.no_repeat_ngram_size:
        redone = call.run([bodies[j][1] for j in again],
                          (lambda i, body: own(again[i], body)) if source is not None else None,
                          lambda i: numbering(indices[bodies[again[i]][0]]),
                          dataclasses.replace(options, no_repeat_ngram_size=LOOP_NGRAM))
        for j, t in zip(again, redone, strict=True):
            if not looping(t.best.text, bodies[j][1]):
                done[j] = t
    results: dict[int, Translation] = {k: t for (k, _), t in zip(bodies, done, strict=True)}
    out = []
    for k, (texts, rebuild) in enumerate(split):
        t = results.get(k)
        best = t.best if t is not None else Candidate([], "", [], 0.0, 0.0)
        text = _spaced(rebuild([(clean_output(best.text), best.alignment or [])]) if texts else rebuild([]),
                       forms[k][2], forms[k][0])
        alignment = None
        if decode.alignments != "off":
            alignment = call.engine.align([sentences[k]], [text], decode, call.target)[0]
        carried = Candidate(best.ids, text, best.pieces, best.score, best.logprob, alignment)
        base = t if t is not None else Translation(0, sentences[k], [], [carried])
        out.append(dataclasses.replace(base, source=sentences[k], candidates=[carried]))
    return out


def _target_forms(sentence: str, lost: list[Protected]):
    """``sentence`` with each lost token (its first whole-token occurrence not yet taken) written in its target
    form, the ``regex`` pattern of those forms as whole tokens, and the forms."""
    forms: list[str] = []
    for token in lost:
        found = occurrences(sentence, token.text, 1)
        if found:
            (a, b), form = found[0], token.renderings[0]
            sentence = sentence[:a] + form + sentence[b:]
            forms.append(form)
    pattern = "|".join(token_regex(f) for f in sorted(set(forms), key=len, reverse=True)) or r"(?!)"
    return sentence, regex.compile(pattern), forms


def _spaced(text: str, forms: list[str], line: str) -> str:
    """``text`` with a space between each of ``forms`` and a letter or digit glued to it (``x@y.comsich``,
    ``10:30der``) where ``line`` (the source, the forms written in) does not glue them so."""
    for form in set(forms):
        at, out = 0, []
        glued = [(a > 0 and line[a - 1].isalnum(), b < len(line) and line[b].isalnum())
                 for a, b in occurrences(line, form, MAX_FORCED)]
        left_ok, right_ok = any(g[0] for g in glued), any(g[1] for g in glued)
        while (k := text.find(form, at)) >= 0:
            end = k + len(form)
            glued_left = not left_ok and k > 0 and text[k - 1].isalnum() and form[0].isalnum()
            glued_right = not right_ok and end < len(text) and text[end].isalnum() and form[-1].isalnum()
            out += [text[at:k], " " if glued_left else "", form, " " if glued_right else ""]
            at = end
        text = "".join(out) + text[at:]
    return text


def _joined(item: _Line, checks: list[Checked]) -> Translation:
    """The line's :class:`Translation`: its one sentence's, or its sentences' joined (see the module docstring)."""
    if item.whole:
        t = item.results[0]
        return dataclasses.replace(t, index=item.index, source=item.text, checks=checks)
    parts = item.results
    gaps = [item.text[item.spans[k][1]:item.spans[k + 1][0]] for k in range(len(item.spans) - 1)]
    src_offsets, words = [], 0  # source words before each sentence
    for k, (a, _) in enumerate(item.spans):
        words += len(item.text[item.spans[k - 1][0] if k else 0:a].split())
        src_offsets.append(words)
    depth = max(len(t.candidates) for t in parts)
    candidates = []
    for k in range(depth):
        chosen = [t.candidates[min(k, len(t.candidates) - 1)] for t in parts]
        candidates.append(_join_candidates(chosen, gaps, src_offsets))
    unmet = list(dict.fromkeys(p for t in parts for p in t.unmet))
    unwritable = {p: why for t in parts for p, why in t.unwritable.items()}
    return Translation(item.index, item.text, [i for t in parts for i in t.src_ids], candidates, unmet, unwritable,
                       parts=list(parts), checks=checks)


def _join_candidates(chosen: list[Candidate], gaps: list[str], src_offsets: list[int]) -> Candidate:
    """One hypothesis of a line from one of each of its sentences: texts joined with the line's whitespace,
    ids and pieces one after another, scores and log-probabilities summed, alignments shifted into the line."""
    texts = [c.text.strip() for c in chosen]
    text = texts[0] + "".join(gap + t for gap, t in zip(gaps, texts[1:], strict=True))
    alignment = None
    if any(c.alignment is not None for c in chosen):
        alignment, tgt_offset = [], 0
        for c, t, s in zip(chosen, texts, src_offsets, strict=True):
            alignment += [(a + s, b + tgt_offset) for a, b in c.alignment or []]
            tgt_offset += len(t.split())
    return Candidate([i for c in chosen for i in c.ids], text, [p for c in chosen for p in c.pieces],
                     sum(c.score for c in chosen), sum(c.logprob for c in chosen), alignment,
                     sum(c.sentences for c in chosen))


def sentence_reports(t: Translation) -> list[dict]:
    """Each sentence of a translated line: its ``source`` and best translation (``text``) and, with the guard on,
    what it ``repaired``, what is still ``missing`` and whether it is still in a ``loop`` (as ``--format json``
    and ``/v1/translate`` give them); [] for an empty line."""
    if not t.src_ids:
        return []
    parts = t.parts or [t]
    found = []
    for k, part in enumerate(parts):
        entry = {"source": part.source.strip(), "text": part.best.text.strip()}
        if k < len(t.checks):
            entry.update(t.checks[k].as_json())
        found.append(entry)
    return found
