"""The runtime's side of an ensemble: loaded models must share one vocabulary (the model side, which
averages their distributions over ids, is :class:`mtkit.decoding.ensemble.Ensemble`)."""

from __future__ import annotations

from collections.abc import Sequence

from mtkit.errors import MtkitError


def check_one_vocabulary(loaded: Sequence) -> None:
    """Refuse loaded models (``.vocab``, ``.path``) whose vocabularies differ: an ensemble averages
    distributions over one id table."""
    first = loaded[0]
    for other in loaded[1:]:
        if other.vocab.model_bytes() != first.vocab.model_bytes():
            raise MtkitError(f"{getattr(other, 'path', 'a model')}: an ensemble needs one vocabulary, "
                             f"and it differs from {getattr(first, 'path', 'the first model')}'s")
