//! `ferry --generate man|complete-bash|complete-zsh|complete-fish`: what
//! README.md tells a user to install after `cargo install`. Each script is
//! loaded by its shell and completes a subcommand; the man page is read by
//! `man` (the page's content is checked by the unit tests in
//! src/generate.rs).

use std::path::Path;
use std::process::{Command, Output};

use crate::util::{bin, skip, tmpdir};

fn generate(kind: &str) -> Output {
    Command::new(bin())
        .args(["--generate", kind])
        .output()
        .expect("run ferry")
}

/// `ferry --generate KIND` into DIR/NAME; its stdout must be the whole of it.
fn write(kind: &str, dir: &Path, name: &str) -> std::path::PathBuf {
    let out = generate(kind);
    assert!(
        out.status.success(),
        "{kind}: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = dir.join(name);
    std::fs::write(&p, &out.stdout).unwrap();
    p
}

fn has(shell: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {shell}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `shell args...`; its stdout, after checking it succeeded.
fn run(shell: &str, args: &[&str]) -> String {
    let out = Command::new(shell).args(args).output().expect(shell);
    assert!(
        out.status.success(),
        "{shell} {args:?}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn bash_completion_loads_and_completes_a_subcommand() {
    let tmp = tmpdir();
    let f = write("complete-bash", tmp.path(), "ferry.bash");
    let f = f.to_str().unwrap();
    run("bash", &["-n", f]);
    // As bash calls it on `ferry sy<TAB>`: the function `complete -F` names.
    let script = format!(
        "source {f}; complete -p ferry; COMP_WORDS=(ferry sy); COMP_CWORD=1; \
         _ferry ferry sy ferry; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    );
    let got = run("bash", &["-c", &script]);
    let mut lines = got.lines();
    assert!(lines.next().unwrap().contains("-F _ferry ferry"), "{got}");
    assert_eq!(lines.collect::<Vec<_>>(), ["sync"], "{got}");
    // And an option of that subcommand.
    let script = format!(
        "source {f}; COMP_WORDS=(ferry sync --dry); COMP_CWORD=2; \
         _ferry ferry --dry sync; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    );
    assert_eq!(run("bash", &["-c", &script]).trim(), "--dry-run");
}

#[test]
fn fish_completion_loads_and_completes_a_subcommand() {
    if !has("fish") {
        return skip(&"fish is not installed (scripts/test installs it)");
    }
    let tmp = tmpdir();
    let f = write("complete-fish", tmp.path(), "ferry.fish");
    let f = f.to_str().unwrap();
    run("fish", &["-n", f]);
    let got = run(
        "fish",
        &["-c", &format!("source {f}; complete -C'ferry sy'")],
    );
    let names: Vec<&str> = got.lines().map(|l| l.split('\t').next().unwrap()).collect();
    assert_eq!(names, ["sync"], "{got}");
    let got = run(
        "fish",
        &[
            "-c",
            &format!("source {f}; complete -C'ferry bisync --resy'"),
        ],
    );
    assert!(got.starts_with("--resync\t"), "{got}");
}

#[test]
fn zsh_completion_loads_and_completes_a_subcommand() {
    if !has("zsh") {
        return skip(&"zsh is not installed (scripts/test installs it)");
    }
    let tmp = tmpdir();
    let f = write("complete-zsh", tmp.path(), "_ferry");
    let fs = f.to_str().unwrap();
    run("zsh", &["-n", fs]);
    // Loaded as a user's fpath loads it: compinit finds `_ferry` and binds
    // it to `ferry`.
    let dump = tmp.path().join("zcompdump");
    let script = format!(
        "fpath=({} $fpath); autoload -Uz compinit; compinit -u -d {}; \
         print -r -- $_comps[ferry]; whence -w _ferry",
        tmp.path().display(),
        dump.display()
    );
    let got = run("zsh", &["-f", "-c", &script]);
    assert_eq!(
        got.lines().collect::<Vec<_>>(),
        ["_ferry", "_ferry: function"],
        "{got}"
    );
    // Completing `ferry sy<TAB>` in an interactive zsh (on a pty: zsh's
    // completion runs only in its line editor) gives `ferry sync`.
    let script = tmp.path().join("complete.zsh");
    std::fs::write(
        &script,
        format!(
            "zmodload zsh/zpty\n\
             zpty z zsh -f -i\n\
             zpty -w z 'PS1=\"> \"; fpath=({dir} $fpath); autoload -Uz compinit; \
             compinit -u -d {dir}/zcompdump2; print READY'\n\
             zpty -r z line '*READY*'\n\
             zpty -w -n z $'ferry sy\\t'\n\
             all=''\n\
             for i in {{1..600}}; do\n\
               zpty -r -t z out && all+=$out\n\
               [[ $all == *'ferry sync'* ]] && break\n\
               sleep 0.1\n\
             done\n\
             zpty -d z\n\
             [[ $all == *'ferry sync'* ]] && print COMPLETED\n",
            dir = tmp.path().display()
        ),
    )
    .unwrap();
    let out = Command::new("zsh")
        .arg("-f")
        .arg(&script)
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let got = String::from_utf8_lossy(&out.stdout);
    assert!(got.contains("COMPLETED"), "{got:?}");
    // What it offers after `ferry `: every visible subcommand.
    let text = std::fs::read_to_string(&f).unwrap();
    for sub in [
        "copy", "sync", "ls", "cleanup", "bisync", "versions", "restore",
    ] {
        assert!(text.contains(&format!("'{sub}:")), "{sub}");
    }
}

#[test]
fn man_page_is_read_by_man() {
    if !has("man") {
        return skip(&"man is not installed (scripts/test installs man-db)");
    }
    let tmp = tmpdir();
    let f = write("man", tmp.path(), "ferry.1");
    let out = Command::new("man")
        .arg("-l")
        .arg(&f)
        .env("MANWIDTH", "100")
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .output()
        .expect("man");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "NAME",
        "SYNOPSIS",
        "COMMANDS",
        "ferry bisync",
        "--max-delete",
        "EXIT STATUS",
    ] {
        assert!(text.contains(want), "{want} not in:\n{text}");
    }
}

#[test]
fn generate_refuses_a_subcommand_and_an_unknown_kind() {
    let out = Command::new(bin())
        .args(["--generate", "man", "sync", "a", "b"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let out = Command::new(bin())
        .args(["--generate", "man", "--timeout", "5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--generate"), "{err}");
    let out = generate("complete-tcsh");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("complete-bash"));
}
