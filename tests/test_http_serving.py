"""Moto served with keep-alive connections (emulator/http_serving.py): several requests on one connection, each
answered whole, also after a request whose body moto never reads; a client that asks to close gets a closed
connection."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from emulator import http_serving

BUCKET = "keep-alive-bucket"
# Moto reads the access key from the credential scope and checks no signature.
HEADERS = {
    "Host": "s3.amazonaws.com",
    "Authorization": "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, "
    "SignedHeaders=host, Signature=0",
}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with http_serving.moto_in_thread() as url:
        yield url


def connect(url: str) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)


def request(conn: http.client.HTTPConnection, method: str, path: str, body: bytes = b"") -> tuple[int, bytes, str]:
    """One request on ``conn``; the status, body and Connection header of its response."""
    conn.request(method, path, body=body or None, headers=HEADERS)
    response = conn.getresponse()
    return response.status, response.read(), response.getheader("Connection", "")


def test_requests_share_one_connection_and_each_gets_its_own_answer(endpoint: str) -> None:
    conn = connect(endpoint)
    try:
        assert request(conn, "PUT", f"/{BUCKET}")[0] == 200
        sock = conn.sock
        assert sock is not None, "the connection was closed after the first response"
        objects = {f"k{i}": bytes([i]) * (1000 + i) for i in range(3)}
        for key, data in objects.items():
            status, _, connection = request(conn, "PUT", f"/{BUCKET}/{key}", data)
            assert (status, connection.lower()) == (200, "")
        for key, data in objects.items():
            assert request(conn, "GET", f"/{BUCKET}/{key}")[:2] == (200, data)
        assert conn.sock is sock, "a response closed the connection, so the client opened another"
    finally:
        conn.close()


def test_a_body_moto_does_not_read_does_not_become_the_next_request(endpoint: str) -> None:
    conn = connect(endpoint)
    try:
        # moto's own API answers this GET from its path and leaves the body unread; read as requests, the body is
        # three more requests, and their answers would come before the next request's.
        smuggled = f"GET /{BUCKET}-smuggled HTTP/1.1\r\nHost: s3.amazonaws.com\r\n\r\n".encode() * 3
        conn.request("GET", "/moto-api/data.json", body=smuggled, headers={"Host": "localhost"})
        response = conn.getresponse()
        assert (response.status, response.read()[:1]) == (200, b"{")
        assert request(conn, "PUT", f"/{BUCKET}-second")[0] == 200
        status, body, _ = request(conn, "GET", f"/{BUCKET}-second?list-type=2")
        assert status == 200 and f"<Name>{BUCKET}-second</Name>".encode() in body
    finally:
        conn.close()


def test_a_client_that_asks_to_close_gets_a_closed_connection(endpoint: str) -> None:
    conn = connect(endpoint)
    try:
        conn.request("GET", "/", headers={**HEADERS, "Connection": "close"})
        response = conn.getresponse()
        response.read()
        assert response.status == 200
        assert response.getheader("Connection", "").lower() == "close"
    finally:
        conn.close()
