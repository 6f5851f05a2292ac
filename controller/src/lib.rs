//! Gateway API controller for Cloudflare Tunnel data planes.
//!
//! [`translate`] is the pure core: Gateway API objects in, proxy config documents and statuses
//! out, with no I/O. [`manifest`] parses multi-document YAML into a [`translate::Snapshot`].
//! [`cli`] is the command line (`translate`).

pub mod cli;
pub mod manifest;
pub mod translate;
