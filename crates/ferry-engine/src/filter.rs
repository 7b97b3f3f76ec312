//! Exclude rules in gitignore syntax, compiled once into one matcher
//! (`ignore::gitignore`), so thousands of rules do not cost a linear scan per
//! path. Paths are matched relative to the root of the tree being synced.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use ignore::gitignore::{Gitignore, GitignoreBuilder};

/// A compiled set of exclude rules.
#[derive(Debug)]
pub struct Filter {
    matcher: Gitignore,
}

/// A rule that could not be read or parsed.
#[derive(Debug)]
pub struct FilterError(pub String);

impl std::fmt::Display for FilterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Filter {
    /// Build from `--exclude` globs and `--exclude-from` files. Returns
    /// `None` when there are no rules (the fast path: no matching at all).
    pub fn new(globs: &[String], files: &[PathBuf]) -> Result<Option<Filter>, FilterError> {
        if globs.is_empty() && files.is_empty() {
            return Ok(None);
        }
        // Root "/" so that anchored patterns (`/build`) anchor at the tree root
        // and we can match relative paths joined onto it.
        let mut b = GitignoreBuilder::new("/");
        for f in files {
            let text = std::fs::read_to_string(f)
                .map_err(|e| FilterError(format!("{}: {}", f.display(), e)))?;
            for line in text.lines() {
                b.add_line(Some(f.clone()), line)
                    .map_err(|e| FilterError(format!("{}: {}", f.display(), e)))?;
            }
        }
        for g in globs {
            b.add_line(None, g)
                .map_err(|e| FilterError(format!("--exclude {g:?}: {e}")))?;
        }
        let matcher = b.build().map_err(|e| FilterError(e.to_string()))?;
        Ok(Some(Filter { matcher }))
    }

    /// True when `dir/name` (relative to the root) is excluded.
    pub fn excluded(&self, dir: &[u8], name: &[u8], is_dir: bool) -> bool {
        let mut p = Vec::with_capacity(dir.len() + name.len() + 2);
        p.push(b'/');
        p.extend_from_slice(dir);
        if !dir.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(name);
        let path = Path::new(OsStr::from_bytes(&p));
        self.matcher.matched(path, is_dir).is_ignore()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(globs: &[&str]) -> Filter {
        Filter::new(
            &globs.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            &[],
        )
        .unwrap()
        .unwrap()
    }

    #[test]
    fn gitignore_semantics() {
        let m = f(&["*.log", "build/", "/top", "!keep.log"]);
        assert!(m.excluded(b"", b"a.log", false));
        assert!(m.excluded(b"x/y", b"a.log", false));
        assert!(!m.excluded(b"", b"keep.log", false));
        assert!(m.excluded(b"src", b"build", true));
        assert!(!m.excluded(b"src", b"build", false));
        assert!(m.excluded(b"", b"top", false));
        assert!(!m.excluded(b"sub", b"top", false));
        assert!(!m.excluded(b"", b"a.txt", false));
    }

    #[test]
    fn no_rules_is_none() {
        assert!(Filter::new(&[], &[]).unwrap().is_none());
    }
}
