use super::*;
use crate::Config;
use serde_json::json;

fn doc(value: serde_json::Value) -> Config {
    serde_json::from_value(value).expect("the document parses")
}

/// The field a document's first refused rule names, from the document's root.
fn refused_field(value: serde_json::Value) -> String {
    document(&doc(value), &mut Cache::default())
        .expect_err("the document must be refused")
        .field()
}

#[test]
fn a_pattern_over_the_size_limit_is_refused_at_its_field() {
    // Unicode word characters 500 times over: about 8 MiB of NFA, over the 4 MiB limit.
    let err = document(
        &doc(json!({"rules": [
            {"backends": []},
            {"name": "team/shop/0", "matches": [{"path": {"type": "RegularExpression", "value": "/\\w{500}"}}], "backends": []}
        ]})),
        &mut Cache::default(),
    )
    .expect_err("an oversized pattern is refused");
    assert_eq!(err.index, 1);
    assert_eq!(err.name.as_deref(), Some("team/shop/0"));
    assert_eq!(err.invalid.field, "matches[0].path");
    assert!(
        err.invalid.message.starts_with("regex does not compile:"),
        "{err}"
    );
    assert!(
        err.to_string().starts_with("rules[1].matches[0].path: "),
        "{err}"
    );
    // The same pattern over ASCII word characters is small and passes, and so does one
    // that compiles with the `regex` crate's defaults.
    assert!(Pattern::new("/(?-u:\\w){500}").is_ok());
    assert!(Pattern::new("/\\w{50}").is_ok());
}

#[test]
fn patterns_are_anchored_as_parsed() {
    let p = Pattern::new("/v[0-9]+").expect("compiles");
    assert!(p.is_match("/v12"));
    assert!(!p.is_match("/v12/x"));
    assert!(!p.is_match("/x/v12"));
    // Text-anchoring would turn this into a valid pattern matching anything with a `b`.
    let err = Pattern::new("a)|(b").expect_err("refused");
    assert!(!err.contains('\n'), "one line: {err:?}");
}

#[test]
fn hostnames_are_checked_and_normalised_once() {
    assert_eq!(hostname("A.Example.COM").as_deref(), Ok("a.example.com"));
    assert_eq!(hostname(" a.example.com ").as_deref(), Ok("a.example.com"));
    assert_eq!(hostname("*.Example.com").as_deref(), Ok("*.example.com"));
    assert_eq!(hostname("x_y.example").as_deref(), Ok("x_y.example"));
    for bad in ["", "*.", "*", "a..b", "a b.com", "*.*.com", "exa$mple.com"] {
        assert!(hostname(bad).is_err(), "{bad:?} must be refused");
    }
    assert!(hostname(&format!("{}.com", "a".repeat(64))).is_err());
    assert!(hostname(&["a"; 130].join(".")).is_err(), "over 253 bytes");
    assert!(exact_hostname("*.example.com", "redirect").is_err());
    assert_eq!(
        exact_hostname("Example.com", "redirect").as_deref(),
        Ok("example.com")
    );
}

#[test]
fn a_hostname_is_checked_alone_as_it_is_when_built() {
    let long_label = format!("{}.com", "a".repeat(63));
    let too_long = ["a"; 127].join(".");
    let samples = [
        "a.example.com",
        " A.Example.COM ",
        "*.Example.com",
        "x_y.example",
        "",
        "*.",
        "*",
        "a..b",
        "a.",
        ".a",
        "a b.com",
        "*.*.com",
        "exa$mple.com",
        "é.com",
        long_label.as_str(),
        too_long.as_str(),
    ];
    for h in samples {
        assert_eq!(check_hostname(h), hostname(h).map(drop), "{h:?}");
    }
    assert!(check_hostname(&long_label).is_ok(), "63 bytes is a label");
    assert!(check_hostname("a.").is_err(), "an empty last label");
}

#[test]
fn header_names_values_and_methods() {
    assert!(header_name("x-ok").is_ok());
    assert!(header_name("").is_err());
    assert!(header_name("bad name").is_err());
    assert!(header_name("bad:name").is_err());
    assert!(header_value("a b\tc").is_ok());
    assert!(header_value("line\nbreak").is_err());
    assert!(header_value("nul\0").is_err());
    assert_eq!(method("get"), Ok(http::Method::GET));
    assert!(method("GE T").is_err());
}

