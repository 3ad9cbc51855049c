"""Import a Marian / OPUS-MT model in the Hugging Face layout as an mtkit checkpoint.

A folder as ``MarianMTModel.save_pretrained`` and ``MarianTokenizer.save_pretrained`` write it (the
layout of the OPUS-MT models on the hub): ``config.json`` (and ``generation_config.json``),
``model.safetensors`` or ``pytorch_model.bin``, ``source.spm``, ``target.spm``, ``vocab.json`` (and
``target_vocab.json`` with ``separate_vocabs``), ``tokenizer_config.json``.

The architecture is the paper's post-norm Transformer (``model_type: marian``; or, ``pegasus``, the pre-norm one
with a final LayerNorm after each stack, as ``mtkit export hf`` writes pre-norm models) with four of mtkit's
named deviations:
``activation`` (OPUS-MT: swish), ``output_bias`` (``final_logits_bias``), ``scale_embedding``
(√d_model or none) and ``sinusoid_layout: concatenated`` (Hugging Face's
MarianSinusoidalPositionalEmbedding puts the sines before the cosines).

Special ids. Marian has eos=0, unk=1, pad=V-1, no BOS, and starts decoding from the pad id; mtkit
fixes pad=0, unk=1, bos=2, eos=3 everywhere (search, vocabularies, training, exporters). So the
vocabulary is permuted instead (mtkit id <- Marian id): 0 <- pad, 1 <- unk, 2 <- pad, 3 <- eos, then
every other id in Marian's order: one id more than Marian's. (A folder whose decoder starts from an id of
its own, as ``mtkit export hf`` writes them, keeps its ids: pad, unk, start, eos, then the rest.) The BOS
slot carries Marian's decoder start (its pad row: embedding, projection and bias), so the decoder starts
exactly as Marian's. The PAD slot is the extra one: its logit is held at :data:`LOGIT_FLOOR`, far below
any real logit, so that it takes no probability and the softmax is Marian's. With ``renormalize_logits`` (the OPUS-MT
generation configs set it) the BOS slot's logit is floored too: Hugging Face then bans the pad id
before normalizing, so the pad takes no probability either. mtkit never generates PAD or BOS, as
Marian's ``bad_words_ids=[[pad]]`` never does. The piece table(s) are permuted alike and stored in the
checkpoint (``vocab.pieces``): ids come from the table, a piece missing from it being unk.

Names. Marian's layout has one tensor per mtkit parameter (no stacked projections), so the import
maps onto mtkit's parameter names, the checkpoint format; the inference weights that translation and
the CTranslate2 export read are derived from those by the one weight map
(:func:`mtkit.kernels.packed.pack`), not written here.

Checks, before anything is built: every field read from ``config.json``, ``generation_config.json`` and
``tokenizer_config.json`` has its type checked (:class:`Fields`), and every size ``config.json`` gives
is checked against the tensors' shapes, read from the safetensors header without the weights
(:func:`check_config_against_weights`): a config of 100000000 layers over weights of one is one error
line, not a model of that size.

Its length is the checks: a folder from elsewhere is refused field by field before anything of the
size it claims is built.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from mtkit.checkpoints.file import read_payload
from mtkit.checkpoints.io import MAX_POSITIONS, layer_count
from mtkit.config import (
    BOS_ID,
    MAX_LENGTH,
    PAD_ID,
    Config,
    ConfigError,
    DecodeConfig,
    ModelConfig,
    config_from_dict,
    config_to_dict,
    saved_decode,
)
from mtkit.data.vocab import Vocab
from mtkit.engines import manifest as manifest_file
from mtkit.errors import MtkitError, shown
from mtkit.hub import hub_folder
from mtkit.io import MAX_CONFIG_BYTES, MAX_VOCAB_BYTES, parse_json, read_bounded, read_json_file
from mtkit.model import Transformer

logger = logging.getLogger(__name__)

LOGIT_FLOOR = -1e4  # the extra slot's logit: exp() of it is 0 in fp32, and fp16 and bf16 still hold it
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
WEIGHTS = ("model.safetensors", "pytorch_model.bin")
REQUIRED = ("config.json", "source.spm", "target.spm", "vocab.json")
MODEL_TYPES = {"marian": "post", "pegasus": "pre"}  # Hugging Face's model_type -> mtkit's model.norm


@dataclass
class Imported:
    """What an import makes: the config, the weights (mtkit's names and ids) and the vocabulary."""

    config: Config
    state: dict  # mtkit's state_dict
    vocab: dict  # the checkpoint's "vocab" entry: {"src", "tgt", "pieces"}
    src_vocab_size: int
    tgt_vocab_size: int
    source: str


def _read_json(path: Path, max_bytes: int = MAX_CONFIG_BYTES, what: str = "model config") -> dict:
    data = read_json_file(path, max_bytes, what)
    if not isinstance(data, dict):
        raise MtkitError(f"{path}: expected a JSON object")
    return data


_KINDS = {
    "an integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "a number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "true or false": lambda v: isinstance(v, bool),
    "a string": lambda v: isinstance(v, str),
}


class Fields:
    """The fields of one or more JSON files, each read with its type checked: a wrong type is a one-line
    error naming the file and the key (where Hugging Face's code would raise a TypeError deep inside).
    Later files win (generation_config.json over config.json, as transformers reads them); null is absent."""

    def __init__(self, *files: tuple[dict, Path]) -> None:
        self.files = files

    def where(self, key: str) -> Path:
        """The file that gives ``key`` (the last that has it; the first file if none does)."""
        return next((path for data, path in reversed(self.files) if data.get(key) is not None), self.files[0][1])

    def get(self, key: str, kind: str, default: Any = None, minimum: float | None = None) -> Any:
        for data, path in reversed(self.files):
            value = data.get(key)
            if value is None:
                continue
            if not _KINDS[kind](value):
                raise MtkitError(f"{path}: {key} must be {kind}, got {shown(value)}")
            if minimum is not None and value < minimum:
                raise MtkitError(f"{path}: {key} must be >= {minimum}, got {shown(value)}")
            return value
        return default

    def choice(self, key: str, allowed: tuple) -> Any:
        """One of ``allowed`` (the first where the files have none)."""
        value = next((data[key] for data, _ in reversed(self.files) if data.get(key) is not None), allowed[0])
        if not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
            raise MtkitError(f"{self.where(key)}: {key} must be one of {', '.join(map(repr, allowed))}, "
                             f"got {shown(value)}")
        return value

    def need(self, key: str, kind: str, default: Any = None, minimum: float | None = None) -> Any:
        value = self.get(key, kind, default, minimum)
        if value is None:
            raise MtkitError(f"{self.files[0][1]}: no '{key}'")
        return value

    def layer_shape(self, path: Path, activation: str) -> tuple[str, int, int]:
        """A BART-family config's (Marian, M2M100, NLLB) activation, heads and feed-forward width, checked:
        mtkit has one h and one d_ff for both sides (``activation``: the family's default)."""
        act = self.get("activation_function", "a string", activation)
        if act not in ACTIVATIONS:
            raise MtkitError(f"{path}: activation_function {shown(act)} is not supported (relu, swish, silu, gelu)")
        h = self.need("encoder_attention_heads", "an integer", 16, minimum=1)
        if h != self.need("decoder_attention_heads", "an integer", 16, minimum=1):
            raise MtkitError(f"{path}: encoder and decoder attention heads differ; mtkit has one h")
        d_ff = self.need("encoder_ffn_dim", "an integer", 4096, minimum=1)
        if d_ff != self.need("decoder_ffn_dim", "an integer", 4096, minimum=1):
            raise MtkitError(f"{path}: encoder_ffn_dim and decoder_ffn_dim differ; mtkit has one d_ff")
        return act, h, d_ff


def weight_file(folder: Path) -> Path:
    path = next((folder / n for n in WEIGHTS if (folder / n).is_file()), None)
    if path is None:
        raise MtkitError(f"{folder}: no model weights ({' or '.join(WEIGHTS)})")
    return path


def _safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]] | None:
    """The tensors' shapes from a safetensors header (8 bytes of its length, then JSON), nothing else
    read; None where the header is not one (reading the file then says why, in one line)."""
    try:
        with open(path, "rb") as f:
            size = path.stat().st_size
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 < n <= min(size - 8, 1 << 28):
                return None
            raw = f.read(n)
    except OSError:
        return None
    try:
        header = parse_json(raw, f"{path}: its header")
    except MtkitError:
        return None  # reading the file then says why, in one line
    if not isinstance(header, dict):
        return None
    shapes = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            return None
        shapes[name.removeprefix("model.")] = tuple(shape)
    return shapes


