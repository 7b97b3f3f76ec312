#!/usr/bin/env python3
"""What bench/latency_proxy.py itself costs, and that it adds its round trip.

    python3 bench/latency_proxy_check.py [--proxy bench/latency_proxy.py ...] [--ferry BIN]
        [--one-way-ms 10] [--mib 256] [--files 10000] [--workdir DIR]

For each proxy given (default: this one; `none`: straight to sshd, for the ssh rows' baseline),
in front of a throwaway sshd (scripts/sshd):
  rtt:    20 request/response exchanges of 64 bytes through the proxy to a local echo
          server (median and max ms; the added round trip is twice --one-way-ms);
  ssh rtt: 5 x `ssh host true` through the proxy (each is several round trips);
  cat push / cat pull: --mib MiB through `ssh host 'cat > /dev/null'` and
          `ssh host 'head -c N /dev/zero'` (wall, MiB/s);
  ferry push, rsync push (with --ferry): `ferry copy` and `rsync -a` of --files x 4 KiB to
          host:path (destinations moved aside, deleted at the end).
Each row prints the proxy's own CPU seconds (utime + stime of its process, /proc/PID/stat)
for the workload, beside the wall time, and the CPU seconds of the client side (the command
and its ssh) and of the server side (the sshd sessions and what they ran). Proxies are run one after another, rows alternated.
"""
import argparse, os, resource, shutil, socket, statistics, subprocess, sys, tempfile, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("--proxy", action="append", default=[])
ap.add_argument("--ferry", default="")
ap.add_argument("--one-way-ms", type=float, default=10)
ap.add_argument("--mib", type=int, default=256)
ap.add_argument("--files", type=int, default=10_000)
ap.add_argument("--runs", type=int, default=1)
ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "ferry-proxy-check"))
a = ap.parse_args()
repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
proxies = a.proxy or [os.path.join(repo, "bench/latency_proxy.py")]
tck = os.sysconf("SC_CLK_TCK")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def cpu(pid):
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        x = f.read().rsplit(")", 1)[1].split()
    return (int(x[11]) + int(x[12])) / tck


class Direct:
    pid = None

    def kill(self):
        pass

    def wait(self):
        pass


def start_proxy(path, upstream_port):
    if path == "none":
        return Direct(), upstream_port
    port = free_port()
    p = subprocess.Popen([sys.executable, path, str(port), f"127.0.0.1:{upstream_port}", str(a.one_way_ms)],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p, port


def echo_server():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)

    def serve(c):
        with c:
            while True:
                d = c.recv(65536)
                if not d:
                    return
                c.sendall(d)

    def loop():
        while True:
            c, _ = s.accept()
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return s.getsockname()[1]


os.makedirs(a.workdir, exist_ok=True)
sdir = os.path.join(a.workdir, "sshd")
env = subprocess.run([os.path.join(repo, "scripts/sshd"), "start", sdir], check=True,
                     capture_output=True, text=True).stdout
sport = int(env.split("FERRY_TEST_SSH_PORT=")[1].split()[0])
echo_port = echo_server()
with open(os.path.join(sdir, "host_key.pub")) as f:
    key = " ".join(f.read().split()[:2])
src = os.path.join(a.workdir, "src")
if a.ferry:
    for i in range(a.files):
        d = os.path.join(src, f"d{i // 1000:03}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:06}"), "wb") as f:
            f.write(os.urandom(4096))

results = {}  # (proxy, workload) -> [(wall, proxy cpu, client cpu, server cpu)]


def server_cpu():
    """CPU seconds of the sshd sessions reaped so far by the sshd master, once none runs."""
    with open(os.path.join(sdir, "sshd.pid")) as f:
        pid = int(f.read())
    for _ in range(200):
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            if not f.read().split():
                break
        time.sleep(0.01)
    with open(f"/proc/{pid}/stat") as f:
        x = f.read().rsplit(")", 1)[1].split()
    return (int(x[13]) + int(x[14])) / tck



