//! The load harness's tests, one binary.
//!
//! One binary for the crate's tests, its modules one concern each: a binary per file would
//! link the whole dependency tree once per file.

mod cloudflared;
mod compare;
mod harness;
