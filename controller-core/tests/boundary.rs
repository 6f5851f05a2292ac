//! The core stays pure because its dependency tree cannot reach I/O, not because a comment says
//! so: this test reads the crate's normal dependencies (on every target) with `cargo tree` and
//! fails when one of them is an async runtime, a network, HTTP or TLS stack, native crypto, a
//! random source, the CLI parser, the Kubernetes client or one of the workspace's I/O crates.
//! Dev-dependencies (the proxy, tokio for the end-to-end tests) are not part of the boundary.

use std::process::Command;

/// Crates the core must not depend on, by name or name prefix (`tokio` also catches
/// `tokio-util`), with the reason shown when one turns up.
const FORBIDDEN: &[(&str, &str)] = &[
    ("tokio", "an async runtime"),
    ("mio", "sockets and an event loop"),
    ("quinn", "QUIC"),
    ("hyper", "HTTP"),
    ("h2", "HTTP/2"),
    ("tower", "service stacks"),
    ("reqwest", "HTTP"),
    ("rustls", "TLS"),
    ("ring", "native crypto"),
    ("aws-lc", "native crypto"),
    ("getrandom", "the system random source"),
    ("rand", "a random source"),
    ("clap", "the CLI parser"),
    ("kube-client", "the Kubernetes client"),
    ("kube-runtime", "the Kubernetes controller runtime"),
    ("cftunnel-tunnel", "the tunnel connector"),
    ("cftunnel-proxy", "the proxy"),
    ("cftunnel-controller", "the controller's I/O shell"),
];

/// Crates whose names start like a forbidden one but are pure: the certificate and DNS-name
/// types the config contract validates hostnames with, which carry no TLS stack.
const ALLOWED: &[&str] = &[
    "rustls-pki-types",
    "rustls-webpki",
    "cftunnel-controller-core",
];

fn forbidden(name: &str) -> Option<&'static str> {
    if ALLOWED.contains(&name) {
        return None;
    }
    FORBIDDEN
        .iter()
        .find(|(prefix, _)| {
            name == *prefix
                || name
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with(['-', '_']))
        })
        .map(|(_, why)| *why)
}

#[test]
fn the_core_depends_on_nothing_that_does_io() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args([
            "tree",
            "--package",
            "cftunnel-controller-core",
            "--edges",
            "normal",
            "--target",
            "all",
            "--prefix",
            "none",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let names: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert!(
        names.contains(&"cftunnel-config"),
        "the tree was read: {stdout}"
    );
    let mut offenders: Vec<String> = names
        .iter()
        .filter_map(|name| forbidden(name).map(|why| format!("{name} ({why})")))
        .collect();
    offenders.sort();
    offenders.dedup();
    assert!(
        offenders.is_empty(),
        "the pure core depends on {}; run `cargo tree -p cftunnel-controller-core -e normal -i <crate>` to see through what",
        offenders.join(", ")
    );
}

#[test]
fn the_check_knows_a_forbidden_crate_from_a_pure_one() {
    for name in [
        "tokio",
        "tokio-util",
        "hyper-util",
        "aws-lc-rs",
        "rustls",
        "clap_builder",
    ] {
        assert!(forbidden(name).is_some(), "{name}");
    }
    for name in [
        "rustls-webpki",
        "serde",
        "toml",
        "ringbuf",
        "randomize",
        "h2o",
        "tokenizer",
    ] {
        assert!(forbidden(name).is_none(), "{name}");
    }
}
