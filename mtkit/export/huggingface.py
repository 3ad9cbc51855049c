"""Export to Hugging Face: an mtkit model as a folder that ``transformers`` loads with ``AutoModelForSeq2SeqLM``
and ``AutoTokenizer`` (``config.json``, ``model.safetensors``, ``generation_config.json``, the tokenizer's files,
a model card ``README.md``, and ``mtkit.json``: the recipe's decode settings whole, which
``mtkit import marian`` reads back).

The architecture is one that computes what mtkit's model computes, to float rounding:

* post-norm (the paper's §3.1) -> **MarianMT**: post-norm layers, the paper's sinusoids, embeddings scaled by
  √d_model or not (``scale_embedding``), ReLU / swish / GELU, ``final_logits_bias`` (mtkit's ``output_bias``, or
  zeros), source and target embeddings shared or not, tied to the output projection or not;
* pre-norm (``model.norm: pre``) -> **Pegasus**: pre-norm layers with a final LayerNorm after each stack and the
  same sinusoids. Pegasus has one token embedding for both sides, tied to the output projection: a pre-norm
  model needs ``share_embeddings: all``.

Both put all sines before all cosines in the position table; the paper (and mtkit by default) interleaves
them. The export re-parametrises the model exactly instead: the residual stream's dimensions are permuted
(sines' dimensions first), which every weight reading or writing that stream follows (embedding columns,
the projections' input columns and output rows, the LayerNorms' gains and biases); attention, the FFN's
inner dimensions and the LayerNorms' statistics do not depend on the stream's order.

Ids are mtkit's (pad 0, unk 1, bos 2, eos 3): the decoder starts from BOS (``decoder_start_token_id``),
``suppress_tokens`` bans PAD and BOS after the log-softmax as mtkit's search does, and the tokenizer is
``MarianTokenizer`` over the model's own SentencePiece models (the piece table ``vocab.json``; EOS appended
to the source as mtkit does). A multilingual model with its tags on the source side keeps them as source
tokens named ``>>de<<`` (OPUS-MT's form, which MarianTokenizer reads from the start of the text).

Options that neither architecture expresses are refused, each named, before anything is written
(:func:`refusals`). The weights come from the one weight map (:func:`mtkit.kernels.packed.pack`), and the
export checks itself: the Hugging Face model's logits on a probe batch must be mtkit's to 1e-4.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mtkit.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, config_to_dict
from mtkit.data.languages import tag_piece
from mtkit.engines import manifest
from mtkit.errors import MtkitError
from mtkit.export.protocol import Exporter, export, file_modes
from mtkit.importers.marian import LOGIT_FLOOR
from mtkit.kernels.linear import PackedLinear
from mtkit.kernels.packed import pack
from mtkit.version import __version__

TOLERANCE = 1e-4  # the largest logit difference the export accepts between the two models
SPECIAL_NAMES = {PAD_ID: "<pad>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}
ACTIVATIONS = {"relu": "relu", "swish": "swish", "gelu": "gelu"}  # mtkit -> transformers' ACT2FN (gelu: erf)


def architecture(cfg) -> str:
    """``marian`` for a post-norm model, ``pegasus`` for a pre-norm one."""
    return "pegasus" if cfg.model.norm == "pre" else "marian"


def refusals(cfg) -> list[str]:
    """What in ``cfg`` (an mtkit Config) the Hugging Face architecture cannot express, one line each."""
    m, d = cfg.model, cfg.decode
    arch = architecture(cfg)
    out = []
    if m.positions != "sinusoidal":
        out.append(f"model.positions is {m.positions!r}: MarianMT and Pegasus compute sinusoidal positions")
    if not math.isclose(m.layer_norm_eps, 1e-5, rel_tol=0, abs_tol=1e-12):
        out.append(f"model.layer_norm_eps is {m.layer_norm_eps}: MarianMT's and Pegasus' LayerNorms use 1e-5")
    if m.d_model % 2:
        out.append(f"model.d_model is {m.d_model}: the sinusoid table needs an even d_model")
    if arch == "pegasus" and m.share_embeddings != "all":
        out.append(f"model.share_embeddings is {m.share_embeddings!r}: Pegasus (the pre-norm architecture) has one "
                   "token embedding for both sides, tied to the output projection ('all')")
    if m.sinusoid_layout == "fairseq":
        out.append("model.sinusoid_layout is 'fairseq' (an NLLB import): MarianMT's and Pegasus' sinusoids differ; "
                   "the original folder is the Hugging Face model")
    if cfg.data.pairs and cfg.data.tag_side == "codes":
        out.append("data.tag_side is 'codes' (an NLLB import): MarianMT and Pegasus have no forced language code")
    if cfg.data.pairs and cfg.data.tag_side == "target":
        out.append("data.tag_side is 'target': the exported tokenizer reads target-language tags from the "
                   "source side only")
    if d.beam > 1 and d.length_penalty != "power":
        out.append(f"decode.length_penalty is {d.length_penalty!r} with beam {d.beam}: Hugging Face's beam search "
                   "divides by length^α only (export with --length-penalty power, or --beam 1)")
    return out


# -------------------------------------------------------------------------- ids


@dataclass(frozen=True)
class Ids:
    """The exported model's ids: mtkit's own, or (an imported Marian model) Marian's again."""

    src_rows: Any  # exported id -> mtkit id, a LongTensor; None: the same ids
    tgt_rows: Any
    pad: int
    eos: int
    start: int  # the decoder's first token
    banned: tuple[int, ...]  # never generated (mtkit bans PAD and BOS)
    renormalize: bool  # Hugging Face renormalizes after the ban (an OPUS-MT generation config's setting)

    def mtkit_ids(self, ids, side: str):
        """Exported ids (B, L) as mtkit's, the pad positions as PAD."""
        rows = self.src_rows if side == "src" else self.tgt_rows
        return ids if rows is None else rows[ids].masked_fill(ids == self.pad, PAD_ID)


