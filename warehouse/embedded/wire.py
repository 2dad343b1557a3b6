"""How the endpoint and its engine process talk: over a Unix socket pair, one per engine
connection, a frame is a small JSON head and an optional binary payload (a result, a chunk of
INSERT data). The head is bounded, so neither side can be made to buffer a runaway one."""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

_PREFIX = struct.Struct("<IQ")  # head length, payload length
MAX_HEAD = 8 << 20  # a query text and its parameters, with room to spare
CHUNK = 1 << 20


class Closed(EOFError):
    """The other side went away."""


def send(sock: socket.socket, head: dict[str, Any], payload: bytes | memoryview = b"") -> None:
    body = json.dumps(head, separators=(",", ":")).encode()
    sock.sendall(_PREFIX.pack(len(body), len(payload)) + body)
    if len(payload):
        sock.sendall(payload)


def receive(sock: socket.socket) -> tuple[dict[str, Any], bytearray]:
    """One frame: its head and its payload (empty if none)."""
    head_size, payload_size = _PREFIX.unpack(_exactly(sock, _PREFIX.size))
    if head_size > MAX_HEAD:
        raise ValueError(f"a frame's head of {head_size} bytes is over {MAX_HEAD}")
    head = json.loads(_exactly(sock, head_size))
    return head, _exactly(sock, payload_size)


def _exactly(sock: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], min(size - got, CHUNK))
        if n == 0:
            raise Closed("the connection to the engine process ended")
        got += n
    return buffer
