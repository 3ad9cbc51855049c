"""Search over each sentence's own shortlist of target ids: the output layer, the softmax and the beam's ranking
computed for those ids only.

A :class:`Shortlisted` search gives every sentence a vocabulary of its own, a row of ``ids`` (B, U): its
allowed target ids, padded. Search runs unchanged on *positions* in that row (its tokens, its history, its
bans): the model it decodes with is a :class:`ShortlistModel`, whose ``decode_step`` takes positions, feeds
the wrapped model their ids, and returns logits (N, U) for the row's ids only (-inf at the padding), computed
from the decoder's output (``decode_hidden``) and the rows of the output projection (``output_weights``) of
the union of the live sentences' ids, each row then gathered to its own sentence's: its log-softmax, its
candidates and its top-k are over its own shortlist alone, so a sentence's output never depends on the other
sentences of its batch (Bergamot's per-batch shortlist does, and CTranslate2's ``use_vmap``).

The ids search knows by value keep their value: PAD, UNK, BOS and EOS (ids 0-3) sit at positions 0-3 of every
row, and the call's decoder start and forced prefix right after them, at positions the same in every row
(:meth:`Shortlisted.options` gives search those). :meth:`Shortlisted.ids` turns the hypotheses' positions back
into target ids. Which ids a sentence may use is the caller's (:mod:`mtkit.shortlist`): here there are only ids.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from mtkit.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from mtkit.decoding.ensemble import Ensemble
from mtkit.decoding.options import SearchOptions

SPECIAL_IDS = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
if sorted(SPECIAL_IDS) != list(range(len(SPECIAL_IDS))):  # pragma: no cover - a change of the id layout
    raise ImportError("the shortlist's positions assume the special ids are 0-3")


def vocabularies(allowed: Tensor, first: tuple[int, ...]) -> Tensor:
    """Each sentence's vocabulary (B, U) int64 from ``allowed`` (B, V) bool: ``first`` (the special ids 0-3, then
    the call's start and prefix) at positions ``0 .. len(first) - 1`` of every row, then the row's other allowed
    ids in ascending order, padded with -1."""
    B, V = allowed.shape
    rest = allowed.clone()
    rest[:, list(first)] = False
    count = int(rest.sum(dim=1).max()) if B else 0
    order = torch.where(rest, torch.arange(V, device=allowed.device), V).sort(dim=1).values[:, :count]  # (B, count)
    order = order.masked_fill(order == V, -1)
    head = torch.tensor(first, dtype=torch.long, device=allowed.device).expand(B, len(first))
    return torch.cat([head, order], dim=1)


# Sentences whose output layer is computed together: the union of a few sentences' shortlists stays small (a
# sentence's is a tenth of the Multi30k model's 8,000 pieces, a hundred sentences' more than half of them), and
# each group costs a few operator calls a step (benchmarks/README.md: the shortlist's section).
GROUP = 32


class Group:
    """Sentences ``start .. end - 1`` of a :class:`ShortlistCache`, with the output projection's rows for the
    union of their vocabularies: ``weight_t`` (d_model, U'), ``offset`` (U',) or None, and ``gather``
    (n, beam, U) each row's positions in that union (None: one sentence, whose vocabulary is the union)."""

    def __init__(self, start: int, end: int, safe: Tensor, valid: Tensor, beam: int, weight: Tensor,
                 bias: Tensor | None) -> None:
        self.start, self.end = start, end
        ids = safe[start:end]
        if end - start == 1:
            union, self.gather = ids[0], None
        else:
            union = torch.unique(ids[valid[start:end]])  # sorted
            self.gather = torch.searchsorted(union, ids).unsqueeze(1).expand(end - start, beam, ids.size(1))
        self.weight_t = weight.index_select(0, union).t()
        self.offset = None if bias is None else bias.index_select(0, union)

    def kept(self, local: Tensor, start: int) -> Group:
        """This group's sentences ``local`` (their indices within it), now from sentence ``start`` on."""
        new = object.__new__(Group)
        new.__dict__.update(self.__dict__)
        new.start, new.end = start, start + local.numel()
        if self.gather is not None:
            new.gather = self.gather.index_select(0, local)
        return new

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden (n·beam, d_model) of this group's rows -> logits (n, beam, U) over each row's vocabulary."""
        weight_t, offset = self.weight_t, self.offset
        if hidden.dtype != weight_t.dtype:  # under autocast the decoder's output may be bf16/fp16
            weight_t = weight_t.to(hidden.dtype)
            offset = None if offset is None else offset.to(hidden.dtype)
        found = hidden @ weight_t if offset is None else torch.addmm(offset, hidden, weight_t)  # (n·beam, U')
        n = self.end - self.start
        found = found.view(n, hidden.size(0) // n, -1)
        return found if self.gather is None else found.gather(2, self.gather)


class ShortlistCache:
    """The wrapped model's cache, and what the live sentences' vocabularies need at each step.

    Args:
        inner: the wrapped model's cache.
        ids: (B', U) the live sentences' vocabularies (-1: padding).
        beam: rows per sentence.
        weight, bias: the full output projection, (V, d_model) and (V,) or None.
    """

    def __init__(self, inner, ids: Tensor, beam: int, weight: Tensor, bias: Tensor | None) -> None:
        self.inner, self.ids, self.beam, self.weight, self.bias = inner, ids, beam, weight, bias
        valid = ids >= 0
        self.safe = ids.clamp(min=0)  # (B', U) what the padding feeds the model if search ever picked it (never)
        B, U = ids.shape
        self.built_for = B  # the sentences the groups' unions were computed for
        self.groups = [Group(g, min(g + GROUP, B), self.safe, valid, beam, weight, bias) for g in range(0, B, GROUP)]
        self.padding = None if bool(valid.all()) else torch.zeros(B, 1, U, dtype=weight.dtype, device=weight.device
                                                                  ).masked_fill_(~valid.unsqueeze(1), -math.inf)

    def with_inner(self, inner) -> ShortlistCache:
        """This cache around ``inner`` (the same rows: a step on, or reordered within sentences)."""
        new = object.__new__(ShortlistCache)
        new.__dict__.update(self.__dict__)
        new.inner = inner
        return new

    @property
    def step(self) -> int:
        return self.inner.step

    def reorder(self, rows: Tensor) -> ShortlistCache:
        """Rows ``rows`` (N,) of this cache; each comes from its own sentence (beam search's parents), whose
        vocabulary it keeps."""
        return self.with_inner(self.inner.reorder(rows))

    def select_sentences(self, sentences: Tensor) -> ShortlistCache:
        """Sentences ``sentences`` (B',) only, in order: their vocabularies and their groups; the groups' unions
        computed again once half the sentences they were computed for have left (before, the others' ids cost a
        little work, not the result)."""
        inner, ids = self.inner.select_sentences(sentences), self.ids.index_select(0, sentences)
        if 2 * ids.size(0) <= self.built_for:
            fresh = ShortlistCache(inner, ids, self.beam, self.weight, self.bias)
            fresh.built_for = self.built_for if ids.size(0) else 0
            return fresh
        new = self.with_inner(inner)
        new.ids, new.safe = ids, self.safe.index_select(0, sentences)
        new.padding = None if self.padding is None else self.padding.index_select(0, sentences)
        kept, start = [], 0
        for group in self.groups:
            inside = sentences[(sentences >= group.start) & (sentences < group.end)] - group.start
            if inside.numel():
                kept.append(group.kept(inside, start))
                start += inside.numel()
        new.groups = kept
        return new


class ShortlistModel:
    """``model`` (with ``decode_hidden`` and ``output_weights``) decoding in positions of each sentence's vocabulary
    ``ids`` (B, U) (:func:`vocabularies`), row ``b`` for sentence ``b`` of the ``src`` that search encodes."""

    def __init__(self, model, ids: Tensor) -> None:
        self.model = model
        self.ids = ids
        self.kernels = getattr(model, "kernels", None)

    def encode(self, src: Tensor):
        if src.size(0) != self.ids.size(0):
            raise ValueError(f"{src.size(0)} sentences but {self.ids.size(0)} vocabularies")
        return self.model.encode(src)

    def init_cache(self, memory, src_mask: Tensor, beam: int = 1) -> ShortlistCache:
        weight, bias = self.model.output_weights()
        return ShortlistCache(self.model.init_cache(memory, src_mask, beam), self.ids.to(weight.device), beam,
                              weight, bias)

    def decode_step(self, tokens: Tensor, cache: ShortlistCache) -> tuple[Tensor, ShortlistCache]:
        """tokens (N,) positions -> logits (N, U) over each row's vocabulary (-inf at its padding), new cache."""
        B, U = cache.safe.shape
        K = tokens.size(0) // B
        hidden, inner = self.model.decode_hidden(cache.safe.gather(1, tokens.view(B, K)).view(-1), cache.inner)
        if len(cache.groups) == 1:
            logits = cache.groups[0].logits(hidden)
        else:
            logits = torch.cat([g.logits(hidden[g.start * K: g.end * K]) for g in cache.groups])  # (B, K, U)
        if cache.padding is not None:
            logits = logits + cache.padding.to(logits.dtype)
        return logits.reshape(B * K, U), cache.with_inner(inner)


class Shortlisted:
    """One search over each sentence's shortlist: the model search decodes with (:attr:`model`), the options it
    takes (:meth:`options`: the call's start and prefix as positions) and the hypotheses' ids (:meth:`ids`).

    Args:
        model: the engine's model (search's protocol plus ``decode_hidden`` and ``output_weights``), or an
            :class:`~mtkit.decoding.ensemble.Ensemble` of such (each member restricted alike).
        allowed: (B, V) bool, each sentence's allowed target ids (with the special ids, start and prefix).
        options: the call's search options.
    """

    def __init__(self, model, allowed: Tensor, options: SearchOptions) -> None:
        forced = tuple(dict.fromkeys(t for t in (options.start, *options.prefix) if t is not None))
        first = SPECIAL_IDS + tuple(t for t in forced if t not in SPECIAL_IDS)
        self.position = {t: i for i, t in enumerate(first)}
        self.vocab = vocabularies(allowed, first)  # (B, U)
        self._options = options
        self.table = self.vocab.cpu().tolist()
        if isinstance(model, Ensemble):
            self.model = Ensemble([ShortlistModel(m, self.vocab) for m in model.models])
        else:
            self.model = ShortlistModel(model, self.vocab)

    @property
    def options(self) -> SearchOptions:
        """The call's options with its decoder start and prefix as positions."""
        o = self._options
        return dataclasses.replace(o, start=None if o.start is None else self.position[o.start],
                                   prefix=tuple(self.position[t] for t in o.prefix))

    def ids(self, sentence: int, positions: list[int]) -> list[int]:
        """Sentence ``sentence``'s hypothesis ``positions`` as target ids."""
        row = self.table[sentence]
        return [row[p] for p in positions]