def check_config_against_weights(config: Path, model: ModelConfig, src_size: int, tgt_size: int, tgt_key: str,
                                 shapes: dict[str, tuple[int, ...]], weights: Path) -> None:
    """Refuse every size in config.json that the weight tensors do not have, before anything of that size
    is built (a model of 100000000 layers, a vocabulary permutation of 10^9 ids): one line naming the key,
    its value and what ``weights`` holds. Shapes only: ``shapes`` comes from the file's header."""
    name = weights.name

    def refuse(key: str, value: Any, has: str) -> None:
        raise MtkitError(f"{config}: {key} is {value} but {name} has {has}")

    def shape(*names: str) -> tuple[str, tuple[int, ...]]:
        for n in names:
            if n in shapes:
                return n, shapes[n]
        raise MtkitError(f"{weights}: no '{names[0]}'")

    def dims(s: tuple[int, ...]) -> str:
        return " × ".join(map(str, s))

    emb, s = shape("encoder.embed_tokens.weight", "shared.weight")
    if len(s) != 2 or s[1] != model.d_model:
        refuse("d_model", model.d_model, f"{emb} of {dims(s)}")
    if s[0] != src_size:
        refuse("vocab_size", src_size, f"{emb} of {dims(s)}")
    dec, s = shape("decoder.embed_tokens.weight", "shared.weight")
    if len(s) != 2 or s[0] != tgt_size:
        refuse(tgt_key, tgt_size, f"{dec} of {dims(s)}")
    for side in ("encoder", "decoder"):
        n, want = layer_count(shapes, side), getattr(model, f"{side}_layers")
        if n != want:
            refuse(f"{side}_layers", want, f"{n} {side} layer" + ("" if n == 1 else "s"))
        fc1, s = shape(f"{side}.layers.0.fc1.weight")
        if len(s) != 2 or s[0] != model.d_ff:
            refuse(f"{side}_ffn_dim", model.d_ff, f"{fc1} of {dims(s)}")
    table = shapes.get("encoder.embed_positions.weight")  # saved by older transformers, not by newer ones
    if table is not None and table[0] != model.max_positions:
        refuse("max_position_embeddings", model.max_positions, f"encoder.embed_positions.weight of {dims(table)}")
    if model.max_positions > MAX_POSITIONS:
        raise MtkitError(f"{config}: max_position_embeddings is {model.max_positions}, more than the "
                         f"{MAX_POSITIONS} positions mtkit builds a sinusoid table for")


