"""Running the app: middleware in front of it (body size and time, CORS, request metrics, the access log),
uvicorn's protocol with header timeouts and a bound on connections, and a graceful stop.

On SIGTERM or SIGINT the server stops accepting connections, lets the requests in flight
finish (at most ``graceful_timeout`` seconds), stops the decoding threads and returns, so
``mtkit serve`` exits 0. uvicorn itself re-raises the signal once it has stopped, which would
make the exit status 143 / 130: :class:`_Server` does not. A second Ctrl-C stops at once.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import socket
import time
from collections.abc import Callable

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from mtkit.errors import MtkitError

logger = logging.getLogger(__name__)

# Endpoints named in the request metrics (anything else is "other", so that a scan cannot grow them).
ENDPOINTS = ("/translate", "/languages", "/detect", "/health", "/frontend/settings", "/spec", "/js/app.js",
             "/suggest", "/translate_file", "/download_file", "/v1/translate", "/v1/models", "/v1/health", "/metrics",
             "/", "/docs", "/redoc", "/openapi.json")


# Room in an upload's body for what is not the file: the other form fields and the parts' headers.
UPLOAD_ROOM = 64 << 10
UPLOAD_PATH = "/translate_file"


class Guard:
    """ASGI middleware in front of the app: it refuses a body (with the query string) over
    ``max_body_bytes`` with 413 (by its Content-Length, or while reading it, before more is kept) and one
    that has not arrived within ``body_timeout`` seconds with 408; answers a request still running when the
    graceful stop runs out with a JSON 503; counts each request and its latency in ``metrics``; and,
    with ``access_log``, writes one line per request on stderr (method, path without the query string,
    which may hold an API key, status, milliseconds). An upload (``POST /translate_file``) may have
    ``max_file_bytes`` and :data:`UPLOAD_ROOM` for its other fields instead (0: files are off, the usual
    limit)."""

    def __init__(self, app, max_body_bytes: int, metrics, body_timeout: float = 30.0,
                 access_log: bool = False, max_file_bytes: int = 0) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.body_timeout = body_timeout
        self.access_log = access_log
        self.max_file_bytes = max_file_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "/download_file" if path.startswith("/download_file/") else "other"
        upload = self.max_file_bytes > 0 and path == UPLOAD_PATH
        limit = self.max_file_bytes + UPLOAD_ROOM if upload else self.max_body_bytes
        status = [0]

        async def send_status(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        self.metrics.in_flight.inc()
        try:
            try:
                body = await asyncio.wait_for(self._read_body(scope, receive, limit), self.body_timeout)
            except asyncio.TimeoutError:
                await _answer(send_status, 408, f"the request body did not arrive within {self.body_timeout:g} s "
                                                "(--body-timeout)")
                return
            if body is None:
                await _answer(send_status, 413, f"the file is too large (the limit is {self.max_file_bytes} bytes, "
                                                "--max-file-bytes)" if upload else
                                                f"the request body is too large (the limit is {self.max_body_bytes} "
                                                "bytes, --max-body-bytes)")
                return
            done = False
            gone = asyncio.Event()

            async def replay():
                nonlocal done
                if not done:
                    done = True
                    return {"type": "http.request", "body": body, "more_body": False}
                await gone.wait()
                return {"type": "http.disconnect"}

            if await _unless_gone(self.app(scope, replay, send_status), receive, gone):
                status[0] = status[0] or CLIENT_GONE
        except asyncio.CancelledError:  # the graceful stop ran out while this request was decoding
            if not status[0]:
                try:
                    await _answer(send_status, 503, "the server is stopping; retry later")
                except Exception:  # noqa: BLE001 - the connection is gone: nothing to answer
                    pass
        finally:
            self.metrics.in_flight.dec()
            seconds = time.perf_counter() - start
            self.metrics.requests.labels(endpoint, str(status[0] or 500)).inc()
            self.metrics.latency.labels(endpoint).observe(seconds)
            if self.access_log:
                shown = path if path.isprintable() and len(path) <= 200 else repr(path[:200])
                logger.info(f"{scope.get('method', '?')} {shown} {status[0] or '-'} {seconds * 1000:.1f} ms")

    async def _read_body(self, scope, receive, limit: int) -> bytes | None:
        """The whole body (None when it and the query string are over ``limit``)."""
        limit -= len(scope.get("query_string") or b"")
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if limit < 0:
            return None
        if declared is not None:
            try:
                if int(declared) > limit:
                    return None
            except ValueError:
                pass
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return bytes(body)
            body += message.get("body", b"")
            if len(body) > limit:
                return None
            if not message.get("more_body", False):
                return bytes(body)


# The status counted (and logged) for a request whose client went away before its answer (nginx's 499).
CLIENT_GONE = 499


async def _unless_gone(call, receive, gone) -> bool:
    """Run the app's ``call`` while watching ``receive`` for the client's disconnect: a client that goes
    away first has ``call`` cancelled (a translation it waits for is dropped: :meth:`Service.translate`)
    and ``gone`` set; True then."""
    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    task, watcher = asyncio.ensure_future(call), asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this request itself is cancelled (the graceful stop ran out)
        task.cancel()
        watcher.cancel()
        raise
    if task.done():
        watcher.cancel()
        task.result()  # the app's own error, if any
        return False
    gone.set()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if not task.cancelled():  # this request itself was cancelled meanwhile
            raise
    except Exception:  # noqa: BLE001 - nobody reads the answer
        pass
    return True


async def _answer(send, status: int, message: str) -> None:
    """A JSON error ``{"error": message}`` that closes the connection."""
    payload = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": payload})


# LibreTranslate's endpoints answer browsers of any origin (its blueprint's after_request adds the headers).
CORS_PATHS = frozenset({"/translate", "/languages", "/detect", "/health", "/frontend/settings", "/suggest",
                        "/translate_file"})


class Cors:
    """ASGI middleware: CORS for :data:`CORS_PATHS` and the downloads as LibreTranslate answers it (``mtkit serve
    --cors``): any origin; a preflight ``OPTIONS`` gets 200 with the methods and the headers it asked for."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or (path not in CORS_PATHS and not path.startswith("/download_file/")):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if b"origin" not in headers:
            await self.app(scope, receive, send)
            return
        allow = [(b"access-control-allow-origin", b"*"), (b"vary", b"Origin")]
        if scope.get("method") == "OPTIONS" and b"access-control-request-method" in headers:
            asked = headers.get(b"access-control-request-headers")
            preflight = allow + [(b"access-control-allow-methods", b"GET, HEAD, OPTIONS, POST"),
                                 (b"access-control-max-age", b"600"), (b"content-length", b"0")]
            if asked:
                preflight.append((b"access-control-allow-headers", asked[:1000]))
            await send({"type": "http.response.start", "status": 200, "headers": preflight})
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_with_cors(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *allow]}
            await send(message)

        await self.app(scope, receive, send_with_cors)


