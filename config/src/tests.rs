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
