//! What SRC and DST mean (docs/CLI.md, "Arguments"), for any pair of
//! locations: each is parsed once ([`Location`]) and resolved to the root
//! of a store ([`Root`]) by the rules of its backend. Two locations of one
//! backend may follow that backend's own rules ([`Backend::pair`]: two
//! local paths). Every refusal is a usage error (exit 2).
//!
//! [`Backend::pair`]: crate::Backend::pair

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::{Backends, Error, Location, Root, Src};

/// What a copy or sync will do, once SRC and DST are understood.
#[derive(Debug)]
pub struct Job {
    /// The source tree, or the directory (prefix) holding the one file.
    pub src: Root,
    /// The destination tree, or the directory (prefix) to hold the file.
    pub dst: Root,
    /// One file or object: its name in `src` and its name in `dst`.
    pub one: Option<(CString, CString)>,
}

/// A name as a C string; `what` names it in the error.
pub fn cname(n: &OsStr, what: &str) -> Result<CString, Error> {
    CString::new(n.as_bytes()).map_err(|_| Error::Refused(format!("{what}: name contains NUL")))
}

impl Backends {
    /// Resolve SRC and DST of a copy or sync. `force`: a missing
    /// (objectless) SRC prefix is taken as an empty tree instead of
    /// refused.
    pub fn resolve(&self, src: &Path, dst: &Path, force: bool) -> Result<Job, Error> {
        self.resolve_ahead(src, dst, force, &mut |_, _| {})
    }

    /// [`Backends::resolve`], telling `ahead` of the run's local tree (SRC:
    /// 0, DST: 1) as soon as it is known when the other side is not local
    /// (an ssh host, an object store): before that side is reached, so
    /// that the local tree is listed while it connects. A local DST is
    /// told before SRC is reached (its errors still come after SRC's).
    pub fn resolve_ahead(
        &self,
        src: &Path,
        dst: &Path,
        force: bool,
        ahead: &mut dyn FnMut(usize, &Root),
    ) -> Result<Job, Error> {
        let (sl, dl) = (
            Location::parse(src.as_os_str()),
            Location::parse(dst.as_os_str()),
        );
        // An unknown scheme names its side; other errors name themselves.
        fn side(what: &'static str) -> impl Fn(Error) -> Error {
            move |e: Error| match e {
                Error::UnknownScheme { .. } => e.context(what),
                e => e,
            }
        }
        let sr = self.root_of(&sl).map_err(side("SRC "))?;
        // DST's own errors come after SRC's.
        let dr = self.root_of(&dl).map_err(side("DST "));
        if let Ok(dr) = &dr {
            if let Some(job) = self.pair((src, &sr), (dst, dr)) {
                return job;
            }
        }
        // A local DST of a remote SRC, as a tree (when SRC is one file, its
        // listings go unused).
        if let (None, Ok(d)) = (sr.local_path(), &dr) {
            if let (Some(_), Ok(tree)) = (d.local_path(), self.dst_tree(dst, d.clone())) {
                ahead(1, &tree);
            }
        }
        let job = match self.src(src, sr, force)? {
            Src::Tree(s) => {
                if let (Some(_), Ok(None)) = (s.local_path(), dr.as_ref().map(Root::local_path)) {
                    ahead(0, &s);
                }
                Job {
                    src: s,
                    dst: self.dst_tree(dst, dr?)?,
                    one: None,
                }
            }
            Src::One(s, name, typed) => {
                let (d, dname) = self.dst_one(dst, dr?, &typed)?;
                Job {
                    src: s,
                    dst: d,
                    one: Some((cname(&name, "SRC")?, cname(&dname, "DST")?)),
                }
            }
        };
        self.overlap(&job)?;
        Ok(job)
    }

    /// One replica of a bisync, resolved (its id is the name the journal
    /// knows it by); `what`: A or B.
    pub fn resolve_replica(&self, p: &Path, what: &str) -> Result<Root, Error> {
        let loc = Location::parse(p.as_os_str());
        let root = self.root_of(&loc)?;
        self.replica_of(p, root, what)
    }

    /// Refuse replicas that are the same or nested: by their names, then
    /// (another path to one directory: a bind mount, a symlink) by
    /// identity.
    pub fn check_pair(&self, a: &Root, b: &Root) -> Result<(), Error> {
        let (ia, ib) = (a.id(), b.id());
        let nested = |x: &str, y: &str| {
            let y = y.trim_end_matches('/');
            x == y || x.starts_with(&format!("{y}/"))
        };
        if nested(&ia, &ib) || nested(&ib, &ia) {
            return Err(Error::Refused(format!("A {ia} and B {ib} overlap")));
        }
        self.same_replicas(a, b)
    }
}