def exported_ids(loaded) -> Ids:
    """mtkit's ids (PAD and BOS suppressed), unless the model is an imported Marian one: its extra PAD slot
    (logit held at the importer's floor) is dropped and Marian's layout comes back, eos 0, unk 1, the pieces in
    their order, the decoder's start (mtkit's BOS slot) as the pad id after them, as OPUS-MT folders have it
    (:mod:`mtkit.importers.marian` describes the import this inverts)."""
    bias = loaded.model.output_projection.bias
    bias = None if bias is None else bias.detach()
    if loaded.vocab.pieces() is None or bias is None or float(bias[PAD_ID]) > LOGIT_FLOOR / 2:
        return Ids(None, None, PAD_ID, EOS_ID, BOS_ID, (PAD_ID, BOS_ID), False)
    sizes = loaded.vocab.src_size - 1, loaded.vocab.tgt_size - 1
    pad = min(sizes) - 1  # Hugging Face's Marian has one pad id: a larger vocabulary has pieces after it

    def rows(size: int):
        rest = iter(range(BOS_ID + 2, size + 1))  # mtkit's ids after EOS, in order
        return torch.tensor([EOS_ID if j == 0 else UNK_ID if j == 1 else BOS_ID if j == pad else next(rest)
                             for j in range(size)])

    return Ids(rows(sizes[0]), rows(sizes[1]), pad, 0, pad, (pad,), float(bias[BOS_ID]) <= LOGIT_FLOOR / 2)


# ---------------------------------------------------------------------- weights


def residual_order(cfg):
    """The permutation of the residual stream's dimensions that turns mtkit's position table into the
    sines-then-cosines one of MarianMT and Pegasus: identity for ``sinusoid_layout: concatenated``."""
    d = cfg.d_model
    if cfg.sinusoid_layout == "concatenated":
        return torch.arange(d)
    return torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])


