#!/usr/bin/env python3
"""Two-way sync benchmark: `ferry bisync` beside `rsync -a` (one-way, the reference for a
no-op), `rclone bisync` and `unison`, on 100,000 files x 1 KiB in 1,000 directories.

    python3 bench/bisync.py [--ferry PATH] [--workdir DIR] [--runs N] [--files N] [--dirs N]
                            [--tools ferry,rsync,rclone,unison] [--scenarios noop,change]
                            [--base OLD_FERRY] [--out FILE]

--base runs a second ferry binary as tool ferry-base, on its own pair of replicas and
journal, alternating with the others: a before/after measured side by side.

Exits 1 if a ferry run failed or ferry's replicas differ at the end (scripts/test runs it
on 1,000 files as a smoke test).

Scenarios (each tool has its own pair of replicas, made once with `ferry copy` and kept):
  noop    both replicas equal and already synced: the run finds nothing to do
  change  before each run 1% of the files change on EACH side (different files: the first
          bytes rewritten, size kept, new mtime), then the tool syncs them both ways
Tools alternate run by run; wall time, user+sys CPU from wait4(); the median and range of
--runs runs. One extra run of ferry per scenario under `strace -c -f` counts syscalls, to
show that the work beyond the scan is proportional to the changes.

Trees are generated once under --workdir (default: ferry-bisync-bench in the system temp
directory, $TMPDIR if set) and reused by later runs. Standard library only.
"""

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def timed(cmd, env=None):
    """Run cmd; return (wall s, cpu s, exit code, max RSS MiB)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        log(f"    {' '.join(cmd)} exited {code}: {err.strip()[-500:]}")
    return wall, ru.ru_utime + ru.ru_stime, code, ru.ru_maxrss / 1024


def gen(root, files, dirs, seed):
    rnd = random.Random(seed)
    per = files // dirs
    os.makedirs(root)
    for d in range(dirs):
        dp = os.path.join(root, f"d{d:04d}")
        os.mkdir(dp)
        for i in range(per):
            fp = os.path.join(dp, f"f{d * per + i:06d}")
            with open(fp, "wb") as f:
                f.write(rnd.randbytes(1024))
            t = 1_700_000_000 * 10**9 + rnd.randrange(0, 30 * 86400 * 10**9)
            os.utime(fp, ns=(t, t))


def change(root, paths, stamp):
    """Rewrite the first bytes of each file (size kept) and give it a new mtime."""
    for i, rel in enumerate(paths):
        p = os.path.join(root, rel)
        with open(p, "r+b") as f:
            f.write(f"changed {stamp} {i} ".encode())
        t = (1_750_000_000 + stamp) * 10**9 + i
        os.utime(p, ns=(t, t))


def strace_counts(cmd):
    out = subprocess.run(["strace", "-c", "-f", "-o", "/dev/stdout", "-qq"] + cmd,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    counts = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            name = parts[-1]
            calls = int(parts[3])
            counts[name] = calls
    return sum(counts.values()), counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferry", default=os.path.join(REPO, "target/release/ferry"))
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "ferry-bisync-bench"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--dirs", type=int, default=1000)
    ap.add_argument("--tools", default="ferry,rsync,rclone,unison")
    ap.add_argument("--scenarios", default="noop,change")
    ap.add_argument("--out", default=None)
    ap.add_argument("--base", default=None, help="a second ferry binary, run side by side as tool ferry-base")
    args = ap.parse_args()
    tools = [t for t in args.tools.split(",") if t]
    if args.base:
        tools.insert(tools.index("ferry") + 1 if "ferry" in tools else 0, "ferry-base")
    for t, exe in [("rclone", "rclone"), ("unison", "unison"), ("rsync", "rsync")]:
        if t in tools and shutil.which(exe) is None:
            log(f"{t}: not installed, skipped")
            tools.remove(t)
    w = os.path.abspath(args.workdir)
    os.makedirs(w, exist_ok=True)
    src = os.path.join(w, f"src-{args.files}")
    if not os.path.isdir(src):
        log(f"generating {args.files:,} files in {args.dirs:,} dirs")
        gen(src, args.files, args.dirs, 42)
    ferry = os.path.abspath(args.ferry)
    env = dict(os.environ, UNISON=os.path.join(w, "unison-home"),
               XDG_STATE_HOME=os.path.join(w, "state"))
    os.makedirs(env["UNISON"], exist_ok=True)

    # One pair per tool (rsync shares ferry's: it only reads and sets directory times).
    pairs = {}
    for t in tools:
        name = "ferry" if t == "rsync" else t
        a, b = os.path.join(w, f"{name}-a"), os.path.join(w, f"{name}-b")
        pairs[t] = (a, b)
        for r in (a, b):
            if not os.path.isdir(r):
                log(f"making {r}")
                subprocess.run([ferry, "copy", src, r], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    jpath = os.path.join(w, "ferry.sqlite")
    jbase = os.path.join(w, "ferry-base.sqlite")
    base = os.path.abspath(args.base) if args.base else None
    cmds = {
        "ferry": lambda a, b: [ferry, "bisync", "--journal", jpath, a, b],
        "ferry-base": lambda a, b: [base, "bisync", "--journal", jbase, a, b],
        "rsync": lambda a, b: ["rsync", "-a", a + "/", b + "/"],
        "rclone": lambda a, b: ["rclone", "bisync", a, b, "--workdir",
                                os.path.join(w, "rclone-wd"), "--config", "/dev/null"],
        "unison": lambda a, b: ["unison", a, b, "-batch", "-auto", "-times", "-silent",
                                "-confirmbigdel=false"],
    }
    # Initial sync (journals, listings, archives), not timed.
    for t in tools:
        a, b = pairs[t]
        if t in ("ferry", "ferry-base"):
            j = jpath if t == "ferry" else jbase
            timed(cmds[t](a, b) + ["--resync"] if not os.path.exists(j) else cmds[t](a, b), env)
        elif t == "rclone":
            timed(cmds[t](a, b) + ["--resync"], env)
        elif t == "unison":
            timed(cmds[t](a, b), env)
    results = {}
    rels = sorted(os.path.relpath(os.path.join(dp, f), src)
                  for dp, _, fs in os.walk(src) for f in fs)
    n = max(1, len(rels) // 100)
    stamp = int(time.time()) % 1_000_000
    scenarios = [s for s in args.scenarios.split(",") if s]
    for scen in scenarios:
        log(f"scenario {scen}")
        for r in range(args.runs):
            order = tools[r % len(tools):] + tools[:r % len(tools)]
            for t in order:
                if scen == "change" and t == "rsync":
                    continue
                a, b = pairs[t]
                if scen == "change":
                    rnd = random.Random(r)
                    pick = rnd.sample(rels, 2 * n)
                    stamp += 1
                    change(a, pick[:n], stamp)
                    change(b, pick[n:], stamp)
                subprocess.run(["sync"])
                wall, cpu, code, rss = timed(cmds[t](a, b), env)
                results.setdefault((scen, t), []).append((wall, cpu, code, rss))
                log(f"  {t:7s} run {r + 1}: {wall:.3f} s wall, {cpu:.3f} s CPU, {rss:.0f} MiB, exit {code}")
    # Syscalls of ferry: no-op, then one more 1%-change run.
    sys_counts = {}
    has_strace = shutil.which("strace") is not None
    if "ferry" in tools and has_strace:
        a, b = pairs["ferry"]
        sys_counts["noop"] = strace_counts(cmds["ferry"](a, b))
    if "ferry" in tools and "change" in scenarios and has_strace:
        rnd = random.Random(999)
        pick = rnd.sample(rels, 2 * n)
        stamp += 1
        change(a, pick[:n], stamp)
        change(b, pick[n:], stamp)
        sys_counts["change"] = strace_counts(cmds["ferry"](a, b))
    # Report.
    lines = []
    load = os.getloadavg()[0]
    lines.append(f"Load average of the machine (shared with other builds) at the end: {load:.2f}.")
    lines.append("")
    lines.append(f"{len(rels):,} files x 1 KiB in {args.dirs:,} directories; medians of "
                 f"{args.runs} runs (min-max), tools alternating, warm cache, `sync` before "
                 f"every run; CPU = user+sys. change: {n:,} files changed on EACH side before "
                 f"every run ({2 * n:,} in all).")
    lines.append("")
    lines.append("| scenario | tool | wall s, median (min-max) | CPU s | max RSS MiB | x ferry | failed runs |")
    lines.append("|---|---|---|---|---|---|---|")
    for scen in scenarios:
        base = None
        if (scen, "ferry") in results:
            base = statistics.median(x[0] for x in results[(scen, "ferry")])
        for t in tools:
            v = results.get((scen, t))
            if not v:
                continue
            walls = [x[0] for x in v]
            med = statistics.median(walls)
            cpu = statistics.median(x[1] for x in v)
            rss = statistics.median(x[3] for x in v)
            fails = sum(1 for x in v if x[2] != 0)
            label = {"rsync": "rsync -a (one-way)", "ferry": "**ferry bisync**",
                     "ferry-base": "ferry bisync (--base)"}.get(t, t + (" bisync" if t == "rclone" else ""))
            ratio = f"{med / base:.2f}" if base else "-"
            lines.append(f"| {scen} | {label} | {med:.3f} ({min(walls):.3f}-{max(walls):.3f}) "
                         f"| {cpu:.3f} | {rss:.0f} | {ratio} | {fails} |")
    if sys_counts:
        lines.append("")
        lines.append("ferry bisync syscalls (`strace -c -f`, one run each):")
        lines.append("")
        keys = ["statx", "getdents64", "openat", "copy_file_range", "linkat", "renameat2",
                "renameat", "futimens", "utimensat", "unlinkat", "pread64", "pwrite64",
                "fsync", "fdatasync"]
        lines.append("| scenario | total | " + " | ".join(keys) + " |")
        lines.append("|---|---|" + "---|" * len(keys))
        for scen, (total, c) in sys_counts.items():
            lines.append(f"| {scen} | {total:,} | " + " | ".join(f"{c.get(k, 0):,}" for k in keys) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    # Results must be right, not only fast: every ferry run succeeded and its replicas
    # are equal at the end (so the harness can run as a smoke test).
    bad = [x for (scen, t), v in results.items() if t.startswith("ferry") for x in v if x[2] != 0]
    if "ferry" in tools:
        a, b = pairs["ferry"]
        if subprocess.run(["diff", "-r", a, b], stdout=subprocess.DEVNULL).returncode != 0:
            log("ferry's replicas differ at the end")
            bad.append("diff")
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
