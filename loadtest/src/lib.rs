//! Echo backend and load harness.
