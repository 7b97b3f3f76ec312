//! The integration tests of this crate, as one test binary (one link, one build of
//! the shared helpers): one module per suite, run with `cargo nextest run -p CRATE`
//! (filter a suite by its module: `-E 'test(/^ssh::/)'`).

#[macro_use]
mod util;

mod bisync;
mod bisync_keep;
mod bisync_stop;
mod bisync_watch;
mod cli;
mod delta;
mod diskfull;
mod filter;
mod generate;
mod hardlinks;
mod hostile;
mod keep;
mod kill;
mod output;
mod prefetch;
mod props;
mod s3;
mod s3_cluster;
mod s3_faults;
mod s3_props;
mod s3_resume;
mod s3_semantics;
mod service;
mod sftp;
mod special;
mod ssh;
mod ssh_open;
mod versions;
mod watch;
mod watch_heal;
mod watch_status;
mod xattrs;
