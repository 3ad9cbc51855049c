"""LibreTranslate's file translation on ``mtkit serve``: ``POST /translate_file`` (a multipart ``file``, ``source``,
``target``, ``api_key``) answers ``{"translatedFileUrl": ".../download_file/<name>"}``, and that URL gives the
document translated (its structure kept) as an attachment named as the upload with the target language. The
reference is LibreTranslate's ``app.py`` (``translate_file()``, ``download_file()``, its messages and order of
checks), its page's ``translateFile`` (app.js.template: a ``FormData`` of file, source, target, api_key) and
argos-translate-files (``report.txt`` -> ``report_de.txt``).

A stranger's file costs bounded work and gets a 4xx, never a 5xx, and the server goes on: a body over
``--max-file-bytes`` is refused before it is read whole (413), a file of no format or not of its format is a
400 (one line naming it), and a zip bomb, a cut archive and a DTD in an Office part are refused by
:mod:`mtkit.documents.archive` (400). Downloads are looked up among the files the server made (anything else:
404).

The real app behind the real middleware and uvicorn, in this process, with stand-in engines (a word-reversing
engine that aligns each word with the one it came from: the placement of tags shows), so that it is fast; one
test runs the real torch engine of a tiny checkpoint through the batcher, and the slow tier the trained
multi30k model (German text, subtitle timings kept).
"""

from __future__ import annotations

import importlib.util
import io
import json
import threading
import time
import urllib.parse
import zipfile

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
pytest.importorskip("python_multipart")

from conftest import MODELS, http_exchange, write_tiny_checkpoint  # noqa: E402 - after the skips
from test_serve_libretranslate import OPENER, AligningReverse, Reverse, multipart, reverse  # noqa: E402

from mtkit.serve.files import FileStore, attachment, supported_formats, translated_name  # noqa: E402
from mtkit.serve.models import ServedModel  # noqa: E402
from mtkit.serve.server import UPLOAD_ROOM  # noqa: E402

MAX_FILE = 8_000
REAL_MODEL = MODELS / "multi30k-en-de"
NO_OFFICE = importlib.util.find_spec("mtkit.documents.office") is None
NO_SUBTITLES = importlib.util.find_spec("mtkit.documents.subtitles") is None


class Serving:
    """``mtkit serve``'s app (create_app, Cors, Guard with --max-file-bytes) under uvicorn in a thread."""

    def __init__(self, models: list[ServedModel], max_file_bytes: int = MAX_FILE, api_keys=None, **limits) -> None:
        import uvicorn

        from mtkit.serve.app import create_app
        from mtkit.serve.server import Cors, Guard, bind
        from mtkit.serve.service import Limits, Service

        self.service = Service(models, Limits(max_file_bytes=max_file_bytes, **limits), api_keys)
        app = Guard(Cors(create_app(self.service)), 100_000, self.service.metrics, max_file_bytes=max_file_bytes)
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

    def get(self, path_or_url: str) -> tuple[int, dict, bytes]:
        url = path_or_url if path_or_url.startswith("http") else f"http://127.0.0.1:{self.port}{path_or_url}"
        try:
            with OPENER.open(url, timeout=60) as response:
                return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
        except urllib.error.HTTPError as e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()

    def upload(self, filename: str | None, data: bytes = b"", fields: dict | None = None, **headers):
        """``POST /translate_file`` as LibreTranslate's page sends it: (status, JSON answer)."""
        fields = {"source": "en", "target": "de", **(fields or {})}
        body, content_type = multipart({k: v for k, v in fields.items() if v is not None},
                                       [("file", filename, data)] if filename is not None else [])
        return self.post("/translate_file", body, content_type, headers)

    def post(self, path: str, body: bytes, content_type: str, headers: dict | None = None):
        found = http_exchange(self.port, "POST", path, body, {"Content-Type": content_type, **(headers or {})})
        assert found is not None, "the server closed the connection without an answer"
        status, _, answer = found
        return status, json.loads(answer)

    def translate(self, filename: str, data: bytes, **fields) -> tuple[bytes, dict]:
        """The translated document and its download's headers (asserting every step answers 200)."""
        status, answer = self.upload(filename, data, fields)
        assert status == 200, answer
        assert set(answer) == {"translatedFileUrl"}
        status, headers, body = self.get(answer["translatedFileUrl"])
        assert status == 200, body
        return body, headers


