#!/usr/bin/env python3
"""`ferry sync --watch`, local to local: latency, idle cost, burst, memory, and
lsyncd and Syncthing beside it. Sections are chosen with --only (default: latency,idle).

latency: from close() of a new 4 KiB file in SRC to its replica appearing
  under its final name in DST (the inotify event of DST's directory: IN_CREATE
  of the linked O_TMPFILE or IN_MOVED_TO of a renamed temporary), one change
  at a time, over --changes changes: p50, p90, p99, max.

idle: CPU time (utime + stime from /proc/PID/stat) and context switches of
  all of ferry's threads over --idle seconds with nothing changing (the
  process of `latency` when both are chosen).

burst: --burst-files new 4 KiB files in --burst-dirs new directories, made as
  fast as Python can (mkdir, then open/write/close of each file), while
  `ferry sync --watch SRC DST` runs (its first run done, SRC and DST empty).
    watch  = from just before the first mkdir to the moment the last of the
             files is present under its final name in DST (inotify on DST's
             root and on each directory as it appears; a listing after each
             new watch catches what came before it; on queue overflow DST is
             counted by listing it instead).
    create = from the same start to the close() of the last file: the time it
             took just to make the files (a floor under `watch`).
    copy   = `ferry copy SRC DST` of the same files already made, into an
             empty DST (wall time of the process).
    tail   = watch - create, per run: how long after the last close() the
             last replica was in place.
    ratio  = watch / copy (issue 16: within 1.5x). `watch` includes `create`,
             `copy` does not: the reader can subtract.
  Watch and copy are measured in each of --runs runs (their order alternating),
  medians reported.

memory: ferry watching --memory-files empty files in --memory-dirs
  directories (under SRC's root), once its first run (into an empty DST) is
  done and it has been quiet for 2 s: VmRSS and VmHWM (/proc/PID/status;
  VmHWM includes the first run's peak), the inotify watches it holds
  (`inotify wd:` lines of /proc/PID/fdinfo/*), RSS per watched directory.
  The time taken to make the tree and the first run's time are printed too.

lsyncd: the `latency` measurement (same change generator, same detection in
  DST) for `ferry sync --watch` and for lsyncd (default.rsync, delay = 0, the
  smallest it takes; nodaemon), --runs runs each on fresh directories, tools
  alternating run by run, --changes changes per run; samples pooled.

syncthing: the same, for Syncthing (`apt-get install syncthing`; the script
  stops if it is missing): two instances on 127.0.0.1 (homes under the run's
  directory, free ports, discovery, relays, NAT, usage and crash reporting
  off, low priority off), each knowing the other's device ID and address; one
  folder, SRC sendonly on A, DST receiveonly on B, fsWatcherEnabled with
  fsWatcherDelayS = 1 (the smallest it takes), rescans once a day. Measuring
  starts once both are connected and the folder is idle on both
  (/rest/system/connections, /rest/db/status) and a first file went across.
  The replica counts under its final name (Syncthing writes
  .syncthing.NAME.tmp, then renames). With lsyncd too, all three tools rotate
  run by run into one table. Syncthing scans on a 1 s tick of its watcher:
  a change made just after the previous one landed waits nearly a whole tick,
  so with this generator its figures sit near 1 s (at a random moment the wait
  would be 0-1 s); scanning, sending and pulling take a few ms more.

bisync: `ferry bisync --watch A B` over a tree of --bisync-files 1 KiB files
  in --bisync-dirs directories (synced once before), for each binary of
  --bisync-bins (e.g. the build before issue 16, which ran a whole bisync per
  batch of changes, and the current one, which runs only the directories
  that changed): from close() of a new 4 KiB file in a directory of A to its
  replica in place in that directory of B, --bisync-changes changes one at a
  time (each in another directory, --bisync-pause s apart), --runs runs with
  the binaries alternating; medians and p90 of the pooled samples.

Ends with Markdown tables of the results.

  python3 bench/watch.py --ferry target/release/ferry [--changes 1000] [--idle 60]
  python3 bench/watch.py --only burst,memory,lsyncd [--runs 3] [--burst-files 10000]
      [--memory-files 1000000 --memory-dirs 1000]
  python3 bench/watch.py --only lsyncd,syncthing [--runs 3] [--changes 1000]
  python3 bench/watch.py --only bisync --bisync-bins OLD_FERRY,target/release/ferry
      [--bisync-files 100000 --bisync-dirs 1000 --bisync-changes 20 --runs 3]
"""

import argparse
import copy
import ctypes
import ctypes.util
import json
import os
import select
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import xml.etree.ElementTree as ET

