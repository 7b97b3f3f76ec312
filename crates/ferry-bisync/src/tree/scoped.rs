//! The scoped walk of `bisync --watch`: only the directories a watcher saw
//! change, from where they are known in sync on both sides.

use super::*;

/// The directories of a scoped walk, from the root: `/` paths, `true` for
/// one walked whole. (What a watcher saw change.)
pub type ScopeDirs = [(Vec<u8>, bool)];

/// A scoped walk's start: a directory (`/` path), whether it is walked
/// whole, and its open parent on each side (`None`: the root).
type Start<A, B> = (Vec<u8>, bool, Option<Both<A, B>>);

/// A directory open on both sides.
type Both<A, B> = (Arc<<A as Store>::Dir>, Arc<<B as Store>::Dir>);

/// Where a scoped walk starts for one directory of the scope: the
/// directory itself when it and each directory on its way from the root
/// are directories on both sides that the journal knows as one (in sync
/// as directories), else the nearest such ancestor (whose merge then sees
/// what differs below it and walks there). `None`: the directory is not
/// synced (excluded, or kept versions). The open parents on each side are
/// returned with it (`None` for the root).
fn resolve<A: Store, B: Store>(
    a: &A,
    b: &B,
    roots: (&Arc<A::Dir>, &Arc<B::Dir>),
    j: &dyn Records,
    o: &ScanOpts<'_, A, B>,
    rel: &[u8],
) -> io::Result<Option<Start<A, B>>> {
    let mut at: Vec<u8> = Vec::new();
    let mut cur: Both<A, B> = (roots.0.clone(), roots.1.clone());
    let mut parent: Option<Both<A, B>> = None;
    for c in rel.split(|&x| x == b'/').filter(|c| !c.is_empty()) {
        if o.reserved.holds(&at, c) || o.filter.is_some_and(|f| f.excluded(&at, c, true)) {
            return Ok(None);
        }
        let name = CString::new(c).map_err(io::Error::other)?;
        let dir = |m: Option<Meta>| m.is_some_and(|m| m.kind == Kind::Dir);
        let both = dir(a.stat(&cur.0, &name)?)
            && dir(b.stat(&cur.1, &name)?)
            && j.get(&key_of(&at), c)
                .map_err(io::Error::other)?
                .is_some_and(|r| r.a.kind == Kind::Dir);
        if !both {
            return Ok(Some((at, false, parent)));
        }
        let next = (
            Arc::new(a.open_dir(&cur.0, &name)?),
            Arc::new(b.open_dir(&cur.1, &name)?),
        );
        parent = Some(std::mem::replace(&mut cur, next));
        at = join(&at, c);
    }
    Ok(Some((at, true, parent)))
}

/// [`scan_merge`] of some directories only (`scope`, see [`ScopeDirs`]):
/// each is listed on both sides and merged with the journal's records of
/// it, as in a whole walk; the walk goes on into a subdirectory only when
/// that path itself has something to do (new, gone or replaced on a side:
/// all of it is walked then) or below a deep directory. Everything else is
/// taken to be as the journal says: the scope must hold every directory
/// where something changed since the last run. Records below directories
/// no walk reaches are left for a whole run. `Ok(None)`: a directory of
/// the scope could not be resolved (an error on the way): only a whole
/// run can tell.
pub fn scan_scoped<A: Store, B: Store>(
    a: (&A, A::Dir),
    b: (&B, B::Dir),
    j: &dyn Records,
    o: &ScanOpts<'_, A, B>,
    scope: &ScopeDirs,
) -> Result<Option<(Plan, Scan, Scan)>, Refused> {
    let roots = (Arc::new(a.1), Arc::new(b.1));
    // Each directory's start, once; deep wins.
    let mut targets: Vec<Start<A, B>> = Vec::new();
    for (rel, deep) in scope {
        let r = match resolve(a.0, b.0, (&roots.0, &roots.1), j, o, rel) {
            Ok(r) => r,
            Err(_) => return Ok(None),
        };
        let Some((at, whole, parent)) = r else {
            continue;
        };
        let deep = *deep && whole;
        match targets.iter_mut().find(|t| t.0 == at) {
            Some(t) => t.1 |= deep,
            None => targets.push((at, deep, parent)),
        }
    }
    let deep: Vec<Vec<u8>> = targets
        .iter()
        .filter(|t| t.1)
        .map(|t| key_of(&t.0))
        .collect();
    // Directories a deep one's walk reaches anyway are left to it.
    targets.retain(|t| {
        let k = key_of(&t.0);
        !deep
            .iter()
            .any(|d| *d != k && under_any(std::slice::from_ref(d), &k))
    });
    targets.sort_by(|x, y| x.0.cmp(&y.0));
    let root_in = targets.iter().any(|t| t.0.is_empty());
    let (ra, rb) = if root_in {
        let (ra, rb) = (Arc::try_unwrap(roots.0), Arc::try_unwrap(roots.1));
        match (ra, rb) {
            (Ok(ra), Ok(rb)) => (Some(ra), Some(rb)),
            // Still shared by a target's parents: the root is listed
            // through a handle of its own.
            _ => match (a.0.open_root(), b.0.open_root()) {
                (Ok(Some((ra, _))), Ok(Some((rb, _)))) => (Some(ra), Some(rb)),
                _ => return Ok(None),
            },
        }
    } else {
        (None, None)
    };
    let mut sorted = deep;
    sorted.sort();
    let w = Walker {
        a: a.0,
        b: b.0,
        j,
        o,
        ga: Gather::<A>::new(ra),
        gb: Gather::<B>::new(rb),
        st: Mutex::new(State::default()),
        orphans: AtomicBool::new(false),
        scope: Some(Scoping {
            deep: sorted,
            seen: Mutex::new(HashSet::new()),
        }),
        aliases: walk::Aliases::new(["A", "B"], [a.0.root_ids(), b.0.root_ids()]),
    };
    let tasks: Vec<DirTask<A, B>> = targets
        .into_iter()
        .map(|(rel, _, parent)| match parent {
            None => DirTask {
                rel,
                a: Some(None),
                b: Some(None),
            },
            Some((pa, pb)) => DirTask {
                rel,
                a: Some(Some(pa)),
                b: Some(Some(pb)),
            },
        })
        .collect();
    walk::walk(&w, o.jobs.max(2), tasks);
    if let Some(e) = w.st.lock().failed.take() {
        return Err(e);
    }
    Ok(Some(w.into_plan()))
}

/// Last component of a `/` path.
pub(super) fn name_of_path(rel: &[u8]) -> &[u8] {
    match rel.iter().rposition(|&c| c == b'/') {
        Some(i) => &rel[i + 1..],
        None => rel,
    }
}

/// True when `key` is one of `prefixes` (sorted) or below one.
pub fn under_any(prefixes: &[Vec<u8>], key: &[u8]) -> bool {
    prefixes.iter().any(|p| {
        key == p.as_slice() || (key.len() > p.len() && key.starts_with(p) && key[p.len()] == 0)
    })
}