def hf_state(model, ids: Ids) -> dict:
    """mtkit's weights under Hugging Face's names (``model.`` prefixed, as the ConditionalGeneration classes
    name them), the residual stream permuted (:func:`residual_order`); read through the one weight map."""
    w = pack(model, reorder=False)
    p = residual_order(model.cfg)

    def reads(lin) -> dict:  # a projection reading the stream: its input columns follow the order
        return {"weight": lin.weight[:, p], "bias": lin.bias}

    def writes(lin) -> dict:  # a projection writing into the stream: its output rows follow it
        return {"weight": lin.weight[p], "bias": lin.bias[p]}

    state: dict = {}

    def put(prefix: str, tensors: dict) -> None:
        for name, t in tensors.items():
            state[f"{prefix}.{name}"] = t.detach().clone().contiguous()

    def norm(prefix: str, n) -> None:
        put(prefix, {"weight": n[0][p], "bias": n[1][p]})

    def attention(prefix: str, q, k, v, o) -> None:
        for name, lin in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
            put(f"{prefix}.{name}", reads(lin))
        put(f"{prefix}.out_proj", writes(o))

    def split(stacked):
        ws, bs = stacked.weight.chunk(3), stacked.bias.chunk(3)
        return [PackedLinear(wi, bi, False) for wi, bi in zip(ws, bs)]

    for i, layer in enumerate(w.encoder):
        pre = f"model.encoder.layers.{i}"
        attention(f"{pre}.self_attn", *split(layer.self_qkv), layer.self_out)
        norm(f"{pre}.self_attn_layer_norm", layer.self_attn_norm)
        put(f"{pre}.fc1", reads(layer.ffn_in))
        put(f"{pre}.fc2", writes(layer.ffn_out))
        norm(f"{pre}.final_layer_norm", layer.feed_forward_norm)
    for i, layer in enumerate(w.decoder):
        pre = f"model.decoder.layers.{i}"
        attention(f"{pre}.self_attn", *split(layer.self_qkv), layer.self_out)
        norm(f"{pre}.self_attn_layer_norm", layer.self_attn_norm)
        attention(f"{pre}.encoder_attn", layer.cross_query, layer.cross_key, layer.cross_value, layer.cross_out)
        norm(f"{pre}.encoder_attn_layer_norm", layer.cross_attn_norm)
        put(f"{pre}.fc1", reads(layer.ffn_in))
        put(f"{pre}.fc2", writes(layer.ffn_out))
        norm(f"{pre}.final_layer_norm", layer.feed_forward_norm)
    if w.encoder_norm is not None:
        norm("model.encoder.layer_norm", w.encoder_norm)
        norm("model.decoder.layer_norm", w.decoder_norm)
    src_rows = slice(None) if ids.src_rows is None else ids.src_rows  # the exported ids' rows
    tgt_rows = slice(None) if ids.tgt_rows is None else ids.tgt_rows
    state["model.encoder.embed_tokens.weight"] = w.source.tokens[src_rows][:, p].detach().clone()
    state["model.decoder.embed_tokens.weight"] = w.target.tokens[tgt_rows][:, p].detach().clone()
    if model.cfg.share_embeddings == "all":
        state["model.shared.weight"] = state["model.encoder.embed_tokens.weight"]
    state["lm_head.weight"] = w.output.weight[tgt_rows][:, p].detach().clone()
    bias = w.output.bias if w.output.bias is not None else torch.zeros(w.output.weight.size(0))
    state["final_logits_bias"] = bias[tgt_rows].detach().clone().reshape(1, -1)
    return state


# ----------------------------------------------------------------- the folder


def hf_config(cfg, ids: Ids, src_size: int, tgt_size: int):
    """The transformers config (MarianConfig or PegasusConfig) of mtkit's ``cfg``, with the exported ids
    (``src_size``, ``tgt_size``: the exported vocabularies')."""
    m = cfg.model
    common = dict(
        d_model=m.d_model, encoder_layers=m.encoder_layers, decoder_layers=m.decoder_layers,
        encoder_attention_heads=m.h, decoder_attention_heads=m.h, encoder_ffn_dim=m.d_ff, decoder_ffn_dim=m.d_ff,
        max_position_embeddings=m.max_positions, activation_function=ACTIVATIONS[m.activation],
        scale_embedding=m.scale_embedding, dropout=m.dropout, attention_dropout=m.attention_dropout,
        activation_dropout=m.activation_dropout, pad_token_id=ids.pad, eos_token_id=ids.eos,
        bos_token_id=ids.start if ids.start != ids.pad else None, decoder_start_token_id=ids.start,
        forced_eos_token_id=ids.eos, is_encoder_decoder=True,
        tie_word_embeddings=m.share_embeddings != "none",
    )
    if architecture(cfg) == "pegasus":
        from transformers import PegasusConfig

        return PegasusConfig(vocab_size=tgt_size, **common)
    from transformers import MarianConfig

    return MarianConfig(vocab_size=src_size, decoder_vocab_size=tgt_size,
                        share_encoder_decoder_embeddings=m.share_embeddings == "all", **common)


