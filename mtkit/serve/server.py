"""Running the app: a guard in front of it (body size, request metrics), and uvicorn with a graceful stop.

On SIGTERM or SIGINT the server stops accepting connections, lets the requests in flight
finish (at most ``graceful_timeout`` seconds), stops the decoding threads and returns, so
``mtkit serve`` exits 0. uvicorn itself re-raises the signal once it has stopped, which would
make the exit status 143 / 130: :class:`_Server` does not. A second Ctrl-C stops at once.
"""

from __future__ import annotations

import json
import socket
import sys

from mtkit.errors import MtkitError

# Endpoints named in the request metrics (anything else is "other", so that a scan cannot grow them).
ENDPOINTS = ("/translate", "/languages", "/detect", "/v1/translate", "/health", "/metrics", "/", "/docs",
             "/redoc", "/openapi.json")


class _TooLarge(Exception):
    pass


class Guard:
    """ASGI middleware: refuse a body over ``max_body_bytes`` with 413 (by its Content-Length, or while
    reading it), and count each request and its latency in ``metrics``."""

    def __init__(self, app, max_body_bytes: int, metrics) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        import time

        start = time.perf_counter()
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"
        status = [500]

        async def send_status(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        self.metrics.in_flight.inc()
        try:
            body = await self._read_body(scope, receive)
            if body is None:
                await self._too_large(send_status)
                return
            done = False

            async def replay():
                nonlocal done
                if not done:
                    done = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send_status)
        finally:
            self.metrics.in_flight.dec()
            self.metrics.requests.labels(endpoint, str(status[0])).inc()
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - start)

    async def _read_body(self, scope, receive) -> bytes | None:
        """The whole body (None when it is over the limit)."""
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                if int(declared) > self.max_body_bytes:
                    return None
            except ValueError:
                pass
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return bytes(body)
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                return None
            if not message.get("more_body", False):
                return bytes(body)

    async def _too_large(self, send) -> None:
        payload = json.dumps({"error": f"the request body is too large (the limit is {self.max_body_bytes} "
                                       "bytes, --max-body-bytes)"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})


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
        access_log: bool = False) -> None:
    """Serve ``app`` until SIGTERM or SIGINT, then stop gracefully and return."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:  # as uvicorn's, without re-raising the signal afterwards
            if self.should_exit:
                self.force_exit = True
            self.should_exit = True

    sock = bind(host, port)
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    config = uvicorn.Config(app, log_level="warning", access_log=access_log, lifespan="on",
                            timeout_graceful_shutdown=graceful_timeout)
    server = _Server(config)
    print(f"serving on http://{shown}:{bound[1]}/ (API docs: /docs; stop with Ctrl-C or SIGTERM)",
          file=sys.stderr, flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if not server.started:
        raise MtkitError("the server did not start (see the messages above)")
    print("stopped", file=sys.stderr, flush=True)
