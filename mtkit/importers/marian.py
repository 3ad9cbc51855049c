"""Import a Marian / OPUS-MT model in the Hugging Face layout as an mtkit checkpoint.

A folder as ``MarianMTModel.save_pretrained`` and ``MarianTokenizer.save_pretrained`` write it (the
layout of the OPUS-MT models on the hub): ``config.json`` (and ``generation_config.json``),
``model.safetensors`` or ``pytorch_model.bin``, ``source.spm``, ``target.spm``, ``vocab.json`` (and
``target_vocab.json`` with ``separate_vocabs``), ``tokenizer_config.json``.

The architecture is the paper's post-norm Transformer with four of mtkit's named deviations:
``activation`` (OPUS-MT: swish), ``output_bias`` (``final_logits_bias``), ``scale_embedding``
(√d_model or none) and ``sinusoid_layout: concatenated`` (Hugging Face's
MarianSinusoidalPositionalEmbedding puts the sines before the cosines).

Special ids. Marian has eos=0, unk=1, pad=V-1, no BOS, and starts decoding from the pad id; mtkit
fixes pad=0, unk=1, bos=2, eos=3 everywhere (search, vocabularies, training, exporters). So the
vocabulary is permuted instead (mtkit id <- Marian id): 0 <- pad, 1 <- unk, 2 <- pad, 3 <- eos, then
every other id in Marian's order: one id more than Marian's. The BOS slot carries Marian's decoder
start (its pad row: embedding, projection and bias), so the decoder starts exactly as Marian's. The
PAD slot is the extra one: its logit is held at :data:`LOGIT_FLOOR`, far below any real logit, so
that it takes no probability and the softmax is Marian's. With ``renormalize_logits`` (the OPUS-MT
generation configs set it) the BOS slot's logit is floored too: Hugging Face then bans the pad id
before normalizing, so the pad takes no probability either. mtkit never generates PAD or BOS, as
Marian's ``bad_words_ids=[[pad]]`` never does. The piece table(s) are permuted alike and stored in the
checkpoint (``vocab.pieces``): ids come from the table, a piece missing from it being unk.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mtkit.config import BOS_ID, PAD_ID, Config, DecodeConfig, ModelConfig, config_from_dict, config_to_dict
from mtkit.errors import MtkitError

LOGIT_FLOOR = -1e4  # the extra slot's logit: exp() of it is 0 in fp32, and fp16 and bf16 still hold it
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
WEIGHTS = ("model.safetensors", "pytorch_model.bin")
REQUIRED = ("config.json", "source.spm", "target.spm", "vocab.json")


@dataclass
class Imported:
    """What an import makes: the config, the weights (mtkit's names and ids) and the vocabulary."""

    config: Config
    state: dict  # mtkit's state_dict
    vocab: dict  # the checkpoint's "vocab" entry: {"src", "tgt", "pieces"}
    src_vocab_size: int
    tgt_vocab_size: int
    source: str


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise MtkitError(f"{path}: cannot read ({e})") from None
    except ValueError as e:
        raise MtkitError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise MtkitError(f"{path}: expected a JSON object")
    return data


def _read_weights(folder: Path) -> dict:
    import torch

    path = next((folder / n for n in WEIGHTS if (folder / n).is_file()), None)
    if path is None:
        raise MtkitError(f"{folder}: no model weights ({' or '.join(WEIGHTS)})")
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise MtkitError(f"{path}: reading it needs safetensors (pip install 'mtkit[import]')") from None
    try:
        if path.suffix == ".safetensors":
            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)  # never executes code
    except Exception as e:  # noqa: BLE001 (a truncated or foreign file: one line)
        why = (str(e).splitlines() or [""])[0][:120]
        raise MtkitError(f"{path}: not readable model weights ({type(e).__name__}: {why})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise MtkitError(f"{path}: not a state_dict of tensors")
    # MarianMTModel's keys ("model.encoder…", "lm_head.weight", "final_logits_bias"), without "model.".
    return {k.removeprefix("model."): v.float() for k, v in state.items()}


def _special(name: str, config_id: Any, path: Path) -> int:
    if not isinstance(config_id, int) or isinstance(config_id, bool):
        raise MtkitError(f"{path}: {name}_token_id must be an integer, got {config_id!r}")
    return config_id


def _permutation(table: dict[str, int], size: int, pad: int, eos: int, path: Path) -> tuple[list[int], list[str]]:
    """mtkit id -> Marian id (pad, unk, pad, eos, then the rest in order), and mtkit's piece table."""
    if "<unk>" not in table:
        raise MtkitError(f"{path}: no '<unk>' piece")
    unk = table["<unk>"]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in table.values()):
        raise MtkitError(f"{path}: expected a mapping of pieces to integer ids")
    pieces = {i: p for p, i in table.items()}
    bad = [i for i in (pad, eos, unk, *pieces) if not isinstance(i, int) or not 0 <= i < size]
    if bad or len(pieces) != len(table):
        raise MtkitError(f"{path}: ids must be distinct integers below the model's vocabulary size {size}"
                         + (f" (found {bad[0]!r})" if bad else ""))
    if len({pad, eos, unk}) != 3:
        raise MtkitError(f"{path}: pad, eos and unk must be three different ids (got {pad}, {eos}, {unk})")
    order = [pad, unk, pad, eos] + [i for i in range(size) if i not in (pad, unk, eos)]
    names = [pieces.get(i, f"<marian:{i}>") for i in order]
    names[PAD_ID], names[BOS_ID] = pieces.get(pad, "<pad>"), "<s>"
    while names[BOS_ID] in pieces.values():  # a Marian piece "<s>" keeps its name: BOS gets another
        names[BOS_ID] = f"<{names[BOS_ID]}>"
    return order, names