def generation_settings(cfg, ids: Ids) -> dict:
    """``generation_config.json``'s settings from the recipe's decode section: beam, length penalty (α of
    score / length^α), the maximum length, n-gram blocking, sampling; PAD and BOS suppressed as mtkit bans them.

    mtkit bounds each output at ``max_len_a`` · source length + ``max_len_b`` tokens; ``generate()`` takes one
    bound per call: with ``max_len_a`` 0 it is written exactly (``max_new_tokens``: the tokens and the EOS),
    otherwise the model's positions bound it and the model card says how to pass the bound.
    """
    d = cfg.decode
    out = {"decoder_start_token_id": ids.start, "eos_token_id": ids.eos, "pad_token_id": ids.pad,
           "forced_eos_token_id": ids.eos, "num_beams": d.beam}
    if d.beam > 1:  # mtkit's beam search ends a sentence once it holds `beam` finished hypotheses
        out.update(length_penalty=float(d.alpha), early_stopping=True)
    if ids.src_rows is None:
        out.update(bos_token_id=ids.start, suppress_tokens=list(ids.banned))
    else:  # as OPUS-MT's generation configs ban the pad
        out.update(bad_words_ids=[[i] for i in ids.banned], renormalize_logits=ids.renormalize)
    # max_new_tokens: the tokens and the EOS; the decoder's start takes position 0 of max_positions.
    out["max_new_tokens"] = d.max_len_b + 1 if d.max_len_a == 0 else cfg.model.max_positions - 1
    if d.min_len:
        out["min_new_tokens"] = d.min_len
    if d.no_repeat_ngram_size:
        out["no_repeat_ngram_size"] = d.no_repeat_ngram_size
    if d.sampling:
        out.update(do_sample=True, num_beams=1, temperature=float(d.temperature), top_k=d.top_k,
                   top_p=float(d.top_p))
        if d.epsilon:
            out["epsilon_cutoff"] = float(d.epsilon)
    return out


def piece_table(vocab, side: str, ids: Ids, tags: dict[str, str]) -> dict[str, int]:
    """``vocab.json``: piece -> exported id for every id of ``side`` (``src`` or ``tgt``), the special ids under
    MarianTokenizer's names (or an imported table's own) and the language tags in OPUS-MT's form (``tags``:
    ``<2de>`` -> ``>>de<<``)."""
    size = vocab.src_size if side == "src" else vocab.tgt_size
    names = vocab.src_pieces(range(size)) if side == "src" else vocab.tgt_pieces(range(size))
    rows = ids.src_rows if side == "src" else ids.tgt_rows
    table: dict[str, int] = {}
    if rows is not None:  # Marian's layout again: its pad (mtkit's BOS slot) keeps the table's pad name
        for j, i in enumerate(rows.tolist()):
            table[names[PAD_ID] if j == ids.pad else names[i]] = j
        return table
    for i, name in enumerate(names):
        name = SPECIAL_NAMES.get(i, tags.get(name, name))
        if name in table:  # a piece whose name another id has: unique
            name = f"<mtkit:{i}>"
        table[name] = i
    return table


def write_tokenizer(loaded, ids: Ids, folder: Path) -> None:
    """MarianTokenizer's files: ``source.spm``, ``target.spm`` (the models text is encoded with: tags unused,
    so typed text never yields one), ``vocab.json`` (and ``target_vocab.json`` for separate vocabularies),
    ``tokenizer_config.json``."""
    from transformers import MarianTokenizer

    vocab, data = loaded.vocab, loaded.config.data
    tags = {tag_piece(p.tgt_lang): f">>{p.tgt_lang}<<" for p in data.pairs}
    src_text, tgt_text = vocab.text_models()
    (folder / "source.spm").write_bytes(src_text)
    (folder / "target.spm").write_bytes(tgt_text if tgt_text is not None else src_text)
    separate = not vocab.joint or vocab.pieces() is not None and vocab.pieces().get("tgt") is not None
    (folder / "vocab.json").write_text(json.dumps(piece_table(vocab, "src", ids, tags), ensure_ascii=False),
                                       encoding="utf-8")
    if separate:
        (folder / "target_vocab.json").write_text(json.dumps(piece_table(vocab, "tgt", ids, tags),
                                                             ensure_ascii=False), encoding="utf-8")
    src_lang, tgt_lang = data.src_lang, data.tgt_lang
    tokenizer = MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"),
                                target_vocab_file=str(folder / "target_vocab.json") if separate else None,
                                separate_vocabs=separate, source_lang=src_lang, target_lang=tgt_lang,
                                model_max_length=loaded.config.model.max_positions)
    tokenizer.save_pretrained(str(folder))