_BUSY_BODY = json.dumps({"error": "the server has too many connections open (--max-connections); retry later"}).encode()
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
         b"connection: close\r\ncontent-length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY)


class GuardedProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP protocol (httptools, else h11) that closes a connection whose request headers have
    not all arrived ``header_timeout`` seconds after it opened or after its last response (a slow client
    sending a header line a second), and refuses connections beyond ``max_connections`` at once, so that
    slow clients cannot hold every file descriptor (uvicorn builds one per connection: give it
    :func:`guarded_protocol`)."""

    _timer = None

    def __init__(self, *args, header_timeout: float, max_connections: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self.max_connections = max_connections

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.write(_BUSY)
            transport.close()
            return
        self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(self.header_timeout, self._expired, self.cycle)

    def _expired(self, cycle) -> None:
        # No request's headers completed since the timer was armed: uvicorn starts a new cycle for each.
        if self.cycle is cycle and not self.transport.is_closing():
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        super().connection_lost(exc)


def guarded_protocol(header_timeout: float, max_connections: int) -> Callable[..., GuardedProtocol]:
    """What uvicorn calls to build each connection's :class:`GuardedProtocol` (its ``http`` setting)."""
    return functools.partial(GuardedProtocol, header_timeout=header_timeout, max_connections=max_connections)


class _Server(uvicorn.Server):
    """uvicorn's server that says where it serves once it does, and returns on SIGTERM or SIGINT."""

    def __init__(self, config: uvicorn.Config, address: str) -> None:
        super().__init__(config)
        self.address = address

    def handle_exit(self, sig, frame) -> None:  # as uvicorn's, without re-raising the signal afterwards
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit:  # the app started and the socket accepts: it serves
            logger.info(f"serving on http://{self.address}/ (API docs: /docs; stop with Ctrl-C or SIGTERM)")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: one the OS picks)."""
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise MtkitError(f"--host {host}: {e.strerror}") from None
    family, kind, proto, _, address = info[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise MtkitError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run(app, host: str = "127.0.0.1", port: int = 5000, graceful_timeout: float = 30.0,
        header_timeout: float = 10.0, keep_alive_timeout: float = 5.0, max_connections: int = 256) -> None:
    """Serve ``app`` until SIGTERM or SIGINT, then stop gracefully and return.

    A connection whose request headers take over ``header_timeout`` seconds is closed, an idle kept-alive
    one after ``keep_alive_timeout``, and connections beyond ``max_connections`` are refused at once;
    uvicorn answers what it rejects at the HTTP level itself (a malformed request line: 400, as text)."""
    sock = bind(host, port)
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=graceful_timeout, timeout_keep_alive=keep_alive_timeout,
                            http=guarded_protocol(header_timeout, max_connections))
    server = _Server(config, f"{shown}:{bound[1]}")
    try:
        server.run(sockets=[sock])
    except SystemExit:  # uvicorn's exit when the app's startup fails (it has logged why)
        pass
    finally:
        sock.close()
    if not server.started:
        raise MtkitError("the server did not start (see the messages above)")
    logger.info("stopped")
