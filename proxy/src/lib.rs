//! Gateway API L7 proxy.
