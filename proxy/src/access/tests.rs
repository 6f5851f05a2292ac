use super::keys::parse;
use super::token::{self, Candidate, Validations, Verified, VerifiedCache};
use super::*;
use cftunnel_testkit::cloudflare_access::{claims, SigningKey};
use serde_json::json;

const ISSUER: &str = "https://acme.cloudflareaccess.com";

fn set(keys: &[&SigningKey]) -> Vec<token::Key> {
    let doc = json!({"keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>()});
    parse(doc.to_string().as_bytes()).expect("the set parses").0
}

fn check(keys: &[token::Key], token: &str) -> Result<Box<[Box<str>]>, AccessError> {
    let header = token::header(token)?;
    let claims = token::verify(
        token,
        &header,
        token::candidates(keys, &header),
        &Validations::new(ISSUER),
    )?;
    Ok(claims.aud)
}

#[test]
fn tokens_verify_against_the_key_their_header_names() {
    let rsa = SigningKey::rs256("r");
    let ec = SigningKey::es256("e");
    let keys = set(&[&rsa, &ec]);
    for key in [&rsa, &ec] {
        let aud = check(&keys, &key.sign(&claims(ISSUER, &["a", "b"], -5, 600)));
        assert_eq!(
            aud,
            Ok(vec!["a".into(), "b".into()].into_boxed_slice()),
            "{key:?}"
        );
    }
    let expired = rsa.sign(&claims(ISSUER, &["a"], -3600, -120));
    assert_eq!(check(&keys, &expired), Err(AccessError::Expired));
    let early = ec.sign(&claims(ISSUER, &["a"], 600, 1200));
    assert_eq!(check(&keys, &early), Err(AccessError::NotYetValid));
    // Within the leeway, both ends pass.
    let edges = ec.sign(&claims(ISSUER, &["a"], 30, 3600));
    assert!(check(&keys, &edges).is_ok());
    let other_team = rsa.sign(&claims(
        "https://evil.cloudflareaccess.com",
        &["a"],
        -5,
        600,
    ));
    assert_eq!(check(&keys, &other_team), Err(AccessError::WrongIssuer));
    let forged = SigningKey::rs256("r").sign(&claims(ISSUER, &["a"], -5, 600));
    assert_eq!(check(&keys, &forged), Err(AccessError::BadSignature));
    let unknown = SigningKey::es256("x").sign(&claims(ISSUER, &["a"], -5, 600));
    assert_eq!(check(&keys, &unknown), Err(AccessError::UnknownKey));
    // An RS256 header on an EC key's kid: no key of that algorithm has the id.
    let mixed = ec.sign_with_header(
        json!({"alg": "RS256", "kid": "e"}),
        &claims(ISSUER, &["a"], -5, 600),
    );
    assert_eq!(check(&keys, &mixed), Err(AccessError::UnknownKey));
    let none = rsa.sign_with_header(json!({"alg": "none"}), &claims(ISSUER, &["a"], -5, 600));
    assert!(check(&keys, &none).is_err());
    assert_eq!(check(&keys, "a.b"), Err(AccessError::Malformed));
    // Without a kid, every key of the algorithm is tried.
    let no_kid = ec.sign_with_header(json!({"alg": "ES256"}), &claims(ISSUER, &["a"], -5, 600));
    assert!(check(&keys, &no_kid).is_ok());
}

#[test]
fn key_sets_keep_the_keys_that_can_sign_tokens() {
    let rsa = SigningKey::rs256("r");
    let doc = json!({"keys": [
        rsa.jwk(),
        {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},
        {"kty": "RSA", "kid": "enc", "use": "enc", "n": rsa.jwk()["n"], "e": "AQAB"},
        {"kty": "EC", "crv": "P-384", "kid": "p384", "x": "AA", "y": "AA"},
    ], "public_cert": {"kid": "r", "cert": "..."}});
    let (keys, _) = parse(doc.to_string().as_bytes()).expect("parses");
    let kids: Vec<Option<&str>> = keys.iter().map(|k| k.kid.as_deref()).collect();
    assert_eq!(kids, [Some("r")]);
    assert!(parse(br#"{"keys": []}"#).is_err());
    assert!(parse(b"<html>").is_err());
    let header = token::header(&rsa.sign(&claims(ISSUER, &["a"], 0, 60))).expect("header");
    assert!(matches!(token::candidates(&keys, &header), Candidate::Keys(k) if k.len() == 1));
}

/// The claims a token for audience `a` carries.
fn claims_of(exp: u64, email: Option<&str>) -> token::Claims {
    serde_json::from_value(json!({"aud": "a", "exp": exp, "email": email})).expect("claims")
}

#[test]
fn a_remembered_token_serves_only_its_key_set_version_and_the_rule_audiences() {
    let cache = VerifiedCache::default();
    let digest = token::digest("t");
    let exp = u64::try_from(cftunnel_testkit::cloudflare_access::now() + 600).expect("positive");
    cache.insert(
        digest,
        Verified::new(3, claims_of(exp, Some("user@example.com"))),
    );
    assert_eq!(
        cache.get(&digest, 3, &["a".into()]),
        Some(Ok(Some(http::HeaderValue::from_static("user@example.com"))))
    );
    assert_eq!(
        cache.get(&digest, 3, &["b".into()]),
        Some(Err(AccessError::WrongAudience))
    );
    assert_eq!(cache.get(&digest, 4, &["a".into()]), None);
    assert_eq!(cache.get(&token::digest("u"), 3, &["a".into()]), None);
    // Already expired: not remembered at all.
    let past = u64::try_from(cftunnel_testkit::cloudflare_access::now() - 1).expect("positive");
    let old = token::digest("old");
    cache.insert(old, Verified::new(3, claims_of(past, None)));
    assert_eq!(cache.get(&old, 3, &["a".into()]), None);
}

#[test]
fn the_team_domain_template_must_be_a_url() {
    let with = |t: &str| AccessSettings {
        team_domain: t.to_owned(),
        ..AccessSettings::default()
    };
    assert!(AccessSettings::default().check().is_ok());
    assert_eq!(
        AccessSettings::default().domain_of("acme"),
        "https://acme.cloudflareaccess.com"
    );
    assert!(with("http://127.0.0.1:9/{team}").check().is_ok());
    assert!(with("ftp://{team}.example").check().is_err());
    assert!(with("{team}.cloudflareaccess.com").check().is_err());
}

/// A team's key set made for a newer table while an older table's is still in use reports
/// into the same series: the older one going does not take them off `/metrics`, the last one
/// does.
#[tokio::test]
async fn a_teams_series_stay_while_any_of_its_key_sets_is_alive() {
    let metrics = AccessMetrics::default();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let exported = |registry: &prometheus_client::registry::Registry| {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).expect("encodes");
        text.contains("team=\"acme\"")
    };
    let settings = Arc::new(AccessSettings::default());
    let older = TeamKeys::new("acme", settings.clone(), &metrics).expect("keys");
    let newer = TeamKeys::new("acme", settings, &metrics).expect("keys");
    assert!(exported(&registry));
    drop(older);
    assert!(exported(&registry), "the newer set still reports");
    drop(newer);
    assert!(!exported(&registry), "no set of the team is left");
}