def _model_config(hf: dict, path: Path) -> ModelConfig:
    def need(key: str, default: Any = None) -> Any:
        value = hf.get(key, default)
        if value is None:
            raise MtkitError(f"{path}: no '{key}'")
        return value

    if hf.get("model_type", "marian") != "marian":
        raise MtkitError(f"{path}: model_type is {hf.get('model_type')!r}, not 'marian'")
    act = need("activation_function", "gelu")
    if act not in ACTIVATIONS:
        raise MtkitError(f"{path}: activation_function {act!r} is not supported (relu, swish, silu, gelu)")
    if need("encoder_attention_heads", 16) != need("decoder_attention_heads", 16):
        raise MtkitError(f"{path}: encoder and decoder attention heads differ; mtkit has one h")
    if need("encoder_ffn_dim", 4096) != need("decoder_ffn_dim", 4096):
        raise MtkitError(f"{path}: encoder_ffn_dim and decoder_ffn_dim differ; mtkit has one d_ff")
    if hf.get("normalize_before") or hf.get("add_final_layer_norm"):
        raise MtkitError(f"{path}: pre-norm Marian models are not supported")
    raw = {
        "d_model": need("d_model", 1024), "h": hf.get("encoder_attention_heads", 16),
        "d_ff": hf.get("encoder_ffn_dim", 4096), "encoder_layers": need("encoder_layers", 12),
        "decoder_layers": need("decoder_layers", 12), "dropout": hf.get("dropout", 0.1),
        "attention_dropout": hf.get("attention_dropout", 0.0), "activation_dropout": hf.get("activation_dropout", 0.0),
        "norm": "post", "positions": "sinusoidal", "max_positions": need("max_position_embeddings", 1024),
        "activation": ACTIVATIONS[act], "output_bias": True, "scale_embedding": bool(hf.get("scale_embedding", False)),
        "sinusoid_layout": "concatenated", "layer_norm_eps": 1e-5,
    }
    try:
        return config_from_dict({"model": raw}).model
    except MtkitError as e:
        raise MtkitError(f"{path}: {e}") from None


