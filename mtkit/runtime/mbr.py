"""Minimum-Bayes-risk decoding (Kumar & Byrne 2004; Freitag et al. 2022): of a sentence's candidates, the one
with the highest expected utility, the others standing in for the unknown reference.

With ``decode.mbr`` set (``chrf`` or ``bleu``: sacreBLEU's sentence-level chrF or BLEU with effective order),
the engine searches ``decode.mbr_candidates`` hypotheses per sentence (an n-best list from beam search, its
beam widened to that many, or as many samples with ``decode.sampling``), then orders them by

    E[u(h)] = 1/N · Σ_r u(h, r)      over every candidate r (uniform weights: a Monte Carlo estimate over
                                     samples, as Freitag et al.; h itself among them, the same for each h)

best first (search's order among equals; with include phrases, those that hold them first), and keeps
``decode.nbest`` of them. The utility is computed on the
detokenized texts; its cost is N² sentence scores per sentence (:func:`expected_utilities`).
"""

from __future__ import annotations

from dataclasses import replace

from mtkit.config import DecodeConfig


def _metric(utility: str):
    """A sacreBLEU sentence scorer of its own (one per call: engines serve several threads at once)."""
    from sacrebleu.metrics import BLEU, CHRF

    return CHRF() if utility == "chrf" else BLEU(effective_order=True)


def search_decoding(decode: DecodeConfig) -> DecodeConfig:
    """What search is asked for so that MBR has its candidates: ``mbr_candidates`` hypotheses, from a beam at
    least as wide (or as many samples)."""
    k = decode.mbr_candidates
    return replace(decode, nbest=k, beam=decode.beam if decode.sampling else max(decode.beam, k))


def expected_utilities(texts: list[str], utility: str) -> list[float]:
    """Each text's mean utility (``chrf`` or ``bleu``, 0–100) against every text of ``texts`` as the reference."""
    metric = _metric(utility)
    return [sum(metric.sentence_score(h, [r]).score for r in texts) / len(texts) for h in texts]


def mbr_order(candidates: list, utility: str) -> list:
    """``candidates`` (each with a ``text``) by expected ``utility``, best first (search's order among equals);
    the engine keeps the first ``decode.nbest``."""
    if len(candidates) < 2:
        return list(candidates)
    utilities = expected_utilities([c.text for c in candidates], utility)
    return [candidates[i] for i in sorted(range(len(candidates)), key=lambda i: -utilities[i])]
