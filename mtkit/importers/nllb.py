"""Import an NLLB-200 or M2M100 model (Hugging Face's ``M2M100ForConditionalGeneration``) as an mtkit checkpoint.

A folder as ``save_pretrained`` writes it (the layout of ``facebook/nllb-200-distilled-600M`` on the hub):
``config.json`` (and ``generation_config.json``), ``model.safetensors`` or ``pytorch_model.bin``,
``sentencepiece.bpe.model`` (the SentencePiece model: mtkit's tokenizer), ``tokenizer.json`` (the id of every
piece, language code and special token) and ``tokenizer_config.json`` (the language codes, ``src_lang``).

The architecture is the pre-norm Transformer with a final LayerNorm after each stack (mtkit's ``norm: pre``),
with mtkit's named deviations: ``activation`` (the config's, ReLU for NLLB), ``scale_embedding`` (√d_model),
``sinusoid_layout: fairseq`` (fairseq's table: sines then cosines, frequencies 10000^(-i/(d/2-1)), positions
numbered from padding_idx + 1 = 2) and ``output_bias`` (M2M100 has none: zeros, but for the extra slot below).
The embeddings and the output projection are one matrix (``share_embeddings: all``).

Special ids. fairseq's are <s>=0, <pad>=1, </s>=2, <unk>=3, then the SentencePiece pieces (shifted by one),
the language codes and <mask>; decoding starts from </s>. mtkit fixes pad=0, unk=1, bos=2, eos=3, so the
vocabulary is permuted (mtkit id <- NLLB id): 0 <- <pad>, 1 <- <unk>, 2 <- </s> (the decoder's start), 3 <-
</s>, then every other id in NLLB's order (<s> first): one id more than NLLB's. The BOS slot is the extra
one: it repeats the </s> row, and its logit is held at :data:`~mtkit.importers.marian.LOGIT_FLOOR`, so the
softmax is NLLB's. The piece table is stored in the checkpoint (``vocab.pieces``); codes are pieces under
their own names (``fra_Latn``), which SentencePiece never produces from text.

Languages. The run is multilingual with ``data.tag_side: codes`` (:class:`mtkit.data.languages.CodedVocab`):
the source is [source code] + pieces + </s>, as NllbTokenizer writes it (``legacy_behaviour: false``); the
decoder reads </s>, then the target code, forced (search's ``prefix``: Hugging Face's ``forced_bos_token_id``,
of log-probability 0, counted in the length). One source language per run (``--source``); the targets are
the pairs (``--target``, every code by default).

Checks, before anything is built: the fields of the JSON files are typed, config.json's sizes are checked
against the safetensors header (:func:`mtkit.importers.marian.check_config_against_weights`), the tokenizer's
ids against the vocabulary size, and every language asked for against the codes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from mtkit.config import MAX_LENGTH, ModelConfig, config_from_dict, config_to_dict
from mtkit.data.languages import resolve
from mtkit.data.vocab import Vocab
from mtkit.errors import MtkitError, shown
from mtkit.hub import hub_folder
from mtkit.importers.marian import (
    ACTIVATIONS,
    LOGIT_FLOOR,
    WEIGHTS,
    Fields,
    Imported,
    _decode_config,
    _read_json,
    _read_weights,
    _safetensors_shapes,
    check_config_against_weights,
    weight_file,
)
from mtkit.io import MAX_VOCAB_BYTES, read_bounded
from mtkit.model import Transformer

SPM = "sentencepiece.bpe.model"
REQUIRED = ("config.json", SPM, "tokenizer.json")
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
START_PIECE = "<nllb:start>"  # the BOS slot's name in the piece table (</s> is the EOS's)
MAX_CODES = 4096  # NLLB has 202, M2M100 100


def nllb_folder(source: str) -> Path:
    """``source`` itself when it is a directory; otherwise a hub name (``facebook/nllb-200-distilled-600M``),
    downloaded through ``huggingface_hub`` into its cache and read from there."""
    return hub_folder(source, ["*.json", SPM, *WEIGHTS], "facebook/nllb-200-distilled-600M", "import")


def _model_config(hf: Fields, path: Path) -> ModelConfig:
    kind = hf.get("model_type", "a string", "m2m_100")
    if kind != "m2m_100":
        raise MtkitError(f"{path}: model_type is {shown(kind)}, not 'm2m_100' (NLLB-200, M2M100)")
    act, h, d_ff = hf.layer_shape(path, "relu")
    positive = {"minimum": 1}
    d_model = hf.need("d_model", "an integer", 1024, **positive)
    if d_model % h or d_model % 2 or d_model < 4:
        raise MtkitError(f"{path}: d_model ({d_model}) must be even, at least 4 and a multiple of "
                         f"encoder_attention_heads ({h})")
    raw = {
        "d_model": d_model, "h": h, "d_ff": d_ff,
        "encoder_layers": hf.need("encoder_layers", "an integer", 12, **positive),
        "decoder_layers": hf.need("decoder_layers", "an integer", 12, **positive),
        "dropout": hf.get("dropout", "a number", 0.1),
        "attention_dropout": hf.get("attention_dropout", "a number", 0.1),
        "activation_dropout": hf.get("activation_dropout", "a number", 0.0),
        "norm": "pre", "positions": "sinusoidal",
        "max_positions": hf.need("max_position_embeddings", "an integer", 1024, **positive),
        "activation": ACTIVATIONS[act], "output_bias": True,
        "scale_embedding": hf.get("scale_embedding", "true or false", True),
        "sinusoid_layout": "fairseq", "layer_norm_eps": 1e-5, "share_embeddings": "all",
    }
    try:
        return config_from_dict({"model": raw}).model
    except MtkitError as e:
        raise MtkitError(f"{path}: {e}") from None


def _id_table(tokenizer: dict, size: int, path: Path) -> tuple[dict[str, int], list[str]]:
    """piece -> NLLB id: tokenizer.json's model vocabulary and its added tokens (specials, codes, <mask>); and
    the added tokens marked special (what decoding drops, as skip_special_tokens does)."""
    model = tokenizer.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, list):  # a Unigram model: [[piece, score], ...] in id order
        vocab = {entry[0]: i for i, entry in enumerate(vocab) if isinstance(entry, list) and entry}
    if not isinstance(vocab, dict):
        raise MtkitError(f"{path}: no model vocabulary (model.vocab)")
    table = dict(vocab)
    special = []
    added = tokenizer.get("added_tokens") or []
    if not isinstance(added, list):
        raise MtkitError(f"{path}: added_tokens must be a list")
    for entry in added:
        if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
            raise MtkitError(f"{path}: an added token without content: {shown(entry)}")
        table[entry["content"]] = entry.get("id")
        if entry.get("special") is True:
            special.append(entry["content"])
    bad = [i for i in table.values() if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < size]
    if bad:
        raise MtkitError(f"{path}: ids must be integers below the model's vocabulary size {size} "
                         f"(found {shown(bad[0])})")
    if len(set(table.values())) != len(table):
        raise MtkitError(f"{path}: two pieces share an id")
    for piece, want in zip(SPECIALS, range(4)):
        if table.get(piece) != want:
            raise MtkitError(f"{path}: {piece} must have fairseq's id {want}, got {shown(table.get(piece))}")
    return table, special


def _codes(tok: Fields, tok_path: Path, table: dict[str, int]) -> list[str]:
    """The language codes the tokenizer names (extra_special_tokens, or additional_special_tokens), each
    a piece of the table."""
    codes = None
    for key in ("extra_special_tokens", "additional_special_tokens"):
        for data, _ in tok.files:
            value = data.get(key)
            if value:
                codes = value
                break
        if codes:
            break
    if not isinstance(codes, list) or not codes or not all(isinstance(c, str) for c in codes):
        raise MtkitError(f"{tok_path}: no language codes (extra_special_tokens or additional_special_tokens: "
                         "a list of strings such as eng_Latn)")
    if len(codes) > MAX_CODES:
        raise MtkitError(f"{tok_path}: {len(codes)} language codes, more than {MAX_CODES}")
    missing = [c for c in codes if c not in table]
    if missing:
        raise MtkitError(f"{tok_path}: the language code {shown(missing[0])} is not in tokenizer.json's vocabulary")
    return codes


def pick_languages(codes: list[str], source: str | None, targets: list[str], default_source: str | None,
                   where: Path) -> tuple[str, list[str]]:
    """The run's source language and target languages, each a code of the model or its ISO 639-1 code (one line
    otherwise)."""
    src = resolve(source, codes) if source else default_source
    targets = [resolve(t, codes) for t in targets]  # fr for fra_Latn, where the model has one French
    if src is None:
        raise MtkitError(f"{where}: no src_lang; say the source language with --source (e.g. {codes[0]})")
    for lang, flag in [(src, "--source"), *((t, "--target") for t in targets)]:
        if lang not in codes:
            raise MtkitError(f"{flag} {shown(lang)}: not a language code of the model (it has {len(codes)}: "
                             f"{', '.join(codes[:6])}{' …' if len(codes) > 6 else ''})")
    chosen = list(dict.fromkeys(targets)) or [c for c in codes if c != src]
    return src, chosen


def read_nllb(folder: str | Path, source: str | None = None, targets: tuple[str, ...] = ()) -> Imported:
    """Convert the NLLB / M2M100 model in ``folder`` (nothing is written); user errors are one-line MtkitErrors.

    ``source``: the source language's code (default: tokenizer_config.json's ``src_lang``); ``targets``: the
    codes to translate into (default: every other code). Every file is read and checked before the weights."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MtkitError(f"{folder}: no such directory")
    for name in REQUIRED:
        if not (folder / name).exists():
            raise MtkitError(f"{folder}: no {name} (expected an NLLB / M2M100 model saved by save_pretrained)")
    config_path = folder / "config.json"
    hf_json = _read_json(config_path)
    hf = Fields((hf_json, config_path))
    generation = folder / "generation_config.json"
    gen = Fields((hf_json, config_path), *([(_read_json(generation), generation)] if generation.exists() else []))
    tok_path = folder / "tokenizer_config.json"
    tok = Fields((_read_json(tok_path) if tok_path.exists() else {}, tok_path))
    model_cfg = _model_config(hf, config_path)
    decode = _decode_config(gen, model_cfg)
    for key, want in (("pad_token_id", 1), ("eos_token_id", 2), ("decoder_start_token_id", 2), ("bos_token_id", 0)):
        value = gen.get(key, "an integer", want)
        if value != want:
            raise MtkitError(f"{gen.where(key)}: {key} is {value}, not fairseq's {want}")
    forced_eos = gen.get("forced_eos_token_id", "an integer")
    if forced_eos is not None and forced_eos != 2:
        raise MtkitError(f"{gen.where('forced_eos_token_id')}: forced_eos_token_id {forced_eos} is not the eos id 2")
    if tok.get("legacy_behaviour", "true or false", False):
        raise MtkitError(f"{tok_path}: legacy_behaviour (the code after </s>) is not supported")
    size = hf.get("vocab_size", "an integer", 256206, minimum=5)

    weights_path = weight_file(folder)
    shapes = _safetensors_shapes(weights_path) if weights_path.suffix == ".safetensors" else None
    weights = None
    if shapes is None:
        weights = _read_weights(folder)
        shapes = {k: tuple(v.shape) for k, v in weights.items()}
    check_config_against_weights(config_path, model_cfg, size, size, "vocab_size", shapes, weights_path)

    tokenizer_path = folder / "tokenizer.json"
    table, special = _id_table(_read_json(tokenizer_path, MAX_VOCAB_BYTES, "tokenizer"), size, tokenizer_path)
    codes = _codes(tok, tok_path, table)
    src_lang, tgt_langs = pick_languages(codes, source, list(targets), tok.get("src_lang", "a string"), tok_path)
    spm_bytes = read_bounded(folder / SPM, MAX_VOCAB_BYTES, "SentencePiece model")

    pieces = {i: p for p, i in table.items()}
    order = [1, 3, 2, 2] + [i for i in range(size) if i not in (1, 2, 3)]  # mtkit id -> NLLB id
    names = [pieces.get(i, f"<nllb:{i}>") for i in order]
    names[2] = START_PIECE

    if weights is None:
        weights = _read_weights(folder)
    emb = weights.get("shared.weight", weights.get("encoder.embed_tokens.weight"))
    if emb is None or tuple(emb.shape) != (size, model_cfg.d_model):
        raise MtkitError(f"{folder}: no shared embeddings of {size} × {model_cfg.d_model}")
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"):
        if name in weights and not torch.equal(weights[name], emb):
            raise MtkitError(f"{weights_path}: {name} differs from shared.weight; mtkit imports tied embeddings only")
    model = Transformer(model_cfg, len(order), len(order), kernels="reference")
    idx = torch.tensor(order)
    bias = torch.zeros(len(order))
    bias[2] = LOGIT_FLOOR  # the BOS slot repeats </s>: it takes no probability
    new = {"encoder.embeddings.tokens.weight": emb[idx], "output_projection.bias": bias}
    for side, n in (("encoder", model_cfg.encoder_layers), ("decoder", model_cfg.decoder_layers)):
        parts = [("self_attn", "self_attn", "self_attn_layer_norm")]
        if side == "decoder":
            parts.append(("encoder_attn", "cross_attn", "encoder_attn_layer_norm"))
        for i in range(n):
            layer = f"{side}.layers.{i}"
            for hf_attn, mt_attn, hf_norm in parts:
                for hf_p, mt_p in (("q_proj", "w_q"), ("k_proj", "w_k"), ("v_proj", "w_v"), ("out_proj", "w_o")):
                    for t in ("weight", "bias"):
                        new[f"{layer}.{mt_attn}.{mt_p}.{t}"] = weights.get(f"{layer}.{hf_attn}.{hf_p}.{t}")
                for t in ("weight", "bias"):
                    new[f"{layer}.{mt_attn}_norm.{t}"] = weights.get(f"{layer}.{hf_norm}.{t}")
            for t in ("weight", "bias"):
                new[f"{layer}.feed_forward.w_1.{t}"] = weights.get(f"{layer}.fc1.{t}")
                new[f"{layer}.feed_forward.w_2.{t}"] = weights.get(f"{layer}.fc2.{t}")
                new[f"{layer}.feed_forward_norm.{t}"] = weights.get(f"{layer}.final_layer_norm.{t}")
        for t in ("weight", "bias"):
            new[f"{side}.norm.{t}"] = weights.get(f"{side}.layer_norm.{t}")
    params = dict(model.named_parameters())
    for key, value in new.items():
        if value is None:
            raise MtkitError(f"{weights_path}: no tensor for mtkit's {key}")
        if key not in params or params[key].shape != value.shape:
            raise MtkitError(f"{weights_path}: the tensor for {key} is {tuple(value.shape)}, not "
                             f"{tuple(params[key].shape) if key in params else 'expected'} as config.json says")
    with torch.no_grad():
        for key, value in new.items():
            params[key].copy_(value)

    vocab_pieces = {"src": names, "tgt": None, "special": [p for p in special if p not in ("<pad>", "</s>")]}
    try:
        Vocab.from_bytes(spm_bytes, None, vocab_pieces)
    except MtkitError as e:
        raise MtkitError(f"{folder / SPM}: {str(e).split(': ', 1)[-1]}") from None
    pairs = [{"src_lang": src_lang, "tgt_lang": t} for t in tgt_langs if t != src_lang]
    if not pairs:
        raise MtkitError(f"--target: no language to translate into other than the source {src_lang}")
    decode = replace(decode, max_input_len=min(model_cfg.max_positions - 2, MAX_LENGTH))  # the source's code
    config = config_from_dict({"model": config_to_dict(model_cfg), "decode": config_to_dict(decode),
                               "data": {"src_lang": src_lang, "tgt_lang": pairs[0]["tgt_lang"], "pairs": pairs,
                                        "tag_side": "codes"}})
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return Imported(config=config, state=state, vocab={"src": spm_bytes, "tgt": None, "pieces": vocab_pieces},
                    src_vocab_size=len(order), tgt_vocab_size=len(order), source=str(folder))