def _read_weights(folder: Path) -> dict:
    path = weight_file(folder)
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise MtkitError(f"{path}: reading it needs safetensors (pip install 'mtkit[import]')") from None
    else:
        # torch.load's weights-only reading runs no code, but would inflate a compressed entry whole and
        # build whatever the pickle describes: the bounded reader of checkpoints sees the file first.
        read_payload(path)
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


def _permutation(table: dict[str, int], size: int, pad: int, eos: int, path: Path,
                 start: int | None = None) -> tuple[list[int], list[str]]:
    """mtkit id -> Marian id (pad, unk, pad, eos, then the rest in order), and mtkit's piece table. With a
    decoder ``start`` id other than the pad (a folder ``mtkit export hf`` wrote), that id is the BOS slot
    and no slot is extra: (pad, unk, start, eos, then the rest)."""
    if "<unk>" not in table:
        raise MtkitError(f"{path}: no '<unk>' piece")
    unk = table["<unk>"]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in table.values()):
        raise MtkitError(f"{path}: expected a mapping of pieces to integer ids")
    pieces = {i: p for p, i in table.items()}
    bad = [i for i in (pad, eos, unk, *pieces) if not isinstance(i, int) or not 0 <= i < size]
    if bad or len(pieces) != len(table):
        raise MtkitError(f"{path}: ids must be distinct integers below the model's vocabulary size {size}"
                         + (f" (found {shown(bad[0])})" if bad else ""))
    if len({pad, eos, unk}) != 3:
        raise MtkitError(f"{path}: pad, eos and unk must be three different ids (got {pad}, {eos}, {unk})")
    if start is not None and start != pad:
        if start in (unk, eos) or not 0 <= start < size:
            raise MtkitError(f"{path}: the decoder's start id {start} must be an id of its own below {size}")
        order = [pad, unk, start, eos] + [i for i in range(size) if i not in (pad, unk, start, eos)]
        return order, [pieces.get(i, f"<marian:{i}>") for i in order]
    order = [pad, unk, pad, eos] + [i for i in range(size) if i not in (pad, unk, eos)]
    names = [pieces.get(i, f"<marian:{i}>") for i in order]
    names[PAD_ID], names[BOS_ID] = pieces.get(pad, "<pad>"), "<s>"
    while names[BOS_ID] in pieces.values():  # a Marian piece "<s>" keeps its name: BOS gets another
        names[BOS_ID] = f"<{names[BOS_ID]}>"
    return order, names


