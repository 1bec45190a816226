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
        self._writers: set = set()  # both ends of every piped connection, closed by close()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, self.bind, 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(asyncio.sleep(0))  # the closed transports' last callbacks
        self._loop.close()

    async def _pipe(self, reader, writer) -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def sender():
            try:
                while True:
                    due, data = await queue.get()
                    if data is None:
                        break
                    wait = due - self._loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    writer.write(data)
                    await writer.drain()
            finally:
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
        self._writers |= {writer, up_writer}
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True)
        finally:
            writer.close()
            up_writer.close()
            self._writers -= {writer, up_writer}

    def close(self) -> None:
        """Stop listening and end every connection still piped (kept-alive HTTP/2 and SSH
        connections outlive a run), so no task is left pending when the loop stops."""
        async def shutdown():
            if self._server:
                self._server.close()
            # Closed sockets end their pipes as a hang-up would; a task cancelled in its
            # connection's callback would be logged by asyncio (streams.py) as an error.
            for writer in list(self._writers):
                writer.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if tasks:
                _, stuck = await asyncio.wait(tasks, timeout=5)
                for task in stuck:
                    task.cancel()
                await asyncio.gather(*stuck, return_exceptions=True)
            self._loop.stop()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        except Exception:  # a loop already stopped: nothing left to end
            pass
        self._thread.join(10)
