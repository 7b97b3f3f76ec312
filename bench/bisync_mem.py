#!/usr/bin/env python3
"""bisync memory: peak RSS and wall time of `ferry bisync` on a big tree whose sides are
already equal, a first run (`--resync`, fresh journal) and a no-op run after it, beside a
no-op `ferry sync` of the same pair.

    python3 bench/bisync_mem.py [--ferry PATH] [--base PATH] [--workdir DIR]
                                [--files N] [--dirs N] [--size BYTES] [--jobs N]

Default tree: 1,000,000 files of 64 bytes in 1,000 directories, made once under --workdir
(default: ferry-bisync-mem in the system temp directory, $TMPDIR if set) as `a`, then copied
to `b` with `cp -a` (same mtimes); later runs reuse it. Making it takes minutes.
Each binary (--ferry, and --base if given, one after the other) gets its own journal,
removed before its first run. Peak RSS is `ru_maxrss` of the child (what `/usr/bin/time -v`
prints as "Maximum resident set size"), CPU is user + system time. Exits 1 if a run failed.
Standard library only.
"""

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def gen(root, files, dirs, size):
    per = files // dirs
    os.makedirs(root)
    t0 = time.time()
    for d in range(dirs):
        dp = os.path.join(root, f"d{d:04d}")
        os.mkdir(dp)
        dfd = os.open(dp, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i in range(per):
                name = f"f{d * per + i:07d}"
                body = (f"{d}-{i} ".encode() + bytes([97 + i % 26]) * size)[:size]
                fd = os.open(name, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644, dir_fd=dfd)
                try:
                    os.write(fd, body)
                    t = (1_700_000_000 + i) * 10**9
                    os.utime(fd, ns=(t, t))
                finally:
                    os.close(fd)
        finally:
            os.close(dfd)
        if d % 100 == 99:
            log(f"  {d + 1}/{dirs} directories ({time.time() - t0:.0f} s)")


def measured(cmd, env):
    """Run cmd; return (wall s, CPU s, peak RSS MiB, exit code)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        log(f"    {' '.join(cmd)} exited {code}: {err.strip()[-500:]}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, code


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferry", default=os.path.join(REPO, "target/release/ferry"))
    ap.add_argument("--base", default=None, help="a second ferry binary, measured beside")
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "ferry-bisync-mem"))
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--dirs", type=int, default=1000)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=None)
    args = ap.parse_args()
    w = os.path.abspath(args.workdir)
    os.makedirs(w, exist_ok=True)
    a, b = os.path.join(w, "a"), os.path.join(w, "b")
    if not os.path.isdir(a):
        log(f"making {a}: {args.files:,} files of {args.size} B in {args.dirs:,} directories")
        gen(a, args.files, args.dirs, args.size)
    if not os.path.isdir(b):
        log(f"copying to {b}")
        subprocess.run(["cp", "-a", a, b], check=True)
    env = dict(os.environ, XDG_STATE_HOME=os.path.join(w, "state"))
    jobs = ["-j", str(args.jobs)] if args.jobs else []
    tools = [("ferry", os.path.abspath(args.ferry))]
    if args.base:
        tools.append(("base", os.path.abspath(args.base)))
    rows = []
    failed = False
    for label, exe in tools:
        j = os.path.join(w, f"journal-{label}.sqlite")
        for f in (j, j + "-wal", j + "-shm", j + ".lock"):
            if os.path.exists(f):
                os.remove(f)
        bi = [exe, "bisync", "--journal", j] + jobs
        runs = [
            ("bisync first run (--resync)", bi + ["--resync", a, b]),
            ("bisync no-op", bi + [a, b]),
            ("sync no-op", [exe, "sync"] + jobs + [a + "/", b]),
        ]
        for what, cmd in runs:
            wall, cpu, rss, code = measured(cmd, env)
            failed |= code != 0
            rows.append((label, what, f"{wall:.2f}", f"{cpu:.2f}", f"{rss:.1f}"))
            log(f"  {label}: {what}: {wall:.2f} s, {cpu:.2f} CPU-s, {rss:.1f} MiB")
        jsize = sum(os.path.getsize(f) for f in (j, j + "-wal") if os.path.exists(f))
        rows.append((label, "journal file size", "", "", f"{jsize / 2**20:.1f}"))
    print(f"\n{args.files:,} files x {args.size} B in {args.dirs:,} directories, sides equal\n")
    print("| binary | run | wall s | CPU s | max RSS MiB |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
