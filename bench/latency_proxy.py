#!/usr/bin/env python3
"""A TCP proxy that adds a fixed delay each way, to measure S3 clients as if the server
were across a network (this machine has no netem). Every chunk read from one side is
written to the other `delay` later, in order; throughput is not limited.

    python3 bench/latency_proxy.py LISTEN_PORT UPSTREAM_HOST:PORT ONE_WAY_MS

Round trip added: twice ONE_WAY_MS. Meant for request/response traffic of small
objects and listings (one Python process: not for GiB-sized transfers).
"""
import asyncio
import sys


async def pipe(reader, writer, delay):
    loop = asyncio.get_running_loop()
    q = asyncio.Queue()

    async def send():
        while True:
            due, data = await q.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(1 << 16)
            q.put_nowait((loop.time() + delay, data))
            if not data:
                break
    except (ConnectionError, OSError):
        q.put_nowait((loop.time(), b""))
    try:
        await sender
    except (ConnectionError, OSError):
        pass


async def main():
    listen, upstream, one_way_ms = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    host, port = upstream.rsplit(":", 1)
    delay = one_way_ms / 1000

    async def handle(cr, cw):
        try:
            ur, uw = await asyncio.open_connection(host, int(port))
        except OSError:
            cw.close()
            return
        for w in (cw, uw):
            sock = w.get_extra_info("socket")
            if sock is not None:
                import socket
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(pipe(cr, uw, delay), pipe(ur, cw, delay))
        for w in (cw, uw):
            w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", listen, backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
