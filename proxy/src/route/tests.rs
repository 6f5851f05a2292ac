//! Routing table tests over compiled config documents: one test per row of the proxy
//! contract's routing section. No sockets, no runtime.

use crate::config::{compile, Cache};
use crate::metrics::ProxyMetrics;
use crate::route::RequestView;
use crate::routes::Routes;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use serde_json::json;

fn compile_doc(doc: serde_json::Value) -> Routes {
    let doc: cftunnel_config::Config = serde_json::from_value(doc).expect("test document parses");
    let metrics = ProxyMetrics::register(&mut Default::default());
    compile(&doc, &metrics, &mut Cache::default()).expect("test document compiles")
}

/// A rule named `name` routing to a dummy backend.
fn rule(name: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut r = json!({"name": name, "backends": [{"url": "http://127.0.0.1:9", "weight": 1}]});
    if let (Some(r), Some(extra)) = (r.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            r.insert(k.clone(), v.clone());
        }
    }
    r
}

fn find(
    routes: &Routes,
    method: &str,
    host: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> Option<String> {
    let uri: http::Uri = target.parse().expect("test target parses");
    let mut map = HeaderMap::new();
    for (k, v) in headers {
        map.append(
            HeaderName::from_bytes(k.as_bytes()).expect("header name"),
            HeaderValue::from_str(v).expect("header value"),
        );
    }
    let method = Method::from_bytes(method.as_bytes()).expect("method");
    let view = RequestView {
        method: &method,
        path: uri.path(),
        query: uri.query(),
        headers: &map,
    };
    routes
        .table
        .find(host, &view)
        .and_then(|hit| hit.rule.name.as_deref().map(str::to_owned))
}

fn get(routes: &Routes, host: &str, target: &str) -> Option<String> {
    find(routes, "GET", host, target, &[])
}

#[test]
fn host_is_taken_from_host_header_without_port_and_lower_cased() {
    let req = |host: &str| {
        let (parts, ()) = http::Request::builder()
            .uri("/x")
            .header("host", host)
            .body(())
            .expect("request")
            .into_parts();
        crate::proxy::request_host(&parts).into_owned()
    };
    assert_eq!(req("Example.COM:8080"), "example.com");
    assert_eq!(req("example.com"), "example.com");
    assert_eq!(req("[::1]:443"), "[::1]");
    assert_eq!(req("example.com."), "example.com");
    let (parts, ()) = http::Request::builder()
        .uri("https://H2.Example.com/x")
        .body(())
        .expect("request")
        .into_parts();
    assert_eq!(
        crate::proxy::request_host(&parts),
        "h2.example.com",
        ":authority wins for HTTP/2"
    );
}

#[test]
fn exact_host_beats_wildcard_beats_hostless() {
    let routes = compile_doc(json!({"rules": [
        rule("any", json!({})),
        rule("wild", json!({"hostnames": ["*.example.com"]})),
        rule("deep-wild", json!({"hostnames": ["*.a.example.com"]})),
        rule("exact", json!({"hostnames": ["foo.example.com"]})),
    ]}));
    assert_eq!(
        get(&routes, "foo.example.com", "/").as_deref(),
        Some("exact")
    );
    assert_eq!(
        get(&routes, "bar.example.com", "/").as_deref(),
        Some("wild")
    );
    assert_eq!(
        get(&routes, "x.a.example.com", "/").as_deref(),
        Some("deep-wild"),
        "longest wildcard wins"
    );
    assert_eq!(
        get(&routes, "x.y.example.com", "/").as_deref(),
        Some("wild"),
        "wildcard spans several labels"
    );
    assert_eq!(
        get(&routes, "example.com", "/").as_deref(),
        Some("any"),
        "wildcard never matches the apex"
    );
    assert_eq!(get(&routes, "other.org", "/").as_deref(), Some("any"));
}

#[test]
fn lookup_falls_through_to_less_specific_hosts_when_no_rule_matches() {
    let routes = compile_doc(json!({"rules": [
        rule("exact-api", json!({"hostnames": ["foo.example.com"], "matches": [{"path": {"type": "PathPrefix", "value": "/api"}}]})),
        rule("wild-all", json!({"hostnames": ["*.example.com"]})),
    ]}));
    assert_eq!(
        get(&routes, "foo.example.com", "/api/x").as_deref(),
        Some("exact-api")
    );
    assert_eq!(
        get(&routes, "foo.example.com", "/web").as_deref(),
        Some("wild-all")
    );
    assert_eq!(get(&routes, "nothing.org", "/"), None, "no match is a 404");
}

#[test]
fn path_precedence_is_exact_then_longest_prefix_then_regex() {
    let routes = compile_doc(json!({"rules": [
        rule("regex", json!({"matches": [{"path": {"type": "RegularExpression", "value": "/foo/.*"}}]})),
        rule("prefix-short", json!({"matches": [{"path": {"type": "PathPrefix", "value": "/foo"}}]})),
        rule("prefix-long", json!({"matches": [{"path": {"type": "PathPrefix", "value": "/foo/bar"}}]})),
        rule("exact", json!({"matches": [{"path": {"type": "Exact", "value": "/foo/bar"}}]})),
    ]}));
    assert_eq!(get(&routes, "h", "/foo/bar").as_deref(), Some("exact"));
    assert_eq!(
        get(&routes, "h", "/foo/bar/baz").as_deref(),
        Some("prefix-long")
    );
    assert_eq!(get(&routes, "h", "/foo/x").as_deref(), Some("prefix-short"));
    assert_eq!(
        get(&routes, "h", "/foobar"),
        None,
        "prefixes are segment-aware"
    );
}

/// A host with a few paths compares them in turn and one with many looks them up in a map:
/// both keep exact before longest prefix, method before none, and document order among equals.
#[test]
fn precedence_holds_for_hosts_with_few_and_with_many_paths() {
    for fillers in [0, 3, 20] {
        let mut rules: Vec<_> = (0..fillers)
            .flat_map(|i| {
                [
                    rule(&format!("exact{i}"), json!({"matches": [{"path": {"type": "Exact", "value": format!("/filler{i}")}}]})),
                    rule(&format!("prefix{i}"), json!({"matches": [{"path": {"type": "PathPrefix", "value": format!("/filler{i}/p")}}]})),
                ]
            })
            .collect();
        rules.extend([
            rule("prefix-short", json!({"matches": [{"path": {"type": "PathPrefix", "value": "/foo"}}]})),
            rule("prefix-long", json!({"matches": [{"path": {"type": "PathPrefix", "value": "/foo/bar"}}]})),
            rule("exact", json!({"matches": [{"path": {"type": "Exact", "value": "/foo/bar"}}]})),
            rule("exact-again", json!({"matches": [{"path": {"type": "Exact", "value": "/foo/bar"}}]})),
            rule("post", json!({"matches": [{"path": {"type": "Exact", "value": "/foo/bar"}, "method": "POST"}]})),
        ]);
        let routes = compile_doc(json!({ "rules": rules }));
        let at = |method: &str, path: &str| find(&routes, method, "h", path, &[]);
        assert_eq!(at("GET", "/foo/bar").as_deref(), Some("exact"), "{fillers}");
        assert_eq!(at("POST", "/foo/bar").as_deref(), Some("post"), "{fillers}");
        assert_eq!(
            at("GET", "/foo/bar/baz").as_deref(),
            Some("prefix-long"),
            "{fillers}"
        );
        assert_eq!(
            at("GET", "/foo/x").as_deref(),
            Some("prefix-short"),
            "{fillers}"
        );
        assert_eq!(at("GET", "/foobar"), None, "{fillers}");
        for i in 0..fillers {
            assert_eq!(at("GET", &format!("/filler{i}")), Some(format!("exact{i}")));
            assert_eq!(
                at("GET", &format!("/filler{i}/p/q")),
                Some(format!("prefix{i}"))
            );
            assert_eq!(at("GET", &format!("/filler{i}/q")), None);
        }
    }
}

#[test]
fn prefix_match_is_segment_aware_and_ignores_a_trailing_slash() {
    let routes = compile_doc(json!({"rules": [
        rule("foo", json!({"matches": [{"path": {"type": "PathPrefix", "value": "/foo/"}}]})),
    ]}));
    assert_eq!(get(&routes, "h", "/foo").as_deref(), Some("foo"));
    assert_eq!(get(&routes, "h", "/foo/").as_deref(), Some("foo"));
    assert_eq!(get(&routes, "h", "/foo/bar").as_deref(), Some("foo"));
    assert_eq!(get(&routes, "h", "/foobar"), None);
}

/// Only a host's suffixes as long as the longest wildcard are looked up, and only a path's
/// boundaries as near as the bucket's longest prefix: a long host or path still routes as any
/// other, including to a wildcard or prefix exactly as long as that bound.
#[test]
fn a_long_host_or_path_routes_as_a_short_one_would() {
    let labels = "a.".repeat(30_000);
    for fillers in [0, 20] {
        let mut rules: Vec<_> = (0..fillers)
            .map(|i| rule(&format!("filler{i}"), json!({"hostnames": ["p.example"], "matches": [{"path": {"type": "PathPrefix", "value": format!("/f{i}")}}]})))
            .collect();
        rules.extend([
            rule("any", json!({})),
            rule("wild", json!({"hostnames": ["*.example.com"]})),
            rule("deep-wild", json!({"hostnames": ["*.deep.example.com"]})),
            rule("one", json!({"hostnames": ["p.example"], "matches": [{"path": {"type": "PathPrefix", "value": "/a"}}]})),
            rule("three", json!({"hostnames": ["p.example"], "matches": [{"path": {"type": "PathPrefix", "value": "/a/a/a/"}}]})),
            rule("exact", json!({"hostnames": ["p.example"], "matches": [{"path": {"type": "Exact", "value": "/x/y"}}]})),
        ]);
        let routes = compile_doc(json!({ "rules": rules }));
        let host = |tail: &str| format!("{labels}{tail}");
        for (h, want) in [
            // `.deep.example.com` is the longest wildcard: its dot is the first one looked at.
            (host("deep.example.com"), "deep-wild"),
            (host("x.deep.example.com"), "deep-wild"),
            (host("xdeep.example.com"), "wild"),
            (host("example.com"), "wild"),
            (host("example.org"), "any"),
            (host("b"), "any"),
        ] {
            assert_eq!(get(&routes, &h, "/").as_deref(), Some(want), "{fillers}");
        }
        let at = |path: &str| get(&routes, "p.example", path);
        let segments = "/a".repeat(30_000);
        for (path, want) in [
            // `/a/a/a` is the longest prefix: the boundary right after it is in reach.
            (segments.clone(), "three"),
            (format!("{segments}///"), "three"),
            (format!("/a/a/a{}", "/b".repeat(30_000)), "three"),
            (format!("/a/a/ab{segments}"), "one"),
            (format!("/a/a{}", "/b".repeat(30_000)), "one"),
            (format!("/a//a/a{segments}"), "one"),
            // No prefix of the host's: the rules without hostnames.
            (format!("/ab{segments}"), "any"),
            (format!("/x/y{segments}"), "any"),
            (format!("/b{segments}"), "any"),
            (
                format!("/f1{segments}"),
                if fillers > 1 { "filler1" } else { "any" },
            ),
        ] {
            assert_eq!(at(&path).as_deref(), Some(want), "{fillers}: {:.20}", path);
        }
        assert_eq!(at("/a/a/a").as_deref(), Some("three"));
        assert_eq!(at("/a/a").as_deref(), Some("one"));
        assert_eq!(at("/x/y").as_deref(), Some("exact"));
    }
}

#[test]
fn regular_expressions_must_match_the_whole_value() {
    let routes = compile_doc(json!({"rules": [
        rule("path", json!({"matches": [{"path": {"type": "RegularExpression", "value": "/v[0-9]+"}}]})),
        rule("header", json!({"matches": [{"path": {"type": "Exact", "value": "/h"}, "headers": [{"type": "RegularExpression", "name": "x-id", "value": "[a-z]{3}"}]}]})),
        rule("query", json!({"matches": [{"path": {"type": "Exact", "value": "/q"}, "queryParams": [{"type": "RegularExpression", "name": "n", "value": "[0-9]+"}]}]})),
    ]}));
    assert_eq!(get(&routes, "h", "/v12").as_deref(), Some("path"));
    assert_eq!(get(&routes, "h", "/v12/x"), None, "anchored at the end");
    assert_eq!(get(&routes, "h", "/x/v12"), None, "anchored at the start");
    assert_eq!(
        find(&routes, "GET", "h", "/h", &[("x-id", "abc")]).as_deref(),
        Some("header")
    );
    assert_eq!(find(&routes, "GET", "h", "/h", &[("x-id", "abcd")]), None);
    assert_eq!(get(&routes, "h", "/q?n=42").as_deref(), Some("query"));
    assert_eq!(get(&routes, "h", "/q?n=42a"), None);
}

/// The pattern is anchored as parsed, not as text: an alternation stays inside the anchors,
/// a pattern that only compiles once wrapped is refused, and a trailing `(?x)` comment does
/// not swallow the anchor. With 16 or more patterns a host's patterns run as one set, so both
/// ways of matching are checked.
#[test]
fn a_pattern_is_anchored_as_parsed() {
    let metrics = ProxyMetrics::register(&mut Default::default());
    let refused = |value: &str| {
        let doc: cftunnel_config::Config = serde_json::from_value(json!({"rules": [
            rule("r", json!({"matches": [{"path": {"type": "RegularExpression", "value": value}}]})),
        ]}))
        .expect("parses");
        compile(&doc, &metrics, &mut Cache::default()).is_err()
    };
    assert!(refused("/admin)|(.*"), "unbalanced on its own");
    assert!(refused("(/a"));
    for fillers in [0, 20] {
        let mut rules: Vec<_> = (0..fillers)
            .map(|i| rule(&format!("f{i}"), json!({"matches": [{"path": {"type": "RegularExpression", "value": format!("/filler{i}/[0-9]+")}}]})))
            .collect();
        rules.push(rule(
            "alt",
            json!({"matches": [{"path": {"type": "RegularExpression", "value": "/a|/b"}}]}),
        ));
        rules.push(rule("x", json!({"matches": [{"path": {"type": "RegularExpression", "value": "(?x) /c  [0-9]+ # digits"}}]})));
        let routes = compile_doc(json!({ "rules": rules }));
        assert_eq!(get(&routes, "h", "/a").as_deref(), Some("alt"), "{fillers}");
        assert_eq!(get(&routes, "h", "/b").as_deref(), Some("alt"), "{fillers}");
        assert_eq!(
            get(&routes, "h", "/a/x"),
            None,
            "{fillers}: `/a|/b` is `^(?:/a|/b)$`"
        );
        assert_eq!(get(&routes, "h", "/x/b"), None, "{fillers}");
        assert_eq!(get(&routes, "h", "/c42").as_deref(), Some("x"), "{fillers}");
        assert_eq!(get(&routes, "h", "/c42/more"), None, "{fillers}");
    }
}

#[test]
fn method_then_header_count_then_query_count_break_path_ties() {
    let routes = compile_doc(json!({"rules": [
        rule("plain", json!({"matches": [{"path": {"type": "PathPrefix", "value": "/"}}]})),
        rule("one-query", json!({"matches": [{"queryParams": [{"name": "a", "value": "1"}]}]})),
        rule("one-header", json!({"matches": [{"headers": [{"name": "x-a", "value": "1"}]}]})),
        rule("two-headers", json!({"matches": [{"headers": [{"name": "x-a", "value": "1"}, {"name": "x-b", "value": "1"}]}]})),
        rule("method", json!({"matches": [{"method": "POST"}]})),
    ]}));
    assert_eq!(
        find(&routes, "POST", "h", "/?a=1", &[("x-a", "1"), ("x-b", "1")]).as_deref(),
        Some("method")
    );
    assert_eq!(
        find(&routes, "GET", "h", "/?a=1", &[("x-a", "1"), ("x-b", "1")]).as_deref(),
        Some("two-headers")
    );
    assert_eq!(
        find(&routes, "GET", "h", "/?a=1", &[("x-a", "1")]).as_deref(),
        Some("one-header")
    );
    assert_eq!(
        find(&routes, "GET", "h", "/?a=1", &[]).as_deref(),
        Some("one-query")
    );
    assert_eq!(
        find(&routes, "GET", "h", "/", &[]).as_deref(),
        Some("plain")
    );
}

#[test]
fn equal_precedence_goes_to_document_order() {
    let routes = compile_doc(json!({"rules": [
        rule("first", json!({"matches": [{"path": {"type": "PathPrefix", "value": "/same"}}]})),
        rule("second", json!({"matches": [{"path": {"type": "PathPrefix", "value": "/same"}}]})),
    ]}));
    assert_eq!(get(&routes, "h", "/same").as_deref(), Some("first"));
}

#[test]
fn matches_are_ored_and_fields_inside_a_match_are_anded() {
    let routes = compile_doc(json!({"rules": [
        rule("r", json!({"matches": [
            {"path": {"type": "Exact", "value": "/a"}, "headers": [{"name": "color", "value": "blue"}]},
            {"path": {"type": "Exact", "value": "/b"}}
        ]})),
    ]}));
    assert_eq!(
        find(&routes, "GET", "h", "/a", &[("color", "blue")]).as_deref(),
        Some("r")
    );
    assert_eq!(
        find(&routes, "GET", "h", "/a", &[("color", "red")]),
        None,
        "AND inside a match"
    );
    assert_eq!(
        get(&routes, "h", "/b").as_deref(),
        Some("r"),
        "OR across matches"
    );
}

#[test]
fn header_values_beyond_ascii_are_matched_as_text() {
    let routes = compile_doc(json!({"rules": [
        rule("exact", json!({"matches": [{"headers": [{"name": "x-user", "value": "José"}]}]})),
        rule("any", json!({"matches": [{"headers": [{"type": "RegularExpression", "name": "x-team", "value": ".+"}]}]})),
    ]}));
    let find_raw = |name: &str, value: &[u8]| {
        let mut map = HeaderMap::new();
        map.append(
            HeaderName::from_bytes(name.as_bytes()).expect("header name"),
            HeaderValue::from_bytes(value).expect("header value"),
        );
        let view = RequestView {
            method: &Method::GET,
            path: "/",
            query: None,
            headers: &map,
        };
        routes
            .table
            .find("h", &view)
            .and_then(|hit| hit.rule.name.as_deref().map(str::to_owned))
    };
    assert_eq!(
        find_raw("x-user", "José".as_bytes()).as_deref(),
        Some("exact")
    );
    assert_eq!(find_raw("x-user", b"Jose"), None);
    assert_eq!(
        find_raw("x-team", "ölfabrik".as_bytes()).as_deref(),
        Some("any")
    );
}

#[test]
fn header_names_are_case_insensitive_query_names_are_not() {
    let routes = compile_doc(json!({"rules": [
        rule("header", json!({"matches": [{"headers": [{"name": "Version", "value": "one"}]}]})),
        rule("query", json!({"matches": [{"queryParams": [{"name": "animal", "value": "whale"}]}]})),
    ]}));
    assert_eq!(
        find(&routes, "GET", "h", "/", &[("version", "one")]).as_deref(),
        Some("header")
    );
    assert_eq!(
        find(&routes, "GET", "h", "/", &[("version", "One")]),
        None,
        "values are case-sensitive"
    );
    assert_eq!(
        get(&routes, "h", "/?animal=whale").as_deref(),
        Some("query")
    );
    assert_eq!(get(&routes, "h", "/?ANIMAL=whale"), None);
    assert_eq!(
        get(&routes, "h", "/?animal=whale&animal=dolphin").as_deref(),
        Some("query"),
        "first value counts"
    );
    assert_eq!(
        get(&routes, "h", "/?animal=wh%61le").as_deref(),
        Some("query"),
        "values are percent-decoded"
    );
}

#[test]
fn a_rule_without_matches_matches_everything_for_its_hosts() {
    let routes =
        compile_doc(json!({"rules": [rule("all", json!({"hostnames": ["a.example.com"]}))]}));
    assert_eq!(
        find(&routes, "DELETE", "a.example.com", "/any/path?x=1", &[]).as_deref(),
        Some("all")
    );
    assert_eq!(get(&routes, "b.example.com", "/"), None);
}

/// The contract's refusals (every case is in `cftunnel_config::valid`'s tests) reach the
/// proxy's compile with the rule's position and name, and the field from the document's root.
#[test]
fn invalid_documents_are_refused_with_the_rule_and_field_named() {
    let metrics = ProxyMetrics::register(&mut Default::default());
    let refuse = |doc: serde_json::Value| {
        let doc: cftunnel_config::Config = serde_json::from_value(doc).expect("parses");
        match compile(&doc, &metrics, &mut Cache::default()).expect_err("must be refused") {
            crate::ConfigError::Refused(r) => r,
            other => panic!("refused by the contract, not {other:?}"),
        }
    };
    let r = refuse(json!({"rules": [
        {"backends": []},
        {"name": "team/shop/1", "matches": [{"path": {"type": "RegularExpression", "value": "/\\w{500}"}}], "backends": []}
    ]}));
    assert_eq!((r.index, r.name.as_deref()), (1, Some("team/shop/1")));
    assert_eq!(r.field(), "rules[1].matches[0].path");
    assert!(
        r.to_string()
            .starts_with("rules[1].matches[0].path: regex does not compile"),
        "{r}"
    );
    let r = refuse(
        json!({"rules": [{"backends": [{"url": "https://x", "weight": 1, "tls": {"caBundle": "not pem"}}]}]}),
    );
    assert_eq!(r.field(), "rules[0].backends[0].tls.caBundle");
    assert_eq!(r.name, None);
    let r = refuse(
        json!({"rules": [{"backends": [{"url": "http://x", "weight": 1,
        "filters": [{"type": "RequestMirror", "requestMirror": {"backendUrl": "ftp://m"}}]}]}]}),
    );
    assert_eq!(
        r.field(),
        "rules[0].backends[0].filters[0].requestMirror.backendUrl"
    );
}

/// A pattern that takes much memory compiled is matched on its own, not in its host's
/// automaton, and still in its place in the precedence order among the patterns that are.
#[test]
fn a_costly_pattern_keeps_its_precedence_beside_a_hosts_automaton() {
    let path =
        |value: &str| json!({"matches": [{"path": {"type": "RegularExpression", "value": value}}]});
    let mut rules: Vec<_> = (0..20)
        .map(|i| rule(&format!("f{i}"), path(&format!("/f{i}/[a-z]+"))))
        .collect();
    rules.push(rule("early", path("/s/a[a-z]")));
    rules.push(rule("costly", path("/s/\\w{3,32}")));
    rules.push(rule("late", path("/s/[a-z]+")));
    rules.push(rule("costly-last", path("/t/\\w{3,32}")));
    let routes = compile_doc(json!({ "rules": rules }));
    let bucket = routes.table.bucket(0).expect("the host-less bucket");
    assert_eq!(
        bucket.regex_set_sizes(),
        Some((22, 2)),
        "matched together, alone"
    );

    assert_eq!(get(&routes, "h", "/s/ab").as_deref(), Some("early"));
    assert_eq!(get(&routes, "h", "/s/abc").as_deref(), Some("costly"));
    assert_eq!(get(&routes, "h", "/s/日本語").as_deref(), Some("costly"));
    assert_eq!(get(&routes, "h", "/s/a").as_deref(), Some("late"));
    assert_eq!(get(&routes, "h", "/t/abc").as_deref(), Some("costly-last"));
    assert_eq!(get(&routes, "h", "/f7/x").as_deref(), Some("f7"));
    assert_eq!(get(&routes, "h", "/t/a"), None);
}

/// The automatons of a table's hosts together take a bounded amount: past it, hosts match
/// their patterns one at a time, and route as they would through an automaton.
#[test]
fn hosts_past_the_automatons_bound_match_one_pattern_at_a_time() {
    // Each host has 16 patterns of its own, of about 50 KiB each (below the size at which a
    // pattern is matched alone), so each host's automaton takes a few MiB. (Hosts with the
    // same patterns share one automaton.)
    let rules: Vec<_> = (0..12)
        .flat_map(|h| {
            (0..16).map(move |i| {
                json!({"name": format!("h{h}-{i}"), "hostnames": [format!("h{h}.example")],
                       "matches": [{"path": {"type": "RegularExpression", "value": format!("/h{h}/p{i}/\\w{{3}}")}}],
                       "backends": []})
            })
        })
        .collect();
    let routes = compile_doc(json!({ "rules": rules }));
    let sets: Vec<_> = (0..12)
        .map(|h| {
            let bucket = routes
                .table
                .buckets()
                .find(|b| *b.pattern == format!("h{h}.example"))
                .expect("a bucket per host");
            bucket.regex_set_sizes()
        })
        .collect();
    assert_eq!(sets[0], Some((16, 0)), "the first hosts have an automaton");
    assert_eq!(
        sets[11], None,
        "the last ones match one pattern at a time: {sets:?}"
    );
    for h in [0, 11] {
        let host = format!("h{h}.example");
        assert_eq!(
            get(&routes, &host, &format!("/h{h}/p3/abc")),
            Some(format!("h{h}-3"))
        );
        assert_eq!(get(&routes, &host, &format!("/h{h}/p3/ab")), None);
    }
}

/// A host's automaton takes its patterns in precedence order while they take little enough
/// together; the rest are matched one at a time, and every one still routes.
#[test]
fn a_hosts_automaton_takes_patterns_up_to_a_bound_and_the_rest_match_alone() {
    // About 50 KiB each: 50 of them take 2.5 MiB.
    let rules: Vec<_> = (0..50)
        .map(|i| {
            rule(
                &format!("p{i}"),
                json!({"matches": [{"path": {"type": "RegularExpression", "value": format!("/p{i:02}/\\w{{3}}")}}]}),
            )
        })
        .collect();
    let routes = compile_doc(json!({ "rules": rules }));
    let bucket = routes.table.bucket(0).expect("the host-less bucket");
    let (together, alone) = bucket.regex_set_sizes().expect("an automaton");
    assert_eq!(together + alone, 50);
    assert!((16..50).contains(&together), "{together} together");
    for i in [0, together - 1, together, 49] {
        let path = format!("/p{i:02}/abc");
        assert_eq!(get(&routes, "h", &path), Some(format!("p{i}")), "{path}");
    }
    assert_eq!(get(&routes, "h", "/p49/ab"), None);
}
