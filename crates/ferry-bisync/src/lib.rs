//! ferry's two-way sync (`ferry bisync A B`).
//!
//! Data flow, like one-way sync but with a third input: both trees are
//! walked at once ([`tree`]), each directory merged with the journal's
//! records of it ([`journal`]) when it is visited; a pure function decides
//! each path from the three ([`reconcile`]), and only paths with work are
//! kept; [`plan`] applies the rules that span paths (directories, renames,
//! conflict names) to those; [`run()`] carries the plan out over any two
//! [`ferry_engine::Store`]s and records each completed action in the
//! journal. Nothing is ever deleted or overwritten unless it is unchanged
//! since the last sync; when in doubt both versions are kept.
#![deny(missing_docs)]

pub mod journal;
pub mod plan;
pub mod reconcile;
pub mod run;
pub mod tree;

pub use journal::{default_path, Journal, Lock};
pub use reconcile::Side;
pub use run::{run, run_scoped, BiAction, BiReporter, Options, Outcome, Refused};
