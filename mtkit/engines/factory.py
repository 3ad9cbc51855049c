"""The engine factory: the engine that ``translate``, ``serve``, ``evaluate`` and the benchmarks run (a torch
:class:`TorchEngine` on checkpoints, an ensemble for several, or a CTranslate2 one on an exported directory),
with the call's decoding options (:class:`mtkit.config.DecodeOptions`) set on its settings.

Errors name the flag (``--nbest``), not the config key. No torch at import time: the ``ctranslate2``
engine never loads it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from mtkit.config import DecodeConfig, DecodeOptions
from mtkit.engines.engine import stderr
from mtkit.engines.threads import RECHOOSE_SECONDS, ThreadPolicy, choose_threads, since_start, usable_cpus, user_threads
from mtkit.errors import MtkitError

ENGINES = ("torch", "ctranslate2", "onnx")


def say_loaded(loaded: list, log: Callable[[str], None] = stderr) -> None:
    """Say on stderr (or ``log``) which checkpoints a command runs: ``loaded PATH (step N)``; once their
    settings have passed the checks, so that an error stays the only line."""
    from mtkit.engines.checkpoint import describe

    for model in loaded:
        log(f"loaded {describe(model)}")


def is_exported_model(path: Path) -> bool:
    """Whether ``path`` is a directory ``mtkit export ctranslate2`` wrote (its model.bin and mtkit.json)."""
    path = Path(path)
    return path.is_dir() and (path / "model.bin").is_file() and (path / "mtkit.json").is_file()


def is_onnx_export(path: Path) -> bool:
    """Whether ``path`` is a folder ``mtkit export onnx`` wrote (its decoder_step.onnx and mtkit.json; any
    kind of file: the engine refuses one that is not a regular file, naming it)."""
    import os

    path = Path(path)
    return path.is_dir() and os.path.lexists(path / "decoder_step.onnx") and os.path.lexists(path / "mtkit.json")


def _exported(decode, saved: Callable[[Path], DecodeConfig], path: Path) -> DecodeConfig:
    """An export's decode settings: ``decode`` as given, made by it from the saved ones (a function), or the
    saved ones (None)."""
    if callable(decode):
        return decode(saved(path))
    return decode or saved(path)


def build_translator(paths: list[Path], engine: str = "torch", device: str = "auto", precision: str = "fp32",
                     threads: int = 0, options: DecodeOptions | None = None,
                     decode: DecodeConfig | Callable[[DecodeConfig], DecodeConfig] | None = None,
                     inspect: Callable[[list], None] | None = None, tgt_lang: str | None = None,
                     any_target: bool = False, parallel: int = 1, thread_policy: ThreadPolicy | None = None,
                     log: Callable[[str], None] = stderr):
    """The engine that ``translate`` (and ``serve``) runs: a torch :class:`TorchEngine` on checkpoints (an
    ensemble for several), or a CTranslate2 one on an exported directory; says on stderr what it loaded.

    Args:
        decode: the decoding settings; None takes the (first) checkpoint's (or the exported ones); a
            function makes them from those.
        options: the decoding options of the call (command-line flags), set on top of ``decode``; errors name
            the flags.
        inspect: called with the loaded checkpoints (LoadedModels) before anything is said: a caller's own
            checks, or what it reads of them (their configs).
        tgt_lang: the target language of a multilingual model (``--tgt-lang``): the engine's default target,
            whose tag then leads each source (or the decoder).
        any_target: leave the target open (``serve``, which gives it per call).
        parallel: batches translated at the same time from several threads (CTranslate2's ``inter_threads``;
            the torch engine needs nothing for it).
        threads: CPU threads per translation; 0: one per CPU that other work leaves free
            (:mod:`mtkit.engines.threads`, said on stderr), chosen again between batches (torch engine),
            unless ``OMP_NUM_THREADS`` is set.
        thread_policy: the caller's own choice, already made (a server's, per decoding thread); the torch
            engine applies it between batches.
        log: where what was loaded, the thread count and the engine's warnings are said (stderr).
    """
    options = options or DecodeOptions()
    if engine == "ctranslate2":
        if len(paths) != 1:
            raise MtkitError("--engine ctranslate2 takes one exported model directory, not an ensemble")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
            raise MtkitError(f"--device {device}: expected auto, cpu, cuda or cuda:N")
        from mtkit.engines.ctranslate2_engine import Ctranslate2Engine, exported_decode

        decode = options.apply(_exported(decode, exported_decode, paths[0]))
        if thread_policy is not None:
            threads = thread_policy.current or 0
        # One thread per CPU other work leaves free (the reading spans the process's start); CTranslate2
        # fixes its count when it loads the model.
        chosen = (choose_threads(usable_cpus(), since_start().others())
                  if threads <= 0 and user_threads() is None else None)
        translator = Ctranslate2Engine(paths[0], decode, device=device, precision=precision,
                                       intra_threads=threads, inter_threads=parallel, target=tgt_lang,
                                       chosen_threads=chosen)
        if not any_target:
            translator.vocab_for(tgt_lang)  # a target the model lacks is an error now, not at the first line
        log(f"loaded {translator.description}")
        if translator.threads_said is not None:
            log(translator.threads_said)
        return translator
    if engine == "onnx":
        from mtkit.engines.onnx_engine import OnnxEngine, exported_decode

        if len(paths) != 1 or not is_onnx_export(paths[0]):
            raise MtkitError("--engine onnx takes one folder written by mtkit export onnx")
        if device not in ("auto", "cpu"):
            raise MtkitError(f"--device {device}: the ONNX engine runs on the CPU")
        decode = options.apply(_exported(decode, exported_decode, paths[0]))
        if thread_policy is not None:
            threads = thread_policy.current or 0
        # ONNX Runtime fixes its count when it loads the graphs: the user's, else one per CPU other work leaves free.
        threads, why = choose_threads(usable_cpus(), since_start().others(), user_threads(threads))
        translator = OnnxEngine(paths[0], decode, threads=threads, target=tgt_lang)
        if not any_target:
            translator.vocab_for(tgt_lang)
        log(f"loaded {translator.description}")
        log(f"threads: {threads} ({why})")
        return translator
    from mtkit.engines.checkpoint import precheck
    from mtkit.engines.device import resolve_device

    for path in paths:
        if is_exported_model(path):
            raise MtkitError(f"{path}: not an mtkit checkpoint or run directory (this is an exported CTranslate2 "
                             "model: add --engine ctranslate2)")
        if is_onnx_export(path):
            raise MtkitError(f"{path}: not an mtkit checkpoint or run directory (this is an ONNX export: add "
                             "--engine onnx)")
        precheck(path)  # a config its weights do not fit fails here, before torch loads
    device = resolve_device(device)
    if precision == "fp16" and not device.startswith("cuda"):
        raise MtkitError("--precision fp16 needs a CUDA device; use bf16 on CPU")
    import torch

    policy = thread_policy
    if policy is not None:
        torch.set_num_threads(policy.current or torch.get_num_threads())
    elif threads > 0:
        torch.set_num_threads(threads)
    elif device == "cpu" and user_threads() is None:
        # One thread per CPU other work leaves free, never more than torch's own count (its physical
        # cores): two threads time-sliced on one free core wait a scheduler slice at every barrier. The
        # first reading spans the start and the model loading; the engine chooses again between batches.
        policy = ThreadPolicy(torch.set_num_threads, usable=min(usable_cpus(), torch.get_num_threads()),
                              probe=since_start(), min_interval=RECHOOSE_SECONDS, get_threads=torch.get_num_threads)
    from mtkit.engines.checkpoint import load_model

    loaded = [load_model(p, device) for p in paths]
    said = None  # said after the checks below, so that an error stays the only line
    if policy is not None and thread_policy is None:
        said = policy.check()
    elif device == "cpu" and thread_policy is None:
        said = f"threads: {torch.get_num_threads()} (set by {'--threads' if threads > 0 else 'OMP_NUM_THREADS'})"
    if inspect is not None:
        inspect(loaded)
    if callable(decode):
        decode = decode(loaded[0].config.decode)
    decode = options.apply(decode or loaded[0].config.decode)
    translator = torch_engine(loaded, decode, device, precision, tgt_lang, policy, log)
    if not any_target:
        translator.vocab_for(tgt_lang)
    say_loaded(loaded, log)
    if said is not None:
        log(said)
    return translator


def torch_engine(models: list, decode: DecodeConfig, device: str = "cpu", precision: str = "fp32",
                 target: str | None = None, threads: ThreadPolicy | None = None, log: Callable[[str], None] = stderr):
    """The torch engine (:class:`mtkit.engines.torch_engine.TorchEngine`) on models in memory: loaded
    checkpoints (an ensemble for several; their configs give the language pairs and the tag side), or
    training's model for validation (``.model`` and ``.vocab`` only: the vocabulary is the call's)."""
    from mtkit.engines.torch_engine import TorchEngine

    configs = [getattr(m, "config", None) for m in models]
    languages: tuple[list, tuple[str, str] | None] = ([], None)
    tag_side = "source"
    if configs[0] is not None:
        from mtkit.data.languages import same_pairs, single_pair

        languages = (same_pairs(configs), single_pair(configs[0].data))
        tag_side = configs[0].data.tag_side
    return TorchEngine(models, decode, device=device, precision=precision, languages=languages, tag_side=tag_side,
                       target=target, threads=threads, log=log)


def forced_scorer(models: list, device: str = "cpu", precision: str = "fp32", batch_tokens: int | None = None):
    """Forced decoding (:class:`mtkit.engines.pair_scoring.PairScorer`) on loaded checkpoints (an ensemble for
    several), ``batch_tokens`` padded tokens a batch (None: the first checkpoint's ``decode.batch_tokens``)."""
    from mtkit.engines.pair_scoring import PairScorer

    return PairScorer(models, device=device, precision=precision,
                      batch_tokens=batch_tokens or models[0].config.decode.batch_tokens)