#[test]
fn replacement_paths_are_absolute_request_paths() {
    assert_eq!(replacement_path(""), Ok("/"));
    assert_eq!(replacement_path("/a/b"), Ok("/a/b"));
    assert!(replacement_path("relative").is_err());
    assert!(replacement_path("/a b").is_err());
    assert!(replacement_path("/a?q=1").is_err());
    assert!(replacement_path("/a#frag").is_err());
}

#[test]
fn statuses() {
    assert!(status(99).is_err());
    assert!(status(600).is_err());
    assert!(final_status(101).is_err());
    assert!(final_status(503).is_ok());
    assert!(redirect_status(302).is_ok());
    assert!(redirect_status(200).is_err());
}

#[test]
fn targets_parse_everything_a_client_needs() {
    let t = Target::new(
        "https://[::1]:8443/base/",
        crate::BackendProtocol::Http1,
        false,
        None,
        false,
    )
    .expect("parses");
    assert_eq!(&*t.host, "::1");
    assert_eq!(t.port, 8443);
    assert_eq!(t.base_path.as_deref(), Some("/base"));
    assert!(t.tls.as_ref().is_some_and(|tls| tls.roots.is_none()));
    let plain = Target::new(
        "http://svc.ns.svc.cluster.local",
        crate::BackendProtocol::H2c,
        false,
        None,
        false,
    )
    .expect("parses");
    assert_eq!(plain.port, 80);
    assert!(plain.tls.is_none());
    assert!(plain.base_path.is_none());
}

#[test]
fn subject_alt_names_are_dns_names_ip_addresses_or_uris() {
    use super::SubjectAltName;
    let tls = crate::BackendTls {
        subject_alt_names: vec![
            "api.example.com".to_owned(),
            "fe80::1".to_owned(),
            "spiffe://cluster.local/ns/shop/sa/api".to_owned(),
            "urn:example:backend".to_owned(),
        ],
        ..crate::BackendTls::default()
    };
    let t = Target::new(
        "https://x",
        crate::BackendProtocol::Http1,
        false,
        Some(&tls),
        false,
    )
    .expect("parses");
    let names = t.tls.expect("tls").subject_alt_names;
    assert!(matches!(&names[0], SubjectAltName::Name(n) if n.to_str() == "api.example.com"));
    assert!(matches!(&names[1], SubjectAltName::Name(_)));
    assert_eq!(
        names[2..],
        [
            SubjectAltName::Uri("spiffe://cluster.local/ns/shop/sa/api".into()),
            SubjectAltName::Uri("urn:example:backend".into()),
        ]
    );
}

/// Gateway API's `Hostname` type allows a `*.` first label: such a name is accepted as a
/// wildcard, and satisfied by itself or by one label in place of the `*`; other malformed
/// names are still refused.
#[test]
fn a_wildcard_subject_alt_name_is_accepted_and_matches_one_label() {
    use super::SubjectAltName;
    let target = |name: &str| {
        let tls = crate::BackendTls {
            subject_alt_names: vec![name.to_owned()],
            ..crate::BackendTls::default()
        };
        Target::new(
            "https://x",
            crate::BackendProtocol::Http1,
            false,
            Some(&tls),
            false,
        )
    };
    let names = target("*.Svc.Example")
        .expect("a wildcard name")
        .tls
        .expect("tls")
        .subject_alt_names;
    assert_eq!(names, [SubjectAltName::Wildcard("svc.example".into())]);
    for refused in [
        "*",
        "*.",
        "**.svc.example",
        "*.*.svc.example",
        "a*.svc.example",
        "*.10.0.0.1",
        "*.svc example",
    ] {
        let err = target(refused)
            .err()
            .unwrap_or_else(|| panic!("{refused:?} is refused"));
        assert_eq!(err.field, "tls.subjectAltNames[0]", "{refused:?}");
    }
    let matches = |presented| SubjectAltName::wildcard_matches("svc.example", presented);
    assert!(matches("*.svc.example"));
    assert!(matches("*.SVC.example"));
    assert!(matches("api.svc.example"));
    assert!(matches("API.svc.example."));
    assert!(!matches("a.b.svc.example"));
    assert!(!matches("svc.example"));
    assert!(!matches(".svc.example"));
    assert!(!matches("a*.svc.example"));
    assert!(!matches("api.svc.example.org"));
    assert!(!matches("apisvc.example"));
}