IN_CREATE = 0x100
IN_MOVED_TO = 0x80
IN_Q_OVERFLOW = 0x4000
IN_ISDIR = 0x40000000
IN_CLOEXEC = 0o2000000

SECTIONS = ("latency", "idle", "burst", "memory", "lsyncd", "syncthing", "bisync", "grow")

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def inotify_init():
    fd = libc.inotify_init1(IN_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    return fd


def add_watch(fd, path):
    wd = libc.inotify_add_watch(fd, path.encode(), IN_CREATE | IN_MOVED_TO)
    if wd < 0:
        raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
    return wd


def inotify_on(path):
    fd = inotify_init()
    add_watch(fd, path)
    return fd


def events_from(fd):
    """(wd, mask, name) of the events of one read()."""
    buf = os.read(fd, 1 << 20)
    out, i = [], 0
    while i + 16 <= len(buf):
        wd, mask, _cookie, ln = struct.unpack_from("iIII", buf, i)
        out.append((wd, mask, buf[i + 16:i + 16 + ln].rstrip(b"\0").decode()))
        i += 16 + ln
    return out


def wait_name(fd, name, timeout=30.0):
    end = time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise SystemExit(f"{name} never appeared in DST")
        r, _, _ = select.select([fd], [], [], left)
        if r and any(n == name for _, _, n in events_from(fd)):
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


def retire(work, path):
    """Move `path` (a run's many-file tree) aside into WORK/trash, deleted at the end
    (purge_trash): the root ext4 here has no journal, so an inode freed within the last
    minute is not reused and the next run's allocations scan past every one of them
    (bench/LOG.md, "Why small-file runs on this machine swing")."""
    if not os.path.lexists(path):
        return
    trash = os.path.join(work, "trash")
    os.makedirs(trash, exist_ok=True)
    os.rename(path, os.path.join(trash, str(len(os.listdir(trash)))))


def purge_trash(work):
    shutil.rmtree(os.path.join(work, "trash"), ignore_errors=True)


def fresh(work, name):
    base = os.path.join(work, name)
    retire(work, base)
    src, dst = os.path.join(base, "src"), os.path.join(base, "dst")
    os.makedirs(src)
    os.makedirs(dst)
    return base, src, dst


def write_file(path, data):
    f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    if data:
        os.write(f, data)
    os.close(f)


def start_ready(cmd, src, dst, log=subprocess.DEVNULL, timeout=30.0):
    """Start a watcher; return (process, inotify fd on DST) once its first run is
    done: a file made in SRC after the start shows up in DST."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=log if log is not subprocess.DEVNULL else None)
    fd = inotify_on(dst)
    write_file(os.path.join(src, "ready"), os.urandom(4096))
    try:
        wait_name(fd, "ready", timeout)
    except BaseException:
        stop(proc, "watcher")
        raise
    return proc, fd


def stop(proc, what, check=True):
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    if check and code != 0:
        print(f"{what} exited {code}", file=sys.stderr)


def latency_samples(fd, src, n, data):
    """Milliseconds from close() to the replica in place, one change at a time."""
    lat = []
    for i in range(n):
        name = f"f{i:06d}"
        write_file(os.path.join(src, name), data)
        t0 = time.monotonic()
        lat.append((wait_name(fd, name) - t0) * 1e3)
    return lat


def summary(ms):
    return f"p50 {pct(ms, 50):.2f} ms, p90 {pct(ms, 90):.2f} ms, p99 {pct(ms, 99):.2f} ms, max {max(ms):.2f} ms"


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


# --- a growing file ---------------------------------------------------------

def run_grow(a, work, tables):
    """One file of --grow-mb MiB written 1 MiB at a time, evenly over
    --grow-secs seconds, kept open, while `ferry sync --watch --json` runs:
    the bytes its copy/update records say it sent and the bytes it wrote
    (wchar: copy_file_range and write, copies that failed too; over the
    file's size),
    and the time from the close() to DST's copy equal to the source (its
    size checked every 2 ms, then its bytes). --runs runs, medians."""
    rows = []
    ratios, writes, tails, cpus = [], [], [], []
    for r in range(a.runs):
        _, src, dst = fresh(work, f"grow{r}")
        log = open(os.path.join(work, f"grow{r}.json"), "w")
        proc = subprocess.Popen([a.ferry, "sync", "--watch", "--json", src, dst], stdout=log)
        fd = inotify_on(dst)
        write_file(os.path.join(src, "ready"), b"x")
        wait_name(fd, "ready")
        os.close(fd)
        size = a.grow_mb << 20
        blk = os.urandom(1 << 20)
        step = a.grow_secs / a.grow_mb
        f = os.open(os.path.join(src, "log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        t0 = time.monotonic()
        for i in range(a.grow_mb):
            os.write(f, blk)
            time.sleep(max(0.0, t0 + (i + 1) * step - time.monotonic()))
        os.close(f)
        end = time.monotonic()
        want = blk * a.grow_mb
        # Its size first (a stat every 2 ms), then its bytes.
        while True:
            try:
                if os.stat(os.path.join(dst, "log")).st_size == size:
                    with open(os.path.join(dst, "log"), "rb") as g:
                        if g.read() == want:
                            break
            except FileNotFoundError:
                pass
            time.sleep(0.002)
        tails.append(time.monotonic() - end)
        cpu = task_stats(proc.pid)[0]
        with open(f"/proc/{proc.pid}/io") as io:
            wchar = int(next(l for l in io if l.startswith("wchar:")).split()[1])
        stop(proc, "ferry")
        log.close()
        sent = 0
        with open(os.path.join(work, f"grow{r}.json")) as j:
            for line in j:
                rec = json.loads(line)
                if rec.get("type") in ("copy", "update") and rec.get("path") == "log":
                    sent += rec["size"]
        ratios.append(sent / size)
        writes.append(wchar / size)
        cpus.append(cpu)
        print(f"grow run {r}: sent {sent / 2**20:.0f} MiB ({sent / size:.2f}x), written {wchar / 2**20:.0f} MiB ({wchar / size:.2f}x), close() -> equal {tails[-1]*1e3:.0f} ms, ferry CPU {cpu:.2f} s")
    rows.append([f"{a.grow_mb} MiB written over {a.grow_secs:g} s, bytes sent / size",
                 f"{statistics.median(ratios):.2f}x"])
    rows.append(["bytes written by ferry (wchar of /proc/PID/io, copies that failed too) / size",
                 f"{statistics.median(writes):.2f}x"])
    rows.append(["close() -> DST equal", f"{statistics.median(tails)*1e3:.0f} ms"])
    rows.append(["ferry CPU (user+sys) over the run", f"{statistics.median(cpus):.2f} s"])
    tables.append(table(["grow (median of %d runs)" % a.runs, "ferry"], rows))


# --- latency and idle -------------------------------------------------------

def run_latency_idle(a, work, sections, tables):
    _, src, dst = fresh(work, "latency")
    proc, fd = start_ready([a.ferry, "sync", "--watch", src, dst], src, dst)
    try:
        rows = []
        if "latency" in sections:
            ms = latency_samples(fd, src, a.changes, os.urandom(4096))
            print(f"latency close() -> replica in place, {len(ms)} changes of 4 KiB: {summary(ms)}")
            rows += [[f"latency close() -> replica, 4 KiB, {len(ms)} changes",
                      f"{pct(ms, 50):.2f} ms", f"{pct(ms, 90):.2f} ms", f"{pct(ms, 99):.2f} ms", f"{max(ms):.2f} ms"]]
            tables.append(table(["measure", "p50", "p90", "p99", "max"], rows))
        if "idle" in sections:
            time.sleep(1.0)
            cpu0, sw0 = task_stats(proc.pid)
            time.sleep(a.idle)
            cpu1, sw1 = task_stats(proc.pid)
            print(f"idle {a.idle:.0f} s: CPU {1e3 * (cpu1 - cpu0):.1f} ms, context switches {sw1 - sw0} "
                  f"(all threads; clock ticks of {1e3 / os.sysconf('SC_CLK_TCK'):.0f} ms)")
            tables.append(table(["idle", "CPU", "context switches (all threads)"],
                                [[f"{a.idle:.0f} s", f"{1e3 * (cpu1 - cpu0):.1f} ms", str(sw1 - sw0)]]))
    finally:
        os.close(fd)
        stop(proc, "ferry")


# --- burst ------------------------------------------------------------------

def burst_layout(a):
    per = -(-a.burst_files // a.burst_dirs)
    names = []
    for d in range(a.burst_dirs):
        for i in range(per):
            if len(names) == a.burst_files:
                break
            names.append((f"d{d:04d}", f"f{i:06d}"))
    return names


def make_burst(src, names, data, stage=None):
    """Make the files (directories first, as met); seconds taken. With
    `stage` (a tree made beforehand on the same filesystem, --burst-maker
    cp), the files are made by one `cp -a STAGE/. SRC/` (C speed: the burst
    arrives as fast as a real one would, not at Python's pace)."""
    if stage is not None:
        t0 = time.monotonic()
        subprocess.run(["cp", "-a", stage + "/.", src + "/"], check=True)
        return time.monotonic() - t0
    t0 = time.monotonic()
    made = set()
    for d, f in names:
        if d not in made:
            os.mkdir(os.path.join(src, d))
            made.add(d)
        write_file(os.path.join(src, d, f), data)
    return time.monotonic() - t0


def count_files(root):
    n = 0
    stack = [root]
    while stack:
        for e in os.scandir(stack.pop()):
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
            else:
                n += 1
    return n


class DstWatcher(threading.Thread):
    """Follows DST (root + one level of directories) until every expected
    "dir/name" is present; records the time of the last one."""

    def __init__(self, dst, expected, timeout):
        super().__init__(daemon=True)
        self.dst, self.expected, self.timeout = dst, expected, timeout
        self.fd = inotify_init()
        self.wds = {add_watch(self.fd, dst): ""}
        self.seen = set()
        self.done_at = None
        self.overflow = False
        self.error = None

    def note(self, key):
        if key in self.expected and key not in self.seen:
            self.seen.add(key)
            if len(self.seen) == len(self.expected):
                self.done_at = time.monotonic()

    def watch_dir(self, name):
        path = os.path.join(self.dst, name)
        try:
            self.wds[add_watch(self.fd, path)] = name
            for e in os.scandir(path):
                self.note(f"{name}/{e.name}")
        except FileNotFoundError:
            pass  # a temporary directory renamed away: its final name comes as an event

    def run(self):
        end = time.monotonic() + self.timeout
        try:
            while self.done_at is None:
                left = end - time.monotonic()
                if left <= 0:
                    self.error = f"{len(self.expected) - len(self.seen)} files never appeared in DST"
                    return
                if self.overflow:
                    if count_files(self.dst) >= len(self.expected):
                        self.done_at = time.monotonic()
                    else:
                        time.sleep(0.02)
                    continue
                r, _, _ = select.select([self.fd], [], [], min(left, 1.0))
                if not r:
                    continue
                for wd, mask, name in events_from(self.fd):
                    if mask & IN_Q_OVERFLOW:
                        self.overflow = True
                    elif wd in self.wds and self.wds[wd] == "":
                        if mask & IN_ISDIR:
                            self.watch_dir(name)
                    elif wd in self.wds:
                        self.note(f"{self.wds[wd]}/{name}")
        finally:
            os.close(self.fd)


def stage_for(a, work, names, data):
    """The staged tree of --burst-maker cp (made once), else None."""
    if a.burst_maker != "cp":
        return None
    stage = os.path.join(work, "burst-stage")
    if not os.path.isdir(stage):
        os.mkdir(stage)
        make_burst(stage, names, data)
    return stage


def burst_watch(a, work, names, data):
    _, src, dst = fresh(work, "burst-watch")
    # "ready" goes at the root, the burst's directories are new.
    proc, fd = start_ready([a.ferry, "sync", "--watch", src, dst], src, dst)
    os.close(fd)
    try:
        expected = {f"{d}/{f}" for d, f in names}
        w = DstWatcher(dst, expected, timeout=a.burst_timeout)
        w.start()
        t0 = time.monotonic()
        create = make_burst(src, names, data, stage_for(a, work, names, data))
        w.join()
        if w.error:
            raise SystemExit(f"burst: {w.error}")
        if count_files(dst) < len(names) + 1:
            raise SystemExit("burst: DST holds fewer files than SRC once the watcher saw them all")
        return w.done_at - t0, create, w.overflow
    finally:
        stop(proc, "ferry")


def burst_copy(a, work, names, data):
    _, src, dst = fresh(work, "burst-copy")
    os.rmdir(dst)  # ferry copy makes it
    make_burst(src, names, data)
    t0 = time.monotonic()
    r = subprocess.run([a.ferry, "copy", src, dst], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"burst: ferry copy exited {r.returncode}: {r.stderr.decode().strip()}")
    n = count_files(dst)
    if n != len(names):
        raise SystemExit(f"burst: ferry copy left {n} files of {len(names)} in DST")
    return t


def run_burst(a, work, tables):
    names = burst_layout(a)
    data = os.urandom(4096)
    watch, create, copy = [], [], []
    for r in range(a.runs):
        order = ("watch", "copy") if r % 2 == 0 else ("copy", "watch")
        for what in order:
            if what == "watch":
                t, c, overflow = burst_watch(a, work, names, data)
                watch.append(t)
                create.append(c)
                print(f"burst run {r + 1}: watch {t:.3f} s (making the files {c:.3f} s)"
                      + (" [DST counted by listing after an inotify overflow]" if overflow else ""))
            else:
                t = burst_copy(a, work, names, data)
                copy.append(t)
                print(f"burst run {r + 1}: ferry copy {t:.3f} s")
        retire(work, os.path.join(work, "burst-watch"))
        retire(work, os.path.join(work, "burst-copy"))
    w, c, cp = statistics.median(watch), statistics.median(create), statistics.median(copy)
    retire(work, os.path.join(work, "burst-stage"))
    print(f"burst ({a.burst_maker}) of {len(names)} x 4 KiB in {a.burst_dirs} new directories, medians of {a.runs}: "
          f"watch {w:.3f} s, making the files {c:.3f} s, one-shot ferry copy {cp:.3f} s, ratio watch/copy {w / cp:.2f}x")
    tail = statistics.median(x - y for x, y in zip(watch, create))
    tables.append(table(
        ["burst", "watch: first create -> last replica", "of which making the files",
         "last close -> last replica", "one-shot ferry copy", "watch / copy"],
        [[f"{len(names):,} x 4 KiB in {a.burst_dirs} new dirs, made by {a.burst_maker} (median of {a.runs})",
          f"{w:.2f} s", f"{c:.2f} s", f"{tail * 1e3:.0f} ms", f"{cp:.2f} s", f"{w / cp:.2f}x"]]))


# --- bisync -----------------------------------------------------------------

def run_bisync(a, work, tables):
    bins = [os.path.abspath(b) for b in a.bisync_bins.split(",")] if a.bisync_bins else [a.ferry]
    base = os.path.join(work, "bisync")
    retire(work, base)
    A, B = os.path.join(base, "a"), os.path.join(base, "b")
    os.makedirs(B)
    per = -(-a.bisync_files // a.bisync_dirs)
    data = os.urandom(1024)
    t0 = time.monotonic()
    n = 0
    for d in range(a.bisync_dirs):
        os.makedirs(os.path.join(A, f"d{d:04d}"))
        for i in range(per):
            if n == a.bisync_files:
                break
            write_file(os.path.join(A, f"d{d:04d}", f"f{i:05d}"), data)
            n += 1
    journal = os.path.join(base, "journal.sqlite")
    subprocess.run([bins[-1], "bisync", "--journal", journal, A, B], check=True,
                   stdout=subprocess.DEVNULL)
    print(f"bisync: {n} files in {a.bisync_dirs} directories made and synced in {time.monotonic() - t0:.1f} s")
    samples = {b: [] for b in bins}
    change = 0
    for r in range(a.runs):
        order = bins if r % 2 == 0 else list(reversed(bins))
        for b in order:
            proc = subprocess.Popen([b, "bisync", "--watch", "--journal", journal, A, B],
                                    stdout=subprocess.DEVNULL)
            fd = inotify_on(B)
            try:
                write_file(os.path.join(A, f"ready{r}-{bins.index(b)}"), data)
                wait_name(fd, f"ready{r}-{bins.index(b)}", 300.0)
                time.sleep(a.bisync_pause)
                for _ in range(a.bisync_changes):
                    d = f"d{(change * 37) % a.bisync_dirs:04d}"
                    name = f"c{change:06d}"
                    change += 1
                    dfd = inotify_on(os.path.join(B, d))
                    try:
                        write_file(os.path.join(A, d, name), os.urandom(4096))
                        t1 = time.monotonic()
                        samples[b].append((wait_name(dfd, name, 300.0) - t1) * 1e3)
                    finally:
                        os.close(dfd)
                    time.sleep(a.bisync_pause)
            finally:
                os.close(fd)
                stop(proc, b)
            ms = samples[b][-a.bisync_changes:]
            print(f"bisync run {r + 1} {b}: median {statistics.median(ms):.1f} ms")
    rows = []
    for b in bins:
        ms = samples[b]
        rows.append([b, f"{statistics.median(ms):.1f} ms", f"{pct(ms, 90):.1f} ms", f"{max(ms):.1f} ms",
                     str(len(ms))])
    tables.append(table([f"bisync --watch, {n:,} x 1 KiB in {a.bisync_dirs} dirs: close() -> replica on B",
                         "median", "p90", "max", "changes"], rows))
    retire(work, base)


# --- memory -----------------------------------------------------------------

def proc_status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0])  # KiB
    return out


def inotify_watches(pid):
    n = 0
    for fdn in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fdn}") as f:
                n += sum(1 for line in f if line.startswith("inotify wd:"))
        except OSError:
            pass
    return n


