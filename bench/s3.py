#!/usr/bin/env python3
"""S3 side by side on one Garage: ferry vs rclone (default and --transfers 32) and the AWS CLI
(when installed), on the same data, runs alternated, medians reported.

    python3 bench/s3.py [--runs 3] [--ferry target/release/ferry] [--out bench/LOG.md]

Starts a throwaway single-node Garage with scripts/garage (installs it if missing), then:
  small: 10,000 objects x 4 KiB up (fresh prefix each run) and down (fresh directory);
  big:   one 2 GiB object up and down: wall, MiB/s, CPU seconds per GiB;
  lat:   20 downloads of one 128 MiB object with ferry: p50/p90/p95 latency;
  list:  one prefix of --wide objects listed (ferry ls, rclone lsf/lsl, aws s3 ls).
--rtt-ms N puts bench/latency_proxy.py in front of Garage (a network's round trip).
Workload sources are bench/run.py's (`small`, `big`) under --workdir.
"""
import argparse, os, resource, shutil, statistics, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--ferry", default="target/release/ferry")
ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "ferry-bench"))
ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "LOG.md"))
ap.add_argument("--skip", default="", help="comma list of: small,big,lat,list")
ap.add_argument("--rtt-ms", type=float, default=0,
                help="put bench/latency_proxy.py between the clients and Garage, adding this round trip")
ap.add_argument("--wide", type=int, default=20000, help="objects under the one prefix of the list scenario")
ap.add_argument("--tools", default="", help="comma list (default: ferry,rclone,rclone32 and aws when installed)")
ap.add_argument("--dirs", default="up,down", help="comma list of: up,down")
ap.add_argument("--base", default="", help="another ferry binary, measured as tool ferry-base "
                "(add it to --tools): before/after in one run")
a = ap.parse_args()
ferry = os.path.abspath(a.ferry)
repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
src_small = os.path.join(a.workdir, "full/src/small")
src_big = os.path.join(a.workdir, "full/src/big")
for p in (src_small, src_big):
    if not os.path.isdir(p):
        sys.exit(f"{p} missing: generate it with python3 bench/run.py --workloads small,big --scenarios ls --runs 1")

gdir = os.path.join(a.workdir, "garage")
env_lines = subprocess.run([os.path.join(repo, "scripts/garage"), "start", gdir], check=True,
                           capture_output=True, text=True).stdout
cfg = {}
for line in env_lines.splitlines():
    for kv in line.replace("export ", "").split():
        k, v = kv.split("=", 1)
        cfg[k] = v
proxy = None
if a.rtt_ms:
    import socket
    sk = socket.socket()
    sk.bind(("127.0.0.1", 0))
    pport = sk.getsockname()[1]
    sk.close()
    upstream = cfg["FERRY_TEST_S3_ENDPOINT"].removeprefix("http://")
    proxy = subprocess.Popen([sys.executable, os.path.join(repo, "bench/latency_proxy.py"), str(pport), upstream,
                              str(a.rtt_ms / 2)], stdout=subprocess.PIPE, text=True)
    assert proxy.stdout.readline().strip() == "ready"
    cfg["FERRY_TEST_S3_ENDPOINT"] = f"http://127.0.0.1:{pport}"
env = dict(os.environ)
env.pop("AWS_CA_BUNDLE", None)
env.update({"AWS_ACCESS_KEY_ID": cfg["FERRY_TEST_S3_KEY"], "AWS_SECRET_ACCESS_KEY": cfg["FERRY_TEST_S3_SECRET"],
            "AWS_REGION": "garage", "AWS_DEFAULT_REGION": "garage", "AWS_ENDPOINT_URL": cfg["FERRY_TEST_S3_ENDPOINT"],
            "RCLONE_CONFIG": "/dev/null", "RCLONE_CONFIG_G_TYPE": "s3", "RCLONE_CONFIG_G_PROVIDER": "Other",
            "RCLONE_CONFIG_G_ACCESS_KEY_ID": cfg["FERRY_TEST_S3_KEY"],
            "RCLONE_CONFIG_G_SECRET_ACCESS_KEY": cfg["FERRY_TEST_S3_SECRET"],
            "RCLONE_CONFIG_G_ENDPOINT": cfg["FERRY_TEST_S3_ENDPOINT"], "RCLONE_CONFIG_G_REGION": "garage",
            "RCLONE_CONFIG_G_FORCE_PATH_STYLE": "true"})
bucket = cfg["FERRY_TEST_S3_BUCKET"]
have_aws = shutil.which("aws") is not None
seq = [0]

