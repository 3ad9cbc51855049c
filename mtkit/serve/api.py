"""The HTTP API: LibreTranslate's endpoints, mtkit's own, and a page at ``/``.

LibreTranslate-compatible (its clients work unchanged):

* ``POST /translate``: ``q`` (a string or a list of strings), ``source`` (a code or ``auto``),
  ``target``, ``format`` (``text``, or ``html``: the text between tags is translated and the markup
  kept, :mod:`mtkit.serve.markup`), ``alternatives`` (how many more hypotheses to return),
  ``api_key``; as JSON or as a form (``application/x-www-form-urlencoded``).
  Answers ``{"translatedText": ...}`` (a list for a list), with ``alternatives`` when asked and
  ``detectedLanguage`` for ``source=auto``. A ``q`` holding several lines is translated line by
  line, one output line per input line, as ``mtkit translate`` does.
* ``GET /languages``: each source language of the loaded models, with its ``targets``.
* ``POST /detect``: this server does not detect languages. It answers the one language its
  models translate from (confidence 100), or 400 when they translate from several.
* Errors are JSON ``{"error": "..."}`` with 400 (a bad request), 403 (a missing or unknown API
  key), 413 (a body over ``--max-body-bytes``), 503 with ``Retry-After`` (the queue is full),
  500 (a bug).

mtkit's own: ``POST /v1/translate`` (beam size, length penalty, n-best lists with scores,
per-sentence confidence, the model to use, per-sentence constraints and a glossary), ``GET /health``,
``GET /metrics`` (Prometheus), ``GET /docs`` (OpenAPI), ``GET /`` (a page to try a model). A
server-wide glossary (``mtkit serve --glossary``) applies to every request of both APIs.

Confidence is the mean log-probability per target token (EOS included), in nats: the engines
return the length-penalized score ``logprob / lp(n + 1)``, which the server multiplies back by
the length penalty of the settings used (:func:`mtkit.serve.models.mean_logprob`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import re
import sys
import traceback
import urllib.parse
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

from fastapi import Request  # at module level: the routes' annotations are resolved in this module
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mtkit.config import DecodeConfig, override_section
from mtkit.errors import MtkitError
from mtkit.runtime.constraints import Constraints
from mtkit.runtime.engine import Translation
from mtkit.runtime.glossary import Glossary
from mtkit.serve.batcher import Batcher, QueueFull
from mtkit.serve.markup import split_markup
from mtkit.serve.metrics import Metrics
from mtkit.serve.models import ServedModel, language_name, logprob, mean_logprob
from mtkit.translate import clean_output


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


class ApiError(Exception):
    """An error answered as ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


# ---------------------------------------------------------------------------------------- bodies


class ConstraintsBody(BaseModel):
    """One sentence's constraints in ``POST /v1/translate``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    include: list[str] = Field(default_factory=list, description="Phrases the translation must contain.")
    exclude: list[str] = Field(default_factory=list, description="Phrases the translation must not contain.")


class GlossaryEntry(BaseModel):
    """One glossary pair in ``POST /v1/translate``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    source: str
    target: str


