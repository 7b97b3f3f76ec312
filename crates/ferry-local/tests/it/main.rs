//! The integration tests of this crate, as one test binary (one link, one build of
//! the shared helpers): one module per suite, run with `cargo nextest run -p CRATE`
//! (filter a suite by its module: `-E 'test(/^ssh::/)'`).

mod aliases;
mod changing;
mod conformance;
mod delta;
mod planned;
mod read_only;
