//! The translation core's end-to-end tests, one binary: documents it emits served by a real
//! proxy on loopback, and the Gateway API conformance cases replayed.
//!
//! One binary for the crate's tests, its modules one concern each: a binary per file would
//! link the whole dependency tree once per file.

mod backend_tls;
mod boundary;
mod conformance;
mod contract;
mod external_backend;
mod external_backend_tls;
mod gateway_config_crd;
mod grpc;
mod listener_isolation;
