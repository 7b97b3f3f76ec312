//! Hostile tests: s3_meta (see main.rs).
#[allow(unused_imports)]
use crate::util::*;
