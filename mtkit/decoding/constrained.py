"""Lexically constrained beam search: Dynamic Beam Allocation (Post & Vilar, 2018), vectorized
over sentences × beams as Hu et al. (2019) do: a :class:`~mtkit.decoding.search.BeamStrategy` of
:func:`mtkit.decoding.search.beam_loop`, the loop plain beam search runs (no second loop).

Each sentence may carry phrases (lists of target ids) that its output must contain
(``include``) and phrases it must not contain (``exclude``).

* Exclude: a hypothesis that ends with all but the last piece of an excluded phrase may not
  add that last piece (its log-probability becomes -inf, as search's ``no_repeat_ngram_size``
  bans tokens); a one-piece phrase is never generated. A phrase given with an
  :class:`mtkit.engines.constraints.ExcludeMatcher` (an ``ExcludeSet``'s ``matchers``) is matched on
  the text instead: every hypothesis tracks which prefixes of the phrase's text it ends with (written
  by whole pieces), and may not add a piece that would complete the phrase, so that no spelling of
  the phrase, or of a word it begins, gets in.
* Include: every hypothesis tracks which phrases it holds and how far it is into the one it is
  writing (a phrase must be written without interruption; phrases come in any order). Its
  *bank* is the number of constraint pieces it has met. At each step the candidates are the
  ``2·beam`` best extensions (as in :func:`mtkit.decoding.search.beam_search`), every hypothesis's next
  constraint pieces and every hypothesis's best next token; duplicates are dropped, and the
  beam is shared among banks round-robin, the highest bank first (the "stripes" of Hu et al.,
  fairseq's ``LexicallyConstrainedBeamSearch``): the best of each bank, then the second best of
  each, and so on. EOS is banned for a hypothesis that has not met all its phrases, except at
  the maximum length, where EOS is forced as usual and the hypothesis finishes without them
  (the caller checks and reports that); they come after those that hold every phrase. As the
  highest bank always takes the first place, the hypothesis furthest along meets one more constraint
  piece at every step: every phrase fits when their pieces fit in the maximum length (and no ban forbids one).

Everything else is :func:`mtkit.decoding.search.beam_search`'s: those of the first ``beam`` ordered
candidates that end in EOS finish with score ``logprob / lp(n + 1)``, the first ``beam`` others
carry on; a sentence stops with ``beam`` finished hypotheses, when its best finished score
can no longer be beaten and it holds ``nbest``, or at its maximum length. A sentence without
constraints has one bank, so its candidates are ordered by score alone and it is searched
exactly as :func:`mtkit.decoding.search.beam_search` searches it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from mtkit.config import EOS_ID
from mtkit.decoding.options import Hypothesis, SearchModel, SearchOptions
from mtkit.decoding.search import BeamStrategy, beam_loop
from mtkit.kernels import Kernels, KernelsName

Phrases = Sequence[Sequence[int]]  # one sentence's phrases, each a list of target ids


class _ExcludeTable:
    """One sentence-level table per phrase length l: the first l-1 pieces (B, X, l-1), the last
    piece (B, X) and which entries are real (B, X)."""

    def __init__(self, exclude: Sequence[Phrases], device: torch.device) -> None:
        by_length: dict[int, list[list[tuple[int, ...]]]] = {}
        for b, phrases in enumerate(exclude):
            for p in phrases:
                if p:
                    by_length.setdefault(len(p), [[] for _ in exclude])[b].append(tuple(p))
        self.groups: list[tuple[int, Tensor, Tensor, Tensor]] = []
        for n, rows in sorted(by_length.items()):
            X = max(len(r) for r in rows)
            table = torch.zeros(len(exclude), X, n, dtype=torch.long)
            ok = torch.zeros(len(exclude), X, dtype=torch.bool)
            for b, r in enumerate(rows):
                for x, p in enumerate(r):
                    table[b, x] = torch.tensor(p)
                    ok[b, x] = True
            table, ok = table.to(device), ok.to(device)
            self.groups.append((n, table[:, :, : n - 1], table[:, :, n - 1], ok))

    def select(self, keep: Tensor) -> None:
        self.groups = [(n, p.index_select(0, keep), last.index_select(0, keep), ok.index_select(0, keep))
                       for n, p, last, ok in self.groups]

    def ban(self, lprobs: Tensor, history: Tensor, K: int) -> None:
        """Forbid, in place, the last piece of every phrase the rows' ``history`` (N, t) ends with the rest of."""
        N, t = history.shape
        V = lprobs.size(1)
        for n, prefix, last, ok in self.groups:
            if t < n - 1:
                continue
            last_rows = last.repeat_interleave(K, dim=0)  # (N, X)
            match = ok.repeat_interleave(K, dim=0)  # (N, X)
            if n > 1:
                tail = history[:, t - n + 1 :]  # (N, n-1)
                match = match & (prefix.repeat_interleave(K, dim=0) == tail.unsqueeze(1)).all(dim=-1)
            banned = torch.where(match, last_rows, torch.full_like(last_rows, V))
            mask = torch.zeros(N, V + 1, dtype=torch.bool, device=lprobs.device)
            mask.scatter_(1, banned, True)
            lprobs.masked_fill_(mask[:, :V], -math.inf)


