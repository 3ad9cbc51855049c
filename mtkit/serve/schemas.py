"""The HTTP API's request and response bodies: the pydantic models of mtkit's own API, and the parsing
of a JSON body, a form, a multipart form or a query string, with the checks every request passes (UTF-8,
lone surrogates, nesting, finite numbers), each failure a 400 naming the field. Which of them a
LibreTranslate request reads, and in what order: :mod:`mtkit.serve.libretranslate`.
"""

from __future__ import annotations

import json
import logging
import math
import urllib.parse
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mtkit.config import DecodeOptions
from mtkit.engines.constraints import Constraints
from mtkit.errors import MtkitError
from mtkit.text.glossary import Glossary


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
    model: str | None = Field(None, description="The model's name (see /v1/models); default: by source and target.")
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
    format: Literal["text", "html", "xml"] = Field(
        "text", description="text: a sentence per item; html or xml: each item a fragment, whose inline tags are "
                            "put back around the words aligned to those they wrapped (block tags cut sentences; "
                            "script, style and comments untouched); each hypothesis of the n-best list with its "
                            "own tags placed, qe the sentences' mean; no alignments, constraints or glossary.")
    alignments: bool = Field(False, description="With format text: each hypothesis's word alignment, [source word, "
                                                "target word] pairs, 0-based, words split at whitespace.")
    split: Literal["sentences", "none"] | None = Field(
        None, description="sentences: each text's sentences translated one by one and joined with its own "
                          "whitespace; none: each text one sentence; default: the server's (--split).")
    guard: bool | None = Field(None, description="The integrity guard: numbers, URLs, e-mail addresses and "
                                                 "placeholders of the source forced back into a translation that "
                                                 "lost them, repetition loops searched again; default: the "
                                                 "server's (--guard).")

    def decode_options(self, aligned: bool) -> DecodeOptions:
        """The request's decoding fields as the options of its call (unset: the model's own); ``aligned``:
        with hard word alignments (asked for, or to put back the tags of markup)."""
        return DecodeOptions(beam=self.beam, alpha=self.alpha, length_penalty=self.length_penalty, nbest=self.nbest,
                             alignments="hard" if aligned else None, split=self.split, guard=self.guard)


class Hypothesis(BaseModel):
    text: str
    score: float = Field(description="Length-penalized log-probability: what the search ranks by.")
    logprob: float = Field(description="Log-probability of the hypothesis and its EOS (nats).")
    confidence: float = Field(description="Mean log-probability per token, EOS included (nats, <= 0).")
    tokens: int = Field(description="Target tokens, EOS included.")
    alignment: list[list[int]] | None = Field(None, description="[source word, target word] pairs (0-based, "
                                                                "whitespace words), when asked (alignments).")


class SentenceReport(BaseModel):
    source: str = Field(description="The sentence as the text has it.")
    text: str = Field(description="Its best translation.")
    repaired: list[str] = Field(default_factory=list, description="Protected tokens (numbers, URLs, e-mail "
                                                                  "addresses, placeholders) of the source that a "
                                                                  "second search forced back in.")
    missing: list[str] = Field(default_factory=list, description="Protected tokens the translation still lacks.")
    loop: bool = Field(False, description="Whether the translation is still caught in a repetition loop.")


class Sentence(BaseModel):
    text: str
    confidence: float | None = Field(description="The best hypothesis's mean token log-probability (nats); "
                                                 "null for an empty input.")
    qe: float | None = Field(None, description="Quality estimate of the translation, without a reference: "
                                              "COMET-QE's score of the source and the translation when the server "
                                              "runs with --qe-model (CometKiwi: about 0.8 for a good translation, "
                                              "comparable across systems), else the confidence (the model's "
                                              "certainty, comparable only between its own outputs); null for an "
                                              "empty input.")
    nbest: list[Hypothesis] = Field(description="Hypotheses, best first (empty for an empty input).")
    unmet: list[str] = Field(default_factory=list, description="Include phrases (constraints, glossary terms) "
                                                              "the translation lacks: they did not fit in its "
                                                              "maximum length, or the model cannot write them "
                                                              "(see unmet_reasons).")
    unmet_reasons: dict[str, str] = Field(default_factory=dict, description="Unmet phrases the model cannot write "
                                                                           "(a character outside its vocabulary), "
                                                                           "so never forced -> why.")
    alignment: list[list[int]] | None = Field(None, description="The best hypothesis's alignment, when asked.")
    sentences: list[SentenceReport] | None = Field(
        None, description="With format text: each sentence of the text, its source and best translation and, with "
                          "the guard on, what was repaired, what is still missing and whether it is still in a "
                          "repetition loop.")


class NativeResponse(BaseModel):
    model: str
    source: str
    target: str
    translations: list[Sentence]


MAX_DEPTH = 32  # levels of JSON nesting a request may have (mtkit's own needs 4: glossary lists of objects)


def decode_body(body: bytes, what: str = "the request body") -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"{what} is not valid UTF-8 (byte {e.start})") from None


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


