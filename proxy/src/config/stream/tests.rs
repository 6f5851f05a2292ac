use super::*;
use crate::config::compile::{compile_json, Compiler};
use crate::config::{compile, Cache, ConfigError};
use crate::metrics::ProxyMetrics;

type Outcome = Result<(i64, bool, usize), String>;

/// The text read rule by rule into a table: version, gRPC flag and rule count, or why not.
fn streamed(text: &str) -> Outcome {
    let metrics = ProxyMetrics::register(&mut Default::default());
    let mut cache = Cache::default();
    let mut compiler = Compiler::new(&mut cache, None);
    let header = read(text.as_bytes(), &mut compiler)?;
    let routes = compiler
        .finish(&metrics, header.version, header.has_grpc_route)
        .map_err(|e| e.to_string())?;
    Ok((header.version, header.has_grpc_route, routes.rule_count()))
}

/// The same text parsed whole into the config type, then compiled.
fn whole(text: &str) -> Outcome {
    let metrics = ProxyMetrics::register(&mut Default::default());
    let mut de = serde_json::Deserializer::from_slice(text.as_bytes());
    let doc: cftunnel_config::Config =
        serde_path_to_error::deserialize(&mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    let routes = compile(&doc, &metrics, &mut Cache::default()).map_err(|e| e.to_string())?;
    Ok((doc.version, doc.has_grpc_route, routes.rule_count()))
}

#[test]
fn a_document_reads_as_the_config_type_reads_it() {
    let bad_regex = r#"{"matches": [{"path": {"type": "RegularExpression", "value": "(["}}]}"#;
    let cases = [
        r#"{"version": 3, "rules": [{"backends": []}, {}], "hasGrpcRoute": true}"#.to_owned(),
        r#"{"hasGrpcRoute": false, "rules": [{}], "version": 9}"#.to_owned(),
        r#"{"rules": null}"#.to_owned(),
        r#"{}"#.to_owned(),
        r#"{"version": null, "hasGrpcRoute": null, "rules": [{"backends": [{"websocket": null, "protocol": null}]}]}"#.to_owned(),
        r#"[null, null, null]"#.to_owned(),
        r#"{"version": 1, "extra": {"a": [1, {"b": null}]}, "rules": []}"#.to_owned(),
        r#"[5, [{"backends": []}], true]"#.to_owned(),
        r#"[5]"#.to_owned(),
        r#"[]"#.to_owned(),
        r#"{"version": 1, "version": 2}"#.to_owned(),
        r#"{"rules": [], "rules": []}"#.to_owned(),
        r#"{"hasGrpcRoute": true, "hasGrpcRoute": false}"#.to_owned(),
        r#"{"version": "x"}"#.to_owned(),
        r#"{"rules": {}}"#.to_owned(),
        r#"{"rules": [{}, {"filters": [{"type": "Nope"}]}]}"#.to_owned(),
        r#"{"rules": [{}, {"backends": [{"url": "http://x", "weight": -1}]}]}"#.to_owned(),
        r#"{"rules": []} trailing"#.to_owned(),
        r#"{"rules": []}  "#.to_owned(),
        r#""string""#.to_owned(),
        "null".to_owned(),
        String::new(),
        r#"{"rules": ["#.to_owned(),
        format!(r#"{{"rules": [{{}}, {bad_regex}]}}"#),
        // A malformed rule after a refused one: the document is refused as malformed.
        format!(r#"{{"rules": [{bad_regex}, 7]}}"#),
    ];
    for text in &cases {
        assert_eq!(streamed(text), whole(text), "{text}");
    }
}

/// Bytes that are not UTF-8 are refused with the reader's own message and position.
#[test]
fn text_that_is_not_utf8_is_refused_as_the_config_type_refuses_it() {
    let text = b"{\"rules\": [{\"name\": \"a\xffb\"}]}";
    let mut cache = Cache::default();
    let mut compiler = Compiler::new(&mut cache, None);
    let refused = read(text, &mut compiler).expect_err("refused");
    let whole = serde_path_to_error::deserialize::<_, cftunnel_config::Config>(
        &mut serde_json::Deserializer::from_slice(text),
    )
    .expect_err("refused")
    .to_string();
    assert_eq!(refused, whole);
    assert!(refused.starts_with("rules[0].name: "), "{refused}");
}

/// The rule a request to `host` finds, by address: equal addresses are one shared rule.
fn rule_at(routes: &crate::routes::Routes, host: &str) -> *const crate::rule::Rule {
    let headers = http::HeaderMap::new();
    let view = crate::route::RequestView {
        method: &http::Method::GET,
        path: "/",
        query: None,
        headers: &headers,
    };
    routes
        .table
        .find(host, &view)
        .map_or(std::ptr::null(), |hit| std::sync::Arc::as_ptr(hit.rule))
}

/// A push read from text shares each rule whose text the table in service was built from,
/// compiles the others, and reads a rule spelled differently as the same rule.
#[test]
fn a_rule_pushed_again_with_the_same_text_is_shared_not_parsed_again() {
    let metrics = ProxyMetrics::register(&mut Default::default());
    let mut cache = Cache::default();
    let rule = |host: &str, port: u16| {
        format!(
            r#"{{"hostnames": ["{host}"], "backends": [{{"url": "http://127.0.0.1:{port}", "weight": 1}}]}}"#
        )
    };
    let doc = |rules: &[String]| format!(r#"{{"version": 1, "rules": [{}]}}"#, rules.join(","));
    let mut push =
        |text: String| compile_json(text.as_bytes(), 0, &metrics, &mut cache).expect("compiles");
    let first = push(doc(&[rule("a.test", 1), rule("b.test", 2)]));
    let second = push(doc(&[rule("a.test", 1), rule("b.test", 3)]));
    assert_eq!(rule_at(&first, "a.test"), rule_at(&second, "a.test"));
    assert_ne!(rule_at(&first, "b.test"), rule_at(&second, "b.test"));
    assert!(!rule_at(&second, "b.test").is_null());
    // The same rule with other spacing: compiled again, and served the same.
    let spaced = rule("a.test", 1).replace("\": ", "\" :  ");
    let third = push(doc(&[spaced, rule("b.test", 3)]));
    assert_ne!(rule_at(&second, "a.test"), rule_at(&third, "a.test"));
    assert!(!rule_at(&third, "a.test").is_null());
    assert_eq!(rule_at(&second, "b.test"), rule_at(&third, "b.test"));
}

/// A stale version is refused as stale, before any rule is looked at.
#[test]
fn a_stale_document_is_refused_as_stale_whatever_its_rules() {
    let metrics = ProxyMetrics::register(&mut Default::default());
    let text = br#"{"version": 4, "rules": [{"matches": [{"path": {"type": "RegularExpression", "value": "(["}}]}]}"#;
    let refused = compile_json(text, 5, &metrics, &mut Cache::default());
    assert!(
        matches!(
            refused,
            Err(ConfigError::Stale {
                pushed: 4,
                current: 5
            })
        ),
        "{refused:?}"
    );
}
