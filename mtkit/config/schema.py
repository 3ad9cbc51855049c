"""The configuration's schema: typed, frozen dataclasses (``data``, ``model``, ``train``, ``decode``,
``eval``, ``expected``), the special token ids, the presets, and the range of every setting (checked
once a config is built, by :func:`validate`)."""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from mtkit.errors import MtkitError, shown


class ConfigError(MtkitError):
    """A bad config value; ``key`` is its dotted path (``train.lr``), so that the loader can say
    where the value came from (the recipe file, a ``--set`` or a command-line flag)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem

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
    src: str | None = None
    tgt: str | None = None
    path: str | None = None
    name: str | None = None
    config: str | None = None
    split: str | None = None
    src_field: str | None = None
    tgt_field: str | None = None
    streaming: bool = False
    size: int = 20000
    seed: int = 1


@dataclass(frozen=True)
class LangIdFilter:
    """Drop a pair whose source or target is identified as another language (lingua, mtkit[clean])."""

    languages: tuple[str, ...] = ("en", "fr", "de", "es", "it", "pt", "nl", "ru", "zh", "ja")  # the candidates
    # besides the pair's own two (ISO 639-1): a line is only told apart from the languages it is compared with
    min_chars: int = 10  # a side with fewer letters is kept unjudged (too short to tell)
    accuracy: Literal["high", "low"] = "high"  # lingua's modes: low is about 3.5x faster, worse on short lines


@dataclass(frozen=True)
class AlphaFilter:
    """Drop a pair where a side's share of letters among its non-space characters is under ``min``."""

    min: float = 0.5


@dataclass(frozen=True)
class RepeatFilter:
    """Drop a pair where a side repeats a word more than ``max`` times in a row."""

    max: int = 4


@dataclass(frozen=True)
class CopyFilter:
    """Drop a pair whose target is its source (case, spaces and punctuation aside) with at least ``min_chars``
    letters and digits (shorter ones, names and numbers, are often right)."""

    min_chars: int = 1


@dataclass(frozen=True)
class Switch:
    """A filter without settings: present (``{}``) is on."""


@dataclass(frozen=True)
class DualXentFilter:
    """Dual conditional cross-entropy filtering (Junczys-Dowmunt 2018): ``mtkit score``'s output for the pairs
    of ``data.train`` under a forward model (``forward``) and a backward one (``backward``, its --src the target
    file): keep the ``keep`` share of pairs with the best score |H_f - H_b| + (H_f + H_b) / 2."""

    forward: str = ""
    backward: str = ""
    keep: float = 0.9


@dataclass(frozen=True)
class FiltersConfig:
    """The filters training pairs go through after normalization (``data.clean.filters``); each is off unless
    given, with ``{}`` for its default settings. In the order they run:"""

    nonprinting: Switch | None = None  # private-use, unassigned, format or replacement characters (U+FFFD)
    alpha: AlphaFilter | None = None
    repeats: RepeatFilter | None = None
    copy: CopyFilter | None = None
    numbers: Switch | None = None  # the two sides' numbers (digit runs, separators aside) differ
    urls: Switch | None = None  # the two sides' URLs and e-mail addresses differ
    langid: LangIdFilter | None = None
    dual_xent: DualXentFilter | None = None


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
    filters: FiltersConfig | None = None  # more filters (None: the rules above only)
    examples: int = 3  # dropped pairs the report shows for each rule and filter
    warn_share: float = 0.2  # a rule or filter that drops more than this share of the pairs read warns


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
    model: str | None = None  # reuse this model (joint) instead of training one
    tgt_model: str | None = None  # reuse this target model (separate vocabularies)
    vocab_from: str | None = None  # a checkpoint or run directory: encode with its SentencePiece model(s),
    # as a run that starts from it (train.init_from) needs; instead of training one (or model/tgt_model)


@dataclass(frozen=True)
class PairConfig:
    """One language pair of a multilingual model (``data.pairs``): its sources, as a single-pair
    recipe's ``data.train`` / ``valid`` / ``test``, and its share of the training mixture."""

    src_lang: str = ""
    tgt_lang: str = ""
    train: SourceConfig | None = None
    valid: SourceConfig | None = None
    test: SourceConfig | None = None
    weight: float | None = None  # sampling weight; none on every pair: temperature over sizes
    # (train.pair_temperature); given, it must be given on every pair
    lc_tok_ref: str | None = None  # the official lowercased tokenized test references (as eval.lc_tok_ref)


@dataclass(frozen=True)
class CorpusConfig:
    """One training corpus of a single pair's recipe (``data.corpora``): e.g. the original data and
    back-translated data, each with its share of every epoch, sampled as ``data.pairs`` are."""

    name: str = ""  # for the report, the manifest and the training log
    train: SourceConfig | None = None
    weight: float = 1.0  # the corpora's shares of each epoch are their weights, normalized
    tag: str | None = None  # a piece that leads each source of this corpus (tagged back-translation, Caswell et
    # al. 2019: "<BT>"), reserved whole in SentencePiece; translation inputs never carry it


