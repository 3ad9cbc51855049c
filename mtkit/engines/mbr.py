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
small estimator (as unbabel-comet's ``comet-mbr``). The model is loaded on first use by the engine that
uses it, and owned by it (:class:`Utilities`): nothing here outlives its engine.
"""

from __future__ import annotations

import threading
from dataclasses import replace

from sacrebleu.metrics import BLEU, CHRF

from mtkit.config import DecodeConfig
from mtkit.errors import MtkitError


def _metric(utility: str):
    """A sacreBLEU sentence scorer of its own (one per call: engines serve several threads at once)."""
    return CHRF() if utility == "chrf" else BLEU(effective_order=True)


def search_decoding(decode: DecodeConfig) -> DecodeConfig:
    """What search is asked for so that MBR has its candidates: ``mbr_candidates`` hypotheses, from a beam at
    least as wide (or as many samples)."""
    k = decode.mbr_candidates
    return replace(decode, nbest=k, beam=decode.beam if decode.sampling else max(decode.beam, k))


class Utilities:
    """The COMET models an engine's MBR calls have used, by name, loaded on first use (a reference-free one is
    refused) and kept for the engine's lifetime: at most :attr:`LIMIT` of them, the least recently used let go
    first. Safe to share between threads (one lock)."""

    LIMIT = 2

    def __init__(self) -> None:
        self._models: dict[str, object] = {}
        self._lock = threading.Lock()

    def __contains__(self, name: str) -> bool:
        with self._lock:
            return name in self._models

    def __len__(self) -> int:
        with self._lock:
            return len(self._models)

    def comet(self, name: str):
        """The COMET model ``name``, loaded now unless this object holds it already."""
        with self._lock:
            scorer = self._models.pop(name, None)
            if scorer is None:
                from mtkit.metrics.comet import CometScorer

                scorer = CometScorer(name)
                if scorer.hparams.kind != "regression_metric":
                    raise MtkitError(f"decode.mbr_comet_model {name}: MBR's COMET utility scores candidates against "
                                     f"each other as references: it needs a reference-based model (regression_metric, "
                                     f"such as Unbabel/wmt22-comet-da), not a {scorer.hparams.kind}")
            self._models[name] = scorer  # the most recently used last
            while len(self._models) > self.LIMIT:
                del self._models[next(iter(self._models))]
            return scorer


def expected_utilities(texts: list[str], utility: str, source: str = "", comet=None) -> list[float]:
    """Each text's mean utility against every text of ``texts`` as the reference: ``chrf`` or ``bleu`` (0–100,
    itself included), or ``comet`` (the others only; ``source``: what they translate; ``comet``: the COMET
    model, :meth:`Utilities.comet`)."""
    if utility == "comet":
        if len(texts) < 2:
            return [0.0] * len(texts)
        matrix = comet.pairwise(source, texts)
        return [sum(v for j, v in enumerate(row) if j != i) / (len(texts) - 1) for i, row in enumerate(matrix)]
    metric = _metric(utility)
    return [sum(metric.sentence_score(h, [r]).score for r in texts) / len(texts) for h in texts]


def mbr_order(candidates: list, decode: DecodeConfig, source: str = "", utilities: Utilities | None = None) -> list:
    """``candidates`` (each with a ``text``) by the expected utility ``decode.mbr`` (its COMET model
    ``decode.mbr_comet_model``, from ``utilities``: the engine's), best first (search's order among equals);
    the engine keeps the first ``decode.nbest``."""
    if len(candidates) < 2:
        return list(candidates)
    comet = None
    if decode.mbr == "comet":
        comet = (utilities if utilities is not None else Utilities()).comet(decode.mbr_comet_model)
    expected = expected_utilities([c.text for c in candidates], decode.mbr, source, comet)
    return [candidates[i] for i in sorted(range(len(candidates)), key=lambda i: -expected[i])]
