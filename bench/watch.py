#!/usr/bin/env python3
"""`ferry sync --watch` latency and idle cost, local to local.

Latency: from close() of a new 4 KiB file in SRC to its replica appearing
under its final name in DST (the inotify event of DST's directory: IN_CREATE
of the linked O_TMPFILE or IN_MOVED_TO of a renamed temporary), one change at
a time, over --changes changes: p50, p90, p99, max.

Idle: CPU time (utime + stime from /proc/PID/stat) and context switches of
all of ferry's threads over --idle seconds with nothing changing.

  python3 bench/watch.py --ferry target/release/ferry [--changes 1000] [--idle 60]
"""

import argparse
import ctypes
import ctypes.util
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

IN_CREATE = 0x100
IN_MOVED_TO = 0x80
IN_CLOEXEC = 0o2000000

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def inotify_on(path):
    fd = libc.inotify_init1(IN_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    if libc.inotify_add_watch(fd, path.encode(), IN_CREATE | IN_MOVED_TO) < 0:
        raise OSError(ctypes.get_errno(), "inotify_add_watch")
    return fd


def names_from(fd):
    """Names in the events of one read()."""
    buf = os.read(fd, 65536)
    out, i = [], 0
    while i + 16 <= len(buf):
        _wd, _mask, _cookie, ln = struct.unpack_from("iIII", buf, i)
        out.append(buf[i + 16:i + 16 + ln].rstrip(b"\0").decode())
        i += 16 + ln
    return out


def wait_name(fd, name, timeout=30.0):
    end = time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise SystemExit(f"{name} never appeared in DST")
        r, _, _ = select.select([fd], [], [], left)
        if r and name in names_from(fd):
            return time.monotonic()


def task_stats(pid):
    """(CPU seconds of the process, context switches of all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    hz = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / hz
    switches = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/status") as f:
            for line in f:
                if "ctxt_switches" in line:
                    switches += int(line.split()[1])
    return cpu, switches


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ferry", default="target/release/ferry")
    ap.add_argument("--changes", type=int, default=1000)
    ap.add_argument("--idle", type=float, default=60.0)
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    work = a.workdir or tempfile.mkdtemp(prefix="ferry-watch-bench-")
    src, dst = os.path.join(work, "src"), os.path.join(work, "dst")
    os.makedirs(src, exist_ok=True)
    os.makedirs(dst, exist_ok=True)
    proc = subprocess.Popen([a.ferry, "sync", "--watch", src, dst], stdout=subprocess.DEVNULL)
    try:
        # The first run is done once a file made now shows up.
        fd = inotify_on(dst)
        data = os.urandom(4096)
        with open(os.path.join(src, "ready"), "wb") as f:
            f.write(data)
        wait_name(fd, "ready")
        lat = []
        for i in range(a.changes):
            name = f"f{i:06d}"
            f = os.open(os.path.join(src, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(f, data)
            os.close(f)
            t0 = time.monotonic()
            lat.append(wait_name(fd, name) - t0)
        ms = [x * 1e3 for x in lat]
        print(f"latency close() -> replica in place, {len(ms)} changes of 4 KiB: "
              f"p50 {pct(ms, 50):.2f} ms, p90 {pct(ms, 90):.2f} ms, p99 {pct(ms, 99):.2f} ms, max {max(ms):.2f} ms")
        time.sleep(1.0)
        cpu0, sw0 = task_stats(proc.pid)
        time.sleep(a.idle)
        cpu1, sw1 = task_stats(proc.pid)
        print(f"idle {a.idle:.0f} s: CPU {1e3 * (cpu1 - cpu0):.1f} ms, context switches {sw1 - sw0} "
              f"(all threads; clock ticks of {1e3 / os.sysconf('SC_CLK_TCK'):.0f} ms)")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        if code != 0:
            print(f"ferry exited {code}", file=sys.stderr)
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
