//! Echo backend and load harness for the Cloudflare Tunnel gateway proxy.
//!
//! * [`echo`]: an in-process stand-in for the Gateway API conformance echo server
//!   (`echo-basic`), used by the proxy and tunnel end-to-end tests and as the origin in load
//!   runs.
//! * [`harness`]: a closed-loop HTTP/1.1 load generator and the scenarios it drives (the echo
//!   backend direct, through `cftunnel-proxy`, through nginx), with latency percentiles and
//!   ratio reporting.
//!
//! Nothing here is used on the proxy's request path; the crate is test and measurement tooling.

pub mod echo;
pub mod harness;
