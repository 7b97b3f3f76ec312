//! Starting ferry on a host, and self-install: one ssh connection runs a
//! small POSIX-sh prologue ([`start_script`]) that execs the ferry there,
//! or, when there is none it may run, says what it found in the same round
//! trip: the host's OS and architecture, its C library and version, its
//! cache directory and whether a cached file is there ([`Report`]). A host
//! with ferry costs one connection, as rsync's does.
//!
//! The cache is `${XDG_CACHE_HOME:-$HOME/.cache}/ferry/ferry-<version>-<id>`
//! (id: the first 16 hex digits of this build's GNU build-id, else of its
//! SHA-256). A cached file is run without hashing it when its marker
//! (`NAME.ok`, written by the install or by one check) still matches it:
//! the file's size, mtime, ctime, inode and owner and the directory's
//! inode, owner and mode (no write for group or others), from the remote's
//! `stat`. Anything else (no marker, a file changed, moved, touched or
//! chmod'ed, a directory others may write) makes the next start check the
//! file's SHA-256 there once ([`Look::Verify`]) and write the marker again,
//! or stop with one line when it is not this binary ([`NOT_THIS`]).
//!
//! What is shipped is this binary without debug info or symbol table
//! ([`shipped`], stripped here in memory), sent gzip-compressed when the
//! host has `gzip`. The upload goes to a temporary name in the cache
//! directory, its SHA-256 is checked there once, and it is made
//! executable and linked to its final name, which never replaces a file.
//!
//! Runs that start at once on a host without ferry race to install it:
//! each uploads to a temporary name of its own, and the link that makes
//! the final name is atomic, so a final name, once there, is whole. A run
//! whose link finds the name taken (another run won) checks that file's
//! SHA-256 and runs it when it is this binary: the race costs an upload,
//! never the run.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::conn::Target;
use crate::proto;
use crate::SessionError;

/// The SHA-256 of a file on the remote, printed as 64 hex digits (GNU
/// coreutils, or the BSDs' and macOS's shasum); nothing when neither runs.
const SUM: &str = "{ sha256sum \"$1\" || shasum -a 256 \"$1\"; } 2>/dev/null | cut -c1-64";

/// The first line of what the start command prints when it runs no ferry.
pub const PROBE: &str = "#ferry-probe";

/// The last line of the start command's report: the client reads up to
/// it and closes its side at once, not waiting for the end of a stream
/// that an `-e` wrapper may hold open until then (`tee -a LOG | ssh ...`).
pub const REPORT_END: &str = "#ferry-end";

/// What every command ferry runs through the remote shell prints first (a
/// newline, so that output not ending in one is cut off from it): what
/// comes before it is the shell's own, a start-up file that prints
/// (`~/.bashrc`'s `echo`, a banner), which ferry skips ([`skip_to_start`])
/// where rsync's protocol fails ("is your shell clean?").
pub const START: &[u8] = b"\n#ferry-start\n";

/// The shell's part of [`START`] (no backslash: a wrapper that logs its command line
/// with `echo` would expand one).
const START_SH: &str = "echo; echo '#ferry-start'";

/// At most this much of what the remote shell prints before [`START`] is
/// skipped.
const NOISE_MAX: usize = 64 << 10;

/// Read `r` up to and including [`START`], never past it: what came before
/// (the remote shell's own output). `UnexpectedEof` when the stream ends
/// first; `InvalidData` past 64 KiB.
pub fn skip_to_start(r: &mut impl std::io::Read) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    loop {
        if buf.ends_with(START) {
            buf.truncate(buf.len() - START.len());
            return Ok(buf);
        }
        if buf.len() > NOISE_MAX {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "the remote shell wrote more than {} KiB before ferry's command ran (starting {:?})",
                    NOISE_MAX >> 10,
                    String::from_utf8_lossy(&buf[..buf.len().min(40)])
                ),
            ));
        }
        // The longest end of `buf` that begins START: read only the rest
        // of START, so nothing after it is taken from the stream.
        let k = (1..START.len())
            .rev()
            .find(|&k| buf.ends_with(&START[..k]))
            .unwrap_or(0);
        let mut chunk = [0u8; 16];
        let want = START.len() - k;
        match r.read(&mut chunk[..want])? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The note for what the remote shell printed before ferry's command.
pub fn noise_note(host: &str, noise: &[u8]) -> String {
    let text = String::from_utf8_lossy(noise);
    let first: String = text.trim().chars().take(60).collect();
    format!(
        "ferry: note: {host}: the remote shell printed {} bytes before ferry's command ran ({first:?}): skipped; a start-up file there writes to stdout (rsync and scp fail on such a host)",
        noise.len()
    )
}

