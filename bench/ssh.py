#!/usr/bin/env python3
"""ferry over ssh side by side with rsync -a over the same ssh (and scp -r and rclone sftp
when installed; ferry-sftp is ferry --sftp: the server's sftp subsystem, no remote ferry),
on a throwaway sshd on 127.0.0.1 (scripts/sshd), runs alternated, medians.

    python3 bench/ssh.py [--runs 3] [--ferry target/release/ferry] [--rtt-ms N] [--smoke]

Workloads (generated under --workdir, removed at the end):
  small: 10,000 x 4 KiB, first copy, push (local -> host:path) and pull (host:path -> local);
  noop:  100,000 x 1 KiB already in place (nothing to copy), push and pull; in the same
         rounds, alternated with the tools: `ssh host true` and the same no-op between two
         local directories (ferry and rsync), so that "ssh + local no-op" is of the same
         moments as the remote no-ops (--noop-files 10000,100000: one workload per count;
         --noop-flat 50000: the same with every file in the tree's root, one directory);
         with --bisync, also `ferry bisync` of the tree here and its copy there (push rows),
         against `ssh host true` + the same bisync between two local directories;
  big:   one 1 GiB file, first copy, push and pull;
  delta: one 1 GiB file the receiving side has an old copy of, pushed and pulled again,
         with 100 scattered 4 KiB changes ("scattered") and with 1 MiB appended ("append"):
         ferry's delta transfer against rsync's, bytes on the wire beside the wall time
         (ferry: the --json summary's wire_bytes, signature and ops; rsync: --stats' total
         bytes sent plus received), and each tool's set-up: the same command run again
         right after, with nothing left to send.
Each row: wall time (median of --runs), MiB/s for big, the CPU seconds of the local
side (the tool and its ssh children) and of the remote side (the sshd sessions and what they
ran, from the sshd master's reaped children), and for big the CPU per GiB of each end.
(With --rtt-ms, the rate column also gives the latency proxy's own CPU seconds.)
--cipher NAME gives every tool's ssh `-c NAME` (default aes128-gcm@openssh.com, the same
cipher for all); --cipher default gives none (each tool as users run it: ferry puts AES-GCM
first when ssh is left to its defaults, rsync and scp take ssh's default order). --rtt-ms N puts bench/latency_proxy.py between the
clients and sshd (--both: each tool also straight to sshd, as TOOL@lo, in the same run). --smoke runs tiny workloads once and checks the copies are equal (what
scripts/test runs, so this never rots). --only big,push picks rows (--only delta: the delta
rows alone).

Default flags: tool ferry-default is `ferry copy -e SSH SRC DST` as a new user types it (no
--remote-ferry: the start command finds ferry cached there, or installs it); ferry-base-default
the same with --ferry-base. Their cached copies on the host (~/.cache/ferry/ferry-*-<build-id>)
are removed before the first run, so the first run installs. --noop-files N sets the no-op
workload's file count (default 100,000). Also measured in the same run ("fixed" rows): one ssh
connection (`ssh host true`), the no-op between two local directories, a first run on a host
without ferry (the install: its cache removed before each run, a 1-file tree), and, once per
tool after the timed runs, the ssh connections each run opens (strace -f -e execve, counted).
"""
import argparse, filecmp, hashlib, json, os, re, resource, shutil, statistics, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--ferry", default="target/release/ferry")
ap.add_argument("--ferry-base", default="", help="another ferry binary: tools ferry-base and ferry-sftp-base (before/after in one run)")
ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "ferry-bench-ssh"))
ap.add_argument("--rtt-ms", type=float, default=0)
ap.add_argument("--both", action="store_true",
                help="with --rtt-ms: each tool also straight to sshd (tool@lo), alternated in the same run")
ap.add_argument("--smoke", action="store_true")
ap.add_argument("--tools", default="", help="comma list (default: ferry,ferry-sftp,rsync and scp,rclone when installed)")
ap.add_argument("--cipher", default="aes128-gcm@openssh.com",
                help="the cipher every tool's ssh is given (-c), or 'default': none, each tool as users run it")
