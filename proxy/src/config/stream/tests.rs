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
    let header = read(text.as_bytes(), 0, &mut compiler)?;
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
    let refused = read(text, 0, &mut compiler).expect_err("refused");
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

/// A stale version is refused as stale, whatever its rules hold.
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

/// Counts the rules handed over, taking each as the compiler would find it new.
#[derive(Default)]
struct Counting(usize);

impl RuleSink for Counting {
    fn push_text(&mut self, text: &str) -> Result<(), serde_json::Error> {
        serde_json::from_str::<cftunnel_config::Rule>(text)?;
        self.0 += 1;
        Ok(())
    }
}

/// The rules of `text` that reach the compiler with version `current` in service, and what
/// the document says of itself.
fn handed_over(text: &str, current: i64) -> (Result<Header, String>, usize) {
    let mut sink = Counting::default();
    let read = read(text.as_bytes(), current, &mut sink);
    (read, sink.0)
}

/// A stale document whose version comes before its rules, as the controller writes it, hands
/// no rule to the compiler: the push is answered 409 without building the table it would have.
#[test]
fn a_stale_version_before_the_rules_hands_no_rule_to_the_compiler() {
    let rules = r#"[{"hostnames": ["a.test"]}, {"hostnames": ["b.test"]}]"#;
    let header = |version| Header {
        version,
        has_grpc_route: true,
    };
    let written = serde_json::to_string(&cftunnel_config::Config {
        version: 4,
        rules: vec![cftunnel_config::Rule::default(); 2],
        has_grpc_route: true,
    })
    .expect("a document");
    assert!(
        written.find("\"version\"") < written.find("\"rules\""),
        "the config type writes the version first: {written}"
    );
    for text in [
        written,
        format!(r#"{{"version": 4, "rules": {rules}, "hasGrpcRoute": true}}"#),
        format!(r#"[4, {rules}, true]"#),
    ] {
        assert_eq!(handed_over(&text, 5), (Ok(header(4)), 0), "{text}");
        // Current, newer or unversioned: every rule is compiled.
        assert_eq!(handed_over(&text, 4), (Ok(header(4)), 2), "{text}");
        assert_eq!(handed_over(&text, 0), (Ok(header(4)), 2), "{text}");
        let unversioned = text.replacen('4', "0", 1);
        assert_eq!(handed_over(&unversioned, 5), (Ok(header(0)), 2), "{text}");
    }
    // The version read after the rules: they are compiled before it is known.
    let late = format!(r#"{{"rules": {rules}, "hasGrpcRoute": true, "version": 4}}"#);
    assert_eq!(handed_over(&late, 5), (Ok(header(4)), 2));
}

/// A stale document is still read whole: one that is malformed is refused as malformed, with
/// the message any other push gets, and only then as stale.
#[test]
fn a_malformed_stale_document_is_refused_as_malformed() {
    let metrics = ProxyMetrics::register(&mut Default::default());
    for text in [
        r#"{"version": 4, "rules": [{}, {"backends": [{"url": "http://x", "weight": -1}]}]}"#,
        r#"{"version": 4, "rules": [{}, 7]}"#,
        r#"{"version": 4, "rules": [{}]} trailing"#,
        r#"[4, [{}, {"filters": [{"type": "Nope"}]}]]"#,
    ] {
        let (read, handed) = handed_over(text, 5);
        assert_eq!(handed, 0, "{text}");
        let whole = whole(text).expect_err("malformed");
        assert_eq!(read, Err(whole.clone()), "{text}");
        let refused = compile_json(text.as_bytes(), 5, &metrics, &mut Cache::default());
        assert_eq!(refused.err(), Some(ConfigError::Json(whole)), "{text}");
    }
}

/// A file's document is read into the config type by the reader a push's text goes through.
#[test]
fn a_document_read_whole_is_the_config_type_and_refused_as_a_push_is() {
    let good = r#"{"version": 3, "rules": [{"hostnames": ["a.test"]}, {}], "hasGrpcRoute": true}"#;
    let parsed: cftunnel_config::Config = serde_json::from_str(good).expect("a document");
    assert_eq!(read_document(good.as_bytes()), Ok(parsed));
    let bad =
        r#"{"version": 3, "rules": [{}, {}, {"backends": [{"url": "http://x", "weight": -1}]}]}"#;
    let refused = read_document(bad.as_bytes()).expect_err("refused");
    assert!(
        refused.starts_with("rules[2].backends[0].weight: "),
        "{refused}"
    );
    let metrics = ProxyMetrics::register(&mut Default::default());
    let pushed = compile_json(bad.as_bytes(), 0, &metrics, &mut Cache::default());
    assert_eq!(pushed.err(), Some(ConfigError::Json(refused)));
}