def probe_logits_difference(model, hf_model, ids: Ids) -> float:
    """The largest |logit| difference between mtkit's model and the Hugging Face one, teacher-forced on a
    fixed probe batch of two sentences of random ids (one padded)."""
    config = hf_model.config
    sizes = config.vocab_size, getattr(config, "decoder_vocab_size", None) or config.vocab_size
    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, sizes[0], (2, 9), generator=g)
    tgt = torch.randint(0, sizes[1], (2, 7), generator=g)
    for t in (src, tgt):  # no special id in the text
        t[(t == ids.pad) | (t == ids.eos) | (t == ids.start) | (t == UNK_ID)] = 4 if ids.src_rows is None else 2
    src[:, -1] = ids.eos
    src[1, 5:] = ids.pad
    src[1, 4] = ids.eos
    tgt[:, 0] = ids.start
    with torch.no_grad():
        ours = model(ids.mtkit_ids(src, "src"), ids.mtkit_ids(tgt, "tgt")).float()
        if ids.tgt_rows is not None:
            ours = ours[..., ids.tgt_rows]
        theirs = hf_model(input_ids=src, attention_mask=(src != ids.pad).long(), decoder_input_ids=tgt).logits
    return float((ours - theirs.float()).abs().max())


def model_card(loaded, arch: str) -> str:
    """README.md: what the model is, how to run it, the recipe, and the run's scores where the run kept them."""

    cfg = loaded.config
    m, d = cfg.model, cfg.decode
    run_dir = loaded.path.parent.parent if loaded.path.parent.name == "checkpoints" else loaded.path.parent
    lines = [
        "---", "library_name: transformers", "pipeline_tag: translation",
        f"language: [{cfg.data.src_lang}, {cfg.data.tgt_lang}]", "tags: [mtkit, translation]", "---", "",
        f"# {cfg.data.src_lang} → {cfg.data.tgt_lang}: an mtkit Transformer", "",
        f"Exported by `mtkit export hf` (mtkit {__version__}) from `{loaded.path.name}`"
        + (f" (step {loaded.step})" if loaded.step else "") + f", as {'Pegasus' if arch == 'pegasus' else 'MarianMT'}"
        f" ({m.norm}-norm, d_model {m.d_model}, {m.encoder_layers}+{m.decoder_layers} layers, {m.h} heads, "
        f"FFN {m.d_ff}); its logits equal mtkit's to {TOLERANCE:g}.", "",
        "```python",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        "tok = AutoTokenizer.from_pretrained(PATH)",
        "model = AutoModelForSeq2SeqLM.from_pretrained(PATH)",
        'batch = tok(["A man is riding a bike."], return_tensors="pt", padding=True)',
    ]
    if d.max_len_a:
        lines += [f"# mtkit bounds each output at {d.max_len_a:g} × source length + {d.max_len_b} tokens:",
                  f"limit = int({d.max_len_a:g} * batch['attention_mask'].sum(1).max()) + {d.max_len_b + 1}",
                  "out = model.generate(**batch, max_new_tokens=limit)"]
    else:
        lines.append("out = model.generate(**batch)")
    lines += ["print(tok.batch_decode(out, skip_special_tokens=True))", "```", ""]
    if cfg.data.pairs:
        lines += ["Multilingual: start each source line with the target language's tag, "
                  + ", ".join(f"`>>{p.tgt_lang}<<`" for p in cfg.data.pairs) + ".", ""]
    lines += [f"Decoding (`generation_config.json`, the recipe's): beam {d.beam}"
              + (f", length penalty score / length^{d.alpha:g}" if d.beam > 1 else "")
              + ("" if not d.sampling else ", sampling") + "."
              + (" At the length bound mtkit scores the forced EOS with its log-probability, `generate()` with 0:"
                 " a beam whose hypotheses reach the bound may end otherwise." if d.forced_eos == "logprob" else ""),
              ""]
    scores = run_dir.parent / "scores.json"
    if scores.is_file():
        try:
            doc = json.loads(scores.read_text(encoding="utf-8"))
            rows = [f"| {s.get('metric')} | {s.get('score')} | `{s.get('signature', '')}` |"
                    for s in doc.get("scores", []) if isinstance(s, dict)]
            if rows:
                lines += ["## Scores (`mtkit run`'s test set)", "", "| metric | score | signature |", "|---|---|---|",
                          *rows, ""]
        except (OSError, ValueError, AttributeError):
            pass
    recipe = {"data": {k: v for k, v in config_to_dict(cfg.data).items() if k in ("src_lang", "tgt_lang", "train",
                                                                                   "valid", "test", "spm", "pairs")},
              "model": config_to_dict(m), "decode": config_to_dict(d)}
    lines += ["## Recipe", "", "```json", json.dumps(recipe, indent=2, ensure_ascii=False, default=str), "```", ""]
    return "\n".join(lines)


