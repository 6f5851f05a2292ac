//! Gateway API controller for Cloudflare Tunnel data planes.
//!
//! [`translate`] is the pure core: Gateway API objects in, proxy config documents and statuses
//! out, with no I/O. [`manifest`] parses multi-document YAML into a [`translate::Snapshot`].
//! [`render`] is the other pure core: a Gateway and its [`gateway_config::GatewayConfig`] in,
//! the objects of its dedicated data plane out. [`push`] brings a plane's pods to its config.
//! [`runtime`] is the I/O shell that runs them against a cluster. [`cli`] is the command line
//! (`run`, `translate`, `render`, `crd`).

pub mod cli;
pub mod cloudflare;
pub mod gateway_config;
pub mod manifest;
pub mod push;
pub mod render;
pub mod runtime;
pub mod translate;
