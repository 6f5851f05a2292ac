//! The controller's pure core: what it decides, with nothing that could do I/O.
//!
//! The input is a [`snapshot::Snapshot`] of the objects the controller watches ([`manifest`]
//! parses one from multi-document YAML). [`render`] turns a Gateway and its
//! [`gateway_config::GatewayConfig`] into the objects of its dedicated data plane;
//! [`render::plan`] does so for every dedicated plane of a snapshot, once. [`translate`] turns
//! the snapshot and those plans into one proxy config document per data plane and the status
//! every owned object should carry: a dedicated Gateway is accepted by the render that is
//! applied, not by one of its own. The modules import one way: `snapshot` and
//! `gateway_config`, then `render`, then `translate`.
//!
//! What it leaves out: the cluster, the clock, the network and the random source. The
//! controller's runtime watches the cluster, draws the config-API tokens generated Secrets get,
//! applies what is rendered, pushes the configs and writes the statuses; its CLI reads
//! manifests from files. This crate cannot reach any of that by accident: its normal
//! dependencies are the config contract (`cftunnel-config`), the Gateway API and Kubernetes
//! types, and small pure crates, and `tests/boundary.rs` fails the build's tests when an async
//! runtime, a network or TLS stack, native crypto or the CLI parser joins them.

pub mod access_policy;
pub mod class_parameters;
pub mod external_backend;
pub mod gateway_class_config;
pub mod gateway_config;
pub mod manifest;
pub mod render;
pub mod service_import;
pub mod snapshot;
pub mod translate;
