//! The `translate` command, run as a binary on a fixture.

use std::process::Command;

use cftunnel_config::{Backend, Config};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/shop.yaml");

fn translate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cftunnel-controller"))
        .arg("translate")
        .args(args)
        .output()
        .expect("the binary runs")
}

#[test]
fn translate_prints_the_shared_plane_config_and_conditions() {
    let out = translate(&["-f", FIXTURE]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config: Config = serde_json::from_slice(&out.stdout).expect("stdout is a config document");
    assert_eq!(
        config.rules.len(),
        2,
        "the rule with a broken regex is dropped; the listener hostname gets its 404 rule"
    );
    let isolation = &config.rules[1];
    assert_eq!(
        (isolation.hostnames.clone(), isolation.unavailable_status),
        (vec!["*.example.com".to_owned()], Some(404))
    );
    let rule = &config.rules[0];
    assert_eq!(rule.hostnames, vec!["shop.example.com".to_owned()]);
    assert_eq!(rule.name.as_deref(), Some("shop/storefront/api"));
    let backend = |url: &str, weight: u32, unavailable: Option<u16>| Backend {
        url: url.to_owned(),
        weight,
        unavailable_status: unavailable,
        ..Backend::default()
    };
    assert_eq!(
        rule.backends,
        vec![
            backend("http://10.0.0.7:8080", 3, None),
            backend("http://10.0.0.8:8080", 3, None),
            backend("http://legacy-api.shop.svc.cluster.local:80", 2, Some(500)),
        ]
    );

    let stderr = String::from_utf8_lossy(&out.stderr);
    for line in [
        "GatewayClass cloudflare-tunnel: Accepted=True (Accepted)",
        "Gateway shop/edge (shared): Accepted=True (Accepted); Programmed=True (Programmed)",
        "  listener web: attachedRoutes=1;",
        "HTTPRoute shop/storefront",
        "ResolvedRefs=False (BackendNotFound): spec.rules[0].backendRefs[1]: Service shop/legacy-api not found",
        "PartiallyInvalid=True (UnsupportedValue): dropped rules: spec.rules[1].matches[0].path: regular expression does not compile: error: unclosed character class",
    ] {
        assert!(stderr.contains(line), "missing {line:?} in:\n{stderr}");
    }
}

/// The whole document, byte for byte: the translation is deterministic. After an intended
/// change, regenerate with
/// `cargo run -p cftunnel-controller -- translate -f controller/tests/fixtures/shop.yaml > controller/tests/golden/shop.json`.
#[test]
fn translate_output_matches_the_golden_file() {
    let out = translate(&["-f", FIXTURE]);
    assert!(out.status.success());
    let golden = include_str!("golden/shop.json");
    assert_eq!(String::from_utf8_lossy(&out.stdout), golden);
}

#[test]
fn translate_of_a_named_gateway_and_a_folder() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let out = translate(&["-f", dir, "--gateway", "shop/edge"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config: Config = serde_json::from_slice(&out.stdout).expect("stdout is a config document");
    assert_eq!(config.rules.len(), 2);
}

#[test]
fn translate_prints_every_plane_on_request() {
    let out = translate(&["-f", FIXTURE, "--all-planes"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let planes: std::collections::BTreeMap<String, Config> =
        serde_json::from_slice(&out.stdout).expect("stdout maps planes to configs");
    assert_eq!(planes.keys().collect::<Vec<_>>(), vec!["shared"]);
    assert_eq!(planes["shared"].rules.len(), 2);

    let out = translate(&["-f", FIXTURE, "--all-planes", "--gateway", "shop/edge"]);
    assert!(
        !out.status.success(),
        "--all-planes and --gateway exclude each other"
    );
}

#[test]
fn translate_refuses_an_unknown_gateway_and_unowned_manifests() {
    let out = translate(&["-f", FIXTURE, "--gateway", "shop/nope"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Gateway shop/nope is not in the manifests")
    );

    let out = translate(&["-f", FIXTURE, "--controller-name", "example.com/other"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("pass --gateway-class-name or --gateway"));

    let out = translate(&["-f", FIXTURE, "--gateway", "not-a-name"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected NAMESPACE/NAME"));
}
