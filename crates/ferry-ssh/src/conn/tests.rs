use super::target::{cpu_has_aes, fast_cipher, gcm_first, Ask};
use super::*;
use crate::quiet;
use std::process::Command;

#[test]
fn commands_split_as_a_shell_does() {
    let w = |s: &str| split_words(s).unwrap();
    assert_eq!(w("ssh -p 2222  -F cfg"), ["ssh", "-p", "2222", "-F", "cfg"]);
    assert_eq!(
        w(r#"ssh -o 'A B' "c \"d\"" e\ f ''"#),
        ["ssh", "-o", "A B", "c \"d\"", "e f", ""]
    );
    assert!(split_words("ssh 'x").is_err());
    let t = Target {
        rsh: w("ssh -F c"),
        host: "u@h".into(),
        port: Some(22),
        remote_ferry: "/opt/ferry".into(),
        install: false,
        options: Options::Fixed(vec!["-o".into(), "Ciphers=x".into()]),
        connections: None,
        timeout: quiet::DEFAULT_TIMEOUT,
        read_only: false,
    };
    assert_eq!(
        t.argv(),
        [
            "ssh",
            "-F",
            "c",
            "-p",
            "22",
            "-o",
            "Ciphers=x",
            "u@h",
            "/opt/ferry serve"
        ]
    );
    assert_eq!(
        t.subsystem("sftp"),
        [
            "ssh",
            "-F",
            "c",
            "-s",
            "-p",
            "22",
            "-o",
            "Ciphers=x",
            "u@h",
            "sftp"
        ]
    );
}

#[test]
fn aes_gcm_goes_first_only_where_ssh_is_left_to_its_defaults() {
    let w = |s: &str| split_words(s).unwrap();
    // Not OpenSSH's ssh, or a cipher named on its command line: untouched
    // (no `ssh -G` is run for these).
    assert_eq!(fast_cipher(&w("dbclient"), "h", None), None);
    assert_eq!(fast_cipher(&w("ssh -c aes256-ctr"), "h", None), None);
    assert_eq!(
        fast_cipher(&w("ssh -o Ciphers=aes256-ctr"), "h", None),
        None
    );
    if !cpu_has_aes() || Command::new("ssh").arg("-V").output().is_err() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("cfg");
    std::fs::write(&cfg, "Host chosen\n  Ciphers aes256-ctr\n").unwrap();
    let f = cfg.to_str().unwrap();
    // A configuration that chooses: untouched.
    assert_eq!(
        fast_cipher(&w(&format!("ssh -F {f}")), "chosen", None),
        None
    );
    // Defaults: the same ciphers, AES-GCM first.
    let c = fast_cipher(&w(&format!("ssh -F {f}")), "other", Some(2222)).unwrap();
    assert_eq!(
        c,
        "Ciphers=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr,aes192-ctr,aes256-ctr"
    );
}

/// `ssh -G`'s answer is kept for the next run, whose first connection
/// starts with it while `ssh -G` runs again: the guess is the last answer,
/// and a changed answer replaces it (one line per command, host and port).
#[test]
fn the_last_answer_of_ssh_g_is_the_next_guess() {
    if !cpu_has_aes() || Command::new("ssh").arg("-V").output().is_err() {
        return;
    }
    let w = |s: &str| split_words(s).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("cfg");
    let file = dir.path().join("cache/ferry/ssh-ciphers");
    std::fs::write(&cfg, "Host other\n  Ciphers aes256-ctr\n").unwrap();
    let rsh = w(&format!("ssh -F {}", cfg.display()));
    let ask = || Ask::start(&rsh, "h", Some(22), Some(file.clone()));
    let lines = || std::fs::read_to_string(&file).unwrap().lines().count();
    // No answer kept: no guess; the answer (defaults: AES-GCM first) kept.
    let a = ask();
    assert_eq!(a.guess, None);
    assert_eq!(a.truth(), Some(gcm_first()));
    assert_eq!(lines(), 1);
    // The next run guesses it, and it is right.
    let b = ask();
    assert_eq!(b.guess, Some(Some(gcm_first())));
    assert_eq!(b.truth(), Some(gcm_first()));
    // The configuration now chooses: the guess is wrong, the answer kept.
    std::fs::write(&cfg, "Host h\n  Ciphers aes256-ctr\n").unwrap();
    let c = ask();
    assert_eq!(c.guess, Some(Some(gcm_first())));
    assert_eq!(c.truth(), None);
    assert_eq!(lines(), 1);
    assert_eq!(ask().guess, Some(None));
    // Another host: a line of its own; a damaged file is no guess.
    let other = Ask::start(&rsh, "other", None, Some(file.clone()));
    assert_eq!(other.truth(), Some(gcm_first()));
    assert_eq!(lines(), 2);
    std::fs::write(&file, "garbage\n\0\n").unwrap();
    assert_eq!(ask().guess, None);
}

#[test]
fn failed_sessions_are_classified_from_what_ssh_said() {
    let t = Target {
        rsh: vec!["ssh".into()],
        host: "h".into(),
        port: None,
        remote_ferry: "ferry".into(),
        install: true,
        options: Options::Fixed(Vec::new()),
        connections: None,
        timeout: quiet::DEFAULT_TIMEOUT,
        read_only: false,
    };
    let c = |code, l: &str| classify(&t, Some(code), &[l.to_string()]);
    assert!(c(
        255,
        "ssh: Could not resolve hostname h: Name or service not known"
    )
    .contains("host unreachable"));
    assert!(c(255, "u@h: Permission denied (publickey).").contains("authentication failed"));
    assert!(c(255, "Host key verification failed.").contains("host key verification failed"));
    // Unknown, changed, refused: each says what happened and what to do.
    let tl = |lines: &[&str]| {
        let v: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        classify(&t, Some(255), &v)
    };
    let unknown = tl(&[
        "No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict checking.",
        "Host key verification failed.",
    ]);
    assert!(
        unknown.contains("known_hosts has no key for this host"),
        "{unknown}"
    );
    assert!(!unknown.contains("not the one"), "{unknown}");
    let changed = tl(&[
        "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @",
        "  ssh-keygen -f \"/k\" -R \"[127.0.0.1]:2222\"",
        "Host key for [127.0.0.1]:2222 has changed and you have requested strict checking.",
        "Host key verification failed.",
    ]);
    assert!(changed.contains("key changed"), "{changed}");
    assert!(changed.contains("ssh-keygen -f \"/k\" -R"), "{changed}");
    assert!(is_ssh_failure(&unknown) && is_ssh_failure(&changed));
    let refused = c(255, "u@h: Permission denied (publickey).");
    assert!(refused.contains("authorized_keys"), "{refused}");
    assert!(c(127, "bash: line 1: ferry: command not found").contains("no ferry on the remote"));
    assert!(c(1, "boom").contains("exited with status 1"));
    // What ssh failed at is told apart from what the remote could not run.
    assert!(is_ssh_failure(&c(
        255,
        "ssh: connect to host h port 22: Connection refused"
    )));
    assert!(is_ssh_failure(&c(
        255,
        "u@h: Permission denied (publickey)."
    )));
    assert!(is_ssh_failure(&c(255, "Host key verification failed.")));
    assert!(!is_ssh_failure(&c(127, "sh: 1: ferry: not found")));
    assert!(!is_ssh_failure(&c(1, "boom")));
}

#[test]
fn only_a_change_no_reply_confirms_makes_the_end_waited_for() {
    use crate::conn::unconfirmed;
    use crate::proto::Req;
    // Confirmed later (the file's commit says how its data went), or no change.
    for r in [
        Req::Close { handle: 3 },
        Req::ListAhead { path: b"/x" },
        Req::Write {
            file: 7,
            data: b"abc",
        },
        Req::SetLen { file: 7, size: 3 },
        Req::PartAttach {
            path: b"/x",
            file: 7,
        },
    ] {
        assert!(!unconfirmed(&r), "{r:?}");
    }
    // A discard, a best-effort record: nothing confirms them but the session's end.
    for r in [
        Req::Abort { dir: 1, file: 7 },
        Req::PatchAbort { file: 7 },
        Req::PartRecord {
            file: 7,
            ranges: vec![(0, 4096)],
        },
    ] {
        assert!(unconfirmed(&r), "{r:?}");
    }
}