/// What the start command may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Look {
    /// The cached ferry when its marker matches, else `ferry` on the PATH.
    Fast,
    /// The cached ferry when its marker matches (the PATH's is of another
    /// protocol).
    NoPath,
    /// The cached ferry when its marker matches, or when its SHA-256 is
    /// this binary's (then marked again).
    Verify,
}

/// The cache directory, the cached file, and `k`: the key a marker holds
/// (file: size, mtime, ctime, inode, owner; directory: inode, owner, mode).
/// The times to the nanosecond (GNU stat's `%.9Y`): a file removed and
/// written anew within the same second may get the same inode back, and
/// whole seconds would then let it pass for the marked one.
/// GNU stat's format of a marker's fields.
macro_rules! marker_stat {
    () => {
        "%s %.9Y %.9Z %i %u %a"
    };
}

/// The `stat -c` format a marker is made of (the file's size, mtime,
/// ctime, inode, owner, mode; of the directory the last three): tests
/// that make a marker use it. Run in the C locale: GNU stat writes `%.9Y`
/// with the locale's decimal separator (`1795851273,388403511` under
/// de_DE.UTF-8, which ssh's `SendEnv LANG LC_*` brings to the session),
/// and a marker written in one locale must match in every other.
pub const MARKER_STAT: &str = marker_stat!();

const PRELUDE: &str = concat!("d=\"${XDG_CACHE_HOME:-$HOME/.cache}/ferry\"; f=\"$d/$1\"; k() { set -- $(LC_ALL=C stat -c '", marker_stat!(), "' \"$f\" \"$d\" 2>/dev/null); [ $# = 12 ] || set -- $(stat -f '%z %m %c %i %u %Lp' \"$f\" \"$d\" 2>/dev/null); [ $# = 12 ] && K=\"$1 $2 $3 $4 $5 ${10} ${11} ${12}\"; }; mark() { [ -O \"$d\" ] && chmod go-w \"$d\" && k && echo \"$K\" > \"$f.ok.$$\" && mv -f \"$f.ok.$$\" \"$f.ok\" || rm -f \"$f.ok.$$\"; } 2>/dev/null");

/// The marker matches the cached file: it runs.
const MARKED: &str = "[ -f \"$f\" ] && [ ! -h \"$f\" ] && read -r m 2>/dev/null < \"$f.ok\" && k && [ \"$K\" = \"$m\" ]";

/// The guard of a start: a process of the session there (its output
/// nowhere) that, once the ssh session's sshd is gone (the client gave up
/// or was killed), kills every process of the session's process group:
/// the start command and what it runs, whatever they wait on. The sshd is
/// the parent of the session's leader, read from `/proc` (Linux): only a
/// start command in a process group that is its session's (as sshd makes
/// it: `setsid`) has a guard. `g` is its pid, empty when there is none; the
/// cached ferry stops it once its session has started (`serve
/// --start-guard`), the start command when it runs anything else or ends.
const GUARD: &str = "p=; { read -r x < /proc/$$/stat && set -- $x && [ \"$5\" = \"$6\" ] && read -r x < /proc/$6/stat && set -- $x && p=$4; } 2>/dev/null; g=; if [ \"$p\" -gt 1 ] 2>/dev/null && kill -0 \"$p\" 2>/dev/null; then (while kill -0 \"$p\" 2>/dev/null; do sleep 1; done; kill -KILL 0) </dev/null >/dev/null 2>&1 & g=$!; fi; unguard() { [ -z \"$g\" ] || kill \"$g\" 2>/dev/null; }";

/// The one-line command that starts ferry on a host (`sh -c` runs it with
/// the cache name as `$1`): see [`Look`]. When it runs none it prints
/// [`PROBE`] and what a [`Report`] reads, and exits 0. Its `GUARD` ends
/// it, and the cached ferry it started, when the connection goes before
/// the session has started.
pub fn start_script(look: Look, sum: &str) -> String {
    let run = "exec \"$f\" serve ${g:+--start-guard \"$g\"} ${w:+\"--walk-ahead=$w\"}";
    let mut s = format!("{START_SH}; w=$2; {PRELUDE}; {GUARD}; if {MARKED}; then {run}; fi; o=");
    match look {
        Look::Fast => {
            s.push_str("; command -v ferry >/dev/null 2>&1 && { unguard; exec ferry serve; }")
        }
        Look::NoPath => {}
        Look::Verify => s.push_str(&format!(
            "; sum() {{ {SUM}; }}; if [ -h \"$f\" ]; then o=symlink; elif [ -f \"$f\" ]; then o=$(sum \"$f\"); if [ \"$o\" = {sum} ]; then mark; {run}; fi; fi"
        )),
    }
    s.push_str(&format!(
        "; unguard; echo '{PROBE}'; echo \"os $(uname -sm)\"; echo \"dir $d\"; if [ -e \"$f\" ]; then echo \"cache there $o\"; fi; echo \"libc $( {{ getconf GNU_LIBC_VERSION 2>/dev/null || ldd --version 2>&1; }} | head -n 1)\"; if command -v gzip >/dev/null 2>&1; then echo gzip; fi; echo '{REPORT_END}'"
    ));
    s
}

