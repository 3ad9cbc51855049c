"""ONNX Runtime behind mtkit's search: the two graphs of :mod:`mtkit.export.onnx` as a search model, and the
engine ``--engine onnx`` runs (:class:`OnnxEngine`).

:class:`OnnxModel` follows the protocol of :mod:`mtkit.decoding.options` (``encode``, ``init_cache``,
``decode_step``, and the cache's ``reorder`` and ``select_sentences``), so greedy search, sampling and beam
search are mtkit's own loops (:mod:`mtkit.decoding.search`): only the network runs in ONNX Runtime. Tensors
cross as numpy arrays without copies (``torch.from_numpy``).

A graph is a program (an ONNX ``Loop`` may never end), so every run has a deadline: :data:`RUN_SECONDS` plus
the time its multiply-adds would take at :data:`SLOW_MACS` a second, counting each weight of the graph file once
per token the run computes (:meth:`OnnxModel.deadline`): bounded by what it is given. A :class:`RunWatch`
thread sets the run's ``terminate`` flag at that deadline, or as soon as the call's ``should_stop`` says so (a
server's deadline, a request nobody waits for); ONNX Runtime then ends the run between two operators. Any
error of a run is one line naming the graph file.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from mtkit.config import PAD_ID, DecodeConfig, saved_decode
from mtkit.data.languages import decoder_prefix, decoder_start, pairs_from_list
from mtkit.data.vocab import Vocab
from mtkit.decoding.options import SearchOptions
from mtkit.engines import manifest as manifest_file
from mtkit.engines.capabilities import ONNX
from mtkit.engines.engine import Call, Engine, Stopped
from mtkit.engines.threads import ThreadPolicy
from mtkit.engines.torch_engine import padded_sources, run_search
from mtkit.errors import MtkitError
from mtkit.io import open_regular

MANIFEST = manifest_file.NAME
ENCODER = "encoder.onnx"
STEP = "decoder_step.onnx"

# A run's deadline: this many seconds, plus its multiply-adds at SLOW_MACS a second (a hundredth of what one
# core does: far above what a sound graph takes on a busy machine), each weight of the graph counted once
# per token the run computes.
RUN_SECONDS = 10.0
SLOW_MACS = 1e8
POLL_SECONDS = 0.05  # how often the watch asks a call's should_stop


def graph_names(layers: int) -> dict:
    """The two graphs' input and output names, for a model of ``layers`` decoder layers."""
    cross = [n for i in range(layers) for n in (f"cross_k.{i}", f"cross_v.{i}")]
    cache = [n for i in range(layers) for n in (f"self_k.{i}", f"self_v.{i}", f"cross_k.{i}", f"cross_v.{i}")]
    new = [n for i in range(layers) for n in (f"new_self_k.{i}", f"new_self_v.{i}")]
    return {"encoder": {"inputs": ["src"], "outputs": cross},
            "step": {"inputs": ["tokens", "src_mask", *cache], "outputs": ["logits", *new]}}


def read_manifest(folder: Path) -> dict:
    """An ONNX export's ``mtkit.json``, read in bounded work, with the fields the engine uses type-checked."""
    path = Path(folder) / MANIFEST
    # Present (a FIFO or a device too: read_json_file and OnnxModel refuse those, naming them, unopened).
    if not os.path.lexists(Path(folder) / STEP) or not os.path.lexists(path):
        raise MtkitError(f"{folder}: not an mtkit ONNX export (no {STEP} or {MANIFEST}); make one with "
                         "'mtkit export onnx'")
    manifest = manifest_file.read(folder, "ONNX export manifest")
    model = manifest.get("model") if isinstance(manifest, dict) else None
    if not isinstance(model, dict):
        raise MtkitError(f"{path}: no 'model' object")
    for key in ("h", "d_model", "decoder_layers", "max_positions"):
        value = model.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= 1 << 20:
            raise MtkitError(f"{path}: model.{key} must be a positive integer, got {value!r}")
    if model["d_model"] % model["h"]:
        raise MtkitError(f"{path}: model.h ({model['h']}) must divide model.d_model ({model['d_model']})")
    return manifest