class _ExcludeMatchers:
    """The phrases of :class:`mtkit.engines.constraints.ExcludeMatcher` form: per row, which prefixes of
    each phrase's text it ends with (``active``, (N, E·L): column e·L + k for k characters of phrase e;
    k = 0 is always on), and per sentence the (prefix, piece) pairs that are banned and the (prefix,
    piece, longer prefix) steps, as flat tables padded with entries that are off."""

    def __init__(self, exclude: Sequence[Phrases], K: int, device: torch.device) -> None:
        per = [tuple(getattr(p, "matchers", ())) for p in exclude]
        self.empty = not any(per)
        if self.empty:
            return
        E = max(len(m) for m in per)
        L = self.L = max(len(m.text) for ms in per for m in ms) + 1
        self.width = E * L
        B = len(exclude)
        X = max([sum(len(m.bans) for m in ms) for ms in per] + [1])
        Y = max([sum(len(m.steps) for m in ms) for ms in per] + [1])
        ban_at, ban_piece, ban_ok = (torch.zeros(B, X, dtype=torch.long), torch.zeros(B, X, dtype=torch.long),
                                     torch.zeros(B, X, dtype=torch.bool))
        step_at, step_piece, step_to = (torch.zeros(B, Y, dtype=torch.long), torch.zeros(B, Y, dtype=torch.long),
                                        torch.full((B, Y), self.width, dtype=torch.long))
        always = torch.zeros(B, self.width, dtype=torch.bool)
        start = torch.zeros(B, self.width, dtype=torch.bool)
        for b, ms in enumerate(per):
            bans = [(e * L + k, i) for e, m in enumerate(ms) for k, i in m.bans]
            steps = [(e * L + k, i, e * L + k2) for e, m in enumerate(ms) for k, i, k2 in m.steps]
            if bans:
                ban_at[b, : len(bans)] = torch.tensor([a for a, _ in bans])
                ban_piece[b, : len(bans)] = torch.tensor([i for _, i in bans])
                ban_ok[b, : len(bans)] = True
            if steps:
                step_at[b, : len(steps)] = torch.tensor([a for a, _, _ in steps])
                step_piece[b, : len(steps)] = torch.tensor([i for _, i, _ in steps])
                step_to[b, : len(steps)] = torch.tensor([t for _, _, t in steps])
            for e, m in enumerate(ms):
                always[b, e * L] = True
                start[b, e * L + m.start] = True
        self.ban_at, self.ban_piece, self.ban_ok = ban_at.to(device), ban_piece.to(device), ban_ok.to(device)
        self.step_at, self.step_piece, self.step_to = step_at.to(device), step_piece.to(device), step_to.to(device)
        self.always = always.to(device)
        self.active = (start | always).to(device).repeat_interleave(K, dim=0)  # (B·K, E·L)

    def select(self, keep: Tensor, keep_rows: Tensor) -> None:
        if self.empty:
            return
        for name in ("ban_at", "ban_piece", "ban_ok", "step_at", "step_piece", "step_to", "always"):
            setattr(self, name, getattr(self, name).index_select(0, keep))
        self.active = self.active.index_select(0, keep_rows)

    def ban(self, lprobs: Tensor, K: int) -> None:
        """Forbid, in place, every piece that would complete a phrase after a prefix the row ends with."""
        if self.empty:
            return
        V = lprobs.size(1)
        match = self.active.gather(1, self.ban_at.repeat_interleave(K, dim=0)) & self.ban_ok.repeat_interleave(K, dim=0)
        banned = torch.where(match, self.ban_piece.repeat_interleave(K, dim=0), V)  # (N, X)
        mask = torch.zeros(lprobs.size(0), V + 1, dtype=torch.bool, device=lprobs.device)
        mask.scatter_(1, banned, True)
        lprobs.masked_fill_(mask[:, :V], -math.inf)

    def advance(self, rows: Tensor, tokens: Tensor, K: int) -> None:
        """The prefixes of the rows that continue ``rows`` (parents, (N,)) with ``tokens`` (N,)."""
        if self.empty:
            return
        parent = self.active.index_select(0, rows)  # (N, E·L)
        hit = (parent.gather(1, self.step_at.repeat_interleave(K, dim=0))
               & (self.step_piece.repeat_interleave(K, dim=0) == tokens.unsqueeze(1)))
        target = torch.where(hit, self.step_to.repeat_interleave(K, dim=0), self.width)  # padding points past the end
        found = torch.zeros(parent.size(0), self.width + 1, dtype=torch.bool, device=parent.device)
        found.scatter_(1, target, True)
        self.active = found[:, : self.width] | self.always.repeat_interleave(K, dim=0)


