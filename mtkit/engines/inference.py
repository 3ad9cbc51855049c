"""A Transformer as search sees it: the model protocol (``encode``, ``init_cache``, ``decode_step``),
over weights packed once, at construction.

:class:`InferenceModel` resolves the inference kernels once, from the model's
(:attr:`mtkit.kernels.Kernels.fused_inference`): ``auto`` packs the weights
(:func:`mtkit.kernels.packed.pack`) and runs the fused encoder and decoding step on them; ``reference``
runs the model's own modules. It owns what it packed: weights packed before an optimizer step are the
old ones, so whoever decodes with new weights builds a new one (the torch engine is built per use,
validation BLEU builds it at every validation). The model itself is left as it was: its ``encode``
and ``decode_step`` stay the paper's modules (training, the loss, the reference twins).
"""

from __future__ import annotations

from torch import Tensor

from mtkit.kernels import cross_keys_values, fused_encode, fused_hidden, fused_step, pack
from mtkit.model import DecoderCache, LayerCache, Transformer


class InferenceModel:
    """One Transformer for decoding, in eval mode; run it under ``torch.inference_mode()``.

    Args:
        model: a :class:`mtkit.model.Transformer`, on the device and in the mode it decodes in (the
            weights are packed from it as they are now).
    """

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.fused = model.kernels.fused_inference
        self.weights = pack(model) if self.fused else None
        self.kernels = model.kernels  # search ranks beam extensions with its ``top_extensions``

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) ids, padded with pad_id -> memory (B, S, d_model) and its mask (B, 1, 1, S)."""
        if not self.fused:
            return self.model.encode(src)
        src_mask = self.model.source_mask(src)
        return fused_encode(self.weights, src, src_mask), src_mask

    def init_cache(self, memory: Tensor, src_mask: Tensor, beam: int = 1) -> DecoderCache:
        """As :meth:`mtkit.model.Transformer.init_cache`: the encoder keys and values projected once per
        sentence, memory (B, S, d_model), for ``beam`` rows each."""
        if not self.fused:
            return self.model.init_cache(memory, src_mask, beam)
        B, _, d = memory.shape
        h = self.weights.heads
        empty = memory.new_zeros(B * beam, h, 0, d // h)  # (N, h, 0, d_k)
        layers = [LayerCache(empty, empty, k, v) for k, v in cross_keys_values(self.weights, memory)]
        return DecoderCache(layers=layers, src_mask=src_mask, beam=beam, step=0)

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> tuple[Tensor, DecoderCache]:
        """tokens (N,) last token of each row -> logits (N, V) for the next token, and the new cache."""
        if not self.fused:
            return self.model.decode_step(tokens, cache)
        return fused_step(self.weights, tokens, cache)

    def decode_hidden(self, tokens: Tensor, cache: DecoderCache) -> tuple[Tensor, DecoderCache]:
        """:meth:`decode_step` before the output projection: the decoder's output (N, d_model), new cache."""
        if not self.fused:
            return self.model.decode_hidden(tokens, cache)
        return fused_hidden(self.weights, tokens, cache)

    def output_weights(self) -> tuple[Tensor, Tensor | None]:
        """The output projection's weight (V, d_model) and bias (V,) or None: what :meth:`decode_step` multiplies
        :meth:`decode_hidden`'s output by (a vocabulary shortlist takes some of its rows)."""
        projection = self.model.output_projection
        return projection.weight, projection.bias