/// An empty CA bundle trusts no certificate (the Go implementation's block without one);
/// one without any PEM certificate in it is still refused.
#[test]
fn an_empty_ca_bundle_trusts_nothing() {
    let target = |bundle: &str| {
        let tls = crate::BackendTls {
            ca_bundle: Some(bundle.to_owned()),
            ..crate::BackendTls::default()
        };
        Target::new(
            "https://x",
            crate::BackendProtocol::Http1,
            false,
            Some(&tls),
            false,
        )
    };
    let roots = target("").expect("accepted").tls.expect("tls").roots;
    assert_eq!(roots, Some(Vec::new()));
    assert_eq!(
        target("\n").err().map(|e| e.field).as_deref(),
        Some("tls.caBundle")
    );
}

#[test]
fn a_changed_client_key_makes_another_target() {
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["client.test".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    let tls = |private_key: String| crate::BackendTls {
        client_certificate: Some(crate::ClientCertificate {
            certificate_chain: cert.pem(),
            private_key,
        }),
        ..crate::BackendTls::default()
    };
    let mut cache = Cache::default();
    let mut target = |tls: &crate::BackendTls| {
        cache
            .target(
                "https://x",
                crate::BackendProtocol::Http1,
                false,
                Some(tls),
                false,
            )
            .cloned()
    };
    let first = target(&tls(key.serialize_pem())).expect("matching key");
    // The same certificate with a key of another encoding is checked again, not taken from
    // the cache as the same target.
    let other = rcgen::KeyPair::generate().expect("key");
    let err = target(&tls(other.serialize_pem())).expect_err("a key of another certificate");
    assert_eq!(err.field, "tls.clientCertificate.privateKey");
    let again = target(&tls(key.serialize_pem())).expect("again");
    assert!(
        std::sync::Arc::ptr_eq(&again, &first),
        "the same settings, the same target"
    );
}

#[test]
fn invalid_documents_name_the_field_at_fault() {
    let cases = [
        (
            json!({"rules": [{"matches": [{"path": {"type": "RegularExpression", "value": "(["}}]}]}),
            "rules[0].matches[0].path",
        ),
        (
            json!({"rules": [{"matches": [{"headers": [{"type": "RegularExpression", "name": "x", "value": "(["}]}]}]}),
            "rules[0].matches[0].headers[0].value",
        ),
        (
            json!({"rules": [{"matches": [{"headers": [{"name": "bad name", "value": "x"}]}]}]}),
            "rules[0].matches[0].headers[0].name",
        ),
        (
            json!({"rules": [{"matches": [{"queryParams": [{"name": "", "value": "x"}]}]}]}),
            "rules[0].matches[0].queryParams[0].name",
        ),
        (
            json!({"rules": [{"matches": [{"method": "G E T"}]}]}),
            "rules[0].matches[0].method",
        ),
        (
            json!({"rules": [{"hostnames": ["*"]}]}),
            "rules[0].hostnames[0]",
        ),
        (
            json!({"rules": [{}, {"backends": [{"url": "ftp://x", "weight": 1}]}]}),
            "rules[1].backends[0].url",
        ),
        (
            json!({"rules": [{"backends": [{"url": "not a url", "weight": 1}]}]}),
            "rules[0].backends[0].url",
        ),
        (
            json!({"rules": [{"backends": [{"url": "http://x:70000", "weight": 1}]}]}),
            "rules[0].backends[0].url",
        ),
        (
            json!({"rules": [{"backends": [{"url": "http://x:0", "weight": 1}]}]}),
            "rules[0].backends[0].url",
        ),
        (
            json!({"rules": [{"backends": [{"url": "http://u:p@x", "weight": 1}]}]}),
            "rules[0].backends[0].url",
        ),
        (
            json!({"rules": [{"backends": [{"url": "https://x", "weight": 1, "tls": {"caBundle": "not pem"}}]}]}),
            "rules[0].backends[0].tls.caBundle",
        ),
        (
            json!({"rules": [{"backends": [{"url": "https://x", "weight": 1, "tls": {"serverName": "a b"}}]}]}),
            "rules[0].backends[0].tls.serverName",
        ),
        (
            json!({"rules": [{"backends": [{"url": "https://x", "weight": 1, "tls": {"subjectAltNames": ["ok", "not ok"]}}]}]}),
            "rules[0].backends[0].tls.subjectAltNames[1]",
        ),
        (
            json!({"rules": [{"backends": [{"url": "https://x", "weight": 1, "tls": {"subjectAltNames": ["spiffe://a/b", "1scheme:x"]}}]}]}),
            "rules[0].backends[0].tls.subjectAltNames[1]",
        ),
        (
            json!({"rules": [{"backends": [{"url": "https://x", "weight": 1, "tls": {"clientCertificate": {"certificateChain": "", "privateKey": ""}}}]}]}),
            "rules[0].backends[0].tls.clientCertificate.certificateChain",
        ),
        (
            json!({"rules": [{"backends": [{"url": "http://x", "weight": 1, "tls": {}}]}]}),
            "rules[0].backends[0].tls",
        ),
        (
            json!({"rules": [{"filters": [{"type": "RequestRedirect", "requestRedirect": {"statusCode": 200}}]}]}),
            "rules[0].filters[0].requestRedirect.statusCode",
        ),
        (
            json!({"rules": [{"filters": [{"type": "RequestRedirect", "requestRedirect": {"hostname": "*.example.com"}}]}]}),
            "rules[0].filters[0].requestRedirect.hostname",
        ),
        (
            json!({"rules": [{"filters": [{"type": "RequestRedirect", "requestRedirect": {"port": 0}}]}]}),
            "rules[0].filters[0].requestRedirect.port",
        ),
        (
            json!({"rules": [{"filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "ftp"}}]}]}),
            "rules[0].filters[0].requestRedirect.scheme",
        ),
        (
            json!({"rules": [{"filters": [
                {"type": "RequestRedirect", "requestRedirect": {}},
                {"type": "RequestRedirect", "requestRedirect": {}}
            ]}]}),
            "rules[0].filters[1]",
        ),
        (
            json!({"rules": [{"matches": [{"path": {"type": "RegularExpression", "value": "/a.*"}}],
                              "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/b"}}}]}]}),
            "rules[0].filters[0].urlRewrite.path",
        ),
        (
            json!({"rules": [{"filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplaceFullPath", "replaceFullPath": "/a b"}}}]}]}),
            "rules[0].filters[0].urlRewrite.path",
        ),
        (
            json!({"rules": [{"filters": [{"type": "URLRewrite", "urlRewrite": {"hostname": "*.x"}}]}]}),
            "rules[0].filters[0].urlRewrite.hostname",
        ),
        (
            json!({"rules": [{"filters": [{"type": "RequestMirror", "requestMirror": {"backendUrl": "http://m", "percent": 101}}]}]}),
            "rules[0].filters[0].requestMirror.percent",
        ),
        (
            json!({"rules": [{"filters": [{"type": "RequestMirror", "requestMirror": {"backendUrl": "http://m", "fraction": {"numerator": 1, "denominator": 0}}}]}]}),
            "rules[0].filters[0].requestMirror.fraction.denominator",
        ),
        (
            json!({"rules": [{"filters": [{"type": "RequestMirror", "requestMirror": {"backendUrl": "http://m", "fraction": {"numerator": 3, "denominator": 2}}}]}]}),
            "rules[0].filters[0].requestMirror.fraction.numerator",
        ),
        (
            json!({"rules": [{"filters": [{"type": "RequestMirror", "requestMirror": {"backendUrl": "m"}}]}]}),
            "rules[0].filters[0].requestMirror.backendUrl",
        ),
        (
            json!({"rules": [{"filters": [{"type": "RequestHeaderModifier"}]}]}),
            "rules[0].filters[0].requestHeaderModifier",
        ),
        (
            json!({"rules": [{"filters": [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [{"name": "x", "value": "a\nb"}]}}]}]}),
            "rules[0].filters[0].responseHeaderModifier.set[0].value",
        ),
        (
            json!({"rules": [{"filters": [{"type": "CORS", "cors": {"allowMethods": ["GET\n"]}}]}]}),
            "rules[0].filters[0].cors.allowMethods",
        ),
        (
            json!({"rules": [{"unavailableStatus": 101}]}),
            "rules[0].unavailableStatus",
        ),
        (
            json!({"rules": [{"backends": [{"url": "http://127.0.0.1:9", "weight": 1, "unavailableStatus": 100}]}]}),
            "rules[0].backends[0].unavailableStatus",
        ),
        (
            json!({"rules": [{"retry": {"codes": [700]}}]}),
            "rules[0].retry.codes[0]",
        ),
        (
            json!({"rules": [{"backends": [{"url": "http://x", "weight": 1,
                   "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"remove": ["a b"]}}]}]}]}),
            "rules[0].backends[0].filters[0].requestHeaderModifier.remove[0]",
        ),
        (
            json!({"rules": [{"matches": [{"path": {"type": "Exact", "value": "no-slash"}}]}]}),
            "rules[0].matches[0].path",
        ),
        // Positions past the first, at every depth.
        (
            json!({"rules": [{}, {}, {"matches": [{}, {"queryParams": [
                {"name": "a", "value": "x"},
                {"type": "RegularExpression", "name": "b", "value": "(["}
            ]}]}]}),
            "rules[2].matches[1].queryParams[1].value",
        ),
        (
            json!({"rules": [{"backends": [
                {"url": "http://x", "weight": 1},
                {"url": "http://y", "weight": 1, "filters": [
                    {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"add": [{"name": "a", "value": "b"}]}},
                    {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"add": [{"name": "a", "value": "b"}, {"name": "c d", "value": "e"}]}}
                ]}
            ]}]}),
            "rules[0].backends[1].filters[1].responseHeaderModifier.add[1].name",
        ),
    ];
    for (value, field) in cases {
        assert_eq!(refused_field(value.clone()), field, "{value}");
        assert_same_verdict(&doc(value));
    }
}

/// [`check`] refuses exactly the rules [`rule`] refuses, naming the same field and reason.
fn assert_same_verdict(config: &Config) {
    for r in &config.rules {
        let built = rule(r, &mut Cache::default()).map(drop);
        assert_eq!(check(r, &mut Cache::default()), built, "{r:?}");
    }
}

#[test]
fn a_check_alone_gives_the_verdict_of_the_built_rule() {
    let accepted = doc(json!({"rules": [{
        "hostnames": ["A.example.com"],
        "matches": [{"path": {"type": "PathPrefix", "value": "/api/"},
                     "headers": [{"name": "X-A", "value": "1"}, {"name": "x-a", "type": "RegularExpression", "value": "("}],
                     "queryParams": [{"name": "q", "value": "1"}, {"name": "q", "type": "RegularExpression", "value": "("}]}],
        "filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https"}}],
        "backends": [{"url": "http://b", "weight": 3}]
    }]}));
    assert!(
        check(&accepted.rules[0], &mut Cache::default()).is_ok(),
        "a later equal name is not checked"
    );
    assert_same_verdict(&accepted);
    let refused = doc(json!({"rules": [
        {"matches": [{"headers": [{"name": "x-a", "value": "1"}, {"name": "X-B", "type": "RegularExpression", "value": "("}]}]},
        {"filters": [
            {"type": "RequestRedirect", "requestRedirect": {"scheme": "https"}},
            {"type": "RequestRedirect", "requestRedirect": {"scheme": "http"}}
        ]},
        {"matches": [{"path": {"type": "RegularExpression", "value": "/a.*"}}],
         "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/b"}}}]}
    ]}));
    for r in &refused.rules {
        assert!(check(r, &mut Cache::default()).is_err(), "{r:?}");
    }
    assert_same_verdict(&refused);
}