def fresh(kind):
    seq[0] += 1
    return f"{kind}-{seq[0]}-{time.time_ns()}"

def tool_cmd(tool, src, dst):
    """src/dst: ('local', path) or ('s3', prefix)."""
    def fmt(side, style):
        kind, p = side
        if kind == "local":
            return p
        return {"ferry": f"s3://{bucket}/{p}", "rclone": f"g:{bucket}/{p}", "aws": f"s3://{bucket}/{p}"}[style]
    if tool == "ferry":
        return [ferry, "copy", "--no-progress", fmt(src, "ferry"), fmt(dst, "ferry")]
    if tool == "ferry-base":
        return [os.path.abspath(a.base), "copy", "--no-progress", fmt(src, "ferry"), fmt(dst, "ferry")]
    if tool == "rclone":
        return ["rclone", "copy", fmt(src, "rclone"), fmt(dst, "rclone")]
    if tool == "rclone32":
        return ["rclone", "copy", "--transfers", "32", "--checkers", "32", fmt(src, "rclone"), fmt(dst, "rclone")]
    if tool == "aws":
        return ["aws", "s3", "cp", "--recursive", "--only-show-errors", "--endpoint-url",
                cfg["FERRY_TEST_S3_ENDPOINT"], fmt(src, "aws"), fmt(dst, "aws")]
    raise ValueError(tool)

gpid = int(open(os.path.join(gdir, "pid")).read())
tick = os.sysconf("SC_CLK_TCK")