@dataclass
class OnnxCache:
    """The step graph's explicit state: per layer self_k, self_v (N, h, t, d_k) and cross_k, cross_v
    (N, h, S, d_k), all one row per hypothesis; ``src_mask`` (N, S)."""

    tensors: list[Tensor]  # self_k.0, self_v.0, cross_k.0, cross_v.0, self_k.1, ...
    src_mask: Tensor
    beam: int

    def reorder(self, indices: Tensor) -> OnnxCache:
        # Only the self-attention keys and values move; a sentence's rows share its cross keys and values.
        return replace(self, tensors=[t.index_select(0, indices) if i % 4 < 2 else t
                                      for i, t in enumerate(self.tensors)])

    def select_sentences(self, sentences: Tensor) -> OnnxCache:
        rows = (sentences.unsqueeze(1) * self.beam + torch.arange(self.beam)).flatten()
        return replace(self, tensors=[t.index_select(0, rows) for t in self.tensors],
                       src_mask=self.src_mask.index_select(0, rows))


@dataclass(eq=False)
class WatchedRun:
    """One run :class:`RunWatch` watches: its ``RunOptions``, its deadline (``time.monotonic()``), its call's
    ``should_stop``, and why the watch ended it (``deadline`` or ``stopped``; None: it did not)."""

    options: object
    deadline: float
    should_stop: Callable[[], bool] | None
    ended: str | None = None


