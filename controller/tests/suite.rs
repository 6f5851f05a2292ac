//! The controller's tests against the stand-in API server, real proxies and the real tools
//! (Helm, kubectl, kubernetes-validate, promtool), one binary.
//!
//! One binary for the crate's tests, its modules one concern each: a binary per file would
//! link the whole dependency tree once per file.

mod support;

mod api_client;
mod chart;
mod class_config;
mod cli;
mod discovery;
mod late_lists;
mod lease;
mod push;
mod pusher;
mod render;
mod runtime;
mod stores;
mod tracing;
