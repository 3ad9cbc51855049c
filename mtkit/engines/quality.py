"""Quality estimation of each translation, without a reference: COMET-QE's score of the source and the
translation when a reference-free COMET model is given (CometKiwi, :mod:`mtkit.metrics.comet`), else the
model's own confidence, the mean log-probability per token of its best hypothesis (EOS included, nats, at
most 0; the server's ``confidence``). An empty source line has none (None).

What the two mean: COMET-QE is a learned estimate of human judgement, comparable across systems (CometKiwi:
around 0.8 for good translations, higher is better); the confidence is the model's certainty, comparable
only between outputs of one model (a model can be sure and wrong)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from mtkit.engines.engine import Translation
from mtkit.errors import MtkitError


def confidence(t: Translation) -> float | None:
    """The model's own estimate: its best hypothesis's mean token log-probability (None for an empty line)."""
    return t.best.mean_logprob if t.src_ids else None


def load_qe_model(name: str, device: str = "auto"):
    """A reference-free COMET model (a hub name or a folder); one that needs references is refused."""
    from mtkit.metrics.comet import CometScorer

    scorer = CometScorer(name, device)
    if scorer.needs_references:
        raise MtkitError(f"--qe-model {name}: a reference-based COMET model ({scorer.hparams.kind}); quality "
                         "estimation takes a reference-free one, such as Unbabel/wmt22-cometkiwi-da")
    return scorer


def with_quality(translations: Iterable[Translation], scorer=None, group: int = 16
                 ) -> Iterator[tuple[Translation, float | None]]:
    """Each translation with its quality estimate, in order. With ``scorer``, translations are scored
    ``group`` at a time (1: each as soon as it comes, for a stream read as it arrives)."""
    if scorer is None:
        for t in translations:
            yield t, confidence(t)
        return
    pending: list[Translation] = []
    for t in translations:
        pending.append(t)
        if len(pending) >= group:
            yield from _scored(pending, scorer)
            pending = []
    yield from _scored(pending, scorer)


def _scored(pending: list[Translation], scorer) -> Iterator[tuple[Translation, float | None]]:
    scored = [t for t in pending if t.src_ids]
    values = iter(scorer.score([t.source for t in scored], [t.best.text for t in scored], None, progress=False)
                  if scored else [])
    for t in pending:
        yield t, (next(values) if t.src_ids else None)
