"""Typed, frozen configuration and one strict YAML loader.

A recipe is a YAML mapping with the sections ``data``, ``model``, ``train``,
``decode`` (and an optional ``expected`` block that documents the score a
recipe should reach). Every key is checked: an unknown or misspelt key is an
error that names its dotted path and the closest valid key; a value of the
wrong type is an error that names the key and the expected type. Command-line
overrides (``train.max_steps=100``) pass through the same check.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

from mtkit.errors import MtkitError

# Special token ids, fixed for every SentencePiece model mtkit trains
# (and required of a model passed in with ``data.spm.model``).
PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class SourceConfig:
    """Where one split's parallel text comes from.

    kind:
      files -- two plain-text files (``src``, ``tgt``), one sentence per line, optionally .gz
      tsv   -- one file (``path``), ``source<TAB>target`` per line, optionally .gz
      hf    -- a Hugging Face dataset (``name``: hub name or local folder; ``config``;
               ``split``), either the hub's ``translation`` layout or two flat
               columns (``src_field``, ``tgt_field``)
      demo  -- the built-in synthetic corpus (English number words -> German)
    """

    kind: Literal["files", "tsv", "hf", "demo"] = "files"
    src: Optional[str] = None
    tgt: Optional[str] = None
    path: Optional[str] = None
    name: Optional[str] = None
    config: Optional[str] = None
    split: Optional[str] = None
    src_field: Optional[str] = None
    tgt_field: Optional[str] = None
    streaming: bool = False
    size: int = 20000
    seed: int = 1


@dataclass(frozen=True)
class CleanConfig:
    """Cleaning rules applied to training pairs (each can be switched off)."""

    strip: bool = True
    drop_empty: bool = True
    remove_control: bool = True
    nfkc: bool = False
    max_len: int = 250  # SentencePiece tokens per side; 0 disables
    max_ratio: float = 3.0  # longer/shorter side, in tokens; 0 disables
    dedup: bool = False
    invalid_utf8: Literal["error", "skip"] = "error"


@dataclass(frozen=True)
class SpmConfig:
    """SentencePiece: joint (the paper's shared vocabulary) or separate models."""

    joint: bool = True
    model_type: Literal["bpe", "unigram"] = "bpe"
    vocab_size: int = 8000
    character_coverage: float = 1.0
    lowercase: bool = False  # case-fold inside the model (SentencePiece's nmt_nfkc_cf), as the
    # Multi30k and IWSLT literature's lowercased training data; outputs are then lowercase
    sample_size: int = 1_000_000  # sentences sampled for training; bounds memory
    model: Optional[str] = None  # reuse this model (joint) instead of training one
    tgt_model: Optional[str] = None  # reuse this target model (separate vocabularies)


@dataclass(frozen=True)
class DataConfig:
    src_lang: str = "en"
    tgt_lang: str = "de"
    train: Optional[SourceConfig] = None
    valid: Optional[SourceConfig] = None
    test: Optional[SourceConfig] = None
    clean: CleanConfig = field(default_factory=CleanConfig)
    spm: SpmConfig = field(default_factory=SpmConfig)
    workers: int = 0  # encoding processes; 0 = one per core


# -------------------------------------------------------------------------- model


@dataclass(frozen=True)
class ModelConfig:
    """The Transformer's shape (§3, Table 3). ``preset`` fills the defaults."""

    preset: Optional[str] = None
    d_model: int = 512
    h: int = 8
    d_ff: int = 2048
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    norm: Literal["post", "pre"] = "post"
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"
    max_positions: int = 1024
    share_embeddings: Literal["all", "decoder", "none"] = "all"
    layer_norm_eps: float = 1e-5


PRESETS: dict[str, dict[str, Any]] = {
    # Table 3, row "base".
    "transformer-base": dict(d_model=512, h=8, d_ff=2048, encoder_layers=6, decoder_layers=6, dropout=0.1),
    # Table 3, row "big"; dropout 0.3 for en-de (§6.1), 0.1 for en-fr.
    "transformer-big": dict(d_model=1024, h=16, d_ff=4096, encoder_layers=6, decoder_layers=6, dropout=0.3),
    # fairseq's transformer_iwslt_de_en.
    "transformer-iwslt": dict(d_model=512, h=4, d_ff=1024, encoder_layers=6, decoder_layers=6, dropout=0.3),
    # Wu et al. (2021), the Multi30k text-only baseline.
    "transformer-tiny": dict(d_model=128, h=4, d_ff=256, encoder_layers=4, decoder_layers=4, dropout=0.3),
}


# -------------------------------------------------------------------------- train


@dataclass(frozen=True)
class TrainConfig:
    max_tokens: int = 4096  # padded tokens per batch (the larger of source and target)
    update_freq: int = 1  # batches accumulated per update
    processes: int = 1  # local DDP ranks that `mtkit train`/`run` start through torchrun (ignored under torchrun)
    ensemble: int = 1  # independent models (seeds seed, seed+1, …) in RUN, RUN-2, …; `mtkit run` decodes with all
    max_steps: int = 100_000
    max_epochs: int = 0  # 0 = no limit
    max_minutes: float = 0.0  # wall-time limit; 0 = no limit
    lr_schedule: Literal["noam", "inverse_sqrt", "linear"] = "noam"
    warmup: int = 4000
    lr: float = 5e-4  # peak learning rate of inverse_sqrt and linear
    lr_scale: float = 1.0  # factor on the paper's (noam) schedule
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    weight_decay: float = 0.0
    clip_norm: float = 0.0  # 0 = no clipping
    label_smoothing: float = 0.1
    bpe_dropout: float = 0.0  # BPE-dropout of training sentences (Provilkov et al. 2020); 0 = off
    rdrop_alpha: float = 0.0  # R-Drop's consistency weight α (Liang et al. 2021); 0 = off, 5 in their MT runs
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    compile: bool = False
    seed: int = 1
    log_every: int = 50
    valid_every: int = 1000  # validation loss; 0 = never
    bleu_every: int = 0  # validation BLEU (greedy or beam); 0 = never
    bleu_beam: int = 1
    save_every: int = 1000  # steps; 0 = only at the end
    save_every_minutes: float = 0.0
    keep_last: int = 5
    best_metric: Literal["bleu", "loss"] = "loss"
    patience: int = 0  # validations without improvement before stopping; 0 = never
    average_last: int = 0  # average the last N checkpoints at the end of training
    tensorboard: bool = False


# ------------------------------------------------------------------------- decode


@dataclass(frozen=True)
class DecodeConfig:
    beam: int = 4  # §6.1
    alpha: float = 0.6  # length penalty exponent (§6.1: GNMT's, α = 0.6)
    length_penalty: Literal["gnmt", "power"] = "gnmt"  # gnmt: ((5+L)/6)^α (§6.1); power: L^α (fairseq --lenpen, Marian --normalize)
    max_len_a: float = 1.0  # maximum output length = a * source length + b (§6.1: +50)
    max_len_b: int = 50
    nbest: int = 1
    batch_tokens: int = 4000
    max_input_len: int = 1000  # longer inputs are truncated with a warning
    no_repeat_ngram_size: int = 0
    sampling: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0


@dataclass(frozen=True)
class EvalConfig:
    """How ``mtkit run`` scores a recipe's test split (cased detokenized sacreBLEU first)."""

    metrics: tuple[str, ...] = ("bleu", "chrf", "ter")
    lc_tok_ref: Optional[str] = None  # official lowercased tokenized references: also report lc-tok BLEU
    compound_split: bool = False  # also the WMT14 en-de paper's tokenized BLEU with compound splitting
    testset: Optional[str] = None  # a sacrebleu test set (e.g. wmt14/full) instead of the test split
    langpair: Optional[str] = None
    examples: int = 5  # example translations to print


@dataclass(frozen=True)
class ExpectedConfig:
    """What a recipe should reach, for the record (not used by training)."""

    score: Optional[float] = None
    metric: Optional[str] = None
    source: Optional[str] = None
    testset: Optional[str] = None
    hardware: Optional[str] = None
    notes: Optional[str] = None


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    expected: ExpectedConfig = field(default_factory=ExpectedConfig)


# ------------------------------------------------------------------------- loader


def _closest(key: str, valid: typing.Iterable[str]) -> str:
    match = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.0)
    return f" (did you mean '{match[0]}'?)" if match else ""


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, path: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return the typed value."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, path)
            except MtkitError as e:
                errors.append(e)
        raise errors[0] if len(errors) == 1 else MtkitError(f"{path}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise MtkitError(f"{path}: expected one of {_type_name(tp)}, got {value!r}")
        return value
    if origin is tuple and len(typing.get_args(tp)) == 2 and typing.get_args(tp)[1] is Ellipsis:
        item = typing.get_args(tp)[0]
        if not isinstance(value, (list, tuple)):
            raise MtkitError(f"{path}: expected a list, got {value!r}")
        return tuple(_convert(v, item, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise MtkitError(f"{path}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_convert(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise MtkitError(f"{path}: expected a mapping, got {value!r}")
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise MtkitError(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise MtkitError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MtkitError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise MtkitError(f"{path}: expected a string, got {value!r}")
        return str(value)
    raise TypeError(f"unsupported config type {tp!r} at {path}")  # a bug, not a user error


def _build(cls: type, raw: dict, path: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    if cls is ModelConfig and raw.get("preset") is not None:
        preset = raw["preset"]
        if preset not in PRESETS:
            raise MtkitError(f"{path}.preset: unknown preset {preset!r}{_closest(str(preset), PRESETS)}")
        raw = {**PRESETS[preset], **raw}
    for key, value in raw.items():
        dotted = f"{path}.{key}" if path else str(key)
        if key not in names:
            raise MtkitError(f"unknown config key '{dotted}'{_closest(str(key), names)}")
        kwargs[key] = _convert(value, hints[key], dotted)
    return cls(**kwargs)


def config_from_dict(raw: dict | None) -> Config:
    """Build a checked :class:`Config` from plain data (e.g. parsed YAML)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise MtkitError("config: the top level must be a mapping of sections")
    config = _build(Config, raw)
    _validate(config)
    return config


def _validate(config: Config) -> None:
    m = config.model
    if m.d_model % m.h:
        raise MtkitError(f"model.d_model ({m.d_model}) must be divisible by model.h ({m.h})")
    for name in ("d_model", "h", "d_ff", "encoder_layers", "decoder_layers", "max_positions"):
        if getattr(m, name) <= 0:
            raise MtkitError(f"model.{name} must be positive")
    t = config.train
    for name in ("max_tokens", "update_freq", "processes", "ensemble"):
        if getattr(t, name) <= 0:
            raise MtkitError(f"train.{name} must be positive")
    if t.rdrop_alpha < 0:
        raise MtkitError(f"train.rdrop_alpha must be >= 0, got {t.rdrop_alpha}")
    if not 0.0 <= t.bpe_dropout < 1.0:
        raise MtkitError(f"train.bpe_dropout must be in [0, 1), got {t.bpe_dropout}")
    if t.lr_schedule == "linear" and t.max_steps <= t.warmup:
        raise MtkitError(f"train.lr_schedule=linear decays to 0 at train.max_steps ({t.max_steps}), "
                         f"which must exceed train.warmup ({t.warmup})")
    if config.decode.beam < 1 or config.decode.nbest < 1 or config.decode.nbest > config.decode.beam:
        raise MtkitError("decode: need 1 <= decode.nbest <= decode.beam")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``'train.max_steps=100'`` -> (['train', 'max_steps'], 100); values are YAML."""
    import yaml

    if "=" not in text:
        raise MtkitError(f"override '{text}': expected KEY=VALUE, e.g. train.max_steps=100")
    key, value = text.split("=", 1)
    try:
        parsed = yaml.safe_load(value) if value != "" else None
    except yaml.YAMLError:
        parsed = value
    return key.strip().split("."), parsed


def apply_overrides(raw: dict, overrides: typing.Sequence[str]) -> dict:
    """Return a copy of ``raw`` with each ``KEY=VALUE`` override set."""
    import copy

    raw = copy.deepcopy(raw) if raw else {}
    for text in overrides:
        keys, value = parse_override(text)
        node = raw
        for k in keys[:-1]:
            if not isinstance(node.get(k), dict):
                node[k] = {}
            node = node[k]
        node[keys[-1]] = value
    return raw


def read_yaml(path: str | Path) -> dict:
    """Read a YAML mapping with ``yaml.safe_load``; errors name the file and line."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MtkitError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise MtkitError(f"{path}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise MtkitError(f"{path}:{where}: malformed YAML: {problem}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise MtkitError(f"{path}: expected a mapping of sections (data, model, train, decode)")
    return raw


def load_config(path: str | Path | None, overrides: typing.Sequence[str] = ()) -> Config:
    """Load a recipe (or the defaults when ``path`` is None) and apply overrides."""
    raw = read_yaml(path) if path is not None else {}
    try:
        return config_from_dict(apply_overrides(raw, overrides))
    except MtkitError as e:
        where = f"{path}: " if path is not None else ""
        raise MtkitError(f"{where}{e}") from None


def config_to_dict(config: Any) -> dict:
    """Plain data (tuples become lists) for YAML/JSON/checkpoints."""

    def plain(value: Any) -> Any:
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return plain(dataclasses.asdict(config))


def save_config(config: Config, path: str | Path) -> None:
    """Write the resolved config as YAML, atomically."""
    import yaml

    from mtkit.io import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(config_to_dict(config), sort_keys=False))


def override_section(value: Any, section: str, changes: dict) -> Any:
    """A copy of one config section (e.g. ``decode``) with ``changes``, through the recipe's strict checks."""
    if not changes:
        return value
    return getattr(config_from_dict({section: {**config_to_dict(value), **changes}}), section)
