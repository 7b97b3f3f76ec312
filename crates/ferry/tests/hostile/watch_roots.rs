//! Hostile tests: watch_roots (see main.rs).
#[allow(unused_imports)]
use crate::util::*;
