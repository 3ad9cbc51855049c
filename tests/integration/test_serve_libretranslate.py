"""LibreTranslate's API as LibreTranslate 1.9 answers it, endpoint by endpoint, method by method, body kind
by body kind, message by message. The reference is LibreTranslate v1.9.6 (commit 497f6c6,
github.com/LibreTranslate/LibreTranslate): ``libretranslate/app.py`` (routes, checks and messages),
``libretranslate/templates/app.js.template`` (what its web page requests and how: ``/frontend/settings``
then ``/languages``, then ``FormData`` posts to ``/translate``; ``apiSecret: "..."`` in ``/js/app.js``)
and ``libretranslate/tests/test_api/*.py`` (its own API tests: 405s, ``{"status": "ok"}``, the messages).

The real app behind the real middleware and uvicorn, in this process, on a port the OS picks, with
stand-in engines (a word-reversing engine; no model): what is checked here is the HTTP API, and a
stand-in keeps it in the fast tier. tests/integration/test_serve.py checks the translations of a real
model through the same endpoints.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
pytest.importorskip("python_multipart")

from test_serve_batcher import WordVocab  # noqa: E402 - after the skips

from mtkit.config import DecodeConfig  # noqa: E402
from mtkit.engines.engine import Engine  # noqa: E402
from mtkit.serve.files import supported_formats  # noqa: E402
from mtkit.serve.models import ServedModel  # noqa: E402

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
MAX_CHARS, MAX_SENTENCES, MAX_ALTERNATIVES = 200, 6, 4


class Reverse(Engine):
    """Translates by reversing the words; the k-th hypothesis rotates the reversed words by k."""

    def __init__(self) -> None:
        super().__init__(WordVocab(), DecodeConfig(beam=2))

    def search_batch(self, batch, call):
        found = []
        for ids in batch:
            words = list(reversed(ids[:-1]))  # without EOS
            found.append([(words[k:] + words[:k], -1.0 - k, -2.0 - 2 * k) for k in range(call.decode.nbest)])
        return found


def reverse(text: str) -> str:
    return " ".join(reversed(text.split()))


class Running:
    """``mtkit serve``'s app (create_app, Cors, Guard) under uvicorn in a thread."""

    def __init__(self, models: list[ServedModel], api_keys: frozenset[str] | None = None, limits=None,
                 body_limit: int = 100_000) -> None:
        import uvicorn

        from mtkit.serve.app import create_app
        from mtkit.serve.server import Cors, Guard, bind
        from mtkit.serve.service import Limits, Service

        limits = limits or Limits(max_chars=MAX_CHARS, max_sentences=MAX_SENTENCES, max_alternatives=MAX_ALTERNATIVES,
                                  max_beam=8)
        self.service = Service(models, limits, api_keys)
        app = Guard(Cors(create_app(self.service)), body_limit, self.service.metrics)
        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60  # a bound on a hang, not a timing assertion
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.server.started

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)
        self.sock.close()

    def request(self, method: str, path: str, body: bytes | None = None, content_type: str | None = None,
                headers: dict | None = None) -> tuple[int, dict, bytes]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=body, method=method,
                                     headers={**({"Content-Type": content_type} if content_type else {}),
                                              **(headers or {})})
        try:
            with OPENER.open(req, timeout=60) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def json(self, method: str, path: str, body: bytes | None = None, content_type: str | None = None,
             headers: dict | None = None):
        status, _, answer = self.request(method, path, body, content_type, headers)
        return status, json.loads(answer)

    def post_json(self, path: str, data, headers: dict | None = None):
        return self.json("POST", path, json.dumps(data).encode(), "application/json", headers)

    def post_form(self, path: str, fields):
        return self.json("POST", path, urllib.parse.urlencode(fields).encode(), "application/x-www-form-urlencoded")

    def post_multipart(self, path: str, fields, files=()):
        body, content_type = multipart(fields, files)
        return self.json("POST", path, body, content_type)


