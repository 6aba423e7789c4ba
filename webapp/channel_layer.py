"""The Redis channel layer, made to honour a cancellation that Python 3.11 can lose inside redis-py."""

from __future__ import annotations

import asyncio

from channels_redis.core import RedisChannelLayer as _StockRedisChannelLayer


class RedisChannelLayer(_StockRedisChannelLayer):
    """channels_redis' layer whose blocking receive ends once its task is cancelled, even if the cancel was lost.

    Why: with a socket timeout, redis-py writes through `asyncio.wait_for`, and on Python 3.11 `wait_for` swallows a
    cancellation that arrives as the write completes (CPython gh-86296, fixed in 3.12). A consumer cancelled then,
    typically a websocket refused right after it connected, has a receive task that never ends: it keeps popping its
    channel every `brpop_timeout` seconds, and whatever awaits it (the consumer's teardown, an event loop shutting
    down) waits for good. The task still counts the lost request (`Task.cancelling()`), so after each blocking pop
    (at most `brpop_timeout` later) the receive is cancelled as it was asked to be. A message popped meanwhile stays
    in the channel's backup queue, as with any cancelled receive.
    """

    async def _brpop_with_clean(self, index: int, channel: str, timeout: float) -> bytes | None:
        member = await super()._brpop_with_clean(index, channel, timeout)
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError()
        return member
