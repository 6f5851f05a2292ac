//! Fixtures for the benchmarks: synthetic config documents of a given size for the proxy, and a
//! synthetic cluster ([`cluster`]) for the controller.

pub mod cluster;

use cftunnel_config::Config;
use serde_json::json;

/// A document of `n` rules mixing exact hosts (half), wildcard hosts (a quarter) and
/// host-less rules (a quarter), with exact and prefix paths and one regex path in ten, and a
/// header match on one rule in five, as a large cluster produces.
pub fn config(n: usize) -> Config {
    let rules: Vec<_> = (0..n)
        .map(|i| {
            let path = match kind(i) {
                PathKind::Regex => json!({"type": "RegularExpression", "value": format!("/re{i}/[a-z]+/[0-9]+")}),
                PathKind::Exact => json!({"type": "Exact", "value": format!("/svc{i}/exact")}),
                PathKind::Prefix => json!({"type": "PathPrefix", "value": format!("/svc{i}")}),
            };
            let mut m = json!({"path": path});
            if i % 5 == 1 {
                m["headers"] = json!([{"name": "x-version", "value": "v2"}]);
            }
            json!({
                "name": format!("ns/route{i}/0"),
                "hostnames": hostnames(i),
                "matches": [m],
                "backends": [{"url": format!("http://10.{}.{}.{}:8080", (i >> 16) & 255, (i >> 8) & 255, i & 255), "weight": 1}]
            })
        })
        .collect();
    serde_json::from_value(json!({"version": 1, "rules": rules})).unwrap_or_default()
}

enum PathKind {
    Exact,
    Prefix,
    Regex,
}

/// Path kinds cycle independently of host kinds (every fourth rule), so each host kind has
/// every path kind.
fn kind(i: usize) -> PathKind {
    let j = i / 4;
    match (j % 10, j % 2) {
        (9, _) => PathKind::Regex,
        (_, 0) => PathKind::Exact,
        _ => PathKind::Prefix,
    }
}

fn hostnames(i: usize) -> serde_json::Value {
    match i % 4 {
        0 | 1 => json!([format!("app{i}.example.com")]),
        2 => json!([format!("*.team{i}.example.com")]),
        _ => json!([]),
    }
}

/// Requests against the last matching rules of the document, one per host kind, each sent
/// with `x-version: v2` so header-matching rules qualify too: `(host, path)`. The last one
/// matches nothing and is answered 404 after searching the exact, wildcard and host-less
/// rules (regexes included), the most work a lookup can do.
pub fn probes(n: usize) -> Vec<(String, String)> {
    let last = |f: &dyn Fn(usize) -> bool| (0..n).rev().find(|&i| f(i)).unwrap_or(0);
    let exact = last(&|i| i % 4 < 2 && matches!(kind(i), PathKind::Exact));
    let wild = last(&|i| i % 4 == 2 && matches!(kind(i), PathKind::Prefix));
    let any = last(&|i| i % 4 == 3 && matches!(kind(i), PathKind::Prefix));
    vec![
        (
            format!("app{exact}.example.com"),
            format!("/svc{exact}/exact"),
        ),
        (
            format!("x.team{wild}.example.com"),
            format!("/svc{wild}/deep/path/here"),
        ),
        ("unknown.example.org".to_owned(), format!("/svc{any}/deep")),
        (
            "a.b.unknown.example.org".to_owned(),
            "/no/such/path".to_owned(),
        ),
    ]
}
