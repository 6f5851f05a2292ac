//! Load harness for the Cloudflare Tunnel gateway proxy.
//!
//! [`harness`]: a closed-loop HTTP/1.1 load generator and the scenarios it drives (the echo
//! backend direct, through `cftunnel-proxy`, through nginx, through the proxy behind the mock
//! edge), with latency percentiles and ratio reporting. The echo backend and the mock edge are
//! `cftunnel-testkit`'s.
//!
//! Nothing here is used on the proxy's request path; the crate is test and measurement tooling.

pub mod harness;
