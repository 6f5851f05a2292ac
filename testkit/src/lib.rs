//! Test doubles and shared test helpers. Nothing here ships in a product binary.
//!
//! The product crates take this crate as a dev-dependency only. Each double stands in for
//! something that cannot run on a test machine and follows its real protocol, so the product
//! code under test talks to it exactly as it talks to the real thing.
//!
//! - [`edge`]: Cloudflare's edge as a connector meets it (QUIC and HTTP/2 over TLS,
//!   registration RPC, configuration pushes) and as an eyeball meets it (a plain-HTTP
//!   listener whose requests are forwarded through the tunnel).
//! - [`pki`]: the generated CA and edge certificate that connectors trust in tests.
//! - [`echo`]: the Gateway API conformance echo server (`echo-basic`), the backend behind
//!   the proxy in end-to-end tests and load runs.
//! - [`grpc_echo`]: the conformance suite's gRPC echo (`GrpcEcho`), the backend of the
//!   GRPCRoute cases, with a client that reads responses as grpc-go does.
//! - [`kube_api`]: a Kubernetes API server in memory, speaking the real REST protocol.
//! - [`cloudflare_access`]: a Cloudflare Access team's key endpoint (JWKS) and the tokens
//!   Access issues, signed with keys the test holds.
//! - [`cloudflare_api`]: the Cloudflare API calls the controller makes (tunnel ingress
//!   documents, tunnel tokens).
//! - [`config_tap`]: a real proxy's config API, keeping each document pushed to it.
//! - [`older_proxy`]: a proxy of an earlier release, whose config API refuses what that
//!   release cannot read.
//! - [`otlp`]: an OpenTelemetry collector's trace receiver (OTLP over HTTP and gRPC), which
//!   records the spans exported to it.
//! - [`h2_tap`]: a relay in front of an HTTP/2 server that notes the frames its clients send
//!   (their pings), which servers act on but do not show.
//!
//! Helpers the tests of several crates share: [`tools`] (the real tools some tests run),
//! [`trace`] (logs), [`wait`] (polling for a
//! state), [`ports`] (free ports for child processes), [`connector`] (credentials and options
//! for a connector facing the mock edge) and [`client`] (HTTP/1.1 and h2c clients).
//!
//! The edge's wire format comes from `cftunnel-tunnel` itself (its stream framing, head
//! codecs, RPC schema and HTTP/2 adapters), so the double cannot drift from the connector on
//! what bytes mean; it re-implements only the edge's decisions.

pub mod client;
pub mod cloudflare_access;
pub mod cloudflare_api;
pub mod config_tap;
pub mod connector;
pub mod echo;
pub mod edge;
pub mod grpc_echo;
pub mod h2_tap;
pub mod kube_api;
pub mod older_proxy;
pub mod otlp;
pub mod pki;
pub mod ports;
pub mod tools;
pub mod trace;
pub mod wait;
