//! Hostile tests: ssh_install (see main.rs).
#[allow(unused_imports)]
use crate::util::*;
