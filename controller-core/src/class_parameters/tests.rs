use super::*;
use crate::manifest;

const ACCOUNT: &str = "0123456789abcdef0123456789abcdef";
const TUNNEL: &str = "550e8400-e29b-41d4-a716-446655440000";
const FLAG_TUNNEL: &str = "6ba7b810-9dad-11d1-80b4-00c04fd430c8";

fn token(account: &str, tunnel: &str) -> String {
    Token::new(account, vec![7; 32], tunnel.parse().expect("uuid")).encode()
}

fn snapshot(text: &str) -> Snapshot {
    let mut snapshot = Snapshot::default();
    manifest::load_into(&mut snapshot, text, "test").expect("manifests parse");
    snapshot
}

fn class(name: &str, created: &str, parameters: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: {name}, creationTimestamp: \"{created}\"}}\nspec:\n  controllerName: cf.k8s.lex.la/tunnel-controller\n  {parameters}\n---\n"
    )
}

fn config(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayClassConfig\nmetadata: {{name: {name}, generation: 2}}\nspec: {spec}\n---\n"
    )
}

fn secret(namespace: &str, name: &str, data: &[(&str, &str)]) -> String {
    let data: String = data
        .iter()
        .map(|(k, v)| format!("  {k}: \"{v}\"\n"))
        .collect();
    format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {namespace}}}\nstringData:\n{data}---\n")
}

fn defaults() -> ClassDefaults {
    ClassDefaults {
        namespace: "cftunnel-system".to_owned(),
        tunnel_secret: Some((
            ObjectKey::new("cftunnel-system", "flag-tunnel"),
            "tunnel-token".to_owned(),
        )),
        api_token: Some("flag-api-token".to_owned()),
        pool_namespace: None,
    }
}

fn settle_text(text: &str) -> ClassParameters {
    let base = secret(
        "cftunnel-system",
        "flag-tunnel",
        &[("tunnel-token", &token(ACCOUNT, FLAG_TUNNEL))],
    );
    settle(
        &snapshot(&[base, text.to_owned()].concat()),
        "cf.k8s.lex.la/tunnel-controller",
        &defaults(),
    )
}

const REF: &str = "parametersRef: {group: cf.k8s.lex.la, kind: GatewayClassConfig, name: main}";

#[test]
fn without_a_class_config_the_flags_decide() {
    let out = settle_text(&class("cf", "2024-01-01T00:00:00Z", ""));
    assert!(out.refused.is_empty());
    assert_eq!(out.shared.config, None);
    assert_eq!(out.shared.api_token.as_deref(), Some("flag-api-token"));
    assert_eq!(
        out.shared.tunnel_id,
        Some(FLAG_TUNNEL.parse().expect("uuid"))
    );
    assert_eq!(out.shared.account_id.as_deref(), Some(ACCOUNT));
    assert_eq!(out.shared.held, None);
    assert_eq!(
        out.shared.tunnel_secret,
        Some((
            ObjectKey::new("cftunnel-system", "flag-tunnel"),
            "tunnel-token".to_owned()
        )),
        "the pool reads the flag's Secret"
    );
}

#[test]
fn a_go_controller_object_overrides_the_credentials_and_names_the_tunnel() {
    // As the Go controller's documentation writes it: tunnelID and credentials only, the
    // Secret in the controller's namespace.
    let text = [
        class("cf", "2024-01-01T00:00:00Z", REF),
        config(
            "main",
            &format!("{{tunnelID: \"{FLAG_TUNNEL}\", cloudflareCredentialsSecretRef: {{name: cloudflare-credentials}}}}"),
        ),
        secret(
            "cftunnel-system",
            "cloudflare-credentials",
            &[("api-token", "class-api-token")],
        ),
    ]
    .concat();
    let out = settle_text(&text);
    assert!(out.refused.is_empty(), "{:?}", out.refused);
    assert_eq!(out.shared.config.as_deref(), Some("main"));
    assert_eq!(out.shared.api_token.as_deref(), Some("class-api-token"));
    assert_eq!(
        out.shared.tunnel_id,
        Some(FLAG_TUNNEL.parse().expect("uuid"))
    );
    assert_eq!(
        out.shared.account_id.as_deref(),
        Some(ACCOUNT),
        "the account of the flag's connector token"
    );
    let verdict = &out.configs["main"];
    assert_eq!(
        verdict.conditions(),
        [
            (
                "SecretsResolved",
                true,
                "SecretsFound",
                "All referenced secrets exist and contain required keys".to_owned()
            ),
            ("Valid", true, "Valid", "Configuration is valid".to_owned()),
        ]
    );
    assert_eq!(verdict.generation, Some(2));
}

