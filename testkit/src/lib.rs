//! Test doubles and shared test helpers. Nothing here ships in a product binary.
//!
//! The product crates take this crate as a dev-dependency only. Each double stands in for
//! something that cannot run on a test machine and follows its real protocol, so the product
//! code under test talks to it exactly as it talks to the real thing.

pub mod cloudflare_api;
pub mod kube_api;
pub mod older_proxy;
