//! Hostile tests: s3_partial (see main.rs).
#[allow(unused_imports)]
use crate::util::*;
