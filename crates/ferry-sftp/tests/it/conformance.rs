//! The conformance suite on SFTP, against a real OpenSSH server
//! (`scripts/sshd`, `FERRY_TEST_SSH_*` and `FERRY_TEST_SFTP_*`): once on
//! its ordinary endpoint (`Subsystem sftp internal-sftp`), once on the
//! chroot that serves SFTP only (no shell, no ferry). Each test skips with
//! a line saying so when the server is not set up.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use ferry_conformance::{local::read_only, Denied, Fixture, Outside};
use ferry_engine::keep::KeepBase;
use ferry_sftp::SftpStore;
use ferry_ssh::Target;

fn var(k: &str) -> Result<String, String> {
    std::env::var(k).map_err(|_| format!("{k} is not set (scripts/test starts sshd)"))
}

struct Sftp {
    tmp: tempfile::TempDir,
    host: String,
    /// The tree's path as the server names it.
    path: Vec<u8>,
    store: SftpStore,
}

impl Fixture for Sftp {
    type Store = SftpStore;
    fn store(&self) -> &SftpStore {
        &self.store
    }
    fn mtime_step_ns(&self) -> u32 {
        1_000_000_000
    }
    fn keeps_times_before_epoch(&self) -> bool {
        false
    }
    fn denied(&self) -> Result<Denied<SftpStore>, String> {
        let guard = read_only(self.tmp.path())?;
        let store = open(&self.host, &self.path)?;
        Ok(Denied {
            store,
            guard: Box::new(guard),
        })
    }
    fn outside(&self) -> Result<Outside<SftpStore>, String> {
        // A sibling of the tree, named as the server names it.
        let local = self.tmp.path().parent().expect("in a directory");
        let remote = &self.path[..self.path.iter().rposition(|&b| b == b'/').unwrap_or(0)];
        let other = fixture(
            self.host.clone(),
            local,
            std::str::from_utf8(remote).map_err(|e| e.to_string())?,
        )?;
        Ok(Outside {
            base: KeepBase::Abs(other.path.clone()),
            store: open(&self.host, &other.path)?,
            guard: Box::new(other),
        })
    }
}

fn open(host: &str, path: &[u8]) -> Result<SftpStore, String> {
    let set = ferry_ssh::Settings {
        rsh: Some(var("FERRY_TEST_SSH_RSH")?),
        ..Default::default()
    };
    Ok(SftpStore::open(&Target::with(host, None, &set)?, path)?)
}

/// A fresh tree in `local` (a directory here) that the server at `host`
/// names `remote`.
fn fixture(host: String, local: &Path, remote: &str) -> Result<Sftp, String> {
    let tmp = tempfile::tempdir_in(local).map_err(|e| e.to_string())?;
    let mut path = remote.as_bytes().to_vec();
    if !remote.is_empty() {
        path.push(b'/');
    }
    path.extend_from_slice(tmp.path().file_name().unwrap().as_bytes());
    let store = open(&host, &path)?;
    Ok(Sftp {
        tmp,
        host,
        path,
        store,
    })
}

fn plain() -> Result<Sftp, String> {
    let host = var("FERRY_TEST_SSH_HOST")?;
    let base = std::env::temp_dir();
    fixture(host, &base, base.to_str().unwrap())
}

fn chroot() -> Result<Sftp, String> {
    let host = var("FERRY_TEST_SFTP_HOST")?;
    let root = var("FERRY_TEST_SFTP_ROOT")?;
    fixture(host, Path::new(&root), &var("FERRY_TEST_SFTP_PATH")?)
}

fn plain_no_hardlink() -> Result<Sftp, String> {
    let mut fx = plain()?;
    fx.store = fx.store.without_hardlink();
    Ok(fx)
}

ferry_conformance::suite!(conformance, plain);
ferry_conformance::suite!(chrooted, chroot);
// As on a server without hardlink@openssh.com (kept entries are renamed).
ferry_conformance::suite!(no_hardlink, plain_no_hardlink);