#[test]
fn a_checked_rule_keeps_gateway_api_semantics() {
    let rules = document(
        &doc(json!({"rules": [{
            "hostnames": ["A.example.com"],
            "matches": [{"path": {"type": "PathPrefix", "value": "/api/"},
                         "headers": [{"name": "X-A", "value": "1"}, {"name": "x-a", "value": "2"}],
                         "queryParams": [{"name": "q", "value": "1"}, {"name": "q", "value": "2"}]}],
            "backends": [{"url": "http://b", "weight": 3}],
            "timeouts": {"request": "0s", "backend": "2s"}
        }, {"backends": [{"url": "", "weight": 1, "unavailableStatus": 500}]}]})),
        &mut Cache::default(),
    )
    .expect("passes");
    let r = &rules[0];
    assert_eq!(&*r.hostnames[0], "a.example.com");
    let m = &r.matches[0];
    assert!(matches!(&m.path, PathMatch::Prefix(p) if &**p == "/api"));
    assert_eq!(m.headers.len(), 1, "the first of equal header names counts");
    assert!(matches!(&m.headers[0].1, ValueMatch::Exact(v) if &**v == "1"));
    assert_eq!(m.query.len(), 1, "the first of equal parameters counts");
    assert_eq!(r.request_timeout, None, "zero means no timeout");
    assert_eq!(r.backend_timeout, Some(std::time::Duration::from_secs(2)));
    assert_eq!(r.backends[0].weight, 3);
    assert!(rules[1].backends[0].target.is_none(), "never dialled");
    assert_eq!(rules[1].matches.len(), 1, "no matches: every request");
}