def run_memory(a, work, tables):
    _, src, dst = fresh(work, "memory")
    per = -(-a.memory_files // a.memory_dirs)
    t0 = time.monotonic()
    n = 0
    for d in range(a.memory_dirs):
        dp = os.path.join(src, f"d{d:05d}")
        os.mkdir(dp)
        for i in range(min(per, a.memory_files - n)):
            os.close(os.open(os.path.join(dp, f"f{i:07d}"), os.O_WRONLY | os.O_CREAT, 0o644))
            n += 1
    made = time.monotonic() - t0
    print(f"memory: made {n} empty files in {a.memory_dirs} directories in {made:.1f} s")
    t0 = time.monotonic()
    proc, fd = start_ready([a.ferry, "sync", "--watch", src, dst], src, dst, timeout=a.memory_timeout)
    os.close(fd)
    try:
        # "ready" may come before the rest: wait for all of it, then for quiet.
        while count_files(dst) < n + 1:
            if time.monotonic() - t0 > a.memory_timeout:
                raise SystemExit("memory: the first run never finished")
            time.sleep(1.0)
        first = time.monotonic() - t0
        cpu, _ = task_stats(proc.pid)
        while True:
            time.sleep(2.0)
            cpu1, _ = task_stats(proc.pid)
            if cpu1 == cpu:
                break
            cpu = cpu1
        st = proc_status(proc.pid)
        watches = inotify_watches(proc.pid)
    finally:
        stop(proc, "ferry")
    dirs = a.memory_dirs + 1  # and the root
    rss, hwm = st["VmRSS"], st["VmHWM"]
    print(f"memory watching {n} files in {dirs} directories (first run {first:.1f} s): VmRSS {rss / 1024:.1f} MiB, "
          f"VmHWM {hwm / 1024:.1f} MiB, inotify watches {watches}, RSS per directory {rss / dirs:.1f} KiB, "
          f"per file {rss * 1024 / max(n, 1):.0f} B")
    tables.append(table(
        ["watching", "VmRSS", "VmHWM (incl. first run)", "inotify watches", "RSS / directory", "RSS / file",
         "making the tree", "first run"],
        [[f"{n:,} empty files in {a.memory_dirs:,} dirs", f"{rss / 1024:.1f} MiB", f"{hwm / 1024:.1f} MiB",
          f"{watches:,}", f"{rss / dirs:.1f} KiB", f"{rss * 1024 / max(n, 1):.0f} B", f"{made:.1f} s", f"{first:.1f} s"]]))


# --- lsyncd and Syncthing --------------------------------------------------

ST_FOLDER = "bench"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Syncthing:
    """One Syncthing instance: home under the run's directory, REST on 127.0.0.1."""

    def __init__(self, exe, home):
        self.exe, self.home = exe, home
        self.gui, self.listen = free_port(), free_port()
        r = subprocess.run([exe, "generate", f"--home={home}", "--no-default-folder", "--skip-port-probing"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env())
        if r.returncode != 0:
            raise SystemExit(f"syncthing generate --home {home} exited {r.returncode}: {r.stdout.decode().strip()}")
        self.conf = os.path.join(home, "config.xml")
        root = ET.parse(self.conf).getroot()
        self.id = root.find("device").get("id")
        self.apikey = root.find("gui/apikey").text
        self.proc = self.log = None

    def env(self):
        return dict(os.environ, STNODEFAULTFOLDER="1", STNOUPGRADE="1", STNORESTART="1")

    def configure(self, peer, path, kind):
        """Options for a lone machine, `peer` as the only other device, one folder at `path`."""
        tree = ET.parse(self.conf)
        root = tree.getroot()
        opts = root.find("options")
        for k, v in {"listenAddress": f"tcp://127.0.0.1:{self.listen}", "globalAnnounceEnabled": "false",
                     "localAnnounceEnabled": "false", "relaysEnabled": "false", "natEnabled": "false",
                     "urAccepted": "-1", "crashReportingEnabled": "false", "startBrowser": "false",
                     "autoUpgradeIntervalH": "0", "announceLANAddresses": "false", "setLowPriority": "false",
                     "reconnectionIntervalS": "1"}.items():
            el = opts.find(k)
            if el is None:
                el = ET.SubElement(opts, k)
            el.text = v
        root.find("gui/address").text = f"127.0.0.1:{self.gui}"
        dev = copy.deepcopy(root.find("defaults/device"))
        dev.set("id", peer.id)
        dev.set("name", "peer")
        dev.find("address").text = f"tcp://127.0.0.1:{peer.listen}"
        root.insert(list(root).index(root.find("gui")), dev)
        folder = copy.deepcopy(root.find("defaults/folder"))
        folder.attrib.update({"id": ST_FOLDER, "label": ST_FOLDER, "path": path, "type": kind,
                              "rescanIntervalS": "86400", "fsWatcherEnabled": "true", "fsWatcherDelayS": "1"})
        for d in folder.findall("device"):
            folder.remove(d)
        for i, dev_id in enumerate((self.id, peer.id)):
            d = ET.Element("device", {"id": dev_id, "introducedBy": ""})
            ET.SubElement(d, "encryptionPassword")
            folder.insert(i, d)
        root.insert(0, folder)
        tree.write(self.conf)
        os.makedirs(os.path.join(path, ".stfolder"), exist_ok=True)

    def start(self):
        self.log = open(os.path.join(self.home, "syncthing.out"), "w")
        self.proc = subprocess.Popen([self.exe, "serve", f"--home={self.home}", "--no-browser", "--no-restart",
                                     "--no-upgrade", f"--gui-address=127.0.0.1:{self.gui}"],
                                    stdout=self.log, stderr=subprocess.STDOUT, env=self.env())

    def rest(self, path, method="GET"):
        req = urllib.request.Request(f"http://127.0.0.1:{self.gui}{path}", method=method,
                                     headers={"X-API-Key": self.apikey})
        with urllib.request.urlopen(req, timeout=5) as resp:
            body = resp.read()
        return json.loads(body) if body.strip() else None

    def ready(self, peer):
        """Connected to the peer and the folder idle with nothing needed."""
        if self.proc.poll() is not None:
            raise SystemExit(f"syncthing ({self.home}) exited {self.proc.returncode}; see {self.log.name}")
        try:
            conn = self.rest("/rest/system/connections")["connections"].get(peer.id, {})
            st = self.rest(f"/rest/db/status?folder={ST_FOLDER}")
        except (OSError, ValueError):
            return False  # not listening yet
        return bool(conn.get("connected")) and st.get("state") == "idle" and st.get("needTotalItems", 0) == 0

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.rest("/rest/system/shutdown", method="POST")
                self.proc.wait(timeout=30)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.proc = None


def syncthing_version(exe):
    r = subprocess.run([exe, "--version"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    words = r.stdout.decode().split()
    return words[1].lstrip("v").split("-")[0] if len(words) > 1 else "?"


def start_syncthing(a, base, src, dst):
    """Instance A sends SRC (sendonly), B receives into DST (receiveonly). Returns
    ([A, B], inotify fd on DST) once both are connected and idle and a file made
    in SRC has shown up in DST."""
    pair = [Syncthing(a.syncthing, os.path.join(base, "st-a")), Syncthing(a.syncthing, os.path.join(base, "st-b"))]
    try:
        pair[0].configure(pair[1], src, "sendonly")
        pair[1].configure(pair[0], dst, "receiveonly")
        for st in pair:
            st.start()
        end = time.monotonic() + a.syncthing_timeout
        while not (pair[0].ready(pair[1]) and pair[1].ready(pair[0])):
            if time.monotonic() > end:
                raise SystemExit(f"syncthing: not connected and idle after {a.syncthing_timeout:.0f} s "
                                 f"(logs in {base}/st-*/syncthing.out)")
            time.sleep(0.2)
        fd = inotify_on(dst)
        write_file(os.path.join(src, "ready"), os.urandom(4096))
        try:
            wait_name(fd, "ready", a.syncthing_timeout)
        except BaseException:
            os.close(fd)
            raise
        return pair, fd
    except BaseException:
        for st in pair:
            st.stop()
        raise


def run_peers(a, work, sections, tables):
    """ferry and the chosen peers (lsyncd, syncthing), same changes, same detection;
    the tools' order rotates run by run."""
    tools = ["ferry"] + [t for t in ("lsyncd", "syncthing") if t in sections]
    labels = {"ferry": "ferry sync --watch", "lsyncd": "lsyncd (default.rsync, delay = 0)"}
    if "lsyncd" in tools and not os.access(a.lsyncd, os.X_OK):
        raise SystemExit(f"lsyncd: {a.lsyncd} is not an executable (apt-get install lsyncd, or --lsyncd PATH)")
    if "syncthing" in tools:
        exe = shutil.which(a.syncthing)
        if exe is None:
            raise SystemExit(f"syncthing: {a.syncthing!r} not found (apt-get install syncthing, or --syncthing PATH)")
        a.syncthing = exe
        labels["syncthing"] = (f"Syncthing {syncthing_version(exe)} (sendonly -> receiveonly over 127.0.0.1, "
                               f"fsWatcherDelayS = 1)")
    data = os.urandom(4096)
    samples = {t: [] for t in tools}
    for r in range(a.runs):
        order = tools[r % len(tools):] + tools[:r % len(tools)]
        for tool in order:
            base, src, dst = fresh(work, f"lat-{tool}")
            pair, log = None, subprocess.DEVNULL
            if tool == "syncthing":
                pair, fd = start_syncthing(a, base, src, dst)
            else:
                if tool == "ferry":
                    cmd = [a.ferry, "sync", "--watch", src, dst]
                else:
                    conf = os.path.join(base, "lsyncd.lua")
                    with open(conf, "w") as f:
                        f.write(f'settings {{ nodaemon = true, logfile = "{base}/lsyncd.log" }}\n'
                                f'sync {{ default.rsync, source = "{src}", target = "{dst}", delay = 0 }}\n')
                    cmd, log = [a.lsyncd, conf], open(os.path.join(base, "lsyncd.out"), "w")
                proc, fd = start_ready(cmd, src, dst, log=log)
            try:
                ms = latency_samples(fd, src, a.changes, data)
            finally:
                os.close(fd)
                if pair:
                    for st in pair:
                        st.stop()
                else:
                    stop(proc, tool, check=(tool == "ferry"))
                if log is not subprocess.DEVNULL:
                    log.close()
            samples[tool] += ms
            print(f"run {r + 1} {tool}: {summary(ms)}")
            retire(work, base)
    rows = []
    for tool, ms in samples.items():
        print(f"{tool} pooled over {len(ms)} changes: {summary(ms)}")
        rows.append([labels[tool], f"{pct(ms, 50):.2f} ms", f"{pct(ms, 90):.2f} ms", f"{pct(ms, 99):.2f} ms",
                     f"{max(ms):.2f} ms"])
    tables.append(table([f"close() -> replica, 4 KiB, {a.runs} x {a.changes} changes", "p50", "p90", "p99", "max"], rows))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ferry", default="target/release/ferry")
    ap.add_argument("--lsyncd", default="/usr/bin/lsyncd")
    ap.add_argument("--syncthing", default="syncthing")
    ap.add_argument("--syncthing-timeout", type=float, default=120.0,
                    help="syncthing: seconds to wait for the two instances to connect and sync the first file")
    ap.add_argument("--only", default="latency,idle", help=f"comma-separated sections of {','.join(SECTIONS)}")
    ap.add_argument("--changes", type=int, default=1000, help="latency, lsyncd and syncthing: changes per run")
    ap.add_argument("--idle", type=float, default=60.0, help="idle: seconds")
    ap.add_argument("--runs", type=int, default=3, help="burst, lsyncd and syncthing: runs")
    ap.add_argument("--burst-files", type=int, default=10_000)
    ap.add_argument("--burst-dirs", type=int, default=100)
    ap.add_argument("--burst-maker", choices=["python", "cp"], default="python",
                    help="how the burst's files are made: one by one from Python, or by one cp -a of a staged tree")
    ap.add_argument("--burst-timeout", type=float, default=600.0)
    ap.add_argument("--memory-files", type=int, default=1_000_000)
    ap.add_argument("--memory-dirs", type=int, default=1000)
    ap.add_argument("--memory-timeout", type=float, default=3600.0)
    ap.add_argument("--bisync-bins", default=None,
                    help="bisync: comma-separated ferry binaries to compare (default: --ferry)")
    ap.add_argument("--bisync-files", type=int, default=100_000)
    ap.add_argument("--bisync-dirs", type=int, default=1000)
    ap.add_argument("--bisync-changes", type=int, default=20)
    ap.add_argument("--bisync-pause", type=float, default=1.0,
                    help="bisync: seconds between changes (a run for the replica's own events settles)")
    ap.add_argument("--grow-mb", type=int, default=200, help="grow: the file's size, MiB")
    ap.add_argument("--grow-secs", type=float, default=10.0, help="grow: seconds over which it is written")
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    a.ferry = os.path.abspath(a.ferry)
    sections = [s.strip() for s in a.only.split(",") if s.strip()]
    for s in sections:
        if s not in SECTIONS:
            ap.error(f"--only: unknown section {s!r} (sections: {', '.join(SECTIONS)})")
    work = os.path.abspath(a.workdir) if a.workdir else tempfile.mkdtemp(prefix="ferry-watch-bench-")
    os.makedirs(work, exist_ok=True)
    tables = []
    try:
        if "latency" in sections or "idle" in sections:
            run_latency_idle(a, work, sections, tables)
        if "burst" in sections:
            run_burst(a, work, tables)
        if "memory" in sections:
            run_memory(a, work, tables)
        if "lsyncd" in sections or "syncthing" in sections:
            run_peers(a, work, sections, tables)
        if "bisync" in sections:
            run_bisync(a, work, tables)
        if "grow" in sections:
            run_grow(a, work, tables)
    finally:
        purge_trash(work)
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