@pytest.fixture(scope="module")
def aligned():
    """en -> de by a reversing stand-in that gives word alignments (tags follow their words)."""
    s = Serving([ServedModel("en-de", AligningReverse(), "en", "de")], max_sentences=4, max_chars=60)
    yield s
    s.stop()


def reversed_lines(text: str) -> str:
    return "".join(reverse(line) + line[len(line.rstrip("\r\n")):] if line.strip() else line
                   for line in text.splitlines(keepends=True))


# ------------------------------------------------------------------------------------ the round trip


def test_a_text_file_comes_back_translated_line_by_line_as_an_attachment(aligned):
    source = "\ufeffone two three\r\n\r\nfour five\nsix\n" + "".join(f"w{i} x{i} y{i}\n" for i in range(20))
    body, headers = aligned.translate("notes.txt", source.encode())
    # every line translated (in parts of --max-sentences lines: 6 decoding jobs), blank lines, CRLF, BOM kept
    assert body.decode() == "\ufeff" + reversed_lines(source[1:])
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert headers["content-disposition"] == 'attachment; filename="notes_de.txt"'
    status, answer = aligned.upload("notes.txt", source.encode())
    url = urllib.parse.urlsplit(answer["translatedFileUrl"])
    # an absolute URL on this server, named as LibreTranslate names them: <uuid>.<name>_<target>.<ext>
    assert (url.scheme, url.netloc) == ("http", f"127.0.0.1:{aligned.port}")
    assert url.path.startswith("/download_file/") and url.path.endswith(".notes_de.txt")


def test_names_that_are_not_plain_ascii_or_are_paths_are_named_safely():
    assert translated_name("report.docx", "de") == "report_de.docx"
    assert translated_name("C:\\fakepath\\my report.v2.txt", "fr") == "my report.v2_fr.txt"
    assert translated_name("../../etc/passwd.txt", "de") == "passwd_de.txt"
    assert attachment("notes_de.txt") == 'attachment; filename="notes_de.txt"'
    assert attachment('Übersicht "1"\r\nX: y_de.txt') == (
        "attachment; filename=\"Ubersicht_1_X_y_de.txt\"; "
        "filename*=UTF-8''%C3%9Cbersicht%20%221%22%0D%0AX%3A%20y_de.txt")


def test_a_python_client_uploads_with_httpx_and_libretranslates_page_gets_its_file(aligned):
    """httpx's multipart upload (what a Python client sends; libretranslatepy 2.1 has no file method), and the
    requests LibreTranslate's page makes: /frontend/settings (filesTranslation, supportedFilesFormat), then a
    FormData of file, source (the settings' source: auto), target and an empty api_key."""
    httpx = pytest.importorskip("httpx")
    base = f"http://127.0.0.1:{aligned.port}"
    with httpx.Client(trust_env=False, timeout=60) as client:
        answer = client.post(f"{base}/translate_file", data={"source": "en", "target": "de"},
                             files={"file": ("a.txt", b"one two\n", "text/plain")})
        assert answer.status_code == 200, answer.text
        download = client.get(answer.json()["translatedFileUrl"])
        assert (download.status_code, download.content) == (200, b"two one\n")
        settings = client.get(f"{base}/frontend/settings").json()
        assert settings["filesTranslation"] is True
        assert settings["supportedFilesFormat"] == list(supported_formats()) and ".txt" in settings[
            "supportedFilesFormat"]
        page = {"source": settings["language"]["source"]["code"], "target": settings["language"]["target"]["code"],
                "api_key": ""}
        assert page["source"] == "auto"
        answer = client.post(f"{base}/translate_file", data=page,
                             files={"file": ("story.txt", b"A dog runs in the park.\n", "text/plain")})
        assert answer.status_code == 200, answer.text
        assert client.get(answer.json()["translatedFileUrl"]).content == b"park. the in runs dog A\n"


def test_the_spec_describes_file_translation(aligned):
    status, _, body = aligned.get("/spec")
    spec = json.loads(body)
    assert status == 200
    upload = spec["paths"]["/translate_file"]["post"]
    assert {p["name"] for p in upload["parameters"]} == {"file", "source", "target", "api_key"}
    assert "/download_file/{filename}" in spec["paths"]


