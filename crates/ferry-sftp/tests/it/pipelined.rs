//! Commits without waiting (`PipelineStore::commit_nowait`), moved on by the
//! session's reader thread, against a real OpenSSH server (`scripts/sshd`,
//! `FERRY_TEST_SSH_*`): many at once land whole with their mode and mtime;
//! one whose rename fails says so and leaves no temporary; one given up
//! (never waited for) leaves no temporary. Skipped with a line saying so
//! when the server is not set up.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use ferry_conformance::{c, file_meta, root, Bytes, Pattern};
use ferry_engine::store::{Store, StoreExt};
use ferry_sftp::SftpStore;
use ferry_ssh::Target;

/// A store over a fresh directory here (the server is this machine), or
/// why not.
fn store() -> Result<(tempfile::TempDir, SftpStore), String> {
    let var = |k: &str| {
        std::env::var(k).map_err(|_| format!("{k} is not set (scripts/test starts sshd)"))
    };
    let host = var("FERRY_TEST_SSH_HOST")?;
    let set = ferry_ssh::Settings {
        rsh: Some(var("FERRY_TEST_SSH_RSH")?),
        ..Default::default()
    };
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = tmp.path().join("tree");
    let s = SftpStore::open(
        &Target::with(&host, None, &set)?,
        path.as_os_str().as_bytes(),
    )?;
    Ok((tmp, s))
}

macro_rules! need {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(why) => {
                eprintln!("skipped: {why}");
                return;
            }
        }
    };
}

/// Names in `dir` that are ferry's temporaries.
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".ferry-"))
        .collect()
}

#[test]
fn commits_in_flight_land_whole_and_a_failed_rename_leaves_no_temporary() {
    let (tmp, s) = need!(store());
    let dir = root(&s);
    let here = tmp.path().join("tree");
    // Small files sent whole at commit, streamed ones (past a write
    // request's size) with their writes in flight, and names that are a
    // non-empty directory by the time of the rename.
    let sizes = |i: u64| match i % 10 {
        0 => 300 << 10,
        _ => 1 + (i * 977) % 8192,
    };
    let mut going = Vec::new();
    for i in 0..240u64 {
        let name = format!("f{i:03}");
        let meta = file_meta(
            sizes(i),
            (1_600_000_000 + i as i64, 0),
            0o600 + (i as u32 % 0o100),
        );
        let mut w = s.create_file(&dir, &c(name.as_bytes()), &meta).unwrap();
        let n = s.write_from(
            &dir,
            &mut w,
            &mut Pattern::new(meta.size, i),
            meta.size,
            None,
        );
        assert_eq!(n.unwrap(), meta.size);
        if i % 40 == 7 {
            std::fs::create_dir_all(here.join(&name).join("inside")).unwrap();
        }
        going.push((
            i,
            name.clone(),
            meta,
            s.commit_nowait(&dir, w, &c(name.as_bytes()), &meta, false),
        ));
    }
    for (i, name, meta, commit) in going {
        let r = commit.wait();
        let p = here.join(&name);
        if i % 40 == 7 {
            assert!(r.is_err(), "{name}: renamed over a non-empty directory");
            assert!(p.join("inside").is_dir(), "{name}");
            continue;
        }
        r.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            std::fs::read(&p).unwrap(),
            Pattern::bytes(meta.size, i),
            "{name}"
        );
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, meta.mode, "{name}");
        assert_eq!(m.mtime(), meta.mtime_sec, "{name}");
    }
    assert_eq!(temporaries(&here), Vec::<String>::new());
}

#[test]
fn a_commit_given_up_leaves_no_temporary() {
    let (tmp, s) = need!(store());
    let dir = root(&s);
    let here = tmp.path().join("tree");
    let data = vec![7u8; 4096];
    let meta = file_meta(4096, (1_600_000_000, 0), 0o644);
    for k in 0..20 {
        let name = format!("g{k:02}");
        let mut w = s.create_file(&dir, &c(name.as_bytes()), &meta).unwrap();
        s.write_from(&dir, &mut w, &mut Bytes(&data), 4096, None)
            .unwrap();
        drop(s.commit_nowait(&dir, w, &c(name.as_bytes()), &meta, false));
    }
    // A commit waited for after them on the same sessions: the given-up
    // ones' requests were sent before its own, their temporaries go.
    for _ in 0..50 {
        for k in 0..8 {
            let name = format!("w{k}");
            let mut w = s.create_file(&dir, &c(name.as_bytes()), &meta).unwrap();
            s.write_from(&dir, &mut w, &mut Bytes(&data), 4096, None)
                .unwrap();
            s.commit_nowait(&dir, w, &c(name.as_bytes()), &meta, false)
                .wait()
                .unwrap();
        }
        if temporaries(&here).is_empty() {
            break;
        }
    }
    assert_eq!(temporaries(&here), Vec::<String>::new());
    // Nothing given up is half there: a name is absent or whole.
    for k in 0..20 {
        if let Ok(b) = std::fs::read(here.join(format!("g{k:02}"))) {
            assert_eq!(b, data);
        }
    }
}