@dataclass(frozen=True)
class DataConfig:
    src_lang: str = "en"
    tgt_lang: str = "de"
    train: SourceConfig | None = None
    valid: SourceConfig | None = None
    test: SourceConfig | None = None
    clean: CleanConfig = field(default_factory=CleanConfig)
    spm: SpmConfig = field(default_factory=SpmConfig)
    workers: int = 0  # encoding processes; 0 = one per core
    # Several pairs in one model, each source sentence led by its target language's tag <2xx>
    # (Johnson et al. 2017); empty: the single pair above (src_lang, tgt_lang, train, valid, test).
    pairs: tuple[PairConfig, ...] = ()
    # Where the tag goes: "source", the source's first token (Johnson et al. 2017); "target", the
    # decoder's first token in place of BOS (fairseq's --decoder-langtok); "codes", NLLB's and M2M100's (an
    # imported model's): the source language's code leads the source, the decoder reads BOS then the target's
    # code (mtkit.data.languages.CodedVocab). Only with data.pairs.
    tag_side: str = "source"
    # Word alignments of the training pairs, stored beside them for train.guided_alignment: "eflomal" computes
    # them (mtkit.data.alignments; pip install 'mtkit[align]'), a path reads them (Pharaoh, a line per pair of
    # data.train); None: none. A single pair's recipe only.
    alignments: str | None = None
    # Several training corpora of the one pair, each with a weight (and optionally a tag), instead of data.train.
    corpora: tuple[CorpusConfig, ...] = ()


# -------------------------------------------------------------------------- model


@dataclass(frozen=True)
class ModelConfig:
    """The Transformer's shape (§3, Table 3). ``preset`` fills the defaults."""

    preset: str | None = None
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
    # Deviations from the paper that imported models need (mtkit.importers.marian); each default is the paper's.
    activation: Literal["relu", "swish", "gelu"] = "relu"  # the FFN's (§3.3: ReLU; Marian's OPUS-MT: swish = SiLU)
    output_bias: bool = False  # a bias on the pre-softmax projection (Marian's final_logits_bias)
    scale_embedding: bool = True  # token embeddings × √d_model (§3.4); false: unscaled
    sinusoid_layout: Literal["interleaved", "concatenated", "fairseq"] = "interleaved"  # §3.5's sin/cos pairs, or
    # all sines then all cosines (Marian, tensor2tensor), or fairseq's (M2M100, NLLB: concatenated, frequencies
    # 10000^(-i/(d_model/2 - 1)), positions numbered from 2)


PRESETS: dict[str, dict[str, Any]] = {
    # Table 3, row "base".
    "transformer-base": dict(d_model=512, h=8, d_ff=2048, encoder_layers=6, decoder_layers=6, dropout=0.1),
    # Table 3, row "big"; dropout 0.3 for en-de (§6.1), 0.1 for en-fr.
    "transformer-big": dict(d_model=1024, h=16, d_ff=4096, encoder_layers=6, decoder_layers=6, dropout=0.3),
    # fairseq's transformer_iwslt_de_en.
    "transformer-iwslt": dict(d_model=512, h=4, d_ff=1024, encoder_layers=6, decoder_layers=6, dropout=0.3),
    # Wu et al. (2021), the Multi30k text-only baseline.
    "transformer-tiny": dict(d_model=128, h=4, d_ff=256, encoder_layers=4, decoder_layers=4, dropout=0.3),
    # Students for sequence-level distillation (Kim & Rush 2016): a deep encoder and a shallow decoder
    # (Kasai et al. 2021), whose decoder runs once per output token; Bergamot's (mozilla/translations)
    # "base" and "tiny" student shapes, with standard self-attention where theirs has an SSRU.
    "transformer-student-base": dict(d_model=512, h=8, d_ff=2048, encoder_layers=6, decoder_layers=2, dropout=0.1),
    "transformer-student-tiny": dict(d_model=256, h=8, d_ff=1536, encoder_layers=6, decoder_layers=2, dropout=0.1),
}


# -------------------------------------------------------------------------- train


Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = typing.get_args(Precision)


@dataclass(frozen=True)
class GuidedAlignmentConfig:
    """Guided-alignment training (Garg et al. 2019): the cross-entropy between one cross-attention head and the
    training pairs' word alignments (``data.alignments``), times ``weight``, added to the loss."""

    weight: float = 0.0  # λ; 0 = off (Garg et al.: 0.05)
    layer: int = -2  # the decoder layer (negative: from the end; Garg et al.: the penultimate)
    head: int = 0  # the head of that layer trained to align


@dataclass(frozen=True)
class AugmentConfig:
    """Training-time augmentation (``train.augment``; mtkit.training.augment): each a probability per training
    pair read; all 0 = off. Validation and test data are never augmented."""

    upper: float = 0.0  # both sides in UPPER CASE
    title: float = 0.0  # both sides in Title Case (upper + title <= 1: at most one of the two)
    typos: float = 0.0  # character typos on the source ...
    typo_rate: float = 0.05  # ... each letter with this probability
    merge: float = 0.0  # joined with another training pair drawn at random
    copy_noise: float = 0.0  # replaced by random words, the same on both sides

    @property
    def on(self) -> bool:
        return any((self.upper, self.title, self.typos, self.merge, self.copy_noise))


