"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), §3, and nothing else.

One class per component, in the paper's order: positional encoding and embeddings (§3.5,
§3.4), multi-head attention (§3.2), the position-wise feed-forward network (§3.3), encoder and
decoder layers (§3.1), the encoder and decoder stacks (§3.1), and the whole encoder-decoder
with its output projection (§3.4); then the decoder cache of incremental decoding.

Conventions: tensors are batch-first. ``B`` batch, ``S`` source length, ``T``
target length, ``h`` heads, ``d_k = d_model / h``, ``V`` vocabulary size.
Padding masks are boolean with True marking a padding position. The model
knows nothing of files, tokenizers or training: special ids come in as
integers. Incremental decoding passes an explicit :class:`DecoderCache` in and
out; no state is ever written onto a module during ``forward``.

Dropout and attention go through the :class:`~mtkit.kernels.Kernels` the model receives at
construction (``kernels="auto"`` or ``"reference"``): this module holds the paper's formulas
only, with no branch on device, dtype or shape.

Parameter names are a file format (checkpoints and exporters read them; layer norms are named by the
sub-layer they serve): change them only together with ``CHECKPOINT_FORMAT`` and its upgrade step in
mtkit.checkpoints.io.

One module for the whole of §3, so that the model reads as the paper does, top to bottom; its
length is the components and their documented shapes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtkit.config import ModelConfig
from mtkit.kernels import AUTO, Dropout, Kernels, KernelsName, reference_attention, select

# ------------------------------------------------- §3.5 positions, §3.4 embeddings


FAIRSEQ_FIRST_POSITION = 2  # fairseq numbers positions from padding_idx + 1, its padding id being 1


