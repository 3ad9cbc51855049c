"""One server's state: its models and their batchers, the limits, the API keys, the metrics and the
server-wide glossary, and what every request asks of them (a model for a language pair, decode
settings and constraints through the config's checks, a translation through the model's batcher,
within ``--decode-timeout``), and whether it is healthy (:meth:`Service.healthy`: its decoding threads
run and its queues move).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from mtkit import langid
from mtkit.config import DecodeConfig, DecodeOptions
from mtkit.engines.capabilities import include_refusal
from mtkit.engines.constraints import Constraints
from mtkit.engines.engine import Stopped, Translation
from mtkit.engines.quality import confidence
from mtkit.errors import MtkitError
from mtkit.serve.batcher import Batcher, BatchPolicy, QueueFull
from mtkit.serve.files import Cancelled, FileWork
from mtkit.serve.metrics import Metrics
from mtkit.serve.models import ServedModel
from mtkit.serve.schemas import ApiError
from mtkit.text.glossary import Glossary


@dataclass(frozen=True)
class Limits:
    """What one request may ask (the ``mtkit serve`` flags of the same names)."""

    max_body_bytes: int = 1 << 20
    max_chars: int = 20_000  # characters in all of a request's text
    max_sentences: int = 128  # lines in all of a request's text
    max_beam: int = 8
    max_alternatives: int = 4
    max_queue: int = 256  # requests waiting per model
    max_wait_ms: float = 0.0
    batch_tokens: int | None = None  # source tokens merged into one decoding call (None: the model's)
    retry_after: int = 1  # seconds, in a 503's Retry-After
    decoding_threads: int = 2  # per model: batches decoded at the same time
    # Constraint phrases (include and exclude, the request's glossary's matches too) in all of a request:
    # constrained search's work grows with them (beam x phrases candidates a step, ranked pairwise), and
    # 2,000 held a decoding thread for minutes.
    max_phrases: int = 64
    # Pieces of those phrases in all of a request (a few long phrases cost as many): 16 per phrase.
    max_constraint_pieces: int = 1024
    # Seconds a request may take, queued and decoded: then it gets a 504 and its decoding stops between
    # search steps. A queue is "not moving" (503 on /health) when a batch decodes for twice as long.
    # A document's text goes to the batcher in parts of at most max_sentences lines and max_chars
    # characters, each within this time.
    decode_timeout: float = 60.0
    # The largest document POST /translate_file takes (413 beyond); 0: file translation is off (403, as a
    # LibreTranslate with --disable-files-translation).
    max_file_bytes: int = 16 << 20


class Service:
    """The models, their batchers, the limits, the keys, the metrics and the glossary of one server
    (``glossary``: applied to every request, on both APIs)."""

    def __init__(self, models: list[ServedModel], limits: Limits, api_keys: frozenset[str] | None = None,
                 glossary: Glossary | None = None, qe=None) -> None:
        if not models:
            raise MtkitError("no model to serve")
        self.qe = qe  # a reference-free CometScorer (mtkit serve --qe-model), or None: the confidence
        self._qe_lock = threading.Lock()  # one COMET-QE batch at a time: its threads are the decoders' too
        self.models = models
        self.by_name = {m.name: m for m in models}
        self.limits = limits
        self.api_keys = api_keys
        self.glossary = glossary
        self.metrics = Metrics()
        policy = BatchPolicy(limits.max_queue, limits.max_wait_ms / 1000, limits.batch_tokens, limits.decoding_threads,
                             limits.decode_timeout, stall_after=2 * limits.decode_timeout)
        self.batchers = {
            m.name: Batcher(m, policy, on_batch=self.metrics.batch_done,
                            on_queue=lambda n, name=m.name: self.metrics.queue.labels(name).set(n))
            for m in models
        }
        # Language identification (POST /detect, source auto): among the models' source languages and the common
        # ones; a detected code maps to the served source it is the base language of (pt -> pt-BR).
        self.languages = tuple(sorted({langid.base_code(m.src_lang) for m in models if langid.knows(m.src_lang)}
                                      | set(langid.COMMON)))
        self.source_of: dict[str, str] = {}
        for m in models:
            self.source_of.setdefault(langid.base_code(m.src_lang), m.src_lang)
        self.ready = False
        # POST /translate_file's documents and their translations (None: file translation is off)
        self.files = FileWork(limits.max_file_bytes) if limits.max_file_bytes > 0 else None

    def start(self) -> None:
        """Load the language identifier's models (with lingua) and start the decoding threads (once; again is a
        no-op). A thread the system refuses is one error line."""
        if self.ready:
            return
        if langid.available():  # now, not at the first /detect: lingua would hold every request while it loads
            langid.prepare(self.languages)
        try:
            for batcher in self.batchers.values():
                batcher.start()
        except RuntimeError as e:  # "can't start new thread": the process's or the system's limit
            self.stop()
            raise MtkitError(f"--decoding-threads {self.limits.decoding_threads}: cannot start the decoding threads "
                             f"({e}); give fewer") from None
        self.ready = True

    def stop(self) -> None:
        self.ready = False
        if self.files is not None:
            self.files.close()  # the translated files go, as LibreTranslate's would after their time
        for batcher in self.batchers.values():
            batcher.stop(timeout=60)

    def healthy(self) -> bool:
        """Whether the models are served: started, every decoding thread alive and every queue moving
        (:meth:`mtkit.serve.batcher.Batcher.moving`). ``GET /health`` answers 503 when not."""
        return self.ready and all(b.alive and b.moving() for b in self.batchers.values())

    def health(self) -> dict:
        """``GET /v1/health``'s body: the status, and per model its step, queue and whether it moves."""
        models = []
        for m in self.models:
            batcher = self.batchers[m.name]
            models.append({"name": m.name, "source": m.src_lang, "target": m.tgt_lang, "engine": m.engine,
                           "step": m.step, "queue": batcher.queue_length(), "decoding": batcher.decoding(),
                           "moving": batcher.moving(), "alive": batcher.alive})
        return {"status": "ok" if self.healthy() else "unavailable", "models": models}

    # -------------------------------------------------------------- checks

    def check_key(self, key: Any, headers, missing: ApiError | None = None) -> None:
        """With API keys, a 403 for a key that is not one; ``missing`` (default a 403) when none was given
        (in the body, else ``Authorization: Bearer`` or ``X-Api-Key``; an empty one is none)."""
        if self.api_keys is None:
            return
        if key is None or key == "":
            auth = headers.get("authorization", "")
            key = auth[7:].strip() if auth.lower().startswith("bearer ") else headers.get("x-api-key")
        if not isinstance(key, str) or not key:
            raise missing or ApiError(403, "Please contact the server operator to get an API key (none was given)")
        if not any(hmac.compare_digest(key.encode(), k.encode()) for k in self.api_keys):
            raise ApiError(403, "Invalid API key")

    def check_size(self, items: list[list[str]]) -> None:
        lines = sum(len(lines) for lines in items)
        chars = sum(len(line) for lines in items for line in lines)
        if lines > self.limits.max_sentences:
            raise ApiError(400, f"too many sentences: {lines} lines (the limit is {self.limits.max_sentences} "
                                "per request)")
        if chars > self.limits.max_chars:
            raise ApiError(400, f"too much text: {chars} characters (the limit is {self.limits.max_chars} "
                                "per request)")

    def pairs(self) -> str:
        return ", ".join(f"{m.src_lang}-{m.tgt_lang}" for m in self.models)

    def pick(self, source: str | None, target: str | None, name: str | None = None) -> ServedModel:
        """The model for a request: by name, else the first whose pair matches (``auto`` or no source:
        the one source language that translates into ``target``). The name of a multilingual model
        picks among its pairs the same way."""
        candidates = self.models
        if name is not None:
            model = self.by_name.get(name)
            candidates = [m for m in self.models if m.group == name] if model is None else []
            if model is None and not candidates:
                raise ApiError(400, f"unknown model {name!r}; this server has: {', '.join(self.by_name)}")
            if model is not None:
                for value, own, what in ((source, model.src_lang, "source"), (target, model.tgt_lang, "target")):
                    if value not in (None, "auto", own):
                        raise ApiError(400, f"model {name} translates {model.src_lang}-{model.tgt_lang}, "
                                            f"not {what} {value}")
                return model
        found = [m for m in candidates
                 if (source in (None, "auto") or m.src_lang == source) and (target is None or m.tgt_lang == target)]
        if not found:
            if source not in (None, "auto") and all(m.src_lang != source for m in self.models):
                raise ApiError(400, f"{source} is not supported; this server translates {self.pairs()}")
            raise ApiError(400, f"language pair {source or 'auto'}-{target} is not supported; "
                                f"this server translates {self.pairs()}")
        if source in (None, "auto") and len({m.src_lang for m in found}) > 1:
            raise ApiError(400, f"give source: this server translates into {target or 'several languages'} from "
                                f"{', '.join(sorted({m.src_lang for m in found}))} and does not detect languages")
        if target is None and len({m.tgt_lang for m in found}) > 1:
            raise ApiError(400, f"give target: this server translates {self.pairs()}")
        return found[0]

    def decode_for(self, model: ServedModel, options: DecodeOptions) -> DecodeConfig:
        """The model's decode settings with a request's options, through the config's own checks (a 400 naming
        the field)."""
        if options.nbest is not None and options.beam is None:  # a longer n-best list widens the model's beam
            options = options.replace(beam=max(options.nbest, model.decode.beam))
        beam = model.decode.beam if options.beam is None else options.beam
        if beam > self.limits.max_beam:
            raise ApiError(400, f"beam must be at most {self.limits.max_beam} on this server, got {beam}")
        try:
            return options.set_on(model.decode)
        except MtkitError as e:
            raise ApiError(400, str(e).replace("decode.", "")) from None

    def constraints_for(self, model: ServedModel, lines: list[str], requested: list[Constraints | None] | None = None,
                        glossary: Glossary | None = None) -> list[Constraints | None] | None:
        """Each line's constraints: the request's, its glossary's and the server's glossary's matches
        (None when no line has any); a 400 for include phrases on an engine without constrained search."""
        found: list[Constraints | None] = list(requested) if requested is not None else [None] * len(lines)
        if glossary is not None:
            found = [glossary.constraints(line).merged(c) for line, c in zip(lines, found)]
        self.check_phrases(model, found)  # the request's own (the server's glossary is the operator's)
        if self.glossary is not None:
            found = [self.glossary.constraints(line).merged(c) for line, c in zip(lines, found)]
        if not any(found):
            return None
        refusal = include_refusal(model.engine)
        if refusal is not None and any(c is not None and c.include for c in found):
            raise ApiError(400, f"model {model.name}: {refusal.replace('--engine ', 'engine ')}")
        return found

    def check_phrases(self, model: ServedModel, found: list[Constraints | None]) -> None:
        """A 400 for more constraint phrases, characters or pieces in a request than the limits allow
        (counted in that order, each bound before the next costs more work)."""
        phrases = [p for c in found if c for p in (*c.include, *c.exclude)]
        limit = self.limits.max_phrases
        if len(phrases) > limit:
            raise ApiError(400, f"too many constraint phrases: {len(phrases)} (the limit is {limit} per request, "
                                "--max-phrases)")
        chars = sum(len(p) for p in phrases)
        if chars > self.limits.max_chars:
            raise ApiError(400, f"too much constraint text: {chars} characters (the limit is "
                                f"{self.limits.max_chars} per request)")
        vocab = model.translator.vocab
        if phrases and hasattr(vocab, "encode_tgt"):
            pieces = sum(len(vocab.encode_tgt(p)) for p in phrases)
            if pieces > self.limits.max_constraint_pieces:
                raise ApiError(400, f"too many constraint pieces: the phrases make {pieces} pieces (the limit is "
                                    f"{self.limits.max_constraint_pieces} per request)")

    async def identify(self, texts: list[str]) -> list[list[tuple[str, float]]]:
        """Each text's languages, best first, as ``(code, confidence in 0..1)`` (:func:`mtkit.langid.detect`:
        each judged on a bounded prefix; empty for a text without letters), among :attr:`languages`, a served
        source language spelt as its model spells it. In a worker thread, one text at a time: lingua holds the GIL
        while it works, so the event loop waits at most for one text's prefix (milliseconds) between calls (its
        models were loaded by :meth:`start`)."""
        if not langid.available():
            raise ApiError(501, f"this server cannot identify languages: {langid.NEEDS_LINGUA}")

        def each() -> list[list[tuple[str, float]]]:
            return [langid.detect([text], self.languages)[0] for text in texts]

        found = await asyncio.to_thread(each)
        return [[(self.source_of.get(code, code), value) for code, value in values] for values in found]

    async def quality(self, translations: list[Translation]) -> list[float | None]:
        """Each translation's quality estimate (mtkit.engines.quality): COMET-QE's score of its source and
        text with ``--qe-model``, else the model's confidence; None for an empty line or a number that is not
        finite. COMET-QE runs in a worker thread, within ``decode_timeout`` (else a 504)."""
        if self.qe is None:
            found = [confidence(t) for t in translations]
        else:
            scored = [t for t in translations if t.src_ids]

            def score() -> list[float]:
                with self._qe_lock:
                    return self.qe.score([t.source for t in scored], [t.best.text for t in scored], None,
                                         progress=False)

            try:
                values = iter(await asyncio.wait_for(asyncio.to_thread(score), self.limits.decode_timeout)
                              if scored else [])
            except (TimeoutError, asyncio.TimeoutError):
                raise ApiError(504, "the quality estimate did not finish within "
                                    f"{self.limits.decode_timeout:g} s (--decode-timeout)") from None
            found = [next(values) if t.src_ids else None for t in translations]
        return [v if v is not None and math.isfinite(v) else None for v in found]

    def _submit(self, model: ServedModel, lines: list[str], decode: DecodeConfig,
                constraints: list[Constraints | None] | None):
        """``lines`` queued on ``model``'s batcher: (the batcher, the job's future); a full queue is a 503."""
        batcher = self.batchers[model.name]
        try:
            return batcher, batcher.submit(lines, decode, constraints)
        except QueueFull as e:
            self.metrics.rejected.labels(model.name).inc()
            raise ApiError(503, f"the server is busy ({e}); retry later",
                           {"Retry-After": str(self.limits.retry_after)}) from None

    async def translate(self, model: ServedModel, lines: list[str], decode: DecodeConfig,
                        constraints: list[Constraints | None] | None = None) -> list[Translation]:
        """``lines`` translated by ``model``'s batcher (``constraints``: per line, after :meth:`constraints_for`),
        within ``decode_timeout`` seconds (else a 504, and the job is dropped). A request cancelled while it
        waits (its client went away) drops its job too."""
        if not lines:
            return []
        batcher, future = self._submit(model, lines, decode, constraints)
        timeout = self.limits.decode_timeout
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except (TimeoutError, asyncio.TimeoutError, Stopped):
            batcher.abandon(future)
            raise ApiError(504, f"the translation did not finish within {timeout:g} s (--decode-timeout); send "
                                "fewer sentences or constraint phrases") from None
        except asyncio.CancelledError:
            batcher.abandon(future)
            raise

    def translate_waiting(self, model: ServedModel, lines: list[str], decode: DecodeConfig,
                          constraints: list[Constraints | None] | None,
                          cancelled: threading.Event) -> list[Translation]:
        """:meth:`translate` for a worker thread (a document's text): it waits on the batcher's future, within
        ``decode_timeout`` (else a 504); ``cancelled`` set (the client went away) drops the job and raises
        :class:`Cancelled`."""
        if not lines:
            return []
        batcher, future = self._submit(model, lines, decode, constraints)
        deadline = time.monotonic() + self.limits.decode_timeout
        while True:
            if cancelled.is_set():
                batcher.abandon(future)
                raise Cancelled()
            try:  # a short wait at a time, so that a client that went away stops the work soon
                return future.result(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
            except (concurrent.futures.TimeoutError, TimeoutError):
                if time.monotonic() >= deadline:
                    batcher.abandon(future)
                    raise ApiError(504, f"a part of the document did not finish within {self.limits.decode_timeout:g}"
                                        " s (--decode-timeout)") from None
            except (Stopped, concurrent.futures.CancelledError):
                raise ApiError(504, f"a part of the document did not finish within {self.limits.decode_timeout:g} s "
                                    "(--decode-timeout)") from None