/// The tree a run walks there as the start command's second argument
/// (`$2`, quoted), which it gives the cached ferry it runs (`serve
/// --walk-ahead=PATH`: that ferry answers the tree's first levels
/// unasked), or `None`: a path whose bytes are not all printable ASCII, or
/// that holds `!` or `\`, goes only in the session's first write, as
/// before. The command line passes through the user's login shell there,
/// whatever it is (csh expands `!` in single quotes and takes no newline
/// in them; fish reads `\` in them).
pub fn walk_word(path: &[u8]) -> Option<String> {
    let plain = path
        .iter()
        .all(|&b| (b' '..=b'~').contains(&b) && b != b'!' && b != b'\\');
    if !plain {
        return None;
    }
    Some(quote(std::str::from_utf8(path).ok()?))
}

/// What the start command found on a host where it ran no ferry.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// `uname -sm` there.
    pub os: String,
    /// The cache directory there.
    pub dir: String,
    /// A file of the cache name is there (its marker did not match).
    pub cached: bool,
    /// Its SHA-256, when it was checked ([`Look::Verify`]).
    pub cached_sum: Option<String>,
    /// `getconf GNU_LIBC_VERSION`, else the first line of `ldd --version`.
    pub libc: String,
    /// `gzip` is there.
    pub gzip: bool,
}

impl Report {
    /// Read what the start command printed after [`PROBE`].
    pub fn parse(text: &str) -> Report {
        let mut r = Report::default();
        for line in text.lines() {
            let (k, v) = line.split_once(' ').unwrap_or((line, ""));
            match k {
                "os" => r.os = v.trim().to_string(),
                "dir" => r.dir = v.to_string(),
                "cache" => {
                    r.cached = true;
                    let s = v.trim_start_matches("there").trim();
                    r.cached_sum = (!s.is_empty()).then(|| s.to_string());
                }
                "libc" => r.libc = v.trim().to_string(),
                "gzip" => r.gzip = true,
                _ => {}
            }
        }
        r
    }
}

/// The C library a binary needs to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Libc {
    /// None: statically linked.
    Static,
    /// glibc, at least this version (the highest `GLIBC_x.y` it names).
    Glibc(Vec<u32>),
    /// musl's dynamic loader.
    Musl,
    /// Something else (another loader, not ELF).
    Unknown,
}

impl Libc {
    fn of(elf: &[u8]) -> Libc {
        use object::read::{Object, ObjectSection};
        let Ok(file) = object::read::File::parse(elf) else {
            return Libc::Unknown;
        };
        let Some(interp) = file.section_by_name(".interp") else {
            return Libc::Static;
        };
        let interp = interp.data().unwrap_or_default();
        let has = |s: &[u8]| interp.windows(s.len()).any(|w| w == s);
        if has(b"ld-musl") {
            return Libc::Musl;
        }
        if !has(b"ld-linux") {
            return Libc::Unknown;
        }
        let dynstr = file
            .section_by_name(".dynstr")
            .and_then(|s| s.data().ok())
            .unwrap_or_default();
        let need = dynstr
            .split(|b| *b == 0)
            .filter_map(|s| s.strip_prefix(b"GLIBC_"))
            .filter_map(|v| parse_version(std::str::from_utf8(v).ok()?))
            .max()
            .unwrap_or_default();
        Libc::Glibc(need)
    }
}

/// `2.36` as `[2, 36]`; `None` when it is not numbers and dots.
fn parse_version(s: &str) -> Option<Vec<u32>> {
    let v: Option<Vec<u32>> = s.split('.').map(|p| p.parse().ok()).collect();
    v.filter(|v| !v.is_empty())
}

fn show(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(".")
}

/// Why a binary that needs `need` cannot run on a host whose C library
/// is `there` ([`Report::libc`]); `None` when it can, or when that is not
/// known (then it is tried).
pub fn libc_mismatch(need: &Libc, there: &str) -> Option<String> {
    let low = there.to_ascii_lowercase();
    let musl = low.contains("musl");
    let glibc = if low.contains("glibc") || low.contains("gnu libc") || low.starts_with("ldd ") {
        there.split_whitespace().last().and_then(parse_version)
    } else {
        None
    };
    match need {
        Libc::Static | Libc::Unknown => None,
        Libc::Glibc(v) if musl => Some(format!(
            "its C library is musl, this ferry is built for glibc {} or later",
            show(v)
        )),
        Libc::Glibc(v) => match glibc {
            Some(g) if g < *v => Some(format!(
                "its glibc is {}, older than the {} this ferry is built for",
                show(&g),
                show(v)
            )),
            _ => None,
        },
        Libc::Musl if glibc.is_some() => {
            Some("its C library is glibc, this ferry is built for musl".into())
        }
        Libc::Musl => None,
    }
}

