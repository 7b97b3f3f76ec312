//! The integration tests of ferry-backends (one binary): the library used
//! as README.md shows it, through `examples/sync.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The example's binary, built beside this test's (`cargo test` and
/// `cargo nextest run` build a crate's examples with its tests; a run
/// filtered to this test binary alone may not, so it is built then).
fn example(name: &str) -> PathBuf {
    let me = std::env::current_exe().unwrap();
    let profile_dir = me.parent().unwrap().parent().unwrap();
    let bin = profile_dir.join("examples").join(name);
    if !bin.exists() {
        let profile = match profile_dir.file_name().unwrap().to_str().unwrap() {
            "debug" => "dev",
            p => p,
        };
        let st = Command::new(env!("CARGO"))
            .args([
                "build",
                "-p",
                "ferry-backends",
                "--example",
                name,
                "--profile",
                profile,
            ])
            .status()
            .expect("cargo build --example");
        assert!(st.success(), "cargo build --example {name}: {st:?}");
    }
    bin
}

fn put(p: &Path, data: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

/// `examples/sync.rs SRC DST` makes DST equal to SRC: new and changed files
/// copied (nested ones too), what SRC lacks deleted, exit 0.
#[test]
fn the_sync_example_syncs_two_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    put(&src.join("a.txt"), "alpha");
    put(&src.join("sub/b.txt"), "beta");
    put(&dst.join("a.txt"), "old content");
    put(&dst.join("gone/c.txt"), "not in SRC");
    let out = Command::new(example("sync"))
        .arg(&src)
        .arg(&dst)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("errors: 0"), "{stdout}");
    assert_eq!(std::fs::read_to_string(dst.join("a.txt")).unwrap(), "alpha");
    assert_eq!(
        std::fs::read_to_string(dst.join("sub/b.txt")).unwrap(),
        "beta"
    );
    assert!(!dst.join("gone").exists());
    let mut names: Vec<_> = std::fs::read_dir(&dst)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["a.txt", "sub"]);
}
