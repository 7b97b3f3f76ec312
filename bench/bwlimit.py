#!/usr/bin/env python3
"""--bwlimit accuracy: achieved rate vs the setting over a 500 MiB transfer.

For each rate (default 1, 10 and 100 MiB/s) and each shape (one 500 MiB file;
500 files of 1 MiB), runs `ferry copy --bwlimit RATE` into a fresh target and
reports bytes / wall time as a ratio to the setting. The limiter is one
token bucket over all transfers, so the many-files shape (4 workers at once)
must hold the same rate as the single stream. Appends a section to
bench/LOG.md (or --out) unless --no-write.

    python3 bench/bwlimit.py [--rates 1,10,100] [--mib 500] [--ferry PATH]
"""
import argparse, os, shutil, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("--rates", default="1,10,100", help="MiB/s, comma-separated")
ap.add_argument("--mib", type=int, default=500, help="transfer size in MiB")
ap.add_argument("--shapes", default="one,many")
ap.add_argument("--ferry", default="target/release/ferry")
ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "ferry-bwlimit"))
ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "LOG.md"))
ap.add_argument("--no-write", action="store_true")
a = ap.parse_args()

mib = 1 << 20
os.makedirs(a.workdir, exist_ok=True)
block = bytes((i * 7919) & 0xFF for i in range(mib))

def make(shape):
    src = os.path.join(a.workdir, f"src-{shape}-{a.mib}")
    if os.path.isdir(src):
        return src
    tmp = src + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    if shape == "one":
        with open(os.path.join(tmp, "big"), "wb") as f:
            for _ in range(a.mib):
                f.write(block)
    else:
        for i in range(a.mib):
            with open(os.path.join(tmp, f"f{i:05}"), "wb") as f:
                f.write(block)
    os.rename(tmp, src)
    return src

rows = []
for shape in a.shapes.split(","):
    src = make(shape)
    for r in [float(x) for x in a.rates.split(",")]:
        dst = os.path.join(a.workdir, f"dst-{shape}-{r:g}-{time.time_ns()}")
        t0 = time.monotonic()
        p = subprocess.run([a.ferry, "copy", "--no-progress", "--bwlimit", f"{r:g}M", src, dst],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wall = time.monotonic() - t0
        if p.returncode != 0:
            sys.exit(f"ferry failed: {p.stderr.decode()}")
        achieved = a.mib / wall
        rows.append((shape, r, wall, achieved, achieved / r))
        print(f"{shape:5} {r:6g} MiB/s: {wall:8.2f} s, achieved {achieved:8.3f} MiB/s = {achieved / r:.4f} x setting", flush=True)
        shutil.rmtree(dst, ignore_errors=True)

ok = all(abs(x[4] - 1) <= 0.03 for x in rows)
if not a.no_write:
    lines = ["", "## --bwlimit accuracy", "",
             f"`python3 bench/bwlimit.py --rates {a.rates} --mib {a.mib}`: {a.mib} MiB copied with "
             "`ferry copy --bwlimit RATE` into a fresh target; achieved = bytes / wall time of the whole "
             "command (process start, scan and metadata included). Goal: within ±3% of the setting.", "",
             "| shape | setting MiB/s | wall s | achieved MiB/s | achieved / setting |", "|---|---|---|---|---|"]
    for shape, r, wall, ach, ratio in rows:
        desc = f"1 x {a.mib} MiB" if shape == "one" else f"{a.mib} x 1 MiB"
        lines.append(f"| {desc} | {r:g} | {wall:.2f} | {ach:.3f} | {ratio:.4f} |")
    with open(a.out, "a") as f:
        f.write("\n".join(lines) + "\n")
sys.exit(0 if ok else 1)
