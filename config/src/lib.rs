//! The proxy config document (`PUT /config`, `--config-file`) and the rules it must satisfy.
//!
//! The proxy compiles documents into route tables; the controller produces them from Gateway
//! API objects. Both depend on this crate so that the contract between them is written once:
//! the wire types ([`Config`] and what it holds) and, in [`valid`], every rule a document must
//! satisfy, with the regex engine and limits the proxy matches with. The proxy's compile calls
//! [`valid::rule`] on each rule and builds its table from the result; the controller runs the
//! same checks ([`valid::check`], which builds nothing) on each rule it emits and leaves out
//! what fails, so a document it pushes is one the proxy accepts.
//!
//! The connector token ([`Token`]) is the other document both sides read: the proxy's
//! connector registers with it, and the controller takes a dedicated plane's tunnel identity
//! and address from it, so its format is parsed in one place too.
//!
//! Which headers stop at each hop ([`hop_by_hop`]) is the rule the proxy and the connector
//! both apply to what they pass on, and a path's canonical form ([`path`]) the one requests
//! are routed on and rule path values are written in.
//!
//! Which addresses are public ([`address::is_public`], and outside the cluster's own ranges
//! with [`address::is_public_with`]) is the rule behind `publicOnly`: the proxy applies it at
//! each dial, the controller to the IP literals it can judge ahead.
//!
//! What the config API answers a pusher ([`api::ConfigState`]) is written here too, so a pusher
//! reads what the proxy says it enforces, and what its bearer token may hold
//! ([`auth_token::check`]).
//!
//! What it leaves out: anything that does I/O or needs a runtime (dialling backends, serving
//! requests, connecting to the edge) belongs to the proxy and the tunnel connector.

pub mod address;
pub mod api;
pub mod auth_token;
pub mod bytes;
mod document;
mod duration;
pub mod hop_by_hop;
pub mod path;
mod token;
pub mod valid;

pub use document::*;
pub use duration::{Duration, ParseDurationError};
pub use token::{
    check_account_tag, is_region_label, Token, TokenError, ACCOUNT_TAG_RULE, REGION_RULE,
};

#[cfg(test)]
mod tests;