def multipart(fields, files=()) -> tuple[bytes, str]:
    """A ``multipart/form-data`` body as a browser's ``FormData`` sends it (CRLF line ends, UTF-8 values)."""
    boundary = "----formdata-" + uuid.uuid4().hex
    out = b""
    for name, value in (fields.items() if isinstance(fields, dict) else fields):
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n").encode()
        out += str(value).encode() + b"\r\n"
    for name, filename, data in files:
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{filename}\"\r\n"
                "Content-Type: text/plain\r\n\r\n").encode() + data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return out, f"multipart/form-data; boundary={boundary}"


@pytest.fixture(scope="module")
def one():
    """One model, en -> de."""
    s = Running([ServedModel("en-de", Reverse(), "en", "de")])
    yield s
    s.stop()


@pytest.fixture(scope="module")
def several():
    """en -> de, en -> fr and fr -> de: several sources, a pair missing (de -> anything, fr -> en)."""
    engine = Reverse()
    s = Running([ServedModel("en-de", engine, "en", "de"), ServedModel("en-fr", engine, "en", "fr"),
                 ServedModel("fr-de", engine, "fr", "de")])
    yield s
    s.stop()


OK = {"q": "one two three", "source": "en", "target": "de"}


# ------------------------------------------------------------------------------------ endpoints, methods


def test_get_endpoints_answer_200_in_libretranslates_shapes_and_other_methods_405(one):
    """app.py: ``/languages``, ``/health`` (``{"status": "ok"}``, test_api_health.py), ``/frontend/settings``
    and ``/spec`` are GET routes; ``/translate``, ``/detect``, ``/suggest``, ``/translate_file`` POST routes;
    any other method is a 405 (test_api_*.py's ``must_fail_bad_request_type``)."""
    assert one.json("GET", "/health") == (200, {"status": "ok"})
    assert one.json("GET", "/languages") == (200, [{"code": "en", "name": "English", "targets": ["de"]}])
    status, spec = one.json("GET", "/spec")
    assert status == 200 and spec["swagger"] == "2.0" and {"title", "version"} <= set(spec["info"])
    assert set(spec["paths"]) >= {"/translate", "/languages", "/detect", "/health", "/frontend/settings"}
    assert "post" in spec["paths"]["/translate"] and "get" in spec["paths"]["/languages"]
    assert {p["name"] for p in spec["paths"]["/translate"]["post"]["parameters"]} == {
        "q", "source", "target", "format", "alternatives", "api_key", "qe"}  # qe: mtkit's own, opt-in
    for method, path in [("POST", "/health"), ("POST", "/spec"), ("POST", "/frontend/settings"),
                         ("POST", "/languages"), ("GET", "/detect"), ("GET", "/translate"), ("PUT", "/translate"),
                         ("DELETE", "/languages"), ("GET", "/suggest"), ("GET", "/translate_file")]:
        status, _, body = one.request(method, path, b"" if method != "GET" else None)
        assert status == 405, (method, path, status, body)
        assert isinstance(json.loads(body)["error"], str)


def test_head_and_options_as_flask_answers_them(one):
    """Flask adds HEAD to each GET route and OPTIONS (200, ``Allow``) to every route of LibreTranslate's;
    a health probe with HEAD gets 200 and no body."""
    for path in ("/health", "/languages", "/frontend/settings", "/spec", "/js/app.js", "/"):
        status, headers, body = one.request("HEAD", path)
        assert (status, body) == (200, b"") and int(headers["content-length"]) > 0, path
        status, headers, body = one.request("OPTIONS", path)
        assert (status, headers["allow"], body) == (200, "GET, HEAD, OPTIONS", b""), path
    for path in ("/translate", "/detect", "/suggest", "/translate_file"):
        status, headers, body = one.request("OPTIONS", path)
        assert (status, headers["allow"], body) == (200, "OPTIONS, POST", b""), path
        assert one.request("HEAD", path)[0] == 405, path