# ------------------------------------------------------------------------------------ errors


def test_libretranslates_messages_in_its_order_of_checks(aligned):
    """app.py's ``translate_file()``: file, source, target, an empty file name, the extension, then the
    languages; each a 400 ``{"error": ...}``."""
    good = b"one two\n"
    cases = [
        (aligned.upload(None), "Invalid request: missing file parameter"),
        (aligned.upload(None, fields={"source": None}), "Invalid request: missing file parameter"),
        (aligned.upload("a.txt", good, {"source": None}), "Invalid request: missing source parameter"),
        (aligned.upload("a.txt", good, {"target": ""}), "Invalid request: missing target parameter"),
        (aligned.upload("", good), "Invalid request: empty file"),
        (aligned.upload("a.exe", good), "Invalid request: file format not supported"),
        (aligned.upload("README", good), "Invalid request: file format not supported"),
        (aligned.upload("a.txt", good, {"source": "xx"}), "xx is not supported"),
        (aligned.upload("a.txt", good, {"target": "fr"}), "fr is not supported"),
        # a body that is not a form has no file
        (aligned.post("/translate_file", b'{"source": "en", "target": "de"}', "application/json"),
         "Invalid request: missing file parameter"),
    ]
    for answer, message in cases:
        assert answer == (400, {"error": message})


def test_a_file_not_of_its_format_is_a_400_naming_it(aligned):
    status, answer = aligned.upload("notes.txt", b"fine\n\xff\xfe broken\n")
    assert status == 400 and answer["error"] == "Invalid request: notes.txt: line 2: not valid UTF-8 (byte 5)"
    assert aligned.get("/health")[0] == 200


def test_downloads_are_only_the_files_the_server_made(aligned):
    status, answer = aligned.upload("a.txt", b"one two\n")
    url = answer["translatedFileUrl"]
    name = urllib.parse.urlsplit(url).path.rsplit("/", 1)[1]
    for path in ("/download_file/" + "0" * 32 + ".a_de.txt", "/download_file/" + name + "x",
                 "/download_file/..%2F..%2Fetc%2Fpasswd", "/download_file/%2e%2e", "/download_file/a_de.txt"):
        status, _, body = aligned.get(path)
        assert status == 404 and json.loads(body)["error"], path  # ("Not Found" for a path the route never sees)
    assert aligned.get(url)[0] == 200
    # as Flask answers a GET route: HEAD (no body) and OPTIONS
    path = urllib.parse.urlsplit(url).path
    found = http_exchange(aligned.port, "HEAD", path)
    assert found is not None and found[0] == 200 and found[1]["content-disposition"].endswith('_de.txt"')
    found = http_exchange(aligned.port, "OPTIONS", path)
    assert found is not None and (found[0], found[1]["allow"]) == (200, "GET, HEAD, OPTIONS")
    # the request metrics name the downloads' endpoint once, whatever the file
    registry = aligned.service.metrics.registry
    assert registry.get_sample_value("mtkit_serve_requests_total", {"endpoint": "/download_file", "status": "404"})


