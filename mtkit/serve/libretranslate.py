"""LibreTranslate's rules, as LibreTranslate 1.9 applies them (``libretranslate/app.py`` of v1.9.6,
commit 497f6c6): where a request's fields come from, its error messages word for word, the
``/frontend/settings`` its web page reads first, and the Swagger 2.0 document it serves at ``/spec``.

Fields: a JSON body (``application/json`` or ``application/*+json``) is read alone, as Flask's
``request.get_json()``; any other request reads the URL's query string and a form body
(``application/x-www-form-urlencoded`` or ``multipart/form-data``, the ``FormData`` its web page sends),
the query string first, as Flask's ``request.values``; a form's text has its line ends made ``\\n``.
mtkit adds: a JSON body's missing fields are looked for in the query string too, an empty body (any
Content-Type) leaves the query string alone, a repeated ``q`` in a form or query string is a list of
texts, and a body without a Content-Type that looks like JSON is JSON (else a urlencoded form).
"""

from __future__ import annotations

import math
import re
import reprlib
from typing import Any

from mtkit import langid
from mtkit.serve.models import language_name
from mtkit.serve.schemas import ApiError, decode_body, parse_form, parse_json, parse_multipart, parse_upload

# LibreTranslate's messages (its app.py, through Flask's abort(400, description=...)).
BAD_REQUEST = "The browser (or proxy) sent a request that this server could not understand."  # Flask's BadRequest()
INVALID_JSON = "Invalid JSON format"
KEY_MISSING = "Please contact the server operator to get an API key"
SUGGESTIONS_DISABLED = "Suggestions are disabled on this server."
FILES_DISABLED = "Files translation are disabled on this server."
EMPTY_FILE = "Invalid request: empty file"  # a file part whose file name is empty
FORMAT_NOT_SUPPORTED = "Invalid request: file format not supported"

# LibreTranslate's own aliases of language codes (libretranslate/language.py): a client may send either.
ALIASES = {"pt-br": "pb", "zh-hans": "zh", "zh-hant": "zt"}

FRONTEND_TIMEOUT_MS = 500  # LibreTranslate's default --frontend-timeout: its page waits this long after typing

_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60


def missing(name: str) -> ApiError:
    return ApiError(400, f"Invalid request: missing {name} parameter")


def shown(value: Any) -> str:
    """A value in a message as LibreTranslate formats it (``str``), shortened through ``reprlib`` when long:
    a stranger's 1 MB field never comes back whole in an error."""
    text = value if isinstance(value, str) else str(value) if isinstance(value, (int, float, type(None))) else None
    if text is not None and len(text) <= 60:
        return text
    return _short.repr(value)


def is_json(content_type: str) -> bool:
    """Flask's ``request.is_json``: ``application/json`` or ``application/*+json``."""
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def read_fields(body: bytes, content_type: str, query: bytes = b"") -> dict:
    """A request's fields, as LibreTranslate reads them (see the module's docstring)."""
    from_query = parse_form(decode_body(query, "the query string"), "a query parameter") if query else {}
    kind = content_type.split(";", 1)[0].strip().lower()
    if not body.strip():
        return from_query
    if is_json(content_type) or (not kind and body.lstrip()[:1] in (b"{", b"[")):
        return {**from_query, **parse_json(body, malformed=BAD_REQUEST, not_object=INVALID_JSON)}
    if kind == "application/x-www-form-urlencoded" or not kind:
        form = parse_form(decode_body(body, "the form body"), "a form field")
    elif kind == "multipart/form-data":
        form = parse_multipart(body, content_type)
    else:  # LibreTranslate reads no other body: only the query string's fields
        form = {}
    return {**_unix_lines(form), **_unix_lines(from_query)}


def read_upload(body: bytes, content_type: str, query: bytes = b"") -> tuple[dict, dict[str, tuple[str, bytes]]]:
    """``POST /translate_file``'s fields (as :func:`read_fields`: the query string's and the form's) and its
    files (``{name: (file name, bytes)}``, from a ``multipart/form-data`` body only, as Flask's
    ``request.files``)."""
    if content_type.split(";", 1)[0].strip().lower() != "multipart/form-data":
        return read_fields(body, content_type, query), {}
    from_query = parse_form(decode_body(query, "the query string"), "a query parameter") if query else {}
    form, files = parse_upload(body, content_type)
    return {**form, **from_query}, files


