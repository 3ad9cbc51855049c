"""Multilingual models: the language pairs a model translates and the target-language tags it reads.

A model trained on several pairs (``data.pairs``) reads one token naming the language to
translate into: ``<2de>``, ``<2fr>`` … (Johnson et al. 2017, "Google's Multilingual Neural Machine
Translation System"; OPUS-MT's ``>>de<<``). Each tag is a user-defined piece of the SentencePiece
model, so it is one id that the text never splits. It is added by id, never read from the text:
``<2fr>`` typed in a line is plain characters (:mod:`mtkit.data.vocab` encodes text with the tags
unused), so input cannot pick another language. ``data.tag_side`` places it:

- ``source`` (the default): the source's first token. It reaches every engine unchanged
  (CTranslate2 sees it as the first source token), and search needs nothing new.
- ``target``: the decoder's first token, in place of BOS (fairseq's ``--decoder-langtok``). The
  store keeps it before each target; training feeds it as the decoder's start and never predicts
  it; search starts from it (``start``); a CTranslate2 export has no fixed start token and is given
  the tag as the target prefix.

A single-pair model has no tags: its vocabulary, store and inputs are what they always were.

The pairs are the model's config (``data.pairs``), saved in every checkpoint; an exported
CTranslate2 model lists them in its ``mtkit.json``. :func:`for_target` gives the vocabulary that
encodes sources for one target language (:class:`TaggedVocab`), with the one-line errors of a
missing or unknown ``--tgt-lang``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mtkit.config import DataConfig
from mtkit.errors import MtkitError
from mtkit.langid import short_codes


def tag_piece(lang: str) -> str:
    """The target-language tag of ``lang``: ``de`` -> ``<2de>``."""
    return f"<2{lang}>"


@dataclass(frozen=True)
class Pair:
    src_lang: str
    tgt_lang: str

    @property
    def name(self) -> str:
        """``en-de``: how metrics, manifests and ``train.best_pair`` name the pair."""
        return f"{self.src_lang}-{self.tgt_lang}"


def config_pairs(data: DataConfig) -> list[Pair]:
    """The pairs of a multilingual config, in order; empty for a single-pair one."""
    return [Pair(p.src_lang, p.tgt_lang) for p in data.pairs]


def targets(pairs: Sequence[Pair]) -> list[str]:
    """The target languages of ``pairs``, in their first-listed order."""
    return list(dict.fromkeys(p.tgt_lang for p in pairs))


def languages(pairs: Sequence[Pair]) -> list[str]:
    """Every language of ``pairs`` (sources and targets), in their first-listed order."""
    return list(dict.fromkeys(lang for p in pairs for lang in (p.src_lang, p.tgt_lang)))


def tag_id(vocab, lang: str, side: str = "source") -> int:
    """The id of ``lang``'s tag in ``vocab``'s ``side`` (``source`` or ``target``: ``data.tag_side``); an
    error when the vocabulary lacks it."""
    piece = tag_piece(lang)
    found = vocab.src_piece_id(piece) if side == "source" else vocab.tgt_piece_id(piece)
    if found is None:
        raise MtkitError(f"the vocabulary has no target-language tag {piece}: it was not trained for a "
                         f"multilingual model translating into {lang} (mtkit prepare with data.pairs reserves it)")
    return found


class TaggedVocab:
    """A vocabulary that tags its sentences for one target language.

    With ``side="source"`` its source encodings start with the tag id; an empty line stays empty
    (no tag), so that the engines still give it an empty translation untouched. With
    ``side="target"`` sources are encoded as they are and ``decoder_start`` is the tag's target id,
    where search starts instead of BOS. Everything else is the wrapped
    :class:`mtkit.data.vocab.Vocab`'s.
    """

    def __init__(self, vocab, tgt_lang: str, side: str = "source") -> None:
        self.base = vocab
        self.tgt_lang = tgt_lang
        self.side = side
        self.tag = tag_id(vocab, tgt_lang, side)
        self.decoder_start = self.tag if side == "target" else None

    def __getattr__(self, name: str):
        if name == "base":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.base, name)

    def encode_src(self, text: str) -> list[int]:
        ids = self.base.encode_src(text)
        return [self.tag, *ids] if ids and self.side == "source" else ids

    def src_words(self, text: str) -> list[int]:
        """The word of each id of :meth:`encode_src` (the tag: none, -1)."""
        words = self.base.src_words(text)
        return [-1, *words] if words and self.side == "source" else words

    def encode_src_batch(self, texts: Sequence[str]) -> list[list[int]]:
        found = self.base.encode_src_batch(texts)
        return [[self.tag, *ids] if ids else [] for ids in found] if self.side == "source" else found


class CodedVocab(TaggedVocab):
    """NLLB's and M2M100's language codes (``data.tag_side: codes``, an imported model's): the source starts with
    the *source* language's code (``eng_Latn``, a piece of the vocabulary under its own name), and the decoder
    reads BOS, then the target language's code, forced (:attr:`decoder_prefix`; Hugging Face's
    ``forced_bos_token_id``). An empty line stays empty. Everything else is the wrapped vocabulary's."""

    def __init__(self, vocab, src_lang: str, tgt_lang: str) -> None:
        self.base, self.tgt_lang, self.side = vocab, tgt_lang, "source"  # the source code leads the source
        self.tag = _code_id(vocab.src_piece_id(src_lang), src_lang, "source")
        self.decoder_start = None  # BOS
        self.decoder_prefix = (_code_id(vocab.tgt_piece_id(tgt_lang), tgt_lang, "target"),)