def record(loaded, arch: str) -> dict:
    """``mtkit.json``: what was exported, and the recipe's decode settings whole (``generate()`` has no
    a·source + b bound): ``mtkit import marian`` reads them back, so that import(export(run)) decodes as the run."""
    return manifest.record(loaded, architecture=arch, decode=config_to_dict(loaded.config.decode))


class HuggingfaceExport(Exporter):
    """The export of ``loaded`` (a LoadedModel) as a Hugging Face model folder, by the exporters' steps
    (:func:`mtkit.export.protocol.export`): refused, in one line each, for options no architecture expresses
    and a missing ``transformers``; the Hugging Face model built and its weights set in memory, saved with its
    tokenizer, model card and ``mtkit.json``, then its logits checked against mtkit's."""

    target = "Hugging Face"

    def __init__(self, loaded) -> None:
        self.loaded = loaded
        self.model = self.hf_model = self.ids = None  # mtkit's model, the Hugging Face one, its ids: prepare's
        self.transformers = None  # the module, once required

    def refusals(self) -> list[str]:
        return refusals(self.loaded.config)

    def require(self) -> None:
        try:
            import transformers
        except ImportError:
            raise MtkitError("exporting to Hugging Face needs transformers (pip install 'mtkit[hf]')") from None
        self.transformers = transformers

    def prepare(self) -> None:
        from transformers import AutoModelForSeq2SeqLM, GenerationConfig
        from transformers.utils import logging as hf_logging

        version = self.transformers.__version__
        loaded = self.loaded
        self.model = model = loaded.model.float().eval()
        self.ids = ids = exported_ids(loaded)
        sizes = [len(r) if r is not None else n for r, n in ((ids.src_rows, loaded.vocab.src_size),
                                                             (ids.tgt_rows, loaded.vocab.tgt_size))]
        config = hf_config(loaded.config, ids, *sizes)
        hf_model = AutoModelForSeq2SeqLM.from_config(config).eval()
        state = hf_state(model, ids)
        own = hf_model.state_dict()
        missing = [k for k in own if k not in state and "embed_positions" not in k]
        extra = [k for k in state if k not in own]
        if missing or extra:
            raise MtkitError(f"transformers {version}'s {type(hf_model).__name__} has other "
                             f"weights than the export writes (missing {missing[:3]}, unexpected {extra[:3]})")
        with torch.no_grad():
            for name, t in state.items():
                if own[name].shape != t.shape:
                    raise MtkitError(f"{name}: {tuple(t.shape)} where {type(hf_model).__name__} has "
                                     f"{tuple(own[name].shape)}")
                own[name].copy_(t)
        generation = GenerationConfig(**generation_settings(loaded.config, ids))
        try:
            generation.validate(strict=True)
        except ValueError as e:
            said = " ".join(line.strip("- ") for line in str(e).splitlines()[1:2])
            raise MtkitError(f"transformers {version} refuses the generation settings: "
                             f"{said}") from None
        hf_model.generation_config = generation
        self.hf_model = hf_model
        hf_logging.disable_progress_bar()  # its shard-writing bar: mtkit says what it wrote, once

    def write(self, folder: Path) -> None:
        loaded, arch = self.loaded, architecture(self.loaded.config)
        self.hf_model.save_pretrained(str(folder))
        write_tokenizer(loaded, self.ids, folder)
        (folder / "README.md").write_text(model_card(loaded, arch), encoding="utf-8")
        manifest.write(folder, record(loaded, arch))
        file_modes(folder)  # safetensors writes 0600: the folder's files as any other output

    def check(self, folder: Path) -> None:
        """The Hugging Face model's logits on a probe batch are mtkit's to :data:`TOLERANCE`."""
        diff = probe_logits_difference(self.model, self.hf_model, self.ids)
        if not diff <= TOLERANCE:
            raise MtkitError(f"the exported {type(self.hf_model).__name__}'s logits differ from mtkit's by "
                             f"{diff:.3g} (transformers {self.transformers.__version__}); nothing written")


def export_model(loaded, out_dir: str | Path) -> Path:
    """Write ``loaded`` (a LoadedModel) as a Hugging Face model folder ``out_dir`` (:class:`HuggingfaceExport`:
    built beside it, checked and renamed into place: a failed export leaves nothing). Refused, in one line
    each: options no architecture expresses, a non-empty ``out_dir``, a missing ``transformers``."""
    return export(HuggingfaceExport(loaded), out_dir)