def _unix_lines(fields: dict) -> dict:
    """A form's ``q`` with its line ends made ``\\n`` (LibreTranslate: ``"\\n".join(q.splitlines())``)."""
    q = fields.get("q")
    if isinstance(q, str):
        return {**fields, "q": "\n".join(q.splitlines())}
    if isinstance(q, list):
        return {**fields, "q": ["\n".join(x.splitlines()) for x in q]}
    return fields


def text_field(fields: dict, name: str) -> str | None:
    """A string field (None when absent or empty, as LibreTranslate's ``if not value``)."""
    value = fields.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    raise ApiError(400, f"Invalid request: {name} must be a string, got {type(value).__name__}")


def alternatives(fields: dict, limit: int) -> int:
    """``alternatives`` as LibreTranslate reads it: ``max(0, int(value))``, 400 when not a number or over the limit.
    Only ASCII digits (``int()`` would take ``"\\u0663"``), at most 9 of them; a JSON float is truncated."""
    value = fields.get("alternatives", 0)
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]{1,9}\s*", value):
        value = int(value)
    elif isinstance(value, float) and math.isfinite(value):
        value = int(value)
    if not isinstance(value, int):  # bool is an int: True counts 1, as int(True)
        raise ApiError(400, "Invalid request: alternatives parameter is not a number")
    value = max(0, int(value))
    if value > limit:
        raise ApiError(400, f"Invalid request: alternatives parameter must be <= {limit}")
    return value


def flag(fields: dict, name: str) -> bool:
    """An opt-in field of mtkit's own (``qe``): true for JSON true or the form values true, 1, yes (any case);
    absent, false, 0, no or empty: false; anything else: 400."""
    value = fields.get(name)
    if value is None or value is False or value == "":
        return False
    if value is True:
        return True
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    raise ApiError(400, f"Invalid request: {name} must be true or false")


def over_limit(size: int, limit: int) -> ApiError:
    """LibreTranslate's message for a batch over --batch-limit and a text over --char-limit."""
    return ApiError(400, f"Invalid request: request ({size}) exceeds text limit ({limit})")


def language_code(value: str, known: dict[str, str]) -> str:
    """A requested code as the models spell it (``known``: lower case -> the models' code), matched
    without regard to case and through LibreTranslate's aliases; unknown codes come back lower-cased,
    as LibreTranslate's ``iso2model`` gives them."""
    lower = value.lower()
    if lower in known:
        return known[lower]
    return known.get(ALIASES.get(lower, lower), ALIASES.get(lower, lower))


def detections(found: list[list[tuple[str, float]]], unknown: str) -> list[dict]:
    """``POST /detect``'s answer: ``[{"confidence": 0-100, "language": code}, ...]``, best first, from each
    text's ``(code, 0..1)`` list (:meth:`mtkit.serve.service.Service.identify`); for several texts, each
    language's mean over them (LibreTranslate averages a list's too). Confidences have one decimal; those that
    round to 0 are left out. Nothing detected (no letters): ``unknown`` at confidence 0, as LibreTranslate
    answers its default language."""
    totals: dict[str, float] = {}
    for values in found:
        for code, value in values:
            totals[code] = totals.get(code, 0.0) + value
    ranked = sorted(((round(100 * v / len(found), 1), code) for code, v in totals.items()), key=lambda x: -x[0])
    answer = [{"confidence": value, "language": code} for value, code in ranked if value > 0]
    return answer or [{"confidence": 0.0, "language": ranked[0][1] if ranked else unknown}]


def not_supported(code: str) -> ApiError:
    return ApiError(400, f"{shown(code)} is not supported")


def not_available(source: str, target: str) -> ApiError:
    return ApiError(400, f"{language_name(target)} ({target}) is not available as a target language from "
                         f"{language_name(source)} ({source})")


def unsupported_format(value: Any) -> ApiError:
    return ApiError(400, f"{shown(value)} format is not supported")


def alternatives_of(best: str, candidates: list[str]) -> list[str]:
    """LibreTranslate's ``filter_unique``: the candidates in order, without repeats, the best or empty ones."""
    seen = {best, ""}
    found = []
    for text in candidates:
        if text not in seen:
            seen.add(text)
            found.append(text)
    return found


# ---------------------------------------------------------------------------------- the web page's reads


