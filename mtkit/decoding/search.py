"""Greedy search, sampling and beam search over the model protocol of :mod:`mtkit.decoding.options`.

Search sees token ids and three methods, nothing else (no files, no vocabulary):

    encode(src (B, S)) -> (memory, src_mask)
    init_cache(memory, src_mask, beam) -> cache
    decode_step(tokens (N,), cache) -> (logits (N, V), cache)

and the cache's ``reorder(rows)`` and ``select_sentences(sentences)``. Rows
``i*beam .. i*beam+beam-1`` of a cache belong to sentence ``i``. Options come in one
:class:`~mtkit.decoding.options.SearchOptions` per call.

Conventions (those of fairseq): the source is padded with ``pad_id`` and ends in
EOS; every hypothesis starts from BOS; log-probabilities are taken in float32.
A hypothesis of ``n`` tokens has ``n + 1`` scored tokens (its EOS) and its score
is ``logprob / lp(n + 1)`` with the GNMT length penalty
``lp(L) = ((5 + L) / 6) ** alpha`` (Wu et al., 2016; the paper's §6.1 uses
alpha = 0.6), or with ``length_penalty="power"`` ``lp(L) = L ** alpha``, the length
normalization of fairseq's ``--lenpen`` and Marian's ``--normalize`` (alpha = 1:
the mean log-probability per token). The maximum length is ``max_len_a * S + max_len_b`` tokens before
the EOS, where ``S`` counts the source ids including its EOS; at that length EOS
is forced (with its log-probability, or with ``forced_eos="zero"`` 0, as Hugging Face's
``forced_eos_token_id``). Padding and BOS are never generated.

Beam search is one loop, :func:`beam_loop`, whose per-step choices are a :class:`BeamStrategy`'s
(fairseq's ``Search.step`` / ``init_constraints`` / ``prune_sentences`` / ``update_constraints``):
the plain strategy ranks extensions by score; :mod:`mtkit.decoding.constrained` brings lexical
constraints as another strategy, in the same loop.

Every loop asks ``options.should_stop`` before each step and raises :class:`SearchStopped` when it
says so: a caller bounds a search's time (a server's deadline) without search knowing of clocks.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from mtkit.config import BOS_ID, EOS_ID, PAD_ID
from mtkit.decoding.options import Hypothesis, SearchModel, SearchOptions, SearchStopped
from mtkit.decoding.penalties import length_penalty
from mtkit.kernels import Kernels, KernelsName, select

__all__ = ["BeamStrategy", "Hypothesis", "SearchOptions", "SearchStopped", "beam_loop", "beam_search", "greedy_search",
           "max_lengths", "sample"]


def max_lengths(src: Tensor, max_len_a: float, max_len_b: int, limit: int | None, pad_id: int = PAD_ID) -> Tensor:
    """The per-sentence maximum number of tokens before EOS, (B,) int64, at least 1."""
    src_len = (src != pad_id).sum(dim=1)  # (B,)
    lengths = (max_len_a * src_len.double() + max_len_b).long().clamp(min=1)
    if limit is not None:
        lengths = lengths.clamp(max=max(1, limit))
    return lengths


# ------------------------------------------------------------------- utilities


@functools.cache
def _ids(ids: tuple[int, ...], device: torch.device) -> Tensor:
    """A constant index tensor, made once per device (every step bans the same ids)."""
    return torch.tensor(ids, device=device)


def _log_probs(logits: Tensor, step: int, min_len: int, max_len: Tensor, any_at_max: bool,
               forced_eos: str = "logprob") -> Tensor:
    """Float32 log-probabilities (N, V) with PAD/BOS banned, EOS banned before ``min_len``
    and forced for rows whose maximum length ``max_len`` (N,) is reached (``any_at_max``
    says whether any is, known to the caller without a device sync), with its own
    log-probability or, ``forced_eos="zero"``, 0 (Hugging Face's ``forced_eos_token_id``)."""
    lprobs = torch.log_softmax(logits if logits.dtype == torch.float32 else logits.float(), dim=-1)
    lprobs.index_fill_(1, _ids((PAD_ID, BOS_ID, EOS_ID) if step < min_len else (PAD_ID, BOS_ID), lprobs.device),
                       -math.inf)
    if any_at_max:
        at_max = max_len <= step  # (N,)
        eos = lprobs[:, EOS_ID].clone()
        lprobs[at_max] = -math.inf
        # Forced EOS keeps its probability: the score stays the model's log-probability.
        keep = torch.isfinite(eos[at_max]) & (forced_eos == "logprob")
        lprobs[at_max, EOS_ID] = torch.where(keep, eos[at_max], torch.zeros_like(eos[at_max]))
    return lprobs


def _ban_repeated_ngrams(lprobs: Tensor, history: Tensor, n: int) -> None:
    """Forbid tokens that would repeat an n-gram of ``history`` (N, t) (BOS excluded), in place."""
    N, t = history.shape
    if n == 1 and t > 0:
        lprobs.scatter_(1, history, -math.inf)
    if n <= 1 or t < n:
        return
    windows = history.unfold(1, n, 1)  # (N, t-n+1, n)
    prefix = history[:, t - n + 1 :]  # (N, n-1): the n-gram the next token would complete
    match = (windows[:, :, : n - 1] == prefix.unsqueeze(1)).all(dim=-1)  # (N, t-n+1)
    V = lprobs.size(1)
    banned = torch.where(match, windows[:, :, n - 1], torch.full_like(match, V, dtype=torch.long))
    mask = torch.zeros(N, V + 1, dtype=torch.bool, device=lprobs.device)
    mask.scatter_(1, banned, True)
    lprobs.masked_fill_(mask[:, :V], -math.inf)


def finished_sentences(alive: list[int], finished: list[list[Hypothesis]], best_live: list[float],
                       max_len: list[int], step: int, options: SearchOptions) -> list[int]:
    """The batch positions of beam search's live sentences that are done after ``step``: at their maximum
    length, holding ``options.beam`` finished hypotheses, or holding ``options.nbest`` of which the best can no
    longer be beaten (a live hypothesis's log-probability only falls, and its length penalty is at most that of
    the maximum length). ``alive`` maps batch positions to sentences, ``best_live`` gives each position's
    best live cumulative log-probability."""
    beam, nbest, alpha, penalty = options.beam, options.nbest, options.alpha, options.length_penalty
    done = []
    for b, sent in enumerate(alive):
        fin = finished[sent]
        if step >= max_len[sent] or len(fin) >= beam:
            done.append(b)
        elif len(fin) >= nbest:
            bound_len = len(options.prefix) + (max_len[sent] + 1 if alpha >= 0 else step + 2)
            if max(h.score for h in fin) >= best_live[b] / length_penalty(bound_len, alpha, penalty):
                done.append(b)
    return done


def surviving(done: list[int], n: int, beam: int, device: torch.device) -> tuple[list[int], Tensor, Tensor]:
    """The batch positions of ``n`` that are not ``done``: as a list, as a tensor, and their ``beam`` rows each."""
    done_set = set(done)
    keep_list = [b for b in range(n) if b not in done_set]
    keep = torch.tensor(keep_list, dtype=torch.long, device=device)
    return keep_list, keep, (keep.unsqueeze(1) * beam + torch.arange(beam, device=device)).view(-1)


# ------------------------------------------------------------------ greedy / sample


@torch.inference_mode()
def greedy_search(model: SearchModel, src: Tensor, options: SearchOptions = SearchOptions()
                  ) -> list[list[Hypothesis]]:
    """The most probable next token at every step, for a batch of sentences.

    Args:
        model: follows the protocol of :mod:`mtkit.decoding.options`.
        src: (B, S) source ids padded with PAD_ID, each ending in EOS.
        options: its lengths, ``min_len``, ``no_repeat_ngram_size``, ``forced_eos`` and ``start``; ``alpha``
            and ``length_penalty`` only for the reported score (the length-normalized log-probability).

    Returns:
        one list holding one :class:`Hypothesis` per sentence.
    """
    return _sample_or_greedy(model, src, options, sampler=None)


@torch.inference_mode()
def sample(model: SearchModel, src: Tensor, options: SearchOptions = SearchOptions(),
           generator: torch.Generator | None = None) -> list[list[Hypothesis]]:
    """Ancestral sampling from the model, optionally restricted to the ``options.top_k`` tokens, the
    nucleus of probability ``options.top_p`` (Holtzman et al., 2020) and/or the tokens of probability at
    least ``options.epsilon`` (epsilon sampling, Hewitt et al., 2022; the likeliest token always stays), at
    ``options.temperature``; the other options as :func:`greedy_search` reads them.

    The reported ``logprob`` is the model's own (temperature 1, unrestricted). The same
    ``generator`` seed gives the same samples for the same batch.
    """
    temperature, top_k, top_p, epsilon = options.temperature, options.top_k, options.top_p, options.epsilon
    if temperature <= 0:
        raise ValueError("temperature must be positive")

    def sampler(lprobs: Tensor) -> Tensor:
        scores = lprobs / temperature
        if top_k > 0:
            kth = scores.topk(min(top_k, scores.size(1)), dim=1).values[:, -1:]  # (N, 1)
            scores = scores.masked_fill(scores < kth, -math.inf)
        if top_p < 1.0:
            sorted_scores, order = scores.sort(dim=1, descending=True)
            cumulative = sorted_scores.softmax(dim=1).cumsum(dim=1)
            # Drop a token when the tokens before it already reach top_p (the first always stays).
            drop_sorted = (cumulative - sorted_scores.softmax(dim=1)) >= top_p
            drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
            scores = scores.masked_fill(drop, -math.inf)
        if epsilon > 0:
            probs = scores.softmax(dim=1)
            keep = (probs >= epsilon) | (scores == scores.max(dim=1, keepdim=True).values)
            scores = scores.masked_fill(~keep, -math.inf)
        probs = scores.softmax(dim=1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)

    return _sample_or_greedy(model, src, options, sampler=sampler)


def _feed_prefix(model: SearchModel, last: Tensor, cache, max_len: Tensor, prefix: tuple[int, ...]):
    """Run the forced ``prefix`` through the decoder after ``last`` (N,) (its logits unused: each forced token
    has log-probability 0, as Hugging Face's forced_bos_token_id gives it): the last input and the cache
    after it, and the maximum lengths (B,) less the prefix's tokens, which count in the length."""
    for token in prefix:
        _, cache = model.decode_step(last, cache)
        last = torch.full_like(last, token)
    return last, cache, (max_len - len(prefix)).clamp(min=1) if prefix else max_len


def _sample_or_greedy(model: SearchModel, src: Tensor, o: SearchOptions, sampler) -> list[list[Hypothesis]]:
    B = src.size(0)
    device = src.device
    max_len = max_lengths(src, o.max_len_a, o.max_len_b, o.max_len_limit)  # (B,)
    memory, src_mask = model.encode(src)
    cache = model.init_cache(memory, src_mask, 1)
    alive = torch.arange(B, device=device)  # original sentence of each row
    history = torch.full((B, 0), BOS_ID, dtype=torch.long, device=device)  # generated tokens, (B', t)
    logprob = torch.zeros(B, dtype=torch.float32, device=device)
    last = torch.full((B,), BOS_ID if o.start is None else o.start, dtype=torch.long, device=device)
    last, cache, max_len = _feed_prefix(model, last, cache, max_len, o.prefix)
    P = len(o.prefix)
    results: list[list[Hypothesis]] = [[] for _ in range(B)]
    min_max_len = int(max_len.min())
    step = 0
    while alive.numel() > 0:
        o.check_stop()
        logits, cache = model.decode_step(last, cache)  # (B', V)
        lprobs = _log_probs(logits, step, o.min_len, max_len, step >= min_max_len, o.forced_eos)
        if o.no_repeat_ngram_size > 0:
            _ban_repeated_ngrams(lprobs, history, o.no_repeat_ngram_size)
        token = lprobs.argmax(dim=1) if sampler is None else sampler(lprobs)  # (B',)
        logprob = logprob + lprobs.gather(1, token.unsqueeze(1)).squeeze(1)
        done = token == EOS_ID
        if bool(done.any()):
            lp = length_penalty(P + step + 1, o.alpha, o.length_penalty)
            for row in done.nonzero().squeeze(1).tolist():
                lpr = float(logprob[row])
                results[int(alive[row])] = [Hypothesis(history[row].tolist(), lpr / lp, lpr)]
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            cache = cache.select_sentences(keep)
            alive, history, logprob, token, max_len = (
                alive[keep], history[keep], logprob[keep], token[keep], max_len[keep])
        history = torch.cat([history, token.unsqueeze(1)], dim=1)
        last = token
        step += 1
    return results


# ------------------------------------------------------------------------ beam


class BeamStrategy:
    """Plain beam search's choice at each step (fairseq's ``BeamSearch.step``): the ``2·beam`` best
    extensions of a sentence's beams by cumulative log-probability, best first.

    :func:`beam_loop` calls, in this order: :meth:`init` once, then at every step :meth:`ban`,
    :meth:`candidates`, :meth:`finished_hold` (when candidates finish), :meth:`update` with the
    continuations taken, and :meth:`prune_sentences` when sentences leave the batch. A subclass bans
    tokens, proposes and orders candidates, keeps per-row state in step with the beams and says which
    finished hypotheses meet its requirements (:class:`mtkit.decoding.constrained.DynamicBeamAllocation`).
    Rows ``b*K .. b*K+K-1`` belong to batch position ``b``; ``Bc`` is the number of live sentences.
    """

    beam: int

    def init(self, batch: int, beam: int, device: torch.device) -> None:
        """Before the first step (fairseq's ``init_constraints``): ``batch`` sentences of ``beam`` rows."""
        self.beam = beam

    def ban(self, lprobs: Tensor, history: Tensor, step: int, row_max_len: Tensor) -> None:
        """Forbid tokens in ``lprobs`` (Bc·K, V), in place, given each row's tokens so far ``history``
        (Bc·K, t) and maximum length ``row_max_len`` (Bc·K,). The plain strategy bans nothing."""

    def candidates(self, scores: Tensor, lprobs: Tensor, top_extensions) -> tuple[Tensor, Tensor, Tensor]:
        """The candidates in the order the beam takes them.

        Args:
            scores: (Bc, K) the live beams' cumulative log-probabilities.
            lprobs: (Bc·K, V) the next token's log-probabilities, bans applied.
            top_extensions: the kernels' ``top_extensions(scores, lprobs, n)``.

        Returns:
            their cumulative log-probabilities (Bc, C), the beam each extends (Bc, C) and its token
            (Bc, C), C >= K; those among the first K that end in EOS finish, the first K others carry on.
        """
        V = lprobs.size(1)
        top_scores, top_index = top_extensions(scores, lprobs, 2 * self.beam)  # (Bc, 2K) over the K·V sums
        return top_scores, top_index // V, top_index % V

    def finished_hold(self, beams: Tensor) -> Tensor | None:
        """Whether a hypothesis finished from each of ``beams`` (Bc, K) meets the strategy's requirements
        (Bc, K) bool, or None: every one does. Those that do rank before those that do not."""
        return None

    def update(self, order: Tensor, rows: Tensor, tokens: Tensor) -> None:
        """The continuations taken (fairseq's ``update_constraints``): positions ``order`` (Bc, K) among the
        candidates, the new rows' parents ``rows`` (Bc·K,) and tokens ``tokens`` (Bc·K,)."""

    def prune_sentences(self, keep: Tensor, keep_rows: Tensor) -> None:
        """Only batch positions ``keep`` (B',) go on, with their rows ``keep_rows`` (B'·K,)."""


@torch.inference_mode()
def beam_search(model: SearchModel, src: Tensor, options: SearchOptions = SearchOptions(),
                kernels: KernelsName | Kernels = "auto") -> list[list[Hypothesis]]:
    """Beam search batched over sentences × beams, with the model's cached keys and values.

    fairseq's scheme: at each step the ``2·beam`` best extensions of a sentence's beams
    (by cumulative log-probability) are taken; those among the first ``beam`` that end
    in EOS are finished (scored with the length penalty), and the first ``beam`` others
    carry on. A sentence stops when it holds ``beam`` finished hypotheses, when its best
    finished score can no longer be beaten (every live hypothesis can only lose
    log-probability, and its length penalty is at most lp(max length + 1)) and it holds
    ``nbest`` finished ones, or at its maximum length (where EOS is forced). Finished
    sentences leave the batch. With ``beam=1`` this is exactly :func:`greedy_search`.

    Args:
        model: follows the protocol of :mod:`mtkit.decoding.options`.
        src: (B, S) source ids padded with PAD_ID, each ending in EOS.
        options: ``beam``, ``nbest``, the length penalty, lengths and bans (sampling fields unused).
        kernels: ranks the extensions with its ``top_extensions`` (mtkit.kernels; the same result
            either way).

    Returns:
        per sentence, its ``nbest`` best hypotheses, best first.
    """
    return beam_loop(model, src, options, BeamStrategy(), kernels)


@torch.inference_mode()
def beam_loop(model: SearchModel, src: Tensor, options: SearchOptions, strategy: BeamStrategy,
              kernels: KernelsName | Kernels = "auto") -> list[list[Hypothesis]]:
    """The beam loop of :func:`beam_search`, its candidates chosen by ``strategy`` (see :class:`BeamStrategy`).

    Returns:
        per sentence, its ``nbest`` best hypotheses: those that meet the strategy's requirements first,
        then the others, each group best first.
    """
    o = options
    K, nbest = o.beam, o.nbest
    length_penalty(1, o.alpha, o.length_penalty)  # an unknown penalty fails here, before any work
    B = src.size(0)
    device = src.device
    max_len = max_lengths(src, o.max_len_a, o.max_len_b, o.max_len_limit)  # (B,)
    max_len_list = max_len.tolist()
    top_extensions = select(kernels).top_extensions
    memory, src_mask = model.encode(src)
    cache = model.init_cache(memory, src_mask, K)
    strategy.init(B, K, device)

    alive = list(range(B))  # original sentence of each batch position
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    holds: list[list[bool]] = [[] for _ in range(B)]  # whether each finished hypothesis meets the strategy's terms
    scores = torch.zeros(B, K, dtype=torch.float32, device=device)  # cumulative log-probabilities
    scores[:, 1:] = -math.inf  # all beams start equal: only the first may expand at step 0
    history = torch.zeros(B * K, 0, dtype=torch.long, device=device)  # (B'·K, t) tokens so far
    last = torch.full((B * K,), BOS_ID if o.start is None else o.start, dtype=torch.long, device=device)
    last, cache, max_len = _feed_prefix(model, last, cache, max_len, o.prefix)
    max_len_list = max_len.tolist()
    P = len(o.prefix)
    row_max_len = max_len.repeat_interleave(K)  # (B'·K,)
    base = torch.arange(B, device=device).unsqueeze(1) * K  # (B', 1): the first row of each sentence
    min_max_len = min(max_len_list)  # the smallest maximum length among the live sentences
    step = 0
    while alive:
        o.check_stop()
        logits, cache = model.decode_step(last, cache)  # (Bc·K, V)
        lprobs = _log_probs(logits, step, o.min_len, row_max_len, step >= min_max_len, o.forced_eos)
        if o.no_repeat_ngram_size > 0:
            _ban_repeated_ngrams(lprobs, history, o.no_repeat_ngram_size)
        strategy.ban(lprobs, history, step, row_max_len)
        cand_scores, cand_beam, cand_token = strategy.candidates(scores, lprobs, top_extensions)  # (Bc, C)
        is_eos = (cand_token == EOS_ID) & (cand_scores > -math.inf)  # finite: sums of log-probabilities are <= 0
        eos_first = is_eos[:, :K]  # only candidates among the first K may finish

        # Finish: collect the hypotheses that ended (a short Python loop over few items).
        eos_hits = eos_first.nonzero().tolist()
        if eos_hits:
            lp = length_penalty(P + step + 1, o.alpha, o.length_penalty)
            rows = (base + cand_beam)[:, :K]
            fin_rows = rows[eos_first].tolist()
            fin_scores = cand_scores[:, :K][eos_first].tolist()
            hold = strategy.finished_hold(cand_beam[:, :K])
            fin_holds = [True] * len(fin_rows) if hold is None else hold[eos_first].tolist()
            for (b, _), row, s, ok in zip(eos_hits, fin_rows, fin_scores, fin_holds):
                if len(finished[alive[b]]) < K:
                    finished[alive[b]].append(Hypothesis(history[row].tolist(), s / lp, s))
                    holds[alive[b]].append(ok)

        # Continue: the first K candidates that are not EOS (a stable sort puts them first, in order).
        first = _ids(tuple(range(K)), device).expand(len(alive), K)  # (Bc, K) each sentence's 0 .. K-1
        if eos_hits:
            order = is_eos.sort(dim=1, stable=True).indices[:, :K]  # (Bc, K)
            next_beam = cand_beam.gather(1, order)
            next_token = cand_token.gather(1, order)
            scores = cand_scores.gather(1, order)  # (Bc, K)
        else:  # none of the first K ends: they carry on, as they are (the same values, fewer operator calls)
            order = first
            next_beam = cand_beam[:, :K]
            next_token = cand_token[:, :K].contiguous()
            scores = cand_scores[:, :K].contiguous()  # (Bc, K)
        rows = (base + next_beam).view(-1)  # (Bc·K,)
        strategy.update(order, rows, next_token.view(-1))

        # Which sentences are done? (a strategy may order candidates otherwise than by score: take the best)
        done = []
        if eos_hits or step >= min_max_len:
            done = finished_sentences(alive, finished, scores.max(dim=1).values.tolist(), max_len_list, step, o)

        if torch.equal(next_beam, first):  # every beam extends itself: the rows stay as they are
            history = torch.cat([history, next_token.view(-1, 1)], dim=1)
        else:
            history = torch.cat([history.index_select(0, rows), next_token.view(-1, 1)], dim=1)
            cache = cache.reorder(rows)
        last = next_token.view(-1)
        if done:
            keep_list, keep, keep_rows = surviving(done, len(alive), K, device)
            if not keep_list:
                break
            cache = cache.select_sentences(keep)
            scores = scores.index_select(0, keep)
            history = history.index_select(0, keep_rows)
            last = last.index_select(0, keep_rows)
            row_max_len = row_max_len.index_select(0, keep_rows)
            strategy.prune_sentences(keep, keep_rows)
            alive = [alive[b] for b in keep_list]
            base = base[: len(alive)]
            min_max_len = min(max_len_list[s] for s in alive)
        step += 1

    # Those that meet the strategy's terms first (a stable sort: the plain strategy's order is by score).
    return [[h for _, h in sorted(zip(ok, hyps), key=lambda x: (not x[0], -x[1].score))][:nbest]
            for ok, hyps in zip(holds, finished)]
