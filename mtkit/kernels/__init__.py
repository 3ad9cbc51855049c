"""Fast paths, each beside its reference twin, chosen once from one setting (``Config.kernels``).

``reference`` is the formulas as written: ``F.dropout``, softmax(QKᵀ/√d_k)·V, the label-smoothed
loss and the symmetric KL of a float32 log-softmax of the whole (N, V) matrix, the model's modules
for inference. ``auto`` is the fast twins, chosen as follows (each is tested equal to its twin in
tests/unit/test_fast_paths.py). Most are chosen once, with the :class:`Kernels`; a rule marked
*per call* depends on what is known only at the call (grad mode, autocast dtype, a tensor's device
or size: one model trains and validates, in either precision), and this table is all of them:

=================  =========================================  ======================================
kernel             ``auto``                                   ``reference``
=================  =========================================  ======================================
dropout            *per call*, by the tensor's device: 16-bit ``F.dropout``
                   keep masks on CPU (:func:`~mtkit.kernels.
                   dropout.fast_dropout`), ``F.dropout``
                   elsewhere
attention          *per call*, :func:`~mtkit.kernels.         the plain formula
                   attention.choose_attention`: the plain
                   formula for CPU training in bf16/fp16 or
                   with d_k < 64, SDPA (flash) otherwise
label-smoothed CE  chunked, gradient computed in forward      float32 log-softmax of (N, V)
fused projection   *per call*, by the hidden states' device   no (the logits, then the reference
+ CE               (``fuse_projection``): on CPU no (the      loss)
                   logits, then the chunked CE); elsewhere
                   yes: the (N, V) logits never exist
symmetric KL       chunked, gradient computed in forward      float32 log-softmaxes of (N, V)
encoder and        for inference, one function each over     the model's modules (``Encoder``,
decoding step      :class:`~mtkit.kernels.packed.            ``Transformer.decode_step``)
                   InferenceWeights` (:func:`~mtkit.kernels.
                   encoder.fused_encode`, :func:`~mtkit.
                   kernels.decoder_step.fused_step`): one
                   matmul for W_Q, W_K, W_V, no module calls;
                   the weights packed once by the engine at
                   construction (:class:`mtkit.engines.
                   inference.InferenceModel`); training and
                   the loss run the modules
inference matmul   *per call*, :class:`~mtkit.kernels.linear. ``nn.Linear`` (the modules)
(fused passes)     PackedLinear`: oneDNN for a float32 2-D
                   input outside autocast from
                   :data:`~mtkit.kernels.linear.MIN_MACS`
                   multiply-adds, BLAS (``addmm``) otherwise
beam search top-k  the k best vocabulary chunks ranked        one top-k over all K·V sums
                   (:func:`~mtkit.kernels.topk.
                   chunked_top_extensions`)
=================  =========================================  ======================================

The model receives a :class:`Kernels` at construction (``Transformer(..., kernels="auto")``), the
training loss and beam search too; nothing else in mtkit branches on device, dtype or shape to pick a kernel.
This package knows nothing but torch and mtkit.config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from torch import Tensor, nn

from mtkit.kernels.attention import (
    auto_attention,
    choose_attention,
    plain_attention,
    reference_attention,
    sdpa_attention,
)
from mtkit.kernels.decoder_step import cross_keys_values, fused_hidden, fused_step
from mtkit.kernels.dropout import fast_dropout, keep_mask, masked_dropout, reference_dropout
from mtkit.kernels.encoder import fused_encode
from mtkit.kernels.loss import (
    label_smoothed_loss,
    linear_label_smoothed_loss,
    reference_label_smoothed_loss,
    reference_linear_label_smoothed_loss,
    reference_symmetric_kl,
    symmetric_kl,
)
from mtkit.kernels.packed import InferenceWeights, pack
from mtkit.kernels.topk import chunked_top_extensions, reference_top_extensions

KernelsName = Literal["auto", "reference"]


def fuse_on_accelerators(device_type: str) -> bool:
    """``auto``: fuse the output projection into the loss off the CPU, where the (N, V) logits are what
    bounds the batch in memory; on CPU memory is plentiful and the fused path measured no faster than
    the unfused one at the tiny and small shapes (benchmarks/README.md)."""
    return device_type != "cpu"


def never(device_type: str) -> bool:
    """``reference``: the logits are always made whole."""
    return False


@dataclass(frozen=True)
class Kernels:
    """One choice of kernel for every fast path (see the table above); all are plain functions.

    Attributes:
        name: ``"auto"``, ``"reference"``, or a label of a hand-made mix (benchmarks).
        dropout: (x, p, training) -> x with inverted dropout.
        attention: (q, k, v, mask, causal, dropout_p) -> (B, h, T, d_k).
        label_smoothed_loss: (logits (B, T, V), target (B, T), ε, pad_id) -> (loss_sum, nll_sum, n_tokens).
        linear_label_smoothed_loss: (hidden (B, T, d), W (V, d), target, ε, pad_id) -> the same.
        fuse_projection: device type -> whether the loss takes ``linear_label_smoothed_loss``.
        symmetric_kl: (logits_a, logits_b, target, pad_id) -> summed KL(P_a‖P_b) + KL(P_b‖P_a).
        fused_inference: whether inference (the torch engine) packs the weights and runs the fused encoder
            and decoding step, or runs the model's modules.
        top_extensions: (scores (B, K), lprobs (B·K, V), k) -> the k best sums, values and indices
            i·V + v (B, k) (beam search).
    """

    name: str
    dropout: Callable[[Tensor, float, bool], Tensor]
    attention: Callable[..., Tensor]
    label_smoothed_loss: Callable[..., tuple[Tensor, Tensor, int]]
    linear_label_smoothed_loss: Callable[..., tuple[Tensor, Tensor, int]]
    fuse_projection: Callable[[str], bool]
    symmetric_kl: Callable[..., Tensor]
    fused_inference: bool
    top_extensions: Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]]


AUTO = Kernels(
    name="auto",
    dropout=fast_dropout,
    attention=auto_attention,
    label_smoothed_loss=label_smoothed_loss,
    linear_label_smoothed_loss=linear_label_smoothed_loss,
    fuse_projection=fuse_on_accelerators,
    symmetric_kl=symmetric_kl,
    fused_inference=True,
    top_extensions=chunked_top_extensions,
)

REFERENCE = Kernels(
    name="reference",
    dropout=reference_dropout,
    attention=plain_attention,
    label_smoothed_loss=reference_label_smoothed_loss,
    linear_label_smoothed_loss=reference_linear_label_smoothed_loss,
    fuse_projection=never,
    symmetric_kl=reference_symmetric_kl,
    fused_inference=False,
    top_extensions=reference_top_extensions,
)


def select(kernels: KernelsName | Kernels = "auto") -> Kernels:
    """The :class:`Kernels` of a setting (``"auto"`` or ``"reference"``); a ``Kernels`` passes through."""
    if isinstance(kernels, Kernels):
        return kernels
    if kernels == "auto":
        return AUTO
    if kernels == "reference":
        return REFERENCE
    raise ValueError(f"kernels must be 'auto' or 'reference', got {kernels!r}")


class Dropout(nn.Module):
    """Inverted dropout (§5.4) through the chosen kernel: no parameters, active in training mode only."""

    def __init__(self, p: float, kernels: Kernels = AUTO) -> None:
        super().__init__()
        self.p = p
        self.kernel = kernels.dropout

    def forward(self, x: Tensor) -> Tensor:
        return self.kernel(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


__all__ = [
    "AUTO", "REFERENCE", "Dropout", "InferenceWeights", "Kernels", "KernelsName", "choose_attention",
    "chunked_top_extensions", "cross_keys_values", "fast_dropout", "fused_encode", "fused_hidden", "fused_step",
    "keep_mask", "pack", "reference_top_extensions",
    "label_smoothed_loss", "linear_label_smoothed_loss", "masked_dropout", "plain_attention",
    "reference_attention", "reference_dropout", "reference_label_smoothed_loss",
    "reference_linear_label_smoothed_loss", "reference_symmetric_kl", "sdpa_attention", "select", "symmetric_kl",
]
