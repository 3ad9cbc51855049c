"""``mtkit serve`` against hostile clients: text no encoder can write, JSON nested without end, numbers
no float holds, LibreTranslate's query-string parameters, browsers of another origin, slow clients, the
graceful stop running out. The real server in a subprocess (:class:`test_serve.Server`) on the reverse
task's model; every case on loopback, on a port the OS picks, bounded in count and time."""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from test_serve import LIMITS, Server, mtkit_translate, sentences  # after the skips: it needs the serve extra

pytestmark = pytest.mark.slow  # real processes and training: the fast tier is pytest -m 'not slow'

OK = {"q": "alpha bravo", "source": "en", "target": "de"}


@pytest.fixture(scope="module")
def server(reverse_run, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("serve-hostile"), "-m", reverse_run, *LIMITS, "--max-body-bytes", 300_000,
               "--max-wait-ms", 20)  # room for JSON nested 100,000 deep
    yield s
    assert s.stop() == 0, s.log.read_text()


@pytest.fixture(scope="module")
def expected(reverse_run) -> dict[str, str]:
    lines = sentences(12, seed=5)
    return dict(zip(lines, mtkit_translate("-m", reverse_run, lines=lines)))


def raw(server, body: bytes, path: str = "/translate", content_type: str = "application/json"):
    status, headers, answer = server.request("POST", path, body, content_type)
    return status, json.loads(answer)


def test_lone_surrogates_are_a_400_naming_the_field_and_stop_no_decoding_thread(server, expected):
    """Valid JSON, invalid text: ``\\ud800`` cannot be encoded. Each such request is a 400 naming the
    field, mixed into traffic (so that some would join batches) and more of them than there are decoding
    threads; every other request gets its translation, and the server stays healthy."""
    bad = [
        (b'{"q": "\\ud800 five", "source": "en", "target": "de"}', "/translate", "q"),
        (b'{"q": ["alpha", "bravo \\udfff"], "source": "en", "target": "de"}', "/translate", "q[1]"),
        (b'{"text": "\\udfff"}', "/v1/translate", "text"),
        (b'{"text": "alpha", "glossary": {"alpha\\ud800": "x"}}', "/v1/translate", "glossary"),
        (b'{"text": "alpha", "constraints": {"include": ["\\ud83d"]}}', "/v1/translate", "constraints.include[0]"),
    ]
    lines = list(expected)
    with ThreadPoolExecutor(16) as pool:
        bad_answers = [pool.submit(raw, server, body, path) for body, path, _ in bad * 4]
        good_answers = [pool.submit(server.post_json, "/translate", {**OK, "q": line}) for line in lines]
        for (_, _, field), future in zip(bad * 4, bad_answers):
            status, answer = future.result()
            assert status == 400 and "not valid Unicode" in answer["error"] and field in answer["error"], answer
        assert [f.result() for f in good_answers] == [(200, {"translatedText": expected[x]}) for x in lines]
    assert server.get("/health")[0] == 200


def test_nesting_huge_and_non_finite_numbers_and_odd_digits_are_400s(server):
    deep = lambda n: "[" * n + '"alpha"' + "]" * n  # noqa: E731
    cases = {
        "q nested 100,000 deep": raw(server, (f'{{"q": {deep(100_000)}, "source": "en", "target": "de"}}').encode()),
        "text nested 100,000 deep": raw(server, (f'{{"text": {deep(100_000)}}}').encode(), "/v1/translate"),
        "glossary nested 100,000 deep": raw(server, (f'{{"text": "alpha", "glossary": {deep(100_000)}}}').encode(),
                                            "/v1/translate"),
        "q nested 40 deep": raw(server, (f'{{"q": {deep(40)}, "source": "en", "target": "de"}}').encode()),
        "alpha 1e308": server.post_json("/v1/translate", {"text": "alpha bravo", "alpha": 1e308}),
        "alpha 1e400 (inf)": raw(server, b'{"text": "alpha bravo", "alpha": 1e400}', "/v1/translate"),
        "alpha NaN": raw(server, b'{"text": "alpha bravo", "alpha": NaN}', "/v1/translate"),
        "alpha -Infinity": raw(server, b'{"text": "alpha bravo", "alpha": -Infinity}', "/v1/translate"),
        "beam 10**40": server.post_json("/v1/translate", {"text": "alpha", "beam": 10**40}),
        "alternatives 10**5000 digits": raw(server, b'{"q": "alpha", "source": "en", "target": "de", '
                                                    b'"alternatives": 1' + b"0" * 5000 + b"}"),
        "form alternatives=\u00b2": server.post_form("/translate", {**OK, "alternatives": "\u00b2"}),
        "form alternatives=\u0663 (Arabic-Indic three)": server.post_form("/translate",
                                                                          {**OK, "alternatives": "\u0663"}),
        "query alternatives=1e400": raw(server, b"",
                                        "/translate?" + urllib.parse.urlencode({**OK, "alternatives": "1e400"}), ""),
    }
    for name, (status, answer) in cases.items():
        assert status == 400 and isinstance(answer.get("error"), str), (name, status, answer)
    assert server.get("/health")[0] == 200


