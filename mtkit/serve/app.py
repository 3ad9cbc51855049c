"""The HTTP app: LibreTranslate's endpoints and mtkit's own, and a page at ``/``.

LibreTranslate's, as LibreTranslate 1.9 answers them, so that its clients and its web page work
unchanged (its rules and messages: :mod:`mtkit.serve.libretranslate`):

* ``POST /translate``: ``q`` (a string or a list of strings), ``source`` (a code or ``auto``),
  ``target``, ``format`` (``text``, or ``html``: each sentence's inline tags are taken out, the plain
  sentence translated and the tags put back around the words aligned to those they wrapped; block tags
  cut sentences, script, style and comments are untouched, :mod:`mtkit.text.markup`),
  ``alternatives`` (how many more hypotheses to return),
  ``api_key``; as JSON, a form (urlencoded or multipart) or the query string. Answers
  ``{"translatedText": ...}`` (a list for a list), with ``alternatives`` when asked and
  ``detectedLanguage`` for ``source=auto``. A ``q`` holding several lines is translated line by
  line, one output line per input line, as ``mtkit translate`` does.
* ``GET /languages``: each source language of the loaded models, with its ``targets``.
* ``POST /detect``: the languages of ``q``, best first, ``[{"confidence": 0-100, "language": code}]``,
  among the languages the models translate from and common ones (:mod:`mtkit.langid`: lingua, on
  each text's first characters). With ``source=auto``, ``/translate`` detects each item's language and
  sends it to the model that translates from it into ``target`` (an item already in ``target`` comes back
  as it is; a language no model translates into ``target`` is a 400 naming it).
* ``GET /health`` (``{"status": "ok"}``, 503 until the models decode), ``GET /frontend/settings``,
  ``GET /spec`` (Swagger 2.0), ``GET /js/app.js`` (the page's script, with an empty ``apiSecret``);
  ``/suggest`` answers as a LibreTranslate with suggestions off.
* ``POST /translate_file`` (multipart ``file``, ``source`` (a code or ``auto``: detected on the document's first
  characters), ``target``, ``api_key``): the document's text translated through :mod:`mtkit.documents`, its
  structure and formatting kept; answers ``{"translatedFileUrl": ...}``, which ``GET /download_file/<name>``
  serves for 30 minutes (:mod:`mtkit.serve.files`). ``--max-file-bytes`` bounds the upload (413), 0 turns it
  off (403, as LibreTranslate's ``--disable-files-translation``).
* Errors are JSON ``{"error": "..."}`` with 400 (a bad request, a missing API key, a document that is not of
  its format), 403 (an unknown API key), 404 (a download we never made or that expired), 405 (another method),
  413 (a body over ``--max-body-bytes``, a file over ``--max-file-bytes``), 503 with ``Retry-After``
  (the queue is full), 500 (a bug).

mtkit's own: ``POST /v1/translate`` (beam size, length penalty, n-best lists with scores, word
alignments, html or xml markup, per-sentence confidence, the model to use, per-sentence constraints and a
glossary), ``GET /v1/models``
(each model's name, languages, engine and training step), ``GET /v1/health`` (the models, their steps and
queues; 503 when a decoding thread is gone or a queue is not moving), ``GET /metrics`` (Prometheus),
``GET /docs`` (OpenAPI), ``GET /`` (a page to try a model). A server-wide glossary (``mtkit serve
--glossary``) applies to every request of both APIs.

Confidence is the mean log-probability per target token (EOS included), in nats: the engines give
each hypothesis its log-probability as search found it (:class:`mtkit.engines.engine.Candidate`).
"""

from __future__ import annotations

import asyncio
import logging
import mimetypes
import threading
import traceback
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import PurePosixPath
from typing import Any

from fastapi import Request  # at module level: the routes' annotations are resolved in this module
from pydantic import ValidationError

