"""Websocket clients on the ASGI app for tests: one way to open a socket, and one to see a refusal end cleanly."""

from __future__ import annotations

import asyncio

from channels.testing import WebsocketCommunicator

from webapp.asgi import application


def open_socket(path: str, key: str | None) -> WebsocketCommunicator:
    """A communicator for `path`, sent from an allowed origin, with `key` as its API token (None: anonymous)."""
    headers = [(b"origin", b"http://localhost"), (b"host", b"localhost")]
    if key:
        headers.append((b"authorization", f"Token {key}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


async def refusal_code(path: str, key: str | None) -> int | None:
    """The close code the server refuses the socket with (None if it accepts it).

    The socket is disconnected either way, so its consumer stops inside the test. Left alone, it would only be
    cancelled when pytest-asyncio closes the test's event loop, which waits for it without a limit; a consumer whose
    cancel Python 3.11 lost in redis-py (see webapp/channel_layer.py) once hung CI there for good. The wait allows
    for that layer's bound on a lost cancel (one blocking pop, 5 s)."""
    comm = open_socket(path, key)
    accepted, code = await comm.connect(timeout=5)
    # A refusal comes while the consumer's receive is still connecting to Redis, where a cancel is lost (and then
    # honoured 5 s later): a moment's wait lets it connect first, so the disconnect ends it at once.
    await asyncio.sleep(0.05)
    await comm.disconnect(timeout=10)
    return None if accepted else code
