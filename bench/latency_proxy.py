#!/usr/bin/env python3
"""A TCP proxy that adds a fixed delay each way, to measure clients as if the server were
across a network (this machine has no netem). Every byte read from one side is written to
the other `delay` later, in order; throughput is not limited.

    python3 bench/latency_proxy.py LISTEN_PORT UPSTREAM_HOST:PORT ONE_WAY_MS

Round trip added: twice ONE_WAY_MS. Prints "ready" once it listens.

Built to cost little CPU, so that the round trip, not the proxy, is what a benchmark
measures: one thread, one poll loop (no asyncio), reads of up to 1 MiB, and whatever has
come due on a direction goes out in one write (a run of small reads is forwarded as one
large write, as a NIC with receive offload hands a burst to the kernel in one piece). A
direction holding more than BUFFERED bytes not yet written stops reading until the far end
takes them (memory stays bounded; at 10 ms each way that is still over 3 GiB/s).
"""
import collections
import os
import select
import socket
import sys
import time

READ = 1 << 20
BUFFERED = 32 << 20
IN, OUT = select.POLLIN, select.POLLOUT
ERR = select.POLLERR | select.POLLHUP | select.POLLNVAL


class Way:
    """One direction: bytes read from `src`, due at `due`, written to `dst`."""

    __slots__ = ("src", "dst", "queue", "held", "out", "eof_read", "eof_sent", "pair")

    def __init__(self, src, dst, pair):
        self.src, self.dst, self.pair = src, dst, pair
        self.queue = collections.deque()  # (due, bytes); b"" = end of stream
        self.held = 0                     # bytes in queue and out
        self.out = b""                    # due, not yet taken by dst
        self.eof_read = self.eof_sent = False


class Pair:
    __slots__ = ("a", "b", "ways", "closed")

    def __init__(self, a, b):
        self.a, self.b, self.closed = a, b, False
        self.ways = (Way(a, b, self), Way(b, a, self))


def main():
    listen, upstream, one_way_ms = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    host, port = upstream.rsplit(":", 1)
    port = int(port)
    delay = one_way_ms / 1000
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", listen))
    srv.listen(1024)
    srv.setblocking(False)
    poller = select.poll()
    poller.register(srv, IN)
    by_fd = {}      # fd -> (socket, Pair)
    timed = set()   # ways with something queued
    print("ready", flush=True)

    def interest(sock):
        """What to wait for on `sock`: reading while its way in is open and not
        full, writing while its way out has bytes it did not take."""
        _, p = by_fd[sock.fileno()]
        rd = next(w for w in p.ways if w.src is sock)
        wr = next(w for w in p.ways if w.dst is sock)
        if rd.eof_read and wr.eof_sent:
            return
        ev = 0
        if not rd.eof_read and rd.held < BUFFERED:
            ev |= IN
        if wr.out:
            ev |= OUT
        poller.modify(sock, ev)

    def close(p):
        if p.closed:
            return
        p.closed = True
        for w in p.ways:
            timed.discard(w)
        for s in (p.a, p.b):
            by_fd.pop(s.fileno(), None)
            try:
                poller.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    def flush(w):
        """Write what is due on `w` (one send); False when the pair was closed."""
        now = time.monotonic()
        q = w.queue
        if q and q[0][0] <= now:
            parts = [w.out] if len(w.out) else []
            while q and q[0][0] <= now and q[0][1]:
                parts.append(q.popleft()[1])
            w.out = b"".join(parts) if len(parts) != 1 else parts[0]
        if len(w.out):
            try:
                n = w.dst.send(w.out)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                close(w.pair)
                return False
            w.held -= n
            # (A view: the rest is not copied again after a partial send.)
            w.out = memoryview(w.out)[n:] if n < len(w.out) else b""
        # The end of the stream, once everything before it is written.
        if not len(w.out) and q and q[0][0] <= now and not q[0][1]:
            q.popleft()
            w.eof_sent = True
            try:
                w.dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        if not q:
            timed.discard(w)
        if all(x.eof_sent for x in w.pair.ways):
            close(w.pair)
            return False
        return True

    while True:
        # Sleep until the next queued chunk is due (a way whose bytes the far
        # end is not taking waits for POLLOUT instead).
        wait = None
        dues = [w.queue[0][0] for w in timed if not w.out]
        if dues:
            wait = max(0.0, (min(dues) - time.monotonic()) * 1000)
            # poll() takes whole ms: round up, never wake early.
            wait = int(wait) + (1 if wait % 1 else 0)
        events = poller.poll(wait)
        touched = set()
        for fd, ev in events:
            if fd == srv.fileno():
                while True:
                    try:
                        c, _ = srv.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    u = socket.socket()
                    try:
                        u.connect((host, port))
                    except OSError:
                        u.close()
                        c.close()
                        continue
                    p = Pair(c, u)
                    for s in (c, u):
                        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        s.setblocking(False)
                        by_fd[s.fileno()] = (s, p)
                        poller.register(s, IN)
                continue
            ent = by_fd.get(fd)
            if ent is None:
                continue
            sock, p = ent
            w = next(x for x in p.ways if x.src is sock)
            if ev & ERR and w.eof_read:
                # Both halves shut (HUP): nothing more to wait for on it;
                # else it is gone (reset after its end) and so is the pair.
                if next(x for x in p.ways if x.dst is sock).eof_sent:
                    poller.unregister(sock)
                else:
                    close(p)
                continue
            if ev & (IN | ERR):
                try:
                    data = sock.recv(READ)
                except (BlockingIOError, InterruptedError):
                    data = None
                except OSError:
                    # Reset: the far side learns at once.
                    close(p)
                    continue
                if data is not None:
                    t = time.monotonic() + delay
                    w.queue.append((t, data))
                    timed.add(w)
                    if data:
                        w.held += len(data)
                    else:
                        w.eof_read = True
                    touched.add(sock)
            if ev & OUT and not p.closed:
                w = next(x for x in p.ways if x.dst is sock)
                if flush(w):
                    touched.add(sock)
        # Everything due goes out now, one write per way.
        for w in list(timed):
            if w.pair.closed or w.out:
                continue
            if w.queue[0][0] <= time.monotonic():
                if flush(w):
                    touched.add(w.dst)
                    touched.add(w.src)
        for s in touched:
            if s.fileno() in by_fd:
                interest(s)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