def _model_config(hf: Fields, path: Path) -> ModelConfig:
    kind = hf.get("model_type", "a string", "marian")
    if kind not in MODEL_TYPES:
        raise MtkitError(f"{path}: model_type is {shown(kind)}, not 'marian' (or 'pegasus', as mtkit export hf "
                         "writes pre-norm models)")
    act, h, d_ff = hf.layer_shape(path, "gelu")
    positive = {"minimum": 1}
    if hf.get("normalize_before", "true or false") or hf.get("add_final_layer_norm", "true or false"):
        raise MtkitError(f"{path}: pre-norm Marian models are not supported")
    d_model = hf.need("d_model", "an integer", 1024, **positive)
    if d_model % h:
        raise MtkitError(f"{path}: encoder_attention_heads ({h}) must divide d_model ({d_model})")
    raw = {
        "d_model": d_model, "h": h, "d_ff": d_ff,
        "encoder_layers": hf.need("encoder_layers", "an integer", 12, **positive),
        "decoder_layers": hf.need("decoder_layers", "an integer", 12, **positive),
        "dropout": hf.get("dropout", "a number", 0.1),
        "attention_dropout": hf.get("attention_dropout", "a number", 0.0),
        "activation_dropout": hf.get("activation_dropout", "a number", 0.0),
        "norm": MODEL_TYPES[kind], "positions": "sinusoidal",
        "max_positions": hf.need("max_position_embeddings", "an integer", 1024, **positive),
        "activation": ACTIVATIONS[act], "output_bias": True,
        "scale_embedding": hf.get("scale_embedding", "true or false", False),
        "sinusoid_layout": "concatenated", "layer_norm_eps": 1e-5,
    }
    try:
        return config_from_dict({"model": raw}).model
    except MtkitError as e:
        raise MtkitError(f"{path}: {e}") from None


DEFAULT_MAX_LENGTH = 20  # transformers' GenerationConfig().max_length


def _decode_config(gen: Fields, model: ModelConfig) -> DecodeConfig:
    """Hugging Face's generation settings as mtkit's: beam, power length penalty, maximum length."""
    beam = gen.get("num_beams", "an integer", 1, minimum=1)
    alpha = gen.get("length_penalty", "a number", 1.0)
    if alpha < 0:
        raise MtkitError(f"{gen.where('length_penalty')}: length_penalty {shown(alpha)} is not supported "
                         "(mtkit's power penalty needs >= 0)")
    new_tokens = gen.get("max_new_tokens", "an integer", minimum=1)
    max_length = gen.get("max_length", "an integer", minimum=0)
    no_repeat = gen.get("no_repeat_ngram_size", "an integer", 0, minimum=0)
    gen.choice("early_stopping", (False, True, "never"))  # typed here, noted once the import has succeeded
    # mtkit's max_len_b counts the tokens before the EOS. Hugging Face's max_length counts the decoder
    # start and the EOS that forced_eos_token_id forces at the last step: max_length - 2 tokens before it;
    # max_new_tokens counts the EOS only. With neither set, generate() takes the default max_length of 20
    # *new* tokens (20 + the start, capped at max_position_embeddings).
    if new_tokens is not None:
        max_out = new_tokens - 1
    elif max_length is not None:
        max_out = max_length - 2
    else:
        max_out = min(DEFAULT_MAX_LENGTH + 1, model.max_positions) - 2
    # Marian's forced_eos_token_id gives the EOS forced at the maximum length log-probability 0.
    raw = {"beam": beam, "nbest": 1, "length_penalty": "power", "alpha": float(alpha), "max_len_a": 0.0,
           "max_len_b": max(1, max_out), "forced_eos": "zero", "no_repeat_ngram_size": no_repeat,
           "max_input_len": min(model.max_positions - 1, MAX_LENGTH)}  # max_position_embeddings is checked
    # against the weights and mtkit's table later, as a size of the model
    hf_keys = {"beam": "num_beams", "alpha": "length_penalty", "no_repeat_ngram_size": "no_repeat_ngram_size",
               "max_len_b": "max_new_tokens" if new_tokens is not None else "max_length"}
    try:
        return config_from_dict({"decode": raw}).decode
    except ConfigError as e:  # out of mtkit's range (a beam of 10^9): named by Hugging Face's key and file
        key = hf_keys.get(e.key.removeprefix("decode."))
        if key is None:
            raise MtkitError(f"{gen.where('num_beams')}: {e}") from None
        raise MtkitError(f"{gen.where(key)}: {key}: {e.problem} (as mtkit's {e.key})") from None