def frontend_settings(models, char_limit: int, api_keys: bool, files: list[str] | None = None) -> dict:
    """``GET /frontend/settings``: what LibreTranslate's page reads before anything else. ``models``: the
    served models (source, target); the page starts on ``auto`` (each text's language detected and routed to
    the model that translates from it) and the first model's target. ``files``: the extensions of the
    documents ``/translate_file`` takes (None: file translation is off)."""
    first = models[0]
    source = {"code": "auto", "name": "Auto Detect"}
    return {
        "charLimit": char_limit,
        "frontendTimeout": FRONTEND_TIMEOUT_MS,
        "apiKeys": api_keys,
        "keyRequired": api_keys,  # with --api-keys, mtkit answers no request without a key
        "suggestions": False,
        "filesTranslation": files is not None,
        "supportedFilesFormat": list(files or []),
        "language": {"source": source,
                     "target": {"code": first.tgt_lang, "name": language_name(first.tgt_lang)}},
    }


def _param(name: str, kind: str, required: bool, description: str, **more) -> dict:
    return {"in": "formData", "name": name, "required": required, "description": description,
            "schema": {"type": kind, **more}}


_ERROR = {"description": "Error", "schema": {"$ref": "#/definitions/error-response"}}
_KEY = _param("api_key", "string", False, "API key (with mtkit serve --api-keys)")


def spec(version: str) -> dict:
    """``GET /spec``: LibreTranslate's API as a Swagger 2.0 document (the shape of LibreTranslate's
    flask_swagger output: ``swagger``, ``info``, ``basePath``, ``paths``, ``definitions``)."""
    language = {"type": "object", "properties": {"confidence": {"type": "number", "format": "float",
                                                                "minimum": 0, "maximum": 100},
                                                 "language": {"type": "string"}}}
    return {
        "swagger": "2.0",
        "basePath": "/",
        "info": {"title": "mtkit", "version": version, "license": {"name": "MIT"},
                 "description": "LibreTranslate's API, served by mtkit (mtkit's own API: /docs)."},
        "paths": {
            "/translate": {"post": {
                "tags": ["translate"], "summary": "Translate Text",
                "consumes": ["application/json", "application/x-www-form-urlencoded", "multipart/form-data"],
                "parameters": [
                    _param("q", "string", True, "Text to translate, or a list of texts (JSON)"),
                    _param("source", "string", True, "Source language code, or auto (each text's language "
                                                     "detected, and the text sent to the model that translates "
                                                     "from it)"),
                    _param("target", "string", True, "Target language code"),
                    _param("format", "string", False, "text, or html (inline tags put back around the aligned words)",
                           enum=["text", "html"], default="text"),
                    _param("alternatives", "integer", False, "How many alternative translations", default=0),
                    _param("qe", "boolean", False, "mtkit's: also each text's quality estimate (qe)", default=False),
                    _KEY],
                "responses": {"200": {"description": "Translation", "schema": {"$ref": "#/definitions/translate"}},
                              "400": _ERROR, "403": _ERROR, "413": _ERROR, "500": _ERROR, "503": _ERROR}}},
            "/languages": {"get": {
                "tags": ["translate"], "summary": "Get Supported Languages",
                "responses": {"200": {"description": "Languages", "schema": {"$ref": "#/definitions/languages"}}}}},
            "/detect": {"post": {
                "tags": ["translate"], "summary": "Detect Language of Text",
                "parameters": [_param("q", "string", True, "Text, or a list of texts (JSON): each judged on its "
                                                          f"first {langid.PREFIX_CHARS:,} characters"), _KEY],
                "responses": {"200": {"description": "The languages of q, best first, with their confidence (0-100), "
                                                     "among the languages the models translate from and common "
                                                     "ones; for a list, each language's mean over the items",
                                      "schema": {"$ref": "#/definitions/detections"}},
                              "400": _ERROR, "403": _ERROR}}},
            "/translate_file": {"post": {
                "tags": ["translate"], "summary": "Translate a File",
                "consumes": ["multipart/form-data"],
                "parameters": [
                    {"in": "formData", "name": "file", "type": "file", "required": True,
                     "description": "The document to translate (its format from its extension: "
                                    "/frontend/settings' supportedFilesFormat)"},
                    _param("source", "string", True, "Source language code, or auto (detected from the "
                                                     "document's text)"),
                    _param("target", "string", True, "Target language code"),
                    _KEY],
                "responses": {"200": {"description": "Translated file",
                                      "schema": {"$ref": "#/definitions/translate-file"}},
                              "400": _ERROR, "403": _ERROR, "413": _ERROR, "503": _ERROR}}},
            "/download_file/{filename}": {"get": {
                "tags": ["translate"], "summary": "Download a translated file (kept for 30 minutes)",
                "parameters": [{"in": "path", "name": "filename", "type": "string", "required": True}],
                "responses": {"200": {"description": "The translated file, as an attachment"}, "404": _ERROR}}},
            "/suggest": {"post": {
                "tags": ["misc"], "summary": "Submit a Suggestion (disabled on mtkit)",
                "responses": {"403": _ERROR}}},
            "/frontend/settings": {"get": {
                "tags": ["misc"], "summary": "Retrieve Frontend Settings",
                "responses": {"200": {"description": "Frontend settings",
                                      "schema": {"$ref": "#/definitions/frontend-settings"}}}}},
            "/health": {"get": {
                "tags": ["misc"], "summary": "Health Check",
                "responses": {"200": {"description": "Serving", "schema": {"$ref": "#/definitions/health-response"}},
                              "503": {"description": "Not ready"}}}},
        },
        "definitions": {
            "translate": {"type": "object", "required": ["translatedText"], "properties": {
                "translatedText": {"description": "Translated text(s)"},
                "detectedLanguage": {"description": "With source auto: each text's language and confidence (a list "
                                                    "for a list); a text in the target language comes back as it "
                                                    "is"},
                "alternatives": {"description": "With alternatives > 0"},
                "qe": {"description": "mtkit's, with qe true: each text's quality estimate without a reference "
                                      "(the mean over its lines of COMET-QE's score with mtkit serve --qe-model, "
                                      "else of the model's confidence, the mean token log-probability); null for "
                                      "an empty text"}}},
            "translate-file": {"type": "object", "properties": {
                "translatedFileUrl": {"type": "string", "description": "Translated file url"}}},
            "languages": {"type": "array", "items": {"type": "object", "properties": {
                "code": {"type": "string"}, "name": {"type": "string"},
                "targets": {"type": "array", "items": {"type": "string"}}}}},
            "detections": {"type": "array", "items": language},
            "frontend-settings": {"type": "object", "properties": {
                "charLimit": {"type": "integer"}, "frontendTimeout": {"type": "integer"},
                "apiKeys": {"type": "boolean"}, "keyRequired": {"type": "boolean"},
                "suggestions": {"type": "boolean"}, "filesTranslation": {"type": "boolean"},
                "supportedFilesFormat": {"type": "array", "items": {"type": "string"}},
                "language": {"type": "object"}}},
            "health-response": {"type": "object", "properties": {"status": {"type": "string"}}},
            "error-response": {"type": "object", "properties": {"error": {"type": "string"}}},
        },
    }