def test_frontend_settings_as_libretranslates_page_reads_them(one, several):
    """app.py ``frontend_settings()``: the fields app.js.template's ``mounted`` reads (``language.source.code``,
    ``language.target.code``, ``charLimit``, ``suggestions``, ``supportedFilesFormat``, ``filesTranslation``,
    ``frontendTimeout``) and the rest of LibreTranslate's answer (``apiKeys``, ``keyRequired``)."""
    status, settings = one.json("GET", "/frontend/settings")
    assert status == 200
    assert settings == {
        "charLimit": MAX_CHARS, "frontendTimeout": 500, "apiKeys": False, "keyRequired": False,
        "suggestions": False, "filesTranslation": True, "supportedFilesFormat": list(supported_formats()),
        "language": {"source": {"code": "auto", "name": "Auto Detect"}, "target": {"code": "de", "name": "German"}}}
    # Several source languages: auto still (each text's language detected and sent to the model that has it).
    status, settings = several.json("GET", "/frontend/settings")
    assert status == 200 and settings["language"] == {"source": {"code": "auto", "name": "Auto Detect"},
                                                      "target": {"code": "de", "name": "German"}}


def test_the_page_and_its_script_hold_what_scrapers_read(one):
    """app.js.template holds ``apiSecret: "{{ bogus_api_secret }}"`` (empty without --require-api-key-secret)
    and index.html loads ``js/app.js?v=VERSION``; clients find the secret with ``apiSecret: "(.*?)"`` in
    ``GET /js/app.js``. mtkit's page keeps working: its script is that file."""
    import re

    from mtkit.version import __version__

    status, headers, page = one.request("GET", "/")
    assert status == 200 and headers["content-type"].startswith("text/html") and b"<textarea" in page
    assert f'src="js/app.js?v={__version__}"'.encode() in page
    for path in ("/js/app.js", f"/js/app.js?v={__version__}"):
        status, headers, script = one.request("GET", path)
        assert status == 200 and headers["content-type"].startswith("application/javascript")
        assert re.search(rb'apiSecret: "(.*?)"', script).group(1) == b""
        assert b"v1/translate" in script and b"v1/models" in script  # mtkit's page: its own API
    assert one.request("POST", "/js/app.js", b"")[0] == 405


def test_health_is_libretranslates_and_mtkits_models_moved_to_v1_models(one, several):
    """``/health`` is LibreTranslate's ``{"status": "ok"}``; the model names, languages, engines and steps
    are mtkit's own API's (``GET /v1/models``)."""
    assert several.json("GET", "/health") == (200, {"status": "ok"})
    status, answer = several.json("GET", "/v1/models")
    assert status == 200 and answer == {"models": [
        {"name": "en-de", "source": "en", "target": "de", "engine": "torch", "step": None, "alignments": False},
        {"name": "en-fr", "source": "en", "target": "fr", "engine": "torch", "step": None, "alignments": False},
        {"name": "fr-de", "source": "fr", "target": "de", "engine": "torch", "step": None, "alignments": False}]}
    assert one.request("POST", "/v1/models", b"")[0] == 405


def test_health_is_503_while_the_models_are_not_ready():
    """LibreTranslate's ``/health`` is 200 once it serves; mtkit's is 503 while the models are not ready to
    decode (before the lifespan starts the decoding threads, during a stop), so that a balancer waits."""
    s = Running([ServedModel("en-de", Reverse(), "en", "de")])
    try:
        s.service.ready = False  # as between the app's creation and its lifespan's start
        assert s.json("GET", "/health") == (503, {"status": "unavailable"})
        s.service.ready = True
        assert s.json("GET", "/health") == (200, {"status": "ok"})
    finally:
        s.stop()


# ------------------------------------------------------------------------------------ bodies


