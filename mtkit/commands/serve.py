"""``mtkit serve``: serve one or more models over HTTP (LibreTranslate's API and mtkit's own).

Each ``-m`` is a model of its own (a checkpoint or run directory; with ``--engine ctranslate2``
an exported directory), built as ``mtkit translate`` builds its engine
(:func:`mtkit.api.load_models`), and named by its path. Its language pair is
its config's ``data.src_lang`` / ``data.tgt_lang`` (for an exported model: those of the run it
was exported from, when its ``config.yaml`` is still there); ``--src-lang`` / ``--tgt-lang`` set
them for every model. A multilingual model (``data.pairs``) serves each of its pairs, as ``NAME:en-de``
…; ``--src-lang`` / ``--tgt-lang`` then keep only the pairs they match. Everything is checked, and
every model loaded, before the server listens.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from mtkit import langid
from mtkit.api import ENGINES, LoadOptions, load_models
from mtkit.config import PRECISIONS, DecodeOptions
from mtkit.data.languages import describe, languages
from mtkit.engines.ctranslate2_engine import read_manifest
from mtkit.engines.quality import load_qe_model
from mtkit.engines.threads import RECHOOSE_SECONDS, ThreadPolicy, serving_choice, since_start, user_threads
from mtkit.errors import MtkitError
from mtkit.export.cache import check_quantization, ctranslate2_model
from mtkit.host_memory import bound_onednn_caches
from mtkit.io import MAX_RECIPE_BYTES, read_yaml_file
from mtkit.langid import short_codes
from mtkit.serve.models import ServedModel
from mtkit.serve.service import Limits, Service
from mtkit.text.phrases import read_constraint_options

# Decoding threads per model: each holds a batch's tensors and its engine threads; beyond a few per core
# they only wait on each other, and thousands exhaust the process's threads.
MAX_DECODING_THREADS = 64
# Constraint phrases per request, at most: their search work grows with them (see Limits.max_phrases).
MAX_PHRASES = 10_000


def read_api_keys(path: Path) -> frozenset[str]:
    """One key per line; blank lines and ``#`` comments are skipped. The keys are never printed."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MtkitError(f"--api-keys {path}: no such file") from None
    except (UnicodeDecodeError, IsADirectoryError):
        raise MtkitError(f"--api-keys {path}: not a text file of keys, one per line") from None
    keys = frozenset(s for line in text.splitlines() if (s := line.strip()) and not s.startswith("#"))
    if not keys:
        raise MtkitError(f"--api-keys {path}: holds no key (one per line)")
    return keys


def _exported_languages(model_dir: Path) -> tuple[str | None, str | None]:
    """An exported model's languages: its manifest's ``data``, else the config.yaml of the run it came from
    (read bounded and without aliases; one that cannot be read leaves them unknown)."""
    manifest = read_manifest(model_dir)
    data = manifest.get("data") or {}
    if data.get("src_lang") and data.get("tgt_lang"):
        return data["src_lang"], data["tgt_lang"]
    source = manifest.get("checkpoint")
    if source:
        for folder in Path(source).parents[:2]:  # RUN/checkpoints/x.pt or RUN/x.pt
            config = folder / "config.yaml"
            if config.is_file():
                try:
                    raw = read_yaml_file(config, MAX_RECIPE_BYTES, "run config")
                except MtkitError:
                    break
                data = raw.get("data") if isinstance(raw, dict) else None
                if not isinstance(data, dict):
                    break
                src, tgt = data.get("src_lang"), data.get("tgt_lang")
                return (src if isinstance(src, str) else None), (tgt if isinstance(tgt, str) else None)
    return None, None


def _served_pairs(name: str, path: Path, translator, engine: str, step: int | None, src_lang: str | None,
                  tgt_lang: str | None) -> list:
    """A multilingual model's pairs as served models ``NAME:en-de`` …, one engine asked for each pair's
    target; a request naming ``NAME`` picks among them by source and target. ``--src-lang``
    / ``--tgt-lang`` keep only the pairs they match."""
    pairs = translator.languages[0]
    chosen = [p for p in pairs if src_lang in (None, p.src_lang) and tgt_lang in (None, p.tgt_lang)]
    if not chosen:
        raise MtkitError(f"-m {path}: translates {describe(pairs)}; none of them matches --src-lang / --tgt-lang")
    print(f"model {name}: {describe(chosen)}", file=sys.stderr, flush=True)
    # LibreTranslate's clients name languages by ISO 639-1: an NLLB model's fra_Latn is served as fr
    short = short_codes(languages(pairs)) if translator.tag_side == "codes" else {}
    return [ServedModel(f"{name}:{p.name}", translator, short.get(p.src_lang, p.src_lang),
                        short.get(p.tgt_lang, p.tgt_lang), engine, step, group=name, target=p.tgt_lang)
            for p in chosen]