def parse_json(body: bytes, malformed: str | None = None, not_object: str | None = None) -> dict:
    """A JSON object, through :func:`check_values`. ``malformed``, ``not_object``: the messages to answer
    instead of mtkit's own, for a body that is not JSON (or not UTF-8) and for one that is not an object
    (LibreTranslate's endpoints answer LibreTranslate's)."""
    try:
        data = json.loads(decode_body(body), parse_constant=_no_constant)
    except RecursionError:
        raise ApiError(400, f"Invalid request: the JSON is nested deeper than {MAX_DEPTH} levels") from None
    except ApiError as e:
        raise ApiError(400, malformed or e.message) from None
    except ValueError as e:
        raise ApiError(400, malformed or f"malformed JSON: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, not_object or f"expected a JSON object, got {type(data).__name__}")
    check_values(data)
    return data


LIST_FIELDS = ("q",)  # a form field that, repeated, is a list (mtkit's; LibreTranslate takes the first of any)


def parse_form(text: str, where: str) -> dict[str, Any]:
    """A form's or a query string's fields: a repeated ``q`` gives a list, any other repeated field its first
    value (as Flask's ``request.values.get``)."""
    try:
        pairs = urllib.parse.parse_qsl(text, keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise ApiError(400, f"{where} is not valid UTF-8 once percent-decoded") from None
    return _fields(pairs)


def _fields(pairs) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key, value in pairs:
        if key not in fields:
            fields[key] = value
        elif key in LIST_FIELDS:
            fields[key] = (fields[key] if isinstance(fields[key], list) else [fields[key]]) + [value]
    return fields


# Parts a multipart/form-data body may have: LibreTranslate's page sends 6 or 7; Starlette's own default bound.
MAX_FORM_PARTS = 1000


def parse_multipart(body: bytes, content_type: str) -> dict[str, Any]:
    """The text fields of a ``multipart/form-data`` body (the ``FormData`` a browser sends); file parts are
    left out, as Flask's ``request.values`` leaves them. A body that cannot be read (no boundary, cut short,
    malformed) has no fields, as Flask reads it; over :data:`MAX_FORM_PARTS` parts is a 400. Work and memory
    are linear in the body, which the server has already bounded (``--max-body-bytes``)."""
    return parse_upload(body, content_type)[0]


def parse_upload(body: bytes, content_type: str) -> tuple[dict[str, Any], dict[str, tuple[str, bytes]]]:
    """A ``multipart/form-data`` body's text fields (as :func:`parse_multipart`) and its file parts, ``{name:
    (filename as sent, bytes)}`` (the first part of a name; Flask's ``request.files``). Nothing for a body
    that cannot be read."""
    try:  # the serve extra's python-multipart (Starlette's form parser), imported here so that a server
        # installed without it still answers JSON and urlencoded forms
        from python_multipart.multipart import MultipartParser, parse_options_header
    except ImportError:
        raise ApiError(400, "this server cannot read multipart/form-data (python-multipart is not installed); "
                            "send JSON or application/x-www-form-urlencoded") from None
    logging.getLogger("python_multipart").setLevel(logging.CRITICAL)  # a stranger's malformed body: no log line
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        return {}, {}
    parts: list[tuple[dict[bytes, bytes], bytearray]] = []
    header = [b"", b""]
    ended: list[bool] = []

    def on_part_begin() -> None:
        if len(parts) >= MAX_FORM_PARTS:
            raise ApiError(400, f"Invalid request: the form has more than {MAX_FORM_PARTS} parts")
        parts.append(({}, bytearray()))

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header[0] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header[1] += data[start:end]

    def on_header_end() -> None:
        parts[-1][0][header[0].strip().lower()] = header[1].strip()
        header[0], header[1] = b"", b""

    def on_part_data(data: bytes, start: int, end: int) -> None:
        parts[-1][1].extend(data[start:end])

    parser = MultipartParser(boundary, {"on_part_begin": on_part_begin, "on_header_field": on_header_field,
                                        "on_header_value": on_header_value, "on_header_end": on_header_end,
                                        "on_part_data": on_part_data, "on_end": lambda: ended.append(True)})
    try:
        parser.write(body)
        parser.finalize()
    except ValueError:  # python_multipart's parse errors
        return {}, {}
    if not ended:  # cut short before its closing boundary
        return {}, {}
    pairs = []
    files: dict[str, tuple[str, bytes]] = {}
    for i, (headers, data) in enumerate(parts):
        _, disposition = parse_options_header(headers.get(b"content-disposition", b""))
        if b"name" not in disposition:
            continue
        name = decode_body(disposition[b"name"], f"the name of form part {i + 1}")
        shown = name if len(name) <= 40 and name.isprintable() else repr(name[:40])
        if b"filename" in disposition:
            filename = disposition[b"filename"].decode("utf-8", "replace")  # a name only: shown, never a path
            files.setdefault(name, (filename, bytes(data)))
            continue
        pairs.append((name, decode_body(bytes(data), f"form field {shown}")))
    return _fields(pairs), files


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


def validation_message(errors) -> str:
    """One line for pydantic's errors: ``beam: Input should be a valid integer``."""
    parts = []
    for e in list(errors)[:3]:
        where = ".".join(str(x) for x in e.get("loc", ()) if x not in ("body", "str", "list[str]"))
        parts.append(f"{where}: {e.get('msg', 'invalid')}" if where else str(e.get("msg", "invalid")))
    return "Invalid request: " + "; ".join(parts)