from mtkit import langid
from mtkit.config import DecodeOptions
from mtkit.documents import Texts
from mtkit.errors import MtkitError, shown
from mtkit.serve import libretranslate as lt
from mtkit.serve.files import (
    KEEP_SECONDS,
    MAX_FILE_JOBS,
    Busy,
    EngineFailed,
    Sample,
    attachment,
    read_document,
    sentence_translator,
    translated_name,
    upload_name,
)
from mtkit.serve.models import language_name
from mtkit.serve.schemas import (
    ApiError,
    Hypothesis,
    NativeRequest,
    NativeResponse,
    Sentence,
    parse_json,
    request_constraints,
    request_glossary,
    split_lines,
    validation_message,
)
from mtkit.serve.service import Service
from mtkit.text.lines import clean_output
from mtkit.text.markup import MarkupError, split_markup
from mtkit.text.pipeline import sentence_reports
from mtkit.version import __version__

logger = logging.getLogger(__name__)

# source auto: lingua's confidence (0..1, relative to the other candidates') at which a detected language is
# believed when no model translates from it (the text kept as it is when it is the target, else a 400 naming it);
# under it, the text is too short or mixed to tell, and goes to the likeliest language a model translates from.
CLEAR = 0.5


def page_file(name: str) -> str:
    """A file of the page (``static/``): ``index.html`` at ``/``, its script ``app.js`` at ``/js/app.js``."""
    return resources.files("mtkit.serve").joinpath("static", name).read_text(encoding="utf-8")


