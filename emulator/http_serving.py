"""Moto's WSGI app served by werkzeug with HTTP/1.1 keep-alive: the emulator's endpoint and the tests' moto server.

Werkzeug's development server ends every response with ``Connection: close``, so each AWS call from a node, a test or
``trainctl`` pays a new TCP connection and TLS handshake on both ends. Profiled on the interruption matrix, those
handshakes were about a sixth of the server's CPU time and about two fifths of the test process's. Werkzeug closes
because, after a response, it drains whatever the client sent that the application did not read, and on a
kept-alive connection that would swallow the client's next request. Here the request body is read whole before
moto sees the request (moto reads bodies whole anyway), so nothing is left to drain: the handler keeps the
connection open, and the drain is switched off.

Werkzeug's internals this relies on (``requirements-dev.txt`` pins werkzeug): ``WSGIRequestHandler.run_wsgi``
sends ``Connection: close`` through ``send_header`` and drains through ``selectors.DefaultSelector``.
"""

from __future__ import annotations

import io
import selectors
import threading
import types
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import werkzeug.serving
from moto import backends
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import BaseWSGIServer, DechunkedInput

from emulator.request_counts import RequestCounts, WsgiApp, counting


class KeepAliveRequestHandler(MotoRequestHandler):
    """Moto's request handler without the ``Connection: close`` werkzeug adds to every response.

    A client that asks to close (``Connection: close``, or HTTP/1.0 without keep-alive) still gets a closed
    connection: ``http.server`` has set ``close_connection`` from the request before the response starts.
    """

    def send_header(self, keyword: str, value: str) -> None:
        if keyword.lower() == "connection" and value.lower() == "close" and not self.close_connection:
            return
        super().send_header(keyword, value)


class _NothingToDrain:
    """Stands in for the selector werkzeug drains unread request data with: the body is read whole already."""

    def register(self, *args: Any) -> None:
        pass

    def select(self, timeout: float | None = None) -> list[Any]:
        return []

    def close(self) -> None:
        pass


def read_bodies_whole(app: WsgiApp) -> WsgiApp:
    """WSGI wrapper: read the request body (by ``Content-Length``, or to the end of a chunked body) before ``app``
    runs, so that the connection holds nothing of this request once the response is sent."""

    def wrapped(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        stream = environ["wsgi.input"]
        if isinstance(stream, DechunkedInput):
            body = stream.read()
        else:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = stream.read(length) if length > 0 else b""
        environ["wsgi.input"] = io.BytesIO(body)
        return app(environ, start_response)

    return wrapped


def moto_app(counts: RequestCounts | None = None) -> WsgiApp:
    """Moto's dispatcher (every service on one endpoint), with request bodies read whole (:func:`read_bodies_whole`)
    and, given ``counts``, every request counted (``emulator/request_counts.py``).

    Moto's dispatcher lists its own package directory (a listdir and about 150 stat calls) on every request to
    find the service a host name belongs to; the list does not change while a server runs, so it is listed once.
    """
    modules = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: modules
    dispatcher: WsgiApp = DomainDispatcherApplication(create_backend_app)
    return read_bodies_whole(dispatcher if counts is None else counting(dispatcher, counts))


def make_server(host: str, port: int, app: WsgiApp, ssl_context: Any = None) -> BaseWSGIServer:
    """A threaded werkzeug server (a thread per connection) whose connections stay open between requests.

    Switches off werkzeug's after-response drain process-wide: only a process that serves moto calls this, and
    every app it serves must be wrapped by :func:`read_bodies_whole` (``moto_app`` is).
    """
    werkzeug.serving.selectors = types.SimpleNamespace(  # type: ignore[assignment]
        DefaultSelector=_NothingToDrain, EVENT_READ=selectors.EVENT_READ
    )
    return werkzeug.serving.make_server(
        host, port, app, threaded=True, request_handler=KeepAliveRequestHandler, ssl_context=ssl_context
    )


@contextmanager
def moto_in_thread(host: str = "127.0.0.1", counts: RequestCounts | None = None) -> Iterator[str]:
    """Moto (:func:`moto_app`) served from a thread of this process on a free port of ``host``; yields the endpoint
    URL (plain HTTP). The tests' and benchmarks' in-process AWS; the emulator's endpoint is a process of its own."""
    server = make_server(host, 0, moto_app(counts))
    serving = threading.Thread(target=server.serve_forever, daemon=True, name=f"moto-{server.server_port}")
    serving.start()
    try:
        yield f"http://{host}:{server.server_port}"
    finally:
        server.shutdown()
        serving.join()
        server.server_close()
