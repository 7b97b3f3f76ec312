//! The backend conformance suite (crates/ferry-conformance) on the local store.

use std::os::unix::ffi::OsStrExt;

use ferry_conformance::{local::read_only, Denied, Fixture, Outside};
use ferry_engine::keep::KeepBase;
use ferry_local::LocalStore;

/// A local store rooted in a new temporary directory.
struct Local {
    tmp: tempfile::TempDir,
    store: LocalStore,
}

impl Fixture for Local {
    type Store = LocalStore;
    fn store(&self) -> &LocalStore {
        &self.store
    }
    fn denied(&self) -> Result<Denied<LocalStore>, String> {
        let guard = read_only(self.tmp.path())?;
        let store = LocalStore::new(self.tmp.path(), 2);
        Ok(Denied {
            store,
            guard: Box::new(guard),
        })
    }
    fn outside(&self) -> Result<Outside<LocalStore>, String> {
        let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
        Ok(Outside {
            base: KeepBase::Abs(tmp.path().as_os_str().as_bytes().to_vec()),
            store: LocalStore::new(tmp.path(), 2),
            guard: Box::new(tmp),
        })
    }
}

fn local() -> Result<Local, String> {
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let store = LocalStore::new(tmp.path(), 2);
    Ok(Local { tmp, store })
}

ferry_conformance::suite!(local, local);