class NativeRequest(BaseModel):
    """``POST /v1/translate``: one sentence per item of ``text``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str | list[str] = Field(description="A sentence, or a list of sentences (no line breaks inside one).")
    model: str | None = Field(None, description="The model's name (see /health); default: by source and target.")
    source: str | None = Field(None, description="Source language code; default: the model's.")
    target: str | None = Field(None, description="Target language code; default: the model's.")
    beam: int | None = Field(None, ge=1, description="Beam size (1: greedy); default: the model's.")
    alpha: float | None = Field(None, ge=0, description="Length penalty exponent α; default: the model's.")
    length_penalty: Literal["gnmt", "power"] | None = Field(None, description="gnmt ((5+L)/6)^α or power L^α.")
    nbest: int | None = Field(None, ge=1, description="Hypotheses per sentence (at most beam).")
    api_key: str | None = Field(None, description="With --api-keys (or an Authorization: Bearer header).")
    constraints: ConstraintsBody | list[ConstraintsBody | None] | None = Field(
        None, description="Phrases the translation must (include) and must not (exclude) contain: one object "
                          "for a text that is a string, a list of objects (or nulls) for a list. include needs "
                          "the torch engine; exclude works with both.")
    glossary: dict[str, str] | list[GlossaryEntry] | None = Field(
        None, description="Source term -> target term (an object, or a list of {source, target}): where a "
                          "sentence holds the source term (any case, whole words), its translation holds the "
                          "target term; on top of the server's --glossary. Torch engine only.")


class Hypothesis(BaseModel):
    text: str
    score: float = Field(description="Length-penalized log-probability: what the search ranks by.")
    logprob: float = Field(description="Log-probability of the hypothesis and its EOS (nats).")
    confidence: float = Field(description="Mean log-probability per token, EOS included (nats, <= 0).")
    tokens: int = Field(description="Target tokens, EOS included.")


class Sentence(BaseModel):
    text: str
    confidence: float | None = Field(description="The best hypothesis's mean token log-probability (nats); "
                                                 "null for an empty input.")
    nbest: list[Hypothesis] = Field(description="Hypotheses, best first (empty for an empty input).")
    unmet: list[str] = Field(default_factory=list, description="Include phrases (constraints, glossary terms) "
                                                              "the translation lacks: they did not fit in its "
                                                              "maximum length, or the model cannot write them "
                                                              "(see unmet_reasons).")
    unmet_reasons: dict[str, str] = Field(default_factory=dict, description="Unmet phrases the model cannot write "
                                                                           "(a character outside its vocabulary), "
                                                                           "so never forced -> why.")


class NativeResponse(BaseModel):
    model: str
    source: str
    target: str
    translations: list[Sentence]


MAX_DEPTH = 32  # levels of JSON nesting a request may have (mtkit's own needs 4: glossary lists of objects)


def _decode_body(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the request body is not valid UTF-8 (byte {e.start})") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def check_values(data: Any) -> None:
    """Refuse what JSON can carry but a request must not: nesting deeper than :data:`MAX_DEPTH`, lone
    surrogates (``"\\ud800"``, which no encoder can write), and numbers too large for a float (``1e400``).
    Iterative, so that no input can exhaust the stack; the 400 names the field."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ApiError(400, f"Invalid request: {where or 'the body'} is nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ApiError(400, f"Invalid request: {where or 'the body'} is not valid Unicode: lone surrogate "
                                    f"at character {e.start}") from None
        elif isinstance(value, float) and not math.isfinite(value):
            raise ApiError(400, f"Invalid request: {where or 'the body'}: {value} is not a finite number")
        elif isinstance(value, dict):
            for key, item in value.items():
                shown = str(key).encode("utf-8", "backslashreplace").decode("utf-8")  # the message must encode too
                path = f"{where}.{shown}" if where else shown
                stack.append((key, f"{path} (the key)", depth + 1))
                stack.append((item, path, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))