#[test]
fn the_cache_compiles_a_pattern_once_and_keeps_one_document_worth() {
    let mut cache = Cache::default();
    let a = cache.pattern("/a.*").expect("compiles");
    let again = cache.pattern("/a.*").expect("compiles");
    assert!(std::ptr::eq(a.source(), again.source()), "reused");
    cache.keep_used();
    let kept = cache.pattern("/a.*").expect("compiles");
    assert!(
        std::ptr::eq(a.source(), kept.source()),
        "kept across documents"
    );
    cache.keep_used();
    // A document that no longer names it lets it go.
    cache.keep_used();
    let fresh = cache.pattern("/a.*").expect("compiles");
    assert!(!std::ptr::eq(a.source(), fresh.source()), "compiled again");
    // A refused document's additions are forgotten; the previous generation stays.
    cache.keep_used();
    let _ = cache.pattern("/b.*");
    cache.drop_used();
    let still = cache.pattern("/a.*").expect("compiles");
    assert!(std::ptr::eq(fresh.source(), still.source()));
}

/// Patterns the engine refuses: one that does not parse, one over the size limit (about 8 MiB
/// of NFA, the costly kind to compile again).
const REFUSED: [&str; 2] = ["/([a-z]", "/\\w{500}"];

/// `cache`'s answer for `source`, which must be a refusal, and how many compiles it took.
fn refusal(cache: &mut Cache, source: &str) -> (String, usize) {
    let before = pattern::compiles();
    let err = cache.pattern(source).expect_err("a refused pattern");
    (err, pattern::compiles() - before)
}

