//! The harness of the `--watch` tests (`watch.rs`, `bisync_watch.rs`): a running
//! `ferry ... --watch`, its stderr lines (and its `--json` lines, when asked), waiting until
//! something holds, and SIGTERM with its exit code.
//!
//! Every wait is bounded only to keep a broken watch from hanging the suite: a replica
//! converges whenever it does, no timing is asserted.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use super::*;

/// How long a wait may take before the test gives up (a hang guard).
pub const WAIT: Duration = Duration::from_secs(60);

/// A running `ferry ... --watch`, its stderr lines forwarded to a channel.
pub struct Watch {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    /// Its stdout's JSON lines (`spawn_json`).
    json: Option<mpsc::Receiver<Json>>,
    seen: Vec<String>,
}

/// A test that fails leaves no watch running behind it.
impl Drop for Watch {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Each line `read` gives, sent (as `f` makes it) until the test stops listening.
fn forward<R, T, F>(read: R, f: F) -> mpsc::Receiver<T>
where
    R: std::io::Read + Send + 'static,
    T: Send + 'static,
    F: Fn(String) -> T + Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(read).lines().map_while(Result::ok) {
            if tx.send(f(l)).is_err() {
                break;
            }
        }
    });
    rx
}

impl Watch {
    /// `ferry ARGS --watch SRC DST`.
    pub fn start(args: &[&str], src: impl AsRef<OsStr>, dst: impl AsRef<OsStr>) -> Watch {
        let mut cmd = Command::new(bin());
        cmd.args(args).arg("--watch").arg(src).arg(dst);
        Watch::spawn(cmd)
    }

    /// Any command that ends up as a watching ferry (its pid ferry's).
    pub fn spawn(mut cmd: Command) -> Watch {
        cmd.stdout(Stdio::null());
        Watch::with(cmd, |_| None)
    }

    /// Like `spawn`, for a `--json` watch: each stdout line must be JSON (and is echoed to
    /// the test's stderr, for a failing test's log).
    pub fn spawn_json(mut cmd: Command) -> Watch {
        cmd.stdout(Stdio::piped());
        Watch::with(cmd, |c| {
            Some(forward(c.stdout.take().expect("stdout"), |l| {
                eprintln!("watch: {l}");
                parse_json(&l).expect("a JSON line")
            }))
        })
    }