def test_json_forms_multipart_and_query_strings_all_translate(one):
    """app.py ``translate()``: a JSON body (``request.is_json``, ``application/*+json`` too) or
    ``request.values`` (the query string and a urlencoded or multipart form: app.js.template posts
    ``FormData``). A form's ``q`` has its line ends made LF (``"\\n".join(q.splitlines())``)."""
    want = {"translatedText": reverse(OK["q"])}
    assert one.post_json("/translate", OK) == (200, want)
    assert one.json("POST", "/translate", json.dumps(OK).encode(), "application/vnd.api+json") == (200, want)
    assert one.post_form("/translate", OK) == (200, want)
    assert one.post_multipart("/translate", OK) == (200, want)
    assert one.json("POST", "/translate?" + urllib.parse.urlencode(OK)) == (200, want)
    # The query string comes first for a form (Flask's request.values: args, then form).
    assert one.json("POST", "/translate?q=five+six", urllib.parse.urlencode(OK).encode(),
                    "application/x-www-form-urlencoded") == (200, {"translatedText": "six five"})
    # A body LibreTranslate does not read (text/plain): only the query string counts.
    assert one.json("POST", "/translate?" + urllib.parse.urlencode(OK), b"q=seven", "text/plain") == (200, want)
    # CRLF from a browser's form (and a lone CR) become LF; a trailing line end goes, as splitlines() drops it.
    lines = {**OK, "q": "one two\r\nthree four\rfive\r\n"}
    expected = {"translatedText": "two one\nfour three\nfive"}
    assert one.post_multipart("/translate", lines) == (200, expected)
    assert one.post_form("/translate", lines) == (200, expected)
    # A file part is no field (request.values leaves files out): q from a file is a missing q.
    assert one.post_multipart("/translate", {"source": "en", "target": "de"},
                              [("q", "q.txt", b"one two")]) == (400, {"error": "Invalid request: missing q parameter"})
    # Unicode survives each body kind.
    text = {**OK, "q": "grüße 東京 ☃"}
    for answer in (one.post_json("/translate", text), one.post_form("/translate", text),
                   one.post_multipart("/translate", text)):
        assert answer == (200, {"translatedText": "☃ 東京 grüße"})