#[test]
fn the_cache_compiles_a_refused_pattern_once_and_refuses_it_alike() {
    for source in REFUSED {
        let fresh = Pattern::new(source).expect_err("refused");
        let mut cache = Cache::default();
        assert_eq!(refusal(&mut cache, source), (fresh.clone(), 1), "{source}");
        assert_eq!(refusal(&mut cache, source), (fresh.clone(), 0), "{source}");
        // The next document names it again: still remembered.
        cache.keep_used();
        assert_eq!(refusal(&mut cache, source), (fresh.clone(), 0), "{source}");
        cache.keep_used();
        assert_eq!(refusal(&mut cache, source), (fresh.clone(), 0), "{source}");

        // A whole document refuses it at the same field with the same message, compiled once.
        let value = json!({"rules": [
            {"backends": []},
            {"matches": [{"path": {"type": "RegularExpression", "value": source}}], "backends": []}
        ]});
        let first = document(&doc(value.clone()), &mut cache).expect_err("refused");
        cache.keep_used();
        let before = pattern::compiles();
        let again = document(&doc(value.clone()), &mut cache).expect_err("refused");
        assert_eq!(pattern::compiles() - before, 0, "{source}");
        assert_eq!(again.to_string(), first.to_string());
        let fresh = document(&doc(value), &mut Cache::default()).expect_err("refused");
        assert_eq!(again.to_string(), fresh.to_string());
    }
}

