//! Hostile tests: recheck (see main.rs).
#[allow(unused_imports)]
use crate::util::*;