def parse_json(body: bytes) -> dict:
    text = _decode_body(body)
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ApiError(400, f"Invalid request: the JSON is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:
        raise ApiError(400, f"malformed JSON: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"expected a JSON object, got {type(data).__name__}")
    check_values(data)
    return data


def _form(text: str, where: str) -> dict[str, Any]:
    """A form's or a query string's fields (a repeated field gives a list)."""
    try:
        pairs = urllib.parse.parse_qsl(text, keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise ApiError(400, f"{where} is not valid UTF-8 once percent-decoded") from None
    fields: dict[str, Any] = {}
    for key, value in pairs:
        if key in fields:
            fields[key] = (fields[key] if isinstance(fields[key], list) else [fields[key]]) + [value]
        else:
            fields[key] = value
    return fields


def parse_fields(body: bytes, content_type: str, query: bytes = b"") -> dict:
    """A LibreTranslate request's fields, as LibreTranslate reads them: from the URL's query string, then
    a JSON or a form body (a field in the body wins; a repeated form field gives a list)."""
    fields = _form(_decode_body(query), "a query parameter") if query else {}
    kind = content_type.split(";", 1)[0].strip().lower()
    if not body.strip():
        return fields
    if kind == "application/json" or (not kind and body.lstrip()[:1] in (b"{", b"[")):
        return {**fields, **parse_json(body)}
    if kind in ("application/x-www-form-urlencoded", ""):
        return {**fields, **_form(_decode_body(body), "a form field")}
    raise ApiError(400, f"unsupported Content-Type {kind}: send application/json or "
                        "application/x-www-form-urlencoded")


def _optional_str(fields: dict, name: str) -> str | None:
    value = fields.get(name)
    if value is None or isinstance(value, str):
        return value
    raise ApiError(400, f"Invalid request: {name} must be a string, got {type(value).__name__}")


def _int_field(fields: dict, name: str, default: int, low: int, high: int) -> int:
    value = fields.get(name, default)
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]{1,9}\s*", value):  # a form sends text (ASCII digits)
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"Invalid request: {name} must be an integer")
    if not low <= value <= high:
        raise ApiError(400, f"Invalid request: {name} must be between {low} and {high}, got {value}")
    return value


# ---------------------------------------------------------------------------------------- the app


class Service:
    """The models, their batchers, the limits, the keys, the metrics and the glossary of one server
    (``glossary``: applied to every request, on both APIs)."""

    def __init__(self, models: list[ServedModel], limits: Limits, api_keys: frozenset[str] | None = None,
                 glossary: Glossary | None = None) -> None:
        if not models:
            raise MtkitError("no model to serve")
        self.models = models
        self.by_name = {m.name: m for m in models}
        self.limits = limits
        self.api_keys = api_keys
        self.glossary = glossary
        self.metrics = Metrics()
        self.batchers = {
            m.name: Batcher(m, limits.max_queue, limits.max_wait_ms / 1000, limits.batch_tokens,
                            on_batch=self.metrics.batch_done,
                            on_queue=lambda n, name=m.name: self.metrics.queue.labels(name).set(n),
                            threads=limits.decoding_threads)
            for m in models
        }
        self.ready = False

    def start(self) -> None:
        for batcher in self.batchers.values():
            batcher.start()
        self.ready = True

    def stop(self) -> None:
        self.ready = False
        for batcher in self.batchers.values():
            batcher.stop(timeout=60)

    # -------------------------------------------------------------- checks

    def check_key(self, key: Any, headers) -> None:
        if self.api_keys is None:
            return
        if key is None:
            auth = headers.get("authorization", "")
            key = auth[7:].strip() if auth.lower().startswith("bearer ") else headers.get("x-api-key")
        if not isinstance(key, str) or not key:
            raise ApiError(403, "Please contact the server operator to get an API key (none was given)")
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

    def decode_for(self, model: ServedModel, changes: dict) -> DecodeConfig:
        """The model's decode settings with a request's changes, through the config's own checks."""
        changes = {k: v for k, v in changes.items() if v is not None}
        if "nbest" in changes and "beam" not in changes and changes["nbest"] > model.decode.beam:
            changes["beam"] = changes["nbest"]
        beam = changes.get("beam", model.decode.beam)
        if beam > self.limits.max_beam:
            raise ApiError(400, f"beam must be at most {self.limits.max_beam} on this server, got {beam}")
        nbest = changes.get("nbest", model.decode.nbest)
        if nbest > beam:
            raise ApiError(400, f"nbest must be between 1 and beam ({beam}), got {nbest}")
        if not changes:
            return model.decode
        try:
            return override_section(model.decode, "decode", changes)
        except MtkitError as e:
            raise ApiError(400, str(e).replace("decode.", "")) from None

    def constraints_for(self, model: ServedModel, lines: list[str], requested: list[Constraints | None] | None = None,
                        glossary: Glossary | None = None) -> list[Constraints | None] | None:
        """Each line's constraints: the request's, its glossary's and the server's glossary's matches
        (None when no line has any); a 400 for include phrases on an engine without constrained search."""
        found: list[Constraints | None] = list(requested) if requested is not None else [None] * len(lines)
        for terms in (glossary, self.glossary):
            if terms is not None:
                found = [terms.constraints(line).merged(c) for line, c in zip(lines, found)]
        if not any(found):
            return None
        if model.engine == "ctranslate2" and any(c is not None and c.include for c in found):
            from mtkit.runtime.ctranslate2_engine import INCLUDE_UNSUPPORTED

            raise ApiError(400, f"model {model.name}: {INCLUDE_UNSUPPORTED.replace('--engine ', 'engine ')}")
        return found

    async def translate(self, model: ServedModel, lines: list[str], decode: DecodeConfig,
                        constraints: list[Constraints | None] | None = None) -> list[Translation]:
        """``lines`` translated by ``model``'s batcher (``constraints``: per line, after :meth:`constraints_for`)."""
        if not lines:
            return []
        batcher = self.batchers[model.name]
        try:
            future = batcher.submit(lines, decode, constraints)
        except QueueFull as e:
            self.metrics.rejected.labels(model.name).inc()
            raise ApiError(503, f"the server is busy ({e}); retry later",
                           {"Retry-After": str(self.limits.retry_after)}) from None
        return await asyncio.wrap_future(future)


def request_constraints(req: NativeRequest, n: int) -> list[Constraints | None] | None:
    """The per-sentence constraints of a ``/v1/translate`` request (a 400 names the bad field)."""
    if req.constraints is None:
        return None
    given = [req.constraints] if isinstance(req.text, str) else req.constraints
    if isinstance(req.text, str) and isinstance(req.constraints, list):
        raise ApiError(400, "Invalid request: constraints must be one object when text is a string")
    if not isinstance(given, list) or len(given) != n:
        raise ApiError(400, f"Invalid request: constraints must be a list of {n} objects (or nulls), one per "
                            "sentence of text")
    found = []
    for i, body in enumerate(given):
        where = "constraints" if isinstance(req.text, str) else f"constraints[{i}]"
        try:
            found.append(None if body is None else Constraints.from_json(body.model_dump(), where))
        except MtkitError as e:
            raise ApiError(400, f"Invalid request: {e}") from None
    return found


def request_glossary(req: NativeRequest) -> Glossary | None:
    """The glossary a ``/v1/translate`` request brings, if any (a 400 names the bad entry)."""
    if not req.glossary:
        return None
    pairs = (req.glossary.items() if isinstance(req.glossary, dict)
             else ((e.source, e.target) for e in req.glossary))
    try:
        return Glossary((s, t, f"glossary entry {s!r}") for s, t in pairs)
    except MtkitError as e:
        raise ApiError(400, f"Invalid request: {e}") from None


def split_lines(text: str) -> list[str]:
    """A text's lines, as ``mtkit translate`` reads them (``\\n`` or ``\\r\\n`` ends a line)."""
    return text.replace("\r\n", "\n").split("\n")


def page_html() -> str:
    return resources.files("mtkit.serve").joinpath("static/index.html").read_text(encoding="utf-8")


def create_app(service: Service):
    """The FastAPI app of ``service`` (wrap it with :class:`mtkit.serve.server.Guard` to serve it)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from mtkit import __version__

    @asynccontextmanager
    async def lifespan(app):
        service.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, service.stop)

    try:  # the serve extra: Swagger UI (/docs) and ReDoc (/redoc) served by this server, no CDN
        from fastapi_offline import FastAPIOffline as make_app
    except ImportError:  # FastAPI's own pages, which load them from a CDN
        make_app = FastAPI
    app = make_app(title="mtkit", version=__version__, lifespan=lifespan,
                  description="Machine translation with mtkit models: LibreTranslate's API and mtkit's own (/v1).")
    app.state.service = service

    def error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, e: ApiError):
        return error(e.status, e.message, e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, e: StarletteHTTPException):
        return error(e.status_code, str(e.detail), getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, e: RequestValidationError):
        return error(400, validation_message(e.errors()))

    @app.exception_handler(Exception)
    async def on_bug(request: Request, e: Exception):
        traceback.print_exception(e, file=sys.stderr)
        return error(500, f"internal error ({type(e).__name__}); see the server's log")

    # -------------------------------------------------------------- LibreTranslate

    @app.post("/translate", summary="Translate (LibreTranslate's API)", tags=["LibreTranslate"],
              openapi_extra=_form_docs("q, source, target, format (text), alternatives, api_key"))
    async def translate(request: Request):
        fields = parse_fields(await request.body(), request.headers.get("content-type", ""),
                              request.scope.get("query_string", b""))
        service.check_key(_optional_str(fields, "api_key"), request.headers)
        q = fields.get("q")
        if q is None:
            raise ApiError(400, "Invalid request: missing q parameter")
        if isinstance(q, list):
            if not all(isinstance(x, str) for x in q):
                raise ApiError(400, "Invalid request: q must be a string or a list of strings")
            items = q
        elif isinstance(q, str):
            items = [q]
        else:
            raise ApiError(400, "Invalid request: q must be a string or a list of strings")
        source, target = _optional_str(fields, "source"), _optional_str(fields, "target")
        if not source:
            raise ApiError(400, "Invalid request: missing source parameter")
        if not target:
            raise ApiError(400, "Invalid request: missing target parameter")
        text_format = _optional_str(fields, "format") or "text"
        if text_format not in ("text", "html"):
            raise ApiError(400, f"Invalid request: format must be text or html, got {text_format!r}")
        alternatives = _int_field(fields, "alternatives", 0, 0, service.limits.max_alternatives)
        parsed = ([split_markup(item) for item in items] if text_format == "html"
                  else [(split_lines(item), "\n".join) for item in items])
        per_item = [lines for lines, _ in parsed]
        service.check_size(per_item)
        model = service.pick(source, target)
        decode = service.decode_for(model, {"nbest": alternatives + 1} if alternatives else {})
        all_lines = [line for lines in per_item for line in lines]
        results = await service.translate(model, all_lines, decode, service.constraints_for(model, all_lines))
        texts, alts, at = [], [], 0
        for lines, assemble in parsed:
            got = results[at : at + len(lines)]
            at += len(lines)
            texts.append(assemble([clean_output(t.best.text) for t in got]))
            # The k-th alternative of a text: each line's k-th hypothesis (its last one when it has fewer).
            # An empty alternative (a hypothesis of EOS alone) is no alternative.
            alts.append([alt for k in range(1, alternatives + 1)
                         if (alt := assemble([clean_output(t.candidates[min(k, len(t.candidates) - 1)].text)
                                              for t in got])).strip()])
        answer: dict[str, Any] = {"translatedText": texts if isinstance(q, list) else texts[0]}
        if alternatives:
            answer["alternatives"] = alts if isinstance(q, list) else alts[0]
        if source == "auto":
            detected = {"confidence": 100.0, "language": model.src_lang}
            answer["detectedLanguage"] = [detected] * len(items) if isinstance(q, list) else detected
        return answer

    @app.get("/languages", summary="Languages (LibreTranslate's API)", tags=["LibreTranslate"])
    async def languages():
        targets: dict[str, list[str]] = {}
        for m in service.models:
            found = targets.setdefault(m.src_lang, [])
            if m.tgt_lang not in found:
                found.append(m.tgt_lang)
        return [{"code": code, "name": language_name(code), "targets": t} for code, t in targets.items()]

    @app.post("/detect", summary="The source language (no detection: see the description)", tags=["LibreTranslate"],
              description="This server does not detect languages: it answers the one language its models "
                          "translate from, with confidence 100, or 400 when they translate from several.",
              openapi_extra=_form_docs("q, api_key"))
    async def detect(request: Request):
        fields = parse_fields(await request.body(), request.headers.get("content-type", ""),
                              request.scope.get("query_string", b""))
        service.check_key(_optional_str(fields, "api_key"), request.headers)
        if fields.get("q") is None:
            raise ApiError(400, "Invalid request: missing q parameter")
        sources = sorted({m.src_lang for m in service.models})
        if len(sources) > 1:
            raise ApiError(400, f"this server does not detect languages and translates from {', '.join(sources)}; "
                                "give source")
        return [{"confidence": 100.0, "language": sources[0]}]

    # -------------------------------------------------------------- mtkit's own

    @app.post("/v1/translate", response_model=NativeResponse, summary="Translate with settings and scores",
              tags=["mtkit"], openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": NativeRequest.model_json_schema()}}}})
    async def translate_v1(request: Request):
        data = parse_json(await request.body())
        service.check_key(data.get("api_key"), request.headers)
        try:
            req = NativeRequest.model_validate(data)
        except ValidationError as e:
            raise ApiError(400, validation_message(e.errors())) from None
        items = [req.text] if isinstance(req.text, str) else req.text
        for i, item in enumerate(items):
            if len(split_lines(item)) > 1:
                where = "text" if isinstance(req.text, str) else f"text[{i}]"
                raise ApiError(400, f"{where} holds a line break: send one sentence per item")
        service.check_size([[item] for item in items])
        model = service.pick(req.source, req.target, req.model)
        decode = service.decode_for(model, {"beam": req.beam, "alpha": req.alpha,
                                            "length_penalty": req.length_penalty, "nbest": req.nbest})
        constraints = service.constraints_for(model, items, request_constraints(req, len(items)),
                                              request_glossary(req))
        results = await service.translate(model, items, decode, constraints)
        sentences = []
        for t in results:
            if not t.src_ids:
                sentences.append(Sentence(text="", confidence=None, nbest=[]))
                continue
            hyps = [Hypothesis(text=clean_output(c.text), score=c.score, logprob=logprob(c, decode),
                               confidence=mean_logprob(c, decode), tokens=len(c.ids) + 1)
                    for c in t.candidates[: decode.nbest]]
            hyps = hyps[:1] + [h for h in hyps[1:] if h.text]  # an empty alternative is no alternative
            sentences.append(Sentence(text=hyps[0].text, confidence=hyps[0].confidence, nbest=hyps, unmet=t.unmet,
                                      unmet_reasons=t.unwritable))
        return NativeResponse(model=model.name, source=model.src_lang, target=model.tgt_lang, translations=sentences)

    @app.get("/health", summary="200 when the models are loaded and their decoding threads run", tags=["mtkit"])
    async def health():
        alive = service.ready and all(b.alive for b in service.batchers.values())
        body = {"status": "ok" if alive else "unavailable",
                "models": [{"name": m.name, "source": m.src_lang, "target": m.tgt_lang, "engine": m.engine,
                            "step": m.step, "queue": service.batchers[m.name].queue_length()}
                           for m in service.models]}
        return JSONResponse(body, status_code=200 if alive else 503)

    @app.get("/metrics", summary="Prometheus metrics", tags=["mtkit"])
    async def metrics():
        body, content_type = service.metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/", include_in_schema=False)
    async def page():
        return HTMLResponse(page_html())

    return app


def _form_docs(fields: str) -> dict:
    return {"requestBody": {"required": True, "description": f"JSON or a form: {fields}.", "content": {
        "application/json": {"schema": {"type": "object"}},
        "application/x-www-form-urlencoded": {"schema": {"type": "object"}}}}}


def validation_message(errors) -> str:
    """One line for pydantic's errors: ``beam: Input should be a valid integer``."""
    parts = []
    for e in list(errors)[:3]:
        where = ".".join(str(x) for x in e.get("loc", ()) if x not in ("body", "str", "list[str]"))
        parts.append(f"{where}: {e.get('msg', 'invalid')}" if where else str(e.get("msg", "invalid")))
    return "Invalid request: " + "; ".join(parts)