#[test]
fn the_cache_forgets_a_refused_pattern_the_last_document_did_not_name() {
    for source in REFUSED {
        let fresh = Pattern::new(source).expect_err("refused");
        let mut cache = Cache::default();
        assert_eq!(refusal(&mut cache, source), (fresh.clone(), 1), "{source}");
        cache.keep_used();
        assert_eq!(
            refusal(&mut cache, source),
            (fresh.clone(), 0),
            "kept: {source}"
        );
        cache.keep_used();
        // A document that does not name it.
        cache.pattern("/a.*").expect("compiles");
        cache.keep_used();
        assert_eq!(
            refusal(&mut cache, source),
            (fresh, 1),
            "compiled again: {source}"
        );
    }
}

#[test]
fn the_cache_forgets_a_refused_pattern_a_refused_document_added() {
    for source in REFUSED {
        let fresh = Pattern::new(source).expect_err("refused");
        let mut cache = Cache::default();
        assert_eq!(refusal(&mut cache, source), (fresh.clone(), 1), "{source}");
        cache.drop_used();
        assert_eq!(
            refusal(&mut cache, source),
            (fresh.clone(), 1),
            "forgotten: {source}"
        );
        // Added by a document that passed, then named by a refused one: it stays, until a
        // document that does not name it passes.
        cache.keep_used();
        assert_eq!(refusal(&mut cache, source), (fresh.clone(), 0), "{source}");
        cache.drop_used();
        assert_eq!(refusal(&mut cache, source), (fresh.clone(), 0), "{source}");
        cache.drop_used();
        cache.keep_used();
        assert_eq!(refusal(&mut cache, source), (fresh, 1), "{source}");
    }
}

#[test]
fn the_cache_keeps_a_target_across_documents_and_a_refused_one_gives_it_back() {
    let mut cache = Cache::default();
    let url = "http://10.0.0.1:3000";
    let target = |cache: &mut Cache| {
        cache
            .target(url, crate::BackendProtocol::Http1, false, None, false)
            .cloned()
            .expect("parses")
    };
    let first = target(&mut cache);
    cache.keep_used();
    let kept = target(&mut cache);
    assert!(
        std::sync::Arc::ptr_eq(&first, &kept),
        "kept across documents"
    );
    let h2c = cache
        .target(url, crate::BackendProtocol::H2c, false, None, false)
        .cloned()
        .expect("parses");
    assert!(
        !std::sync::Arc::ptr_eq(&first, &h2c),
        "other settings, another target"
    );
    // A refused document's additions are forgotten; what it reused stays.
    cache.drop_used();
    let again = target(&mut cache);
    assert!(std::sync::Arc::ptr_eq(&first, &again));
    cache.keep_used();
    cache.keep_used();
    let fresh = target(&mut cache);
    assert!(
        !std::sync::Arc::ptr_eq(&first, &fresh),
        "parsed again once unused"
    );
}

#[test]
fn an_access_requirement_is_checked_at_its_fields() {
    let rule = |access: serde_json::Value| json!({"rules": [{"backends": [], "access": access}]});
    let checked = document(
        &doc(rule(
            json!({"teamName": "Acme-1", "audiences": ["aud1", "aud2", "aud1"]}),
        )),
        &mut Cache::default(),
    )
    .expect("a team and audiences pass");
    assert_eq!(
        checked[0].access,
        Some(Access {
            team: "acme-1".into(),
            audiences: vec!["aud1".into(), "aud2".into()],
        })
    );
    for (access, field) in [
        (json!({"audiences": ["a"]}), "rules[0].access.teamName"),
        (
            json!({"teamName": "acme.example", "audiences": ["a"]}),
            "rules[0].access.teamName",
        ),
        (
            json!({"teamName": "-acme", "audiences": ["a"]}),
            "rules[0].access.teamName",
        ),
        (json!({"teamName": "acme"}), "rules[0].access.audiences"),
        (
            json!({"teamName": "acme", "audiences": []}),
            "rules[0].access.audiences",
        ),
        (
            json!({"teamName": "acme", "audiences": ["ok", ""]}),
            "rules[0].access.audiences[1]",
        ),
        (
            json!({"teamName": "acme", "audiences": ["has space"]}),
            "rules[0].access.audiences[0]",
        ),
    ] {
        assert_eq!(refused_field(rule(access.clone())), field, "{access}");
    }
    // Without the field, no requirement.
    let plain = document(
        &doc(json!({"rules": [{"backends": []}]})),
        &mut Cache::default(),
    )
    .expect("passes");
    assert_eq!(plain[0].access, None);
}

