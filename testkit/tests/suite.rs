//! The test doubles' own tests, one binary: each double against real clients.
//!
//! One binary for the crate's tests, its modules one concern each: a binary per file would
//! link the whole dependency tree once per file.

mod echo;
mod echo_bin;
mod grpc_echo;
mod kubectl;