def sinusoid_table(max_positions: int, d_model: int, layout: str = "interleaved") -> Tensor:
    """The paper's positional encodings (§3.5), shape (max_positions, d_model).

    PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).
    ``layout="concatenated"`` puts the same sines in the first half and the cosines in the second
    (Marian and tensor2tensor order them so; Hugging Face's MarianSinusoidalPositionalEmbedding).
    ``layout="fairseq"`` is fairseq's SinusoidalPositionalEmbedding (M2M100, NLLB): concatenated, with
    the frequencies 10000^(-i/(d_model/2 - 1)) and the first position numbered 2 (fairseq's padding id + 1).
    """
    first = FAIRSEQ_FIRST_POSITION if layout == "fairseq" else 0
    pos = torch.arange(first, first + max_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model/2,)
    if layout == "fairseq":
        angle = pos * torch.exp(-math.log(10000.0) * (two_i / 2) / (d_model // 2 - 1))  # (P, d_model/2)
    else:
        angle = pos / torch.pow(10000.0, two_i / d_model)  # (P, d_model/2)
    table = torch.zeros(max_positions, d_model, dtype=torch.float64)
    if layout in ("concatenated", "fairseq"):
        n_sin = angle.size(1)
        table[:, :n_sin] = torch.sin(angle)
        table[:, n_sin:] = torch.cos(angle[:, : d_model // 2])
    else:
        table[:, 0::2] = torch.sin(angle)
        table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class PositionalEncoding(nn.Module):
    """Fixed sinusoidal positional encoding (§3.5); a buffer, not a parameter."""

    def __init__(self, d_model: int, max_positions: int, layout: str = "interleaved") -> None:
        super().__init__()
        self.register_buffer("table", sinusoid_table(max_positions, d_model, layout), persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Returns the encodings of positions offset..offset+length-1, shape (length, d_model)."""
        return self.table[offset : offset + length]


class LearnedPositionalEncoding(nn.Module):
    """Learned positional embeddings, the alternative of §3.5 / Table 3 row (E)."""

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_positions, d_model))
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Returns shape (length, d_model)."""
        return self.weight[offset : offset + length]


class Embeddings(nn.Module):
    """Token embeddings scaled by √d_model plus positional encoding, then dropout (§3.4, §3.5, §5.4).

    ``tokens`` can be shared with another ``Embeddings`` (and with the output
    projection) by passing the same ``nn.Embedding``. ``scale=False`` leaves the
    token embeddings unscaled (option ``scale_embedding``).
    """

    def __init__(self, tokens: nn.Embedding, positions: nn.Module, dropout: float, kernels: Kernels = AUTO,
                 scale: bool = True) -> None:
        super().__init__()
        self.tokens = tokens
        self.positions = positions
        self.dropout = Dropout(dropout, kernels)
        self.scale = math.sqrt(tokens.embedding_dim) if scale else 1.0

    def forward(self, ids: Tensor, offset: int = 0) -> Tensor:
        """(B, L) token ids -> (B, L, d_model); ``offset`` is the first position (for decoding steps)."""
        x = self.tokens(ids) * self.scale + self.positions(ids.size(1), offset)
        return self.dropout(x)


# ------------------------------------------------------------ §3.2 attention


class MultiHeadAttention(nn.Module):
    """Multi-head attention (§3.2.2): Concat(head_1..head_h)·W_O with head_i = Attention(QW_Q_i, KW_K_i, VW_V_i).

    The h per-head projections of size d_model × d_k are stored together as one
    d_model × d_model matrix each for Q, K and V. Attention itself, softmax(QKᵀ/√d_k)·V
    (§3.2.1, Eq. 1), is the ``attention`` kernel of ``kernels``; :meth:`forward_with_weights` uses the
    formula written out (:func:`mtkit.kernels.reference_attention`).
    """

    def __init__(self, d_model: int, h: int, dropout: float = 0.0, kernels: Kernels = AUTO) -> None:
        super().__init__()
        assert d_model % h == 0, "d_model must be divisible by h"
        self.h = h
        self.d_k = d_model // h
        self.dropout = dropout
        self.kernel = kernels.attention
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, L, d_model) -> (B, h, L, d_k)."""
        B, L, _ = x.shape
        return x.view(B, L, self.h, self.d_k).transpose(1, 2)  # (B, h, L, d_k)

    def merge_heads(self, x: Tensor) -> Tensor:
        """(B, h, L, d_k) -> (B, L, d_model): the concatenation of the heads."""
        B, _, L, _ = x.shape
        return x.transpose(1, 2).reshape(B, L, self.h * self.d_k)  # (B, L, d_model)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of ``x`` (B, S, d_model), each (B, h, S, d_k)."""
        return self.split_heads(self.w_k(x)), self.split_heads(self.w_v(x))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool = False) -> Tensor:
        """Attention of projected q (B, h, T, d_k) over k, v (B, h, S, d_k) -> (B, T, d_model) after W_O."""
        dropout_p = self.dropout if self.training else 0.0
        out = self.kernel(q, k, v, mask, causal, dropout_p)  # (B, h, T, d_k)
        return self.w_o(self.merge_heads(out))

    def forward(self, query: Tensor, memory: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
        """Attention of ``query`` (B, T, d_model) over ``memory`` (B, S, d_model).

        Args:
            mask: boolean, broadcastable to (B, h, T, S), True where allowed.
            causal: mask every future position (decoder self-attention, §3.2.3).

        Returns:
            (B, T, d_model).
        """
        q = self.split_heads(self.w_q(query))  # (B, h, T, d_k)
        k, v = self.project_kv(memory)  # (B, h, S, d_k)
        return self.attend(q, k, v, mask, causal)

    def forward_with_weights(self, query: Tensor, memory: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """As :meth:`forward` (not causal), through the reference formula, with the weights (B, h, T, S) that
        the output is made of (before dropout): what guided-alignment training supervises and alignments and
        heatmaps read."""
        q = self.split_heads(self.w_q(query))
        k, v = self.project_kv(memory)
        out, weights = reference_attention(q, k, v, mask, dropout_p=self.dropout if self.training else 0.0)
        return self.w_o(self.merge_heads(out)), weights


# ------------------------------------------------------------ §3.3 feed-forward


ACTIVATIONS = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}  # swish(x) = x·σ(x) (SiLU); gelu: exact (erf)


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, xW_1 + b_1)W_2 + b_2 (§3.3, Eq. 2); (B, L, d_model) -> (B, L, d_model).

    ``activation`` replaces max(0, ·) by swish or GELU (option ``activation``).
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, kernels: Kernels = AUTO,
                 activation: str = "relu") -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = Dropout(dropout, kernels)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.dropout(self.activation(self.w_1(x))))


# ----------------------------------------------------------------- §3.1 layers


class Residual(nn.Module):
    """The residual connection and layer normalization around a sub-layer (§3.1, §5.4), given the
    sub-layer and its LayerNorm (each layer names its norms by the sub-layer they serve).

    Post-norm (the paper): LayerNorm(x + Dropout(Sublayer(x))).
    Pre-norm (option):     x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, dropout: float, pre_norm: bool, kernels: Kernels = AUTO) -> None:
        super().__init__()
        self.dropout = Dropout(dropout, kernels)
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, norm: nn.LayerNorm, sublayer) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(norm(x)))
        return norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention then FFN, each wrapped in a residual connection and LayerNorm (§3.1)."""

    def __init__(self, cfg: ModelConfig, kernels: Kernels = AUTO) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.h, cfg.attention_dropout, kernels)
        self.feed_forward = PositionwiseFeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout, kernels,
                                                    cfg.activation)
        self.self_attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.feed_forward_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.residual = Residual(cfg.dropout, cfg.norm == "pre", kernels)

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        """x (B, S, d_model), src_mask (B, 1, 1, S) True where a real token -> (B, S, d_model)."""
        x = self.residual(x, self.self_attn_norm, lambda y: self.self_attn(y, y, src_mask))
        return self.residual(x, self.feed_forward_norm, self.feed_forward)