def _include_table(include: Sequence[Phrases], device: torch.device) -> tuple[Tensor, Tensor]:
    """The phrases (B, M, L) padded with -1 and their lengths (B, M), 0 for no phrase."""
    M = max([len(p) for p in include] + [1])
    L = max([len(x) for p in include for x in p] + [1])
    phrases = torch.full((len(include), M, L), -1, dtype=torch.long)
    lengths = torch.zeros(len(include), M, dtype=torch.long)
    for b, sentence in enumerate(include):
        for m, p in enumerate(sentence):
            phrases[b, m, : len(p)] = torch.tensor(list(p), dtype=torch.long)
            lengths[b, m] = len(p)
    return phrases.to(device), lengths.to(device)


class DynamicBeamAllocation(BeamStrategy):
    """The beam loop's strategy for include / exclude phrases (see the module docstring).

    Per row (Bc·K of them): ``met`` (Bc·K, M) the phrases it holds, ``cur`` (Bc·K,) the phrase it is
    writing or -1, ``pos`` (Bc·K,) the pieces of it written, ``bank`` (Bc·K,) the constraint pieces met.
    Per sentence: ``phrases`` (Bc, M, L) padded with -1, ``phrase_len`` (Bc, M), ``total`` (Bc,).

    Args:
        include: per sentence, the phrases (non-empty lists of target ids) its output must contain.
        exclude: per sentence, the phrases its output must not contain.
    """

    def __init__(self, include: Sequence[Phrases], exclude: Sequence[Phrases]) -> None:
        if len(include) != len(exclude):
            raise ValueError("need one include and one exclude list per sentence")
        if any(not p for s in [*include, *exclude] for p in s):
            raise ValueError("a constraint phrase is empty")
        self.include, self.exclude = include, exclude

    def init(self, batch: int, beam: int, device: torch.device) -> None:
        if len(self.include) != batch:
            raise ValueError("need one include and one exclude list per sentence")
        K = self.beam = beam
        self.device = device
        self.phrases, self.phrase_len = _include_table(self.include, device)  # (B, M, L), (B, M)
        self.M, self.L = self.phrases.size(1), self.phrases.size(2)
        self.total = self.phrase_len.sum(dim=1)  # (B,) constraint pieces per sentence
        self.n_banks = int(self.total.max()) + 1
        # Phrases with a matcher are matched on their text; others (plain id lists) as sequences.
        self.banned = _ExcludeTable([() if getattr(p, "matchers", ()) else p for p in self.exclude], device)
        self.matched = _ExcludeMatchers(self.exclude, K, device)
        self.met = torch.zeros(batch * K, self.M, dtype=torch.bool, device=device)  # phrases each row holds
        self.cur = torch.full((batch * K,), -1, dtype=torch.long, device=device)  # the phrase a row writes, or -1
        self.pos = torch.zeros(batch * K, dtype=torch.long, device=device)  # pieces of it written so far
        self.bank = torch.zeros(batch * K, dtype=torch.long, device=device)  # constraint pieces met

    def ban(self, lprobs: Tensor, history: Tensor, step: int, row_max_len: Tensor) -> None:
        K = self.beam
        self.banned.ban(lprobs, history, K)
        self.matched.ban(lprobs, K)
        # EOS waits until every phrase is in (at the maximum length it is forced all the same).
        lprobs[:, EOS_ID].masked_fill_((self.bank < self.total.repeat_interleave(K)) & (row_max_len > step), -math.inf)

    def candidates(self, scores: Tensor, lprobs: Tensor, top_extensions) -> tuple[Tensor, Tensor, Tensor]:
        """The 2K best extensions, each row's next constraint pieces and each row's best token (Bc, P),
        ordered round-robin over banks."""
        K, M, L, device = self.beam, self.M, self.L, self.device
        phrases, phrase_len, met, cur, pos = self.phrases, self.phrase_len, self.met, self.cur, self.pos
        Bc = scores.size(0)
        V = lprobs.size(1)
        top_scores, top_index = top_extensions(scores, lprobs, 2 * K)  # (Bc, 2K)
        flat_scores = scores.view(-1)  # (Bc·K,)
        row_phr = phrases.repeat_interleave(K, dim=0)  # (Bc·K, M, L)
        expected = row_phr.view(Bc * K, M * L).gather(1, (cur.clamp(min=0) * L + pos.clamp(max=L - 1)).unsqueeze(1))
        starts = torch.where(met | (phrase_len.repeat_interleave(K, dim=0) == 0), -1, row_phr[:, :, 0])  # (Bc·K, M)
        first_col = torch.where(cur >= 0, expected.squeeze(1), starts[:, 0]).unsqueeze(1)
        wanted = torch.cat([first_col, torch.where((cur >= 0).unsqueeze(1), -1, starts[:, 1:])], dim=1)  # (Bc·K, M)
        wanted_lp = lprobs.gather(1, wanted.clamp(min=0)).masked_fill(wanted < 0, -math.inf)
        best_lp, best_token = lprobs.max(dim=1)  # (Bc·K,)
        beam_ids = torch.arange(K, device=device)
        pool_score = torch.cat([top_scores, (flat_scores.unsqueeze(1) + wanted_lp).view(Bc, K * M),
                                (flat_scores + best_lp).view(Bc, K)], dim=1)  # (Bc, P)
        pool_beam = torch.cat([top_index // V, beam_ids.repeat_interleave(M).expand(Bc, K * M),
                               beam_ids.expand(Bc, K)], dim=1)
        pool_token = torch.cat([top_index % V, wanted.view(Bc, K * M), best_token.view(Bc, K)], dim=1)
        P = pool_score.size(1)
        cand_pos = torch.arange(P, device=device)
        earlier = cand_pos.unsqueeze(0) < cand_pos.unsqueeze(1)  # (P, P) [i, j]: j comes before i
        valid = torch.isfinite(pool_score) & (pool_token >= 0)
        key = pool_beam * V + pool_token.clamp(min=0)
        duplicate = ((key.unsqueeze(2) == key.unsqueeze(1)) & earlier & valid.unsqueeze(1)).any(dim=2)
        valid &= ~duplicate

        # Each candidate's constraint state: it goes on with its phrase, starts one, or holds none in progress.
        parent = torch.arange(Bc, device=device).unsqueeze(1) * K + pool_beam  # (Bc, P) rows
        p_met, p_cur, p_pos = met[parent], cur[parent], pos[parent]  # (Bc, P, M), (Bc, P), (Bc, P)
        p_expected = expected.squeeze(1)[parent]
        going_on = (p_cur >= 0) & (pool_token == p_expected)
        cur_len = phrase_len.gather(1, p_cur.clamp(min=0))  # (Bc, P)
        completes_on = going_on & (p_pos + 1 == cur_len)
        starting = (~p_met) & (phrase_len.unsqueeze(1) > 0) & (phrases[:, :, 0].unsqueeze(1) == pool_token.unsqueeze(2))
        starts_one = starting.any(dim=2) & ~going_on
        started = starting.long().argmax(dim=2)  # (Bc, P) the first phrase it starts
        completes_new = starts_one & (phrase_len.gather(1, started) == 1)
        in_progress_on = going_on & ~completes_on
        in_progress_new = starts_one & ~completes_new
        new_cur = torch.where(in_progress_on, p_cur, torch.where(in_progress_new, started, -1))
        new_pos = torch.where(in_progress_on, p_pos + 1, in_progress_new.long())
        completed = torch.where(completes_on, p_cur, started)
        new_met = p_met | ((completed.unsqueeze(2) == torch.arange(M, device=device))
                           & (completes_on | completes_new).unsqueeze(2))
        new_bank = (new_met.long() * phrase_len.unsqueeze(1)).sum(dim=2) + new_pos  # (Bc, P)

        # Order: round-robin over banks, highest first; within a bank by score, ties by pool position.
        better = ((pool_score.unsqueeze(1) > pool_score.unsqueeze(2))
                  | ((pool_score.unsqueeze(1) == pool_score.unsqueeze(2)) & earlier))  # [b, i, j]: j before i
        rank = (better & (new_bank.unsqueeze(1) == new_bank.unsqueeze(2)) & valid.unsqueeze(1)).sum(dim=2)
        stripe = torch.where(valid, rank * self.n_banks + (self.total.unsqueeze(1) - new_bank),
                             (P * self.n_banks + 1) + cand_pos)  # invalid candidates last, in pool order
        ordered = stripe.argsort(dim=1)  # (Bc, P)
        # What update() takes for the candidates carried on, in this order.
        self._ordered, self._new = ordered, (new_met, new_cur, new_pos, new_bank)
        o_score = torch.where(valid, pool_score, -math.inf).gather(1, ordered)
        o_beam, o_token = pool_beam.gather(1, ordered), pool_token.gather(1, ordered).clamp(min=0)
        return o_score, o_beam, o_token

    def finished_hold(self, beams: Tensor) -> Tensor:
        """A hypothesis holds every phrase when its parent row's bank is the sentence's total."""
        return self.bank.view(beams.size(0), self.beam).gather(1, beams) == self.total.unsqueeze(1)

    def update(self, order: Tensor, rows: Tensor, tokens: Tensor) -> None:
        K, M = self.beam, self.M
        Bc = order.size(0)
        chosen = self._ordered.gather(1, order)  # (Bc, K) pool positions
        new_met, new_cur, new_pos, new_bank = self._new
        self.met = new_met.gather(1, chosen.unsqueeze(2).expand(Bc, K, M)).view(Bc * K, M)
        self.cur = new_cur.gather(1, chosen).view(-1)
        self.pos = new_pos.gather(1, chosen).view(-1)
        self.bank = new_bank.gather(1, chosen).view(-1)
        self.matched.advance(rows, tokens, K)

    def prune_sentences(self, keep: Tensor, keep_rows: Tensor) -> None:
        self.met, self.cur = self.met.index_select(0, keep_rows), self.cur.index_select(0, keep_rows)
        self.pos, self.bank = self.pos.index_select(0, keep_rows), self.bank.index_select(0, keep_rows)
        self.phrases, self.phrase_len = self.phrases.index_select(0, keep), self.phrase_len.index_select(0, keep)
        self.total = self.total.index_select(0, keep)
        self.banned.select(keep)
        self.matched.select(keep, keep_rows)


