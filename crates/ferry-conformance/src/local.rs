//! Helpers for fixtures of backends over a local directory (the local
//! store; a server under test that serves one).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Keeps a directory read-only until dropped (see [`read_only`]).
pub struct ReadOnly {
    path: PathBuf,
    immutable: bool,
    mode: u32,
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        if self.immutable {
            let _ = Command::new("chattr").arg("-i").arg(&self.path).status();
        }
        let _ = fs::set_permissions(&self.path, fs::Permissions::from_mode(self.mode));
    }
}

/// Make the directory `path` refuse new and removed entries, for us too:
/// mode 0555, and for root (whom modes do not stop) the immutable attribute
/// (`chattr +i`). `Err(reason)` when neither stops us here.
pub fn read_only(path: &Path) -> Result<ReadOnly, String> {
    let mode = fs::metadata(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .permissions()
        .mode()
        & 0o7777;
    let mut guard = ReadOnly {
        path: path.to_path_buf(),
        immutable: false,
        mode,
    };
    fs::set_permissions(path, fs::Permissions::from_mode(0o555))
        .map_err(|e| format!("chmod {}: {e}", path.display()))?;
    if refuses(path) {
        return Ok(guard);
    }
    let chattr = Command::new("chattr").arg("+i").arg(path).output();
    match chattr {
        Ok(o) if o.status.success() => guard.immutable = true,
        Ok(o) => {
            return Err(format!(
                "mode 0555 does not stop this user and chattr +i failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
        Err(e) => {
            return Err(format!(
                "mode 0555 does not stop this user and chattr cannot run: {e}"
            ))
        }
    }
    if refuses(path) {
        Ok(guard)
    } else {
        Err("neither mode 0555 nor chattr +i stops this user".into())
    }
}

/// True when a file cannot be created in `dir`.
fn refuses(dir: &Path) -> bool {
    let probe = dir.join(".conformance-probe");
    match fs::File::create(&probe) {
        Ok(_) => {
            let _ = fs::remove_file(&probe);
            false
        }
        Err(_) => true,
    }
}