def _code_id(found: int | None, lang: str, side: str) -> int:
    if found is None:
        raise MtkitError(f"the {side} vocabulary has no language code {lang}")
    return found


def resolve(lang: str, known: Sequence[str]) -> str:
    """``lang`` itself, or the one code of ``known`` whose short code it is (``fr`` for ``fra_Latn``)."""
    if lang in known:
        return lang
    return next((code for code, short in short_codes(known).items() if short == lang), lang)


def decoder_prefix(vocab) -> tuple[int, ...]:
    """The tokens forced after the decoder's start for ``vocab``'s sentences: NLLB's target code, or none."""
    return getattr(vocab, "decoder_prefix", ())


def describe(pairs: Sequence[Pair]) -> str:
    return ", ".join(p.name for p in pairs)


def pick_target(pairs: Sequence[Pair], single: tuple[str, str] | None, tgt_lang: str | None,
                flag: str = "--tgt-lang") -> str | None:
    """The target language to translate into: ``tgt_lang`` checked against the model's.

    Args:
        pairs: a multilingual model's pairs (empty for a single-pair model).
        single: a single-pair model's (src_lang, tgt_lang), when recorded.
        tgt_lang: what the user asked for (None: not asked).

    Returns the tag's language for a multilingual model, None for a single-pair one. A model with
    several targets needs ``tgt_lang``; one with a single target takes it as given or not, but
    only that one.
    """
    if not pairs:
        if tgt_lang is not None and single is not None and tgt_lang != single[1]:
            raise MtkitError(f"{flag} {tgt_lang}: the model translates {single[0]}-{single[1]} only")
        return None
    known = targets(pairs)
    if tgt_lang is not None:
        tgt_lang = resolve(tgt_lang, known)
    if tgt_lang is None:
        if len(known) == 1:
            return known[0]
        raise MtkitError(f"{flag}: missing; the model translates into {', '.join(known)} "
                         f"(pairs {describe(pairs)}): say which, e.g. {flag} {known[0]}")
    if tgt_lang not in known:
        raise MtkitError(f"{flag} {tgt_lang}: the model does not translate into it; its targets are "
                         f"{', '.join(known)} (pairs {describe(pairs)})")
    return tgt_lang


def for_target(vocab, pairs: Sequence[Pair], single: tuple[str, str] | None, tgt_lang: str | None,
               flag: str = "--tgt-lang", side: str = "source"):
    """The vocabulary that encodes sources for ``tgt_lang`` (see :func:`pick_target`): ``vocab``
    itself for a single-pair model, a :class:`TaggedVocab` with the tag on ``side`` for a multilingual one."""
    lang = pick_target(pairs, single, tgt_lang, flag)
    if lang is not None and side == "codes":
        return CodedVocab(vocab, next(p.src_lang for p in pairs if p.tgt_lang == lang), lang)
    return vocab if lang is None else TaggedVocab(vocab, lang, side)


def decoder_start(vocab) -> int | None:
    """Where search starts for ``vocab``'s sentences: a target-side tag's id, or None (BOS)."""
    return getattr(vocab, "decoder_start", None)


def pairs_from_list(raw) -> list[Pair]:
    """Pairs from plain data (``[["en", "de"], …]``, as an export's ``mtkit.json`` lists them)."""
    return [Pair(str(src), str(tgt)) for src, tgt in (raw or [])]


@dataclass(frozen=True)
class StoredPair:
    """One pair of a multilingual prepared directory (its manifest's ``pairs``): the tag id that
    leads its sources (or its targets: the manifest's ``tag_side``), and per split the contiguous
    segment of the store it fills."""

    pair: Pair
    tag_id: int
    segments: dict  # split -> (start, count)

    def segment(self, split: str) -> tuple[int, int] | None:
        return self.segments.get(split)


def stored_pairs(manifest: dict) -> list[StoredPair]:
    """The pairs of a prepared directory's manifest; empty for a single-pair store."""
    found = []
    for entry in manifest.get("pairs") or []:
        segments = {split: (int(s["start"]), int(s["pairs"])) for split, s in entry.get("splits", {}).items()}
        found.append(StoredPair(Pair(entry["src_lang"], entry["tgt_lang"]), int(entry["tag_id"]), segments))
    return found


def single_pair(data: DataConfig) -> tuple[str, str] | None:
    """A single-pair config's (src_lang, tgt_lang); None for a multilingual one."""
    return None if data.pairs else (data.src_lang, data.tgt_lang)


def same_pairs(configs: Sequence) -> list[Pair]:
    """The pairs of an ensemble's configs, which must agree (the tag means one language to all)."""
    first = config_pairs(configs[0].data)
    for config in configs[1:]:
        if config_pairs(config.data) != first:
            raise MtkitError(f"an ensemble's models must translate the same pairs: {describe(first) or 'one pair'} "
                             f"against {describe(config_pairs(config.data)) or 'one pair'}")
        if config.data.tag_side != configs[0].data.tag_side:
            raise MtkitError(f"an ensemble's models must place their tags alike: data.tag_side "
                             f"{configs[0].data.tag_side} against {config.data.tag_side}")
    return first


def for_config(vocab, config, tgt_lang: str | None, flag: str = "--tgt-lang"):
    """:func:`for_target` for a checkpoint's config (``data.pairs`` or its one pair, ``data.tag_side``)."""
    return for_target(vocab, config_pairs(config.data), single_pair(config.data), tgt_lang, flag,
                      config.data.tag_side)
