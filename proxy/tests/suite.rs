//! The proxy's end-to-end tests, one binary: real sockets on 127.0.0.1, the real binary where
//! its start-up, signals or output are what is tested.
//!
//! One binary for the crate's tests, its modules one concern each: a binary per file would
//! link the whole dependency tree once per file.

mod support;

mod access;
mod access_log;
mod backend_tls;
mod backends;
mod busy_runtime;
mod drain;
mod framing;
mod hardening;
mod header_filter_framing;
mod http2_backends;
mod invalid_backends;
mod keepalive;
mod listen;
mod logs;
mod metrics_endpoint;
mod regex_budget;
mod reload;
mod route_semantics;
mod routing;
mod settings;
mod start_up;
mod streaming_replay;
mod tracing;
mod tracing_outcomes;
mod tunnel;
