use super::*;
use ferry_engine::{Listing, Store};

fn reg(sftp: bool) -> Backends {
    Backends::new(Settings {
        sftp,
        ..Settings::default()
    })
}

fn root(reg: &Backends, t: &str) -> Result<Root, Error> {
    reg.root_of(&Location::parse(std::ffi::OsStr::new(t)))
}

/// An S3 root (no credentials asked: nothing is requested).
fn s3(bucket: &str, prefix: &str) -> Root {
    Root::S3(Box::new(S3Config {
        endpoint: url::Url::parse("http://127.0.0.1:9/").unwrap(),
        region: "us-east-1".into(),
        bucket: bucket.into(),
        prefix: prefix.into(),
        credentials: None,
        path_style: true,
    }))
}

fn shell(r: Root) -> SshRoot {
    match r {
        Root::Shell(s) => s,
        r => panic!("{r:?}"),
    }
}

#[test]
fn ssh_roots_of_shell_locations() {
    let r = |t: &str| root(&reg(false), t);
    let h = shell(r("u@h:dir/x").unwrap());
    assert_eq!(
        (h.host.as_str(), h.port, &h.path[..], h.sftp),
        ("u@h", None, &b"dir/x"[..], false)
    );
    assert_eq!(Root::Shell(h).id(), "u@h:dir/x");
    let h = shell(r("ssh://u@h:2222/abs/p").unwrap());
    assert_eq!(
        (h.host.as_str(), h.port, &h.path[..]),
        ("u@h", Some(2222), &b"/abs/p"[..])
    );
    assert_eq!(Root::Shell(h).id(), "ssh://u@h:2222/abs/p");
    let h = shell(r("ssh://[::1]/p").unwrap());
    assert_eq!((h.host.as_str(), h.port), ("[::1]", None));
    assert_eq!(shell(r("h:").unwrap()).path, b"");
    assert!(r("ssh://h:port/p")
        .unwrap_err()
        .to_string()
        .contains("bad port"));
}

#[test]
fn sftp_roots_of_shell_locations() {
    let s = shell(root(&reg(false), "sftp://u@h:2200/d").unwrap());
    assert_eq!(
        (s.host.as_str(), s.port, &s.path[..], s.sftp),
        ("u@h", Some(2200), &b"/d"[..], true)
    );
    assert!(!shell(root(&reg(false), "h:d").unwrap()).sftp);
    // --sftp: a setting of this registry, not of the process.
    assert!(shell(root(&reg(true), "h:d").unwrap()).sftp);
    assert!(!shell(root(&reg(false), "h:d").unwrap()).sftp);
}

#[test]
fn an_unknown_scheme_is_refused_with_the_schemes_ferry_knows() {
    let e = root(&reg(false), "gs://b/t").unwrap_err();
    assert!(matches!(e, Error::UnknownScheme { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "gs://b/t: unknown scheme gs:// (ferry knows s3://, ssh://, sftp://; for a local name write ./gs://b/t)"
    );
    assert_eq!(e.class(), ferry_engine::class::Class::Refused);
    // Every scheme of the registry is one a backend claims.
    for s in backend_schemes() {
        let r = root(&reg(false), &format!("{s}://b/p"));
        assert!(!matches!(r, Err(Error::UnknownScheme { .. })), "{s}: {r:?}");
    }
    // Copy and sync name the side.
    let e = reg(false)
        .resolve(Path::new("/"), Path::new("gs://b/t"), false)
        .unwrap_err();
    assert!(
        e.to_string().starts_with("DST gs://b/t: unknown scheme"),
        "{e}"
    );
}

#[test]
fn each_backend_wants_its_workers() {
    let r = reg(false);
    let local = local_root(Path::new("/x"));
    let s3 = s3("b", "p");
    let ssh = root(&r, "h:p").unwrap();
    let sftp = root(&r, "sftp://h/p").unwrap();
    assert_eq!(r.jobs_for(Some(3), &[&local, &local]), 3);
    assert_eq!(r.jobs_for(Some(5), &[&local, &s3]), 5);
    assert_eq!(r.jobs_for(None, &[&local, &s3]), 32);
    // No round trip measured yet: the least.
    assert_eq!(r.jobs_for(None, &[&local, &sftp]), 32);
    assert_eq!(r.jobs_for(None, &[&ssh, &sftp]), 32);
    // No connection waits for its measure: the count now, nothing later.
    let (now, later) = r.jobs_now(None, &[&local, &ssh]);
    assert_eq!((now, later.is_none()), (32, true));
    assert_eq!(r.jobs_now(Some(7), &[&local, &ssh]).0, 7);
    assert!(ssh.jobs() > sftp.jobs() && sftp.jobs() > s3.jobs() && s3.jobs() > local.jobs());
}

#[test]
fn locations_below_roots() {
    let r = reg(false);
    assert_eq!(s3("b", "p/").location(b"x/y"), b"s3://b/p/x/y");
    assert_eq!(root(&r, "h:").unwrap().location(b"f"), b"h:f");
    assert_eq!(root(&r, "h:/d/").unwrap().location(b"f"), b"h:/d/f");
    assert_eq!(
        root(&r, "ssh://h:22/d").unwrap().location(b"f"),
        b"ssh://h:22/d/f"
    );
    assert_eq!(local_root(Path::new("/a")).location(b""), b"/a");
}

#[test]
fn a_local_root_opens_as_any_store_and_forwards() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("f"), b"abc").unwrap();
    let root = local_root(d.path());
    assert_eq!(root.id(), d.path().to_string_lossy());
    let s = reg(false)
        .open(
            &root,
            &Opts {
                jobs: 2,
                lazy_meta: true,
                walk: false,
            },
        )
        .unwrap();
    assert!(matches!(s, AnyStore::Local(_)));
    assert!(s.features().inodes && !s.features().latency_bound && s.hashes().is_none());
    let (dir, meta) = s.open_root().unwrap().expect("exists");
    assert_eq!(meta.kind, ferry_engine::Kind::Dir);
    let mut l = Listing::new();
    s.list(&dir, b"", &mut l, &mut Vec::new()).unwrap();
    let e = &l.entries()[0];
    assert_eq!((l.name(e), e.meta.size), (&b"f"[..], 3));
    assert_ne!(e.meta.ino, 0);
    assert_eq!(e.meta.version, 0);
    let mut r = s.open_file(&dir, c"f").unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(
        ferry_engine::store::SourceFile::read(&mut r, &mut buf).unwrap(),
        3
    );
    // No downloads: nothing to note. No uploads to clean up.
    assert!(s.report("destination").notes.is_empty());
    assert!(s.cleanup().is_none());
}

