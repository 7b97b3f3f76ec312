//! One bisync run, step by step ([`super::run_with`]): the roots opened
//! and checked, both trees scanned with the journal, the refusals that
//! look at the whole plan, the plan carried out (or reported, dry), and
//! the outcome. Each step is a method of [`Pass`], which holds what every
//! step reads.

use super::*;

/// What every step of a run reads.
pub(super) struct Pass<'r, A: Store, B: Store> {
    pub(super) a: &'r A,
    pub(super) b: &'r B,
    pub(super) opts: &'r Options,
    pub(super) rep: &'r dyn BiReporter,
    pub(super) stats: &'r Stats,
    pub(super) scope: Option<&'r ScopeDirs>,
}

/// Both roots as opened (`None`: missing), and a missing one to create
/// (its side, the mode it gets).
pub(super) type Roots<A, B> = (
    Option<(<A as Store>::Dir, Meta)>,
    Option<(<B as Store>::Dir, Meta)>,
    Option<(Side, u32)>,
);

/// What the scan found: the plan and each side's scan (`None`: only a
/// whole run can tell).
type Scanned = Option<(Plan, crate::tree::Scan, crate::tree::Scan)>;

impl<'r, A: Store, B: Store> Pass<'r, A, B> {
    /// Open both roots, check them against the watch's (if any), and find
    /// the one to create; refused when neither exists, or when one the
    /// journal has seen (`known`) is gone.
    pub(super) fn open_roots(&self, known: bool) -> Result<Roots<A, B>, Refused> {
        let (opts, rep) = (self.opts, self.rep);
        let (oa, ob) = (
            open_root(self.a, Side::A, opts)?,
            open_root(self.b, Side::B, opts)?,
        );
        if let Some(g) = &opts.guard {
            for (side, o) in [
                (Side::A, oa.as_ref().map(|r| &r.1)),
                (Side::B, ob.as_ref().map(|r| &r.1)),
            ] {
                let Some(m) = o else { continue };
                match g.check(side as usize, &opts.name(side), m, opts.force) {
                    Ok(None) => {}
                    Ok(Some(note)) => rep.note(&note),
                    Err(r) => return Err(r),
                }
            }
        }
        // A missing root: the side to create and the mode it gets.
        let missing = match (&oa, &ob) {
            (None, None) => {
                return Err(Refused(format!(
                    "neither {} nor {} exists",
                    opts.name(Side::A),
                    opts.name(Side::B)
                )))
            }
            (None, Some((_, m))) => Some((Side::A, m.mode)),
            (Some((_, m)), None) => Some((Side::B, m.mode)),
            _ => None,
        };
        if let (Some((side, _)), true) = (missing, known) {
            return Err(Refused(format!(
                "{}: does not exist, but it did at the last run (an unmounted disk, or a renamed folder?): nothing done; check it, then run again with --resync to sync it as a new, empty side (--force does not)",
                opts.name(side)
            )));
        }
        Ok((oa, ob, missing))
    }

    /// Both trees listed on the pool while another thread loads the
    /// journal, and merged with it as the listings come in (on a no-op
    /// run, that is all the work there is). `early`: a real `--resync`,
    /// whose records of what is in sync are written while it scans.
    pub(super) fn scan(
        &self,
        journal: Option<&Journal>,
        (known, early, sides): (bool, bool, Sides),
        oa: Option<(A::Dir, Meta)>,
        ob: Option<(B::Dir, Meta)>,
    ) -> Result<Scanned, Refused> {
        let (a, b, opts, rep, stats) = (self.a, self.b, self.opts, self.rep, self.stats);
        // A path that cannot be listed is an error of the run (exit 1), like
        // any other; it is left alone on both sides.
        let fail = |p: &[u8], e: &io::Error| {
            add(&stats.errors, 1);
            rep.error(p, e)
        };
        let cp = Copier {
            src: a,
            dst: b,
            fsync: opts.fsync,
            bwlimit: opts.bwlimit.as_ref(),
            moved: &stats.bytes_moved,
            // Only compares: nothing written.
            xattrs: None,
            delta: None,
            keep: None,
            mtime_step: ferry_engine::store::mtime_step(a, b),
            special: None,
            grow: None,
        };
        let records: &dyn Records = match journal {
            Some(j) if known => j,
            _ => &NoRecords,
        };
        // Records wait here while the writer is behind, a bounded number of
        // directories' worth.
        let (tx, rx) = mpsc::sync_channel::<Update>(16);
        let scanned = std::thread::scope(|s| {
            let writer = early.then(|| {
                let j = journal.expect("a real run has a journal");
                s.spawn(move || j.write_from(rx))
            });
            let o = ScanOpts {
                sides,
                jobs: opts.jobs,
                filter: opts.filter.as_ref(),
                checksum: opts.checksum,
                on_error: &fail,
                compare: Some(&cp),
                in_sync: if opts.dry_run {
                    InSync::Count
                } else if early {
                    InSync::Write(&tx)
                } else {
                    InSync::Keep
                },
                stop_if_both_hold: !known && !opts.resync,
                reserved: Reserved {
                    keep: [opts.keep[0].as_ref(), opts.keep[1].as_ref()],
                },
                stopping: &|| opts.stopping(),
            };
            let r = match (self.scope, oa, ob) {
                (Some(sc), Some((da, _)), Some((db, _))) => {
                    scan_scoped((a, da), (b, db), records, &o, sc)
                }
                // (A missing root was refused above: the pair is known.)
                (Some(_), _, _) => Ok(None),
                (None, oa, ob) => scan_merge(
                    (a, oa.map(|(d, _)| d)),
                    (b, ob.map(|(d, _)| d)),
                    records,
                    &o,
                )
                .map(Some),
            };
            drop(tx);
            if let Some(w) = writer {
                if let Err(e) = w.join().expect("journal writer") {
                    rep.error(b"", &io::Error::other(e));
                    add(&stats.errors, 1);
                }
            }
            r
        });
        scanned
    }