class DecoderLayer(nn.Module):
    """Masked self-attention, attention over the encoder output, then FFN (§3.1, §3.2.3)."""

    def __init__(self, cfg: ModelConfig, kernels: Kernels = AUTO) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.h, cfg.attention_dropout, kernels)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.h, cfg.attention_dropout, kernels)
        self.feed_forward = PositionwiseFeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout, kernels,
                                                    cfg.activation)
        self.self_attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.cross_attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.feed_forward_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.residual = Residual(cfg.dropout, cfg.norm == "pre", kernels)

    def forward(self, y: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """y (B, T, d_model), memory (B, S, d_model), src_mask (B, 1, 1, S) -> (B, T, d_model).

        Self-attention is causal: position t sees positions ≤ t only. Target padding
        sits at the end of each row, so the causal mask also hides it from real tokens.
        """
        y = self.residual(y, self.self_attn_norm, lambda x: self.self_attn(x, x, None, causal=True))
        y = self.residual(y, self.cross_attn_norm, lambda x: self.cross_attn(x, memory, src_mask))
        return self.residual(y, self.feed_forward_norm, self.feed_forward)

    def forward_with_weights(self, y: Tensor, memory: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor]:
        """As :meth:`forward`, with the cross-attention weights (B, h, T, S) it used (the reference formula)."""
        y = self.residual(y, self.self_attn_norm, lambda x: self.self_attn(x, x, None, causal=True))
        found = []

        def cross_attention(x: Tensor) -> Tensor:
            out, weights = self.cross_attn.forward_with_weights(x, memory, src_mask)
            found.append(weights)
            return out

        y = self.residual(y, self.cross_attn_norm, cross_attention)
        return self.residual(y, self.feed_forward_norm, self.feed_forward), found[0]

    def step(self, y: Tensor, cache: LayerCache, src_mask: Tensor, beam: int) -> tuple[Tensor, LayerCache]:
        """One decoding step: y (N, 1, d_model) for N = B × beam rows -> (N, 1, d_model) and the new cache."""

        def self_attention(x: Tensor) -> Tensor:
            nonlocal cache
            attn = self.self_attn
            q = attn.split_heads(attn.w_q(x))  # (N, h, 1, d_k)
            k, v = attn.project_kv(x)  # each (N, h, 1, d_k)
            cache = replace(
                cache, self_k=torch.cat([cache.self_k, k], dim=2), self_v=torch.cat([cache.self_v, v], dim=2)
            )  # (N, h, t+1, d_k)
            return attn.attend(q, cache.self_k, cache.self_v, None)

        def cross_attention(x: Tensor) -> Tensor:
            attn = self.cross_attn
            N = x.size(0)
            # A sentence's beam rows act as `beam` queries over its one copy of the keys.
            q = attn.split_heads(attn.w_q(x).view(N // beam, beam, -1))  # (B, h, beam, d_k)
            out = attn.attend(q, cache.cross_k, cache.cross_v, src_mask)  # (B, beam, d_model)
            return out.reshape(N, 1, -1)  # (N, 1, d_model)

        y = self.residual(y, self.self_attn_norm, self_attention)
        y = self.residual(y, self.cross_attn_norm, cross_attention)
        return self.residual(y, self.feed_forward_norm, self.feed_forward), cache


# ----------------------------------------------------------------- §3.1 stacks


class Encoder(nn.Module):
    """A stack of N encoder layers (§3.1); pre-norm adds a final LayerNorm."""

    def __init__(self, cfg: ModelConfig, embeddings: Embeddings, kernels: Kernels = AUTO) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.layers = nn.ModuleList([EncoderLayer(cfg, kernels) for _ in range(cfg.encoder_layers)])
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm == "pre" else nn.Identity()

    def forward(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """src (B, S) ids, src_mask (B, 1, 1, S) -> memory (B, S, d_model)."""
        x = self.embeddings(src)
        for layer in self.layers:
            x = layer(x, src_mask)
        return self.norm(x)


class Decoder(nn.Module):
    """A stack of N decoder layers (§3.1); pre-norm adds a final LayerNorm."""

    def __init__(self, cfg: ModelConfig, embeddings: Embeddings, kernels: Kernels = AUTO) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.layers = nn.ModuleList([DecoderLayer(cfg, kernels) for _ in range(cfg.decoder_layers)])
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm == "pre" else nn.Identity()

    def forward(self, tgt: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """tgt (B, T) ids (shifted right: BOS first) -> hidden states (B, T, d_model)."""
        y = self.embeddings(tgt)
        for layer in self.layers:
            y = layer(y, memory, src_mask)
        return self.norm(y)

    def forward_with_attention(self, tgt: Tensor, memory: Tensor, src_mask: Tensor, layer: int, head: int
                               ) -> tuple[Tensor, Tensor]:
        """As :meth:`forward`, with the cross-attention weights (B, T, S) of ``head`` of ``layer`` (0-based):
        what guided alignment trains (Garg et al. 2019)."""
        y = self.embeddings(tgt)
        weights = None
        for i, decoder_layer in enumerate(self.layers):
            if i == layer:
                y, all_heads = decoder_layer.forward_with_weights(y, memory, src_mask)
                weights = all_heads[:, head]
            else:
                y = decoder_layer(y, memory, src_mask)
        assert weights is not None, f"no decoder layer {layer}"
        return self.norm(y), weights

    def step(self, tokens: Tensor, cache: DecoderCache) -> tuple[Tensor, DecoderCache]:
        """tokens (N, 1), the last token of each row -> hidden state (N, 1, d_model) and the new cache."""
        y = self.embeddings(tokens, offset=cache.step)
        layers = []
        for layer, layer_cache in zip(self.layers, cache.layers):
            y, layer_cache = layer.step(y, layer_cache, cache.src_mask, cache.beam)
            layers.append(layer_cache)
        return self.norm(y), replace(cache, layers=layers, step=cache.step + 1)


# ------------------------------------------------------------- the whole model


class Transformer(nn.Module):
    """The encoder-decoder Transformer (§3, Figure 1).

    With ``share_embeddings='all'`` (the paper's setting, §3.4) the source and target
    embeddings and the pre-softmax projection are one matrix, which needs a shared
    vocabulary; ``'decoder'`` ties only the target embedding and the projection;
    ``'none'`` ties nothing. ``kernels`` chooses dropout and attention kernels (``"auto"``: the fast
    paths, ``"reference"``: the formulas as written; see mtkit.kernels); they hold no parameters.
    """

    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int = 0,
                 kernels: KernelsName | Kernels = "auto", initialize: bool = True) -> None:
        super().__init__()
        kernels = select(kernels)
        if cfg.share_embeddings == "all" and src_vocab_size != tgt_vocab_size:
            raise ValueError("share_embeddings='all' needs one vocabulary for source and target")
        self.cfg = cfg
        self.pad_id = pad_id

        src_tokens = nn.Embedding(src_vocab_size, cfg.d_model, padding_idx=pad_id)
        tgt_tokens = (src_tokens if cfg.share_embeddings == "all"
                      else nn.Embedding(tgt_vocab_size, cfg.d_model, padding_idx=pad_id))
        self.kernels = kernels
        if cfg.positions == "sinusoidal":
            positions = lambda: PositionalEncoding(cfg.d_model, cfg.max_positions, cfg.sinusoid_layout)  # noqa: E731
        else:
            positions = lambda: LearnedPositionalEncoding(cfg.d_model, cfg.max_positions)  # noqa: E731
        embeddings = lambda tokens: Embeddings(tokens, positions(), cfg.dropout, kernels, cfg.scale_embedding)  # noqa: E731
        self.encoder = Encoder(cfg, embeddings(src_tokens), kernels)
        self.decoder = Decoder(cfg, embeddings(tgt_tokens), kernels)
        # §3.4: no bias; ``output_bias`` adds one (Marian's final_logits_bias).
        self.output_projection = nn.Linear(cfg.d_model, tgt_vocab_size, bias=cfg.output_bias)
        if initialize:  # False: weights about to be loaded (a checkpoint) need no initial draws
            self.reset_parameters()
        if cfg.share_embeddings != "none":
            self.output_projection.weight = tgt_tokens.weight

    def reset_parameters(self) -> None:
        """Xavier-uniform weight matrices and zero biases (as tensor2tensor and fairseq);
        embeddings N(0, d_model^-0.5), so that after the √d_model scaling they have unit variance."""
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() > 1 and "tokens" not in name and "positions" not in name:
                nn.init.xavier_uniform_(p)
        src_tokens, tgt_tokens = self.encoder.embeddings.tokens, self.decoder.embeddings.tokens
        # A list, not a set: a set's order follows object ids, and so would the draws of a seeded init.
        for emb in [src_tokens] if tgt_tokens is src_tokens else [src_tokens, tgt_tokens]:
            nn.init.normal_(emb.weight, mean=0.0, std=self.cfg.d_model**-0.5)
            with torch.no_grad():
                emb.weight[self.pad_id].zero_()

    def source_mask(self, src: Tensor) -> Tensor:
        """src (B, S) -> (B, 1, 1, S), True at real tokens (broadcasts over heads and queries)."""
        return (src != self.pad_id)[:, None, None, :]

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) ids, padded with pad_id -> memory (B, S, d_model) and its mask (B, 1, 1, S)."""
        src_mask = self.source_mask(src)
        return self.encoder(src, src_mask), src_mask

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """tgt (B, T) ids (BOS-first) over memory (B, S, d_model) -> hidden states (B, T, d_model)."""
        return self.decoder(tgt, memory, src_mask)

    def logits(self, hidden: Tensor) -> Tensor:
        """The pre-softmax linear transformation (§3.4): (..., d_model) -> (..., V)."""
        return self.output_projection(hidden)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher-forced pass: src (B, S), tgt (B, T) -> logits (B, T, V)."""
        memory, src_mask = self.encode(src)
        return self.logits(self.decode(tgt, memory, src_mask))

    def init_cache(self, memory: Tensor, src_mask: Tensor, beam: int = 1) -> DecoderCache:
        """Start incremental decoding of B sentences with ``beam`` rows each.

        The encoder keys and values of every decoder layer are computed here, once per
        sentence, from memory (B, S, d_model).
        """
        B = memory.size(0)
        empty = memory.new_zeros(B * beam, self.cfg.h, 0, self.cfg.d_model // self.cfg.h)  # (N, h, 0, d_k)
        layers = [LayerCache(empty, empty, *layer.cross_attn.project_kv(memory))  # cross: (B, h, S, d_k)
                  for layer in self.decoder.layers]
        return DecoderCache(layers=layers, src_mask=src_mask, beam=beam, step=0)

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> tuple[Tensor, DecoderCache]:
        """One step: tokens (N,) last token of each row -> logits (N, V) for the next token, new cache.

        The paper's modules (:meth:`Decoder.step`, then :meth:`logits`); the reference twin of the fused step
        that inference runs (:func:`mtkit.kernels.decoder_step.fused_step`).
        """
        hidden, cache = self.decode_hidden(tokens, cache)
        return self.logits(hidden), cache

    def decode_hidden(self, tokens: Tensor, cache: DecoderCache) -> tuple[Tensor, DecoderCache]:
        """:meth:`decode_step` before the output projection: the decoder's output (N, d_model), new cache."""
        hidden, cache = self.decoder.step(tokens.unsqueeze(1), cache)  # (N, 1, d_model)
        return hidden.squeeze(1), cache

    @torch.no_grad()
    def cross_attention(self, src: Tensor, tgt: Tensor, layers: int | None = None) -> Tensor:
        """Cross-attention weights of every decoder layer and head, (L, B, h, T, S), for visualization and
        word alignments; ``layers``: of the first ones only (the decoder runs no further).

        A separate pass through the reference formula, so that the normal path stays fast.
        """
        memory, src_mask = self.encode(src)
        y = self.decoder.embeddings(tgt)
        maps = []
        for layer in self.decoder.layers[:layers]:
            y, weights = layer.forward_with_weights(y, memory, src_mask)
            maps.append(weights)
        return torch.stack(maps)


# ------------------------------------------------ incremental decoding state


@dataclass
class LayerCache:
    """One decoder layer's cached keys and values.

    self_k, self_v: (N, h, t, d_k), the decoder's own keys/values for the t steps so far
        (N = sentences × beam rows).
    cross_k, cross_v: (B, h, S, d_k), the encoder output projected once per sentence;
        the ``beam`` rows of a sentence share them.
    """

    self_k: Tensor
    self_v: Tensor
    cross_k: Tensor
    cross_v: Tensor


@dataclass
class DecoderCache:
    """Explicit state of incremental decoding, passed into and returned by ``decode_step``.

    ``beam`` rows per sentence; rows ``i*beam .. i*beam+beam-1`` belong to sentence ``i``.
    ``src_mask`` (B, 1, 1, S) is True at real source tokens. ``step`` is the number of
    target tokens already consumed (the position of the next one).
    """

    layers: list[LayerCache]
    src_mask: Tensor
    beam: int
    step: int = 0

    def reorder(self, indices: Tensor) -> DecoderCache:
        """Reorder the rows (beam search's back-pointers), ``indices`` (N,) of row numbers.

        Each index must stay within its sentence's group of ``beam`` rows (beam search
        only ever picks among a sentence's own hypotheses), so the shared encoder keys
        and values need no copy.
        """
        # Built directly rather than through dataclasses.replace: this runs at every beam step.
        layers = [LayerCache(lc.self_k.index_select(0, indices), lc.self_v.index_select(0, indices), lc.cross_k,
                             lc.cross_v) for lc in self.layers]
        return DecoderCache(layers, self.src_mask, self.beam, self.step)

    def select_sentences(self, sentences: Tensor) -> DecoderCache:
        """Keep only the given sentences (B',) and their beam rows, e.g. to drop finished ones."""
        rows = (sentences.unsqueeze(1) * self.beam + torch.arange(self.beam, device=sentences.device)).flatten()
        layers = [
            replace(
                lc,
                self_k=lc.self_k.index_select(0, rows),
                self_v=lc.self_v.index_select(0, rows),
                cross_k=lc.cross_k.index_select(0, sentences),
                cross_v=lc.cross_v.index_select(0, sentences),
            )
            for lc in self.layers
        ]
        return replace(self, layers=layers, src_mask=self.src_mask.index_select(0, sentences))


def count_parameters(model: nn.Module) -> int:
    """Distinct trainable parameters (a tied matrix counts once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
