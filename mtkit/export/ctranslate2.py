"""Export to CTranslate2: an mtkit model as a CTranslate2 model folder (``model.bin``, vocabularies, ``mtkit.json``).

The exported folder is translated by :mod:`mtkit.engines.ctranslate2_engine`.

The export describes mtkit's Transformer with CTranslate2's model specs
(``TransformerSpec.from_config``), sets every weight from the one weight map the fused passes read
(:func:`mtkit.kernels.packed.pack`), and writes what differs
from CTranslate2's defaults explicitly:

* the positional-encoding table (CTranslate2's built-in sinusoids put all sines
  before all cosines; the paper interleaves them) -- or the learned table;
* the LayerNorm epsilon (mtkit: ``model.layer_norm_eps``, 1e-5 by default);
* post-norm (``pre_norm=False``, the paper) or pre-norm with its final LayerNorm;
* embeddings scaled by √d_model, ReLU, a bias-free output projection (tied to the
  target embeddings unless ``share_embeddings='none'``) -- or the model's options
  ``scale_embedding: false``, ``activation: swish | gelu`` and ``output_bias`` (an imported
  Marian model's); the table written above covers ``sinusoid_layout``;
* the source gets EOS appended (``add_source_eos``) and the decoder starts from BOS -- or, for a
  multilingual model with its tags on the target side (``data.tag_side: target``), from no fixed
  token (``decoder_start_token`` None): the engine gives the tag as the target prefix, which
  CTranslate2 then takes as the start token and leaves out of its hypotheses and scores.

The directory holds ``model.bin``, ``config.json``, the vocabularies, mtkit's
SentencePiece model(s) (``spm.model`` or ``spm.src.model`` + ``spm.tgt.model``)
and ``mtkit.json`` (what was exported, and the recipe's decode settings, which
``mtkit translate --engine ctranslate2`` decodes with unless told otherwise; for a multilingual
model its ``pairs``, whose target-language tags ``<2xx>`` are source tokens like any other, and
its ``tag_side``).

Translating with the result: :mod:`mtkit.engines.ctranslate2_engine`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from mtkit.config import BOS_ID, EOS_ID, UNK_ID, config_to_dict
from mtkit.data.word_alignment import default_layer, guided_head
from mtkit.engines import manifest
from mtkit.engines.ctranslate2_engine import QUANTIZATIONS, import_ctranslate2
from mtkit.errors import MtkitError, shown
from mtkit.export.protocol import Exporter, export
from mtkit.kernels.packed import pack
from mtkit.shortlist import VMAP_FILE, read_shortlist, shortlist_path

# model.activation -> common_spec.Activation (GELU: erf)
ACTIVATIONS = {"relu": "RELU", "swish": "SWISH", "gelu": "GELU"}


# ------------------------------------------------------------------------ export


def alignment_of(config) -> tuple[int, int | None]:
    """The (layer, head) whose cross-attention an export gives as CTranslate2's ``return_attention`` (head
    None: the mean of the layer's heads): the guided-alignment head of a model trained with one, else the
    penultimate layer's mean (:mod:`mtkit.data.word_alignment`)."""
    return guided_head(config) or (default_layer(config.model.decoder_layers), None)


def _head_first(attention, head: int, h: int) -> None:
    """Swap head ``head`` of a CTranslate2 cross-attention spec with head 0 (CTranslate2 aligns with its first
    ``alignment_heads`` heads); the heads' order changes nothing else."""
    def swap(a, axis: int, blocks: int) -> None:
        d_k = a.shape[axis] // (blocks * h)
        order = np.arange(a.shape[axis]).reshape(blocks, h, d_k)
        order[:, [0, head]] = order[:, [head, 0]]
        a[...] = np.take(a, order.reshape(-1), axis=axis)

    query, key_value, out = attention.linear
    swap(query.weight, 0, 1)
    swap(key_value.weight, 0, 2)
    for linear, blocks in ((query, 1), (key_value, 2)):
        if isinstance(getattr(linear, "bias", None), np.ndarray):
            swap(linear.bias, 0, blocks)
    swap(out.weight, 1, 1)


