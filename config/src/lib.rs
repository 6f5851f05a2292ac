//! The proxy config document (`PUT /config`, `--config-file`) and the rules it must satisfy.
//!
//! The proxy compiles documents into route tables; the controller produces them from Gateway
//! API objects. Both depend on this crate so that the contract between them is written once:
//! the wire types ([`Config`] and what it holds) and, in [`valid`], every rule a document must
//! satisfy, with the regex engine and limits the proxy matches with. The proxy's compile calls
//! [`valid::rule`] on each rule and builds its table from the result; the controller calls the
//! same function on each rule it emits and leaves out what fails, so a document it pushes is
//! one the proxy accepts.
//!
//! What it leaves out: anything that does I/O or needs a runtime (dialling backends, serving
//! requests) belongs to the proxy.

mod document;
mod duration;
pub mod valid;

pub use document::*;
pub use duration::{Duration, ParseDurationError};

#[cfg(test)]
mod tests;