/// The binary shipped to hosts: this one without debug info or symbol
/// table, its SHA-256, and what C library it needs.
pub struct Ship {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Their SHA-256, in hex.
    pub sum: String,
    /// The C library it needs.
    pub libc: Libc,
}

/// How bytes are sent: gzip's level 1, compressed while they are sent (so
/// compressing and sending overlap; level 6 would send 7% fewer bytes
/// for three times the CPU: bench/LOG.md, "Issue 29: one connection to start").
const GZIP_LEVEL: u32 = 1;

/// Write `bytes` to `w` gzip-compressed, in pieces.
fn write_gz(w: impl Write, bytes: &[u8]) -> std::io::Result<()> {
    let mut e = flate2::write::GzEncoder::new(w, flate2::Compression::new(GZIP_LEVEL));
    bytes.chunks(256 << 10).try_for_each(|c| e.write_all(c))?;
    e.finish()?.flush()
}

/// This binary as shipped (made once per run).
pub fn shipped() -> Result<&'static Ship, SessionError> {
    static SHIP: OnceLock<Result<Ship, SessionError>> = OnceLock::new();
    SHIP.get_or_init(|| {
        let exe = std::env::current_exe().map_err(|e| format!("this ferry's binary: {e}"))?;
        let raw = std::fs::read(&exe).map_err(|e| format!("{}: {e}", exe.display()))?;
        let libc = Libc::of(&raw);
        let bytes = strip(&raw).unwrap_or(raw);
        let sum = hex(&Sha256::digest(&bytes));
        Ok(Ship { bytes, sum, libc })
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// `elf` without its debug info and symbol table (what `strip` leaves);
/// `None` when it is not an ELF file this can rewrite, or has nothing to
/// take out.
pub fn strip(elf: &[u8]) -> Option<Vec<u8>> {
    let mut b = object::build::elf::Builder::read(elf).ok()?;
    let mut any = false;
    for s in b.sections.iter_mut() {
        let n: &[u8] = &s.name;
        if n.starts_with(b".debug") || n == b".symtab" || n == b".strtab" {
            s.delete = true;
            any = true;
        }
    }
    if !any {
        return None;
    }
    for s in b.symbols.iter_mut() {
        s.delete = true;
    }
    b.delete_orphans();
    let mut out = Vec::with_capacity(elf.len() / 4);
    b.write(&mut out).ok()?;
    Some(out)
}

/// `ferry-<version>-<id>`: this build's name in a host's cache (id: its
/// GNU build-id, read from the first pages of the binary; else its
/// SHA-256, read whole).
pub fn cache_name() -> Result<&'static str, SessionError> {
    static NAME: OnceLock<Result<String, SessionError>> = OnceLock::new();
    NAME.get_or_init(|| {
        let exe = std::env::current_exe().map_err(|e| format!("this ferry's binary: {e}"))?;
        let mut head = Vec::new();
        std::fs::File::open(&exe)
            .and_then(|f| f.take(64 << 10).read_to_end(&mut head))
            .map_err(|e| format!("{}: {e}", exe.display()))?;
        let id = match build_id(&head) {
            Some(id) if id.len() >= 8 => hex(&id),
            _ => {
                let raw = std::fs::read(&exe).map_err(|e| format!("{}: {e}", exe.display()))?;
                hex(&Sha256::digest(&raw))
            }
        };
        Ok(format!("ferry-{}-{}", proto::version(), &id[..16]))
    })
    .as_ref()
    .map(String::as_str)
    .map_err(Clone::clone)
}

/// The GNU build-id of an ELF file (64-bit, little-endian) whose program
/// headers and notes are within `head`.
fn build_id(head: &[u8]) -> Option<Vec<u8>> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(head.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(head.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(head.get(o..o + 8)?.try_into().ok()?));
    if head.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let (phoff, phsz, phnum) = (u64_at(0x20)? as usize, u16_at(0x36)?, u16_at(0x38)?);
    for i in 0..usize::from(phnum) {
        let ph = phoff + i * usize::from(phsz);
        if u32_at(ph)? != 4 {
            continue; // not PT_NOTE
        }
        let (off, size) = (u64_at(ph + 8)? as usize, u64_at(ph + 32)? as usize);
        let mut at = off;
        while at + 12 <= off + size {
            let (nsz, dsz, ty) = (
                u32_at(at)? as usize,
                u32_at(at + 4)? as usize,
                u32_at(at + 8)?,
            );
            let name = at + 12;
            let desc = name + nsz.div_ceil(4) * 4;
            if ty == 3 && head.get(name..name + nsz)? == b"GNU\0" {
                return Some(head.get(desc..desc + dsz)?.to_vec());
            }
            at = desc + dsz.div_ceil(4) * 4;
        }
    }
    None
}

/// Install this binary in `r`'s cache on `t`'s host, when it can run there
/// (`why`: why no ferry ran). `Err` is the one line saying why it cannot
/// be, and what to do.
pub fn install(t: &Target, r: &Report, why: &str) -> Result<(), SessionError> {
    let fail = |what: String| {
        SessionError(format!("{what}; {why} (ferry installs itself only on the same OS and architecture; --no-remote-install turns that off)"))
    };
    let here = local_uname().map_err(|e| fail(format!("uname here: {e}")))?;
    if r.os.trim() != here.trim() {
        return Err(fail(format!(
            "{}: the remote is {:?}, this machine {:?}",
            t.host,
            r.os.trim(),
            here.trim()
        )));
    }
    let ship = shipped().map_err(|e| fail(e.0))?;
    if let Some(m) = libc_mismatch(&ship.libc, &r.libc) {
        return Err(SessionError(format!(
            "{}: this ferry cannot run there: {m} ({:?}): install ferry there, or use --sftp",
            t.host, r.libc
        )));
    }
    if !r.dir.starts_with('/') {
        return Err(fail(format!(
            "{}: no cache directory (is $HOME set?)",
            t.host
        )));
    }
    let name = cache_name().map_err(|e| fail(e.0))?;
    let path = format!("{}/{name}", r.dir);
    // The upload: to a temporary name, checked, then linked to the final
    // name (`ln` fails rather than replace a file that appeared since).
    // When the link finds the name taken, by a run that installed at the
    // same time (or by anyone), that file's hash is the answer: `there
    // HASH`. A link that fails with no file there is tried again for its
    // error.
    let body = Some((ship.bytes.as_slice(), r.gzip));
    let out = match run(t, &put_script(&r.dir, name, &ship.sum, r.gzip), body) {
        Ok(o) => o,
        // ssh failed or was killed: the one line says so (the run stops).
        Err(e) if e.ssh_failed() => {
            return Err(SessionError(format!("{e} (installing ferry in {path})")))
        }
        Err(e) => return Err(fail(format!("{}: installing ferry in {path}: {e}", t.host))),
    };
    match out.trim().strip_prefix("there") {
        // Installed by another run meanwhile: run it when it is this ferry.
        Some(s) if s.trim() == ship.sum => Ok(()),
        Some(s) => Err(SessionError(not_this(t, &path, s.trim()))),
        None if out.trim() == "installed" => {
            eprintln!("ferry: note: installed this ferry on {} as {path}", t.host);
            Ok(())
        }
        None => Err(fail(format!(
            "{}: installing ferry: {}",
            t.host,
            out.trim()
        ))),
    }
}

/// The shell command that installs the bytes on its stdin (gzip's when
/// `gz`) as `dir/name` when their SHA-256 is `sum`, and writes its marker.
/// It prints `installed`, or `there HASH` when the name was taken before
/// its link (HASH: that file's). Its temporary goes however it ends: an
/// upload cut short (this ferry or its ssh killed) ends its input or hangs
/// it up.
fn put_script(dir: &str, name: &str, sum: &str, gz: bool) -> String {
    format!(
        "set -- {n}; {PRELUDE}; sum() {{ {SUM}; }}; set -e; umask 022; d={d}; f=\"$d/$1\"; mkdir -p \"$d\"; t=\"$d/.$1.$$.tmp\"; trap 'rm -f \"$t\"' EXIT; trap 'exit 4' HUP INT TERM PIPE; {get} > \"$t\"; [ \"$(sum \"$t\")\" = {sum} ] || {{ echo 'the upload arrived changed' >&2; exit 3; }}; chmod 755 \"$t\"; if ln \"$t\" \"$f\" 2>/dev/null; then rm -f \"$t\"; mark || :; echo installed; elif [ -e \"$f\" ]; then echo \"there $(sum \"$f\")\"; else ln \"$t\" \"$f\"; fi",
        n = quote(name),
        d = quote(dir),
        get = if gz { "gzip -dc" } else { "cat" },
    )
}

/// Part of the one line for a cached file that is not this binary: the
/// run stops there (exit 2), served neither by it nor over SFTP.
pub const NOT_THIS: &str = "is not this ferry";

/// The one line for `path` on `t`'s host, whose SHA-256 there is `sum`
/// (empty: unknown), not this binary's.
pub fn not_this(t: &Target, path: &str, sum: &str) -> String {
    format!(
        "{}: {path} {NOT_THIS} (its SHA-256 is {:?}): ferry does not replace a file it did not write; remove it, or name a ferry with --remote-ferry PATH",
        t.host,
        match sum {
            "" => "unknown",
            "symlink" => "none: a symbolic link",
            s => s,
        }
    )
}

/// `uname -sm` of this machine.
fn local_uname() -> std::io::Result<String> {
    let o = Command::new("uname").arg("-sm").output()?;
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Run `cmd` on `t`'s host with `input` on its stdin (gzip-compressed
/// when its flag is set): its stdout, or what it said on stderr when it
/// failed. Given up (ssh killed) when nothing moves either way for
/// `--timeout`.
fn run(t: &Target, cmd: &str, input: Option<(&[u8], bool)>) -> Result<String, SessionError> {
    let argv = t.command(&format!(
        "sh -c {} sh",
        quote(&format!("{START_SH}; {cmd}"))
    ));
    let mut c = Command::new(&argv[0]);
    c.args(&argv[1..])
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c
        .spawn()
        .map_err(|e| SessionError(format!("cannot run {:?}: {e}", argv[0])))?;
    let quiet = crate::quiet::Quiet::start(
        child.id(),
        format!("{}: ssh failed: no answer while installing ferry", t.host),
        t.timeout,
    );
    let feed = input.map(|(b, gz)| {
        let mut stdin = crate::quiet::Writing {
            inner: child.stdin.take().expect("piped"),
            quiet: quiet.clone(),
        };
        let b = b.to_vec();
        std::thread::spawn(move || {
            // In pieces, so that the timeout sees each one move.
            if gz {
                write_gz(stdin, &b)
            } else {
                b.chunks(256 << 10).try_for_each(|c| stdin.write_all(c))
            }
        })
    });
    let mut err = String::new();
    let mut errp = child.stderr.take().expect("piped");
    let errt = std::thread::spawn(move || {
        let _ = errp.read_to_string(&mut err);
        err
    });
    let mut out = Vec::new();
    let _ = crate::quiet::Reading {
        inner: child.stdout.take().expect("piped"),
        quiet: quiet.clone(),
    }
    .read_to_end(&mut out);
    // What the remote shell printed before the command's START is its own.
    let out = match out.windows(START.len()).position(|w| w == START) {
        Some(i) => String::from_utf8_lossy(&out[i + START.len()..]).into_owned(),
        None => String::from_utf8_lossy(&out).into_owned(),
    };
    quiet.reaped();
    quiet.stop();
    let status = child.wait().map_err(|e| SessionError(e.to_string()))?;
    let err = errt.join().unwrap_or_default();
    let fed = feed.map(|f| f.join());
    if let Some(why) = quiet.fired() {
        return Err(SessionError(why));
    }
    // ssh itself failed (exit 255: unreachable, authentication, ...) or
    // was killed: said as for a session, so that the run stops (exit 2)
    // rather than take the host for one where ferry cannot run.
    if status.code() == Some(255) {
        let tail: Vec<String> = err.lines().map(str::to_string).collect();
        return Err(SessionError(crate::conn::classify(t, Some(255), &tail)));
    }
    if status.code().is_none() {
        return Err(SessionError(format!("{}: ssh failed: {status}", t.host)));
    }
    if !status.success() {
        // The last words on stderr, else on stdout (an SFTP-only server
        // answers a command with a line there).
        let last = |s: &str| {
            s.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(|l| l.trim().to_string())
        };
        let why = last(&err).or_else(|| last(&out));
        return Err(SessionError(match why {
            Some(w) => format!("{status}: {w}"),
            None => status.to_string(),
        }));
    }
    if let Some(Ok(Err(e))) = fed {
        return Err(SessionError(e.to_string()));
    }
    Ok(out)
}

/// `s` in single quotes for a POSIX shell.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_a_shell() {
        let s = "a'b \"c\" $d";
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!("printf %s {}", quote(s)))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout), s);
        assert_eq!(hex(&[0, 0xab]), "00ab");
    }

    /// `script` run here by `sh` with `args`, `input` on its stdin, the
    /// cache under `cache` and a PATH without ferry: its stdout.
    fn sh(script: &str, args: &[&str], cache: &std::path::Path, input: &[u8]) -> String {
        let mut c = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .args(args)
            .env("XDG_CACHE_HOME", cache)
            .env("PATH", "/usr/bin:/bin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(input).unwrap();
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// What comes before START is skipped, glued to it or not, and nothing
    /// after it is read; a stream that ends first, or a flood, is an error.
    #[test]
    fn the_remote_shells_own_output_is_skipped_up_to_start() {
        let after = b"FERRY-SERVE\nrest";
        for noise in [
            &b""[..],
            b"Welcome!\n",
            b"no newline",
            b"\n#ferry-sta",
            b"#ferry-start",
        ] {
            let mut s = noise.to_vec();
            s.extend_from_slice(START);
            s.extend_from_slice(after);
            let mut r = &s[..];
            assert_eq!(skip_to_start(&mut r).unwrap(), noise, "{noise:?}");
            assert_eq!(r, after, "{noise:?}");
        }
        let mut r = &b"Welcome!\n"[..];
        assert_eq!(
            skip_to_start(&mut r).unwrap_err().kind(),
            std::io::ErrorKind::UnexpectedEof
        );
        let flood = vec![b'x'; NOISE_MAX + 100];
        let mut r = &flood[..];
        assert_eq!(
            skip_to_start(&mut r).unwrap_err().kind(),
            std::io::ErrorKind::InvalidData
        );
        assert!(noise_note("h", b"Welcome!\n").contains("\"Welcome!\""));
    }

    /// The install step, run here by `sh`: the first install links the
    /// file and writes its marker; one that finds the name taken (a run
    /// that installed at the same time, or a planted file) answers with
    /// that file's hash and leaves it alone; no temporary stays behind
    /// either way. Sent compressed, it arrives whole.
    #[test]
    fn the_install_step_answers_for_a_name_taken_meanwhile() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cache dir's");
        let dir_s = dir.to_str().unwrap();
        let put = |bytes: &[u8], gz: bool| {
            let sum = hex(&Sha256::digest(bytes));
            let body = if gz {
                let mut z = Vec::new();
                write_gz(&mut z, bytes).unwrap();
                z
            } else {
                bytes.to_vec()
            };
            sh(
                &put_script(dir_s, "ferry-x", &sum, gz),
                &[],
                tmp.path(),
                &body,
            )
            .trim()
            .to_string()
        };
        let names = || {
            let mut v: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            v.sort();
            v
        };
        assert_eq!(put(b"ferry", true), "installed");
        assert_eq!(std::fs::read(dir.join("ferry-x")).unwrap(), b"ferry");
        assert_eq!(names(), ["ferry-x", "ferry-x.ok"]);
        // Another run's upload of the same binary finds it there.
        let same = hex(&Sha256::digest(b"ferry"));
        assert_eq!(put(b"ferry", false), format!("there {same}"));
        // A file of other content planted under the name: its hash, not replaced.
        std::fs::remove_file(dir.join("ferry-x")).unwrap();
        std::fs::write(dir.join("ferry-x"), b"planted").unwrap();
        let planted = hex(&Sha256::digest(b"planted"));
        assert_eq!(put(b"ferry", true), format!("there {planted}"));
        assert_eq!(std::fs::read(dir.join("ferry-x")).unwrap(), b"planted");
        assert_eq!(names(), ["ferry-x", "ferry-x.ok"]);
    }

    /// The start command, run here by `sh`: with nothing cached it reports
    /// (this machine's OS, libc, the cache directory); once a ferry is
    /// installed it runs it without hashing it (its marker matches); a
    /// cached file touched since is reported, then checked once by its
    /// SHA-256, run and marked again; one of other content is reported
    /// with its hash, never run.
    #[test]
    fn the_start_command_runs_a_marked_cache_and_reports_otherwise() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("c");
        let dir = cache.join("ferry");
        // A stand-in ferry: it stops the guard it is given, as `serve
        // --start-guard` does, and says it ran.
        let fake = b"#!/bin/sh\n[ \"$2\" = --start-guard ] && kill -9 \"$3\"\necho ran \"$1\"\n";
        let sum = hex(&Sha256::digest(fake));
        // What the start command prints begins with START.
        let start = |look| {
            let o = sh(&start_script(look, &sum), &["ferry-x"], &cache, b"");
            let o = o
                .as_bytes()
                .strip_prefix(START)
                .unwrap_or_else(|| panic!("{o:?}"));
            String::from_utf8_lossy(o).into_owned()
        };
        let report = |out: &str| {
            let rest = out.strip_prefix(PROBE).unwrap_or_else(|| panic!("{out}"));
            Report::parse(rest)
        };
        let r = report(&start(Look::Fast));
        assert_eq!(r.os.trim(), local_uname().unwrap().trim());
        assert_eq!(r.dir, dir.to_str().unwrap());
        assert!(!r.cached && !r.libc.is_empty(), "{r:?}");
        let put = put_script(dir.to_str().unwrap(), "ferry-x", &sum, false);
        assert_eq!(sh(&put, &[], &cache, fake).trim(), "installed");
        for look in [Look::Fast, Look::NoPath] {
            assert_eq!(start(look).trim(), "ran serve");
        }
        // Touched: reported, then checked and marked again.
        let f = dir.join("ferry-x");
        let old = std::fs::metadata(&f).unwrap().modified().unwrap();
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(old - std::time::Duration::from_secs(60))
            .unwrap();
        let r = report(&start(Look::Fast));
        assert!(r.cached && r.cached_sum.is_none(), "{r:?}");
        assert_eq!(start(Look::Verify).trim(), "ran serve");
        assert_eq!(start(Look::NoPath).trim(), "ran serve");
        // The directory opened to others (anyone could have put a file there): reported,
        // then checked, closed to others again and marked.
        let mode =
            |m| std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(m));
        mode(0o777).unwrap();
        let r = report(&start(Look::Fast));
        assert!(r.cached && r.cached_sum.is_none(), "{r:?}");
        assert_eq!(start(Look::Verify).trim(), "ran serve");
        let now = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&dir).unwrap().permissions(),
        );
        assert_eq!(now & 0o022, 0, "{now:o}");
        assert_eq!(start(Look::NoPath).trim(), "ran serve");
        // Other content under the name: reported with its hash.
        std::fs::remove_file(&f).unwrap();
        std::fs::write(&f, b"#!/bin/sh\necho planted\n").unwrap();
        let r = report(&start(Look::Verify));
        assert_eq!(
            r.cached_sum.as_deref(),
            Some(hex(&Sha256::digest(b"#!/bin/sh\necho planted\n")).as_str())
        );
        // A symbolic link under the name, even to this very ferry: never run.
        std::fs::remove_file(&f).unwrap();
        std::fs::write(tmp.path().join("real"), fake).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("real"), &f).unwrap();
        let r = report(&start(Look::Verify));
        assert_eq!(r.cached_sum.as_deref(), Some("symlink"));
    }

    #[test]
    fn reports_parse_and_libcs_compare() {
        let r = Report::parse(
            "\nos Linux x86_64\ndir /h/.cache/ferry\ncache there abc\nlibc glibc 2.17\ngzip\n",
        );
        assert_eq!(r.os, "Linux x86_64");
        assert_eq!(r.dir, "/h/.cache/ferry");
        assert!(r.cached && r.gzip);
        assert_eq!(r.cached_sum.as_deref(), Some("abc"));
        let need = Libc::Glibc(vec![2, 34]);
        assert!(libc_mismatch(&need, "glibc 2.17")
            .unwrap()
            .contains("glibc is 2.17, older than the 2.34"));
        assert!(libc_mismatch(&need, "ldd (GNU libc) 2.28").is_some());
        assert_eq!(libc_mismatch(&need, "glibc 2.34"), None);
        assert_eq!(libc_mismatch(&need, "glibc 2.40"), None);
        assert_eq!(libc_mismatch(&need, "ldd (Debian GLIBC 2.36-9) 2.36"), None);
        assert!(libc_mismatch(&need, "musl libc (x86_64)")
            .unwrap()
            .contains("musl"));
        assert_eq!(libc_mismatch(&need, "sh: ldd: not found"), None);
        assert_eq!(libc_mismatch(&Libc::Static, "musl libc (x86_64)"), None);
        assert!(libc_mismatch(&Libc::Musl, "glibc 2.36").is_some());
    }

    /// This test binary: its build-id read from its first pages, its glibc
    /// need, and a stripped copy that has no debug info and still runs.
    #[test]
    fn a_binary_stripped_here_runs() {
        use object::read::{Object, ObjectSection};
        let exe = std::env::current_exe().unwrap();
        let raw = std::fs::read(&exe).unwrap();
        assert!(build_id(&raw[..64 << 10]).is_some_and(|id| id.len() >= 8));
        assert!(matches!(Libc::of(&raw), Libc::Glibc(v) if v >= vec![2, 2]));
        let Some(small) = strip(&raw) else {
            return; // nothing to take out
        };
        assert!(small.len() < raw.len());
        let f = object::read::File::parse(&*small).unwrap();
        assert!(!f
            .sections()
            .any(|s| s.name().unwrap_or("").starts_with(".debug")));
        assert_eq!(build_id(&small[..64 << 10]), build_id(&raw[..64 << 10]));
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("stripped");
        std::fs::write(&p, &small).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let o = Command::new(&p).arg("--list").output().unwrap();
        assert!(o.status.success(), "{o:?}");
        assert!(String::from_utf8_lossy(&o.stdout).contains("a_binary_stripped_here_runs"));
    }
}