def test_libretranslate_query_string_parameters_with_an_empty_body(server, expected):
    line = list(expected)[0]
    query = urllib.parse.urlencode({**OK, "q": line, "format": "text"})
    for content_type in ("", "application/x-www-form-urlencoded", "application/json"):
        assert raw(server, b"", f"/translate?{query}", content_type) == (200, {"translatedText": expected[line]})
    # A JSON body's fields win over the query string's; the query string counts against the same limits.
    body = json.dumps({**OK, "q": line}).encode()
    assert raw(server, body, "/translate?q=ignored") == (200, {"translatedText": expected[line]})
    assert raw(server, b"", "/translate?" + urllib.parse.urlencode({**OK, "q": ["alpha"] * 71}, doseq=True),
               "")[0] == 400  # a repeated q is a list: 71 sentences are over --max-sentences 70
    status, answer = raw(server, b"", "/translate?" + urllib.parse.urlencode({**OK, "q": "alpha " * 1000}), "")
    assert (status, answer) == (400, {"error": "Invalid request: request (6000) exceeds text limit (5000)"})
    # A URL longer than the HTTP parser takes is refused by uvicorn itself (400, plain text).
    status, _, _ = server.request("POST", "/translate?" + urllib.parse.urlencode({**OK, "q": "alpha " * 55_000}))
    assert 400 <= status < 500
    status, answer = raw(server, b"", "/detect?q=the+house+is+blue", "")
    assert status == 200 and answer[0]["language"] == "en"