/// A `document` whose only rule has `filter` at rule level (`backend: false`) or on its one
/// backend.
fn one_filter(filter: serde_json::Value, backend: bool) -> serde_json::Value {
    if backend {
        json!({"rules": [{"backends": [{"url": "http://b", "weight": 1, "filters": [filter]}]}]})
    } else {
        json!({"rules": [{"filters": [filter], "backends": [{"url": "http://b", "weight": 1}]}]})
    }
}

/// A header modifier of `kind` (`requestHeaderModifier`, `responseHeaderModifier`) with
/// `edits`.
fn modifier(kind: &str, edits: serde_json::Value) -> serde_json::Value {
    let tag = if kind == "requestHeaderModifier" {
        "RequestHeaderModifier"
    } else {
        "ResponseHeaderModifier"
    };
    json!({"type": tag, kind: edits})
}

/// A filter setting `Content-Length` or `Transfer-Encoding` would frame a message other than
/// the proxy sends it (a response queue poisoned, a request smuggled): `set` and `add` of them
/// are refused at the entry's name, naming the header, at rule and backend level, on requests
/// and responses; `remove` of them is taken. The other hop-by-hop headers may be set (as the
/// Go implementation allows: documents it pushes with them must keep being taken).
#[test]
fn a_header_filter_may_remove_framing_headers_but_not_set_or_add_them() {
    for name in crate::hop_by_hop::NAMES
        .into_iter()
        .filter(|n| *n != "transfer-encoding")
    {
        for kind in ["requestHeaderModifier", "responseHeaderModifier"] {
            for what in ["set", "add"] {
                let edits = json!({what: [{"name": name, "value": "close"}]});
                let value = one_filter(modifier(kind, edits), false);
                document(&doc(value.clone()), &mut Cache::default())
                    .unwrap_or_else(|e| panic!("{value}: {e}"));
                assert_same_verdict(&doc(value));
            }
        }
    }
    // A `Connection` that names a framing header would have a next hop remove it.
    for (kind, what) in [
        ("requestHeaderModifier", "set"),
        ("responseHeaderModifier", "add"),
    ] {
        for value in [
            "content-length",
            "close, Transfer-Encoding",
            "keep-alive,host",
            "content-length, \u{e9}",
        ] {
            let edits = json!({what: [{"name": "Connection", "value": value}]});
            let value = one_filter(modifier(kind, edits), false);
            let err = document(&doc(value.clone()), &mut Cache::default())
                .expect_err("a Connection naming a framing header is refused");
            assert_eq!(
                err.field(),
                format!("rules[0].filters[0].{kind}.{what}[0].value"),
                "{value}"
            );
            assert_same_verdict(&doc(value));
        }
    }
    for name in ["Content-Length", "transfer-encoding"] {
        for kind in ["requestHeaderModifier", "responseHeaderModifier"] {
            for backend in [false, true] {
                let at = if backend {
                    format!("rules[0].backends[0].filters[0].{kind}")
                } else {
                    format!("rules[0].filters[0].{kind}")
                };
                for what in ["set", "add"] {
                    // Behind an entry that is fine, so the position is the refused one's.
                    let edits = json!({what: [{"name": "x-fine", "value": "1"}, {"name": name, "value": "0"}]});
                    let value = one_filter(modifier(kind, edits), backend);
                    let err = document(&doc(value.clone()), &mut Cache::default())
                        .expect_err("a framing header is refused");
                    assert_eq!(err.field(), format!("{at}.{what}[1].name"), "{value}");
                    assert!(
                        err.invalid.message.starts_with(&name.to_ascii_lowercase())
                            && err.invalid.message.ends_with(&format!("not {what} it")),
                        "{value}: {err}"
                    );
                    assert_same_verdict(&doc(value));
                }
                let removed = one_filter(modifier(kind, json!({"remove": [name]})), backend);
                document(&doc(removed.clone()), &mut Cache::default())
                    .unwrap_or_else(|e| panic!("{removed}: {e}"));
                assert_same_verdict(&doc(removed));
            }
        }
    }
}