ap.add_argument("--noop-files", default="100000", help="comma list: one no-op workload per count")
ap.add_argument("--noop-flat", default="", help="comma list: one no-op workload per count, all its files in one directory")
ap.add_argument("--bisync", action="store_true", help="no-op rows: ferry bisync too (local tree and its copy there)")
ap.add_argument("--only", default="", help="comma list of workloads and directions: small,noop,big,delta,push,pull")
a = ap.parse_args()
ferry = os.path.abspath(a.ferry)
repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
runs = 1 if a.smoke else a.runs
noops = [int(n) for n in a.noop_files.split(",") if n]
flats = [int(n) for n in a.noop_flat.split(",") if n]
W = {"small": (200, 4096), "noop": (300, 1024), "noopflat": (300, 1024), "big": (1, 3 << 20)} if a.smoke else \
    {"small": (10_000, 4096), **{f"noop{n}": (n, 1024) for n in noops},
     **{f"noopflat{n}": (n, 1024) for n in flats}, "big": (1, 1 << 30)}
only = set(filter(None, a.only.split(",")))

os.makedirs(a.workdir, exist_ok=True)
sdir = os.path.join(a.workdir, "sshd")
env_lines = subprocess.run([os.path.join(repo, "scripts/sshd"), "start", sdir], check=True,
                           capture_output=True, text=True).stdout
cfg = {}
for line in env_lines.splitlines():
    line = line.replace("export ", "")
    # FERRY_TEST_SSH_RSH='ssh -F DIR/ssh_config' has a blank inside its quotes.
    for part in line.split(" FERRY_"):
        k, v = part.removeprefix("FERRY_").split("=", 1)
        cfg[k] = v.strip("'")
config = os.path.join(sdir, "ssh_config")
config_lo = config
host = "ferry-test"
proxy = None
if a.rtt_ms:
    import socket
    sk = socket.socket()
    sk.bind(("127.0.0.1", 0))
    pport = sk.getsockname()[1]
    sk.close()
    proxy = subprocess.Popen([sys.executable, os.path.join(repo, "bench/latency_proxy.py"), str(pport),
                              f"127.0.0.1:{cfg['TEST_SSH_PORT']}", str(a.rtt_ms / 2)],
                             stdout=subprocess.PIPE, text=True)
    assert proxy.stdout.readline().strip() == "ready"
    with open(config) as f:
        text = f.read().replace(f"Port {cfg['TEST_SSH_PORT']}", f"Port {pport}")
    config = os.path.join(sdir, "ssh_config_rtt")
    with open(config, "w") as f:
        f.write(text)
    # The server's key, known under the proxy's port too (ssh and rclone
    # look it up by [host]:port).
    with open(os.path.join(sdir, "host_key.pub")) as f:
        key = " ".join(f.read().split()[:2])
    with open(os.path.join(sdir, "known_hosts"), "a") as f:
        f.write(f"[127.0.0.1]:{pport} {key}\n")
cipher = [] if a.cipher == "default" else ["-c", a.cipher]
ssh = " ".join(["ssh", "-F", config] + cipher)
config_rtt = config

# The smoke run (scripts/test) runs ferry as a new user does, over SFTP, and rsync: each
# workload's and row's code, at one ssh connection per run (~0.3 s here). `--remote-ferry`,
# scp and rclone (slow on even the smoke workloads) are each a command line of cmd() only:
# by default in full runs only.
tools = [t for t in a.tools.split(",") if t] or (["ferry-default", "ferry-sftp", "rsync"] if a.smoke else
    ["ferry-default", "ferry", "ferry-sftp", "rsync"] + [t for t in ("scp", "rclone") if shutil.which(t)])
if a.both and a.rtt_ms:
    # Loopback and behind the proxy in one run, alternated: whatever the machine does
    # (other work, ext4's scans past recently freed inodes) hits both alike.
    tools = [x for t in tools for x in (t + "@lo", t)]