def test_multipart_bodies_that_cannot_be_read_have_no_fields_and_parts_are_bounded(one):
    """Flask reads a multipart body it cannot parse (no boundary, cut short, garbage) as an empty form:
    ``missing q``. mtkit bounds the parts of one form (MAX_FORM_PARTS); invalid UTF-8 in a field is a
    400 naming it."""
    from mtkit.serve.schemas import MAX_FORM_PARTS

    missing_q = (400, {"error": "Invalid request: missing q parameter"})
    body, content_type = multipart(OK)
    assert one.json("POST", "/translate", body, "multipart/form-data") == missing_q  # no boundary
    assert one.json("POST", "/translate", body[: len(body) // 2], content_type) == missing_q  # cut short
    assert one.json("POST", "/translate", b"garbage" + body, content_type) == missing_q
    status, answer = one.post_multipart("/translate", [*OK.items(), *[("x", "") for _ in range(MAX_FORM_PARTS)]])
    assert status == 400 and f"more than {MAX_FORM_PARTS} parts" in answer["error"]
    body, content_type = multipart({"source": "en", "target": "de", "q": "PLACEHOLDER"})
    status, answer = one.json("POST", "/translate", body.replace(b"PLACEHOLDER", b"one \xff"), content_type)
    assert status == 400 and "form field q is not valid UTF-8" in answer["error"]


def test_libretranslates_web_page_as_it_talks_to_the_server(one):
    """The requests app.js.template makes, in order, with its exact fields: settings, languages, then a
    FormData post with ``alternatives`` 3, an empty ``api_key`` and the settings' source (``auto``)."""
    status, settings = one.json("GET", "/frontend/settings")
    status_languages, languages = one.json("GET", "/languages")
    assert (status, status_languages) == (200, 200) and languages[0]["code"] == "en"
    form = {"q": "one two three", "source": settings["language"]["source"]["code"],
            "target": settings["language"]["target"]["code"], "format": "text", "alternatives": 3, "api_key": ""}
    status, answer = one.post_multipart("/translate", form)
    assert status == 200, answer
    # The page reads translatedText, then detectedLanguage.language and .confidence when the source is auto.
    detected = answer.pop("detectedLanguage")
    assert answer == {"translatedText": "three two one", "alternatives": ["two one three", "one three two"]}
    assert detected["language"] == "en" and 0 < detected["confidence"] <= 100


# ------------------------------------------------------------------------------------ messages


def test_libretranslates_error_messages_word_for_word(one, several):
    """Each message of app.py's ``translate()`` and ``detect()`` (``abort(400, description=...)``, answered as
    ``{"error": ...}``), for the same condition and in LibreTranslate's order of checks. test_api_translate.py:
    ``"zz is not supported"``, ``"Invalid request: missing q parameter"``."""
    def error(answer):
        return answer[0], answer[1]["error"]

    cases = [
        (one.post_form("/translate", {"source": "en", "target": "de", "format": "text"}),
         "Invalid request: missing q parameter"),
        (one.post_json("/translate", {**OK, "q": ""}), "Invalid request: missing q parameter"),
        (one.post_json("/translate", {**OK, "q": []}), "Invalid request: missing q parameter"),
        (one.post_json("/translate", {"q": "one", "target": "de"}), "Invalid request: missing source parameter"),
        (one.post_form("/translate", {"q": "one", "source": "", "target": "de"}),
         "Invalid request: missing source parameter"),
        (one.post_json("/translate", {"q": "one", "source": "en"}), "Invalid request: missing target parameter"),
        (one.post_form("/translate", {**OK, "alternatives": "many"}),
         "Invalid request: alternatives parameter is not a number"),
        (one.post_json("/translate", {**OK, "alternatives": "3.5"}),
         "Invalid request: alternatives parameter is not a number"),
        (one.post_json("/translate", {**OK, "alternatives": None}),
         "Invalid request: alternatives parameter is not a number"),
        (one.post_json("/translate", {**OK, "alternatives": MAX_ALTERNATIVES + 1}),
         f"Invalid request: alternatives parameter must be <= {MAX_ALTERNATIVES}"),
        (one.post_json("/translate", {**OK, "q": ["one"] * (MAX_SENTENCES + 1)}),
         f"Invalid request: request ({MAX_SENTENCES + 1}) exceeds text limit ({MAX_SENTENCES})"),
        (one.post_json("/translate", {**OK, "q": "x" * (MAX_CHARS + 1)}),
         f"Invalid request: request ({MAX_CHARS + 1}) exceeds text limit ({MAX_CHARS})"),
        (one.post_form("/translate", {**OK, "target": "zz"}), "zz is not supported"),
        (one.post_form("/translate", {**OK, "source": "xx"}), "xx is not supported"),
        (one.post_form("/translate", {**OK, "source": "XX"}), "xx is not supported"),  # iso2model lower-cases
        (one.post_json("/translate", {**OK, "format": "markdown"}), "markdown format is not supported"),
        (one.post_json("/translate", {**OK, "source": "de", "target": "en"}),
         "English (en) is not available as a target language from German (de)"),
        (several.post_json("/translate", {**OK, "source": "fr", "target": "fr"}),
         "French (fr) is not available as a target language from French (fr)"),
        (one.post_json("/translate", {**OK, "source": "auto", "target": "en"}),
         "English (en) is not available as a target language from English (en)"),
        (one.json("POST", "/translate", b'["one"]', "application/json"), "Invalid JSON format"),
        (one.json("POST", "/translate", b'{"q": "one', "application/json"),
         "The browser (or proxy) sent a request that this server could not understand."),
        (one.json("POST", "/detect", b"", "application/x-www-form-urlencoded"), "Invalid request: missing q parameter"),
        (one.post_json("/detect", {"q": ""}), "Invalid request: missing q parameter"),
    ]
    for answer, message in cases:
        assert error(answer) == (400, message), (answer, message)
    # A long value comes back shortened, never whole.
    status, answer = one.post_json("/translate", {**OK, "format": "y" * 5000})
    assert status == 400 and answer["error"].endswith(" format is not supported") and len(answer["error"]) < 120
    # Files (tests/integration/test_serve_files.py has the rest); suggestions: as a LibreTranslate with them off.
    assert one.post_multipart("/translate_file", {"source": "en", "target": "de"}, [("file", "a.exe", b"one")]) == (
        400, {"error": "Invalid request: file format not supported"})
    assert one.post_form("/suggest", {"q": "one", "s": "eins", "source": "en", "target": "de"}) == (
        403, {"error": "Suggestions are disabled on this server."})


def test_alternatives_as_libretranslate_gives_them(one):
    """``max(0, int(alternatives))``: a negative count is none, a JSON float is truncated, a numeric string
    counts; the alternatives leave out repeats and the translation itself (``filter_unique``); html gets
    none (``alternatives = [] # Not supported for html yet``)."""
    assert one.post_json("/translate", {**OK, "alternatives": -3}) == (200, {"translatedText": "three two one"})
    assert one.post_json("/translate", {**OK, "alternatives": 1.9}) == (
        200, {"translatedText": "three two one", "alternatives": ["two one three"]})
    assert one.post_form("/translate", {**OK, "alternatives": " 2 "}) == (
        200, {"translatedText": "three two one", "alternatives": ["two one three", "one three two"]})
    # Two words: every rotation beyond the first repeats one already given.
    assert one.post_json("/translate", {**OK, "q": "one two", "alternatives": 4}) == (
        200, {"translatedText": "two one", "alternatives": ["one two"]})
    assert one.post_json("/translate", {**OK, "q": ["one two", "three four"], "alternatives": 1}) == (
        200, {"translatedText": ["two one", "four three"], "alternatives": [["one two"], ["three four"]]})
    assert one.post_json("/translate", {**OK, "q": "<b>one two</b>", "format": "html", "alternatives": 2}) == (
        200, {"translatedText": "<b>two one</b>", "alternatives": []})


def test_language_codes_as_libretranslate_reads_them(several):
    """``iso2model``: codes are matched without regard to case; ``source=auto`` answers the detected language
    for a text and for a list, and sends each text to the model that translates from it."""
    assert several.post_json("/translate", {**OK, "source": "EN", "target": "Fr"}) == (
        200, {"translatedText": "three two one"})
    # LibreTranslate's aliases (language.py): zh-Hans is its zh, which this server does not have.
    assert several.post_json("/translate", {**OK, "target": "zh-Hans"}) == (400, {"error": "zh is not supported"})
    status, answer = several.post_json("/translate", {**OK, "q": ["one two three"], "source": "auto", "target": "fr"})
    assert status == 200 and answer["translatedText"] == ["three two one"]
    assert [d["language"] for d in answer["detectedLanguage"]] == ["en"]
    # en and fr both translate into de: each text goes to the model of its language (both reverse words here)
    status, answer = several.post_json("/translate", {**OK, "q": ["the cat sleeps on the sofa",
                                                                  "le chat dort sur le canapé"],
                                                       "source": "auto", "target": "de"})
    assert status == 200 and answer["translatedText"] == ["sofa the on sleeps cat the", "canapé le sur dort chat le"]
    assert [d["language"] for d in answer["detectedLanguage"]] == ["en", "fr"]


def test_api_keys_as_libretranslate_answers_them():
    """access_check(): no key when one is needed is a 400 "Please contact the server operator to get an
    API key" (an empty ``api_key``, as the page sends, is none); a key that is not one is a 403
    "Invalid API key"; ``/languages``, ``/health``, ``/frontend/settings`` and ``/spec`` need none, and the
    settings say a key is needed."""
    s = Running([ServedModel("en-de", Reverse(), "en", "de")], api_keys=frozenset({"k-1"}))
    try:
        need = (400, {"error": "Please contact the server operator to get an API key"})
        assert s.post_json("/translate", OK) == need
        assert s.post_multipart("/translate", {**OK, "api_key": ""}) == need
        assert s.post_json("/detect", {"q": "one"}) == need
        assert s.post_form("/translate", {**OK, "api_key": "nope"}) == (403, {"error": "Invalid API key"})
        assert s.post_multipart("/translate", {**OK, "api_key": "k-1"}) == (200, {"translatedText": "three two one"})
        assert s.json("POST", "/translate?" + urllib.parse.urlencode({**OK, "api_key": "k-1"}))[0] == 200
        assert s.post_json("/v1/translate", {"text": "one"})[0] == 403  # mtkit's own API: its own status
        for path in ("/languages", "/health", "/frontend/settings", "/spec", "/js/app.js", "/"):
            assert s.request("GET", path)[0] == 200, path
        settings = s.json("GET", "/frontend/settings")[1]
        assert settings["apiKeys"] is True and settings["keyRequired"] is True
    finally:
        s.stop()


def test_serve_help_says_what_a_missing_or_wrong_api_key_gets():
    """``mtkit serve --help`` on --api-keys: the statuses test_api_keys_as_libretranslate_answers_them sees."""
    import typer

    from mtkit.cli import app

    serve = typer.main.get_command(app).commands["serve"]
    text = " ".join(next(p.help for p in serve.params if p.name == "api_keys").split())
    assert "/translate and /detect answer 400 without a key and 403 with a wrong one" in text
    assert "/v1/translate answers 403 to both" in text


def test_cors_on_libretranslates_routes(one):
    """LibreTranslate's blueprint adds ``Access-Control-Allow-Origin: *`` to each of its routes' answers."""
    for path in ("/health", "/frontend/settings", "/languages"):
        status, headers, _ = one.request("GET", path, headers={"Origin": "https://page.example"})
        assert status == 200 and headers.get("access-control-allow-origin") == "*", path


class AligningVocab(WordVocab):
    """One piece per word, so each id's word is its position."""

    def src_words(self, text):
        return list(range(len(text.split())))

    def tgt_words(self, ids):
        return list(range(len(ids)))


class AligningReverse(Reverse):
    """The reversing stand-in with the attention a perfect aligner of its reversal has: target word t on
    source word n - 1 - t (a one-layer model's, so that the engine gives alignments)."""

    def __init__(self) -> None:
        super().__init__()
        self.vocab = AligningVocab()
        self.decoder_layers = 1

    def attention_batch(self, sources, outputs, call, layer, head):
        import numpy as np

        found = []
        for src, out in zip(sources, outputs):
            grid = np.zeros((len(out), len(src)))
            for t in range(len(out)):
                grid[t, len(src) - 2 - t] = 1.0  # the last column is EOS
            found.append(grid)
        return found


@pytest.fixture(scope="module")
def aligned():
    s = Running([ServedModel("en-de", AligningReverse(), "en", "de")])
    yield s
    s.stop()


def test_html_puts_inline_tags_back_around_the_aligned_words(aligned, one):
    q = '<p class="c">one <b>two</b> <a href="/x?a=1&amp;b=2">three</a> &amp;</p>\n<ul><li>four <i>five</i></li></ul>'
    expected = ('<p class="c">&amp; <a href="/x?a=1&amp;b=2">three</a> <b>two</b> one</p>\n'
                '<ul><li><i>five</i> four</li></ul>')
    assert aligned.post_json("/translate", {**OK, "q": q, "format": "html"}) == (200, {"translatedText": expected})
    # a list, and a form
    assert aligned.post_form("/translate", {**OK, "q": "a <x>b</x> c", "format": "html"}) == (
        200, {"translatedText": "c <x>b</x> a"})
    # broken markup: a clear 400 naming the text
    assert aligned.post_json("/translate", {**OK, "q": ["fine", "a </b> b"], "format": "html"}) == (
        400, {"error": "q[1]: </b> closes no open tag"})
    # an engine without alignments: the text between tags, as LibreTranslate's own html mode
    assert one.post_json("/translate", {**OK, "q": "one <b>two three</b> four", "format": "html"}) == (
        200, {"translatedText": "one <b>three two</b> four"})


def test_v1_gives_alignments_and_translates_markup(aligned, one):
    status, answer = aligned.post_json("/v1/translate", {"text": ["one two three", ""], "alignments": True})
    assert status == 200, answer
    first, empty = answer["translations"]
    assert first["text"] == "three two one" and first["alignment"] == [[0, 2], [1, 1], [2, 0]]
    assert first["nbest"][0]["alignment"] == [[0, 2], [1, 1], [2, 0]] and empty["nbest"] == []
    status, answer = aligned.post_json("/v1/translate", {"text": "one two"})
    assert status == 200 and answer["translations"][0]["alignment"] is None
    status, answer = aligned.post_json("/v1/translate", {"text": ['a <g id="1">b</g> <x id="2"/> c'],
                                                         "format": "xml"})
    # the void tag goes before the target word of the source word after it ("c"), a space after it as before
    assert status == 200 and answer["translations"][0]["text"] == '<x id="2"/> c <g id="1">b</g> a'
    status, answer = aligned.post_json("/v1/translate", {"text": "<p>one</p>\n<p>two <b>three</b></p>",
                                                         "format": "html"})
    assert status == 200 and answer["translations"][0]["text"] == "<p>one</p>\n<p><b>three</b> two</p>"
    assert aligned.post_json("/v1/translate", {"text": "<b>x", "format": "html"}) == (
        400, {"error": "text: <b> is never closed"})
    assert aligned.post_json("/v1/translate", {"text": "x", "format": "html", "alignments": True})[0] == 400
    assert one.post_json("/v1/translate", {"text": "x", "alignments": True}) == (
        400, {"error": "model en-de: its engine (torch) gives no alignments"})


def test_v1_markup_answers_its_quality_estimate_and_its_n_best_list(aligned, one):
    """docs/serve.md: each item of format html (or xml) comes back with its qe and its n-best list, each
    hypothesis the markup with its tags placed by that hypothesis's own alignment; a fragment of several
    sentences sums their scores, log-probabilities and tokens and averages their confidences."""
    status, answer = aligned.post_json("/v1/translate", {"text": ["a <b>b</b> c", "<p>one two</p><p>three</p>",
                                                                  "<b></b>"], "format": "html", "nbest": 2})
    assert status == 200, answer
    inline, blocks, empty = answer["translations"]
    assert [h["text"] for h in inline["nbest"]] == ["c <b>b</b> a", "b <b>a</b> c"]  # rotated: its own tags
    assert inline["text"] == inline["nbest"][0]["text"] and inline["qe"] == inline["confidence"] is not None
    assert inline["nbest"][0]["confidence"] == inline["confidence"]
    # (stand-in: the k-th hypothesis has score -1 - k and log-probability -2 - 2k)
    assert [(h["score"], h["logprob"]) for h in inline["nbest"]] == [(-1.0, -2.0), (-2.0, -4.0)]
    assert [h["text"] for h in blocks["nbest"]] == ["<p>two one</p><p>three</p>", "<p>one two</p><p>three</p>"]
    first = blocks["nbest"][0]
    assert (first["score"], first["logprob"], first["tokens"]) == (-2.0, -4.0, 5)  # both sentences'
    assert first["confidence"] == pytest.approx((-2 / 3 + -2 / 2) / 2) == blocks["confidence"] == blocks["qe"]
    assert empty == {"text": "<b></b>", "confidence": None, "qe": None, "nbest": [], "unmet": [],
                     "unmet_reasons": {}, "alignment": None, "sentences": None}
    # an engine without alignments: the text between tags, each hypothesis's own
    status, answer = one.post_json("/v1/translate", {"text": "one <b>two three</b>", "format": "xml", "nbest": 2})
    assert status == 200, answer
    found = answer["translations"][0]
    assert [h["text"] for h in found["nbest"]] == ["one <b>three two</b>", "one <b>two three</b>"]
    assert found["qe"] == pytest.approx(found["confidence"])