def test_an_upload_over_max_file_bytes_is_413_before_it_is_read_whole(aligned):
    data = b"one two\n" * (MAX_FILE // 8 + 1)
    assert aligned.upload("big.txt", data)[0] == 413  # within the room for the form's other fields: counted
    # A body larger than that is refused from its Content-Length, before it is read: the answer comes though
    # only the headers were sent.
    import socket

    with socket.create_connection(("127.0.0.1", aligned.port), timeout=60) as sock:
        sock.sendall(f"POST /translate_file HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                     f"Content-Length: {MAX_FILE + UPLOAD_ROOM + 1}\r\n\r\n".encode())
        answer = sock.recv(65536).decode("latin-1")
    assert answer.startswith("HTTP/1.1 413") and "--max-file-bytes" in answer
    # Sent without a length (chunked), it is read up to the limit and no further.
    assert chunked_upload(aligned.port, 64 << 20).startswith("HTTP/1.1 413")
    assert aligned.get("/health")[0] == 200


def chunked_upload(port: int, size: int) -> str:
    """The answer's head to a chunked upload of ``size`` bytes, sent 64 KiB at a time while nothing has come back
    (a server that stops reading answers early; the rest is never sent: the assertion that it was not)."""
    import select
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"POST /translate_file HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        piece = b"x" * 65536
        sent = 0
        while sent < size and not select.select([sock], [], [], 0.01)[0]:
            try:
                sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
        assert sent < size, "the whole body was taken"
        return sock.recv(65536).decode("latin-1")


def test_with_files_off_as_libretranslate_with_disable_files_translation():
    s = Serving([ServedModel("en-de", Reverse(), "en", "de")], max_file_bytes=0)
    try:
        assert s.upload("a.txt", b"one\n") == (403, {"error": "Files translation are disabled on this server."})
        status, _, body = s.get("/download_file/x")
        assert (status, json.loads(body)) == (400, {"error": "Files translation are disabled on this server."})
        settings = json.loads(s.get("/frontend/settings")[2])
        assert (settings["filesTranslation"], settings["supportedFilesFormat"]) == (False, [])
    finally:
        s.stop()


def test_api_keys_as_for_text():
    s = Serving([ServedModel("en-de", Reverse(), "en", "de")], api_keys=frozenset({"k1"}))
    try:
        assert s.upload("a.txt", b"one\n") == (400, {"error": "Please contact the server operator to get an API key"})
        assert s.upload("a.txt", b"one\n", {"api_key": "nope"}) == (403, {"error": "Invalid API key"})
        status, answer = s.upload("a.txt", b"one two\n", {"api_key": "k1"})
        assert status == 200, answer
    finally:
        s.stop()


# ------------------------------------------------------------------------------------ the store


def test_translated_files_expire_and_their_number_and_bytes_are_bounded():
    now = [0.0]
    store = FileStore(keep=1800, max_files=3, max_bytes=100, clock=lambda: now[0])
    try:
        a = store.put(b"a" * 10, "a_de.txt")
        assert store.read(a) == (b"a" * 10, "a_de.txt")
        now[0] = 1801
        assert store.read(a) is None and len(store) == 0  # LibreTranslate's 30 minutes
        names = [store.put(bytes([65 + i]) * 10, f"{i}.txt") for i in range(4)]
        assert store.read(names[0]) is None and [store.read(n)[1] for n in names[1:]] == ["1.txt", "2.txt", "3.txt"]
        big = store.put(b"x" * 90, "big.txt")  # over the bytes: the oldest go until it fits
        assert [n for n in names if store.read(n) is not None] == [names[3]] and store.read(big)[0] == b"x" * 90
        assert store.read("../" + big) is None and store.read(big.split(".", 1)[1]) is None
    finally:
        store.close()


# ------------------------------------------------------------------------------------ several models, concurrency


def test_several_models_are_chosen_by_source_and_target_as_for_text():
    s = Serving([ServedModel("en-de", Reverse(), "en", "de"), ServedModel("en-fr", AligningReverse(), "en", "fr")])
    try:
        for target in ("de", "fr"):
            body, headers = s.translate("a.txt", b"one two three\n", target=target)
            assert body == b"three two one\n" and headers["content-disposition"].endswith(f'_{target}.txt"')
        registry = s.service.metrics.registry
        assert {m.name: registry.get_sample_value("mtkit_serve_sentences_total", {"model": m.name})
                for m in s.service.models} == {"en-de": 1, "en-fr": 1}
    finally:
        s.stop()


def test_text_requests_are_answered_while_a_document_translates():
    """The document goes to the batcher in parts (--max-sentences lines): /translate requests are decoded between
    them, and the event loop answers meanwhile (the document's work is in a worker thread)."""
    from test_serve_batcher import Reverser

    engine = Reverser()
    s = Serving([ServedModel("en-de", engine, "en", "de")], max_sentences=2, decoding_threads=1)
    batcher = s.service.batchers["en-de"]
    try:
        engine.gate.clear()  # each decoding call waits for the gate
        lines = [f"w{i} x{i}" for i in range(6)]
        document: list = []
        worker = threading.Thread(target=lambda: document.append(s.upload("a.txt", "\n".join(lines).encode())))
        worker.start()
        wait_until(lambda: batcher.decoding() == 1)  # the document's first part is being decoded
        assert s.get("/health")[0] == 200  # the event loop answers meanwhile
        text: list = []
        asking = threading.Thread(target=lambda: text.append(s.post(
            "/translate", json.dumps({"q": "a b", "source": "en", "target": "de"}).encode(), "application/json")))
        asking.start()
        wait_until(lambda: batcher.queue_length() == 1)
        engine.gate.set()
        worker.join(60)
        asking.join(60)
        assert text == [(200, {"translatedText": "b a"})] and document[0][0] == 200
        assert [n for n, _ in engine.calls] == [2, 1, 2, 2]  # the text between the document's parts
    finally:
        engine.gate.set()
        s.stop()


def test_a_client_that_goes_away_stops_its_documents_translation():
    from test_serve_batcher import Reverser

    engine = Reverser()
    s = Serving([ServedModel("en-de", engine, "en", "de")], max_sentences=2, decoding_threads=1)
    batcher = s.service.batchers["en-de"]
    try:
        engine.gate.clear()
        body, content_type = multipart({"source": "en", "target": "de"},
                                       [("file", "a.txt", "\n".join(f"w{i} x{i}" for i in range(6)).encode())])
        import socket

        with socket.create_connection(("127.0.0.1", s.port), timeout=60) as sock:
            sock.sendall(f"POST /translate_file HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            wait_until(lambda: batcher.decoding() == 1)  # its first part is being decoded
        # gone (once the server has seen it: it counts a 499): the part being decoded finishes, no other is sent
        wait_until(lambda: 'status="499"' in s.service.metrics.render()[0].decode())
        engine.gate.set()
        wait_until(lambda: s.service.files.running == 0)
        assert [n for n, _ in engine.calls] == [2] and batcher.queue_length() == 0
        assert s.translate("b.txt", b"one two\n")[0] == b"two one\n"  # the server goes on
    finally:
        engine.gate.set()
        s.stop()


def test_documents_beyond_those_being_translated_get_a_503():
    from test_serve_batcher import Reverser

    from mtkit.serve.files import MAX_FILE_JOBS

    engine = Reverser()
    s = Serving([ServedModel("en-de", engine, "en", "de")], decoding_threads=1)
    try:
        engine.gate.clear()
        answers: list = []
        held = [threading.Thread(target=lambda i=i: answers.append(s.upload(f"{i}.txt", f"w{i}\n".encode())))
                for i in range(MAX_FILE_JOBS)]
        for thread in held:
            thread.start()
        wait_until(lambda: s.service.files.running == MAX_FILE_JOBS)
        status, answer = s.upload("one-more.txt", b"w\n")
        assert status == 503 and "retry later" in answer["error"]
        engine.gate.set()
        for thread in held:
            thread.join(60)
        assert [status for status, _ in answers] == [200] * MAX_FILE_JOBS
        assert s.upload("one-more.txt", b"w\n")[0] == 200
    finally:
        engine.gate.set()
        s.stop()


def wait_until(condition) -> None:
    deadline = time.monotonic() + 30  # a bound on a hang, not a timing assertion
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.005)


# ------------------------------------------------------------------------------------ a real engine


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The torch engine of a tiny untrained checkpoint, as mtkit serve loads it."""
    from mtkit.api import LoadOptions, load_models

    checkpoint = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model.pt",
                                       decode={"beam": 1, "max_len_b": 4})
    model = load_models([checkpoint], LoadOptions(device="cpu", threads=1, any_target=True))
    s = Serving([ServedModel("tiny", model.engine, "en", "de")])
    yield s
    s.stop()


def test_the_torch_engine_translates_a_file_through_the_batcher(tiny):
    source = "two hundred five\n\nthree hundred\n"
    body, _ = tiny.translate("numbers.txt", source.encode())
    lines = body.decode().split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""  # an untrained model: its words do not matter


# ------------------------------------------------------------------------------------ hostile archives


def docx_with(document: bytes | None, extra: dict[str, bytes] | None = None) -> bytes:
    """A .docx made by python-docx with its word/document.xml replaced by ``document`` (None: kept), and
    ``extra`` entries."""
    docx = pytest.importorskip("docx")
    out = io.BytesIO()
    made = docx.Document()
    made.add_paragraph("A dog runs.")
    made.save(out)
    source = zipfile.ZipFile(io.BytesIO(out.getvalue()))
    result = io.BytesIO()
    with zipfile.ZipFile(result, "w", zipfile.ZIP_DEFLATED) as zf:
        for info in source.infolist():
            keep = document is None or info.filename != "word/document.xml"
            zf.writestr(info.filename, source.read(info) if keep else document)
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return result.getvalue()


@pytest.mark.skipif(NO_OFFICE, reason="mtkit.documents.office (.docx) is not on this branch yet")
def test_hostile_office_files_are_400s_and_the_server_goes_on(aligned):
    good = docx_with(None)
    bomb = docx_with(b"<w:document/>", {"word/bomb.xml": b" " * (4 << 20)})  # 4 MiB of spaces: ratio ~1000
    laughs = (b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]>'
              b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body><w:p>'
              b'<w:r><w:t>&lol2;</w:t></w:r></w:p></w:body></w:document>')
    xxe = (b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
           b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body><w:p>'
           b'<w:r><w:t>&x;</w:t></w:r></w:p></w:body></w:document>')
    s = Serving([ServedModel("en-de", AligningReverse(), "en", "de")], max_file_bytes=1 << 20)
    try:
        for name, data, said in (("bomb.docx", bomb, "zip bomb"), ("cut.docx", good[: len(good) // 2], "zip archive"),
                                 ("laughs.docx", docx_with(laughs), "DTD"), ("xxe.docx", docx_with(xxe), "DTD"),
                                 ("text.docx", b"just text", "zip archive")):
            status, answer = s.upload(name, data)
            assert status == 400 and answer["error"].startswith(f"Invalid request: {name}: "), (name, answer)
            assert said in answer["error"], answer
            assert "\n" not in answer["error"] and "Traceback" not in answer["error"]
        assert s.get("/health")[0] == 200
        body, _ = s.translate("ok.docx", good)
        assert zipfile.ZipFile(io.BytesIO(body)).namelist() == zipfile.ZipFile(io.BytesIO(good)).namelist()
    finally:
        s.stop()


# ------------------------------------------------------------------------------------ the trained model (slow)


@pytest.fixture(scope="module")
def real():
    if not (REAL_MODEL / "checkpoints").is_dir():
        pytest.skip(f"the trained model is not at {REAL_MODEL}")
    from mtkit.api import LoadOptions, load_models

    checkpoints = sorted((REAL_MODEL / "checkpoints").glob("*.pt"))
    model = load_models([REAL_MODEL], LoadOptions(device="cpu", threads=2, any_target=True))
    assert checkpoints
    s = Serving([ServedModel("multi30k", model.engine, "en", "de")], max_file_bytes=1 << 20)
    yield s
    s.stop()


ENGLISH = ["A dog runs in the park.", "Two men are playing soccer on a field.", "A woman is reading a book."]


@pytest.mark.slow
def test_the_trained_model_translates_a_text_file_into_german(real):
    body, headers = real.translate("captions.txt", ("\n".join(ENGLISH) + "\n").encode())
    lines = body.decode().split("\n")
    assert len(lines) == 4 and lines[-1] == ""
    words = " ".join(lines).lower()
    assert any(w in words for w in ("hund", "männer", "frau", "buch")), lines
    assert "dog" not in words and "woman" not in words
    assert headers["content-disposition"] == 'attachment; filename="captions_de.txt"'


@pytest.mark.slow
@pytest.mark.skipif(NO_SUBTITLES, reason="mtkit.documents.subtitles (.srt) is not on this branch yet")
def test_the_trained_model_translates_subtitles_and_keeps_their_timings(real):
    timings = ["00:00:01,000 --> 00:00:03,500", "00:00:04,000 --> 00:00:06,250", "00:00:07,125 --> 00:00:09,000"]
    srt = "".join(f"{i + 1}\n{t}\n{line}\n\n" for i, (t, line) in enumerate(zip(timings, ENGLISH)))
    body, _ = real.translate("clip.srt", srt.encode())
    blocks = body.decode().strip().split("\n\n")
    assert len(blocks) == 3
    for i, (block, timing) in enumerate(zip(blocks, timings)):
        number, when, *text = block.split("\n")
        assert (number, when) == (str(i + 1), timing)
        assert text and "dog" not in " ".join(text).lower()
    words = body.decode().lower()
    assert any(w in words for w in ("hund", "männer", "frau", "buch")), body.decode()


@pytest.mark.slow
@pytest.mark.skipif(NO_OFFICE, reason="mtkit.documents.office (.docx) is not on this branch yet")
def test_the_trained_model_translates_a_docx_and_its_bold_run_lands_on_its_words(real):
    docx = pytest.importorskip("docx")
    made = docx.Document()
    first = made.add_paragraph("A ")
    first.add_run("dog").bold = True
    first.add_run(" runs in the park.")
    made.add_paragraph(ENGLISH[2])
    out = io.BytesIO()
    made.save(out)
    body, headers = real.translate("story.docx", out.getvalue())
    assert headers["content-type"] == "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
    paragraphs = docx.Document(io.BytesIO(body)).paragraphs
    assert len(paragraphs) == 2
    bold = [r.text for r in paragraphs[0].runs if r.bold]
    assert len(bold) == 1 and "hund" in bold[0].lower(), [(r.text, r.bold) for r in paragraphs[0].runs]
    text = " ".join(p.text for p in paragraphs).lower()
    assert "dog" not in text and "woman" not in text and "frau" in text, text


@pytest.mark.slow
def test_mtkit_serve_takes_max_file_bytes(tmp_path):
    """The command end to end (a subprocess on a tiny checkpoint): --max-file-bytes bounds the upload, 0 turns
    file translation off, a negative value is one error line before anything loads."""
    import subprocess

    from test_serve import ENV, MTKIT, Server

    checkpoint = write_tiny_checkpoint(tmp_path / "model.pt", decode={"beam": 1, "max_len_b": 4})
    server = Server(tmp_path, "-m", checkpoint, "--src-lang", "en", "--tgt-lang", "de", "--max-file-bytes", 1000)
    try:
        body, content_type = multipart({"source": "en", "target": "de"}, [("file", "a.txt", b"two hundred\n")])
        status, _, answer = server.request("POST", "/translate_file", body, content_type)
        assert status == 200, answer
        status, _, download = server.get(urllib.parse.urlsplit(json.loads(answer)["translatedFileUrl"]).path)
        assert status == 200 and download.endswith(b"\n") and download.count(b"\n") == 1
        body, content_type = multipart({"source": "en", "target": "de"}, [("file", "a.txt", b"two\n" * 300)])
        status, _, answer = server.request("POST", "/translate_file", body, content_type)
        assert status == 413 and "--max-file-bytes" in json.loads(answer)["error"]
    finally:
        assert server.stop() == 0, server.log.read_text()
    done = subprocess.run([*MTKIT, "serve", "-m", str(checkpoint), "--max-file-bytes", "-1"], capture_output=True,
                          text=True, env=ENV, timeout=300, check=False)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "--max-file-bytes" in done.stderr, done.stderr


def test_source_auto_detects_the_documents_language(aligned):
    """``source=auto`` (what LibreTranslate's page sends by default): the language of the document's first
    characters picks the model, as for text; a document already in the target language comes back as it is."""
    pytest.importorskip("lingua")
    english = b"A man is riding a bicycle down the street.\nTwo children play in the garden.\n"
    assert aligned.translate("en.txt", english, source="auto")[0] == reversed_lines(english.decode()).encode()
    german = "Ein Mann fährt mit dem Fahrrad die Straße hinunter.\nZwei Kinder spielen im Garten.\n".encode()
    assert aligned.translate("de.txt", german, source="auto")[0] == german
    assert aligned.translate("empty.txt", b"", source="auto")[0] == b""  # no text: nothing to detect, no error
    status, answer = aligned.upload("fr.txt", "Un homme fait du vélo dans la rue avec son chien.\n".encode(),
                                    {"source": "auto"})
    assert status == 400 and answer["error"].startswith("the file fr.txt is French (fr) (detected, confidence ")
    assert answer["error"].endswith("from English (en) only: give source")