def _names(paths: list[Path]) -> list[str]:
    """Each model's name: its run directory's (or file's) name, made unique with -2, -3 ..."""
    names: list[str] = []
    for path in paths:
        path = Path(path)
        base = path.parent.parent.name if path.parent.name == "checkpoints" else (path.stem or "model")
        name, k = base, 2
        while name in names:
            name, k = f"{base}-{k}", k + 1
        names.append(name)
    return names


def default_connections() -> int:
    """Half the process's file-descriptor limit (the rest for models, logs and connections being refused),
    at most 1024."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        return 256
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(8, min(1024, soft // 2))


def _set_torch_threads(n: int) -> None:
    import torch  # loaded already by the torch engine (never by CTranslate2's, whose count is fixed)

    torch.set_num_threads(n)


def _get_torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def serving_policy(engine: str, threads: int, decoding_threads: int):
    """The engine's CPU threads per decoding thread: the user's (``--threads``, ``OMP_NUM_THREADS``), else
    the CPUs other work leaves free but one, shared by the decoding threads, at least 1 each
    (:func:`mtkit.engines.threads.serving_choice`), chosen now (the reading spans the start) and, for the
    torch engine, again between batches; the policy and what to say of its first choice (the caller says it
    once the models have loaded, so that an error before stays the only line)."""
    torch_engine = engine == "torch"
    policy = ThreadPolicy(_set_torch_threads if torch_engine else (lambda n: None), user_threads(threads),
                          probe=since_start(), choose=serving_choice(decoding_threads),
                          min_interval=RECHOOSE_SECONDS, get_threads=_get_torch_threads if torch_engine else None)
    said = policy.check(apply=False)  # torch is not loaded yet: the engine applies the count
    return policy, said


@dataclass(frozen=True)
class ServeOptions:
    """Everything ``mtkit serve`` takes besides its models (the CLI's flags, one field each), checked once
    (:meth:`check`) before anything loads."""

    engine: str = "torch"
    host: str = "127.0.0.1"
    port: int = 5000
    device: str = "auto"
    precision: str = "fp32"
    threads: int = 0
    decode: DecodeOptions = field(default_factory=DecodeOptions)  # the default decoding (--beam ...): requests may ask
    # for another; --batch-tokens is also the source tokens per merge of requests
    src_lang: str | None = None
    tgt_lang: str | None = None
    api_keys: Path | None = None
    max_wait_ms: float = 0.0
    decoding_threads: int = 2
    max_queue: int = 256
    max_body_bytes: int = 1 << 20
    max_file_bytes: int = 16 << 20  # POST /translate_file's largest document; 0: file translation off
    max_chars: int = 20_000
    max_sentences: int = 128
    max_beam: int = 8
    graceful_timeout: float = 30.0
    access_log: bool = False
    glossary: Path | None = None
    header_timeout: float = 10.0
    body_timeout: float = 20.0
    keep_alive_timeout: float = 5.0
    max_connections: int = 0
    cors: bool = True
    max_phrases: int = 64
    decode_timeout: float = 60.0
    quantization: str | None = None
    qe_model: str | None = None

    def check(self) -> None:
        """One error line for the first setting out of its range (the decoding options through
        :meth:`mtkit.config.DecodeOptions.check`)."""
        batch_tokens = self.decode.batch_tokens
        if self.engine not in ENGINES:
            raise MtkitError(f"--engine {self.engine}: expected one of {', '.join(ENGINES)}")
        if self.quantization is not None:
            check_quantization(self.engine, self.quantization)
        if self.precision not in PRECISIONS:
            raise MtkitError(f"--precision {self.precision}: expected one of {', '.join(PRECISIONS)}")
        for flag, value, low in (("--max-queue", self.max_queue, 1), ("--max-body-bytes", self.max_body_bytes, 1),
                                 ("--max-chars", self.max_chars, 1), ("--max-sentences", self.max_sentences, 1),
                                 ("--max-beam", self.max_beam, 1), ("--threads", self.threads, 0),
                                 ("--batch-tokens", 1 if batch_tokens is None else batch_tokens, 1)):
            if value < low:
                raise MtkitError(f"{flag}: must be >= {low}, got {value}")
        for flag, value, high in (("--decoding-threads", self.decoding_threads, MAX_DECODING_THREADS),
                                  ("--max-phrases", self.max_phrases, MAX_PHRASES)):
            if not 1 <= value <= high:
                raise MtkitError(f"{flag}: must be between 1 and {high}, got {value}")
        for flag, value, low in (("--max-wait-ms", self.max_wait_ms, 0.0),
                                 ("--graceful-timeout", self.graceful_timeout, 0.0),
                                 ("--header-timeout", self.header_timeout, 0.001),
                                 ("--body-timeout", self.body_timeout, 0.001),
                                 ("--keep-alive-timeout", self.keep_alive_timeout, 0.001),
                                 ("--decode-timeout", self.decode_timeout, 0.001)):
            if not math.isfinite(value) or value < low or value > 86_400:
                raise MtkitError(f"{flag}: must be a number of {'milliseconds' if 'ms' in flag else 'seconds'} "
                                 f"between {low:g} and 86400, got {value}")
        if self.max_file_bytes < 0:
            raise MtkitError(f"--max-file-bytes: must be >= 0 (0: file translation off), got {self.max_file_bytes}")
        if self.max_connections < 0:
            raise MtkitError(f"--max-connections: must be >= 0, got {self.max_connections}")
        if not 0 <= self.port <= 65535:
            raise MtkitError(f"--port: must be between 0 and 65535, got {self.port}")
        self.decode.check()
        if (self.decode.beam or 1) > self.max_beam:
            raise MtkitError(f"--beam {self.decode.beam}: above --max-beam {self.max_beam}")


def serve(models: list[Path], options: ServeOptions | None = None) -> None:
    """Load ``models`` and serve them until SIGTERM or Ctrl-C (then finish what is in flight and return)."""
    o = options or ServeOptions()
    bound_onednn_caches()  # before torch is loaded: batch shapes vary without end in a server
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise MtkitError(f"mtkit serve needs the serve extra ({e.name} is missing): "
                         "pip install 'mtkit[serve]'") from None
    o.check()
    keys = read_api_keys(o.api_keys) if o.api_keys is not None else None
    terms = None
    if o.glossary is not None:
        _, terms = read_constraint_options(None, o.glossary, o.engine)
    paths = [Path(p) for p in models]
    for path in paths:
        if not path.exists():
            raise MtkitError(f"-m {path}: no such checkpoint, run directory or exported model")
    qe = None
    if o.qe_model is not None:
        qe = load_qe_model(o.qe_model, o.device)
        print(f"quality estimation: {o.qe_model}", file=sys.stderr, flush=True)
    names = _names(paths)
    if o.engine == "ctranslate2":  # a checkpoint or run directory: its export, made on first use and kept
        paths = [ctranslate2_model(p, o.quantization) for p in paths]
    policy, threads_said = serving_policy(o.engine, o.threads, o.decoding_threads)

    from mtkit.serve.app import create_app
    from mtkit.serve.server import Cors, Guard, run
    served = []
    load = LoadOptions(engine=o.engine, device=o.device, precision=o.precision, threads=o.threads,
                       thread_policy=policy, any_target=True, parallel=o.decoding_threads, decode_options=o.decode,
                       qe_model=qe)  # exported above: the folders are CTranslate2's (quantization is theirs)
    for name, path in zip(names, paths):
        model = load_models([path], load)
        translator = model.engine
        found: dict = {}
        if model.checkpoints:
            data = model.checkpoints[0].config.data
            found["src"], found["tgt"], found["step"] = data.src_lang, data.tgt_lang, model.checkpoints[0].step
        if o.engine == "ctranslate2":
            found["src"], found["tgt"] = _exported_languages(path)
            found["step"] = read_manifest(path).get("step")
        elif o.engine == "onnx":
            manifest = translator.model.manifest
            data = manifest.get("data") or {}
            found["src"], found["tgt"], found["step"] = data.get("src_lang"), data.get("tgt_lang"), manifest.get("step")
        if translator.languages[0]:  # a multilingual model: one served entry per pair, sharing the weights
            served += _served_pairs(name, path, translator, o.engine, found.get("step"), o.src_lang,
                                    o.tgt_lang)
            continue
        src, tgt = o.src_lang or found.get("src"), o.tgt_lang or found.get("tgt")
        if not src or not tgt:
            raise MtkitError(f"-m {path}: its language pair is not recorded with it; give --src-lang and --tgt-lang")
        served.append(ServedModel(name, translator, src, tgt, o.engine, found.get("step")))
        print(f"model {name}: {src}-{tgt}", file=sys.stderr, flush=True)

    print(threads_said, file=sys.stderr, flush=True)
    limits = Limits(max_body_bytes=o.max_body_bytes, max_chars=o.max_chars, max_sentences=o.max_sentences,
                    max_beam=o.max_beam, max_queue=o.max_queue, max_wait_ms=o.max_wait_ms,
                    batch_tokens=o.decode.batch_tokens, decoding_threads=o.decoding_threads, max_phrases=o.max_phrases,
                    decode_timeout=o.decode_timeout, max_file_bytes=o.max_file_bytes)
    service = Service(served, limits, keys, terms, qe)
    if terms is not None:
        print(f"glossary: {len(terms)} terms from {o.glossary}", file=sys.stderr, flush=True)
    if keys is not None:
        print(f"API keys: {len(keys)} from {o.api_keys}", file=sys.stderr, flush=True)
    app = create_app(service)
    app = Guard(Cors(app) if o.cors else app, o.max_body_bytes, service.metrics, o.body_timeout, o.access_log,
                o.max_file_bytes)
    started = time.perf_counter()
    service.start()  # here, not in uvicorn's startup: a thread the system refuses is one error line
    if langid.available():
        print(f"language identification: {len(service.languages)} languages loaded in "
              f"{time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    try:
        run(app, o.host, o.port, o.graceful_timeout, o.header_timeout, o.keep_alive_timeout,
            o.max_connections or default_connections())
    finally:
        service.stop()  # when the server did not start (its shutdown stops it otherwise; again is a no-op)
