use super::*;

#[test]
fn durations_parse_like_go() {
    let ms = |n| Duration(std::time::Duration::from_millis(n));
    assert_eq!("10s".parse(), Ok(ms(10_000)));
    assert_eq!("500ms".parse(), Ok(ms(500)));
    assert_eq!("1m30s".parse(), Ok(ms(90_000)));
    assert_eq!("1.5s".parse(), Ok(ms(1_500)));
    assert_eq!("0".parse(), Ok(ms(0)));
    assert_eq!("2h".parse(), Ok(ms(7_200_000)));
    assert!("10".parse::<Duration>().is_err());
    assert!("s".parse::<Duration>().is_err());
    assert!("-1s".parse::<Duration>().is_err());
    assert!("1d".parse::<Duration>().is_err());
    assert_eq!(ms(1_500).to_string(), "1500ms");
    assert_eq!(ms(2_000).to_string(), "2s");
    assert_eq!(ms(0).to_string(), "0s");
}

#[test]
fn documents_round_trip_and_ignore_unknown_fields() {
    let text = r#"{
      "version": 7, "hasGrpcRoute": true, "somethingNew": 1,
      "rules": [{
        "hostnames": ["*.example.com"],
        "matches": [{"path": {"type": "PathPrefix", "value": "/api"},
                     "headers": [{"type": "RegularExpression", "name": "x", "value": "a.*"}],
                     "queryParams": [{"name": "q", "value": "1"}], "method": "GET"}],
        "filters": [{"type": "CORS", "cors": {"allowOrigins": ["*"], "maxAge": 60}},
                    {"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v2"}}}],
        "backends": [{"url": "http://10.0.0.7:8080", "weight": 1, "protocol": "h2c",
                      "tls": {"serverName": "a"}}],
        "timeouts": {"request": "10s", "backend": "500ms"},
        "retry": {"codes": [503], "attempts": 2, "backoff": "100ms"},
        "unavailableStatus": 500, "name": "ns/route/0"
      }]
    }"#;
    let doc: Config = serde_json::from_str(text).expect("document parses");
    assert_eq!(doc.version, 7);
    assert!(doc.has_grpc_route);
    let rule = &doc.rules[0];
    assert_eq!(rule.matches[0].query_params[0].kind, ValueMatchType::Exact);
    assert_eq!(rule.backends[0].protocol, BackendProtocol::H2c);
    assert_eq!(rule.filters[0].kind, FilterType::Cors);
    let again: Config =
        serde_json::from_str(&serde_json::to_string(&doc).expect("serialises")).expect("reparses");
    assert_eq!(again, doc);
}

/// Go encodes nil slices as `null`: the documents its controller pushes for a cluster with no
/// routes, or with a redirect-only rule, read as empty lists.
#[test]
fn null_lists_read_as_empty() {
    let empty: Config = serde_json::from_str(r#"{"version": 3, "rules": null}"#).unwrap();
    assert_eq!((empty.version, empty.rules.len()), (3, 0));
    let text = r#"{"version": 4, "rules": [{
        "hostnames": null, "matches": [{"headers": null, "queryParams": null}], "filters": null,
        "backends": null, "retry": {"codes": null}
    }]}"#;
    let doc: Config = serde_json::from_str(text).unwrap();
    let rule = &doc.rules[0];
    assert!(rule.hostnames.is_empty() && rule.filters.is_empty() && rule.backends.is_empty());
    assert!(rule.matches[0].headers.is_empty() && rule.matches[0].query_params.is_empty());
    assert!(rule.retry.as_ref().unwrap().codes.is_empty());
}

