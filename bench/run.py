#!/usr/bin/env python3
"""Whole-workload benchmark: ferry side by side with rsync, rclone, cp, tar and the syscall floor.

    python3 bench/run.py [--smoke] [--runs N] [--workloads small,many,...] [--scenarios copy,noop,touch,ls]
                         [--tools ferry,rsync,...] [--ferry PATH] [--base PATH] [--workdir DIR] [--out FILE]

Workloads (generated once, deterministically, under --workdir, and cached):
  small  10,000 files x 4 KiB in 100 dirs     many   100,000 files x 1 KiB in 1,000 dirs
  wide   500,000 empty files in one dir        mixed  1,000 files x 1 MiB in 10 dirs
  big    one 2 GiB file                        tree   source-tree-like: 30,000 files mostly < 16 KiB,
                                                      12 large ones, 3,000 dirs up to 14 deep, symlinks
Scenarios:
  copy   first copy into a fresh, not yet existing target (a new target name every run)
  noop   re-sync of an already equal target
  touch  re-sync after 1% of the source files changed (first 4 KiB rewritten, new mtime)
  ls     recursive listing with size and mtime
Each tool runs --runs times (default 5), tools alternating run by run, warm cache, `sync`
before every timed run. Wall time, user+sys CPU and peak RSS come from wait4(); then one
extra `strace -c -f` run per tool counts syscalls. Writes bench/last-run.md (a whole report: copy
the tables worth keeping into BENCHMARKS.md, the log of the run into bench/LOG.md) and bench/charts/*.svg.

--smoke: tiny workloads, one run, finishes in seconds; exits 1 if any tool that ran produced
a wrong result (ferry's copies are also compared byte for byte with `diff -r`), 2 if ferry
or the C compiler is missing. Peer tools that are not installed are skipped and noted.
Standard library only.
"""

import argparse
import datetime
import fcntl
import hashlib
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
NPROC = os.cpu_count() or 1
GEN_VERSION = 1
MTIME_BASE = 1_700_000_000 * 10**9  # fixed mtimes: runs and machines are comparable
TOUCH_BASE = 1_750_000_000 * 10**9
KiB, MiB, GiB = 1024, 1024**2, 1024**3
POOL_SIZE = 8 * MiB

FULL = {
    "small": {"kind": "flat", "files": 10_000, "size": 4 * KiB, "dirs": 100, "seed": 1},
    "many": {"kind": "flat", "files": 100_000, "size": 1 * KiB, "dirs": 1000, "seed": 2},
    "wide": {"kind": "flat", "files": 500_000, "size": 0, "dirs": 0, "seed": 3},
    "mixed": {"kind": "flat", "files": 1000, "size": 1 * MiB, "dirs": 10, "seed": 4},
    "big": {"kind": "big", "size": 2 * GiB, "seed": 5},
    "tree": {"kind": "tree", "files": 30_000, "dirs": 3000, "depth": 14, "links": 150,
             "empty_dirs": 30, "seed": 6,
             "large": [64 * MiB, 32 * MiB, 16 * MiB, 8 * MiB, 8 * MiB, 4 * MiB, 4 * MiB,
                       2 * MiB, 2 * MiB, 1 * MiB, 1 * MiB, 1 * MiB]},
}
SMOKE = {
    "small": {"kind": "flat", "files": 50, "size": 4 * KiB, "dirs": 5, "seed": 1},
    "many": {"kind": "flat", "files": 200, "size": 1 * KiB, "dirs": 20, "seed": 2},
    "wide": {"kind": "flat", "files": 300, "size": 0, "dirs": 0, "seed": 3},
    "mixed": {"kind": "flat", "files": 8, "size": 256 * KiB, "dirs": 2, "seed": 4},
    "big": {"kind": "big", "size": 16 * MiB + 12345, "seed": 5},
    "tree": {"kind": "tree", "files": 80, "dirs": 15, "depth": 6, "links": 4, "empty_dirs": 2,
             "seed": 6, "large": [512 * KiB, 300_000]},
}
WORKLOADS = list(FULL)
SCENARIOS = ["copy", "noop", "touch", "ls"]
SCENARIO_TITLE = {
    "copy": "first copy into a fresh target",
    "noop": "no-op re-sync (target already equal)",
    "touch": "re-sync after 1% of files changed",
    "ls": "recursive listing (size + mtime)",
}
# name -> (kind, scenarios)
TOOLS = {
    "ferry": ("ferry", {"copy", "noop", "touch", "ls"}),
    # ferry and rsync keeping hard links, ACLs and extended attributes: their cost
    "ferry-hax": ("ferry", {"copy", "noop", "touch"}),
    "rsync": ("peer", {"copy", "noop", "touch"}),
    "rsync-hax": ("peer", {"copy", "noop", "touch"}),
    "rclone": ("peer", {"copy", "noop", "touch", "ls"}),
    "rclone32": ("peer", {"copy", "noop", "touch"}),
    "cp": ("peer", {"copy"}),
    "tar": ("peer", {"copy"}),
    "find": ("peer", {"ls"}),
    "ls": ("peer", {"ls"}),
    "fd": ("peer", {"ls"}),
    "floor": ("floor", {"copy", "noop", "touch", "ls"}),
    "floor1": ("floor", {"copy", "noop", "touch", "ls"}),
    # another ferry binary (--base PATH), side by side with this one: regressions
    "ferry-base": ("peer", {"copy", "noop", "touch", "ls"}),
}
# listing tools that print names only (no stat per entry): shown, but not the "best peer"
NAMES_ONLY = {"ls": "prints names only (no stat per entry); not counted as best peer",
              "fd": "prints names only (no stat per entry); not counted as best peer"}