def create_app(service: Service):
    """The FastAPI app of ``service`` (wrap it with :class:`mtkit.serve.server.Guard` to serve it)."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

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
        logger.error("".join(traceback.format_exception(e)).rstrip("\n"))  # the traceback, as Python prints it
        return error(500, f"internal error ({type(e).__name__}); see the server's log")

    app.include_router(libretranslate_router(service))
    app.include_router(mtkit_router(service))
    app.add_middleware(lt.FlaskMethods)
    return app


def aligns(model, kind: str = "html") -> bool:
    """Whether ``model``'s engine gives word alignments (torch, CTranslate2): markup of ``kind`` then keeps its
    inline tags (:mod:`mtkit.text.markup`); plain text needs none."""
    return kind != "text" and model.translator.gives_alignments


def markup_items(items: list[str], kind: str, model, field: str, single: bool) -> list:
    """Each markup item's sentences and its rebuilding function (inline tags carried by alignment when the
    model's engine gives alignments; else the text between tags alone is translated); a 400 naming the request's
    ``field`` (``field[i]`` for an item of a list) for markup that is not well-formed."""
    found = []
    for i, item in enumerate(items):
        try:
            found.append(split_markup(item, kind, inline=aligns(model, kind)))
        except MarkupError as e:
            raise ApiError(400, f"{field if single else f'{field}[{i}]'}: {e}") from None
    return found


def markup_hypotheses(got: list, rebuild, nbest: int) -> list[Hypothesis]:
    """A markup fragment's n-best list: its k-th hypothesis puts each sentence's k-th candidate (its last when it
    has fewer) into the markup, its tags placed by that candidate's own alignment; ``score``, ``logprob`` and
    ``tokens`` are the sentences' sums, ``confidence`` their mean (a one-sentence fragment's are the sentence's).
    Empty when the fragment has nothing to translate; an alternative with an empty sentence is left out."""
    spoken = [t for t in got if t.src_ids]
    if not spoken:
        return []
    hyps = []
    for k in range(min(nbest, max(len(t.candidates) for t in spoken))):
        picked = [t.candidates[min(k, len(t.candidates) - 1)] for t in got]
        texts = [clean_output(c.text) for c in picked]
        used = [(c, text) for t, c, text in zip(got, picked, texts) if t.src_ids]
        if k and not all(text for _, text in used):  # an empty alternative is no alternative
            continue
        hyps.append(Hypothesis(text=rebuild([(text, c.alignment or []) for c, text in zip(picked, texts)]),
                               score=sum(c.score for c, _ in used), logprob=sum(c.logprob for c, _ in used),
                               confidence=sum(c.mean_logprob for c, _ in used) / len(used),
                               tokens=sum(len(c.ids) + 1 for c, _ in used)))
    return hyps


def libretranslate_router(service: Service):
    """LibreTranslate's endpoints, as LibreTranslate 1.9 answers them (:mod:`mtkit.serve.libretranslate`)."""
    from fastapi import APIRouter
    from fastapi.responses import JSONResponse, Response

    router = APIRouter()
    tags = ["LibreTranslate"]
    lower = {code.lower(): code for m in service.models for code in (m.src_lang, m.tgt_lang)}

    async def fields_of(request: Request) -> dict:
        fields = lt.read_fields(await request.body(), request.headers.get("content-type", ""),
                                request.scope.get("query_string", b""))
        service.check_key(fields.get("api_key"), request.headers, ApiError(400, lt.KEY_MISSING))
        return fields

    @router.post("/translate", summary="Translate (LibreTranslate's API)", tags=tags,
              openapi_extra=_form_docs("q, source, target, format (text), alternatives, api_key, "
                                       "qe (mtkit's: true for each text's quality estimate)"))
    async def translate(request: Request):
        fields = await fields_of(request)
        q = fields.get("q")
        if not q:  # LibreTranslate's order of checks, and its messages
            raise lt.missing("q")
        if not (isinstance(q, str) or (isinstance(q, list) and all(isinstance(x, str) for x in q))):
            raise ApiError(400, "Invalid request: q must be a string or a list of strings")
        source, target = lt.text_field(fields, "source"), lt.text_field(fields, "target")
        if source is None:
            raise lt.missing("source")
        if target is None:
            raise lt.missing("target")
        alternatives = lt.alternatives(fields, service.limits.max_alternatives)
        items = q if isinstance(q, list) else [q]
        if len(items) > service.limits.max_sentences:
            raise lt.over_limit(len(items), service.limits.max_sentences)
        chars = sum(len(item) for item in items)
        if chars > service.limits.max_chars:
            raise lt.over_limit(chars, service.limits.max_chars)
        source, target = lt.language_code(source, lower), lt.language_code(target, lower)
        if source != "auto" and source not in lower.values():
            raise lt.not_supported(source)
        if target not in lower.values():
            raise lt.not_supported(target)
        text_format = fields.get("format") or "text"
        if text_format not in ("text", "html"):
            raise lt.unsupported_format(text_format)
        if source == "auto":  # each item's language, and the model that translates it (None: it is in target)
            detected, chosen = await route(items, target, isinstance(q, list))
        else:
            detected, chosen = None, [pick(source, target)] * len(items)
        # markup is parsed and rebuilt in a worker thread: a heavy fragment never holds the event loop
        parsed = await asyncio.to_thread(parse_items, items, text_format, chosen, len(items) == 1) \
            if text_format == "html" else parse_items(items, text_format, chosen, len(items) == 1)
        per_item = [lines for lines, _ in parsed]
        service.check_size(per_item)  # the lines of all texts, against --max-sentences
        nbest = alternatives + 1 if alternatives and text_format == "text" else 1  # LibreTranslate: none for html
        results = await translate_items(per_item, chosen, text_format, nbest)

        def assembled() -> tuple[list, list]:
            texts, alts = [], []
            for (_, assemble), got in zip(parsed, results):
                texts.append(assemble([(clean_output(t.best.text), t.best.alignment or []) for t in got]))
                # The k-th alternative of a text: each line's k-th hypothesis (its last one when it has fewer).
                alts.append(lt.alternatives_of(texts[-1], [
                    assemble([(clean_output(t.candidates[min(k, len(t.candidates) - 1)].text), []) for t in got])
                    for k in range(1, nbest)]))
            return texts, alts

        texts, alts = await asyncio.to_thread(assembled) if text_format == "html" else assembled()
        answer: dict[str, Any] = {"translatedText": texts if isinstance(q, list) else texts[0]}
        if lt.flag(fields, "qe"):  # mtkit's, asked for: each text's quality estimate, the mean of its lines'
            quality, estimates, at = await service.quality([t for got in results for t in got]), [], 0
            for got in results:
                found = [v for v in quality[at : at + len(got)] if v is not None]
                at += len(got)
                estimates.append(sum(found) / len(found) if found else None)
            answer["qe"] = estimates if isinstance(q, list) else estimates[0]
        if detected is not None:
            answer["detectedLanguage"] = detected if isinstance(q, list) else detected[0]
        if alternatives:
            answer["alternatives"] = alts if isinstance(q, list) else alts[0]
        return answer

    def parse_items(items: list[str], text_format: str, chosen: list, single: bool) -> list:
        """Each item's lines to translate and the function that assembles its translation from theirs: markup's
        sentences (``html``) or the item's lines; nothing for an item already in the target language."""
        parsed = []
        for i, (item, model) in enumerate(zip(items, chosen)):
            if model is None:
                parsed.append(([], lambda found, item=item: item))
            elif text_format == "html":
                parsed.extend(markup_items([item], text_format, model, "q" if single else f"q[{i}]", True))
            else:
                parsed.append((split_lines(item), lambda found: "\n".join(text for text, _ in found)))
        return parsed

    async def translate_items(per_item: list[list[str]], chosen: list, text_format: str, nbest: int) -> list[list]:
        """Each item's lines translated by its model: the items of one model together, the models at the same
        time; every model's settings and constraints are checked before any decoding starts."""
        plans: dict[str, tuple] = {}
        for i, model in enumerate(chosen):
            if model is not None:
                plans.setdefault(model.name, (model, []))[1].append(i)
        jobs = []
        for model, indices in plans.values():
            lines = [line for i in indices for line in per_item[i]]
            decode = service.decode_for(model, DecodeOptions(
                nbest=nbest if nbest > 1 else None, alignments="hard" if aligns(model, text_format) else None))
            jobs.append((indices, lines, decode, service.constraints_for(model, lines), model))
        tasks = [asyncio.ensure_future(service.translate(model, lines, decode, constraints))
                 for _, lines, decode, constraints, model in jobs]
        try:
            done = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:  # one failed (a full queue, a deadline): the others' work is dropped too
                task.cancel()
            raise
        results: list[list] = [[] for _ in per_item]
        for (indices, *_), got in zip(jobs, done):
            at = 0
            for i in indices:
                results[i] = got[at : at + len(per_item[i])]
                at += len(per_item[i])
        return results

    async def route(items: list[str], target: str, many: bool, field: str = "q") -> tuple[list[dict], list]:
        """``source: auto``: each item's language (LibreTranslate's ``detectedLanguage``) and its model: the one
        that translates from it into ``target``; None for an item already in ``target`` (answered as it is, as
        LibreTranslate does). A language lingua is unsure of (under :data:`CLEAR`) gives way to the likeliest
        language a model translates from into ``target`` (translated, rather than kept or refused); an item
        without letters goes with the request's most frequent language (else the first model's), at confidence
        0. A language no model translates into ``target`` is a 400 naming it (``field``: what the message calls
        the items)."""
        into: dict[str, Any] = {}
        for m in service.models:
            if m.tgt_lang == target:
                into.setdefault(m.src_lang, m)
        if not into:
            pick("auto", target)  # no model translates into target: the message says so
        same = langid.base_code(target)
        tops = []
        for values in await service.identify(items):
            usable = [(code, value) for code, value in values if code in into]
            tops.append(None if not values else values[0] if values[0][1] >= CLEAR or not usable else usable[0])
        seen = [top[0] for top in tops if top is not None and top[0] in into]
        fallback = max(seen, key=seen.count) if seen else next(iter(into))
        detected, chosen = [], []
        for i, top in enumerate(tops):
            code, value = top if top is not None else (fallback, 0.0)
            if langid.base_code(code) == same:
                code, model = target, None
            elif code in into:
                model = into[code]
            else:
                served = ", ".join(f"{language_name(c)} ({c})" for c in into)
                where = f"{field}[{i}]" if many else field
                raise ApiError(400, f"{where} is {language_name(code)} ({code}) (detected, "
                                    f"confidence {100 * value:.1f}); this server translates into "
                                    f"{language_name(target)} ({target}) from {served} only: give source")
            detected.append({"confidence": round(100 * value, 1), "language": code})
            chosen.append(model)
        return detected, chosen

    def pick(source: str, target: str):
        """The model for a pair both of whose codes this server knows (LibreTranslate's message when none)."""
        if source == "auto" and not any(m.tgt_lang == target for m in service.models):
            sources = {m.src_lang for m in service.models}
            if len(sources) == 1:
                raise lt.not_available(sources.pop(), target)
        if source != "auto" and not any(m.src_lang == source and m.tgt_lang == target for m in service.models):
            raise lt.not_available(source, target)
        return service.pick(source, target)

    @router.get("/languages", summary="Languages (LibreTranslate's API)", tags=tags)
    async def languages():
        targets: dict[str, list[str]] = {}
        for m in service.models:
            found = targets.setdefault(m.src_lang, [])
            if m.tgt_lang not in found:
                found.append(m.tgt_lang)
        return [{"code": code, "name": language_name(code), "targets": t} for code, t in targets.items()]

    @router.post("/detect", summary="Detect the language of a text (LibreTranslate's API)", tags=tags,
              description="The languages of q, best first, with their confidence (0-100), among the languages the "
                          "models translate from and common ones (lingua, on the first "
                          f"{langid.PREFIX_CHARS:,} characters); for a list, each language's mean over the items.",
              openapi_extra=_form_docs("q, api_key"))
    async def detect(request: Request):
        fields = await fields_of(request)
        q = fields.get("q")
        if not q:
            raise lt.missing("q")
        if not (isinstance(q, str) or (isinstance(q, list) and all(isinstance(x, str) for x in q))):
            raise ApiError(400, "Invalid request: q must be a string or a list of strings")
        items = q if isinstance(q, list) else [q]
        if len(items) > service.limits.max_sentences:
            raise lt.over_limit(len(items), service.limits.max_sentences)
        for i, item in enumerate(items):
            if not item.strip():
                raise ApiError(400, f"Invalid request: {'q' if isinstance(q, str) else f'q[{i}]'} holds no text "
                                    "to detect a language in")
        return lt.detections(await service.identify(items), service.models[0].src_lang)

    @router.get("/health", summary="LibreTranslate's health check: 200 once the models decode (503 before)",
                tags=tags)
    async def health():
        alive = service.healthy()  # models started, decoding threads alive, queues moving
        return JSONResponse({"status": "ok" if alive else "unavailable"}, status_code=200 if alive else 503)

    @router.get("/frontend/settings", summary="What LibreTranslate's web page reads first", tags=tags)
    async def frontend_settings():
        return lt.frontend_settings(service.models, service.limits.max_chars, service.api_keys is not None,
                                    None if service.files is None else service.files.extensions())

    @router.get("/spec", summary="LibreTranslate's API as a Swagger 2.0 document", tags=tags)
    async def spec():
        return lt.spec(__version__)

    @router.get("/js/app.js", include_in_schema=False)
    async def app_js():  # the page's script; its apiSecret is empty: this server asks for no secret
        return Response(page_file("app.js"), media_type="application/javascript; charset=utf-8")

    @router.post("/suggest", summary="Suggestions (disabled, as a LibreTranslate without --suggestions)", tags=tags)
    async def suggest():
        raise ApiError(403, lt.SUGGESTIONS_DISABLED)

    @router.post("/translate_file", summary="Translate a document (LibreTranslate's API): its structure and "
                 "formatting kept", tags=tags, openapi_extra={"requestBody": {
                     "required": True, "description": "A form: file, source (a code or auto), target, api_key.",
                     "content": {"multipart/form-data": {"schema": {"type": "object"}}}}})
    async def translate_file(request: Request):
        # a form of up to --max-file-bytes is parsed in a worker thread: the event loop answers meanwhile
        fields, uploads = await asyncio.to_thread(lt.read_upload, await request.body(),
                                                  request.headers.get("content-type", ""),
                                                  request.scope.get("query_string", b""))
        service.check_key(fields.get("api_key"), request.headers, ApiError(400, lt.KEY_MISSING))
        work = service.files
        if work is None:
            raise ApiError(403, lt.FILES_DISABLED)
        upload = uploads.get("file")
        if upload is None:  # LibreTranslate's order of checks, and its messages
            raise lt.missing("file")
        source, target = lt.text_field(fields, "source"), lt.text_field(fields, "target")
        if source is None:
            raise lt.missing("source")
        if target is None:
            raise lt.missing("target")
        filename, data = upload
        if filename == "":
            raise ApiError(400, lt.EMPTY_FILE)
        name = upload_name(filename) or "document"
        fmt = work.formats.get(PurePosixPath(name).suffix.lower())
        if fmt is None:
            raise ApiError(400, lt.FORMAT_NOT_SUPPORTED)
        if len(data) > work.max_file_bytes:
            raise ApiError(413, f"the file is too large (the limit is {work.max_file_bytes} bytes, --max-file-bytes)")
        source, target = lt.language_code(source, lower), lt.language_code(target, lower)
        if source != "auto" and source not in lower.values():
            raise lt.not_supported(source)
        if target not in lower.values():
            raise lt.not_supported(target)
        model = pick(source, target) if source != "auto" else await detected_model(data, fmt, name, target)
        result = data if model is None else await in_worker(translate_document(data, fmt, name, model))
        stored = await asyncio.to_thread(work.store.put, result, translated_name(filename, target))
        return {"translatedFileUrl": str(request.url_for("download_file", filename=stored))}

    async def in_worker(run):
        """``run(cancelled)`` in a file worker thread: a 503 when all are busy; the client going away sets
        ``cancelled``, which stops the document's translation at its next part. A document's own failure (one
        line naming it) is a 400; the batcher's is answered as /translate answers it."""
        cancelled = threading.Event()
        try:
            future = service.files.submit(lambda: run(cancelled))
        except Busy:
            raise ApiError(503, f"the server is translating {MAX_FILE_JOBS} files already; retry later",
                           {"Retry-After": str(service.limits.retry_after)}) from None
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        except MtkitError as e:
            raise ApiError(400, f"Invalid request: {e}") from None
        except EngineFailed as e:
            raise e.error from None

    async def detected_model(data: bytes, fmt: str, name: str, target: str):
        """``source`` auto: the model for the document's language, detected on its first characters as
        /translate detects a text's (None: it is in ``target`` already); without language identification,
        the one language translated into ``target`` (else a 400 asking for source)."""
        if not langid.available():
            return pick("auto", target)
        sample = Sample(langid.PREFIX_CHARS)
        await in_worker(lambda cancelled: read_document(data, fmt, name, Texts(sample), service.files.max_file_bytes))
        return (await route([sample.text], target, False, f"the file {name}"))[1][0]

    def translate_document(data: bytes, fmt: str, name: str, model):
        """The work of translating a document with ``model`` (its text through the model's batcher, the
        server's glossary applied), for :func:`in_worker`."""
        decode = service.decode_for(model, DecodeOptions(alignments="hard" if aligns(model, "xml") else None))

        def run(cancelled: threading.Event) -> bytes:
            def part(lines: list[str]) -> list:
                constraints = service.constraints_for(model, lines)  # the server's glossary
                return service.translate_waiting(model, lines, decode, constraints, cancelled)

            translate = sentence_translator(part, service.limits.max_sentences, service.limits.max_chars)
            return read_document(data, fmt, name, Texts(translate, aligned=aligns(model, "xml")),
                                 service.files.max_file_bytes)

        return run

    @router.get("/download_file/{filename}", summary="A translated file (LibreTranslate's API), kept for "
                f"{KEEP_SECONDS / 60:g} minutes", tags=tags)
    async def download_file(filename: str):
        if service.files is None:
            raise ApiError(400, lt.FILES_DISABLED)
        found = await asyncio.to_thread(service.files.store.read, filename)
        if found is None:
            raise ApiError(404, f"no translated file {shown(filename)} on this server (files are kept "
                                f"{KEEP_SECONDS / 60:g} minutes)")
        data, download = found
        media = mimetypes.guess_type(download)[0] or "application/octet-stream"
        return Response(data, media_type=media, headers={"Content-Disposition": attachment(download)})
    return router