#[test]
fn each_registry_hands_its_own_settings_to_the_ssh_target() {
    let set = Settings {
        rsh: Some("true -x".into()),
        timeout: Some(std::time::Duration::from_secs(7)),
        connections: Some(3),
        read_only: true,
        ..Settings::default()
    };
    let t = ferry_ssh::Target::with("u@h", Some(2), &shell::ssh_settings(&set)).unwrap();
    assert_eq!(t.rsh, ["true", "-x"]);
    assert_eq!(t.timeout, std::time::Duration::from_secs(7));
    assert_eq!((t.connections, t.read_only), (Some(3), true));
    // Another registry, other settings (a second `configure` used to be
    // ignored): its target is its own, never shares the first's session.
    let other = Settings {
        rsh: Some("true -x".into()),
        ..Settings::default()
    };
    let u = ferry_ssh::Target::with("u@h", Some(2), &shell::ssh_settings(&other)).unwrap();
    assert_eq!(u.timeout, ferry_ssh::quiet::DEFAULT_TIMEOUT);
    assert_eq!((u.connections, u.read_only), (None, false));
    assert_ne!(t, u);
}

/// `AnyStore` has an extension exactly where the backend inside has it,
/// and the engine's answer (`StoreExt`) goes to the backend's: local
/// symlinks and its one shortcut (an empty file made under its name),
/// no symlinks on S3 (`Unsupported`) but its metadata known after a commit.
#[test]
fn any_store_has_the_links_and_pipeline_of_the_backend_inside() {
    use ferry_engine::store::StoreExt;
    use ferry_engine::{Kind, Meta};
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let opts = Opts {
        jobs: 2,
        lazy_meta: false,
        walk: false,
    };
    let meta = |kind, size| Meta {
        kind,
        size,
        mtime_sec: 1_700_000_000,
        mtime_nsec: 5,
        mode: 0o640,
        uid: 0,
        gid: 0,
        ino: 0,
        version: 0,
        rdev: 0,
        sparse: false,
        nlink: 1,
        dev: 0,
        ctime: 0,
    };
    let s = reg(false).open(&local_root(d.path()), &opts).unwrap();
    assert!(s.has_symlinks() && s.links().is_some() && s.pipeline().is_some());
    let (dir, _) = s.open_root().unwrap().expect("exists");
    s.create_symlink(&dir, c"l", b"t/u", &meta(Kind::Symlink, 3))
        .unwrap();
    assert_eq!(s.read_link(&dir, c"l").unwrap(), b"t/u");
    assert!(s.sets_symlink_times(&dir, c"l", &meta(Kind::Symlink, 3)));
    assert!(s
        .create_empty(&dir, c"e", &meta(Kind::File, 0), false)
        .unwrap());
    assert!(!s
        .create_empty(&dir, c"e", &meta(Kind::File, 0), false)
        .unwrap());
    let e = std::fs::metadata(d.path().join("e")).unwrap();
    assert_eq!((e.len(), e.permissions().mode() & 0o777), (0, 0o640));
    assert_eq!(s.meta_after_commit(&meta(Kind::File, 0)), None);

    let s = reg(false).open(&s3("b", "p"), &opts).unwrap();
    assert!(!s.has_symlinks() && s.links().is_none() && s.pipeline().is_some());
    let m = s.meta_after_commit(&meta(Kind::File, 9)).expect("known");
    assert_eq!((m.size, m.mtime_nsec, m.mode), (9, 5, 0o640));
}