def server_cpu():
    """User+sys seconds Garage has used so far (all its threads)."""
    with open(f"/proc/{gpid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / tick

def timed(cmd):
    """Wall s, the client's CPU s and the server's CPU s of one command."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    s0 = server_cpu()
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit(f"{cmd}: exit {p.returncode}: {p.stderr.decode()[-2000:]}")
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), server_cpu() - s0

tmp = os.path.join(a.workdir, "s3tmp")
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)
tools = ["ferry", "rclone", "rclone32"] + (["aws"] if have_aws else [])
if a.tools:
    tools = [t for t in a.tools.split(",") if t]
    assert "ferry" in tools, "ferry is the reference"
dirs = [d for d in a.dirs.split(",") if d]
trash = [0]

def discard(d):
    # Moved aside, deleted at the end: on ext4 with discard, deleting many
    # files slows the file creation that follows (see bench/LOG.md, method).
    trash[0] += 1
    if os.path.exists(d):
        os.rename(d, os.path.join(tmp, f"trash-{trash[0]}"))
skip = set(a.skip.split(",")) - {""}
lines = ["", "## S3 (Garage 2.5.0, single node on loopback" + (f", {a.rtt_ms:g} ms round trip added by bench/latency_proxy.py)" if a.rtt_ms else ")"), "",
         f"`python3 bench/s3.py {' '.join(sys.argv[1:])}`: same Garage, same data, tools alternated run by run; "
         "medians (min-max). Uploads go to a fresh prefix each run, downloads into a fresh directory. "
         "CPU = user+sys of the client process; server CPU = Garage's, during the same command." + ("" if have_aws else " AWS CLI not installed here: not measured."), ""]

def scenario(title, src_local, size_bytes, files):
    global lines
    up_prefix = {}
    res = {}
    if "up" not in dirs:
        # Downloads need something to download: one upload by ferry, untimed.
        pre = fresh("up")
        timed(tool_cmd("ferry", ("local", src_local), ("s3", pre)))
        up_prefix["ferry"] = pre
    for run in range(a.runs):
        for t in (tools if "up" in dirs else []):
            pre = fresh("up")
            w, c, g = timed(tool_cmd(t, ("local", src_local), ("s3", pre)))
            res.setdefault((t, "up"), []).append((w, c, g))
            up_prefix[t] = pre
        for t in (tools if "down" in dirs else []):
            d = os.path.join(tmp, fresh("down"))
            w, c, g = timed(tool_cmd(t, ("s3", up_prefix["ferry"]), ("local", d)))
            res.setdefault((t, "down"), []).append((w, c, g))
            discard(d)
        print(f"{title}: run {run + 1}/{a.runs} done", flush=True)
    gib = size_bytes / (1 << 30)
    lines += [f"### {title}", "", "| tool | direction | wall s median (min-max) | MiB/s | files/s | CPU s | CPU s per GiB | server CPU s | ratio to ferry |",
              "|---|---|---|---|---|---|---|---|---|"]
    for d in dirs:
        fw = statistics.median(x[0] for x in res[("ferry", d)])
        for t in tools:
            ws = [x[0] for x in res[(t, d)]]
            cs = [x[1] for x in res[(t, d)]]
            gs = [x[2] for x in res[(t, d)]]
            m, c, g = statistics.median(ws), statistics.median(cs), statistics.median(gs)
            lines.append(f"| {t} | {d} | {m:.2f} ({min(ws):.2f}-{max(ws):.2f}) | {size_bytes / (1 << 20) / m:.1f} | "
                         f"{files / m:.0f} | {c:.2f} | {c / gib:.2f} | {g:.2f} | {m / fw:.2f} |")
    lines.append("")

if "small" not in skip:
    scenario("10,000 objects x 4 KiB", src_small, 10000 * 4096, 10000)
if "big" not in skip:
    scenario("one 2 GiB object", src_big, 2 << 30, 1)
if "lat" not in skip:
    d128 = os.path.join(tmp, "src128")
    os.makedirs(d128)
    with open(os.path.join(d128, "obj128"), "wb") as f:
        f.write(os.urandom(128 << 20))
    pre = fresh("lat")
    timed([ferry, "copy", "--no-progress", d128, f"s3://{bucket}/{pre}"])
    lat_tools = [t for t in tools if t in ("ferry", "rclone")]
    walls = {t: [] for t in lat_tools}
    for i in range(20):
        for t in lat_tools:
            d = os.path.join(tmp, fresh("lat-down"))
            w, _, _ = timed(tool_cmd(t, ("s3", pre), ("local", d)))
            walls[t].append(w)
            discard(d)
    lines += ["### Latency of 20 downloads of one 128 MiB object (whole command, tools alternated)", "",
              "| tool | p50 s | p90 s | p95 s | min s | max s |", "|---|---|---|---|---|---|"]
    for t in lat_tools:
        ws = walls[t]
        q = statistics.quantiles(ws, n=20, method="inclusive")
        lines.append(f"| {t} | {statistics.median(ws):.3f} | {q[17]:.3f} | {q[18]:.3f} | {min(ws):.3f} | {max(ws):.3f} |")
    lines.append("")

if "list" not in skip:
    # One wide prefix: --wide empty objects side by side, uploaded once by ferry.
    wide = os.path.join(a.workdir, f"wide{a.wide}")
    if not os.path.isdir(wide) or len(os.listdir(wide)) != a.wide:
        shutil.rmtree(wide, ignore_errors=True)
        os.makedirs(wide)
        for i in range(a.wide):
            open(os.path.join(wide, f"f{i:07d}"), "wb").close()
    pre = fresh("wide")
    timed([ferry, "copy", "--no-progress", wide, f"s3://{bucket}/{pre}"])
    ep = cfg["FERRY_TEST_S3_ENDPOINT"]
    # Names, sizes and upload times from the listing alone; then with each
    # object's stored mtime (a HEAD per object: once, rclone's are sequential).
    cmds = {"ferry ls --server-mtime": ([ferry, "ls", "--server-mtime", f"s3://{bucket}/{pre}"], "ferry", a.runs),
            "rclone lsf --format sp": (["rclone", "lsf", "--format", "sp", f"g:{bucket}/{pre}"], "rclone", a.runs),
            "aws s3 ls": (["aws", "s3", "ls", "--endpoint-url", ep, f"s3://{bucket}/{pre}/"], "aws", a.runs),
            "ferry ls (stored mtimes)": ([ferry, "ls", f"s3://{bucket}/{pre}"], "ferry", 1),
            "rclone lsl (stored mtimes)": (["rclone", "lsl", f"g:{bucket}/{pre}"], "rclone", 1)}
    names = [n for n, (_, t, _) in cmds.items() if t in tools]
    res = {n: [] for n in names}
    for run in range(a.runs):
        for n in names:
            if run < cmds[n][2]:
                res[n].append(timed(cmds[n][0]))
    lines += [f"### Listing one prefix of {a.wide:,} objects", "",
              "| command | runs | wall s median (min-max) | objects/s | CPU s | server CPU s |",
              "|---|---|---|---|---|---|"]
    for n in names:
        ws = [x[0] for x in res[n]]
        m = statistics.median(ws)
        lines.append(f"| {n} | {len(ws)} | {m:.2f} ({min(ws):.2f}-{max(ws):.2f}) | {a.wide / m:.0f} | "
                     f"{statistics.median(x[1] for x in res[n]):.2f} | {statistics.median(x[2] for x in res[n]):.2f} |")
    lines.append("")

if proxy:
    proxy.kill()
subprocess.run([os.path.join(repo, "scripts/garage"), "stop", gdir])
shutil.rmtree(tmp, ignore_errors=True)
with open(a.out, "a") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
