//! Where a request came from: what the standalone listener or the tunnel connector saw of the
//! client's connection. It travels with every request, so the header rewriting below the
//! handler can tell the client's scheme and whose forwarding headers stand.

use std::net::SocketAddr;

/// Where a request came from, as the listener or connector saw it.
#[derive(Debug, Clone, Copy)]
pub struct ConnInfo {
    pub peer: Option<SocketAddr>,
    /// `http` or `https`: the scheme the client used (redirects and `X-Forwarded-Proto`).
    pub scheme: &'static str,
    /// The request came through a trusted hop (the tunnel edge) whose forwarding headers stand.
    pub trusted_forwarding: bool,
}