class RunWatch:
    """Ends ONNX Runtime runs that outlive their deadline or whose ``should_stop`` says so, by setting their
    ``RunOptions.terminate``: one thread, started with the first run it watches and ending once it has
    watched none for a second (so that a model that is no longer used leaves no thread behind)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: set[WatchedRun] = set()
        self._thread: threading.Thread | None = None

    def start(self, options, seconds: float, should_stop: Callable[[], bool] | None) -> WatchedRun:
        """Watch the run of ``options`` from now; what to give :meth:`end` when it returns."""
        run = WatchedRun(options, time.monotonic() + seconds, should_stop)
        with self._lock:
            self._runs.add(run)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="mtkit-onnx-watch", daemon=True)
                self._thread.start()
        return run

    def end(self, run: WatchedRun) -> None:
        with self._lock:
            self._runs.discard(run)

    def _watch(self) -> None:
        idle_since = None
        while True:
            with self._lock:
                runs = list(self._runs)
                now = time.monotonic()
                if runs:
                    idle_since = None
                elif idle_since is None:
                    idle_since = now
                elif now - idle_since > 1.0:
                    self._thread = None
                    return
            for run in runs:
                if run.ended is not None:
                    continue
                if now >= run.deadline:
                    run.ended = "deadline"
                else:
                    try:
                        if run.should_stop is not None and run.should_stop():
                            run.ended = "stopped"
                    except Exception:  # noqa: BLE001 (a broken hook stops its run, never the watch)
                        run.ended = "stopped"
                if run.ended is not None:
                    run.options.terminate = True
            time.sleep(POLL_SECONDS)


class OnnxModel:
    """An exported folder's graphs in ONNX Runtime sessions of ``threads`` threads each (0: ONNX Runtime's
    own count); every run watched (:class:`RunWatch`): it ends at its deadline (:meth:`deadline`) or once
    ``should_stop`` (:meth:`for_call`) says so."""

    def __init__(self, folder: str | Path, threads: int = 1) -> None:
        try:
            import onnxruntime as ort
        except ImportError:
            raise MtkitError("the ONNX engine needs onnxruntime (pip install 'mtkit[onnx]')") from None
        self.ort = ort
        self.folder = folder = Path(folder)
        self.manifest = read_manifest(folder)
        model = self.manifest["model"]
        self.heads, self.d_k, self.layers = model["h"], model["d_model"] // model["h"], model["decoder_layers"]
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 4  # fatal only: a failure is our one line, not ONNX Runtime's log too
        self.watch = RunWatch()
        self.should_stop: Callable[[], bool] | None = None
        self.weights: dict[str, int] = {}  # graph file -> its size / 4 (fp32 weights): the work of a token
        sessions = []
        for name, key in ((ENCODER, "encoder"), (STEP, "step")):
            # A regular file, checked without blocking: ONNX Runtime would wait forever on a FIFO, read
            # /dev/zero until memory ends.
            with open_regular(folder / name, f"no such file (an mtkit ONNX export has {ENCODER} and {STEP})",
                              "is a directory, expected an ONNX graph") as f:
                self.weights[name] = os.fstat(f.fileno()).st_size // 4
            try:
                session = ort.InferenceSession(str(folder / name), options, providers=["CPUExecutionProvider"])
            except Exception as e:  # noqa: BLE001 (ONNX Runtime's own errors on a broken or foreign file: one line)
                why = (str(e).strip().splitlines() or [""])[0][:200]
                raise MtkitError(f"{folder / name}: ONNX Runtime could not load it ({why})") from None
            want = graph_names(self.layers)[key]
            found = {"inputs": [i.name for i in session.get_inputs()],
                     "outputs": [o.name for o in session.get_outputs()]}
            if found != want:
                raise MtkitError(f"{folder / name}: its inputs and outputs are not those of a model of "
                                 f"{self.layers} decoder layers ({MANIFEST}'s model)")
            sessions.append(session)
        self.encoder, self.step = sessions
        self.step_inputs = graph_names(self.layers)["step"]["inputs"]

    def for_call(self, should_stop: Callable[[], bool] | None) -> OnnxModel:
        """This model (the same sessions) for one call: its runs also end once ``should_stop()`` says so
        (asked every :data:`POLL_SECONDS` while a graph runs), raising :class:`Stopped`."""
        found = copy.copy(self)
        found.should_stop = should_stop
        return found

    def deadline(self, name: str, tokens: int) -> float:
        """Seconds a run of graph ``name`` computing ``tokens`` tokens may take (:data:`RUN_SECONDS` plus
        its multiply-adds, each weight once per token, at :data:`SLOW_MACS` a second)."""
        return RUN_SECONDS + tokens * self.weights[name] / SLOW_MACS

    def run(self, name: str, feed: dict, tokens: int) -> list:
        """The outputs of graph ``name`` on ``feed``: one :class:`MtkitError` line naming the graph file for
        any error of ONNX Runtime or a run past its :meth:`deadline`; :class:`Stopped` when ``should_stop``
        ended it."""
        session = self.encoder if name == ENCODER else self.step
        options = self.ort.RunOptions()
        options.log_severity_level = 4
        seconds = self.deadline(name, tokens)
        watched = self.watch.start(options, seconds, self.should_stop)
        try:
            return session.run(None, feed, options)
        except Exception as e:  # noqa: BLE001 (ONNX Runtime's errors, of a graph from elsewhere: one line)
            if watched.ended == "stopped":
                raise Stopped("the translation was stopped (its deadline passed or nobody waits for it)") from None
            if watched.ended == "deadline":
                raise MtkitError(f"{self.folder / name}: ONNX Runtime did not finish a run within {seconds:.3g} s "
                                 "(the graph may loop forever)") from None
            why = (str(e).strip().splitlines() or [""])[0][:200]
            raise MtkitError(f"{self.folder / name}: ONNX Runtime failed to run it ({why})") from None
        finally:
            self.watch.end(watched)

    def encode(self, src: Tensor) -> tuple[list[Tensor], Tensor]:
        """src (B, S) -> the cross keys and values of every layer (B, h, S, d_k) and the mask (B, S)."""
        out = self.run(ENCODER, {"src": src.numpy()}, src.numel())
        return [torch.from_numpy(a) for a in out], src != PAD_ID

    def init_cache(self, memory: list[Tensor], src_mask: Tensor, beam: int = 1) -> OnnxCache:
        B = src_mask.size(0)
        empty = torch.zeros(B * beam, self.heads, 0, self.d_k)
        tensors = []
        for i in range(self.layers):
            k, v = memory[2 * i], memory[2 * i + 1]
            if beam > 1:
                k, v = k.repeat_interleave(beam, 0), v.repeat_interleave(beam, 0)
            tensors += [empty, empty, k, v]
        mask = src_mask.repeat_interleave(beam, 0) if beam > 1 else src_mask
        return OnnxCache(tensors, mask, beam)

    def decode_step(self, tokens: Tensor, cache: OnnxCache) -> tuple[Tensor, OnnxCache]:
        feed = {"tokens": tokens.reshape(-1, 1).numpy(), "src_mask": cache.src_mask.numpy()}
        for name, t in zip(self.step_inputs[2:], cache.tensors):
            feed[name] = t.contiguous().numpy()
        logits, *new = self.run(STEP, feed, tokens.numel())
        tensors = list(cache.tensors)
        for i in range(self.layers):
            tensors[4 * i], tensors[4 * i + 1] = torch.from_numpy(new[2 * i]), torch.from_numpy(new[2 * i + 1])
        return torch.from_numpy(logits), replace(cache, tensors=tensors)


def exported_decode(folder: Path) -> DecodeConfig:
    """The recipe's decode settings an ONNX export keeps in its mtkit.json, through the recipe's checks."""
    return saved_decode(read_manifest(folder).get("decode"), Path(folder) / MANIFEST)


class OnnxEngine(Engine):
    """Translate with an ``mtkit export onnx`` folder: mtkit's line pipeline and search, the network in ONNX
    Runtime (``threads`` per session; 0: one per CPU, ONNX Runtime's own count). The search runs in torch:
    ``threads`` > 0 is torch's count too, set now and in each thread that translates (torch keeps one per
    thread), so that torch's threads never outnumber the CPUs the count was chosen for."""

    capabilities = ONNX

    def __init__(self, folder: str | Path, decode: DecodeConfig, threads: int = 0, target: str | None = None,
                 seed: int = 1) -> None:
        folder = Path(folder)
        self.model = OnnxModel(folder, threads)
        manifest = self.model.manifest
        data = manifest.get("data") or {}
        single = (data["src_lang"], data["tgt_lang"]) if data.get("src_lang") and data.get("tgt_lang") else None
        policy = None
        if threads > 0:  # fixed, as ONNX Runtime's: applied here, and by the pipeline before each batch
            policy = ThreadPolicy(torch.set_num_threads, (threads, "the ONNX sessions' count"), usable=threads,
                                  get_threads=torch.get_num_threads)
            policy.fit()
        super().__init__(Vocab.load(folder), decode, manifest["model"].get("max_positions"),
                         languages=(pairs_from_list(manifest.get("pairs")), single),
                         tag_side=manifest.get("tag_side") or "source", target=target, threads=policy)
        self.seed = seed
        source = manifest.get("checkpoint")
        if source and manifest.get("step") is not None:
            source += f" (step {manifest['step']})"
        self.description = f"{folder} (ONNX Runtime" + (f", exported from {source})" if source else ")")

    def call(self, options: DecodeConfig | None = None, target: str | None = None) -> Call:
        """As the pipeline's, with a generator of its own seeded with ``seed`` when it samples."""
        found = super().call(options, target)
        if not found.decode.sampling:
            return found
        return dataclasses.replace(found, generator=torch.Generator().manual_seed(self.seed))

    def search_batch(self, batch: list[list[int]], call: Call) -> list[list[tuple[list[int], float, float]]]:
        src = padded_sources(batch)
        options = SearchOptions.from_decode(call.decode, max_len_limit=self.max_out_len,
                                            start=decoder_start(call.vocab), prefix=decoder_prefix(call.vocab),
                                            should_stop=call.should_stop)
        return run_search(self.model.for_call(call.should_stop), src, options, call.generator)