def marian_folder(source: str) -> Path:
    """``source`` itself when it is a directory; otherwise a hub name (``Helsinki-NLP/opus-mt-en-de``),
    downloaded through ``huggingface_hub`` into its cache and read from there."""
    return hub_folder(source, ["*.json", "*.spm", *WEIGHTS], "Helsinki-NLP/opus-mt-en-de", "import")


def read_marian(folder: str | Path) -> Imported:
    """Convert the Marian model in ``folder`` (nothing is written); user errors are one-line MtkitErrors.

    Every file is read and checked (config.json's sizes against the safetensors header) before torch is
    imported, so that a folder that cannot be imported fails at once."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MtkitError(f"{folder}: no such directory")
    for name in REQUIRED:  # exists(), not is_file(): a FIFO or a device is "not a regular file" when read
        if not (folder / name).exists():
            raise MtkitError(f"{folder}: no {name} (expected a Marian model saved by save_pretrained)")
    config_path = folder / "config.json"
    hf_json = _read_json(config_path)
    hf = Fields((hf_json, config_path))
    generation = folder / "generation_config.json"  # where save_pretrained puts num_beams, max_length ...
    gen = Fields((hf_json, config_path), *([(_read_json(generation), generation)] if generation.exists() else []))
    tok_path = folder / "tokenizer_config.json"
    tok = Fields((_read_json(tok_path) if tok_path.exists() else {}, tok_path))
    model_cfg = _model_config(hf, config_path)
    decode = _decode_config(gen, model_cfg)  # every field typed before any work
    manifest = folder / manifest_file.NAME
    if manifest.exists():  # mtkit export hf's: the recipe's decode settings whole (a·source + b, the penalty)
        decode = saved_decode(manifest_file.read_object(folder, "mtkit export manifest").get("decode"), manifest)

    pad = hf.get("pad_token_id", "an integer", 58100)
    eos = hf.get("eos_token_id", "an integer", 0)
    start = hf.get("decoder_start_token_id", "an integer", pad)
    for key, value in (("pad_token_id", pad), ("eos_token_id", eos), ("decoder_start_token_id", start)):
        if gen.get(key, "an integer", value) != value:  # generate() would take generation_config.json's
            raise MtkitError(f"{gen.where(key)}: {key} is {gen.get(key, 'an integer')}, "
                             f"but config.json's is {value}")
    forced = gen.get("forced_eos_token_id", "an integer")
    if forced is not None and forced != eos:
        raise MtkitError(f"{gen.where('forced_eos_token_id')}: forced_eos_token_id {forced} is not the eos id {eos}")
    shared = hf.get("share_encoder_decoder_embeddings", "true or false", True)
    src_size = hf.get("vocab_size", "an integer", 58101, minimum=4)
    tgt_size = src_size if shared else hf.get("decoder_vocab_size", "an integer", src_size, minimum=4)
    tie = hf.get("tie_word_embeddings", "true or false", True)
    separate = tok.get("separate_vocabs", "true or false", False)
    languages = (tok.get("source_lang", "a string") or "src", tok.get("target_lang", "a string") or "tgt")
    renormalize = gen.get("renormalize_logits", "true or false", False)

    # Every size config.json gives is checked against the weights' shapes (their header) before anything
    # of that size is built: the vocabulary permutations below, the model.
    weights_path = weight_file(folder)
    shapes = _safetensors_shapes(weights_path) if weights_path.suffix == ".safetensors" else None
    weights = None
    if shapes is None:  # pytorch_model.bin (or a broken header): its tensors, as they are
        weights = _read_weights(folder)
        shapes = {k: tuple(v.shape) for k, v in weights.items()}
    check_config_against_weights(config_path, model_cfg, src_size, tgt_size,
                                 "vocab_size" if shared else "decoder_vocab_size", shapes, weights_path)

    src_table = _read_json(folder / "vocab.json", MAX_VOCAB_BYTES, "vocabulary")
    if separate and not (folder / "target_vocab.json").exists():
        raise MtkitError(f"{folder}: no target_vocab.json (tokenizer_config.json sets separate_vocabs)")
    tgt_table = _read_json(folder / "target_vocab.json", MAX_VOCAB_BYTES, "vocabulary") if separate else src_table
    src_order, src_pieces = _permutation(src_table, src_size, pad, eos, folder / "vocab.json", start)
    tgt_order, tgt_pieces = _permutation(tgt_table, tgt_size, pad, eos,
                                         folder / ("target_vocab.json" if separate else "vocab.json"), start)
    src_bytes = read_bounded(folder / "source.spm", MAX_VOCAB_BYTES, "SentencePiece model")
    tgt_bytes = read_bounded(folder / "target.spm", MAX_VOCAB_BYTES, "SentencePiece model")

    if weights is None:
        weights = _read_weights(folder)

    def get(*names: str):
        for name in names:
            if name in weights:
                return weights[name]
        raise MtkitError(f"{folder}: the weights have no '{names[0]}'")

    src_emb = get("encoder.embed_tokens.weight", "shared.weight")
    tgt_emb = get("decoder.embed_tokens.weight", "shared.weight")
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
    if start == pad:  # the extra PAD slot (and, renormalized, the start's) takes no probability
        bias[PAD_ID] = LOGIT_FLOOR
        if renormalize:
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
            for hf_attn, mt_attn, hf_norm in parts:
                for hf_p, mt_p in (("q_proj", "w_q"), ("k_proj", "w_k"), ("v_proj", "w_v"), ("out_proj", "w_o")):
                    for t in ("weight", "bias"):
                        new[f"{mt_l}.{mt_attn}.{mt_p}.{t}"] = get(f"{hf_l}.{hf_attn}.{hf_p}.{t}")
                for t in ("weight", "bias"):
                    new[f"{mt_l}.{mt_attn}_norm.{t}"] = get(f"{hf_l}.{hf_norm}.{t}")
            for t in ("weight", "bias"):
                new[f"{mt_l}.feed_forward.w_1.{t}"] = get(f"{hf_l}.fc1.{t}")
                new[f"{mt_l}.feed_forward.w_2.{t}"] = get(f"{hf_l}.fc2.{t}")
                new[f"{mt_l}.feed_forward_norm.{t}"] = get(f"{hf_l}.final_layer_norm.{t}")
        if model_cfg.norm == "pre":  # Pegasus: the stack's last LayerNorm
            for t in ("weight", "bias"):
                new[f"{side}.norm.{t}"] = get(f"{side}.layer_norm.{t}")
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

    pieces = {"src": src_pieces, "tgt": tgt_pieces if separate else None}
    for name, model_bytes in (("source.spm", src_bytes), ("target.spm", tgt_bytes)):
        try:
            Vocab.from_bytes(model_bytes, None, pieces)
        except MtkitError as e:
            raise MtkitError(f"{folder / name}: {str(e).split(': ', 1)[-1]}") from None
    try:
        config = config_from_dict({"model": config_to_dict(model_cfg), "decode": config_to_dict(decode),
                                   "data": {"src_lang": languages[0], "tgt_lang": languages[1]}})
    except MtkitError as e:
        raise MtkitError(f"{tok_path}: {e}") from None
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    early = gen.choice("early_stopping", (False, True, "never"))
    if early is not True and decode.beam > 1:
        logger.info(f"note: {gen.where('early_stopping').name}: early_stopping is {early!r}; mtkit's beam search "
                    "stops a sentence once it holds `beam` finished hypotheses (early_stopping=True)")
    return Imported(config=config, state=state, vocab={"src": src_bytes, "tgt": tgt_bytes, "pieces": pieces},
                    src_vocab_size=V_src, tgt_vocab_size=V_tgt, source=str(folder))