def _decode_config(gen: dict, model: ModelConfig, path: Path) -> DecodeConfig:
    """Hugging Face's generation settings as mtkit's: beam, power length penalty, maximum length."""
    beam = gen.get("num_beams") or 1
    alpha = gen.get("length_penalty", 1.0)
    if not isinstance(alpha, (int, float)) or alpha < 0:
        raise MtkitError(f"{path}: length_penalty {alpha!r} is not supported (mtkit's power penalty needs >= 0)")
    # HF's max_length counts the decoder start and the EOS (forced at the last step): tokens before EOS.
    for key in ("max_new_tokens", "max_length", "no_repeat_ngram_size"):
        if gen.get(key) is not None and (not isinstance(gen[key], int) or isinstance(gen[key], bool) or gen[key] < 0):
            raise MtkitError(f"{path}: {key} must be a non-negative integer, got {gen[key]!r}")
    max_out = gen["max_new_tokens"] - 1 if gen.get("max_new_tokens") else (gen.get("max_length") or 20) - 2
    if gen.get("early_stopping") is not True and beam > 1:
        print(f"note: {path.name}: early_stopping is {gen.get('early_stopping', False)!r}; mtkit's beam search "
              "stops a sentence once it holds `beam` finished hypotheses (early_stopping=True)", file=sys.stderr)
    # Marian's forced_eos_token_id gives the EOS forced at the maximum length log-probability 0.
    raw = {"beam": beam, "nbest": 1, "length_penalty": "power", "alpha": float(alpha), "max_len_a": 0.0,
           "max_len_b": max(1, max_out), "forced_eos": "zero",
           "no_repeat_ngram_size": gen.get("no_repeat_ngram_size") or 0,
           "max_input_len": model.max_positions - 1}
    try:
        return config_from_dict({"decode": raw}).decode
    except MtkitError as e:
        raise MtkitError(f"{path}: {e}") from None


