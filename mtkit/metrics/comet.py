"""COMET (Rei et al. 2020, 2022): learned translation metrics on a multilingual encoder, computed natively on
``transformers``' XLM-R, with the scores of the reference implementation (``unbabel-comet``) on the same
checkpoint to 1e-4 (tests/integration/test_comet_reference.py runs both).

A COMET model is a folder (a hub repository such as ``Unbabel/wmt22-comet-da``, or a local copy) with
``hparams.yaml`` and ``checkpoints/model.ckpt``: a PyTorch Lightning checkpoint whose ``state_dict`` holds
the encoder (``encoder.model.*``, an XLM-R whose config and tokenizer are those of ``pretrained_model``, a hub
name or a folder), the layer mix (``layerwise_attention.*``) and the estimator (``estimator.ff.*``), and
whose ``hyper_parameters`` (else ``hparams.yaml``) say how they are used:

- ``regression_metric`` (COMET-DA, e.g. wmt22-comet-da, the default): source, translation and reference
  encoded apart; each a sentence embedding (the layers mixed by softmax or sparsemax weights, then pooled:
  the mean over tokens, by default); the estimator reads ``[mt; ref; mt⊙ref; |mt−ref|; mt⊙src; |mt−src|]``.
- ``referenceless_regression_metric`` (COMET-QE, wmt20/21): ``[mt; src; mt⊙src; |mt−src|]``, no reference.
- ``unified_metric`` (CometKiwi, wmt22-cometkiwi-da; UniTE): the translation and the source (and the
  reference, where the model takes one) joined into one sequence, ``<s> mt </s></s> src </s>``; the
  estimator reads the mixed layers' first token. With both source and reference, the mean of the scores of
  mt+src, mt+ref and mt+src+ref, as unbabel-comet does.

The score of a segment is the estimator's output; a system's score is their mean (COMET-DA scores are
around 0.8 for good systems, not percentages). Loading never runs code from the folder, never reads
standard input, and costs work bounded by the files' sizes: the checkpoint is read first without torch
(mtkit.checkpoints.file: stored entries, a bounded pickle of plain data and tensors that fit their
storages), then by ``torch.load(weights_only=True)``, memory-mapped; ``hparams.yaml`` is read without
aliases; the encoder's JSON files are read bounded in size and depth, and one asking for code of its own
(an ``auto_map``, a ``model_type`` transformers does not know) is refused before transformers, told
``trust_remote_code=False``, reads them; every tensor's name and shape is checked against the model the
config describes before the weights are allocated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mtkit.checkpoints.file import read_payload
from mtkit.errors import MtkitError, counted, shown
from mtkit.hub import hub_folder
from mtkit.io import (
    MAX_CONFIG_BYTES,
    MAX_VOCAB_BYTES,
    open_regular,
    read_bounded,
    read_json_file,
    read_yaml_file,
    sentence_progress,
)
from mtkit.version import __version__

DEFAULT_MODEL = "Unbabel/wmt22-comet-da"  # reference-based, the one papers and mozilla/translations report
KINDS = ("regression_metric", "referenceless_regression_metric", "unified_metric")
ENCODERS = ("XLM-RoBERTa", "XLM-RoBERTa-XL")
ACTIVATIONS = ("Tanh", "Sigmoid", "Softplus", "Softsign", "Hardtanh", "Mish")  # nn.<activation.title()>
MAX_HPARAMS_BYTES = 1 << 20  # hparams.yaml: a few hundred bytes
# The encoder's files transformers reads for its config and tokenizer (XLM-R's), each checked first.
ENCODER_JSON = ("config.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                "tokenizer.json")
SENTENCEPIECE = "sentencepiece.bpe.model"  # XLM-R's tokenizer where no tokenizer.json is
LFS_POINTER = b"version https://git-lfs"
IGNORED = ("encoder.model.embeddings.position_ids", "encoder.model.embeddings.token_type_ids",
           "encoder.model.pooler.", "layerwise_attention.dropout_mask", "layerwise_attention.dropout_fill",
           "hidden2tag.")  # buffers older transformers saved, the unused pooler, training-only parts


@dataclass(frozen=True)
class CometHparams:
    """What of a COMET model's hyper-parameters scoring uses (unbabel-comet's names)."""

    kind: str  # class_identifier, one of KINDS
    encoder_model: str
    pretrained_model: str  # the encoder's config and tokenizer: a hub name or a folder
    pool: str  # avg | max | cls | default
    layer: str | int  # "mix" or one layer's index
    layer_transformation: str  # softmax | sparsemax
    layer_norm: bool
    hidden_sizes: tuple[int, ...]
    activations: str
    final_activation: str | None
    input_segments: tuple[str, ...]  # unified_metric: what is joined into the sequence, mt first


def _hparams(raw: Any, where: str) -> CometHparams:
    """The hyper-parameters of ``raw`` (a mapping), each checked; an error names ``where`` and the key."""
    if not isinstance(raw, dict):
        raise MtkitError(f"{where}: expected a mapping of hyper-parameters")

    def get(key: str, ok: Callable[[Any], bool], rule: str, default: Any = None) -> Any:
        value = raw.get(key, default)
        if not ok(value):
            raise MtkitError(f"{where}: {key} must be {rule}, got {shown(value)}")
        return value

    kind = get("class_identifier", lambda v: v in KINDS, f"one of {', '.join(KINDS)} (the others are not "
                                                          "supported here)")
    transformation = get("layer_transformation", lambda v: v in ("softmax", "sparsemax", "sparsemax_patch"),
                         "softmax or sparsemax", "softmax")
    segments = get("input_segments", lambda v: isinstance(v, list) and v[:1] == ["mt"] and len(v) <= 3
                   and all(s in ("mt", "src", "ref") for s in v) and 2 <= len(v) == len(set(v)),
                   "a list of mt, then src and/or ref", ["mt", "src", "ref"])
    return CometHparams(
        kind=kind,
        encoder_model=get("encoder_model", lambda v: v in ENCODERS, f"one of {', '.join(ENCODERS)}",
                          "XLM-RoBERTa"),
        pretrained_model=get("pretrained_model", lambda v: isinstance(v, str) and 0 < len(v) < 4096,
                             "a hub name or a folder", "xlm-roberta-large"),
        pool=get("pool", lambda v: v in ("avg", "max", "cls", "default"), "avg, max, cls or default", "avg"),
        layer=get("layer", lambda v: v == "mix" or (type(v) is int and 0 <= v < 1000), "mix or a layer index",
                  "mix"),
        # unbabel-comet 2.2.4 and later read "sparsemax_patch" as softmax (its issue #244); so did earlier ones
        layer_transformation="sparsemax" if transformation == "sparsemax" else "softmax",
        layer_norm=get("layer_norm", lambda v: isinstance(v, bool), "true or false", True),
        hidden_sizes=tuple(get("hidden_sizes", lambda v: isinstance(v, list) and 0 < len(v) <= 16 and all(
            type(n) is int and 0 < n <= 1 << 16 for n in v), "a list of sizes", [3072, 1024])),
        activations=get("activations", lambda v: isinstance(v, str) and v.title() in ACTIVATIONS,
                        f"one of {', '.join(ACTIVATIONS)}", "Tanh").title(),
        final_activation=(lambda v: v.title() if v is not None else None)(get(
            "final_activation", lambda v: v is None or (isinstance(v, str) and v.title() in ACTIVATIONS),
            f"null or one of {', '.join(ACTIVATIONS)}")),
        input_segments=tuple(segments),
    )


def read_hparams_file(path: Path) -> dict:
    """``hparams.yaml``: a bounded read, YAML's safe loader without aliases, one error line naming the file."""
    raw = read_yaml_file(path, MAX_HPARAMS_BYTES, "COMET hparams.yaml")
    if not isinstance(raw, dict):
        raise MtkitError(f"{path}: expected a mapping of hyper-parameters")
    return raw