def cmd(tool, src, dst, push):
    global config, ssh
    # tool@lo: straight to sshd (--both), the same tool through the proxy beside it.
    tool, lo = tool.removesuffix("@lo"), tool.endswith("@lo")
    config = config_lo if lo else config_rtt
    ssh = " ".join(["ssh", "-F", config] + cipher)
    at = lambda p: f"{host}:{p}"
    s, d = (src, at(dst)) if push else (at(src), dst)
    if tool == "ferry":
        return [ferry, "copy", "-e", ssh, "--remote-ferry", ferry, s, d]
    if tool == "ferry-default":
        return [ferry, "copy", "-e", ssh, s, d]
    if tool == "ferry-base-default":
        return [os.path.abspath(a.ferry_base), "copy", "-e", ssh, s, d]
    if tool == "ferry-sftp":
        return [ferry, "copy", "--sftp", "-e", ssh, s, d]
    if tool == "ferry-base":
        b = os.path.abspath(a.ferry_base)
        return [b, "copy", "-e", ssh, "--remote-ferry", b, s, d]
    if tool == "ferry-sftp-base":
        return [os.path.abspath(a.ferry_base), "copy", "--sftp", "-e", ssh, s, d]
    if tool == "rsync":
        return ["rsync", "-a", "-e", ssh, s + "/", d]
    if tool == "tar":
        # The floor of a tree through one ssh stream: tar on both ends, no checks, no temporaries.
        if push:
            return ["sh", "-c", f"tar -C '{s}' -cf - . | {ssh} {host} 'mkdir -p {dst} && tar -C {dst} -xf -'"]
        return ["sh", "-c", f"mkdir -p '{d}' && {ssh} {host} 'tar -C {src} -cf - .' | tar -C '{d}' -xf -"]
    if tool == "scp":
        return ["scp", "-O", "-q", "-r", "-F", config] + cipher + [s, d]
    if tool == "scp-sftp":
        # Plain scp: OpenSSH's default, its sftp client to the server's sftp-server.
        return ["scp", "-q", "-r", "-F", config] + cipher + [s, d]
    if tool == "rclone":
        # rclone's own SSH client, to the same server (and proxy).
        port = config_port()
        r = lambda p: (f":sftp,host=127.0.0.1,port={port},user={os.environ.get('USER') or 'root'},"
                       f"key_file={sdir}/id,known_hosts_file={sdir}/known_hosts:{p}")
        # Without --sftp-disable-hashcheck rclone runs `md5sum FILE` through a
        # new ssh session (a shell) per file after each upload: 10-100x slower
        # here. Measured at its fastest: hashes not checked.
        return ["rclone", "copy", "--transfers", "8", "--sftp-disable-hashcheck"] + \
            ([src, r(dst)] if push else [r(src), dst])
    raise SystemExit(f"unknown tool {tool}")


def config_port():
    with open(config) as f:
        return next(l.split()[1] for l in f if l.strip().startswith("Port ") and l.split()[1] != "1")


def gen(root, n, size, flat=False):
    """n files of size bytes under root: 1,000 per subdirectory, or (flat) all in root."""
    os.makedirs(root, exist_ok=True)
    per = 1000
    for i in range(n):
        d = os.path.join(root, f"d{i // per:03}") if n > 1 and not flat else root
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:06}"), "wb") as f:
            if size > 1 << 20:
                for _ in range(size >> 20):
                    f.write(os.urandom(1 << 20))
            else:
                f.write(os.urandom(size))


def sshd_pid():
    with open(os.path.join(sdir, "sshd.pid")) as f:
        return int(f.read())


