"""A TCP proxy that adds latency, to measure the tool on a slow link (tc netem is not
available here). Each direction's data is held `delay_s` before it is sent on."""

from __future__ import annotations

import asyncio
import threading


class DelayProxy:
    """Forwards 127.0.0.1:<port> to (host, port) with `rtt_ms` added per round trip."""

    def __init__(self, target_host: str, target_port: int, rtt_ms: float, bind: str = "10.200.0.1"):
        self.target = (target_host, target_port)
        self.delay_s = rtt_ms / 2000.0
        self.bind = bind
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server = None
        threading.Thread(target=self._run, daemon=True).start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, self.bind, 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _pipe(self, reader, writer) -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def sender():
            while True:
                due, data = await queue.get()
                if data is None:
                    break
                wait = due - self._loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            writer.close()

        task = self._loop.create_task(sender())
        try:
            while data := await reader.read(65536):
                await queue.put((self._loop.time() + self.delay_s, data))
        except ConnectionError:
            pass
        await queue.put((0, None))
        await task

    async def _handle(self, reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True)

    def close(self) -> None:
        if self._server:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
