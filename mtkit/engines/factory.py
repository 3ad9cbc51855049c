"""The engine factory, :mod:`mtkit.api`'s private helper (nothing else imports it: tests/unit/test_layout.py):
decoding flags checked and applied, and the engine built that :func:`mtkit.api.load` gives every caller (a
torch :class:`TorchEngine` on checkpoints, an ensemble for several, a CTranslate2 or ONNX one on an export).

Errors name the flag (``--nbest``), not the config key. No torch at import time: the ``ctranslate2``
engine never loads it.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtkit.checkpoints.io import describe, load_model, precheck
from mtkit.config import DecodeConfig, DecodeOptions
from mtkit.data.languages import same_pairs, single_pair
from mtkit.engines.capabilities import CAPABILITIES, ENGINES, shortlist_refusal
from mtkit.engines.ctranslate2_engine import CpuThreads, Ctranslate2Engine
from mtkit.engines.ctranslate2_engine import exported_decode as ctranslate2_decode
from mtkit.engines.device import resolve_device
from mtkit.engines.engine import EngineOptions
from mtkit.engines.threads import RECHOOSE_SECONDS, ThreadPolicy, choose_threads, since_start, usable_cpus, user_threads
from mtkit.errors import MtkitError
from mtkit.shortlist import shortlist_path

__all__ = ["ENGINES", "build_translator", "torch_engine"]
logger = logging.getLogger(__name__)  # what the factory loaded; the CLI says it on stderr (mtkit.logs)


def say_loaded(loaded: list) -> None:
    """Say on the ``mtkit`` logger which checkpoints a command runs: ``loaded PATH (step N)``; once their
    settings have passed the checks, so that an error stays the only line."""
    for model in loaded:
        logger.info(f"loaded {describe(model)}")


def is_exported_model(path: Path) -> bool:
    """Whether ``path`` is a directory ``mtkit export ctranslate2`` wrote (its model.bin and mtkit.json)."""
    path = Path(path)
    return path.is_dir() and (path / "model.bin").is_file() and (path / "mtkit.json").is_file()


def is_onnx_export(path: Path) -> bool:
    """Whether ``path`` is a folder ``mtkit export onnx`` wrote (its decoder_step.onnx and mtkit.json; any
    kind of file: the engine refuses one that is not a regular file, naming it)."""
    path = Path(path)
    return path.is_dir() and os.path.lexists(path / "decoder_step.onnx") and os.path.lexists(path / "mtkit.json")


def _exported(decode, saved: Callable[[Path], DecodeConfig], path: Path) -> DecodeConfig:
    """An export's decode settings: ``decode`` as given, made by it from the saved ones (a function), or the
    saved ones (None)."""
    if callable(decode):
        return decode(saved(path))
    return decode or saved(path)


@dataclass(frozen=True)
class LoadOptions:
    """How :func:`mtkit.api.load` (and :func:`mtkit.api.load_models`, the commands', the server's and
    training's door) loads a model (:mod:`mtkit.api` gives it as ``mtkit.api.LoadOptions``).

    Attributes:
        engine: ``torch``, ``ctranslate2`` or ``onnx`` (None: the one the path is for).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        precision: ``fp32``, ``bf16`` or ``fp16`` (CUDA).
        threads: CPU threads. None (the library's default): the process's count is left as it is; 0: one per
            CPU that other work leaves free (or ``OMP_NUM_THREADS``), chosen again between batches by the
            torch engine (what the CLI asks for); N: N. Only 0 and N change torch's count for the process.
        thread_policy: a server's choice, already made (:class:`mtkit.engines.threads.ThreadPolicy`, per
            decoding thread): the torch engine applies it between batches.
        target: the target language calls translate into by default (a multilingual model's).
        any_target: without ``target``, leave it open (each call gives it; a server); False: the model must
            have one target (``translate --tgt-lang`` is required otherwise).
        quantization: with ``engine="ctranslate2"`` on a run directory or checkpoint, its export's weights.
        parallel: batches translated at the same time from several threads (CTranslate2's ``inter_threads``).
        decode: the decoding settings (None: the (first) checkpoint's, or the exported ones; a function makes
            them from those).
        decode_options: the call's decoding options (the flags), set on top of ``decode`` (errors name the flags).
        check: called with the loaded checkpoints before anything is said (a caller's own checks).
        task: ``translate`` (the engine; forced decoding's scorer is derived once, on first
            :meth:`mtkit.api.Model.score`)
            or ``score`` (forced decoding only, built now: no search engine, no thread setting).
        batch_tokens: with ``task="score"``, padded tokens a batch (None: the checkpoint's).
        qe_model: a reference-free COMET model for quality estimation (a hub name or folder, loaded first,
            before the engine; or one loaded already, which a server's models share).
        comet_model: a COMET model to score translations with (``evaluate``'s metric comet), loaded first.
    """

    engine: str | None = None
    device: str = "auto"
    precision: str = "fp32"
    threads: int | None = None
    thread_policy: Any = None
    target: str | None = None
    any_target: bool = True
    quantization: str | None = None
    parallel: int = 1
    decode: Any = None
    decode_options: DecodeOptions | None = None
    check: Callable[[list], None] | None = None
    task: str = "translate"
    batch_tokens: int | None = None
    qe_model: Any = None
    comet_model: str | None = None


def build_translator(paths: list[Path], options: LoadOptions, inspect: Callable[[list], None] | None = None):
    """The engine that ``options`` describe (``engine``, ``device``, ``precision``, ``threads`` …, see
    :class:`LoadOptions`): a torch :class:`TorchEngine` on checkpoints (an ensemble for several), a CTranslate2
    one on an exported directory, an ONNX one on an ONNX export; says (on the ``mtkit`` logger) what it loaded.

    ``inspect`` is called with the loaded checkpoints (LoadedModels) before anything is said: a caller's own
    checks, or what it reads of them (their configs). What was loaded and the thread count go to the ``mtkit``
    logger. Threads (``options.threads``): None leaves torch's count as the process has it
    (CTranslate2's and ONNX Runtime's pools are their own); 0 is one per CPU that other work leaves free
    (:mod:`mtkit.engines.threads`, said), chosen again between batches (torch engine), unless
    ``OMP_NUM_THREADS`` is set; ``thread_policy`` is a caller's choice already made (a server's).
    """
    o = options
    engine, device, precision, threads, decode = o.engine or "torch", o.device, o.precision, o.threads, o.decode
    tgt_lang, parallel, thread_policy = o.target, o.parallel, o.thread_policy
    any_target = o.any_target and o.target is None  # a target given is checked
    overrides = o.decode_options or DecodeOptions()  # the flags, on top of the settings
    if engine == "ctranslate2":
        if len(paths) != 1:
            raise MtkitError("--engine ctranslate2 takes one exported model directory, not an ensemble")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
            raise MtkitError(f"--device {device}: expected auto, cpu, cuda or cuda:N")
        decode = overrides.apply(_exported(decode, ctranslate2_decode, paths[0]))
        if thread_policy is not None:
            threads = thread_policy.current or 0
        threads = threads or 0  # None too: CTranslate2's pool is its own, no state of the process
        # One thread per CPU other work leaves free (the reading spans the process's start); CTranslate2
        # fixes its count when it loads the model.
        chosen = (choose_threads(usable_cpus(), since_start().others())
                  if threads <= 0 and user_threads() is None else None)
        translator = Ctranslate2Engine(paths[0], decode, EngineOptions(device, precision),
                                       CpuThreads(threads, parallel, chosen), target=tgt_lang)
        if not any_target:
            translator.vocab_for(tgt_lang)  # a target the model lacks is an error now, not at the first line
        logger.info(f"loaded {translator.description}")
        if translator.threads_said is not None:
            logger.info(translator.threads_said)
        return translator
    if engine == "onnx":
        from mtkit.engines.onnx_engine import OnnxEngine, exported_decode

        if len(paths) != 1 or not is_onnx_export(paths[0]):
            raise MtkitError("--engine onnx takes one folder written by mtkit export onnx")
        if device != "auto" and device not in CAPABILITIES[engine].devices:  # the CPU only
            raise MtkitError(f"--device {device}: the {CAPABILITIES[engine].title} engine runs on the CPU")
        decode = overrides.apply(_exported(decode, exported_decode, paths[0]))
        if decode.shortlist:
            raise MtkitError(shortlist_refusal(engine))
        if thread_policy is not None:
            threads = thread_policy.current or 0
        why = None
        if threads is not None:  # None: ONNX Runtime's own count, and torch's left as the process has it
            # ONNX Runtime fixes its count when it loads the graphs: the user's, else one per CPU other work
            # leaves free.
            threads, why = choose_threads(usable_cpus(), since_start().others(), user_threads(threads))
        translator = OnnxEngine(paths[0], decode, threads=threads or 0, target=tgt_lang)
        if not any_target:
            translator.vocab_for(tgt_lang)
        logger.info(f"loaded {translator.description}")
        if why is not None:
            logger.info(f"threads: {threads} ({why})")
        return translator
    checked = []
    for path in paths:
        if is_exported_model(path):
            raise MtkitError(f"{path}: not an mtkit checkpoint or run directory (this is an exported CTranslate2 "
                             "model: add --engine ctranslate2)")
        if is_onnx_export(path):
            raise MtkitError(f"{path}: not an mtkit checkpoint or run directory (this is an ONNX export: add "
                             "--engine onnx)")
        checked.append(precheck(path))  # a config its weights do not fit fails here, before torch loads
    device = resolve_device(device)
    if precision == "fp16" and not device.startswith("cuda"):
        raise MtkitError("--precision fp16 needs a CUDA device; use bf16 on CPU")
    import torch

    policy = thread_policy
    if policy is not None:
        torch.set_num_threads(policy.current or torch.get_num_threads())
    elif threads is None:  # not asked: torch's count stays as the process has it
        pass
    elif threads > 0:
        torch.set_num_threads(threads)
    elif device == "cpu" and user_threads() is None:
        # One thread per CPU other work leaves free, never more than torch's own count (its physical
        # cores): two threads time-sliced on one free core wait a scheduler slice at every barrier. The
        # first reading spans the start and the model loading; the engine chooses again between batches.
        policy = ThreadPolicy(torch.set_num_threads, usable=min(usable_cpus(), torch.get_num_threads()),
                              probe=since_start(), min_interval=RECHOOSE_SECONDS, get_threads=torch.get_num_threads)
    loaded = [load_model(p, device, c) for p, c in zip(paths, checked)]  # each file read and checked once
    said = None  # said after the checks below, so that an error stays the only line
    if policy is not None and thread_policy is None:
        said = policy.check()
    elif device == "cpu" and thread_policy is None and threads is not None:
        said = f"threads: {torch.get_num_threads()} (set by {'--threads' if threads > 0 else 'OMP_NUM_THREADS'})"
    if inspect is not None:
        inspect(loaded)
    if callable(decode):
        decode = decode(loaded[0].config.decode)
    decode = overrides.apply(decode or loaded[0].config.decode)
    found = shortlist_path(paths[0])  # the engine reads it when a call first asks for it
    translator = torch_engine(loaded, decode, device, precision, tgt_lang, policy,
                              shortlist=found if found.is_file() else None)
    if not any_target:
        translator.vocab_for(tgt_lang)
    say_loaded(loaded)
    if said is not None:
        logger.info(said)
    return translator


def torch_engine(models: list, decode: DecodeConfig, device: str = "cpu", precision: str = "fp32",
                 target: str | None = None, threads: ThreadPolicy | None = None, warn: bool = True, shortlist=None):
    """The torch engine (:class:`mtkit.engines.torch_engine.TorchEngine`) on models in memory: loaded
    checkpoints (an ensemble for several; their configs give the language pairs and the tag side), or
    training's model for validation (``.model`` and ``.vocab`` only: the vocabulary is the call's; ``warn``
    False: its warnings unsaid); ``shortlist``: the run's :class:`mtkit.shortlist.Shortlist` or its file, or None."""
    from mtkit.engines.torch_engine import TorchEngine

    configs = [getattr(m, "config", None) for m in models]
    languages: tuple[list, tuple[str, str] | None] = ([], None)
    tag_side = "source"
    if configs[0] is not None:
        languages = (same_pairs(configs), single_pair(configs[0].data))
        tag_side = configs[0].data.tag_side
    return TorchEngine(models, decode, EngineOptions(device, precision, warn=warn), languages, tag_side, target,
                       threads, shortlist)


def forced_scorer(models: list, device: str = "cpu", precision: str = "fp32", batch_tokens: int | None = None):
    """Forced decoding (:class:`mtkit.engines.pair_scoring.PairScorer`) on loaded checkpoints (an ensemble for
    several), ``batch_tokens`` padded tokens a batch (None: the first checkpoint's ``decode.batch_tokens``)."""
    from mtkit.engines.pair_scoring import PairScorer

    return PairScorer(models, device=device, precision=precision,
                      batch_tokens=batch_tokens or models[0].config.decode.batch_tokens)