/// `publicOnly` reads as false when absent (documents from the Go controller) and is written
/// only when set.
#[test]
fn public_only_defaults_to_false_and_is_written_only_when_set() {
    let absent: Backend = serde_json::from_str(r#"{"url": "http://a.example.com.:80"}"#).unwrap();
    assert!(!absent.public_only);
    let text = serde_json::to_string(&absent).unwrap();
    assert!(!text.contains("publicOnly"), "{text}");
    let set: Backend =
        serde_json::from_str(r#"{"url": "http://a.example.com.:80", "publicOnly": true}"#).unwrap();
    assert!(set.public_only);
    let text = serde_json::to_string(&set).unwrap();
    assert!(text.contains(r#""publicOnly":true"#), "{text}");
}

/// A mirror's `publicOnly` behaves as a backend's: false when absent, written only when set.
#[test]
fn mirror_public_only_defaults_to_false_and_is_written_only_when_set() {
    let absent: RequestMirror =
        serde_json::from_str(r#"{"backendUrl": "http://a.example.com.:80"}"#).unwrap();
    assert!(!absent.public_only);
    let text = serde_json::to_string(&absent).unwrap();
    assert!(!text.contains("publicOnly"), "{text}");
    let set: RequestMirror =
        serde_json::from_str(r#"{"backendUrl": "http://a.example.com.:80", "publicOnly": true}"#)
            .unwrap();
    assert!(set.public_only);
    let text = serde_json::to_string(&set).unwrap();
    assert!(text.contains(r#""publicOnly":true"#), "{text}");
}

/// The Go implementation's spelling of backend TLS (URI names apart, the client certificate as
/// base64 PEM bytes), which its controller pushes, reads as this crate's; a half pair or two
/// certificates are refused, naming the fields.
#[test]
fn backend_tls_reads_the_go_spelling_too() {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let tls = |value: serde_json::Value| serde_json::from_value::<BackendTls>(value);
    let go = tls(serde_json::json!({
        "caBundle": "CA", "serverName": "api.internal",
        "subjectAltNames": ["api.internal"],
        "subjectAltNameUris": ["spiffe://cluster.local/ns/shop/sa/api"],
        "clientCertPem": b64("CERT"), "clientKeyPem": b64("KEY"),
    }))
    .expect("the Go spelling reads");
    let ours = tls(serde_json::json!({
        "caBundle": "CA", "serverName": "api.internal",
        "subjectAltNames": ["api.internal", "spiffe://cluster.local/ns/shop/sa/api"],
        "clientCertificate": {"certificateChain": "CERT", "privateKey": "KEY"},
    }))
    .expect("this crate's spelling reads");
    assert_eq!(go, ours);
    // Written in this crate's spelling, and read back the same.
    let written = serde_json::to_value(&go).expect("writes");
    assert!(written.get("clientCertPem").is_none(), "{written}");
    assert_eq!(tls(written).expect("reads back"), ours);

    for (value, named) in [
        (
            serde_json::json!({"clientCertPem": b64("CERT")}),
            "clientKeyPem",
        ),
        (
            serde_json::json!({"clientCertPem": "not base64!", "clientKeyPem": b64("KEY")}),
            "clientCertPem",
        ),
        (
            serde_json::json!({"clientCertPem": b64("C"), "clientKeyPem": b64("K"),
                "clientCertificate": {"certificateChain": "C", "privateKey": "K"}}),
            "clientCertificate",
        ),
    ] {
        let err = tls(value).expect_err("refused").to_string();
        assert!(err.contains(named), "{err}");
    }
}

/// A block in the Go implementation's spelling without a CA bundle trusts nothing, as in Go
/// (its controller writes one when a policy's CA cannot be used); told apart by a field only
/// Go writes. A block both spellings share keeps this crate's meaning (the web roots), and
/// what is read is written back so that it reads the same.
#[test]
fn a_go_block_without_a_ca_bundle_trusts_nothing() {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let tls =
        |value: serde_json::Value| serde_json::from_value::<BackendTls>(value).expect("reads");
    for go in [
        serde_json::json!({"serverName": "api.example.com",
            "clientCertPem": b64("CERT"), "clientKeyPem": b64("KEY")}),
        serde_json::json!({"serverName": "api.example.com",
            "subjectAltNameUris": ["spiffe://cluster.local/ns/shop/sa/api"]}),
    ] {
        let read = tls(go.clone());
        assert_eq!(read.ca_bundle.as_deref(), Some(""), "{go}");
        let written = serde_json::to_value(&read).expect("writes");
        assert_eq!(tls(written), read);
    }
    let with_bundle = tls(serde_json::json!({"caBundle": "CA",
        "clientCertPem": b64("CERT"), "clientKeyPem": b64("KEY")}));
    assert_eq!(with_bundle.ca_bundle.as_deref(), Some("CA"));
    for shared in [
        serde_json::json!({"serverName": "api.example.com"}),
        serde_json::json!({"serverName": "api.example.com",
            "clientCertificate": {"certificateChain": "C", "privateKey": "K"}}),
    ] {
        assert_eq!(tls(shared.clone()).ca_bundle, None, "{shared}");
    }
}

/// A mirror's TLS settings, as a backend's: read when set, written only then.
#[test]
fn mirror_tls_is_read_and_written_only_when_set() {
    let plain: RequestMirror =
        serde_json::from_value(serde_json::json!({"backendUrl": "http://m"})).expect("reads");
    assert_eq!(plain.tls, None);
    assert!(serde_json::to_value(&plain)
        .expect("writes")
        .get("tls")
        .is_none());
    let secure: RequestMirror = serde_json::from_value(serde_json::json!({
        "backendUrl": "https://m", "tls": {"serverName": "m.internal"}
    }))
    .expect("reads");
    assert_eq!(
        secure.tls.and_then(|t| t.server_name).as_deref(),
        Some("m.internal")
    );
}