def ssh_config(port):
    with open(os.path.join(sdir, "ssh_config")) as f:
        text = f.read().replace(f"Port {sport}", f"Port {port}")
    path = os.path.join(sdir, f"ssh_config_{port}")
    with open(path, "w") as f:
        f.write(text)
    with open(os.path.join(sdir, "known_hosts"), "a") as f:
        f.write(f"[127.0.0.1]:{port} {key}\n")
    return ["ssh", "-F", path, "-c", "aes128-gcm@openssh.com"]


try:
    for run in range(a.runs):
        for path in proxies:
            name = os.path.relpath(path, repo) if path.startswith(repo) else path
            if path != "none":
                # The echo round trips: a proxy of their own (its CPU apart from ssh's).
                p, port = start_proxy(path, echo_port)
                c = socket.create_connection(("127.0.0.1", port))
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                rtts = []
                for _ in range(20):
                    t = time.perf_counter()
                    c.sendall(b"x" * 64)
                    got = 0
                    while got < 64:
                        got += len(c.recv(64 - got))
                    rtts.append((time.perf_counter() - t) * 1000)
                c.close()
                p.kill()
                p.wait()
                results.setdefault((name, "rtt (ms: median / max of 20)"), []).append(
                    (statistics.median(rtts), max(rtts)))
            p, port = start_proxy(path, sport)
            ssh = ssh_config(port)
            work = [
                ("ssh host true (x5)", lambda: [subprocess.run(ssh + ["ferry-test", "true"], check=True) for _ in range(5)]),
                (f"cat push {a.mib} MiB", lambda: subprocess.run(
                    f"head -c {a.mib}M /dev/zero | {' '.join(ssh)} ferry-test 'cat > /dev/null'", shell=True, check=True)),
                (f"cat pull {a.mib} MiB", lambda: subprocess.run(
                    f"{' '.join(ssh)} ferry-test 'head -c {a.mib}M /dev/zero' > /dev/null", shell=True, check=True)),
            ]
            if a.ferry:
                def push():
                    dst = os.path.join(a.workdir, "there")
                    if os.path.exists(dst):
                        os.rename(dst, os.path.join(a.workdir, f"old-{time.monotonic_ns()}"))
                    subprocess.run([a.ferry, "copy", "-e", " ".join(ssh), "--remote-ferry", a.ferry,
                                    src, f"ferry-test:{dst}"], check=True)
                work.append((f"ferry push {a.files} x 4 KiB", push))

                def rsync():
                    dst = os.path.join(a.workdir, "there")
                    if os.path.exists(dst):
                        os.rename(dst, os.path.join(a.workdir, f"old-{time.monotonic_ns()}"))
                    subprocess.run(["rsync", "-a", "-e", " ".join(ssh), src + "/", f"ferry-test:{dst}"], check=True)
                work.append((f"rsync -a push {a.files} x 4 KiB", rsync))
            for label, fn in work:
                r0, s0 = resource.getrusage(resource.RUSAGE_CHILDREN), server_cpu()
                c0, t = cpu(p.pid), time.perf_counter()
                fn()
                wall, used = time.perf_counter() - t, cpu(p.pid) - c0
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                here = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
                results.setdefault((name, label), []).append((wall, used, here, server_cpu() - s0))
            p.kill()
            p.wait()
finally:
    subprocess.run([os.path.join(repo, "scripts/sshd"), "stop", sdir])
    shutil.rmtree(a.workdir, ignore_errors=True)

print(f"one way {a.one_way_ms} ms; runs {a.runs} (medians)")
print("| proxy | workload | wall s | proxy CPU s | client CPU s | server CPU s |")
print("|---|---|---|---|---|---|")
for (name, label), v in results.items():
    if label.startswith("rtt"):
        print(f"| {name} | {label} | {statistics.median(x for x, _ in v):.2f} / {max(y for _, y in v):.2f} | | | |")
    else:
        m = [statistics.median(r[k] for r in v) for k in range(4)]
        print(f"| {name} | {label} | {m[0]:.2f} | {m[1]:.2f} | {m[2]:.2f} | {m[3]:.2f} |")
