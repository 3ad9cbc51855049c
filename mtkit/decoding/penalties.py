"""Length penalties, without torch: :mod:`mtkit.decoding.search` applies them to tensors and the
CTranslate2 engine (which never loads torch) to plain numbers, so both rank alike."""

from __future__ import annotations

PENALTIES = ("gnmt", "power")


def length_penalty(length, alpha: float, penalty: str = "gnmt"):
    """GNMT's lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016, Eq. 14), or with
    ``penalty="power"`` lp(Y) = |Y| ** alpha (fairseq's ``--lenpen``, Marian's ``--normalize``).

    ``length`` is an int or a tensor of lengths; the result has its type (a float for an int)."""
    if penalty == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if penalty == "power":
        return length ** float(alpha)
    raise ValueError(f"unknown length penalty {penalty!r}; expected one of {', '.join(PENALTIES)}")