def test_cors_as_libretranslate_answers_it(server):
    origin = {"Origin": "https://app.example"}
    status, headers, body = server.request("OPTIONS", "/translate", headers={
        **origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "*", (status, dict(headers), body)
    assert "POST" in headers["Access-Control-Allow-Methods"]
    assert headers["Access-Control-Allow-Headers"].lower() == "content-type"
    status, headers, _ = server.request("POST", "/translate", json.dumps(OK).encode(), "application/json", origin)
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"
    status, headers, _ = server.request("GET", "/languages", headers=origin)
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"
    status, headers, _ = server.request("POST", "/v1/translate", b'{"text": "alpha"}', "application/json", origin)
    assert status == 200 and "Access-Control-Allow-Origin" not in headers  # mtkit's own API: not LibreTranslate's


def test_v1_models_names_the_model_and_its_step_never_a_path(server, reverse_run):
    status, _, body = server.get("/v1/models")
    assert status == 200
    models = json.loads(body)["models"]
    assert [m["name"] for m in models] == ["run"] and models[0]["step"] == 150
    assert str(reverse_run) not in body.decode() and "/" not in json.dumps([m.get("loaded") for m in models])


# ------------------------------------------------------------------------------------------ connections


def _slow(port: int, lines: list[bytes], pause: float, stop: float) -> str:
    """Send ``lines`` one by one, ``pause`` seconds apart, then wait; what the server did: 'closed'
    (with whatever it answered first) or 'open' when ``stop`` (monotonic) came with the socket open."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=2)
    got = b""
    try:
        for line in lines:
            sock.sendall(line)
            time.sleep(pause)
        while time.monotonic() < stop:
            sock.settimeout(max(0.05, min(0.5, stop - time.monotonic())))
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            if not chunk:
                return "closed " + got.decode(errors="replace")
            got += chunk
        return "open"
    except (BrokenPipeError, ConnectionResetError):
        return "closed " + got.decode(errors="replace")
    finally:
        sock.close()


def test_slow_clients_are_closed_and_other_clients_served(reverse_run, tmp_path, expected):
    """Clients that send a header line a second, or headers and then not the body they announced, are
    closed after --header-timeout / --body-timeout (the body's with a JSON 408); a well-behaved client is
    served all the while."""
    s = Server(tmp_path, "-m", reverse_run, "--header-timeout", 1.5, "--body-timeout", 1.5)
    try:
        # How long the server may take to close them is bounded only by this hang guard: each client
        # returns as soon as it is closed, so a busy machine takes longer, never fails the test.
        stop = time.monotonic() + 120
        dribble = [b"POST /translate HTTP/1.1\r\n"] + [b"X-Slow: %d\r\n" % i for i in range(60)]
        silent_body = [b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: 1000\r\n\r\n{\"q\": "]
        with ThreadPoolExecutor(32) as pool:
            slow = [pool.submit(_slow, s.port, dribble, 0.5, stop) for _ in range(12)]
            silent = [pool.submit(_slow, s.port, silent_body, 0.0, stop) for _ in range(12)]
            time.sleep(0.5)  # they are connected and sending
            line = list(expected)[1]
            for _ in range(3):
                assert s.post_json("/translate", {**OK, "q": line}) == (200, {"translatedText": expected[line]})
            slow_ends, silent_ends = [f.result() for f in slow], [f.result() for f in silent]
        assert all(end.startswith("closed") for end in slow_ends), slow_ends
        assert all(end.startswith("closed") and " 408 " in end and "--body-timeout" in end for end in silent_ends), \
            silent_ends
        for _ in range(3):  # and afterwards
            assert s.post_json("/translate", {**OK, "q": line}) == (200, {"translatedText": expected[line]})
        assert s.get("/health")[0] == 200
    finally:
        assert s.stop() == 0, s.log.read_text()


def test_connections_beyond_the_limit_get_a_503_at_once(reverse_run, tmp_path, expected):
    """Beyond --max-connections, a connection gets a JSON 503 and is closed at once; once the idle ones
    go, requests are served again. The idle connections are held open past any timeout here (a long
    --header-timeout), so the outcome does not depend on how fast the machine is."""
    s = Server(tmp_path, "-m", reverse_run, "--header-timeout", 600, "--max-connections", 8)
    idle = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(8)]
    try:
        # The listening socket's queue is first in, first out: the 8 idle connections are taken
        # before any of these, which all find the server full.
        with ThreadPoolExecutor(6) as pool:
            refused = list(pool.map(lambda _: _slow(s.port, [], 0.0, time.monotonic() + 120), range(6)))
        assert all(end.startswith("closed") and " 503 " in end and "--max-connections" in end for end in refused), \
            refused
    finally:
        for sock in idle:
            sock.close()
    try:
        line = list(expected)[1]
        deadline = time.monotonic() + 120  # the server notices the closed sockets when it reads them
        body = json.dumps({**OK, "q": line}).encode()
        while (answer := s.request("POST", "/translate", body, "application/json", answer_optional=True))[0] in (
                503, None) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (answer[0], json.loads(answer[2])) == (200, {"translatedText": expected[line]})
    finally:
        assert s.stop() == 0, s.log.read_text()


def test_access_log_and_a_graceful_stop_that_runs_out(reverse_run, tmp_path):
    """--access-log writes method, path, status and time per request (never the query string, which may
    hold an API key); a request still decoding when --graceful-timeout runs out gets a JSON 503, the log
    no traceback, and the server exits 0."""
    s = Server(tmp_path, "-m", reverse_run, "--access-log", "--max-wait-ms", 20_000, "--graceful-timeout", 0.5)
    try:
        assert s.request("GET", "/languages?api_key=secret-key")[0] == 200  # answered without decoding
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(s.post_json, "/translate", OK)  # waits 20 s for others to join it
            deadline = time.monotonic() + 60
            while s.metric("mtkit_serve_requests_in_flight") < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            s.proc.send_signal(signal.SIGTERM)
            answer = waiting.result()
        assert s.proc.wait(timeout=120) == 0
    finally:
        s.stop()
    log = s.log.read_text()
    assert answer[0] == 503 and "stopping" in answer[1]["error"], answer
    assert "Traceback" not in log and "CancelledError" not in log, log
    assert "secret-key" not in log
    access = [line for line in log.splitlines() if line.startswith(("GET ", "POST "))]
    assert any(line.startswith("GET /languages 200 ") and line.endswith(" ms") for line in access), access
    assert any(line.startswith("GET /health 200 ") for line in access), access
    assert any(line.startswith("POST /translate 503 ") for line in access), access