#[test]
fn a_class_config_can_name_its_own_tunnel_token_key_and_account() {
    let other_account = "fedcba9876543210fedcba9876543210";
    let text = [
        class("cf", "2024-01-01T00:00:00Z", REF),
        config(
            "main",
            "{tunnelTokenSecretRef: {name: class-tunnel, namespace: edge, key: token}, cloudflareCredentialsSecretRef: {name: creds, namespace: edge, key: cf}}",
        ),
        secret("edge", "class-tunnel", &[("token", &token(other_account, TUNNEL))]),
        secret("edge", "creds", &[("cf", "edge-token"), ("account-id", other_account)]),
    ]
    .concat();
    let out = settle_text(&text);
    assert!(out.refused.is_empty(), "{:?}", out.refused);
    let token = out.shared.tunnel_token.as_ref().expect("the class token");
    assert_eq!(
        token.tunnel_id(),
        TUNNEL.parse::<uuid::Uuid>().expect("uuid")
    );
    assert_eq!(out.shared.tunnel_id, Some(token.tunnel_id()));
    assert_eq!(out.shared.account_id.as_deref(), Some(other_account));
    assert_eq!(out.shared.api_token.as_deref(), Some("edge-token"));
    assert_eq!(
        out.shared.tunnel_secret,
        Some((ObjectKey::new("edge", "class-tunnel"), "token".to_owned())),
        "the class config's Secret takes precedence over the flag's"
    );
}

#[test]
fn a_tunnel_token_secret_the_shared_pool_cannot_read_is_invalid() {
    let text = [
        secret(
            "cftunnel-system",
            "flag-tunnel",
            &[("tunnel-token", &token(ACCOUNT, FLAG_TUNNEL))],
        ),
        class("cf", "2024-01-01T00:00:00Z", REF),
        config(
            "main",
            "{tunnelTokenSecretRef: {name: class-tunnel, namespace: edge}}",
        ),
        secret(
            "edge",
            "class-tunnel",
            &[("tunnel-token", &token(ACCOUNT, TUNNEL))],
        ),
    ]
    .concat();
    let settle_with = |pool: Option<&str>| {
        settle(
            &snapshot(&text),
            "cf.k8s.lex.la/tunnel-controller",
            &ClassDefaults {
                pool_namespace: pool.map(str::to_owned),
                ..defaults()
            },
        )
    };
    // No pool the controller points at the Secret: any namespace will do.
    assert!(settle_with(None).refused.is_empty());
    let out = settle_with(Some("cftunnel-system"));
    assert!(
        out.refused["cf"].contains("whose Secrets alone the shared proxy pool's pods can read"),
        "{:?}",
        out.refused
    );
    assert_eq!(
        out.shared.tunnel_secret, None,
        "the pool is left as it runs"
    );
    assert!(out.shared.held.is_some());
    assert!(settle_with(Some("edge")).refused.is_empty());
}

#[test]
fn missing_secrets_make_the_config_invalid_and_the_class_not_accepted() {
    let text = [
        class("cf", "2024-01-01T00:00:00Z", REF),
        config(
            "main",
            "{tunnelTokenSecretRef: {name: absent}, cloudflareCredentialsSecretRef: {name: keyless}}",
        ),
        secret("cftunnel-system", "keyless", &[("other", "x")]),
    ]
    .concat();
    let out = settle_text(&text);
    let [secrets, valid] = out.configs["main"].conditions();
    assert_eq!((secrets.1, secrets.2), (false, "SecretsMissing"));
    assert!(
        secrets
            .3
            .contains("Secret cftunnel-system/keyless has no key \"api-token\""),
        "{}",
        secrets.3
    );
    assert!(
        secrets
            .3
            .contains("Secret cftunnel-system/absent not found"),
        "{}",
        secrets.3
    );
    assert_eq!((valid.1, valid.2), (false, "Invalid"));
    assert!(valid.3.ends_with("(and 1 more errors)"), "{}", valid.3);
    let why = &out.refused["cf"];
    assert!(
        why.contains("GatewayClassConfig main (spec.parametersRef) is not valid"),
        "{why}"
    );
    // Nothing falls back to the flags' tunnel or token.
    assert_eq!(out.shared.api_token, None);
    assert_eq!(out.shared.tunnel_id, None);
    assert!(out
        .shared
        .held
        .as_deref()
        .is_some_and(|h| h.contains("not valid")));
}