def mtkit_router(service: Service):
    """mtkit's own endpoints: ``POST /v1/translate``, ``GET /v1/models``, ``GET /metrics``, the page at ``/``."""
    from fastapi import APIRouter
    from fastapi.responses import HTMLResponse, JSONResponse, Response

    router = APIRouter()

    @router.post("/v1/translate", response_model=NativeResponse, summary="Translate with settings and scores",
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
        model = service.pick(req.source, req.target, req.model)
        if req.format != "text":
            return await translate_markup_v1(req, items, model)
        for i, item in enumerate(items):
            if len(split_lines(item)) > 1:
                where = "text" if isinstance(req.text, str) else f"text[{i}]"
                raise ApiError(400, f"{where} holds a line break: send one sentence per item")
        service.check_size([[item] for item in items])
        if req.alignments and not model.translator.gives_alignments:
            raise ApiError(400, f"model {model.name}: its engine ({model.engine}) gives no alignments")
        decode = service.decode_for(model, req.decode_options(aligned=req.alignments))
        constraints = service.constraints_for(model, items, request_constraints(req, len(items)),
                                              request_glossary(req))
        results = await service.translate(model, items, decode, constraints)
        quality = await service.quality(results)
        sentences = []
        for t, qe in zip(results, quality):
            reports = sentence_reports(t) if decode.split == "sentences" or decode.guard else None
            if not t.src_ids:
                sentences.append(Sentence(text="", confidence=None, qe=None, nbest=[], sentences=reports))
                continue
            hyps = [Hypothesis(text=clean_output(c.text), score=c.score, logprob=c.logprob,
                               confidence=c.mean_logprob, tokens=len(c.ids) + c.sentences,
                               alignment=[list(p) for p in c.alignment] if req.alignments else None)
                    for c in t.candidates[: decode.nbest]]
            hyps = hyps[:1] + [h for h in hyps[1:] if h.text]  # an empty alternative is no alternative
            sentences.append(Sentence(text=hyps[0].text, confidence=hyps[0].confidence, qe=qe, nbest=hyps,
                                      unmet=t.unmet, unmet_reasons=t.unwritable, alignment=hyps[0].alignment,
                                      sentences=reports))
        return NativeResponse(model=model.name, source=model.src_lang, target=model.tgt_lang, translations=sentences)

    async def translate_markup_v1(req: NativeRequest, items: list[str], model) -> NativeResponse:
        """``format`` html or xml: each item a fragment, its markup carried by the alignments, with its n-best list
        (:func:`markup_hypotheses`) and quality estimate (its sentences' mean). Parsing and rebuilding the markup
        run off the event loop (a heavy fragment never holds the other connections)."""
        if req.alignments or req.constraints is not None or req.glossary is not None:
            raise ApiError(400, f"format {req.format} translates markup: alignments, constraints and a glossary go "
                                "with format text")
        parsed = await asyncio.to_thread(markup_items, items, req.format, model, "text", isinstance(req.text, str))
        service.check_size([lines for lines, _ in parsed])
        decode = service.decode_for(model, req.decode_options(aligned=aligns(model, req.format)))
        lines = [line for found, _ in parsed for line in found]
        results = await service.translate(model, lines, decode, None) if lines else []
        quality = await service.quality(results)

        def rebuilt() -> list[Sentence]:
            sentences, at = [], 0
            for found, rebuild in parsed:
                got, estimates = results[at : at + len(found)], quality[at : at + len(found)]
                at += len(found)
                hyps = markup_hypotheses(got, rebuild, decode.nbest)
                if not hyps:  # nothing to translate: the markup as it is
                    text = rebuild([(clean_output(t.best.text), t.best.alignment or []) for t in got])
                    sentences.append(Sentence(text=text, confidence=None, qe=None, nbest=[]))
                    continue
                known = [v for t, v in zip(got, estimates) if t.src_ids and v is not None]
                sentences.append(Sentence(text=hyps[0].text, confidence=hyps[0].confidence,
                                          qe=sum(known) / len(known) if known else None, nbest=hyps))
            return sentences

        sentences = await asyncio.to_thread(rebuilt)  # off the event loop, as the parsing
        return NativeResponse(model=model.name, source=model.src_lang, target=model.tgt_lang, translations=sentences)

    @router.get("/v1/models", summary="The models served: name, languages, engine, training step, whether it "
                "gives word alignments", tags=["mtkit"])
    async def models():
        return {"models": [{"name": m.name, "source": m.src_lang, "target": m.tgt_lang, "engine": m.engine,
                            "step": m.step, "alignments": m.translator.gives_alignments} for m in service.models]}

    @router.get("/v1/health", summary="The models, their steps and queues; 503 when a queue is not moving",
                tags=["mtkit"])
    async def health_v1():
        body = service.health()
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @router.get("/metrics", summary="Prometheus metrics", tags=["mtkit"])
    async def metrics():
        body, content_type = service.metrics.render()
        return Response(body, media_type=content_type)

    @router.get("/", include_in_schema=False)
    async def page():
        return HTMLResponse(page_file("index.html").replace("{version}", __version__))
    return router


def _form_docs(fields: str) -> dict:
    return {"requestBody": {"required": True, "description": f"JSON or a form: {fields}.", "content": {
        "application/json": {"schema": {"type": "object"}},
        "application/x-www-form-urlencoded": {"schema": {"type": "object"}}}}}