# ---------------------------------------------------------------------------------- Flask's methods

# LibreTranslate's routes and their methods; Flask adds HEAD to each GET route and OPTIONS to every route.
ROUTES = {"/translate": ("POST",), "/detect": ("POST",), "/suggest": ("POST",), "/translate_file": ("POST",),
          "/languages": ("GET",), "/health": ("GET",), "/frontend/settings": ("GET",), "/spec": ("GET",),
          "/js/app.js": ("GET",), "/": ("GET",)}
PREFIX_ROUTES = {"/download_file/": ("GET",)}  # routes with a parameter: /download_file/<filename>


class FlaskMethods:
    """ASGI middleware: what Flask answers on each of LibreTranslate's routes without being asked: HEAD on
    a GET route (the GET answer's status and headers; uvicorn sends no body for HEAD) and OPTIONS (200,
    ``Allow``, no body). A CORS preflight is answered before it (:class:`mtkit.serve.server.Cors`)."""

    def __init__(self, app, routes: dict[str, tuple[str, ...]] = ROUTES,
                 prefixes: dict[str, tuple[str, ...]] = PREFIX_ROUTES) -> None:
        self.app = app
        self.allow = {path: ", ".join(sorted({*methods, "OPTIONS", *(("HEAD",) if "GET" in methods else ())}))
                      for path, methods in {**routes, **prefixes}.items()}
        self.prefixes = tuple(prefixes)

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if path.startswith(self.prefixes):
            path = next(prefix for prefix in self.prefixes if path.startswith(prefix))
        allow = self.allow.get(path) if scope["type"] == "http" else None
        if allow is not None and scope["method"] == "HEAD" and "GET" in allow:
            scope = {**scope, "method": "GET"}
        elif allow is not None and scope["method"] == "OPTIONS":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"allow", allow.encode()), (b"content-length", b"0"),
                                    (b"content-type", b"text/html; charset=utf-8")]})
            await send({"type": "http.response.body", "body": b""})
            return
        await self.app(scope, receive, send)