FLOORS = ["floor_ls", "floor_copy", "floor_big", "floor_stat", "runtool"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def human_bytes(n):
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= div:
            v = n / div
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def describe(spec):
    if spec["kind"] == "flat":
        where = "one directory" if spec["dirs"] == 0 else f"{spec['dirs']:,} directories"
        size = "empty" if spec["size"] == 0 else human_bytes(spec["size"])
        return f"{spec['files']:,} files × {size} in {where}"
    if spec["kind"] == "big":
        return f"one file of {human_bytes(spec['size'])}"
    return (f"source-tree-like: {spec['files']:,} files mostly < 16 KiB plus {len(spec['large'])} "
            f"large ({human_bytes(sum(spec['large']))}), {spec['dirs']:,} directories up to "
            f"{spec['depth']} deep, {spec['links']} symlinks, {spec['empty_dirs']} empty dirs")


# --------------------------------------------------------------------------- generation

WORDS = ("src lib core util net io fs test tests docs api internal cmd pkg include common config "
         "model view server client proto build scripts assets vendor examples bench tools data "
         "parser codegen runtime sync store cache index http").split()
EXTS = ".rs .c .h .py .go .js .ts .md .json .toml .txt .yml .sh .html .css".split()


class Writer:
    """Creates files with seeded content and fixed mtimes."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.pool = memoryview(self.rng.randbytes(POOL_SIZE))

    def mtime(self):
        return MTIME_BASE + self.rng.randrange(0, 30 * 86400 * 10**9)

    def file(self, dirfd, name, size, mode=0o644):
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode, dir_fd=dirfd)
        left = size
        while left > 0:
            n = min(left, MiB)
            off = self.rng.randrange(0, POOL_SIZE - n + 1)
            chunk = self.pool[off:off + n]
            while chunk:
                w = os.write(fd, chunk)
                chunk = chunk[w:]
            left -= n
        os.fchmod(fd, mode)
        m = self.mtime()
        os.utime(fd, ns=(m, m))
        os.close(fd)


def set_dir_mtimes(root, rel_dirs, w):
    for rel in sorted(rel_dirs, key=lambda p: -p.count("/") - (1 if p else 0)):
        m = w.mtime()
        os.utime(os.path.join(root, rel) if rel else root, ns=(m, m))


def gen_flat(root, spec):
    w = Writer(spec["seed"])
    dirs = [""] if spec["dirs"] == 0 else [f"d{i:04d}" for i in range(spec["dirs"])]
    per = -(-spec["files"] // len(dirs))
    fds = {}
    for d in dirs:
        if d:
            os.mkdir(os.path.join(root, d))
        fds[d] = os.open(os.path.join(root, d) if d else root, os.O_RDONLY | os.O_DIRECTORY)
    for i in range(spec["files"]):
        w.file(fds[dirs[i // per]], f"f{i:06d}", spec["size"])
        if i and i % 100_000 == 0:
            log(f"    {i:,} files")
    for fd in fds.values():
        os.close(fd)
    set_dir_mtimes(root, [d for d in dirs if d] + [""], w)


def gen_big(root, spec):
    w = Writer(spec["seed"])
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    w.file(fd, "big.bin", spec["size"])
    os.close(fd)
    set_dir_mtimes(root, [""], w)


def gen_tree(root, spec):
    w = Writer(spec["seed"])
    rng = w.rng
    dirs, children, depth = [""], {"": set()}, {"": 0}

    def newdir(parent, base):
        name, n = base, 2
        while name in children[parent]:
            name, n = f"{base}{n}", n + 1
        children[parent].add(name)
        path = f"{parent}/{name}" if parent else name
        os.mkdir(os.path.join(root, path))
        children[path] = set()
        depth[path] = depth[parent] + 1
        return path

    while len(dirs) < spec["dirs"] + 1:
        parent = rng.choice(dirs[-40:]) if rng.random() < 0.6 else rng.choice(dirs)
        if depth[parent] >= spec["depth"]:
            continue
        dirs.append(newdir(parent, rng.choice(WORDS)))
    empties = [newdir(rng.choice(dirs), f"empty{k}") for k in range(spec["empty_dirs"])]
    fds = {d: os.open(os.path.join(root, d) if d else root, os.O_RDONLY | os.O_DIRECTORY) for d in dirs}
    files = []
    for i in range(spec["files"]):
        d = rng.choice(dirs)
        stem = f"{rng.choice(WORDS)}_{i}"
        if i % 997 == 5:
            name = f"with space {i}.txt"
        elif i % 1499 == 7:
            name = f"ünïcødé_{i}.md"
        elif i % 50 == 3:
            name = f".{stem}"
        else:
            name = stem + rng.choice(EXTS)
        r = rng.random()
        size = 0 if r < 0.02 else min(16 * KiB - 1, int(rng.lognormvariate(7.8, 1.1)))
        mode = 0o755 if rng.random() < 0.03 else 0o644
        w.file(fds[d], name, size, mode)
        files.append((d, name))
    for k, size in enumerate(spec["large"]):
        w.file(fds[rng.choice(dirs)], f"blob_{k}.bin", size)
    for k in range(spec["links"]):
        d, name = rng.choice(files)
        target = name if rng.random() < 0.7 else f"../{os.path.basename(d) or 'x'}/{name}"
        if k == 0:
            target = "does/not/exist"
        lname = f"link_{k}"
        os.symlink(target, lname, dir_fd=fds[d])
        m = w.mtime()
        os.utime(lname, ns=(m, m), dir_fd=fds[d], follow_symlinks=False)
    for fd in fds.values():
        os.close(fd)
    set_dir_mtimes(root, dirs[1:] + empties + [""], w)


def scan(root):
    """Sorted (relpath, kind, size) of every entry below root."""
    out = []

    def walk(rel):
        path = os.path.join(root, rel) if rel else root
        with os.scandir(path) as it:
            ents = sorted(it, key=lambda e: e.name)
        for e in ents:
            p = f"{rel}/{e.name}" if rel else e.name
            st = e.stat(follow_symlinks=False)
            if e.is_symlink():
                out.append((p, "link", st.st_size))
            elif e.is_dir(follow_symlinks=False):
                out.append((p, "dir", 0))
                walk(p)
            else:
                out.append((p, "file", st.st_size))

    walk("")
    return out


def manifest(root):
    ents = scan(root)
    files = [e for e in ents if e[1] == "file"]
    return {
        "entries": len(ents),
        "files": len(files),
        "dirs": sum(1 for e in ents if e[1] == "dir"),
        "links": sum(1 for e in ents if e[1] == "link"),
        "bytes": sum(e[2] for e in files),
        "disk_bytes": sum(-(-e[2] // 4096) * 4096 for e in files) + 4096 * (len(ents) - len(files) + 1)
        + 64 * len(ents),
    }


def spec_hash(spec):
    return hashlib.sha256(json.dumps([GEN_VERSION, spec], sort_keys=True).encode()).hexdigest()[:16]


def ensure_workload(ctx, name, spec):
    src = os.path.join(ctx.root, "src", name)
    meta_path = src + ".json"
    h = spec_hash(spec)
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        if meta.get("hash") == h and os.path.isdir(src):
            return src, meta["manifest"]
    except (OSError, ValueError):
        pass
    for p in (src, src + ".tmp"):
        if os.path.lexists(p):
            ctx.trash(p)
    if os.path.exists(meta_path):
        os.unlink(meta_path)
    log(f"  generating {name}: {describe(spec)}")
    t = time.time()
    tmp = src + ".tmp"
    os.makedirs(tmp)
    {"flat": gen_flat, "big": gen_big, "tree": gen_tree}[spec["kind"]](tmp, spec)
    os.rename(tmp, src)
    man = manifest(src)
    with open(meta_path, "w") as f:
        json.dump({"hash": h, "spec": spec, "manifest": man}, f)
    log(f"  generated {name} in {time.time() - t:.1f} s: {man}")
    return src, man


# --------------------------------------------------------------------------- running


class Ctx:
    pass


def measure(ctx, argv, env, errpath, timeout, stdout="/dev/null"):
    """Run argv under the runtool launcher (fork + wait4 in a small C parent)."""
    res = os.path.join(ctx.root, "logs", "runtool.out")
    fa = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
          (os.POSIX_SPAWN_OPEN, 1, stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
          (os.POSIX_SPAWN_OPEN, 2, errpath, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)]
    if os.path.exists(res):
        os.unlink(res)
    pid = os.posix_spawn(ctx.bin["runtool"], [ctx.bin["runtool"], res, str(timeout)] + argv, env,
                         file_actions=fa)
    ctx.running = pid
    try:
        _, status = os.waitpid(pid, 0)
    except BaseException:
        os.kill(pid, signal.SIGTERM)  # runtool kills the tool's process group
        os.waitpid(pid, 0)
        raise
    finally:
        ctx.running = None
    try:
        with open(res) as f:
            wall, ut, st, rss, wst, killed = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return {"wall": 0, "cpu": 0, "rss": 0, "rc": 127, "timeout": False}
    return {"wall": wall / 1e9, "cpu": (ut + st) / 1e6, "rss": rss * 1024,
            "rc": os.waitstatus_to_exitcode(wst), "timeout": bool(killed)}


def tail_of(path, n=400):
    try:
        with open(path, "rb") as f:
            data = f.read()
        return data[-n:].decode(errors="replace").strip().replace("\n", " | ")
    except OSError:
        return ""


def compare(ctx, src, dst):
    """floor_stat SRC DST -> dict of difference counts."""
    r = subprocess.run([ctx.bin["floor_stat"], src, dst, str(NPROC)], capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr.strip() or f"floor_stat exit {r.returncode}"}
    return {k: int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", r.stdout)}


def verdict(diff, strict):
    """(ok, notes) for a compare() result."""
    if "error" in diff:
        return False, [diff["error"]]
    bad = [f"{k}={diff[k]}" for k in ("missing", "extra", "differ") if diff.get(k)]
    notes = []
    if diff.get("modediff"):
        (bad if strict else notes).append(f"permission bits not kept ({diff['modediff']} entries)")
    if diff.get("dirmeta"):
        (bad if strict else notes).append(f"directory mtimes not kept ({diff['dirmeta']} dirs)")
    return not bad, bad + notes if bad else notes


def content_diff(src, dst):
    r = subprocess.run(["diff", "-r", "-q", "--no-dereference", src, dst], capture_output=True, text=True)
    return r.returncode == 0, (r.stdout + r.stderr).strip()[:300]


def tool_cmd(ctx, tool, scenario, wname, src, dst):
    """(argv, env, pre) or None when the tool does not apply."""
    b = ctx.bin
    env = ctx.env
    if scenario == "ls":
        return {
            "ferry": [ctx.ferry, "ls", src],
            "ferry-base": [ctx.base, "ls", src],
            "find": ["find", src, "-printf", "%s %T@ %p\n"],
            "ls": ["ls", "-fR", src],
            "fd": [ctx.fd, "-u", ".", src],
            "rclone": ["rclone", "lsf", "-R", "--links", "--format", "spt", src],
            "floor": [b["floor_ls"], "-p", src, str(NPROC)],
            "floor1": [b["floor_ls"], "-p", src, "1"],
        }[tool], env, None
    if tool == "ferry":
        return [ctx.ferry, "sync", src, dst], env, None
    if tool == "ferry-hax":
        return [ctx.ferry, "sync", "-H", "-A", "-X", src, dst], env, None
    if tool == "ferry-base":
        return [ctx.base, "sync", src, dst], env, None
    if tool == "rsync":
        return ["rsync", "-a", "--delete", src + "/", dst + "/"], env, None
    if tool == "rsync-hax":
        return ["rsync", "-aHAX", "--delete", src + "/", dst + "/"], env, None
    if tool in ("rclone", "rclone32"):
        argv = ["rclone", "sync", "--links", "--create-empty-src-dirs", src, dst]
        if tool == "rclone32":
            argv[2:2] = ["--transfers", "32", "--checkers", "32"]
        return argv, env, None
    if tool == "cp":
        return ["cp", "-a", src, dst], env, None
    if tool == "tar":
        return (["sh", "-c", 'mkdir "$2" && tar -C "$1" --format=posix -cf - . | tar -C "$2" -xf -', "sh", src, dst],
                env, None)
    threads = str(NPROC) if tool == "floor" else "1"
    if scenario == "copy":
        if wname == "big":
            if tool == "floor1":
                return None
            return ([b["floor_big"], os.path.join(src, "big.bin"), os.path.join(dst, "big.bin")], env,
                    lambda: os.mkdir(dst))
        return [b["floor_copy"], src, dst, threads], env, None
    if scenario == "noop":
        return [b["floor_stat"], src, dst, threads], env, None
    return [b["floor_stat"], "-u", src, dst, threads], env, None


def show_cmd(ctx, tool, scenario, wname):
    argv = tool_cmd(ctx, tool, scenario, wname, "SRC", "DST")[0]
    out = []
    for a in argv:
        if a in ctx.bin.values():
            a = os.path.basename(a)
        a = a.replace(REPO + "/", "").replace("\n", "\\n")
        out.append(a if re.fullmatch(r"[\w./=,:+-]+", a) else "'" + a.replace("'", "'\\''") + "'")
    return " ".join(out)


class Group:
    """Results of one workload + scenario."""

    def __init__(self, wname, scenario):
        self.wname, self.scenario = wname, scenario
        self.res = {}  # tool -> dict
        self.skipped = {}  # tool -> reason
        self.note = ""
        self.date = ""  # set when the group was measured by an earlier run of the bench
        self.cmdline = ""

    def r(self, tool):
        return self.res.setdefault(tool, {"wall": [], "cpu": [], "rss": [], "other": [], "fail": None,
                                          "notes": [], "syscalls": None, "cmd": ""})

    def to_json(self):
        return {"wname": self.wname, "scenario": self.scenario, "res": self.res, "skipped": self.skipped,
                "note": self.note}

    @classmethod
    def from_json(cls, d):
        g = cls(d["wname"], d["scenario"])
        g.res, g.skipped, g.note = d["res"], d["skipped"], d["note"]
        return g


def save_group(ctx, g, info):
    """Keep a group's results so that later partial runs still report it."""
    d = os.path.join(ctx.root, "results")
    os.makedirs(d, exist_ok=True)
    rec = {"group": g.to_json(), "hash": spec_hash(ctx.specs[g.wname]), "spec": ctx.specs[g.wname],
           "manifest": ctx.manifests[g.wname], "date": info["date"],
           "cmdline": " ".join(ctx.argv_shown)}
    tmp = os.path.join(d, f".{g.wname}.{g.scenario}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.replace(tmp, os.path.join(d, f"{g.wname}.{g.scenario}.json"))


def all_groups(ctx, groups, specs):
    """This run's groups plus the stored ones of other workloads/scenarios (same data only)."""
    mine = {(g.wname, g.scenario): g for g in groups}
    out = []
    for w in WORKLOADS:
        for sc in SCENARIOS:
            if (w, sc) in mine:
                out.append(mine[(w, sc)])
                continue
            if ctx.args.fresh_report:
                continue
            try:
                with open(os.path.join(ctx.root, "results", f"{w}.{sc}.json")) as f:
                    rec = json.load(f)
            except (OSError, ValueError):
                continue
            if rec.get("hash") != spec_hash(specs[w]):
                continue
            g = Group.from_json(rec["group"])
            g.date, g.cmdline = rec["date"], rec["cmdline"]
            ctx.specs.setdefault(w, rec["spec"])
            ctx.manifests.setdefault(w, rec["manifest"])
            out.append(g)
    return out



def ensure_space(ctx, man):
    need_inodes = man["entries"] + 100 + ctx.reserve_inodes
    need_bytes = man["disk_bytes"] + ctx.reserve_bytes
    st = os.statvfs(ctx.root)
    if st.f_favail >= need_inodes and st.f_bavail * st.f_frsize >= need_bytes:
        return True
    ctx.purge("to make room during a copy group")
    st = os.statvfs(ctx.root)
    return st.f_favail >= need_inodes and st.f_bavail * st.f_frsize >= need_bytes


def run_timed(ctx, g, tool, argv, env, pre, dst_for_verify, src, strict, content):
    """One timed run + verification; returns False when the tool failed."""
    r = g.r(tool)
    if pre:
        pre()
    if ctx.args.wait_idle and sum(ctx.idle_waits) < ctx.args.wait_idle_total * 60:
        ctx.idle_waits.append(wait_idle(ctx.args.wait_idle))
    os.sync()
    errf = os.path.join(ctx.root, "logs", f"{g.wname}.{g.scenario}.{tool}.err")
    b0 = cpu_busy()
    m = measure(ctx, argv, env, errf, ctx.args.timeout)
    b1 = cpu_busy()
    # CPU used by everything else on the machine while the tool ran, in cores
    # (/proc/stat counts in clock ticks: meaningless for runs shorter than ~0.25 s)
    other = max(0.0, (b1 - b0) - m["cpu"]) / m["wall"] if m["wall"] >= 0.25 else None
    if m["timeout"]:
        r["fail"] = f"killed after {ctx.args.timeout} s"
        return False
    if m["rc"] != 0:
        r["fail"] = f"exit {m['rc']}: {tail_of(errf)}"
        return False
    if dst_for_verify:
        ok, notes = verdict(compare(ctx, src, dst_for_verify), strict)
        if ok and content:
            ok, d = content_diff(src, dst_for_verify)
            if not ok:
                notes = [f"content differs: {d}"]
        if not ok:
            r["fail"] = "wrong result: " + "; ".join(notes)
            return False
        for n in notes:
            if n not in r["notes"]:
                r["notes"].append(n)
    r["wall"].append(m["wall"])
    r["cpu"].append(m["cpu"])
    r["rss"].append(m["rss"])
    if other is not None:
        r["other"].append(other)
    return True


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_busy():
    """Busy CPU seconds of the whole machine since boot (all cores, steal included)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / CLK_TCK


def wait_idle(limit):
    """Wait (at most `limit` s) until the machine is nearly idle; returns the seconds waited."""
    t0 = time.time()
    while True:
        b0 = cpu_busy()
        time.sleep(0.5)
        if (cpu_busy() - b0) / 0.5 < 0.15 * NPROC or time.time() - t0 >= limit:
            return time.time() - t0


def run_strace(ctx, g, tool, argv, env, pre):
    if pre:
        pre()
    os.sync()
    out = os.path.join(ctx.root, "logs", f"{g.wname}.{g.scenario}.{tool}.strace")
    errf = out + ".err"
    walls = g.r(tool)["wall"]
    limit = min(ctx.args.timeout, max(60.0, 20 * statistics.median(walls))) if walls else ctx.args.timeout
    m = measure(ctx, ["strace", "-c", "-f", "-o", out, "--"] + argv, env, errf, limit)
    if m["timeout"] or m["rc"] != 0:
        return
    try:
        with open(out) as f:
            for line in f:
                p = line.split()
                if p and p[-1] == "total" and len(p) >= 5:
                    g.r(tool)["syscalls"] = int(p[3])
    except (OSError, ValueError):
        pass


def repair(ctx, src, dst):
    """Bring dst back to an exact copy of src (after a tool left it different), untimed."""
    if shutil.which("rsync"):
        subprocess.run(["rsync", "-a", "--delete", src + "/", dst + "/"], check=False)
    else:
        subprocess.run([ctx.bin["floor_stat"], "-u", src, dst], capture_output=True, check=False)
    d = compare(ctx, src, dst)
    return verdict(d, True)[0]


def mutate(tsrc, chosen, version):
    """Change the chosen files: first 4 KiB rewritten (size kept), new mtime."""
    rng = random.Random(version)
    for i, (rel, size) in enumerate(chosen):
        p = os.path.join(tsrc, rel)
        if size:
            n = min(size, 4 * KiB)
            with open(p, "r+b") as f:
                f.write(rng.randbytes(n))
        m = TOUCH_BASE + version * 10**9 + i
        os.utime(p, ns=(m, m))


def group_tools(ctx, scenario, wname):
    out = []
    for t in ctx.tools:
        if scenario not in TOOLS[t][1]:
            continue
        if t in ctx.missing:
            continue
        if tool_cmd(ctx, t, scenario, wname, "S", "D") is None:
            continue
        out.append(t)
    return out


def run_group(ctx, wname, scenario, src, man):
    g = Group(wname, scenario)
    ctx.current = g
    for t in ctx.tools:
        if scenario in TOOLS[t][1] and t in ctx.missing:
            g.skipped[t] = ctx.missing[t]
    tools = group_tools(ctx, scenario, wname)
    runs, do_strace = ctx.args.runs, ctx.strace
    if ctx.over_budget():
        runs, do_strace = 1, False
        g.note = f"time budget of {ctx.args.budget} min used up: 1 run, no strace"
    base = os.path.join(ctx.root, "dst", wname, scenario)
    os.makedirs(base, exist_ok=True)
    smoke = ctx.args.smoke
    failed = set()
    log(f"  {wname}/{scenario}: {', '.join(tools)} x {runs}")

    def strict(t):  # peers and floors may leave other permission bits / directory mtimes (noted)
        return TOOLS[t][0] == "ferry"

    def content(t, first):
        return smoke or (t == "ferry" and first)

    def fresh(label):  # a name no earlier (or killed) run can have used
        while True:
            ctx.seq += 1
            p = os.path.join(base, f"{label}.{os.getpid()}.{ctx.seq}")
            if not os.path.lexists(p):
                return p

    if scenario == "copy":
        for run in range(runs):
            for t in rotate(tools, run):
                if t in failed:
                    continue
                dst = fresh(t)
                if not ensure_space(ctx, man):
                    g.r(t)["fail"] = "not enough free space or inodes"
                    failed.add(t)
                    continue
                argv, env, pre = tool_cmd(ctx, t, scenario, wname, src, dst)
                g.r(t)["cmd"] = show_cmd(ctx, t, scenario, wname)
                if not run_timed(ctx, g, t, argv, env, pre, dst, src, strict(t), content(t, run == 0)):
                    failed.add(t)
                ctx.trash(dst)  # deleted at the end (or when room runs out): see purge()
        for t in tools:
            if traced(ctx, t) and t not in failed:
                dst = fresh(t + "-strace")
                if ensure_space(ctx, man):
                    argv, env, pre = tool_cmd(ctx, t, scenario, wname, src, dst)
                    run_strace(ctx, g, t, argv, env, pre)
                ctx.trash(dst)
        # Not deleted here: the root ext4 of these VMs has no journal, so inodes freed
        # within the last minute are not reused and the next group's allocations would
        # scan past every one of them (bench/LOG.md, "Why small-file runs on this machine
        # swing"). The trash goes at the end, or earlier only when room runs out
        # (ensure_space, then settle_fs).
    elif scenario in ("noop", "touch"):
        state, tsrc, dst = cached_pair(ctx, wname, scenario, src, man)
        if state is None:
            g.note = "not enough free space or inodes"
            return g
        if scenario == "touch":
            files = [(p, s) for p, k, s in scan(tsrc) if k == "file"]
            chosen = random.Random(hash_int(wname)).sample(files, max(1, len(files) // 100))
            chosen.sort()
            g.note = (g.note + "; " if g.note else "") + f"{len(chosen):,} of {len(files):,} files changed per run"
        passes = [(run, False) for run in range(runs)] + ([(0, True)] if do_strace else [])
        for run, under_strace in passes:
            for t in rotate(tools, run):
                if t in failed or (under_strace and not traced(ctx, t)):
                    continue
                argv, env, pre = tool_cmd(ctx, t, scenario, wname, tsrc, dst)
                g.r(t)["cmd"] = show_cmd(ctx, t, scenario, wname)
                if scenario == "touch":
                    state["version"] += 1
                    save_state(state)
                    mutate(tsrc, chosen, state["version"])
                if under_strace:
                    run_strace(ctx, g, t, argv, env, pre)
                    ok = True
                else:
                    ok = run_timed(ctx, g, t, argv, env, pre, dst, tsrc, strict(t), smoke)
                    if not ok:
                        failed.add(t)
                d = compare(ctx, tsrc, dst)
                if not verdict(d, True)[0] and not repair(ctx, tsrc, dst):
                    g.note = (g.note + "; " if g.note else "") + f"could not restore the target after {t}"
                    failed.update(tools)
                    state["ok"] = False
                    save_state(state)
    else:  # ls
        for run in range(runs):
            for t in rotate(tools, run):
                if t in failed:
                    continue
                argv, env, pre = tool_cmd(ctx, t, scenario, wname, src, None)
                g.r(t)["cmd"] = show_cmd(ctx, t, scenario, wname)
                if not run_timed(ctx, g, t, argv, env, pre, None, src, False, False):
                    failed.add(t)
        if "ferry" in tools and "ferry" not in failed and (smoke or ctx.args.check_ls):
            problem = check_ferry_ls(ctx, src)
            if problem:
                g.r("ferry")["fail"] = "wrong output: " + problem
        if do_strace:
            for t in tools:
                if t not in failed and traced(ctx, t):
                    argv, env, pre = tool_cmd(ctx, t, scenario, wname, src, None)
                    run_strace(ctx, g, t, argv, env, pre)
    return g


def traced(ctx, t):
    """Counted with strace? (smoke mode: only ferry and the floors, to stay fast)"""
    return ctx.strace and not ctx.over_budget() and (not ctx.args.smoke or TOOLS[t][0] != "peer")


def settle_fs(ctx):
    """After a mass delete: wait until creating files is as fast as it was before.

    On ext4 mounted with `discard` (these VMs), deleting files whose data reached the disk
    costs ~0.1-1 ms per file and file creation stays several times slower for up to a
    minute after. The probe copies a 500-file tree with floor_copy and is compared with the
    fastest probe seen; returns the seconds waited (at most --settle)."""
    if not ctx.args.settle:
        return 0.0
    t0 = time.time()
    while True:
        os.sync()
        ctx.seq += 1
        d = os.path.join(ctx.root, "probe", f"copy.{os.getpid()}.{ctx.seq}")
        t = time.perf_counter()
        subprocess.run([ctx.bin["floor_copy"], ctx.probe_src, d, "1"], stdout=subprocess.DEVNULL, check=False)
        el = time.perf_counter() - t
        subprocess.run(["rm", "-rf", d], check=False)
        ctx.probe_best = min(ctx.probe_best, el)
        if el <= 1.5 * ctx.probe_best + 0.005 or time.time() - t0 >= ctx.args.settle:
            return time.time() - t0
        time.sleep(3)


def make_probe(ctx):
    """The small tree settle_fs() copies, and its baseline speed."""
    ctx.probe_src = os.path.join(ctx.root, "probe", "src")
    if not os.path.isdir(ctx.probe_src):
        tmp = ctx.probe_src + f".tmp{os.getpid()}"
        os.makedirs(tmp)
        gen_flat(tmp, {"kind": "flat", "files": 500, "size": 4 * KiB, "dirs": 5, "seed": 99})
        os.rename(tmp, ctx.probe_src)
    ctx.probe_best = float("inf")
    if ctx.args.settle:
        for _ in range(3):
            ctx.seq += 1
            d = os.path.join(ctx.root, "probe", f"copy.{os.getpid()}.{ctx.seq}")
            os.sync()
            t = time.perf_counter()
            subprocess.run([ctx.bin["floor_copy"], ctx.probe_src, d, "1"], stdout=subprocess.DEVNULL, check=False)
            ctx.probe_best = min(ctx.probe_best, time.perf_counter() - t)
            subprocess.run(["rm", "-rf", d], check=False)


def save_state(state):
    with open(state["path"], "w") as f:
        json.dump({k: v for k, v in state.items() if k != "path"}, f)


def cached_pair(ctx, wname, scenario, src, man):
    """(state, source, target) for a re-sync scenario, kept between runs of the bench.

    noop re-syncs SRC into a kept copy; touch works on a kept copy of SRC (whose files get
    changed) and a kept target. Both are made once with floor_copy and reused while they
    still compare equal, so they are not deleted and recreated (see settle_fs())."""
    base = os.path.join(ctx.root, "cache", wname)
    os.makedirs(base, exist_ok=True)
    path = os.path.join(base, f"{scenario}.json")
    h = spec_hash(ctx.specs[wname])
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError):
        state = {}
    state["path"] = path
    tsrc = os.path.join(base, "touch-src") if scenario == "touch" else src
    dst = os.path.join(base, f"{scenario}-dst")
    if state.get("hash") == h and state.get("ok") and os.path.isdir(dst) and os.path.isdir(tsrc):
        if verdict(compare(ctx, tsrc, dst), True)[0]:
            return state, tsrc, dst
    if not ensure_space(ctx, man if scenario == "noop" else double(man)):
        return None, None, None
    for p in ([dst] + ([tsrc] if scenario == "touch" else [])):
        if os.path.lexists(p):
            ctx.trash(p)
    log(f"  preparing the {scenario} target")
    if scenario == "touch":
        run_floor_copy(ctx, src, tsrc)
    run_floor_copy(ctx, tsrc, dst)
    state = {"path": path, "hash": h, "ok": True, "version": state.get("version", 0)}
    save_state(state)
    os.sync()
    return state, tsrc, dst


def double(man):
    m = dict(man)
    m["entries"] *= 2
    m["disk_bytes"] *= 2
    return m


def hash_int(s):
    return int(hashlib.sha256(s.encode()).hexdigest()[:12], 16)


def rotate(lst, k):
    k %= max(1, len(lst))
    return lst[k:] + lst[:k]


def run_floor_copy(ctx, src, dst):
    subprocess.run([ctx.bin["floor_copy"], src, dst, str(NPROC)], check=True, stdout=subprocess.DEVNULL)


def check_ferry_ls(ctx, src):
    """`ferry ls` must print what floor_ls -p prints (a root line is tolerated)."""
    a = subprocess.run([ctx.ferry, "ls", src], capture_output=True)
    b = subprocess.run([ctx.bin["floor_ls"], "-p", src], capture_output=True)
    if a.returncode != 0:
        return f"exit {a.returncode}"
    got, want = set(a.stdout.splitlines()), set(b.stdout.splitlines())
    missing = want - got
    extra = got - want
    if missing or len(extra) > 1:
        sample = sorted(missing)[:2] + sorted(extra)[:2]
        return (f"{len(missing)} expected lines missing, {len(extra)} unexpected: "
                + " / ".join(s.decode(errors="replace") for s in sample))
    return ""


# --------------------------------------------------------------------------- environment


def build_floors(bindir):
    os.makedirs(bindir, exist_ok=True)
    out = {}
    srcdir = os.path.join(HERE, "floor")
    newest = max(os.path.getmtime(os.path.join(srcdir, f)) for f in os.listdir(srcdir))
    for name in FLOORS:
        exe = os.path.join(bindir, name)
        if not os.path.exists(exe) or os.path.getmtime(exe) < newest:
            tmp = f"{exe}.tmp{os.getpid()}"
            subprocess.run(["cc", "-O2", "-pthread", "-Wall", "-o", tmp, os.path.join(srcdir, name + ".c")],
                           check=True)
            os.rename(tmp, exe)
        out[name] = exe
    return out


def first_line(argv):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        s = (r.stdout or r.stderr).strip().splitlines()
        return s[0].strip() if s else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def machine_info(ctx):
    info = {}
    info["date"] = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info["cpu"] = f"{NPROC} × {cpu}"
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        info["memory"] = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError):
        info["memory"] = "?"
    info["kernel"] = platform.release()
    dev = os.stat(ctx.root).st_dev
    fs = "?"
    try:
        best = ""
        with open("/proc/mounts") as f:
            for line in f:
                p = line.split()
                mnt = p[1].replace("\\040", " ")
                if ctx.root.startswith(mnt.rstrip("/") + "/") and len(mnt) >= len(best):
                    try:
                        if os.stat(mnt).st_dev == dev:
                            best, fs = mnt, f"{p[2]} on {p[0]} ({p[3]})"
                    except OSError:
                        pass
    except OSError:
        pass
    info["filesystem"] = f"{fs}, work dir {ctx.root}"
    vers = {"ferry": first_line([ctx.ferry, "--version"]) if ctx.ferry_ok else "missing",
            "rsync": first_line(["rsync", "--version"]), "rclone": first_line(["rclone", "version"]),
            "cp": first_line(["cp", "--version"]), "tar": first_line(["tar", "--version"]),
            "find": first_line(["find", "--version"]), "ls": first_line(["ls", "--version"]),
            "fd": first_line([ctx.fd, "--version"]) if ctx.fd else "missing",
            "strace": first_line(["strace", "-V"]) if ctx.strace else "missing",
            "cc": first_line(["cc", "--version"]), "python": sys.version.split()[0]}
    if ctx.base:
        vers["ferry-base"] = f"{first_line([ctx.base, '--version'])} ({ctx.base})"
    info["versions"] = vers
    return info


# --------------------------------------------------------------------------- report


def fmt_s(x):
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 0.1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def summarize(g, man):
    """Rows with medians and ratios, in display order."""
    med = {t: statistics.median(r["wall"]) for t, r in g.res.items() if r["wall"] and not r["fail"]}
    floors = [v for t, v in med.items() if TOOLS[t][0] == "floor"]
    peers = [v for t, v in med.items() if TOOLS[t][0] == "peer" and t not in NAMES_ONLY]
    floor = min(floors) if floors else None
    best = min(peers) if peers else None
    rows = []
    order = sorted(g.res, key=lambda t: (t not in med, ["ferry", "peer", "floor"].index(TOOLS[t][0]),
                                         med.get(t, 0)))
    for t in order:
        r = g.res[t]
        row = {"tool": t, "fail": r["fail"], "notes": r["notes"], "cmd": r["cmd"], "kind": TOOLS[t][0]}
        if t in med:
            m = med[t]
            row.update(
                median=m, min=min(r["wall"]), max=max(r["wall"]), n=len(r["wall"]),
                x_floor=m / floor if floor else None, x_peer=m / best if best else None,
                cpu=statistics.median(r["cpu"]), rss=max(r["rss"]) / MiB,
                other=statistics.median(r["other"]) if r["other"] else None)
        row["syscalls"] = r["syscalls"]
        row["per_file"] = r["syscalls"] / max(1, man["files"]) if r["syscalls"] else None
        rows.append(row)
    return rows, floor, best


def tool_label(t):
    return {"floor": f"floor ({NPROC} threads)", "floor1": "floor (1 thread)", "rclone32": "rclone 32/32",
            "fd": "fd", "ls": "ls -fR"}.get(t, t)


def write_report(ctx, groups, info, final):
    groups = all_groups(ctx, groups, SMOKE if ctx.args.smoke else FULL)
    out = ctx.out
    chart_dir = ctx.chart_dir
    os.makedirs(chart_dir, exist_ok=True)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    L = []
    L.append("# ferry benchmarks")
    L.append("")
    L.append(f"Generated by `python3 bench/run.py {' '.join(ctx.argv_shown)}` on {info['date']}"
             + ("" if final else " (incomplete: still running or interrupted)") + ". Within each table all "
             "tools were measured side by side in one run; tables kept from an earlier run of the bench "
             "(with other `--workloads`/`--scenarios`) say so. `--fresh-report` drops those.")
    if ctx.args.smoke:
        L.append("")
        L.append("**Smoke mode**: tiny workloads and one run — these numbers check the harness, they "
                 "measure nothing.")
    L.append("")
    L.append("## Machine")
    L.append("")
    L.append("| | |")
    L.append("|---|---|")
    for k in ("cpu", "memory", "kernel", "filesystem"):
        L.append(f"| {k} | {info[k]} |")
    for k, v in info["versions"].items():
        L.append(f"| {k} | {v} |")
    L.append("")
    L.append("## Method")
    L.append("")
    L.append(f"- Each tool runs {ctx.args.runs} time(s) per workload and scenario, the tools alternating run by "
             "run (the order rotates each round); the table shows the median wall time and the range "
             "(min–max). Warm cache: the source is read once before a workload, and `sync` runs before "
             "every timed run so no tool pays for another's writeback.")
    L.append("- CPU = user + system seconds (median), peak RSS = the largest `ru_maxrss` of any run, both "
             "from `wait4()` (for the tar pipeline: the shell and both tars).")
    L.append("- syscalls: one extra run under `strace -c -f` per tool (not timed); syscalls/file divides "
             "by the number of regular files in the workload.")
    L.append("- × floor: median wall time divided by the faster floor program; × best peer: divided by the "
             "fastest of rsync, rclone, cp, tar (for listing: of find and rclone lsf, which stat every entry "
             "as ferry ls does). Lower is better.")
    L.append("- copy: into a target that does not exist yet, with a new name every run. Targets are only "
             "deleted after the copy runs of a workload (or when space runs out), never between two timed "
             "copies, and each such deletion is followed by a wait until a probe copy of 500 small files is "
             "back to its usual speed: on this disk (ext4 mounted with `discard`) deleting files whose data "
             "reached the disk costs ~0.1–1 ms per file and file creation stays several times slower for up "
             "to a minute after. noop: re-sync into a kept, equal copy. "
             "touch: before each run the same 1% of the files of a kept copy of the source get their "
             "first 4 KiB rewritten and a new mtime (sizes unchanged), then the tool re-syncs into a kept "
             "target. The kept copies are made once with floor_copy and reused by later runs of the bench "
             "while they still compare equal.")
    L.append("- Every result is checked with `floor_stat` (names, types, sizes, mtimes, symlink targets, "
             "permission bits, directory mtimes); a target that a peer left with other metadata is "
             "restored with rsync before the next run; ferry's first copy" + (" and every smoke copy" if ctx.args.smoke else "")
             + " is also compared byte for byte with `diff -r`.")
    L.append("- other load: CPU (in cores) that other processes used while the tool ran, median over the "
             "runs (from /proc/stat minus the tool's own CPU, so kernel writeback threads count too; – for "
             "runs under 0.25 s). Near 0 means the "
             "numbers are clean; "
             f"with {NPROC} cores, anything above ~0.2 means they are not."
             + (f" Before each timed run the bench waited up to {ctx.args.wait_idle:.0f} s for the machine to "
                "be idle." if ctx.args.wait_idle else ""))
    L.append("- Floor programs (bench/floor/*.c): the least syscall work for the job — `floor_copy` "
             "(getdents64, statx, openat, copy_file_range, futimens), `floor_big` (copy_file_range loop), "
             "`floor_stat` (both trees listed + statx'ed and compared: the no-op floor; with `-u` it "
             "also rewrites changed files via temp + rename: the touch floor), `floor_ls -p` (getdents64 + "
             "statx, prints `SIZE MTIME_NS PATH` like `ferry ls`).")
    if ctx.idle_waits:
        waited = [w for w in ctx.idle_waits if w > 0.6]
        if sum(ctx.idle_waits) >= ctx.args.wait_idle_total * 60:
            L.append(f"- The bench stopped waiting for an idle machine after {ctx.args.wait_idle_total:.0f} min "
                     "of waiting; later runs started whatever the load.")
        if waited:
            L.append(f"- The machine was busy before {len(waited)} of {len(ctx.idle_waits)} timed runs; the bench "
                     f"waited {sum(waited):.0f} s in all for it to calm down"
                     + (f" and started {sum(1 for w in waited if w >= ctx.args.wait_idle)} run(s) anyway after "
                        f"{ctx.args.wait_idle:.0f} s." if any(w >= ctx.args.wait_idle for w in waited) else "."))
    if ctx.purges:
        L.append(f"- Old targets were deleted {len(ctx.purges)} time(s) during the run: "
                 f"{'; '.join(ctx.purges)}.")
    L.append("")
    L.append("Commands (SRC, DST stand for the workload's source and target):")
    L.append("")
    seen = {}
    for g in groups:
        for t, r in g.res.items():
            key = (t, "ls" if g.scenario == "ls" else "sync")
            if r["cmd"] and key not in seen:
                seen[key] = r["cmd"]
    for (t, kind), cmd in sorted(seen.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        L.append(f"- {tool_label(t)} ({kind}): `{cmd}`")
    by_w = {}
    for g in groups:
        by_w.setdefault(g.wname, []).append(g)
    for wname, gs in by_w.items():
        man = ctx.manifests[wname]
        L.append("")
        L.append(f"## {wname}: {describe(ctx.specs[wname])}")
        L.append("")
        L.append(f"{man['entries']:,} entries ({man['files']:,} files, {man['dirs']:,} dirs, {man['links']:,} "
                 f"symlinks), {human_bytes(man['bytes'])}.")
        chart = write_chart(ctx, wname, gs)
        if chart:
            L.append("")
            L.append(f"![{wname}: wall time ÷ floor]({os.path.relpath(chart, os.path.dirname(out) or '.')})")
        for g in gs:
            rows, floor, best = summarize(g, man)
            L.append("")
            L.append(f"### {wname} — {SCENARIO_TITLE[g.scenario]}")
            L.append("")
            if g.date:
                L.append(f"_From an earlier run: {g.date}, `python3 bench/run.py {g.cmdline}`._")
                L.append("")
            if g.note:
                L.append(f"_{g.note}_")
                L.append("")
            L.append("| tool | wall s, median (min–max) | × floor | × best peer | CPU s | peak RSS MiB "
                     "| syscalls | syscalls/file | other load |")
            L.append("|---|---|---|---|---|---|---|---|---|")
            notes = []
            for row in rows:
                name = tool_label(row["tool"])
                if row["kind"] == "ferry":
                    name = f"**{name}**"
                sc = f"{row['syscalls']:,}" if row["syscalls"] else "–"
                pf = f"{row['per_file']:.1f}" if row["per_file"] else "–"
                if row["fail"]:
                    L.append(f"| {name} | FAILED | | | | | {sc} | {pf} | |")
                    notes.append(f"{tool_label(row['tool'])} failed: {row['fail']}")
                    continue
                if "median" not in row:
                    continue
                rng_s = f"{fmt_s(row['median'])} ({fmt_s(row['min'])}–{fmt_s(row['max'])})"
                xf = f"{row['x_floor']:.2f}" if row["x_floor"] else "–"
                xp = f"{row['x_peer']:.2f}" if row["x_peer"] else "–"
                L.append(f"| {name} | {rng_s} | {xf} | {xp} | {fmt_s(row['cpu'])} | {row['rss']:.1f} | {sc} | {pf} "
                         f"| {'–' if row['other'] is None else format(row['other'], '.2f')} |")
                for n in row["notes"]:
                    notes.append(f"{tool_label(row['tool'])}: {n}")
            if g.scenario == "ls":
                for t in NAMES_ONLY:
                    if t in g.res:
                        notes.append(f"{tool_label(t)}: {NAMES_ONLY[t]}")
            for t, why in g.skipped.items():
                notes.append(f"{tool_label(t)} skipped: {why}")
            if notes:
                L.append("")
                for n in notes:
                    L.append(f"- {n}")
    L.append("")
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(L))
    os.replace(tmp, out)


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_chart(ctx, wname, gs):
    """Horizontal bars: wall time ÷ floor, log scale, one block per scenario."""
    import math
    blocks = []
    for g in gs:
        rows, floor, _ = summarize(g, ctx.manifests[wname])
        bars = [(r["tool"], r["x_floor"], r["median"]) for r in rows if r.get("x_floor") and not r["fail"]]
        fails = [r["tool"] for r in rows if r["fail"]]
        if bars or fails:
            blocks.append((g.scenario, bars, fails))
    if not blocks:
        return None
    vmax = max([b[1] for _, bars, _ in blocks for b in bars] + [2.0])
    top = 10 ** math.ceil(math.log10(vmax) + 1e-9)
    lo = 0.5
    label_w, plot_w, bar_h, gap = 150, 520, 18, 4
    x0 = label_w + 10

    def xpos(v):
        return x0 + plot_w * (math.log10(max(v, lo)) - math.log10(lo)) / (math.log10(top) - math.log10(lo))

    y = 66
    parts = []
    for scen, bars, fails in blocks:
        parts.append(f'<text x="10" y="{y + 12}" font-weight="bold">{esc(SCENARIO_TITLE[scen])}</text>')
        y += 20
        for tool, ratio, med in bars:
            kind = TOOLS[tool][0]
            color = {"ferry": "#e8590c", "floor": "#868e96", "peer": "#1c7ed6"}[kind]
            w = max(1.0, xpos(ratio) - x0)
            parts.append(f'<text x="{label_w}" y="{y + 13}" text-anchor="end">{esc(tool_label(tool))}</text>')
            parts.append(f'<rect x="{x0}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}"/>')
            parts.append(f'<text x="{x0 + w + 5:.1f}" y="{y + 13}">{ratio:.2f}× ({fmt_s(med)} s)</text>')
            y += bar_h + gap
        for tool in fails:
            parts.append(f'<text x="{label_w}" y="{y + 13}" text-anchor="end">{esc(tool_label(tool))}</text>')
            parts.append(f'<text x="{x0 + 5}" y="{y + 13}" fill="#c92a2a">failed</text>')
            y += bar_h + gap
        y += 12
    height = y + 10
    width = x0 + plot_w + 140
    grid = []
    ticks = [0.5] + [d * 10 ** e for e in range(0, 7) for d in (1, 2, 5) if d * 10 ** e <= top]
    for t in ticks:
        x = xpos(t)
        strong = t == 1
        grid.append(f'<line x1="{x:.1f}" y1="56" x2="{x:.1f}" y2="{height - 10}" stroke="{"#495057" if strong else "#dee2e6"}" '
                    f'stroke-width="{1.5 if strong else 1}"/>')
        grid.append(f'<text x="{x:.1f}" y="52" text-anchor="middle" fill="#495057">{t:g}×</text>')
    title = f"{wname}: {describe(ctx.specs[wname])}"
    width = max(width, 20 + 7 * len(title))
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="18" font-size="13" font-weight="bold">{esc(title)}</text>',
           '<text x="10" y="34" fill="#495057">wall time ÷ floor, median (log scale, lower is better); '
           'orange: ferry, blue: other tools, grey: floor programs</text>'] + grid + parts + ["</svg>"]
    path = os.path.join(ctx.chart_dir, f"{wname}.svg")
    with open(path, "w") as f:
        f.write("\n".join(svg) + "\n")
    return path


# --------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny workloads, 1 run, checks results; seconds")
    ap.add_argument("--runs", type=int, default=None, help="timed runs per tool (default 5, smoke 1)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--tools", default=None, help="default: all (smoke: all but rclone32)")
    ap.add_argument("--ferry", default=os.path.join(REPO, "target", "release", "ferry"))
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "ferry-bench"))
    ap.add_argument("--base", default=None, help="a second ferry binary, run side by side as tool ferry-base")
    ap.add_argument("--out", default=None, help="report (default bench/last-run.md; smoke: in the work dir)")
    ap.add_argument("--no-strace", action="store_true")
    ap.add_argument("--budget", type=float, default=150,
                    help="minutes; past it, remaining groups get 1 run and no strace (default 150)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per command (default 900)")
    ap.add_argument("--settle", type=float, default=None, help="after deleting old targets, wait up to this "
                    "many seconds for file creation to get back to speed (default 180, smoke 0)")
    ap.add_argument("--check-ls", action="store_true", help="compare `ferry ls` output with floor_ls (always in smoke)")
    ap.add_argument("--wait-idle", type=float, default=None,
                    help="before each timed run wait up to this many seconds for the machine to be idle "
                    "(default 30, smoke 0)")
    ap.add_argument("--wait-idle-total", type=float, default=20,
                    help="minutes: stop waiting for an idle machine once this much was spent (default 20)")
    ap.add_argument("--fresh-report", action="store_true",
                    help="report only this run (default: also tables of earlier runs for other workloads/scenarios)")
    ap.add_argument("--keep-going", action="store_true", help="exit 0 even if a tool failed")
    args = ap.parse_args()
    if args.runs is None:
        args.runs = 1 if args.smoke else 5
    if args.wait_idle is None:
        args.wait_idle = 0 if args.smoke else 30
    if args.settle is None:
        args.settle = 0 if args.smoke else 180
    ctx = Ctx()
    ctx.args = args
    ctx.start = time.time()
    ctx.argv_shown = [a for a in sys.argv[1:]]
    ctx.over_budget = lambda: args.budget > 0 and time.time() - ctx.start > args.budget * 60
    ctx.seq = 0
    ctx.purges = []
    ctx.running = None
    ctx.idle_waits = []
    ctx.env = dict(os.environ, RCLONE_CONFIG="/dev/null", LC_ALL="C")
    workloads = [w for w in args.workloads.split(",") if w]
    scenarios = [s for s in args.scenarios.split(",") if s]
    if args.tools is None:
        args.tools = ",".join(t for t in TOOLS if not (args.smoke and t == "rclone32")
                              and (t != "ferry-base" or args.base))
    ctx.tools = [t for t in args.tools.split(",") if t]
    for name, lst, known in (("workload", workloads, WORKLOADS), ("scenario", scenarios, SCENARIOS),
                             ("tool", ctx.tools, list(TOOLS))):
        bad = [x for x in lst if x not in known]
        if bad:
            ap.error(f"unknown {name} {','.join(bad)} (known: {','.join(known)})")
    if not shutil.which("cc"):
        log("bench: the C compiler `cc` is required")
        return 2
    ctx.ferry = os.path.abspath(args.ferry)
    ctx.ferry_ok = os.path.isfile(ctx.ferry) and os.access(ctx.ferry, os.X_OK)
    if "ferry" in ctx.tools and not ctx.ferry_ok:
        log(f"bench: ferry binary not found at {ctx.ferry} (build it with `cargo build --release`, or pass --ferry)")
        return 2
    ctx.base = os.path.abspath(args.base) if args.base else None
    if "ferry-base" in ctx.tools and not (ctx.base and os.access(ctx.base, os.X_OK)):
        log("bench: tool ferry-base needs --base PATH (an executable ferry)")
        return 2
    ctx.fd = shutil.which("fdfind") or shutil.which("fd")
    ctx.missing = {}
    for t, exe in (("rsync", "rsync"), ("rsync-hax", "rsync"), ("rclone", "rclone"), ("rclone32", "rclone"), ("cp", "cp"),
                   ("tar", "tar"), ("find", "find"), ("ls", "ls")):
        if not shutil.which(exe):
            ctx.missing[t] = f"`{exe}` not installed"
    if not ctx.fd:
        ctx.missing["fd"] = "`fd`/`fdfind` not installed"
    ctx.strace = bool(shutil.which("strace")) and not args.no_strace

    os.umask(0o022)
    workdir = os.path.abspath(args.workdir)
    ctx.root = os.path.join(workdir, "smoke" if args.smoke else "full")
    for sub in ("src", "dst", "logs"):
        os.makedirs(os.path.join(ctx.root, sub), exist_ok=True)
    lock = open(os.path.join(ctx.root, ".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        log(f"bench: waiting for another run using {ctx.root} ...")
        fcntl.flock(lock, fcntl.LOCK_EX)
    ctx.lock = lock
    ctx.bin = build_floors(os.path.join(workdir, "bin"))
    if args.out:
        ctx.out = os.path.abspath(args.out)
        # charts beside the report; bench/charts only for a report at the repo root
        in_repo = os.path.dirname(ctx.out) in (REPO, HERE)
        ctx.chart_dir = os.path.join(HERE, "charts") if in_repo else os.path.join(os.path.dirname(ctx.out), "charts")
    elif args.smoke:
        ctx.out = os.path.join(ctx.root, "BENCHMARKS.md")
        ctx.chart_dir = os.path.join(ctx.root, "charts")
    else:
        ctx.out = os.path.join(HERE, "last-run.md")
        ctx.chart_dir = os.path.join(HERE, "charts")
    st = os.statvfs(ctx.root)
    ctx.reserve_inodes = 0 if args.smoke else max(1_000_000, st.f_files // 10)
    ctx.reserve_bytes = 0 if args.smoke else max(10 * GiB, st.f_blocks * st.f_frsize // 10)

    trash_seq = [0]

    def trash(path):
        os.makedirs(os.path.join(ctx.root, "trash"), exist_ok=True)
        trash_seq[0] += 1
        if os.path.lexists(path):
            os.rename(path, os.path.join(ctx.root, "trash", f"{os.getpid()}.{trash_seq[0]}"))

    def purge(why, settle=True):
        olds = [os.path.join(ctx.root, n) for n in os.listdir(ctx.root) if n.startswith("trash")]
        olds = [p for p in olds if os.path.isdir(p) and os.listdir(p)]
        if not olds:
            return
        t = time.time()
        log(f"  deleting old targets ({why}) ...")
        for p in olds:
            subprocess.run(["rm", "-rf", p], stderr=subprocess.DEVNULL, check=False)
        os.sync()
        wait_writeback(120)
        took = time.time() - t
        rest = settle_fs(ctx) if settle else 0.0
        ctx.purges.append(f"{why}: {took:.0f} s" + (f", then {rest:.0f} s until file creation was back "
                                                    "to speed" if settle else ""))
        log(f"  ... took {took:.0f} s" + (f" + {rest:.0f} s to settle" if settle else ""))

    ctx.trash, ctx.purge = trash, purge
    make_probe(ctx)
    dst_root = os.path.join(ctx.root, "dst")
    for dirpath, dirnames, _ in os.walk(dst_root):
        if os.path.relpath(dirpath, dst_root).count(os.sep) == 1:  # dst/<workload>/<scenario>
            for n in dirnames:
                trash(os.path.join(dirpath, n))
            dirnames[:] = []
    purge("left over from an earlier run")

    specs = SMOKE if args.smoke else FULL
    ctx.specs = {w: specs[w] for w in workloads}
    ctx.manifests = {}
    srcs = {}
    log(f"bench: work dir {ctx.root}")
    for w in workloads:
        srcs[w], ctx.manifests[w] = ensure_workload(ctx, w, specs[w])
    purge("after generating the workloads")
    os.sync()
    info = machine_info(ctx)
    groups = []

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    try:
        for w in workloads:
            warm(ctx, srcs[w])
            for s in scenarios:
                g = run_group(ctx, w, s, srcs[w], ctx.manifests[w])
                groups.append(g)
                save_group(ctx, g, info)
                write_report(ctx, groups, info, final=False)
    except KeyboardInterrupt:
        log("bench: interrupted; the report keeps what was measured")
        g = getattr(ctx, "current", None)
        if g is not None and g not in groups and any(r["wall"] for r in g.res.values()):
            g.note = (g.note + "; " if g.note else "") + "interrupted: fewer runs than asked"
            groups.append(g)
            save_group(ctx, g, info)
        if groups:
            write_report(ctx, groups, info, final=False)
        for dirpath, dirnames, _ in os.walk(dst_root):  # the copy target of the interrupted run
            if os.path.relpath(dirpath, dst_root).count(os.sep) == 1:
                for n in dirnames:
                    subprocess.run(["rm", "-rf", os.path.join(dirpath, n)], check=False)
                dirnames[:] = []
        return 130
    write_report(ctx, groups, info, final=True)
    log(f"bench: report {ctx.out}, charts in {ctx.chart_dir}, {time.time() - ctx.start:.0f} s")

    # Old targets: deleted now in smoke mode (small), else in the background after we exit.
    trash_root = os.path.join(ctx.root, "trash")
    if os.path.isdir(trash_root):
        if args.smoke:
            shutil.rmtree(trash_root, ignore_errors=True)
        else:
            later = f"{trash_root}.{int(time.time())}"
            os.rename(trash_root, later)
            subprocess.Popen(["rm", "-rf", later], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            log(f"bench: deleting old targets in the background ({later})")

    failures = [(g.wname, g.scenario, t, r["fail"]) for g in groups for t, r in g.res.items() if r["fail"]]
    for f in failures:
        log("bench: FAILED %s/%s %s: %s" % f)
    ran = sum(len(r["wall"]) for g in groups for r in g.res.values())
    log(f"bench: {ran} timed runs, {len(failures)} failures")
    if failures and not args.keep_going:
        return 1
    return 0


def wait_writeback(limit):
    t = time.time()
    while time.time() - t < limit:
        try:
            with open("/proc/meminfo") as f:
                kb = sum(int(l.split()[1]) for l in f if l.startswith(("Dirty:", "Writeback:")))
        except OSError:
            return
        if kb < 32 * 1024:
            return
        time.sleep(0.5)


def warm(ctx, src):
    """Bring the source tree (metadata and data) into the page cache."""
    subprocess.run([ctx.bin["floor_ls"], src, str(NPROC)], stdout=subprocess.DEVNULL, check=False)
    for dirpath, _, files in os.walk(src):
        for n in files:
            p = os.path.join(dirpath, n)
            if os.path.islink(p):
                continue
            try:
                with open(p, "rb", buffering=0) as f:
                    while f.read(8 * MiB):
                        pass
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
