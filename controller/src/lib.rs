//! Gateway API controller for Cloudflare Tunnel data planes.
//!
//! The decisions are made in the pure core, the `cftunnel-controller-core` crate, re-exported
//! here under the same paths: [`translate`] (Gateway API objects in, proxy config documents
//! and statuses out), [`render`] (a Gateway and its [`gateway_config::GatewayConfig`] in, the
//! objects of its dedicated data plane out) and [`manifest`] (multi-document YAML into a
//! [`translate::Snapshot`]). That crate depends on no runtime, network or random source, and a
//! test of its dependency tree keeps it so.
//!
//! This crate is the I/O around it: [`runtime`] watches the cluster, runs the core on what it
//! sees, applies the rendered planes and writes statuses; [`push`] brings a plane's pods to its
//! config; [`cloudflare`] writes the tunnels' ingress documents; [`held`] holds back tunnel
//! writes and plane applies that failed, and [`in_flight`] runs them without holding up a
//! round; [`cli`] is the command line (`run`, `translate`,
//! `render`, `crd`).

mod alarm;
pub mod cli;
pub mod cloudflare;
pub mod held;
pub mod in_flight;
pub mod push;
pub mod runtime;

pub use cftunnel_controller_core::{
    access_policy, class_parameters, external_backend, gateway_class_config, gateway_config,
    manifest, render, service_import, translate,
};
