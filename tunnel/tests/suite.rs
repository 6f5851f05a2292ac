//! The connector's tests over real QUIC and TLS/TCP sockets against the mock edge and bare test
//! edges, one binary.
//!
//! One binary for the crate's tests, its modules one concern each: a binary per file would
//! link the whole dependency tree once per file.

#[macro_use]
mod support;

mod cancel;
mod control_stream;
mod drain;
mod edge_bounds;
mod edge_headers;
mod key_exchange;
mod lifecycle;
mod mock_edge_limits;
mod move_to_http2;
mod origin;
mod supervision;
mod transport;
mod uni_streams;
