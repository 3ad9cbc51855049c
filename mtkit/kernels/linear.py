"""Inference matmuls through oneDNN, on weights reordered once into its blocked layout.

``F.linear`` on the CPU calls the BLAS torch was built with (MKL), which repacks the weight on
every call and, on CPUs other than Intel's, does not take its fastest code paths. oneDNN (which
torch also ships, and which CTranslate2 uses on such CPUs) multiplies by a weight reordered once
for it: measured faster for the decoding step's larger matmuls on such a CPU (the figures, their
date and command: benchmarks/README.md, ``translate.py``). At a few rows of a small weight its fixed
cost per call loses to BLAS, so each call picks by its size (:data:`MIN_MACS`).

It serves float32 inference on the CPU only: under autocast (bf16) and on other devices, or when
torch was built without oneDNN, :class:`PackedLinear` is ``F.linear`` on the original weight.
oneDNN sums in another order than BLAS, so results differ in the last bits (about 1e-6 relative).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

MIN_MACS = 1 << 21  # rows x out x in from which oneDNN beat BLAS here (benchmarks/README.md)


@functools.cache
def onednn_linear_available() -> bool:
    """Whether torch has oneDNN's packed linear (a CPU build with mkldnn; the op is internal, so checked)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        w = torch.ones(2, 2)
        y = torch.ops.mkldnn._linear_pointwise(torch.ones(1, 2), torch.ops.mkldnn._reorder_linear_weight(w, 1),
                                               None, "none", [], "")
        return bool(torch.equal(y, torch.full((1, 2), 2.0)))
    except (AttributeError, RuntimeError):
        return False


class PackedLinear:
    """``x @ weight.T + bias`` for inference, through oneDNN when that pays (see the module docstring).

    Args:
        weight: (out, in); kept for the calls that take ``F.linear``.
        bias: (out,) or None.
        reorder: reorder the weight for oneDNN where that serves (False: ``F.linear`` always, for a reader
            that needs only ``weight`` and ``bias``).
    """

    __slots__ = ("weight", "bias", "packed", "macs_per_row", "weight_t")

    def __init__(self, weight: Tensor, bias: Tensor | None, reorder: bool = True) -> None:
        self.weight = weight
        self.bias = bias
        self.weight_t = weight.t()  # F.linear's own addmm operand, made once rather than per call
        self.macs_per_row = weight.size(0) * weight.size(1)
        usable = reorder and weight.device.type == "cpu" and weight.dtype == torch.float32 and onednn_linear_available()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 64) if usable else None

    def __call__(self, x: Tensor) -> Tensor:
        if (self.packed is not None and x.size(0) * self.macs_per_row >= MIN_MACS and x.dtype == torch.float32
                and x.dim() == 2 and not torch.is_autocast_enabled("cpu")):
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        if self.bias is not None and x.dim() == 2 and not torch.is_autocast_enabled(x.device.type):
            return torch.addmm(self.bias, x, self.weight_t)  # what F.linear calls, in one operator call
        return F.linear(x, self.weight, self.bias)

    def checked(self, x: Tensor, rows: int) -> Tensor:
        """:meth:`__call__`, with the signature of :meth:`exact` (``rows`` unused)."""
        return self(x)

    def exact(self, x: Tensor, rows: int) -> Tensor:
        """:meth:`__call__` where the caller has checked once, for many calls, what it checks at every call:
        ``x`` is (rows, in), 2-D, of the weight's dtype and device, and autocast is off (a decoding step's
        matmuls, checked once per step). The same operator as :meth:`__call__` for the same input."""
        if self.packed is not None and rows * self.macs_per_row >= MIN_MACS:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        if self.bias is not None:
            return torch.addmm(self.bias, x, self.weight_t)
        return F.linear(x, self.weight, self.bias)
