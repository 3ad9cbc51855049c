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

With ``decode.mbr`` ``comet``, the utility is a reference-based COMET model's score (``decode.mbr_comet_model``,
:mod:`mtkit.metrics.comet`), each candidate scored against every *other* (a candidate's COMET against itself
is high and differs from one candidate to the next, unlike chrF's or BLEU's 100); the source, each candidate
and each pseudo-reference are encoded once, so a sentence costs N + 1 encoder passes and N² runs of COMET's
small estimator (as unbabel-comet's ``comet-mbr``). The model is loaded once per process.
"""

from __future__ import annotations

import threading
from dataclasses import replace

from mtkit.config import DecodeConfig
from mtkit.errors import MtkitError


def _metric(utility: str):
    """A sacreBLEU sentence scorer of its own (one per call: engines serve several threads at once)."""
    from sacrebleu.metrics import BLEU, CHRF

    return CHRF() if utility == "chrf" else BLEU(effective_order=True)


def search_decoding(decode: DecodeConfig) -> DecodeConfig:
    """What search is asked for so that MBR has its candidates: ``mbr_candidates`` hypotheses, from a beam at
    least as wide (or as many samples)."""
    k = decode.mbr_candidates
    return replace(decode, nbest=k, beam=decode.beam if decode.sampling else max(decode.beam, k))


_COMET: dict[str, object] = {}  # loaded COMET models by name, for the process's lifetime
_COMET_LOCK = threading.Lock()


def comet_utility(name: str):
    """The COMET model ``name`` (loaded once per process); a reference-free one is refused."""
    with _COMET_LOCK:
        if name not in _COMET:
            from mtkit.metrics.comet import CometScorer

            scorer = CometScorer(name)
            if scorer.hparams.kind != "regression_metric":
                raise MtkitError(f"decode.mbr_comet_model {name}: MBR's COMET utility scores candidates against "
                                 f"each other as references: it needs a reference-based model (regression_metric, "
                                 f"such as Unbabel/wmt22-comet-da), not a {scorer.hparams.kind}")
            _COMET[name] = scorer
        return _COMET[name]


def expected_utilities(texts: list[str], utility: str, source: str = "",
                       comet_model: str = "Unbabel/wmt22-comet-da") -> list[float]:
    """Each text's mean utility against every text of ``texts`` as the reference: ``chrf`` or ``bleu`` (0–100,
    itself included), or ``comet`` (the others only; ``source``: what they translate)."""
    if utility == "comet":
        if len(texts) < 2:
            return [0.0] * len(texts)
        matrix = comet_utility(comet_model).pairwise(source, texts)
        return [sum(v for j, v in enumerate(row) if j != i) / (len(texts) - 1) for i, row in enumerate(matrix)]
    metric = _metric(utility)
    return [sum(metric.sentence_score(h, [r]).score for r in texts) / len(texts) for h in texts]


def mbr_order(candidates: list, utility: str, source: str = "", comet_model: str = "Unbabel/wmt22-comet-da") -> list:
    """``candidates`` (each with a ``text``) by expected ``utility``, best first (search's order among equals);
    the engine keeps the first ``decode.nbest``."""
    if len(candidates) < 2:
        return list(candidates)
    utilities = expected_utilities([c.text for c in candidates], utility, source, comet_model)
    return [candidates[i] for i in sorted(range(len(candidates)), key=lambda i: -utilities[i])]
