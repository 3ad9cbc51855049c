"""A model whose next-token logits are computed for each sentence's own shortlist of target ids only.

:class:`ShortlistModel` wraps a model of the search protocol that also has ``decode_hidden`` (the decoder's
output before the output projection) and ``output_weights`` (that projection's W (V, d_model) and bias):
at each step it multiplies the decoder's output by the rows of W of the union of the live sentences'
allowed ids only (one ``addmm``), scatters them into (N, V) logits of -inf, and gives every row -inf
outside ITS sentence's allowed ids, so that each row's log-softmax is over its own shortlist: a sentence's
output never depends on the other sentences of its batch (Bergamot's per-batch shortlist does, and
CTranslate2's ``use_vmap`` too). Its cache follows ``reorder`` (rows stay within their sentence) and
``select_sentences`` (the sentences that leave take their ids out of the union).

Search itself is unchanged: ids in, ids out. :func:`restrict` wraps a model, or each model of an ensemble.
Which ids a sentence may use is the caller's (:mod:`mtkit.shortlist`): here there are only ids.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mtkit.decoding.ensemble import Ensemble


class ShortlistCache:
    """The wrapped model's cache, and the gathered output weights of the live sentences' shortlists.

    Args:
        inner: the wrapped model's cache.
        allowed: (B', V) bool, each live sentence's allowed ids.
        beam: rows per sentence.
        weight, bias: the full output projection (V, d_model) and (V,) or None.
    """

    def __init__(self, inner, allowed: Tensor, beam: int, weight: Tensor, bias: Tensor | None) -> None:
        self.inner = inner
        self.allowed = allowed
        self.beam = beam
        self.weight = weight
        self.bias = bias
        self.union = allowed.any(dim=0).nonzero().squeeze(1)  # (U,) ids some live sentence may use
        self.weight_t = weight.index_select(0, self.union).t()  # (d_model, U)
        self.offset = None if bias is None else bias.index_select(0, self.union).unsqueeze(0)  # (1, U)
        within = allowed.index_select(1, self.union)  # (B', U)
        if not bool(within.all()):  # the sentences' shortlists differ: each row gets -inf outside its own
            rows = within.repeat_interleave(beam, dim=0)  # (N, U)
            mask = torch.zeros(rows.shape, dtype=weight.dtype, device=weight.device).masked_fill_(~rows, -math.inf)
            self.offset = mask if self.offset is None else mask + self.offset  # (N, U)
        # The logits of the ids outside the union stay -inf: one buffer for every step of these rows (search
        # reads a step's logits before the next step and never writes them).
        self.buffer: Tensor | None = None

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
        """Rows ``rows`` (N,) of this cache; each comes from its own sentence (beam search's parents), so the
        rows' masks stay as they are."""
        return self.with_inner(self.inner.reorder(rows))

    def select_sentences(self, sentences: Tensor) -> ShortlistCache:
        """Sentences ``sentences`` (B',) only: their masks, and the union of their ids computed again."""
        return ShortlistCache(self.inner.select_sentences(sentences), self.allowed.index_select(0, sentences),
                              self.beam, self.weight, self.bias)


class ShortlistModel:
    """``model`` (with ``decode_hidden`` and ``output_weights``) with each sentence's next token restricted to
    its ``allowed`` ids (B, V) bool, row ``b`` for sentence ``b`` of the ``src`` that search encodes."""

    def __init__(self, model, allowed: Tensor) -> None:
        self.model = model
        self.allowed = allowed
        self.kernels = getattr(model, "kernels", None)

    def encode(self, src: Tensor):
        if src.size(0) != self.allowed.size(0):
            raise ValueError(f"{src.size(0)} sentences but {self.allowed.size(0)} shortlists")
        return self.model.encode(src)

    def init_cache(self, memory, src_mask: Tensor, beam: int = 1) -> ShortlistCache:
        weight, bias = self.model.output_weights()
        return ShortlistCache(self.model.init_cache(memory, src_mask, beam), self.allowed.to(weight.device), beam,
                              weight, bias)

    def decode_step(self, tokens: Tensor, cache: ShortlistCache) -> tuple[Tensor, ShortlistCache]:
        """tokens (N,) -> logits (N, V), -inf outside each row's shortlist, and the new cache."""
        hidden, inner = self.model.decode_hidden(tokens, cache.inner)  # (N, d_model)
        offset, weight_t = cache.offset, cache.weight_t
        if hidden.dtype != weight_t.dtype:  # under autocast the decoder's output may be bf16/fp16
            weight_t = weight_t.to(hidden.dtype)
            offset = None if offset is None else offset.to(hidden.dtype)
        scores = hidden @ weight_t if offset is None else torch.addmm(offset, hidden, weight_t)  # (N, U)
        logits = cache.buffer
        if logits is None or logits.dtype != scores.dtype or logits.size(0) != scores.size(0):
            logits = cache.buffer = scores.new_full((scores.size(0), cache.weight.size(0)), -math.inf)  # (N, V)
        logits.index_copy_(1, cache.union, scores)
        return logits, cache.with_inner(inner)


def restrict(model, allowed: Tensor):
    """``model`` restricted to each sentence's ``allowed`` ids (B, V) bool: a :class:`ShortlistModel`, or an
    :class:`~mtkit.decoding.ensemble.Ensemble` of them for an ensemble (each member restricted alike)."""
    if isinstance(model, Ensemble):
        return Ensemble([ShortlistModel(m, allowed) for m in model.models])
    return ShortlistModel(model, allowed)