@dataclass(frozen=True)
class TrainConfig:
    max_tokens: int = 4096  # padded tokens per batch (the larger of source and target)
    update_freq: int = 1  # batches accumulated per update
    processes: int = 1  # local DDP ranks that `mtkit train`/`run` start through torchrun (ignored under torchrun);
    # with train.nodes > 1, the ranks on each machine
    nodes: int = 1  # machines, one `mtkit train --node-rank R --rdzv-endpoint HOST:PORT` on each (docs/training.md);
    # `mtkit train --nnodes` overrides it; ignored under torchrun
    sync_check: int = 1000  # updates between two checks that every DDP rank holds the same weights (a checksum of
    # their bits, compared across ranks: mtkit.training.sync); 0 = off; no cost in one process
    ensemble: int = 1  # independent models (seeds seed, seed+1, …) in RUN, RUN-2, …; `mtkit run` decodes with all
    max_steps: int = 100_000
    max_epochs: int = 0  # 0 = no limit
    max_minutes: float = 0.0  # wall-time limit; 0 = no limit
    lr_schedule: Literal["noam", "inverse_sqrt", "linear"] = "noam"
    warmup: int = 4000  # 0 = none: the peak rate from the first step (mtkit.training.optim)
    lr: float = 5e-4  # peak learning rate of inverse_sqrt and linear
    lr_scale: float = 1.0  # factor on the paper's (noam) schedule
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    weight_decay: float = 0.0
    clip_norm: float = 0.0  # 0 = no clipping
    label_smoothing: float = 0.1
    bpe_dropout: float = 0.0  # BPE-dropout of training sentences (Provilkov et al. 2020); 0 = off
    rdrop_alpha: float = 0.0  # R-Drop's consistency weight α (Liang et al. 2021); 0 = off, 5 in their MT runs
    guided_alignment: GuidedAlignmentConfig = field(default_factory=GuidedAlignmentConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    ema_decay: float = 0.0  # an exponential moving average of the weights (mtkit.training.ema), saved as
    # checkpoints/ema.pt; 0 = off (fairseq --ema-decay 0.9999)
    ema_every: int = 1  # updates between two moves of the average (fairseq --ema-update-freq)
    precision: Precision = "fp32"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    compile: bool = False
    seed: int = 1
    log_every: int = 50
    valid_every: int = 1000  # validation loss; 0 = never
    bleu_every: int = 0  # validation BLEU (greedy or beam); 0 = never
    bleu_beam: int = 1
    valid_metrics: tuple[str, ...] = ("bleu",)  # what bleu_every translates the validation set for: bleu, and
    # optionally chrf and comet (COMET of valid_comet_model, mtkit.metrics.comet; slow on a CPU; mtkit[comet])
    valid_comet_model: str = "Unbabel/wmt22-comet-da"  # with comet in valid_metrics: a hub name or a folder
    save_every: int = 1000  # steps; 0 = only at the end
    save_every_minutes: float = 0.0
    keep_last: int = 5
    best_metric: Literal["bleu", "loss"] = "loss"
    best_pair: str = "mean"  # with data.pairs: the pair (e.g. en-de) whose validation picks best.pt, or
    # mean: the mean over the pairs
    pair_temperature: float = 1.0  # with data.pairs: pair i is sampled with p_i ∝ n_i^(1/T) (T = 1:
    # proportional to its size; larger: flatter), unless data.pairs sets weights
    patience: int = 0  # validations without improvement before stopping; 0 = never
    average_last: int = 0  # average the last N checkpoints at the end of training
    tensorboard: bool = False
    # Fine-tuning (mtkit.training.finetune): a new run starts from this checkpoint's (or run directory's)
    # weights, with a fresh optimizer, schedule, step counter and data order; resuming ignores it.
    init_from: str | None = None
    init_keep_optimizer: bool = False  # with init_from: start from its Adam moments too (the schedule still restarts)
    init_sha256: str | None = None  # init_from's file SHA-256: mtkit records it; set, it must match


# ------------------------------------------------------------------------- decode


# Ranges of decode keys beyond which the arithmetic breaks (a length penalty or a length that overflows,
# sampling logits scaled to inf or 0); far wider than anything used in practice.
MAX_ALPHA = 10.0
MAX_LEN_A = 1000.0
TEMPERATURE_RANGE = (0.01, 100.0)

# The largest value of each integer setting, checked with the rest (validate) before any work starts, so
# that a value from a flag, a recipe, an imported model's generation_config.json or an export's mtkit.json
# is one error line and never an allocation of its size. Each is far beyond any real use.
MAX_BEAM = 1024  # hypotheses per sentence (and n-best lists, samples): papers go to a few hundred at most
MAX_LENGTH = 1 << 16  # tokens in an input or output sentence (max_len_b, max_input_len, clean.max_len)
MAX_BATCH_TOKENS = 1 << 24  # tokens in a training or decoding batch: far beyond any GPU's memory
MAX_VOCAB = 1 << 20  # SentencePiece pieces (and top_k): multilingual models have ~250,000
MAX_COUNT = 1 << 30  # steps, epochs, intervals, sizes: counters that only need to fit their arithmetic
MAX_SAMPLE = 100_000_000  # sentences held in memory to train SentencePiece on (data.spm.sample_size)
MAX_PROCESSES = 1024  # worker processes, DDP ranks, ensemble members
MAX_CHECKPOINTS = 1000  # checkpoints kept (keep_last) or averaged (average_last): each one a model in memory
MAX_SEED = 2**32 - 1 - MAX_PROCESSES  # numpy's seeds are 32-bit; an ensemble adds its member's index


@dataclass(frozen=True)
class DecodeConfig:
    beam: int = 4  # §6.1
    alpha: float = 0.6  # length penalty exponent (§6.1: GNMT's, α = 0.6), in [0, MAX_ALPHA] (fairseq's
    # --lenpen and Marian's --normalize are used between 0 and 2; far above, lp overflows a float)
    length_penalty: Literal["gnmt", "power"] = "gnmt"  # gnmt: ((5+L)/6)^α (§6.1); power: L^α (fairseq
    # --lenpen, Marian --normalize)
    max_len_a: float = 1.0  # maximum output length = a * source length + b (§6.1: +50); a <= MAX_LEN_A
    max_len_b: int = 50
    min_len: int = 0  # EOS banned before this many output tokens (fairseq's --min-len, CTranslate2's
    # min_decoding_length, Hugging Face's min_new_tokens); 0: off. At the maximum length EOS is forced all the same
    forced_eos: Literal["logprob", "zero"] = "logprob"  # what the EOS forced at the maximum length adds to a
    # hypothesis's log-probability: its own (fairseq) or 0 (Hugging Face's forced_eos_token_id; imported models)
    nbest: int = 1
    batch_tokens: int = 4000
    max_input_len: int = 1000  # longer inputs are truncated with a warning
    no_repeat_ngram_size: int = 0
    sampling: bool = False
    temperature: float = 1.0  # in TEMPERATURE_RANGE: far outside it the scaled logits overflow or vanish
    top_k: int = 0
    top_p: float = 1.0
    epsilon: float = 0.0  # with sampling: tokens below this probability dropped (epsilon sampling, Hewitt et al.
    # 2022; Freitag et al. 2023 draw MBR's candidates with 0.02); 0: off
    mbr: Literal["off", "chrf", "bleu", "comet"] = "off"  # minimum-Bayes-risk decoding's utility
    # (mtkit.engines.mbr): the candidate of the highest expected chrF / BLEU / COMET against the others
    mbr_candidates: int = 8  # with mbr: hypotheses searched (the beam widened to as many) or samples drawn
    mbr_comet_model: str = "Unbabel/wmt22-comet-da"  # with mbr comet: a reference-based COMET model (hub name
    # or folder; mtkit.metrics.comet)
    alignments: Literal["off", "hard", "soft"] = "off"  # word alignments of each output (mtkit.data.word_alignment):
    # hard, one source word per target word; soft, every pair of weight >= alignment_threshold
    alignment_layer: int | None = None  # the decoder layer whose mean cross-attention aligns (negative: from the
    # end); None: the guided-alignment head of a model trained with one, else the penultimate layer
    alignment_threshold: float = 0.5  # with soft alignments: the least weight of a pair, in (0, 1]
    split: Literal["sentences", "none"] = "sentences"  # a line's sentences translated one by one and joined with
    # the line's own whitespace (mtkit.text.pipeline); none: a line is one sentence
    guard: bool = True  # the integrity guard (mtkit.text.guard): a sentence whose translation lacks a number, URL,
    # e-mail address or placeholder of its source is searched again with it forced; a repetition loop, again
    # without repeating 3-grams; what still fails is reported
    shortlist: bool = False  # a vocabulary shortlist per sentence (RUN/shortlist.txt, built by mtkit shortlist): the
    # output projection computed for the target pieces the sentence's source pieces translate to, the most frequent
    # ones and its own pieces only (mtkit.shortlist; torch engine, and CTranslate2's use_vmap, per batch)


@dataclass(frozen=True)
class EvalConfig:
    """How ``mtkit run`` scores a recipe's test split (cased detokenized sacreBLEU first)."""

    metrics: tuple[str, ...] = ("bleu", "chrf", "ter")
    lc_tok_ref: str | None = None  # official lowercased tokenized references: also report lc-tok BLEU
    compound_split: bool = False  # also the WMT14 en-de paper's tokenized BLEU with compound splitting
    testset: str | None = None  # a sacrebleu test set (e.g. wmt14/full) instead of the test split
    langpair: str | None = None
    examples: int = 5  # example translations to print


@dataclass(frozen=True)
class ExpectedConfig:
    """What a recipe should reach, for the record (not used by training)."""

    score: float | None = None
    metric: str | None = None
    source: str | None = None
    testset: str | None = None
    hardware: str | None = None
    notes: str | None = None


@dataclass(frozen=True)
class DistillConfig:
    """Sequence-level knowledge distillation (Kim & Rush 2016; mtkit.training.distill): ``mtkit run`` translates
    ``data.train``'s sources with the teacher and trains this recipe's model (the student) on the result, with
    the teacher's SentencePiece model."""

    teacher: tuple[str, ...] = ()  # checkpoints or run directories (several: an ensemble teacher); () = off
    shard_lines: int = 10_000  # sources translated per shard, each written whole: a killed run redoes one
    filter_share: float = 0.0  # drop this share of distilled pairs, those of the highest teacher cross-entropy per
    # token (mozilla/translations' cefilter; it drops 5%)
    mix_original: bool = False  # train the student on the original pairs too (after the distilled ones)
    # The engine table mtkit run prints after a distillation: full (each figure the fastest of 1 and 2 threads,
    # OpenMP's wait policy as it is and PASSIVE: 4 processes), quick (1 thread, the policy as it is), off.
    engine_table: Literal["full", "quick", "off"] = "full"


@dataclass(frozen=True)
class ShortlistConfig:
    """A vocabulary shortlist (mtkit.shortlist; ``mtkit shortlist RUN`` builds one with these settings, ``mtkit run``
    after training when ``build`` is true): the target pieces each source piece co-occurs with most in the training
    pairs, the most frequent target pieces, and a sentence's own pieces; used by ``decode.shortlist``."""

    build: bool = False  # mtkit run builds RUN/shortlist.txt after training
    per_source: int = 64  # candidates kept per source piece (the most likely given it, the frequent ones aside)
    frequent: int = 256  # the most frequent target pieces, candidates for every sentence
    max_pairs: int = 1_000_000  # training pairs counted at most (a sample, seeded, of a larger corpus)


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    expected: ExpectedConfig = field(default_factory=ExpectedConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    shortlist: ShortlistConfig = field(default_factory=ShortlistConfig)
    # Fast paths (auto: chosen by device, dtype and shape, see mtkit/kernels) or the plain formulas (reference).
    kernels: Literal["auto", "reference"] = "auto"


DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")


def _check(ok: bool, key: str, rule: str, value: Any) -> None:
    if not ok:
        raise ConfigError(key, f"must be {rule}, got {shown(value)}")


def _at_most(config: Any, section: str, names: tuple[str, ...], maximum: int) -> None:
    """Each integer ``section.name`` is at most ``maximum`` (lower bounds are checked on their own)."""
    for name in names:
        value = getattr(config, name)
        _check(value <= maximum, f"{section}.{name}", f"at most {maximum}", value)


_LOW_TEMPERATURE, _HIGH_TEMPERATURE = TEMPERATURE_RANGE
# Each decode key's rules, in order (the first one broken is named): the one statement of what decoding
# settings may be, read by the config's check (recipes, --set, the server's per-request settings) and by
# the commands' and the API's check of their decoding flags before any model loads (mtkit.engines.factory).
DECODE_RANGES: dict[str, tuple[tuple[Callable[[Any], bool], str], ...]] = {
    "beam": ((lambda v: v >= 1, ">= 1"), (lambda v: v <= MAX_BEAM, f"at most {MAX_BEAM}")),
    "nbest": ((lambda v: v >= 1, ">= 1"), (lambda v: v <= MAX_BEAM, f"at most {MAX_BEAM}")),
    "alpha": ((lambda v: 0 <= v <= MAX_ALPHA, f"in [0, {MAX_ALPHA:g}]"),),
    "max_len_a": ((lambda v: 0 <= v <= MAX_LEN_A, f"in [0, {MAX_LEN_A:g}]"),),
    "max_len_b": ((lambda v: v <= MAX_LENGTH, f"at most {MAX_LENGTH}"),),
    "min_len": ((lambda v: v >= 0, ">= 0 (0: off)"), (lambda v: v <= MAX_LENGTH, f"at most {MAX_LENGTH}")),
    "batch_tokens": ((lambda v: v >= 1, ">= 1"), (lambda v: v <= MAX_BATCH_TOKENS, f"at most {MAX_BATCH_TOKENS}")),
    "max_input_len": ((lambda v: v >= 2, ">= 2 (one token and EOS)"),
                      (lambda v: v <= MAX_LENGTH, f"at most {MAX_LENGTH}")),
    "no_repeat_ngram_size": ((lambda v: v >= 0, ">= 0 (0: off)"), (lambda v: v <= MAX_LENGTH, f"at most {MAX_LENGTH}")),
    "temperature": ((lambda v: v > 0, "> 0"), (lambda v: _LOW_TEMPERATURE <= v <= _HIGH_TEMPERATURE,
                                               f"in [{_LOW_TEMPERATURE:g}, {_HIGH_TEMPERATURE:g}]")),
    "top_k": ((lambda v: v >= 0, ">= 0 (0: off)"), (lambda v: v <= MAX_VOCAB, f"at most {MAX_VOCAB}")),
    "top_p": ((lambda v: 0 < v <= 1, "in (0, 1]"),),
    "epsilon": ((lambda v: 0 <= v < 1, "in [0, 1) (0: off)"),),
    "mbr_candidates": ((lambda v: v >= 1, ">= 1"), (lambda v: v <= MAX_BEAM, f"at most {MAX_BEAM}")),
    "alignment_layer": ((lambda v: v is None or -MAX_COUNT <= v < MAX_COUNT, f"in [-{MAX_COUNT}, {MAX_COUNT})"),),
    "alignment_threshold": ((lambda v: 0 < v <= 1, "in (0, 1]"),),
}


def check_decode(values: dict[str, Any]) -> None:
    """Raise :class:`ConfigError` (``decode.KEY``) for a decode setting out of :data:`DECODE_RANGES`, or an
    ``nbest`` above the ``beam`` (unless ``sampling``: then nbest counts samples; with ``mbr``: above
    ``mbr_candidates``, the hypotheses it chooses from), among the keys ``values`` has: a whole section's, or
    only the flags a command was given."""
    for key, rules in DECODE_RANGES.items():
        if key in values:
            for ok, rule in rules:
                _check(ok(values[key]), f"decode.{key}", rule, values[key])
    if values.get("mbr", "off") != "off" and "nbest" in values and "mbr_candidates" in values:
        _check(values["nbest"] <= values["mbr_candidates"], "decode.nbest",
               f"between 1 and decode.mbr_candidates ({values['mbr_candidates']})", values["nbest"])
    elif "nbest" in values and "beam" in values and not values.get("sampling"):
        _check(values["nbest"] <= values["beam"], "decode.nbest", f"between 1 and decode.beam ({values['beam']})",
               values["nbest"])


def validate(config: Config) -> None:
    """Ranges and combinations that the types alone do not catch, before any work starts."""
    d = config.data
    for name in ("src_lang", "tgt_lang"):
        _check(bool(getattr(d, name).strip()), f"data.{name}", "a language code such as 'en'", getattr(d, name))
    _check(d.workers >= 0, "data.workers", ">= 0 (0: one per core)", d.workers)
    _check(d.spm.vocab_size >= 8, "data.spm.vocab_size", ">= 8", d.spm.vocab_size)
    _check(0 < d.spm.character_coverage <= 1, "data.spm.character_coverage", "in (0, 1]", d.spm.character_coverage)
    _check(d.spm.sample_size >= 1, "data.spm.sample_size", ">= 1", d.spm.sample_size)
    if d.spm.vocab_from is not None:
        _check(bool(d.spm.vocab_from.strip()), "data.spm.vocab_from", "a checkpoint or run directory", d.spm.vocab_from)
        if d.spm.model or d.spm.tgt_model:
            raise ConfigError("data.spm.vocab_from", "takes the checkpoint's SentencePiece model(s); "
                              "give it or data.spm.model, not both")
    _at_most(d, "data", ("workers",), MAX_PROCESSES)
    _at_most(d.spm, "data.spm", ("vocab_size",), MAX_VOCAB)
    _at_most(d.spm, "data.spm", ("sample_size",), MAX_SAMPLE)
    _at_most(d.clean, "data.clean", ("max_len",), MAX_LENGTH)
    _check(d.clean.max_len >= 0, "data.clean.max_len", ">= 0 (0: no limit)", d.clean.max_len)
    _check(d.clean.max_ratio == 0 or d.clean.max_ratio >= 1, "data.clean.max_ratio", ">= 1 (0: no limit)",
           d.clean.max_ratio)
    _check(0 <= d.clean.examples <= MAX_CHECKPOINTS, "data.clean.examples", f"between 0 and {MAX_CHECKPOINTS}",
           d.clean.examples)
    _check(0 < d.clean.warn_share <= 1, "data.clean.warn_share", "in (0, 1]", d.clean.warn_share)
    if d.clean.filters is not None:
        _validate_filters(d.clean.filters, d)
    for split in ("train", "valid", "test"):
        source = getattr(d, split)
        if source is not None:
            _check_source(source, f"data.{split}")
    _validate_corpora(d)
    _validate_pairs(config)

    m = config.model
    for name in ("d_model", "h", "d_ff", "encoder_layers", "decoder_layers", "max_positions"):
        _check(getattr(m, name) > 0, f"model.{name}", "positive", getattr(m, name))
    if m.d_model % m.h:
        raise ConfigError("model.d_model", f"({m.d_model}) must be divisible by model.h ({m.h})")
    for name in ("dropout", "attention_dropout", "activation_dropout"):
        _check(0 <= getattr(m, name) < 1, f"model.{name}", "in [0, 1)", getattr(m, name))
    _check(m.layer_norm_eps > 0, "model.layer_norm_eps", "> 0", m.layer_norm_eps)

    t = config.train
    for name in ("max_tokens", "update_freq", "processes", "nodes", "ensemble", "max_steps", "log_every",
                 "keep_last", "bleu_beam"):
        _check(getattr(t, name) >= 1, f"train.{name}", ">= 1", getattr(t, name))
    for name in ("warmup", "max_epochs", "max_minutes", "valid_every", "bleu_every", "save_every", "save_every_minutes",
                 "patience", "average_last", "weight_decay", "clip_norm", "rdrop_alpha", "sync_check"):
        _check(getattr(t, name) >= 0, f"train.{name}", ">= 0", getattr(t, name))
    _at_most(t, "train", ("max_tokens",), MAX_BATCH_TOKENS)
    _at_most(t, "train", ("processes", "nodes", "ensemble"), MAX_PROCESSES)
    _at_most(t, "train", ("update_freq", "max_steps", "max_epochs", "warmup", "log_every", "valid_every",
                          "bleu_every", "save_every", "patience", "sync_check"), MAX_COUNT)
    _at_most(t, "train", ("keep_last", "average_last"), MAX_CHECKPOINTS)
    _at_most(t, "train", ("bleu_beam",), MAX_BEAM)
    _check(0 <= t.seed <= MAX_SEED, "train.seed", f"between 0 and {MAX_SEED}", t.seed)
    for name in ("lr", "lr_scale", "eps"):
        _check(getattr(t, name) > 0, f"train.{name}", "> 0", getattr(t, name))
    _check(all(0 <= b < 1 for b in t.betas), "train.betas", "two numbers in [0, 1)", list(t.betas))
    _check(0 <= t.label_smoothing < 1, "train.label_smoothing", "in [0, 1)", t.label_smoothing)
    _check(0 <= t.bpe_dropout < 1, "train.bpe_dropout", "in [0, 1)", t.bpe_dropout)
    _check("bleu" in t.valid_metrics and set(t.valid_metrics) <= {"bleu", "chrf", "comet"}
           and len(set(t.valid_metrics)) == len(t.valid_metrics), "train.valid_metrics",
           "a list of bleu and optionally chrf and comet, each once", list(t.valid_metrics))
    _check(bool(t.valid_comet_model.strip()), "train.valid_comet_model", "a COMET model (hub name or folder)",
           t.valid_comet_model)
    _check(0 <= t.ema_decay < 1, "train.ema_decay", "in [0, 1) (0: off)", t.ema_decay)
    _check(1 <= t.ema_every <= MAX_COUNT, "train.ema_every", f"between 1 and {MAX_COUNT}", t.ema_every)
    _check(bool(DEVICE_PATTERN.match(t.device)), "train.device", "auto, cpu, cuda or cuda:N", t.device)
    if t.init_from is not None:
        _check(bool(t.init_from.strip()), "train.init_from", "a checkpoint or run directory", t.init_from)
    elif t.init_keep_optimizer or t.init_sha256 is not None:
        key = "train.init_keep_optimizer" if t.init_keep_optimizer else "train.init_sha256"
        raise ConfigError(key, "applies only with train.init_from")
    if t.init_sha256 is not None:
        _check(bool(SHA256_PATTERN.match(t.init_sha256)), "train.init_sha256", "64 hexadecimal digits", t.init_sha256)
    if t.lr_schedule == "linear" and t.max_steps <= t.warmup:
        raise ConfigError("train.max_steps", f"train.lr_schedule=linear decays to 0 at train.max_steps "
                          f"({t.max_steps}), which must exceed train.warmup ({t.warmup})")

    _validate_guided_alignment(config)
    _validate_augment(t)

    check_decode(dataclasses.asdict(config.decode))

    _validate_distill(config)
    check_shortlist(config.shortlist)

    e = config.eval
    _check(bool(e.metrics), "eval.metrics", "a list of bleu, chrf, ter", list(e.metrics))
    for metric in e.metrics:
        _check(metric in ("bleu", "chrf", "ter"), "eval.metrics", "a list of bleu, chrf, ter", list(e.metrics))
    _check(0 <= e.examples <= MAX_COUNT, "eval.examples", f"between 0 and {MAX_COUNT}", e.examples)


def _validate_filters(f: FiltersConfig, d: DataConfig) -> None:
    key = "data.clean.filters"
    if f.alpha is not None:
        _check(0 <= f.alpha.min <= 1, f"{key}.alpha.min", "in [0, 1]", f.alpha.min)
    if f.repeats is not None:
        _check(1 <= f.repeats.max <= MAX_LENGTH, f"{key}.repeats.max", f"between 1 and {MAX_LENGTH}", f.repeats.max)
    if f.copy is not None:
        _check(0 <= f.copy.min_chars <= MAX_LENGTH, f"{key}.copy.min_chars", f"between 0 and {MAX_LENGTH}",
               f.copy.min_chars)
    if f.langid is not None:
        _check(0 <= f.langid.min_chars <= MAX_LENGTH, f"{key}.langid.min_chars", f"between 0 and {MAX_LENGTH}",
               f.langid.min_chars)
        _check(len(f.langid.languages) <= 100 and all(re.fullmatch("[a-z]{2}", x) for x in f.langid.languages),
               f"{key}.langid.languages", "ISO 639-1 codes such as [en, fr]", list(f.langid.languages))
    x = f.dual_xent
    if x is not None:
        _check(0 < x.keep <= 1, f"{key}.dual_xent.keep", "in (0, 1]", x.keep)
        for name in ("forward", "backward"):
            _check(bool(getattr(x, name).strip()), f"{key}.dual_xent.{name}",
                   "a file of `mtkit score` output for data.train", getattr(x, name))
        if d.pairs:
            raise ConfigError(f"{key}.dual_xent", "scores a single pair's data.train; not with data.pairs")


def _validate_guided_alignment(config: Config) -> None:
    """``data.alignments`` and ``train.guided_alignment``: a single pair's recipe, a head that exists, and a
    training path that keeps the stored pieces (no BPE-dropout, no R-Drop)."""
    d, g, t, m = config.data, config.train.guided_alignment, config.train, config.model
    if d.alignments is not None:
        _check(bool(d.alignments.strip()), "data.alignments", "eflomal or a Pharaoh file", d.alignments)
        if d.pairs:
            raise ConfigError("data.alignments", "takes a single pair's recipe (data.train), not data.pairs")
    _check(0 <= g.weight <= MAX_ALPHA, "train.guided_alignment.weight", f"in [0, {MAX_ALPHA:g}] (0: off)", g.weight)
    _check(-MAX_COUNT <= g.layer <= MAX_COUNT, "train.guided_alignment.layer", f"between -{MAX_COUNT} and {MAX_COUNT}",
           g.layer)
    _check(0 <= g.head <= MAX_COUNT, "train.guided_alignment.head", f"between 0 and {MAX_COUNT}", g.head)
    if not g.weight:
        return
    layers = m.decoder_layers
    _check(-layers <= g.layer < layers, "train.guided_alignment.layer",
           f"a decoder layer, 0 to {layers - 1} (or -{layers} to -1 from the end)", g.layer)
    _check(0 <= g.head < m.h, "train.guided_alignment.head", f"a head of the layer, 0 to {m.h - 1}", g.head)
    if d.pairs:
        raise ConfigError("train.guided_alignment", "takes a single pair's recipe (data.train), not data.pairs")
    for key, value in (("bpe_dropout", t.bpe_dropout), ("rdrop_alpha", t.rdrop_alpha)):
        if value:
            raise ConfigError("train.guided_alignment", f"cannot go with train.{key} (it trains on the stored "
                              "pieces that the alignments name)")


def _validate_augment(t: TrainConfig) -> None:
    a = t.augment
    for name in ("upper", "title", "typos", "merge", "copy_noise"):
        _check(0 <= getattr(a, name) <= 1, f"train.augment.{name}", "a probability in [0, 1]", getattr(a, name))
    _check(a.upper + a.title <= 1, "train.augment.title", "at most 1 - train.augment.upper (a pair is either)",
           a.title)
    _check(0 < a.typo_rate <= 1, "train.augment.typo_rate", "in (0, 1]", a.typo_rate)
    if not a.on:
        return
    if t.bpe_dropout:
        raise ConfigError("train.augment", "cannot go with train.bpe_dropout (both re-encode the training pairs)")
    if t.guided_alignment.weight:
        raise ConfigError("train.augment", "cannot go with train.guided_alignment (its links name the stored pieces)")


def _validate_distill(config: Config) -> None:
    """``distill``: its ranges, and a recipe it can run on (one pair; the teacher's SentencePiece model)."""
    t = config.distill
    _check(1 <= t.shard_lines <= MAX_COUNT, "distill.shard_lines", f"between 1 and {MAX_COUNT}", t.shard_lines)
    _check(0 <= t.filter_share < 1, "distill.filter_share", "in [0, 1) (0: keep every pair)", t.filter_share)
    _check(len(t.teacher) <= MAX_PROCESSES, "distill.teacher", f"at most {MAX_PROCESSES} models", len(t.teacher))
    for path in t.teacher:
        _check(bool(path.strip()), "distill.teacher", "a list of checkpoints or run directories", list(t.teacher))
    if not t.teacher:
        if t.filter_share or t.mix_original:
            raise ConfigError("distill.filter_share" if t.filter_share else "distill.mix_original",
                              "applies only with distill.teacher")
        return
    d = config.data
    if d.pairs:
        raise ConfigError("distill.teacher", "distills a single-pair recipe (data.train), not data.pairs")
    if d.spm.model or d.spm.tgt_model or d.spm.vocab_from not in (None, t.teacher[0]):
        raise ConfigError("distill.teacher", "the student takes the teacher's SentencePiece model; leave "
                          "data.spm.model, tgt_model and vocab_from unset")


def check_shortlist(t: ShortlistConfig, section: str = "shortlist") -> None:
    """``shortlist``'s ranges (the config's, and ``mtkit shortlist``'s flags)."""
    _check(1 <= t.per_source <= MAX_VOCAB, f"{section}.per_source", f"between 1 and {MAX_VOCAB}", t.per_source)
    _check(0 <= t.frequent <= MAX_VOCAB, f"{section}.frequent", f"between 0 and {MAX_VOCAB}", t.frequent)
    _check(1 <= t.max_pairs <= MAX_COUNT, f"{section}.max_pairs", f"between 1 and {MAX_COUNT}", t.max_pairs)


def _check_source(source: SourceConfig, key: str) -> None:
    _check(1 <= source.size <= MAX_COUNT, f"{key}.size", f"between 1 and {MAX_COUNT}", source.size)
    _check(0 <= source.seed <= MAX_SEED, f"{key}.seed", f"between 0 and {MAX_SEED}", source.seed)


LANGUAGE_CODE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")  # no '-': pairs are named src-tgt (en-de)


TAG_PIECE = re.compile(r"<[A-Za-z0-9_.-]{1,32}>")


def _validate_corpora(d: DataConfig) -> None:
    if not d.corpora:
        return
    if d.train is not None:
        raise ConfigError("data.train", "give the training sources in data.corpora, not here, when data.corpora "
                          "is set")
    if d.pairs:
        raise ConfigError("data.corpora", "is for one pair; with data.pairs give each pair's train source there")
    if d.alignments is not None:
        raise ConfigError("data.alignments", "takes a single data.train, not data.corpora")
    if d.clean.filters is not None and d.clean.filters.dual_xent is not None:
        raise ConfigError("data.clean.filters.dual_xent", "scores a single data.train, not data.corpora")
    _check(len(d.corpora) <= MAX_CHECKPOINTS, "data.corpora", f"at most {MAX_CHECKPOINTS} corpora", len(d.corpora))
    names = []
    for i, c in enumerate(d.corpora):
        key = f"data.corpora[{i}]"
        _check(bool(LANGUAGE_CODE.match(c.name)), f"{key}.name", "a name of letters, digits and _", c.name)
        if c.name in names:
            raise ConfigError(f"{key}.name", f"{c.name} is given twice")
        names.append(c.name)
        if c.train is None:
            raise ConfigError(f"{key}.train", "missing: each corpus needs its training source")
        _check_source(c.train, f"{key}.train")
        _check(0 < c.weight <= 1e6, f"{key}.weight", "> 0", c.weight)
        if c.tag is not None:
            _check(bool(TAG_PIECE.fullmatch(c.tag)) and not c.tag.startswith("<2"), f"{key}.tag",
                   "a piece such as <BT> (letters, digits, _ . -, not <2xx>: those are language tags)", c.tag)


def _validate_pairs(config: Config) -> None:
    """``data.pairs`` and the training keys that go with it (``train.best_pair``, ``train.pair_temperature``)."""
    d, t = config.data, config.train
    _check(t.pair_temperature > 0, "train.pair_temperature", "> 0 (1: proportional to the pairs' sizes)",
           t.pair_temperature)
    _check(d.tag_side in ("source", "target", "codes"), "data.tag_side", "source, target or codes", d.tag_side)
    if not d.pairs:
        _check(t.best_pair == "mean", "train.best_pair", "mean (data.pairs is empty: one pair)", t.best_pair)
        _check(d.tag_side == "source", "data.tag_side", "source (data.pairs is empty: one pair, no tags)",
               d.tag_side)
        return
    for split in ("train", "valid", "test"):
        if getattr(d, split) is not None:
            raise ConfigError(f"data.{split}", "give each pair's sources in data.pairs, not here, when data.pairs "
                              "is set")
    names = []
    for i, pair in enumerate(d.pairs):
        key = f"data.pairs[{i}]"
        for name in ("src_lang", "tgt_lang"):
            value = getattr(pair, name)
            _check(bool(LANGUAGE_CODE.match(value)), f"{key}.{name}", "a language code such as 'en' "
                   "(letters, digits and _)", value)
        if pair.src_lang == pair.tgt_lang:
            raise ConfigError(f"{key}.tgt_lang", f"the same language as its src_lang ({pair.src_lang})")
        name = f"{pair.src_lang}-{pair.tgt_lang}"
        if name in names:
            raise ConfigError(key, f"{name} is listed twice")
        names.append(name)
        for split in ("train", "valid", "test"):
            source = getattr(pair, split)
            if source is not None:
                _check_source(source, f"{key}.{split}")
        if pair.weight is not None:
            _check(pair.weight > 0, f"{key}.weight", "> 0", pair.weight)
    weighted = [p.weight is not None for p in d.pairs]
    if any(weighted) and not all(weighted):
        raise ConfigError(f"data.pairs[{weighted.index(False)}].weight",
                          "missing: give a weight to every pair or to none (then train.pair_temperature decides)")
    _check(t.best_pair == "mean" or t.best_pair in names, "train.best_pair",
           f"mean or one of the pairs ({', '.join(names)})", t.best_pair)