def read_marian(folder: str | Path) -> Imported:
    """Convert the Marian model in ``folder`` (nothing is written); user errors are one-line MtkitErrors."""
    import torch

    from mtkit.model import Transformer

    folder = Path(folder)
    if not folder.is_dir():
        raise MtkitError(f"{folder}: no such directory")
    for name in REQUIRED:
        if not (folder / name).is_file():
            raise MtkitError(f"{folder}: no {name} (expected a Marian model saved by save_pretrained)")
    hf = _read_json(folder / "config.json")
    generation = folder / "generation_config.json"  # where save_pretrained puts num_beams, max_length ...
    gen = {**hf, **(_read_json(generation) if generation.is_file() else {})}
    tok = _read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    model_cfg = _model_config(hf, folder / "config.json")

    pad = _special("pad", hf.get("pad_token_id", 58100), folder / "config.json")
    eos = _special("eos", hf.get("eos_token_id", 0), folder / "config.json")
    start = hf.get("decoder_start_token_id", pad)
    if start != pad:
        raise MtkitError(f"{folder / 'config.json'}: decoder_start_token_id {start} is not the pad id {pad}; "
                         "only Marian's start from the pad embedding is supported")
    shared = bool(hf.get("share_encoder_decoder_embeddings", True))
    src_size = hf.get("vocab_size", 58101)
    tgt_size = src_size if shared else (hf.get("decoder_vocab_size") or src_size)

    for key, size in (("vocab_size", src_size), ("decoder_vocab_size", tgt_size)):
        if not isinstance(size, int) or isinstance(size, bool) or size < 4:
            raise MtkitError(f"{folder / 'config.json'}: {key} must be an integer >= 4, got {size!r}")
    separate = bool(tok.get("separate_vocabs", False))
    src_table = _read_json(folder / "vocab.json")
    if separate and not (folder / "target_vocab.json").is_file():
        raise MtkitError(f"{folder}: no target_vocab.json (tokenizer_config.json sets separate_vocabs)")
    tgt_table = _read_json(folder / "target_vocab.json") if separate else src_table
    src_order, src_pieces = _permutation(src_table, src_size, pad, eos, folder / "vocab.json")
    tgt_order, tgt_pieces = _permutation(tgt_table, tgt_size, pad, eos,
                                         folder / ("target_vocab.json" if separate else "vocab.json"))

    weights = _read_weights(folder)

    def get(*names: str):
        for name in names:
            if name in weights:
                return weights[name]
        raise MtkitError(f"{folder}: the weights have no '{names[0]}'")

    src_emb = get("encoder.embed_tokens.weight", "shared.weight")
    tgt_emb = get("decoder.embed_tokens.weight", "shared.weight")
    tie = bool(hf.get("tie_word_embeddings", True))
    out_w = tgt_emb if tie else get("lm_head.weight")
    out_b = weights.get("final_logits_bias", torch.zeros(1, tgt_size)).reshape(-1)
    for name, t, rows in (("source embeddings", src_emb, src_size), ("target embeddings", tgt_emb, tgt_size),
                          ("output projection", out_w, tgt_size), ("final_logits_bias", out_b, tgt_size)):
        if t.shape[0] != rows or (t.dim() == 2 and t.shape[1] != model_cfg.d_model):
            raise MtkitError(f"{folder}: its {name} are {tuple(t.shape)}, not {rows} × {model_cfg.d_model} "
                             "as config.json says")

    # mtkit's tying: 'all' needs one matrix for both embeddings and the projection.
    share = "all" if shared and tie else "decoder" if tie else "none"
    model_cfg = replace(model_cfg, share_embeddings=share)
    V_src, V_tgt = len(src_order), len(tgt_order)
    model = Transformer(model_cfg, V_src, V_tgt, pad_id=PAD_ID, kernels="reference")
    src_idx, tgt_idx = torch.tensor(src_order), torch.tensor(tgt_order)
    bias = out_b[tgt_idx].clone()
    bias[PAD_ID] = LOGIT_FLOOR
    if gen.get("renormalize_logits"):
        bias[BOS_ID] = LOGIT_FLOOR
    new = {
        "encoder.embeddings.tokens.weight": src_emb[src_idx],
        "decoder.embeddings.tokens.weight": tgt_emb[tgt_idx],
        "output_projection.weight": out_w[tgt_idx],
        "output_projection.bias": bias,
    }
    for side, n in (("encoder", model_cfg.encoder_layers), ("decoder", model_cfg.decoder_layers)):
        parts = [("self_attn", "self_attn", "self_attn_layer_norm")]
        if side == "decoder":
            parts.append(("encoder_attn", "cross_attn", "encoder_attn_layer_norm"))
        for i in range(n):
            hf_l, mt_l = f"{side}.layers.{i}", f"{side}.layers.{i}"
            for k, (hf_attn, mt_attn, hf_norm) in enumerate(parts):
                for hf_p, mt_p in (("q_proj", "w_q"), ("k_proj", "w_k"), ("v_proj", "w_v"), ("out_proj", "w_o")):
                    for t in ("weight", "bias"):
                        new[f"{mt_l}.{mt_attn}.{mt_p}.{t}"] = get(f"{hf_l}.{hf_attn}.{hf_p}.{t}")
                for t in ("weight", "bias"):
                    new[f"{mt_l}.sublayer.{k}.norm.{t}"] = get(f"{hf_l}.{hf_norm}.{t}")
            for t in ("weight", "bias"):
                new[f"{mt_l}.feed_forward.w_1.{t}"] = get(f"{hf_l}.fc1.{t}")
                new[f"{mt_l}.feed_forward.w_2.{t}"] = get(f"{hf_l}.fc2.{t}")
                new[f"{mt_l}.sublayer.{len(parts)}.norm.{t}"] = get(f"{hf_l}.final_layer_norm.{t}")
    own = model.state_dict()
    for key, value in new.items():
        if key in own and own[key].shape != value.shape:
            raise MtkitError(f"{folder}: '{key}' is {tuple(value.shape)}, not {tuple(own[key].shape)} "
                             "as config.json says")
    with torch.no_grad():
        params = dict(model.named_parameters(remove_duplicate=False))
        for key, value in new.items():
            if key == "output_projection.weight" and share != "none":
                continue  # tied to the target embeddings, already set
            if key == "decoder.embeddings.tokens.weight" and share == "all":
                continue  # tied to the source embeddings
            params[key].copy_(value)
    if share == "all" and not torch.equal(src_emb, tgt_emb):
        raise MtkitError(f"{folder}: share_encoder_decoder_embeddings is set but the embeddings differ")

    src_bytes = (folder / "source.spm").read_bytes()
    tgt_bytes = (folder / "target.spm").read_bytes()
    pieces = {"src": src_pieces, "tgt": tgt_pieces if separate else None}
    from mtkit.data.vocab import Vocab

    for name, model_bytes in (("source.spm", src_bytes), ("target.spm", tgt_bytes)):
        try:
            Vocab.from_bytes(model_bytes, None, pieces)
        except MtkitError as e:
            raise MtkitError(f"{folder / name}: {str(e).split(': ', 1)[-1]}") from None
    decode = _decode_config(gen, model_cfg, folder / "config.json")
    config = config_from_dict({"model": config_to_dict(model_cfg), "decode": config_to_dict(decode),
                               "data": {"src_lang": tok.get("source_lang") or "src",
                                        "tgt_lang": tok.get("target_lang") or "tgt"}})
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return Imported(config=config, state=state, vocab={"src": src_bytes, "tgt": tgt_bytes, "pieces": pieces},
                    src_vocab_size=V_src, tgt_vocab_size=V_tgt, source=str(folder))