def remote_cpu():
    """CPU seconds of the sshd sessions (and what they ran: ferry serve, rsync --server,
    the sftp server) reaped so far by the sshd master, once none is left running."""
    pid = sshd_pid()
    for _ in range(200):
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            if not f.read().split():
                break
        time.sleep(0.01)
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def proxy_cpu():
    """CPU seconds of the latency proxy so far (0 without one)."""
    if not proxy:
        return 0.0
    with open(f"/proc/{proxy.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def subreaper():
    """Processes a run leaves behind (ferry does not wait for an ssh whose session's end
    would only cost it a round trip) come to this process when they end, so that their
    CPU counts with the run's (prctl PR_SET_CHILD_SUBREAPER)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)


def reap_left(keep):
    """Wait for this process's children other than `keep` (pids): what a run left
    running, reparented here."""
    me = os.getpid()
    while True:
        with open(f"/proc/{me}/task/{me}/children") as f:
            kids = {int(x) for x in f.read().split()} - keep
        if not kids:
            return
        for k in kids:
            try:
                os.waitpid(k, 0)
            except ChildProcessError:
                pass


SUBREAPER = []


def timed(argv, out=None):
    if not SUBREAPER:
        subreaper()
        SUBREAPER.append(True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    rbefore, pbefore = remote_cpu(), proxy_cpu()
    t = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t
    # (The wall time is the run's; the CPU is also that of what it left running.)
    reap_left({proxy.pid} if proxy else set())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    if out is not None:
        out.append(r.stdout)
    return (wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), remote_cpu() - rbefore,
            proxy_cpu() - pbefore)


def wire_bytes(tool, stdout):
    """Bytes on the wire a run reported: ferry's --json summary, rsync's --stats."""
    if tool.startswith("ferry"):
        line = [l for l in stdout.splitlines() if '"type":"summary"' in l][-1]
        return json.loads(line).get("wire_bytes", 0)
    n = lambda k: int(re.search(rf"Total bytes {k}: ([\d,]+)", stdout).group(1).replace(",", ""))
    return n("sent") + n("received")


def delta_rows():
    """The delta workload: an old copy on the receiving side, the new file sent again."""
    size = (4 << 20) if a.smoke else (1 << 30)
    base = os.path.join(a.workdir, "delta")
    old = os.path.join(base, "old")
    gen(old, 1, size)
    name = "f000000"
    # An hour old: rsync's quick check compares whole seconds.
    t = time.time() - 3600
    os.utime(os.path.join(old, name), (t, t))

    def scattered(p):
        with open(p, "r+b") as f:
            for k in range(100):
                f.seek(k * (size // 100) + 12345)
                f.write(os.urandom(4096))

    def append(p):
        with open(p, "ab") as f:
            f.write(os.urandom(1 << 20))

    for variant, edit in (("scattered", scattered), ("append", append)):
        new = os.path.join(base, "new-" + variant)
        shutil.copytree(old, new)
        edit(os.path.join(new, name))
        far = os.path.join(base, "far-" + variant)  # the new file on the remote, for pulls
        shutil.copytree(new, far)
        for push in (True, False):
            if only & {"push", "pull"} and ("push" if push else "pull") not in only:
                continue
            for tool in [t for t in tools if t in ("ferry-default", "ferry", "ferry-base", "rsync")]:
                walls, cpus, rcpus, wires, agains = [], [], [], [], []
                for _ in range(runs):
                    recv = os.path.join(base, "there" if push else "back")
                    shutil.rmtree(recv, ignore_errors=True)
                    shutil.copytree(old, recv)
                    argv = cmd(tool, new if push else far, recv, push)
                    argv.insert(2, "--json" if tool.startswith("ferry") else "--stats")
                    out = []
                    wall, cpu, rcpu, _ = timed(argv, out)
                    walls.append(wall)
                    cpus.append(cpu)
                    rcpus.append(rcpu)
                    wires.append(wire_bytes(tool, out[0]))
                    # The same command again: nothing left to send, so its wall is the
                    # tool's set-up (ssh, the remote end, both listings): the delta's own
                    # time is the first run's wall less this.
                    agains.append(timed(argv)[0])
                    if a.smoke and not filecmp.cmp(os.path.join(new, name), os.path.join(recv, name), False):
                        raise SystemExit(f"delta {variant}: {tool} left a different file")
                w = statistics.median(walls)
                wire = statistics.median(wires)
                d = "push" if push else "pull"
                rows.append((f"delta {variant}", d, tool, w, statistics.median(cpus), statistics.median(rcpus),
                             f"{wire / 1e6:.2f} MB on the wire; run again (set-up) "
                             f"{statistics.median(agains):.2f} s"))
                print(f"delta {variant:9} {d} {tool:7} {w:7.2f} s  cpu {rows[-1][4]:6.2f} s here"
                      f" {rows[-1][5]:6.2f} s there  {rows[-1][6]}", flush=True)
    shutil.rmtree(base, ignore_errors=True)


def same(x, y):
    c = filecmp.dircmp(x, y)
    if c.left_only or c.right_only or c.diff_files or c.funny_files:
        raise SystemExit(f"{x} and {y} differ: {c.left_only[:3]} {c.right_only[:3]} {c.diff_files[:3]}")
    for s in c.common_dirs:
        same(os.path.join(x, s), os.path.join(y, s))


def build_id(path):
    """The first 16 hex digits of a binary's GNU build-id (its name in a host's cache)."""
    with open(path, "rb") as f:
        head = f.read(64 << 10)
    i = head.find(b"\x04\x00\x00\x00\x14\x00\x00\x00\x03\x00\x00\x00GNU\x00")
    return head[i + 16:i + 24].hex() if i >= 0 else None


def uncache():
    """Remove the tested ferries' copies from the host's cache (the host is this machine, the
    same user): the next default run installs."""
    d = os.path.expanduser("~/.cache/ferry")
    ids = []
    for b in [ferry] + ([os.path.abspath(a.ferry_base)] if a.ferry_base else []):
        # (Before the build-id, the cache name was keyed by the SHA-256 of the binary.)
        with open(b, "rb") as f:
            ids += [build_id(b), hashlib.sha256(f.read()).hexdigest()[:16]]
    if not os.path.isdir(d):
        return
    for n in os.listdir(d):
        if any(i and f"-{i}" in n for i in ids):
            os.remove(os.path.join(d, n))


def count_ssh(tool, argv):
    """The ssh processes one run starts (strace -f -e execve). The smoke run counts
    ferry-default's alone, and holds it to one (#29: a host with ferry costs one ssh
    connection, as rsync's)."""
    if a.smoke and tool != "ferry-default":
        return None
    log = os.path.join(a.workdir, "strace.log")
    subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve", "-e", "signal=none", "-o", log] + argv,
                   check=True, capture_output=True)
    with open(log) as f:
        # (A call another process interrupts is split: "<unfinished ...>", then its result.)
        # `ssh -G` (ferry reading ssh's configuration) opens no connection.
        n = sum(1 for l in f if 'execve("/usr/bin/ssh"' in l and "= -1" not in l and '"-G"' not in l)
    if a.smoke and n != 1:
        raise SystemExit(f"{' '.join(argv)}: {n} ssh connections, where ferry makes one")
    return n


