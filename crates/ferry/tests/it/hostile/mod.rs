//! The hostile suite (issue 28; the classes are listed in docs/DESIGN.md, "Hostile classes"): one module per class
//! of attack that broke ferry before. Its invariant, checked by every test: every byte anyone
//! wrote is in a replica, in a kept version, or named on stderr with exit 1; nothing outside
//! the run's roots changed; no file gained a mode bit.

mod identity;
mod keeps;
mod recheck;
mod records;
mod s3_meta;
mod s3_partial;
mod ssh_install;
mod watch_roots;
