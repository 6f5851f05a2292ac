//! The compiled route table and its lookup: pure, no I/O, no runtime.
//!
//! A [`Table`] is built once per config push by [`crate::config::compile`] and then only read.
//! Lookup goes exact host, then the longest matching wildcard suffix, then rules without
//! hostnames; inside each bucket the (rule, match) pairs are pre-sorted by Gateway API
//! precedence, so a request does a first-hit scan.

mod matcher;
mod table;

pub use matcher::{MatchSpec, PathMatcher, Pattern, RequestView, ValueMatcher};
pub use table::{Bucket, Hit, RegexSets, Table, TableBuilder};

#[cfg(test)]
mod tests;
