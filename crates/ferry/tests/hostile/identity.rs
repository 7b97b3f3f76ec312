//! Hostile tests: identity (see main.rs).
#[allow(unused_imports)]
use crate::util::*;