@torch.inference_mode()
def constrained_beam_search(model: SearchModel, src: Tensor, include: Sequence[Phrases], exclude: Sequence[Phrases],
                            options: SearchOptions = SearchOptions(), kernels: KernelsName | Kernels = "auto",
                            ) -> list[list[Hypothesis]]:
    """Beam search in which sentence ``i``'s outputs contain every phrase of ``include[i]`` and none
    of ``exclude[i]`` (see the module docstring); ``options`` and ``kernels`` are
    :func:`mtkit.decoding.search.beam_search`'s.

    Args:
        model: follows the protocol of :mod:`mtkit.decoding.options`.
        src: (B, S) source ids padded with PAD_ID, each ending in EOS.
        include: per sentence, the phrases (non-empty lists of target ids) its output must contain.
        exclude: per sentence, the phrases its output must not contain.

    Returns:
        per sentence, its ``nbest`` best hypotheses: those that hold every ``include`` phrase first,
        then those that reached the maximum length without (when fewer than ``nbest`` hold them), each
        group by score. None holds an ``exclude`` phrase.
    """
    if len(include) != src.size(0) or len(exclude) != src.size(0):
        raise ValueError("need one include and one exclude list per sentence")
    return beam_loop(model, src, options, DynamicBeamAllocation(include, exclude), kernels)