    /// The executor of this run, on the roots `ra`, `rb` (`None`: missing).
    pub(super) fn exec(
        &self,
        ra: Option<A::Dir>,
        rb: Option<B::Dir>,
        removals_at_start: [u64; 2],
    ) -> Exec<'r, A, B> {
        let (a, b, opts) = (self.a, self.b, self.opts);
        Exec {
            a,
            b,
            da: Dirs::new(ra),
            db: Dirs::new(rb),
            opts,
            rep: self.rep,
            counts: Counts::default(),
            stats: self.stats,
            tx: None,
            xattrs: XattrRun::new(opts.xattrs, a.xattr_caps(), b.xattr_caps()),
            relock: Mutex::new(Vec::new()),
            special: [
                SpecialBits::new(b, a, opts.keep_special_bits),
                SpecialBits::new(a, b, opts.keep_special_bits),
            ],
            lost: Default::default(),
            removals_at_start,
            own: Default::default(),
            deleted: Default::default(),
        }
    }

    /// The refusals that look at the whole plan: an empty root while the
    /// journal knew entries (an unmounted mount point looks like this,
    /// and going on would empty the other side), and the deletion limit.
    /// `Ok(false)`: a scoped run that only a whole run can decide.
    pub(super) fn limits(
        &self,
        ex: &Exec<'r, A, B>,
        plan: &mut Plan,
        (count, known): ([usize; 2], bool),
        journal: Option<&Journal>,
    ) -> Result<bool, Refused> {
        let opts = self.opts;
        for side in [Side::A, Side::B] {
            let (i, o) = (side as usize, side.other() as usize);
            let held = (plan.known[i], plan.known_dirs);
            let del = (plan.deletes[o], plan.dir_deletes[o]);
            if self.scope.is_some() {
                // Only a whole run counts a side's entries: one that deletes
                // while the other root is empty decides (and refuses) itself.
                if !opts.force && del != (0, 0) && on_side!(ex, side, |st, dc| root_empty(st, dc)) {
                    return Ok(false);
                }
                continue;
            }
            if known && !opts.force && count[i] == 0 && del != (0, 0) {
                return Err(Refused(format!(
                    "{} is empty, but held {} at the last run (an unmounted disk looks like this): nothing done; mount it, or run again with --force to delete {} on {}",
                    opts.name(side),
                    entries(held),
                    entries(del),
                    side.other().as_str()
                )));
            }
        }
        if self.scope.is_some() && plan.deletes != [0; 2] {
            // The limit is a share of every file the journal knows, not of
            // the records of the directories this run read.
            let all = journal.expect("scoped runs have a journal");
            plan.known = [all.count_files()?; 2];
        }
        self.max_delete(plan)?;
        Ok(true)
    }

    /// More deletions than `--max-delete` on a side (with a watch's
    /// earlier runs of the window): refused unless `--force`.
    fn max_delete(&self, plan: &Plan) -> Result<(), Refused> {
        let opts = self.opts;
        let now = Instant::now();
        for (i, side) in [(0, "A"), (1, "B")] {
            let (del, known) = (plan.deletes[i], plan.known[i]);
            // A watch's earlier runs of the window count too.
            let before = opts.guard.as_ref().map_or(0, |g| g.removed(i, now));
            // (A share of what there was at the window's start.)
            if !opts.force
                && known > 0
                && (del + before) * 100 > (known + before) * opts.max_delete as u64
            {
                let also = match &opts.guard {
                    Some(g) if before > 0 => format!(
                        " with the {before} deleted there by this watch's runs of the last {} minutes",
                        g.window().as_secs() / 60
                    ),
                    _ => String::new(),
                };
                return Err(Refused(format!(
                    "refusing to delete {del} of {known} files on {side}{also} (more than {}%); check the other side, then run again with --force",
                    opts.max_delete
                )));
            }
        }
        Ok(())
    }

    /// Carry the plan out (a dry run: report it): the missing root made,
    /// leftover temporaries removed, each action recorded in the journal
    /// as it completes. Returns the executor, for its counters.
    pub(super) fn carry_out(
        &self,
        ex: Exec<'r, A, B>,
        plan: &Plan,
        journal: Option<&mut Journal>,
        (early, missing): (bool, Option<(Side, u32)>),
        temps: &[Vec<(Vec<u8>, Meta)>; 2],
    ) -> Result<Exec<'r, A, B>, Refused> {
        let (opts, rep, stats) = (self.opts, self.rep, self.stats);
        if opts.dry_run {
            if let Some((side, _)) = missing {
                rep.note(&format!(
                    "would create {} (does not exist)",
                    opts.name(side)
                ));
                add(&stats.dirs_created, 1);
                rep.action(BiAction::Mkdir, side, b"", None, 0);
            }
            ex.report_dry(plan);
            return Ok(ex);
        }
        let j = journal.expect("a real run has a journal");
        if !early {
            j.mark_synced()?;
        }
        if let Some((side, mode)) = missing {
            self.create_missing(&ex, side, mode)?;
        }
        let (tx, rx) = mpsc::channel();
        let ex = Exec { tx: Some(tx), ..ex };
        Ok(std::thread::scope(|s| {
            let w = s.spawn(move || j.write_from(rx));
            let mut ex = ex;
            ex.remove_temps(temps);
            ex.execute(plan);
            ex.tx = None;
            let res = w.join().expect("journal writer");
            if let Err(e) = res {
                ex.rep.error(b"", &io::Error::other(e));
                add(&ex.stats.errors, 1);
            }
            ex
        }))
    }

    /// Create the missing root of `side` with the other root's `mode` (said
    /// on stderr); in a watch, the root made is the one watched.
    fn create_missing(&self, ex: &Exec<'r, A, B>, side: Side, mode: u32) -> Result<(), Refused> {
        let (opts, rep) = (self.opts, self.rep);
        let mode = ex.special[side as usize]
            .apply(&Meta {
                mode,
                ..dir_rec(None)
            })
            .mode;
        on_side!(ex, side, |st, dc| create_root(st, dc, mode))
            .map_err(|e| Refused(format!("{}: {}", opts.name(side), e)))?;
        rep.note(&format!("created {} (did not exist)", opts.name(side)));
        if let Some(g) = &opts.guard {
            let made = on_side!(ex, side, |st, _dc| st
                .open_root()
                .ok()
                .flatten()
                .map(|r| r.1));
            if let Some(m) = made {
                g.seen(side as usize, &m);
            }
        }
        add(&self.stats.dirs_created, 1);
        rep.action(BiAction::Mkdir, side, b"", None, 0);
        Ok(())
    }

    /// What the run did, once it is over: the watch's window counts its
    /// deletions, its notes said.
    pub(super) fn outcome(&self, ex: &Exec<'r, A, B>, plan: &Plan, start: Instant) -> Outcome {
        let (opts, rep) = (self.opts, self.rep);
        // The files this run deleted count in the watch's window.
        if let Some(g) = &opts.guard {
            for (i, n) in ex.deleted.iter().enumerate() {
                g.add_removed(i, n.load(Ordering::Relaxed));
            }
        }
        if let Some(n) = ex.xattrs.note("a replica") {
            rep.note(&n);
        }
        // Bits dropped on the way to A are B's, and the reverse.
        for (side, from) in [(Side::A, Side::B), (Side::B, Side::A)] {
            if let Some(n) = ex.special[side as usize].note(from.as_str()) {
                rep.note(&n);
            }
        }
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let c = &ex.counts;
        Outcome {
            entries_scanned: plan.scanned,
            files_copied: g(&ex.stats.files_copied),
            bytes_copied: g(&ex.stats.bytes_copied),
            files_deleted: g(&ex.stats.files_deleted),
            dirs_created: g(&ex.stats.dirs_created),
            renamed: g(&c.renamed),
            conflicts: g(&c.conflicts),
            // Paths found equal whose record was only written now count as unchanged.
            unchanged: plan.unchanged
                + plan.recorded
                + plan.items.iter().filter(|it| it.act == Act::Record).count() as u64,
            errors: g(&ex.stats.errors),
            elapsed_s: start.elapsed().as_secs_f64(),
            kept: g(&c.kept),
            bytes_kept: g(&c.bytes_kept),
            stopped: opts.stopping(),
        }
    }
}
