"""The names and shapes of the tensors of :class:`mtkit.model.Transformer`, without torch and without
building a model: the weights described as a schema (as CTranslate2's model specs describe theirs).

Parameter names are a file format (mtkit.model). A checkpoint is checked against this table before a
model of its config's size is allocated (mtkit.checkpoints.io), so that every tensor the config
implies must be in the file, with its shape; tests/unit/test_model_spec.py holds the table equal to
``Transformer(...).state_dict()`` for every option that changes a name or a shape.
"""

from __future__ import annotations

from mtkit.config import ModelConfig


def _linear(name: str, d_in: int, d_out: int, bias: bool = True) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (d_out, d_in), **({f"{name}.bias": (d_out,)} if bias else {})}


def _norm(name: str, d: int) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (d,), f"{name}.bias": (d,)}


def parameter_shapes(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of the state_dict of ``Transformer(cfg, src_vocab_size, tgt_vocab_size)``.

    Tied matrices (``share_embeddings``) appear under each of their names, as in a state_dict. The table
    has about 16 entries per layer: check the layer counts against a file before asking for it.
    """
    d, d_ff = cfg.d_model, cfg.d_ff
    shapes: dict[str, tuple[int, ...]] = {}
    for side, vocab_size, attentions, n_layers in (
        ("encoder", src_vocab_size, ("self_attn",), cfg.encoder_layers),
        ("decoder", tgt_vocab_size, ("self_attn", "cross_attn"), cfg.decoder_layers),
    ):
        shapes[f"{side}.embeddings.tokens.weight"] = (vocab_size, d)
        if cfg.positions == "learned":  # sinusoids are a buffer outside the state_dict
            shapes[f"{side}.embeddings.positions.weight"] = (cfg.max_positions, d)
        for i in range(n_layers):
            layer = f"{side}.layers.{i}"
            for attention in attentions:
                for projection in ("w_q", "w_k", "w_v", "w_o"):
                    shapes.update(_linear(f"{layer}.{attention}.{projection}", d, d))
            shapes.update(_linear(f"{layer}.feed_forward.w_1", d, d_ff))
            shapes.update(_linear(f"{layer}.feed_forward.w_2", d_ff, d))
            for sublayer in (*attentions, "feed_forward"):
                shapes.update(_norm(f"{layer}.{sublayer}_norm", d))
        if cfg.norm == "pre":
            shapes.update(_norm(f"{side}.norm", d))
    shapes.update(_linear("output_projection", d, tgt_vocab_size, bias=cfg.output_bias))
    return shapes
