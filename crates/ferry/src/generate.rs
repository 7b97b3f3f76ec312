//! `ferry --generate man|complete-bash|complete-zsh|complete-fish`: the man
//! page and the shell completion scripts, generated from the command line's
//! definition (clap_mangen, clap_complete), so `cargo install` (which
//! installs only the binary) is enough to have them: README.md, "Use", says
//! where to put each. As ripgrep does, a flag of the top-level command
//! rather than a subcommand, and one that takes no other argument.

use std::io::{self, Write};
use std::process::ExitCode;

use clap::{Arg, ArgMatches, Command, CommandFactory};
use clap_complete::aot::{generate, Shell};
use clap_mangen::roff::{bold, roman, Roff};

use crate::args::Cli;

/// The argument's id and its values.
const ID: &str = "generate";
const KINDS: [&str; 4] = ["man", "complete-bash", "complete-zsh", "complete-fish"];

/// `--generate KIND`, added to [`Cli`]'s command (`#[command(arg(...))]`),
/// so `--help`, the man page and the completions show it.
pub fn arg() -> Arg {
    Arg::new(ID)
        .long(ID)
        .value_name("KIND")
        .value_parser(KINDS)
        .exclusive(true)
        .help(
            "Print the man page (man) or a completion script (complete-bash, \
             complete-zsh, complete-fish) on stdout, and exit",
        )
}

/// When the command line asks for `--generate KIND`: writes it on stdout
/// and returns the exit code; `None` for every other command line (the
/// caller parses it as usual, and reports its errors). `ferry --generate`
/// alone takes no subcommand, which the usual parse requires, hence this
/// parse of its own first.
pub fn requested() -> Option<ExitCode> {
    let m: ArgMatches = match Cli::command().subcommand_required(false).try_get_matches() {
        Ok(m) => m,
        // `--generate` with another argument: said as such (the usual
        // parse would say a subcommand is missing).
        Err(e) if e.kind() == clap::error::ErrorKind::ArgumentConflict => {
            let _ = e.print();
            return Some(ExitCode::from(2));
        }
        Err(_) => return None,
    };
    let kind = m.get_one::<String>(ID)?;
    if let Some((sub, _)) = m.subcommand() {
        let msg = format!("--generate takes no subcommand (got '{sub}')");
        let e = Cli::command().error(clap::error::ErrorKind::ArgumentConflict, msg);
        let _ = e.print();
        return Some(ExitCode::from(2));
    }
    let mut out = Vec::new();
    render(kind, &mut out);
    let mut stdout = io::stdout().lock();
    match stdout.write_all(&out).and_then(|()| stdout.flush()) {
        Ok(()) => Some(ExitCode::SUCCESS),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Some(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("ferry: stdout: write: {e}");
            Some(ExitCode::from(1))
        }
    }
}

/// The text of `kind` (one of [`KINDS`]).
pub fn render(kind: &str, out: &mut Vec<u8>) {
    let mut cmd = Cli::command();
    match kind {
        "complete-bash" => generate(Shell::Bash, &mut cmd, "ferry", out),
        "complete-zsh" => generate(Shell::Zsh, &mut cmd, "ferry", out),
        "complete-fish" => generate(Shell::Fish, &mut cmd, "ferry", out),
        _ => man(cmd, out),
    }
}

/// One page for the whole command: the top level's name, synopsis,
/// description and options (clap_mangen), then a COMMANDS section with each
/// visible subcommand's synopsis, description and options, then the exit
/// codes and where the full contract is.
fn man(mut cmd: Command, out: &mut Vec<u8>) {
    cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let page = clap_mangen::Man::new(cmd.clone());
    // Writing into a Vec cannot fail.
    let _ = page.render_title(out);
    let _ = page.render_name_section(out);
    let _ = page.render_synopsis_section(out);
    let _ = page.render_description_section(out);
    let _ = page.render_options_section(out);
    let mut roff = Roff::new();
    roff.control("SH", ["COMMANDS"]);
    let _ = roff.to_writer(out);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        subcommand(sub, out);
    }
    let mut roff = Roff::new();
    roff.control("SH", ["EXIT STATUS"]);
    for (code, what) in [
        ("0", "everything done."),
        (
            "1",
            "some entries failed, each named on stderr (side, path, operation, cause).",
        ),
        (
            "2",
            "a usage or configuration error, or a refused run: nothing was changed.",
        ),
    ] {
        roff.control("TP", [])
            .text([bold(code)])
            .text([roman(what)]);
    }
    roff.control("SH", ["SEE ALSO"]);
    roff.text([roman(
        "docs/CLI.md in ferry's sources: the whole contract (what SRC and DST mean, \
         what is preserved, every backend's rules).",
    )]);
    let _ = roff.to_writer(out);
}

/// One subcommand as a subsection: its synopsis, description and options,
/// rendered by clap_mangen with their section headings made paragraphs.
fn subcommand(sub: &Command, out: &mut Vec<u8>) {
    let name = sub.get_bin_name().unwrap_or_else(|| sub.get_name());
    let mut roff = Roff::new();
    roff.control("SS", [name]);
    let _ = roff.to_writer(out);
    let page = clap_mangen::Man::new(sub.clone());
    let mut body = Vec::new();
    let _ = page.render_synopsis_section(&mut body);
    let _ = page.render_description_section(&mut body);
    let _ = page.render_options_section(&mut body);
    for line in String::from_utf8_lossy(&body).lines() {
        match line.strip_prefix(".SH ") {
            Some("SYNOPSIS") => {}
            Some(_) => out.extend_from_slice(b".PP\n"),
            None => {
                out.extend_from_slice(line.as_bytes());
                out.push(b'\n');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page as `man` shows it: roff's escaped hyphens read back.
    fn page() -> String {
        let mut out = Vec::new();
        render("man", &mut out);
        String::from_utf8(out).unwrap().replace("\\-", "-")
    }

    /// Every visible subcommand and each of its visible options (and the
    /// top level's) is named on the page.
    #[test]
    fn the_man_page_names_every_subcommand_and_option() {
        let page = page();
        // (`ferry help SUBCOMMAND` is clap's own: --help is on the page.)
        let mut cmd = Cli::command().disable_help_subcommand(true);
        cmd.build();
        let mut checked = 0;
        let mut check = |c: &Command| {
            for a in c.get_arguments().filter(|a| !a.is_hide_set()) {
                if let Some(l) = a.get_long() {
                    let bold = format!("\\fB--{l}");
                    assert!(page.contains(&bold), "{}: --{l}", c.get_name());
                    checked += 1;
                }
                if let Some(s) = a.get_short() {
                    let bold = format!("\\fB-{s}\\fR");
                    assert!(page.contains(&bold), "{}: -{s}", c.get_name());
                }
            }
        };
        check(&cmd);
        let subs: Vec<&Command> = cmd.get_subcommands().filter(|s| !s.is_hide_set()).collect();
        assert!(subs.len() >= 7, "{} subcommands", subs.len());
        for sub in subs {
            assert!(
                page.contains(&format!(".SS \"ferry {}\"", sub.get_name()))
                    || page.contains(&format!(".SS ferry {}", sub.get_name())),
                "no section for {}",
                sub.get_name()
            );
            check(sub);
        }
        assert!(checked > 50, "only {checked} options checked");
        assert!(page.contains("--generate"));
        assert!(page.contains(".SH \"EXIT STATUS\""));
    }

    /// The hidden `serve` (ferry's own remote end) is not on the page.
    #[test]
    fn the_man_page_leaves_out_hidden_commands() {
        assert!(!page().contains("ferry serve"));
    }
}