#[test]
fn disagreeing_tunnel_ids_and_accounts_are_invalid() {
    let text = [
        class("cf", "2024-01-01T00:00:00Z", REF),
        config(
            "main",
            &format!("{{tunnelID: \"{TUNNEL}\", accountId: fedcba9876543210fedcba9876543210}}"),
        ),
    ]
    .concat();
    let out = settle_text(&text);
    let problems = &out.configs["main"].problems;
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains(&format!(
        "spec.tunnelID {TUNNEL} is not the tunnel of the connector token ({FLAG_TUNNEL})"
    )));
    assert!(problems[1].contains("is not that of the connector token"));
}

/// The account is placed in the Cloudflare API's paths: one that could leave its path segment
/// makes the config invalid, with the field or Secret key it came from named.
#[test]
fn an_account_that_is_not_an_account_tag_is_invalid() {
    let text = [
        class("cf", "2024-01-01T00:00:00Z", REF),
        config("main", "{cloudflareCredentialsSecretRef: {name: creds}}"),
        secret(
            "cftunnel-system",
            "creds",
            &[("api-token", "class-api-token"), ("account-id", "x/y#")],
        ),
    ]
    .concat();
    let out = settle_text(&text);
    let problems = &out.configs["main"].problems;
    assert!(
        problems.iter().any(|p| p.contains(
            "spec.cloudflareCredentialsSecretRef: the \"account-id\" key of Secret cftunnel-system/creds: \"x/y#\" is not an account tag"
        )),
        "{problems:?}"
    );
    assert!(out.refused["cf"].contains("is not an account tag"));
    assert!(out.shared.held.is_some(), "nothing is written with it");

    let text = [
        class("cf", "2024-01-01T00:00:00Z", REF),
        config(
            "main",
            &format!("{{tunnelID: \"{TUNNEL}\", accountId: \"acct?x\"}}"),
        ),
    ]
    .concat();
    let problems = &settle_text(&text).configs["main"].problems;
    assert!(
        problems
            .iter()
            .any(|p| p.contains("spec.accountId: \"acct?x\" is not an account tag")),
        "{problems:?}"
    );
}

#[test]
fn a_tunnel_id_without_any_account_is_invalid() {
    let text = [
        class("cf", "2024-01-01T00:00:00Z", REF),
        config("main", &format!("{{tunnelID: \"{TUNNEL}\"}}")),
    ]
    .concat();
    let mut snapshot = snapshot(&text);
    let out = settle(
        &std::mem::take(&mut snapshot),
        "cf.k8s.lex.la/tunnel-controller",
        &ClassDefaults {
            namespace: "cftunnel-system".to_owned(),
            ..ClassDefaults::default()
        },
    );
    assert!(out.refused["cf"].contains("spec.tunnelID is set without an account"));
}

#[test]
fn a_missing_config_or_a_foreign_kind_refuses_the_class() {
    let text = [
        class("missing", "2024-01-01T00:00:00Z", REF),
        class(
            "foreign",
            "2024-01-02T00:00:00Z",
            "parametersRef: {group: \"\", kind: ConfigMap, name: main, namespace: x}",
        ),
        class(
            "other-controller",
            "2024-01-02T00:00:00Z",
            "parametersRef: {group: \"\", kind: ConfigMap, name: main, namespace: x}",
        )
        .replace("cf.k8s.lex.la/tunnel-controller", "example.com/other"),
    ]
    .concat();
    let out = settle_text(&text);
    assert_eq!(
        out.refused,
        BTreeMap::from([
            (
                "foreign".to_owned(),
                "spec.parametersRef must name a cf.k8s.lex.la/GatewayClassConfig, not core/ConfigMap".to_owned()
            ),
            (
                "missing".to_owned(),
                "GatewayClassConfig main (spec.parametersRef) not found".to_owned()
            ),
        ])
    );
    assert!(out
        .shared
        .held
        .as_deref()
        .is_some_and(|h| h.contains("not found")));
}

#[test]
fn classes_of_one_controller_must_name_the_same_config() {
    let text = [
        class(
            "younger",
            "2024-02-01T00:00:00Z",
            &REF.replace("main", "second"),
        ),
        class("older", "2024-01-01T00:00:00Z", REF),
        class("same", "2024-03-01T00:00:00Z", REF),
        class("none", "2024-03-01T00:00:00Z", ""),
        config("main", "{cloudflareCredentialsSecretRef: {name: creds}}"),
        config("second", "{}"),
        secret("cftunnel-system", "creds", &[("api-token", "main-token")]),
    ]
    .concat();
    let out = settle_text(&text);
    assert_eq!(out.refused.keys().collect::<Vec<_>>(), ["younger"]);
    assert!(out.refused["younger"]
        .contains("takes its settings from main, named by GatewayClass older"));
    assert_eq!(out.shared.api_token.as_deref(), Some("main-token"));
    // Both configs are judged, in use or not.
    assert!(out.configs["second"].problems.is_empty());
}