def build_spec(model, vocab, start_from_prefix: bool = False, alignment: tuple[int, int | None] | None = None):
    """The CTranslate2 ``TransformerSpec`` of an mtkit Transformer (weights set, not yet validated);
    ``alignment``: the (layer, head) its ``return_attention`` gives (:func:`alignment_of`; None: the penultimate
    layer's mean)."""
    import_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    pre_norm = cfg.norm == "pre"
    layer, head = alignment or (default_layer(cfg.decoder_layers), None)
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers),
        cfg.h,
        pre_norm=pre_norm,
        activation=common_spec.Activation[ACTIVATIONS[cfg.activation]],
        alignment_layer=layer,
        alignment_heads=cfg.h if head is None else 1,
    )

    w = pack(model, reorder=False)  # the one weight map (mtkit.kernels.packed), as the fused passes read it

    def arr(t):
        # A copy: CTranslate2 optimizes the spec's arrays in place (quantization, the embeddings' scale), and a
        # view would change the model's own weights (a second export from the same model read changed ones).
        return t.detach().float().cpu().numpy().copy()

    def set_linear(ls, *linears):
        """One CTranslate2 linear from one or more (stacked along the output) packed linears."""
        ls.weight = np.concatenate([arr(m.weight) for m in linears], axis=0)
        if linears[0].bias is not None:
            ls.bias = np.concatenate([arr(m.bias) for m in linears], axis=0)

    def set_norm(ns, norm):
        ns.gamma, ns.beta = arr(norm[0]), arr(norm[1])

    def set_ffn(fs, lw, norm):
        set_norm(fs.layer_norm, norm)
        set_linear(fs.linear_0, lw.ffn_in)
        set_linear(fs.linear_1, lw.ffn_out)

    enc, dec = spec.encoder, spec.decoder
    enc.embeddings[0].weight = arr(w.source.tokens)
    enc.scale_embeddings = cfg.scale_embedding
    enc.position_encodings.encodings = arr(w.source.positions)  # (P, d_model)
    for ls, lw in zip(enc.layer, w.encoder):
        set_linear(ls.self_attention.linear[0], lw.self_qkv)
        set_linear(ls.self_attention.linear[1], lw.self_out)
        set_norm(ls.self_attention.layer_norm, lw.self_attn_norm)
        set_ffn(ls.ffn, lw, lw.feed_forward_norm)
    if w.encoder_norm is not None:
        set_norm(enc.layer_norm, w.encoder_norm)

    dec.embeddings.weight = arr(w.target.tokens)
    dec.scale_embeddings = cfg.scale_embedding
    dec.position_encodings.encodings = arr(w.target.positions)
    for ls, lw in zip(dec.layer, w.decoder):
        set_linear(ls.self_attention.linear[0], lw.self_qkv)
        set_linear(ls.self_attention.linear[1], lw.self_out)
        set_norm(ls.self_attention.layer_norm, lw.self_attn_norm)
        set_linear(ls.attention.linear[0], lw.cross_query)
        set_linear(ls.attention.linear[1], lw.cross_key, lw.cross_value)
        set_linear(ls.attention.linear[2], lw.cross_out)
        set_norm(ls.attention.layer_norm, lw.cross_attn_norm)
        set_ffn(ls.ffn, lw, lw.feed_forward_norm)
    if head:
        _head_first(dec.layer[layer].attention, head, cfg.h)
    if w.decoder_norm is not None:
        set_norm(dec.layer_norm, w.decoder_norm)
    dec.projection.weight = arr(w.output.weight)  # §3.4's tied projection: no bias
    if w.output.bias is not None:  # model.output_bias
        dec.projection.bias = arr(w.output.bias)

    src_pieces = vocab.src_pieces(range(vocab.src_size))
    tgt_pieces = vocab.tgt_pieces(range(vocab.tgt_size))
    spec.register_source_vocabulary(src_pieces)
    spec.register_target_vocabulary(tgt_pieces)
    spec.config.layer_norm_epsilon = float(cfg.layer_norm_eps)
    spec.config.unk_token = tgt_pieces[UNK_ID]
    spec.config.bos_token = tgt_pieces[BOS_ID]
    spec.config.eos_token = tgt_pieces[EOS_ID]
    spec.config.decoder_start_token = None if start_from_prefix else tgt_pieces[BOS_ID]
    spec.config.add_source_bos = False
    spec.config.add_source_eos = True
    return spec


class Ctranslate2Export(Exporter):
    """The export of ``loaded`` (a LoadedModel: model, vocab, config, path) as a CTranslate2 model folder, in
    ``quantization`` (None: float32), by the exporters' steps (:func:`mtkit.export.protocol.export`): the spec
    built, validated by CTranslate2 and quantized in memory, then saved with the SentencePiece model(s) and
    ``mtkit.json``."""

    target = "CTranslate2"

    def __init__(self, loaded, quantization: str | None = None) -> None:
        self.loaded, self.quantization = loaded, quantization
        self.spec = None

    def refuse(self) -> None:
        import_ctranslate2()
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise MtkitError(f"unknown quantization {shown(self.quantization)}; expected one of "
                             f"{', '.join(QUANTIZATIONS)}")

    def prepare(self) -> None:
        data = self.loaded.config.data
        spec = build_spec(self.loaded.model, self.loaded.vocab,
                          start_from_prefix=bool(data.pairs) and data.tag_side == "target",
                          alignment=alignment_of(self.loaded.config))
        try:
            spec.validate()
        except ValueError as e:
            raise MtkitError(f"CTranslate2 refused the model: {e}") from None
        spec.optimize(quantization=self.quantization)
        self.spec = spec

    def write(self, folder: Path) -> None:
        loaded = self.loaded  # the small files first: a full disk is met (and named) at spm.model, as before
        manifest.write(folder, manifest.record(
            loaded, spm=loaded.vocab.save(folder), quantization=self.quantization,
            model=config_to_dict(loaded.config.model), decode=config_to_dict(loaded.config.decode),
            alignment=dict(zip(("layer", "head"), alignment_of(loaded.config), strict=True)),
            **manifest.languages(loaded.config.data)))
        self.spec.save(str(folder))  # model.bin, config.json and the vocabularies: none of the names above
        shortlist = shortlist_path(loaded.path)
        if shortlist.is_file():  # the run's shortlist is CTranslate2's vocabulary map: shipped unchanged, once checked
            read_shortlist(shortlist, loaded.vocab)
            shutil.copyfile(shortlist, folder / VMAP_FILE)


def export_model(loaded, out_dir: str | Path, quantization: str | None = None) -> Path:
    """Write ``loaded`` (a LoadedModel: model, vocab, config, path) as a CTranslate2 model in ``out_dir``
    (:class:`Ctranslate2Export`).

    The directory is built beside ``out_dir`` and renamed into place, so a failed export
    leaves nothing behind; an existing non-empty ``out_dir`` is an error.
    """
    return export(Ctranslate2Export(loaded, quantization), out_dir)
