"""Beam search's ranking of one-token extensions: the plain top-k and a chunked one.

Both take the cumulative scores (B, K) of each sentence's K hypotheses and their next-token
log-probabilities (B·K, V), and return the k best sums per sentence, values (B, k) and indices
i·V + v into the K·V extensions, best first: exactly
``(scores.view(-1, 1) + lprobs).view(B, K * V).topk(k)``.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor


def reference_top_extensions(scores: Tensor, lprobs: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top-k over all K·V sums of each sentence (a sort of every sentence's K·V values)."""
    B, K = scores.shape
    V = lprobs.size(1)
    return (scores.view(-1, 1) + lprobs).view(B, K * V).topk(min(k, K * V), dim=1)


@functools.cache
def chunk_size(V: int) -> int | None:
    """The width of the vocabulary chunks of :func:`chunked_top_extensions`: the largest multiple of
    16 up to 256 that divides V (e.g. 160 for 8000, 256 for 32000); otherwise 256, the last chunk
    holding the remainder (OPUS-MT's 58,101 + 1 ids: 226 chunks and one of 246); None when V is
    below two chunks of 16. Cached: every step of a search asks it for the same V."""
    exact = next((c for c in range(256, 15, -16) if V % c == 0 and V // c > 1), None)
    if exact is not None:
        return exact
    return next((c for c in (256, 128, 64, 32, 16) if V > 2 * c), None)


def chunked_top_extensions(scores: Tensor, lprobs: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The same values and indices as :func:`reference_top_extensions`, ranking only k chunks.

    Top-k over all K·V sums is the costliest step of beam search on CPU after the output
    projection. Instead the vocabulary is cut into chunks: a chunk that holds one of the k best
    sums has a maximum at least the k-th best, and at most k chunks do, so the k best sums lie in
    the k chunks of highest maximum (max(x) + s = max(x + s) also in floating point, rounding being
    monotonic). Only those chunks' sums are computed and ranked; the values are bit-identical.
    When the chunk width does not divide V, the last chunk is shorter (padded with -inf where it is
    ranked). Falls back to the plain ranking when V has no chunk width or k chunks cover it all.
    """
    B, K = scores.shape
    V = lprobs.size(1)
    chunk = chunk_size(V)
    if chunk is None or k * chunk >= K * V:
        return reference_top_extensions(scores, lprobs, k)
    full = V // chunk
    n = -(-V // chunk)  # chunks, the last one shorter when chunk does not divide V
    rows_all = lprobs.as_strided((B * K, full, chunk), (lprobs.stride(0), chunk, 1))  # (B·K, full, chunk)
    maxima = rows_all.amax(dim=2)  # (B·K, full)
    if n > full:
        maxima = torch.cat([maxima, lprobs[:, full * chunk :].amax(dim=1, keepdim=True)], dim=1)  # (B·K, n)
    maxima = (scores.view(-1, 1) + maxima).view(B, K * n)  # (B, K·n)
    best = maxima.topk(k, dim=1).indices  # (B, k) chunk numbers i·n + c
    flat = best + _first_chunks(B, K * n, lprobs.device)  # (B, k) chunk numbers over all rows: row·n + c
    rows = flat // n  # (B, k) rows of lprobs
    if n == full and lprobs.is_contiguous():  # the chunks are the rows of lprobs seen as (B·K·n, chunk)
        picked_values = lprobs.view(-1, chunk).index_select(0, flat.view(-1)).view(B, k, chunk)
    elif n == full:
        picked_values = rows_all[rows, best % n]  # (B, k, chunk)
    else:
        columns = (best % n).unsqueeze(2) * chunk + torch.arange(chunk, device=lprobs.device)  # (B, k, chunk)
        picked_values = lprobs[rows.unsqueeze(2), columns.clamp(max=V - 1)].masked_fill(columns >= V, -math.inf)
    sums = picked_values + scores.view(-1).index_select(0, rows.view(-1)).view(B, k, 1)  # (B, k, chunk)
    values, pos = sums.view(B, k * chunk).topk(k, dim=1)  # (B, k)
    picked = best.gather(1, pos // chunk)  # (B, k) the chunk of each pick
    if n == full:  # chunk c of beam i starts at column c·chunk: index i·V + c·chunk = (i·n + c)·chunk
        return values, picked * chunk + pos % chunk
    column = (picked % n) * chunk + pos % chunk
    # a -inf pick from the short chunk's padding (fewer than k finite sums) names a real column
    column = column.clamp(max=V - 1)
    return values, (picked // n) * V + column


@functools.lru_cache(maxsize=256)
def _first_chunks(B: int, per_sentence: int, device: torch.device) -> Tensor:
    """(B, 1) the number of each sentence's first chunk, b·K·n: made once per batch size (a constant of every step)."""
    return torch.arange(B, device=device).unsqueeze(1) * per_sentence
