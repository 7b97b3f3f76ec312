//! Hostile tests: keeps (see main.rs).
#[allow(unused_imports)]
use crate::util::*;