def locate(source: str) -> tuple[Path, Path]:
    """``hparams.yaml`` and ``checkpoints/model.ckpt`` of a COMET model given as a folder, its checkpoint
    file, or a hub name (downloaded)."""
    path = Path(source)
    if path.is_file():  # FOLDER/checkpoints/model.ckpt, as unbabel-comet takes it
        folder, ckpt = path.parent.parent, path
    else:
        folder = hub_folder(source, ["hparams.yaml", "checkpoints/model.ckpt"], DEFAULT_MODEL, "comet")
        ckpt = folder / "checkpoints" / "model.ckpt"
    hparams = folder / "hparams.yaml"
    for needed in (hparams, ckpt):
        if not needed.is_file():
            raise MtkitError(f"{source}: no {needed.relative_to(folder)} (a COMET model is a folder with "
                             "hparams.yaml and checkpoints/model.ckpt)")
    return hparams, ckpt


def read_checkpoint(path: Path) -> dict:
    """The Lightning checkpoint at ``path``: read first without torch, in work bounded by its size
    (:func:`~mtkit.checkpoints.file.read_payload`, as mtkit's own checkpoints are), then memory-mapped
    by torch's weights-only unpickler (nothing of it runs); its ``state_dict`` and ``hyper_parameters``."""
    with open_regular(path, "no such file") as f:
        if f.read(len(LFS_POINTER)) == LFS_POINTER:
            raise MtkitError(f"{path}: a Git LFS pointer, not the checkpoint (fetch it: git lfs pull)")
    read_payload(path, "COMET checkpoint")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 (a file that changed since it was read, or one torch reads otherwise)
        raise MtkitError(f"{path}: not a readable COMET checkpoint ({type(e).__name__})") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise MtkitError(f"{path}: no state_dict (expected a PyTorch Lightning checkpoint of a COMET model)")
    bad = next((k for k, v in ckpt["state_dict"].items() if not (isinstance(k, str)
                                                                   and isinstance(v, torch.Tensor))), None)
    if bad is not None:
        raise MtkitError(f"{path}: its state_dict holds {shown(bad)}, not a named tensor")
    return ckpt