    fn with(
        mut cmd: Command,
        json: impl FnOnce(&mut Child) -> Option<mpsc::Receiver<Json>>,
    ) -> Watch {
        cmd.stdin(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn ferry");
        let json = json(&mut child);
        let lines = forward(child.stderr.take().expect("stderr"), |l| l);
        Watch {
            child,
            lines,
            json,
            seen: Vec::new(),
        }
    }

    /// Wait until the watching ferry holds an inotify instance (the
    /// kernel has read its limits then).
    pub fn until_inotify(&mut self) {
        let fds = format!("/proc/{}/fd", self.child.id());
        let end = Instant::now() + WAIT;
        while !std::fs::read_dir(&fds).is_ok_and(|ds| {
            ds.flatten().any(|d| {
                std::fs::read_link(d.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:inotify")
            })
        }) {
            if Instant::now() > end {
                panic!("no inotify instance\nferry stderr:\n{}", self.stderr());
            }
            // Checked often: the limit it waits for is the machine's.
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The stderr lines so far.
    pub fn stderr(&mut self) -> String {
        while let Ok(l) = self.lines.try_recv() {
            self.seen.push(l);
        }
        self.seen.join("\n")
    }

    /// The first stderr line containing `what` (waits for it).
    pub fn line_with(&mut self, what: &str) -> String {
        self.nth_line_with(what, 1)
    }

    /// The address (`host:port`) of the status page the watch says it serves
    /// (`--status`; waits for the line).
    pub fn status_addr(&mut self) -> String {
        let line = self.line_with("status on http://");
        line.split("http://")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .expect("an address")
            .to_string()
    }

    /// The `n`th stderr line containing `what` (from 1; waits for it).
    pub fn nth_line_with(&mut self, what: &str, n: usize) -> String {
        let end = Instant::now() + WAIT;
        loop {
            if let Some(l) = self.seen.iter().filter(|l| l.contains(what)).nth(n - 1) {
                return l.clone();
            }
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => panic!(
                    "no line {n} with {what:?}; stderr:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Wait until `ok()`; `what` names it if it never comes.
    #[track_caller]
    pub fn until(&mut self, what: &str, mut ok: impl FnMut() -> bool) {
        self.until_none(|| (!ok()).then(|| what.to_string()));
    }

    /// Wait until `left()` says nothing is left (`None`); if the bound comes first, panic
    /// with what it said last and the stderr so far.
    #[track_caller]
    pub fn until_none(&mut self, mut left: impl FnMut() -> Option<String>) {
        let end = Instant::now() + WAIT;
        while let Some(what) = left() {
            if Instant::now() > end {
                panic!("{what}\nferry stderr:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Send `sig` (a name as `kill` takes it: TERM, STOP, CONT...).
    #[track_caller]
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// SIGSTOP, and wait until every thread of ferry is stopped (state T
    /// in `/proc/PID/task/*/stat`): what is done next is read after SIGCONT.
    #[track_caller]
    pub fn freeze(&mut self) {
        self.signal("STOP");
        let tasks = format!("/proc/{}/task", self.child.id());
        self.until("ferry stopped", || {
            std::fs::read_dir(&tasks).is_ok_and(|ts| {
                ts.flatten().all(|t| {
                    std::fs::read_to_string(t.path().join("stat"))
                        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('T')))
                })
            })
        });
    }

    /// SIGKILL, and wait for the end.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM: the exit code and the whole stderr.
    pub fn stop(mut self) -> (Option<i32>, String) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let end = Instant::now() + WAIT;
        let code = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s.code();
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                panic!("ferry did not exit after SIGTERM:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The reader thread ends with the pipe.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(l);
        }
        (code, self.seen.join("\n"))
    }

    /// SIGTERM, which must exit 0: the whole stderr.
    #[track_caller]
    pub fn stop_ok(self) -> String {
        let (code, err) = self.stop();
        assert_eq!(code, Some(0), "exit after SIGTERM; stderr:\n{err}");
        err
    }

    fn json(&self) -> &mpsc::Receiver<Json> {
        self.json.as_ref().expect("a watch made by spawn_json")
    }

    /// The run summaries (`--json`) that came so far.
    pub fn summaries(&mut self) -> Vec<Json> {
        let mut v = Vec::new();
        while let Ok(l) = self.json().try_recv() {
            if l["type"] == "summary" {
                v.push(l);
            }
        }
        v
    }

    /// The next JSON line if one came (`--json`).
    pub fn try_json(&mut self) -> Option<Json> {
        self.json().try_recv().ok()
    }

    /// The next JSON line (`--json`; waits for it).
    pub fn next_json(&mut self) -> Json {
        match self.json().recv_timeout(WAIT) {
            Ok(l) => l,
            Err(_) => panic!("no JSON line; stderr:\n{}", self.stderr()),
        }
    }

    /// The next run summary (`--json`; waits for it).
    pub fn summary(&mut self) -> Json {
        let end = Instant::now() + WAIT;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.json().recv_timeout(left) {
                Ok(l) if l["type"] == "summary" => return l,
                Ok(_) => {}
                Err(_) => panic!("no run summary; stderr:\n{}", self.stderr()),
            }
        }
    }
}

/// Wait until `dst` equals `src` (names, kinds, bytes, mtimes, modes, link targets).
#[track_caller]
pub fn converge(src: &Path, dst: &Path, w: &mut Watch) {
    w.until_none(|| {
        if !dst.exists() {
            return Some(format!("{} is not made", dst.display()));
        }
        let d = tree_diffs(src, dst);
        (!d.is_empty()).then(|| format!("no convergence:\n{}", d.join("\n")))
    });
}

/// Names a shell, a line-based format or a UTF-8 string gets wrong: a newline, non-UTF-8
/// bytes, spaces, a leading dash or space.
pub const ODD: [&[u8]; 5] = [b"new\nline", b"caf\xe9", b"with space", b"-dash", b" lead"];

/// `pre` and `n` joined, as a path of one component.
pub fn odd(pre: &str, n: &[u8]) -> PathBuf {
    let mut v = pre.as_bytes().to_vec();
    v.extend_from_slice(n);
    PathBuf::from(OsStr::from_bytes(&v))
}

/// The concurrent writer of the model test: on its own thread, at random
/// moments while the watch runs, it writes new files in chunks, appends,
/// replaces files (a new file renamed over), rewrites in place, deletes,
/// under `root/DIR`; returns what each of its files must hold at the end.
pub fn concurrent_writer(
    root: PathBuf,
    dir: &str,
    seed: u64,
    ops: usize,
) -> BTreeMap<String, Vec<u8>> {
    let mut rng = Rng::new(seed);
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    fs::create_dir_all(root.join(dir)).unwrap();
    for i in 0..ops {
        let names: Vec<String> = model.keys().cloned().collect();
        let pick =
            (!names.is_empty()).then(|| names[rng.range(0, names.len() as u64) as usize].clone());
        let data = gen_bytes(rng.range(0, 30_000) as usize, rng.next_u64());
        match (rng.range(0, 6), pick) {
            (0, _) | (_, None) => {
                let name = format!("{dir}/n{i}");
                let mut f = fs::File::create(root.join(&name)).unwrap();
                for c in data.chunks(7_000) {
                    f.write_all(c).unwrap();
                    // A random moment between two writes of one file.
                    if rng.chance(1, 2) {
                        std::thread::sleep(Duration::from_millis(rng.range(0, 15)));
                    }
                }
                model.insert(name, data);
            }
            (1, Some(n)) => {
                let mut f = fs::OpenOptions::new()
                    .append(true)
                    .open(root.join(&n))
                    .unwrap();
                f.write_all(&data).unwrap();
                model.get_mut(&n).unwrap().extend_from_slice(&data);
            }
            (2, Some(n)) => {
                let tmp = root.join(format!("{dir}/.tmp{i}"));
                fs::write(&tmp, &data).unwrap();
                fs::rename(&tmp, root.join(&n)).unwrap();
                model.insert(n, data);
            }
            (3, Some(n)) => {
                fs::write(root.join(&n), &data).unwrap();
                model.insert(n, data);
            }
            (_, Some(n)) => {
                fs::remove_file(root.join(&n)).unwrap();
                model.remove(&n);
            }
        }
        if rng.chance(1, 3) {
            std::thread::sleep(Duration::from_millis(rng.range(0, 40)));
        }
    }
    model
}