def fixed_rows():
    """ssh's own cost, the local no-op, and a first run on a host without ferry."""
    t = [timed(["ssh", "-F", config] + cipher + [host, "true"]) for _ in range(max(runs, 5))]
    rows.append(("fixed", "-", "ssh host true", statistics.median(x[0] for x in t),
                 statistics.median(x[1] for x in t), statistics.median(x[2] for x in t), "one ssh connection"))
    base = os.path.join(a.workdir, "fixed")
    one = os.path.join(base, "one")
    os.makedirs(one, exist_ok=True)
    with open(os.path.join(one, "f"), "wb") as f:
        f.write(b"x" * 4096)
    for tool in [t for t in tools if t.endswith("default")]:
        got = []
        for k in range(runs):
            uncache()
            dst = os.path.join(base, f"there-{tool}-{k}")
            got.append(timed(cmd(tool, one, dst, True)))
        rows.append(("install", "push", tool, statistics.median(x[0] for x in got),
                     statistics.median(x[1] for x in got), statistics.median(x[2] for x in got),
                     "first run on a host without ferry, 1 file (ferry uploaded and run)"))
        print(f"install push {tool} {rows[-1][3]:7.2f} s", flush=True)
    shutil.rmtree(base, ignore_errors=True)


def noop_rows(wl, n, src):
    """A tree already in place on the receiving side, synced again (nothing to copy), push
    and pull. Each tool's copy is made once, by the tool itself; then, in every round,
    alternated: each tool's no-op, `ssh host true`, and the same no-op between two local
    directories (ferry and rsync)."""
    label = f"no-op, {n:,} x 1 KiB" + (" in one directory" if wl.startswith("noopflat") else "")
    local = os.path.join(a.workdir, wl, "local")
    ssh_true = ["ssh", "-F", config] + cipher + [host, "true"]
    fixed = {"ssh host true": ssh_true,
             "ferry (local dirs)": [ferry, "copy", src, local],
             "rsync (local dirs)": ["rsync", "-a", src + "/", local]}
    subprocess.run([ferry, "copy", src, local], check=True, capture_output=True)
    far = os.path.join(a.workdir, wl, "far")
    timed(cmd("ferry", src, far, True))
    use = [t for t in tools if t not in ("scp", "scp-sftp", "tar")]
    for push in (True, False):
        d = "push" if push else "pull"
        if only & {"push", "pull"} and d not in only:
            continue
        argv = {}
        for tool in use:
            there = os.path.join(a.workdir, wl, f"{d}-{tool}")
            argv[tool] = cmd(tool, src, there, True) if push else cmd(tool, far, there, False)
            timed(argv[tool])  # the tool's own first copy
            if a.smoke:
                timed(argv[tool])
                same(src, there)
        argv.update(fixed)
        if a.bisync and push:
            # A bisync pair made by a first run of each (B created), then no-ops.
            bis = lambda b, j, *e: [ferry, "bisync", "--journal", os.path.join(a.workdir, wl, j), *e, src, b]
            argv["ferry bisync"] = bis(f"{host}:" + os.path.join(a.workdir, wl, "bisync-b"), "j-ssh",
                                       "-e", " ".join(["ssh", "-F", config] + cipher))
            argv["ferry bisync (local dirs)"] = bis(os.path.join(a.workdir, wl, "bisync-l"), "j-local")
            for t in ("ferry bisync", "ferry bisync (local dirs)"):
                timed(argv[t])
        got = {t: ([], [], [], []) for t in argv}
        for _ in range(runs):
            for t, v in argv.items():  # alternated: a noisy moment hits every one alike
                for acc, x in zip(got[t], timed(v)):
                    acc.append(x)
        for t in argv:
            walls, cpus, rcpus, _ = got[t]
            w, c, rc = statistics.median(walls), statistics.median(cpus), statistics.median(rcpus)
            note = f"min {min(walls):.2f}, max {max(walls):.2f}"
            rows.append((label, d, t, w, c, rc, note))
            print(f"{label} {d} {t:20} {w:7.2f} s  cpu {c:6.2f} s here {rc:6.2f} s there  {note}", flush=True)
        # The sum the no-op is held to, from the same rounds, round by round.
        sums = [x + y for x, y in zip(got["ssh host true"][0], got["ferry (local dirs)"][0])]
        rows.append((label, d, "ssh host true + ferry local no-op", statistics.median(sums), 0.0, 0.0,
                     "the bound: sum of the two in each round, median"))
        # Each tool against the bound in the same round, in ms (the rows above are rounded
        # to 10 ms; what #29 holds a no-op to is this difference).
        for tool in use:
            diff = statistics.median(x - y for x, y in zip(got[tool][0], sums)) * 1000
            print(f"{label} {d} {tool:20} {diff:+7.1f} ms against the bound, per round (median)", flush=True)
            rows.append((label, d, f"{tool} minus the bound", diff / 1000, 0.0, 0.0,
                         f"{diff:+.1f} ms: per round, median"))
        if "ferry bisync" in got:
            bsums = [x + y for x, y in zip(got["ssh host true"][0], got["ferry bisync (local dirs)"][0])]
            diff = statistics.median(x - y for x, y in zip(got["ferry bisync"][0], bsums)) * 1000
            print(f"{label} {d} {'ferry bisync':20} {diff:+7.1f} ms against ssh host true + the local bisync, per round (median)", flush=True)
            rows.append((label, d, "ferry bisync minus ssh host true + local bisync", diff / 1000, 0.0, 0.0,
                         f"{diff:+.1f} ms: per round, median"))
        for tool in use:
            conns.append((label, d, tool, count_ssh(tool, argv[tool])))