def encoder_folder(name: str) -> Path:
    """The folder of the encoder's config and tokenizer: ``name`` itself, or the hub repository it names
    (``xlm-roberta-large``) in the Hugging Face cache, its files downloaded there first as transformers would
    (so that what is checked is what transformers then reads, from the folder, never from the hub again)."""
    if Path(name).is_dir():
        return Path(name)
    from transformers.utils import cached_file

    found = [cached_file(name, file, _raise_exceptions_for_missing_entries=False)
             for file in (*ENCODER_JSON, SENTENCEPIECE)]
    if not any(found):
        raise OSError("not a folder, nor a hub repository here or in the Hugging Face cache")
    return Path(next(f for f in found if f)).parent


def check_encoder(folder: Path) -> None:
    """The encoder's files in ``folder`` as transformers will read them, before it does: each JSON file within
    its bounds (size, depth), none asking for code of its own (an ``auto_map``; a ``model_type`` that is none
    of transformers' own names a model of its own code), the SentencePiece model no larger than one is."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    for name in ENCODER_JSON:
        path = folder / name
        if not path.exists():
            continue  # transformers does without, or says what is missing
        large = name == "tokenizer.json"  # the pieces, a few MB
        value = read_json_file(path, MAX_VOCAB_BYTES if large else MAX_CONFIG_BYTES,
                               "tokenizer" if large else "model config")
        if not isinstance(value, dict):
            raise MtkitError(f"{path}: expected a JSON object")
        if "auto_map" in value:
            raise MtkitError(f"{path}: asks for code of its own (auto_map); mtkit runs none")
        model_type = value.get("model_type") if name == "config.json" else None
        if model_type is not None and (not isinstance(model_type, str) or model_type not in CONFIG_MAPPING_NAMES):
            raise MtkitError(f"{path}: model_type {shown(model_type)} is none that transformers knows (a model of "
                             "its own code)")
    if (folder / SENTENCEPIECE).exists():
        read_bounded(folder / SENTENCEPIECE, MAX_VOCAB_BYTES, "SentencePiece model")


def sparsemax(z):
    """Sparsemax (Martins & Astudillo 2016) of a vector: the Euclidean projection onto the simplex, which,
    unlike softmax, gives weights of exactly 0 (entmax's ``sparsemax``, as unbabel-comet mixes layers)."""
    ordered, _ = torch.sort(z, descending=True)
    k = torch.arange(1, z.numel() + 1, dtype=z.dtype, device=z.device)
    cumulative = ordered.cumsum(0) - 1
    support = int((k * ordered > cumulative).sum())
    tau = cumulative[support - 1] / support
    return torch.clamp(z - tau, min=0)


# The COMET module, its parameter names as unbabel-comet's (encoder.model, layerwise_attention, estimator.ff).


class LayerMix(nn.Module):
    """unbabel-comet's LayerwiseAttention at inference: gamma · Σ_k w_k · layer_k, w = softmax or sparsemax of
    one scalar per layer (``hp.layer_transformation``); with ``hp.layer_norm``, each layer normalized per
    sentence over its tokens and features first."""

    def __init__(self, hp: CometHparams, layers: int):
        super().__init__()
        self.hp = hp
        self.scalar_parameters = nn.ParameterList([nn.Parameter(torch.zeros(1)) for _ in range(layers)])
        self.gamma = nn.Parameter(torch.ones(1))

    def forward(self, tensors, mask):
        """tensors: the encoder's hidden states, each (B, T, d); mask (B, T) -> (B, T, d)."""
        hp = self.hp
        weights = torch.cat(list(self.scalar_parameters))
        weights = sparsemax(weights) if hp.layer_transformation == "sparsemax" else torch.softmax(weights, 0)
        if hp.layer_norm:
            m = mask.float().unsqueeze(-1)
            count = mask.float().sum(1) * tensors[0].size(-1)
            normed = []
            for t in tensors:
                mean = (t * m).flatten(1).sum(1) / count
                var = (((t * m) - mean.view(-1, 1, 1)) * m).pow(2).flatten(1).sum(1) / count
                normed.append((t - mean.view(-1, 1, 1)) / torch.sqrt(var + 1e-12).view(-1, 1, 1))
            tensors = normed
        return self.gamma * sum(w * t for w, t in zip(weights, tensors))


class FeedForward(nn.Module):
    """The estimator: ``hp.hidden_sizes`` linear layers with ``hp.activations``, then one output (and
    ``hp.final_activation``)."""

    def __init__(self, hp: CometHparams, in_dim: int):
        super().__init__()
        sizes = [in_dim, *hp.hidden_sizes]
        modules: list[nn.Module] = []
        for a, b in zip(sizes, sizes[1:]):
            modules += [nn.Linear(a, b), getattr(nn, hp.activations)(), nn.Dropout(0.0)]
        modules.append(nn.Linear(sizes[-1], 1))
        if hp.final_activation is not None:
            modules.append(getattr(nn, hp.final_activation)())
        self.ff = nn.Sequential(*modules)

    def forward(self, x):
        return self.ff(x)


class Encoder(nn.Module):
    """The XLM-R encoder (``encoder.model``), without its pooler."""

    def __init__(self, hp: CometHparams, encoder_config):
        super().__init__()
        if hp.encoder_model == "XLM-RoBERTa-XL":
            from transformers import XLMRobertaXLModel as Model  # transformers: the comet extra, imported when used
        else:
            from transformers import XLMRobertaModel as Model
        self.model = Model(encoder_config, add_pooling_layer=False)


class Comet(nn.Module):
    """The encoder, the layer mix (where ``hp.layer`` is ``mix``) and the estimator of a COMET model."""

    def __init__(self, hp: CometHparams, encoder_config):
        super().__init__()
        self.encoder = Encoder(hp, encoder_config)
        if hp.layer == "mix":
            self.layerwise_attention = LayerMix(hp, encoder_config.num_hidden_layers + 1)
        units = encoder_config.hidden_size
        self.estimator = FeedForward(hp, units * {"regression_metric": 6, "referenceless_regression_metric": 4,
                                                  "unified_metric": 1}[hp.kind])


def _network(hp: CometHparams, encoder_config, device) -> Comet:
    """The COMET module built on ``device`` (``meta``: shapes only)."""
    with torch.device(device):
        return Comet(hp, encoder_config)


def _check_config(config, hp: CometHparams, state: dict, where: str) -> None:
    """The encoder config's sizes against the checkpoint's tensors (before any model is built: the config
    claims, the tensors hold): hidden and vocabulary size, positions, layers, feed-forward width."""
    words = state.get("encoder.model.embeddings.word_embeddings.weight")
    if words is None or words.dim() != 2:
        raise MtkitError(f"{where}: no encoder.model.embeddings.word_embeddings.weight (not an XLM-R COMET model)")
    positions = state.get("encoder.model.embeddings.position_embeddings.weight")
    layers = {int(k.split(".")[4]) for k in state if k.startswith("encoder.model.encoder.layer.")
              and k.split(".")[4].isdigit()}
    ffn = state.get("encoder.model.encoder.layer.0.intermediate.dense.weight")
    held = {"vocab_size": words.shape[0], "hidden_size": words.shape[1],
            "max_position_embeddings": None if positions is None else positions.shape[0],
            "num_hidden_layers": len(layers) if layers == set(range(len(layers))) else None,
            "intermediate_size": None if ffn is None else ffn.shape[0]}
    for key, value in held.items():
        claimed = getattr(config, key, None)
        if value is None or claimed != value:
            raise MtkitError(f"{where}: the encoder config ({hp.pretrained_model}) says {key} {claimed}, the "
                             f"checkpoint's tensors hold {value}")
    heads = getattr(config, "num_attention_heads", 0)
    if type(heads) is not int or heads <= 0 or config.hidden_size % heads:
        raise MtkitError(f"{where}: the encoder config's num_attention_heads {heads} does not divide "
                         f"hidden_size {config.hidden_size}")


def _fit(network, state: dict, where: str) -> dict:
    """The checkpoint's tensors the module takes, each name and shape checked against it (shapes from a
    ``meta`` module: nothing allocated yet)."""
    wanted = {k: tuple(v.shape) for k, v in network.state_dict().items()}
    kept = {k: v for k, v in state.items() if not k.startswith(IGNORED)}
    missing = sorted(set(wanted) - set(kept))
    unexpected = sorted(set(kept) - set(wanted))
    if missing or unexpected:
        name = (missing or unexpected)[0]
        raise MtkitError(f"{where}: {'no tensor' if missing else 'an unexpected tensor'} {name} "
                         f"({len(missing)} missing, {len(unexpected)} unexpected)")
    for k, shape in wanted.items():
        if tuple(kept[k].shape) != shape:
            raise MtkitError(f"{where}: {k} has shape {tuple(kept[k].shape)}, the model needs {shape}")
    return kept


class CometScorer:
    """A loaded COMET model: :meth:`score` gives one score per segment.

    Args:
        source: a hub name (``Unbabel/wmt22-comet-da``), a model folder or its ``checkpoints/model.ckpt``.
        device: ``auto`` (a GPU when there is one), ``cpu``, ``cuda``, ``cuda:N``.
    """

    def __init__(self, source: str = DEFAULT_MODEL, device: str = "auto"):
        try:
            import transformers
            from transformers import AutoConfig, AutoTokenizer
        except ImportError:
            raise MtkitError("COMET needs transformers: pip install 'mtkit[comet]'") from None
        hparams_path, ckpt_path = locate(source)
        ckpt = read_checkpoint(ckpt_path)
        stored = ckpt.get("hyper_parameters")  # what unbabel-comet uses; hparams.yaml names the class
        raw = {**(stored if isinstance(stored, dict) else {}), **{
            k: v for k, v in read_hparams_file(hparams_path).items() if k == "class_identifier"
            or not isinstance(stored, dict)}}
        self.hparams = hp = _hparams(raw, str(hparams_path))
        try:
            folder = encoder_folder(hp.pretrained_model)
        except (OSError, ValueError) as e:  # not on the hub, no network, not a hub name
            why = (str(e).strip().splitlines() or [""])[0][:160]
            raise MtkitError(f"{hparams_path}: its encoder {hp.pretrained_model} cannot be loaded ({why})") from None
        check_encoder(folder)
        try:
            # Never the code of a folder's own (nor a question on stdin whether to run it: transformers asks
            # where trust_remote_code is left unset).
            config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
            self.tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
        except Exception as e:  # noqa: BLE001 (transformers' and tokenizers' errors on a foreign folder: one line)
            why = (str(e).strip().splitlines() or [""])[0][:160]
            raise MtkitError(f"{hparams_path}: its encoder {hp.pretrained_model} cannot be loaded ({why})") from None
        state = ckpt["state_dict"]
        _check_config(config, hp, state, str(ckpt_path))
        if hp.layer != "mix" and hp.layer > config.num_hidden_layers:
            raise MtkitError(f"{hparams_path}: layer {hp.layer} of an encoder of "
                             f"{counted(config.num_hidden_layers, 'layer')}")
        kept = _fit(_network(hp, config, "meta"), state, str(ckpt_path))
        self.device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
        network = _network(hp, config, "cpu")
        network.load_state_dict(kept, strict=False)
        self.network = network.to(self.device).eval()
        self.name = source
        self.max_length = config.max_position_embeddings - 2  # unbabel-comet's encoder.max_positions
        self.signature = (f"model:{source}|class:{hp.kind}|encoder:{hp.pretrained_model}|mtkit:{_mtkit_version()}"
                          f"|transformers:{transformers.__version__}|torch:{torch.__version__.split('+')[0]}")

    @property
    def needs_references(self) -> bool:
        hp = self.hparams
        return hp.kind == "regression_metric" or (hp.kind == "unified_metric" and hp.input_segments == ("mt", "ref"))

    @property
    def needs_sources(self) -> bool:
        hp = self.hparams
        return hp.kind != "unified_metric" or "src" in hp.input_segments

    def score(self, sources: Sequence[str] | None, hypotheses: Sequence[str],
              references: Sequence[str] | None = None, batch_size: int = 16,
              progress: bool = True) -> list[float]:
        """One score per hypothesis, in order. Segments are batched by length (padding does not change a
        score); ``progress``: a bar on a terminal."""
        n = len(hypotheses)
        if self.needs_sources and (sources is None or len(sources) != n):
            raise MtkitError(f"COMET {self.name} needs the sources (--src), one per hypothesis"
                             + (f" (got {len(sources)} for {n})" if sources is not None else ""))
        if self.needs_references and (references is None or len(references) != n):
            raise MtkitError(f"COMET {self.name} needs the references (--ref), one per hypothesis"
                             + (f" (got {len(references)} for {n})" if references is not None else ""))
        if batch_size < 1:
            raise MtkitError(f"COMET batch size must be at least 1, got {batch_size}")
        order = sorted(range(n), key=lambda i: -len(hypotheses[i]) - (len(sources[i]) if sources else 0))
        scores = [0.0] * n
        bar = sentence_progress(enabled=progress)
        with torch.inference_mode():
            for start in range(0, n, batch_size):
                chunk = order[start:start + batch_size]
                src, mt, ref = ([lines[i] for i in chunk] if lines is not None else None
                                for lines in (sources, hypotheses, references))
                for i, value in zip(chunk, self._batch(src, mt, ref)):
                    scores[i] = value
                if bar is not None:
                    bar.update(len(chunk))
        if bar is not None:
            bar.close()
        return scores

    def pairwise(self, source: str, texts: Sequence[str]) -> list[list[float]]:
        """``[i][j]``: the score of ``texts[i]`` as the translation of ``source`` with ``texts[j]`` as its
        reference (a regression_metric model): each sentence encoded once, the estimator run N² times."""
        if self.hparams.kind != "regression_metric":
            raise MtkitError(f"COMET {self.name}: scoring against each other needs a reference-based model")
        with torch.inference_mode():
            hyps = self._sentences(list(texts))
            n = hyps.size(0)
            src = self._sentences([source]).expand(n, -1)
            return [self._estimate(hyps[i:i + 1].expand(n, -1), src, hyps) for i in range(n)]

    # ---------------------------------------------------------------- one batch

    def _tokens(self, lines: list[str]) -> dict:
        return self.tokenizer(lines, return_tensors="pt", padding=True, truncation=True,
                              max_length=self.max_length - 2)

    def _layer(self, ids, mask):
        """The encoder's mixed (or chosen) layer, and its last hidden state."""
        hp, net = self.hparams, self.network
        out = net.encoder.model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        layers = out.hidden_states
        return (net.layerwise_attention(layers, mask) if hp.layer == "mix" else layers[hp.layer]), out.last_hidden_state

    def _sentences(self, lines: list[str]):
        """Sentence embeddings of ``lines``, each encoded alone (regression models)."""
        t = self._tokens(lines)
        return self._embed(t["input_ids"].to(self.device), t["attention_mask"].long().to(self.device))

    def _estimate(self, mt, src, ref=None) -> list[float]:
        """The estimator on a regression model's features: ``[mt; ref; mt⊙ref; |mt−ref|; mt⊙src; |mt−src|]``,
        or without a reference ``[mt; src; mt⊙src; |mt−src|]``."""
        features = (mt, src, mt * src, torch.abs(mt - src))
        if ref is not None:
            features = (mt, ref, mt * ref, torch.abs(mt - ref), mt * src, torch.abs(mt - src))
        return self.network.estimator(torch.cat(features, dim=1)).view(-1).float().tolist()

    def _embed(self, ids, mask):
        """Sentence embeddings: the mixed (or chosen) layer pooled as ``hparams.pool`` says."""
        hp = self.hparams
        words, last = self._layer(ids, mask)
        if hp.pool == "default":
            return last[:, 0, :]
        if hp.pool == "cls":
            return words[:, 0, :]
        padding = ids.eq(self.tokenizer.pad_token_id).unsqueeze(-1)
        if hp.pool == "max":
            return words.float().masked_fill(padding, float("-inf")).type_as(words).max(dim=1)[0]
        total = words.float().masked_fill(padding, 0.0).type_as(words).sum(1)
        return total / mask.unsqueeze(-1).expand(words.size()).float().sum(1)

    def _batch(self, sources, hypotheses, references) -> list[float]:

        hp, net, device = self.hparams, self.network, self.device
        if hp.kind != "unified_metric":
            ref = self._sentences(references) if hp.kind == "regression_metric" else None
            return self._estimate(self._sentences(hypotheses), self._sentences(sources), ref)
        given = {"mt": hypotheses, "src": sources, "ref": references}
        segments = [s for s in hp.input_segments if given[s] is not None]
        encoded = {s: self._tokens(given[s])["input_ids"] for s in segments}
        if segments == ["mt", "src", "ref"]:  # unbabel-comet: the mean of mt+src, mt+ref and all three
            groups = [["mt", "src"], ["mt", "ref"], ["mt", "src", "ref"]]
        else:
            groups = [segments]
        scores = None
        for group in groups:
            ids, mask = self._joined([encoded[s] for s in group])
            first = self._layer(ids.to(device), mask.long().to(device))[0][:, 0, :]  # the first token
            value = net.estimator(first).view(-1).float()
            scores = value if scores is None else scores + value
        return (scores / len(groups)).tolist()

    def _joined(self, parts: list) -> tuple:
        """Each row's segments joined as unbabel-comet's ``concat_sequences`` joins them (``<s> a </s></s> b
        </s>``), cut to the encoder's positions where they do not fit, padded; ids and attention mask."""
        pad, cls, sep = (self.tokenizer.pad_token_id, self.tokenizer.cls_token_id, self.tokenizer.sep_token_id)
        rows = []
        for i in range(parts[0].size(0)):
            pieces = [p[i][p[i].ne(pad)].tolist() for p in parts]
            joined = pieces[0]
            for other in pieces[1:]:  # XLM-R's pair of sequences (build_inputs_with_special_tokens)
                joined = [cls, *joined[1:-1], sep, sep, *other[1:-1], sep]
            if sum(len(p) - 2 for p in pieces) > self.max_length - (1 + 2 * len(pieces)):
                joined = joined[:self.max_length]
            rows.append(joined)
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        lengths = torch.tensor([len(r) for r in rows])
        return ids, torch.arange(width)[None, :] < lengths[:, None]


def _mtkit_version() -> str:
    return __version__
