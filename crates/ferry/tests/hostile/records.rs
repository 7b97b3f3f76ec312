//! Hostile tests: records (see main.rs).
#[allow(unused_imports)]
use crate::util::*;