rows = []
conns = []
trash = os.path.join(a.workdir, "trash")
def retire(path, many):
    # The root ext4 here has no journal: an inode freed within the last minute is not
    # reused, and the next run's allocations scan past every one of them (bench/LOG.md,
    # "Why small-file runs on this machine swing"). Many-file destinations are moved aside, deleted at the end.
    if not os.path.exists(path):
        return
    if not many:
        shutil.rmtree(path, ignore_errors=True)
        return
    os.makedirs(trash, exist_ok=True)
    k = len(os.listdir(trash))
    while os.path.exists(os.path.join(trash, str(k))):
        k += 1
    os.rename(path, os.path.join(trash, str(k)))
try:
    uncache()
    if not only or "fixed" in only:
        fixed_rows()
    uncache()
    for wl, (n, size) in W.items():
        kind = "noop" if wl.startswith("noop") else wl
        if only and kind not in only:
            continue
        src = os.path.join(a.workdir, wl, "src")
        gen(src, n, size, flat=wl.startswith("noopflat"))
        total = n * size
        if kind == "noop":
            noop_rows(wl, n, src)
            shutil.rmtree(os.path.join(a.workdir, wl), ignore_errors=True)
            continue
        for push in (True, False):
            if only & {"push", "pull"} and ("push" if push else "pull") not in only:
                continue
            use = tools
            got = {t: ([], [], [], []) for t in use}
            for _ in range(runs):
                for tool in use:  # alternated: a noisy moment hits every tool alike
                    far = os.path.join(a.workdir, wl, "there")
                    near = os.path.join(a.workdir, wl, "back")
                    if push:
                        dst = far
                        retire(dst, n > 1)
                        res = timed(cmd(tool, src, dst, True))
                    else:
                        if not os.path.isdir(far):
                            timed(cmd("ferry", src, far, True))
                        retire(near, n > 1)
                        res = timed(cmd(tool, far, near, False))
                    for acc, v in zip(got[tool], res):
                        acc.append(v)
                    if a.smoke:
                        same(src, far if push else near)
            if wl == "small":
                # The ssh connections of one run of each tool (ferry installed by now).
                for tool in use:
                    far = os.path.join(a.workdir, wl, "there")
                    near = os.path.join(a.workdir, wl, "back")
                    if push:
                        retire(far, True)
                        argv = cmd(tool, src, far, True)
                    else:
                        retire(near, True)
                        argv = cmd(tool, far, near, False)
                    conns.append((wl, "push" if push else "pull", tool, count_ssh(tool, argv)))
            for tool in use:
                walls, cpus, rcpus, pcpus = got[tool]
                w = statistics.median(walls)
                rate = f"{total / w / (1 << 20):.0f} MiB/s" if wl == "big" else ""
                if proxy:
                    rate += (", " if rate else "") + f"proxy CPU {statistics.median(pcpus):.2f} s"
                c, rc = statistics.median(cpus), statistics.median(rcpus)
                if wl == "big":
                    gib = total / (1 << 30)
                    rate += f", CPU/GiB {c / gib:.2f} s here + {rc / gib:.2f} s there"
                rows.append((wl, "push" if push else "pull", tool, w, c, rc, rate))
                print(f"{wl:5} {'push' if push else 'pull'} {tool:7} {w:7.2f} s  cpu {c:6.2f} s here"
                      f" {rc:6.2f} s there  {rate}", flush=True)
        shutil.rmtree(os.path.join(a.workdir, wl), ignore_errors=True)
    if not only or "delta" in only:
        delta_rows()
finally:
    if proxy:
        proxy.kill()
    subprocess.run([os.path.join(repo, "scripts/sshd"), "stop", sdir])
    shutil.rmtree(a.workdir, ignore_errors=True)

print()
print(f"cipher: {a.cipher}; rtt: {a.rtt_ms} ms")
print(f"| workload | dir | tool | wall s (median of {runs}) | CPU s here | CPU s there (sshd + server) | rate |")
print("|---|---|---|---|---|---|---|")
for wl, d, tool, w, cpu, rcpu, rate in rows:
    print(f"| {wl} | {d} | {tool} | {w:.2f} | {cpu:.2f} | {rcpu:.2f} | {rate} |")
if conns:
    print()
    print("| workload | dir | tool | ssh connections per run |")
    print("|---|---|---|---|")
    for wl, d, tool, n in [c for c in conns if c[3] is not None]:
        print(f"| {wl} | {d} | {tool} | {n} |")
