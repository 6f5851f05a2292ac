//! Load harness for the Cloudflare Tunnel gateway proxy.
//!
//! [`harness`]: a closed-loop HTTP/1.1 load generator and the scenarios it drives (the echo
//! backend direct, through `cftunnel-proxy`, through nginx, through the proxy behind the mock
//! edge), with latency percentiles and ratio reporting. The echo backend and the mock edge are
//! `cftunnel-testkit`'s.
//!
//! [`compare`]: the side-by-side comparison with `wrk` against an nginx backend, through
//! `cftunnel-proxy`, nginx and HAProxy (and the tunnel, against `cloudflared`).
//!
//! Both write a results file (JSON) and a chart (SVG) beside their table
//! ([`harness::results`], [`harness::chart`]).
//!
//! Nothing here is used on the proxy's request path; the crate is test and measurement tooling.

pub mod compare;
pub mod harness;
