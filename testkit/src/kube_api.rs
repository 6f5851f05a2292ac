//! A Kubernetes API server in memory, speaking the real REST protocol over HTTP on loopback:
//! discovery, list (with label selectors) and watch streams from a resourceVersion, get,
//! create, replace, delete, server-side apply (`application/apply-patch+yaml`), JSON merge
//! patches, and the `status` and (Deployments) `scale` subresources; metadata-only answers
//! (`PartialObjectMetadata`) for a client that asks for them, as kube's metadata-only `Api`
//! does. Errors are `Status` objects with the real codes (404 NotFound, 409 AlreadyExists,
//! 409 Conflict for a write naming a resourceVersion that is no longer current or an apply
//! that conflicts, 422 Invalid for a Lease the API server's validation refuses or a change of a
//! Deployment's immutable `spec.selector`, 403 Forbidden for a request RBAC or a test refuses).
//! It runs no controllers: a test plays the Deployment and EndpointSlice controllers itself.
//!
//! A test builds the server with the RBAC rules its client is held to and the objects it
//! starts with, and can then act as a user or another controller, change the Gateway API CRDs
//! installed, and hold, refuse or fail requests:
//!
//! ```no_run
//! # async fn example() {
//! use cftunnel_testkit::kube_api::{ApiServer, Rule};
//!
//! const RBAC: &[Rule] = &[("", "namespaces", &["list", "watch"])];
//! let api = ApiServer::builder()
//!     .rbac(RBAC)
//!     .seed("apiVersion: v1\nkind: Namespace\nmetadata: {name: tenant-a}\n")
//!     .start()
//!     .await;
//! let controller = api.client(); // held to RBAC
//! let user = api.user_client(); // a cluster admin
//! let hold = api.hold(|call| call.kind == "Namespace" && call.method == "GET");
//! # }
//! ```
//!
//! Where each part lives, and what it simplifies:
//! - `server`: [`ApiServer`] and its builder, the test's side.
//! - `front`: the HTTP front that authorizes and routes each request.
//! - `served`, `discovery`: the resources served at which versions ([`GatewayApiCrds`]), and
//!   the discovery documents that list them (one stored version per resource); a CRD a test
//!   installs or removes ([`ApiServer::install_crd`]) decides for its resource.
//! - `rbac`: the service account's rules ([`Rule`]) and the verbs requests map to (no
//!   namespaces told apart).
//! - `store`, `cluster`: objects, resourceVersions and the write log; the state the handlers
//!   share (no garbage collection, the log never compacted).
//! - `read`, `watch`, `selector`, `partial_metadata`: get, list and watch, label selectors and
//!   metadata-only answers (no pagination, no 410 Gone, equality-based selectors only).
//! - `write`, `patch`, `merge`, `apply`, `scale`, `schema`: create, replace and delete; merge
//!   patches and server-side apply with managed fields (lists owned whole); the `scale`
//!   subresource; per-kind defaults and validation (only those the controller meets).
//! - `call`, `hold`, `refusal`: the requests a test holds ([`Hold`]), refuses or fails
//!   ([`Forbid`]), picked by a predicate over a [`Call`].

mod apply;
mod call;
mod cluster;
mod discovery;
#[cfg(test)]
mod fixtures;
mod front;
mod hold;
mod merge;
mod partial_metadata;
mod patch;
mod rbac;
mod read;
mod refusal;
mod request;
mod response;
mod scale;
mod schema;
mod selector;
mod served;
mod server;
mod store;
mod target;
mod watch;
mod write;

pub use call::Call;
pub use hold::Hold;
pub use rbac::Rule;
pub use refusal::Forbid;
pub use served::{crd, GatewayApiCrds};
pub use server::{ApiServer, ApiServerBuilder};
