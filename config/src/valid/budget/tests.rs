use super::super::{check, document, rule, Cache, Pattern, PATTERN_BUDGET};
use crate::Config;
use serde_json::json;

/// A pattern that takes about half a megabyte compiled: Unicode word characters, repeated.
/// Each `i` below 1,000 gives another pattern of the same size.
fn costly(i: usize) -> String {
    format!("/a{i:03}/\\w{{3,32}}")
}

fn cost(source: &str) -> usize {
    Pattern::new(source).expect("compiles").cost()
}

fn path_rule(source: &str) -> serde_json::Value {
    json!({"matches": [{"path": {"type": "RegularExpression", "value": source}}], "backends": []})
}

fn doc(rules: Vec<serde_json::Value>) -> Config {
    serde_json::from_value(json!({ "rules": rules })).expect("the document parses")
}

/// How many of `costly(0)`, `costly(1)`, ... fit in the budget together.
fn fitting() -> usize {
    let mut spent = 0;
    (0..)
        .take_while(|&i| {
            spent += cost(&costly(i));
            spent <= PATTERN_BUDGET
        })
        .count()
}

#[test]
fn a_document_past_the_budget_is_refused_at_the_pattern_that_takes_it_there() {
    let n = fitting();
    assert!(
        (8..200).contains(&n),
        "a costly pattern is a small part of the budget: {n} fit"
    );
    let fits = doc((0..n).map(|i| path_rule(&costly(i))).collect());
    assert!(document(&fits, &mut Cache::default()).is_ok());

    let mut rules: Vec<_> = (0..=n).map(|i| path_rule(&costly(i))).collect();
    rules.push(json!({"backends": []}));
    let err = document(&doc(rules), &mut Cache::default()).expect_err("past the budget");
    assert_eq!(err.index, n, "the rule whose pattern goes past it");
    assert_eq!(err.field(), format!("rules[{n}].matches[0].path"));
    let message = &err.invalid.message;
    assert!(
        message.contains("regexes counted before it")
            && message.contains(&format!("{} MiB", PATTERN_BUDGET >> 20)),
        "{message}"
    );
}

#[test]
fn header_and_query_patterns_count_and_are_named_at_their_value() {
    let n = fitting();
    let mut rules: Vec<_> = (0..n).map(|i| path_rule(&costly(i))).collect();
    rules.push(json!({"matches": [{
        "path": {"type": "RegularExpression", "value": "/x/[a-z]+"},
        "headers": [{"name": "a", "value": "1"}, {"name": "b", "type": "RegularExpression", "value": costly(n)}]
    }], "backends": []}));
    let err = document(&doc(rules.clone()), &mut Cache::default()).expect_err("past the budget");
    assert_eq!(
        err.field(),
        format!("rules[{n}].matches[0].headers[1].value")
    );

    rules.pop();
    rules.push(json!({"matches": [
        {"path": {"type": "PathPrefix", "value": "/"}},
        {"queryParams": [{"name": "q", "type": "RegularExpression", "value": costly(n)}]}
    ], "backends": []}));
    let err = document(&doc(rules), &mut Cache::default()).expect_err("past the budget");
    assert_eq!(
        err.field(),
        format!("rules[{n}].matches[1].queryParams[0].value")
    );
}

#[test]
fn a_pattern_named_again_counts_once() {
    let n = fitting();
    // Every costly pattern twice, in rules of their own and in one rule twice over.
    let mut rules: Vec<_> = (0..n).map(|i| path_rule(&costly(i))).collect();
    rules.extend((0..n).map(|i| path_rule(&costly(i))));
    rules.push(json!({"matches": [
        {"path": {"type": "RegularExpression", "value": costly(0)}},
        {"headers": [{"name": "a", "type": "RegularExpression", "value": costly(0)}]}
    ], "backends": []}));
    assert!(document(&doc(rules), &mut Cache::default()).is_ok());
}

#[test]
fn a_check_alone_counts_no_budget_a_built_document_does() {
    let n = fitting();
    let rules: Vec<_> = (0..=n).map(|i| path_rule(&costly(i))).collect();
    let config = doc(rules);
    document(&config, &mut Cache::default()).expect_err("past the budget");
    // The controller's checks span every plane's rules: the budget is the proxy's to count,
    // per document it builds.
    let mut cache = Cache::default();
    for r in &config.rules {
        check(r, &mut cache).expect("a check counts no budget");
    }
}

#[test]
fn a_refused_rule_counts_nothing_and_the_next_document_has_the_whole_budget() {
    let n = fitting();
    let config = doc((0..=n).map(|i| path_rule(&costly(i))).collect());
    let mut cache = Cache::default();
    // The rule past the budget is left out (as the controller does) and the rules after it,
    // which fit in what it did not take, pass.
    let cheap = doc(vec![path_rule("/b/[a-z]+")]);
    for r in &config.rules[..n] {
        rule(r, &mut cache).expect("fits");
    }
    assert!(rule(&config.rules[n], &mut cache).is_err());
    rule(&cheap.rules[0], &mut cache).expect("the refused rule took nothing");

    // Refused as a document, it leaves the cache counting from nothing.
    assert!(document(&config, &mut cache).is_err());
    cache.drop_used();
    let fits = doc((1..=n).map(|i| path_rule(&costly(i))).collect());
    document(&fits, &mut cache).expect("a refused document counts nothing");
    cache.keep_used();
    // The next document has the whole budget again, whatever the last one took.
    let other = doc((n..2 * n).map(|i| path_rule(&costly(i))).collect());
    document(&other, &mut cache).expect("a new document, a new budget");
}

#[test]
fn kept_patterns_count_against_the_budget() {
    let n = fitting();
    let held: Vec<Pattern> = (0..n)
        .map(|i| Pattern::new(&costly(i)).expect("compiles"))
        .collect();
    let mut cache = Cache::default();
    assert!(cache.keep_patterns(&held), "they fit");
    let rule_past = doc(vec![path_rule(&costly(n))]);
    let err = rule(&rule_past.rules[0], &mut cache).expect_err("past the budget");
    assert_eq!(err.field, "matches[0].path");

    let mut cache = Cache::default();
    rule(&rule_past.rules[0], &mut cache).expect("fits alone");
    assert!(!cache.keep_patterns(&held), "with it, they do not");
    // Nothing of them was counted: a rule of theirs alone still fits.
    let again = doc(vec![path_rule(&costly(1))]);
    rule(&again.rules[0], &mut cache).expect("nothing counted");
}

#[test]
fn the_synthetic_document_of_a_large_cluster_takes_a_small_part_of_the_budget() {
    // As the benchmarks' 10,000-rule document: 1,000 regexes of ASCII classes, and as
    // GRPCRoute method matches compile.
    let rules: Vec<_> = (0..1000)
        .map(|i| path_rule(&format!("/re{i}/[a-z]+/[0-9]+")))
        .chain((0..1000).map(|i| path_rule(&format!("/[^/]+/Method{i}"))))
        .collect();
    let config = doc(rules);
    document(&config, &mut Cache::default()).expect("fits");
    let total: usize = config
        .rules
        .iter()
        .map(|r| cost(&r.matches[0].path.as_ref().expect("a path").value))
        .sum();
    assert!(total < PATTERN_BUDGET / 4, "{total} bytes");
}

#[test]
fn a_built_rule_holds_built_matchers_and_a_check_builds_none() {
    let config = doc(vec![json!({"matches": [{
        "path": {"type": "RegularExpression", "value": "/a/\\w{3,32}"},
        "headers": [{"name": "a", "type": "RegularExpression", "value": "v[0-9]+"}]
    }], "backends": []})]);
    let mut cache = Cache::default();
    check(&config.rules[0], &mut cache).expect("passes");
    let checked = cache.pattern("/a/\\w{3,32}").expect("cached");
    assert!(!checked.is_built(), "a check builds no matcher");

    let built = rule(&config.rules[0], &mut cache).expect("passes");
    let patterns: Vec<_> = built.matches.iter().flat_map(|m| m.patterns()).collect();
    assert_eq!(patterns.len(), 2);
    assert!(patterns.iter().all(|p| p.is_built()), "{patterns:?}");
    assert!(checked.is_built(), "the cached pattern is the one built");
}

/// The matcher answers as the `regex` crate's engine does on the same anchored pattern.
#[test]
fn patterns_match_as_the_regex_engine_does() {
    use regex_automata::meta;
    let patterns = [
        "/v[0-9]+/.*",
        "/a/\\w{3,32}",
        "(?i)/Straße/[a-z]+",
        "/x/\\bword\\b.*",
        "\\b\\w+\\b",
        "",
        "a|ab|abc",
        "/[^/]+/Get",
        "(?-u:\\w)+é",
        "/api/v[12]/users/\\w{1,64}/[\\w.-]{1,64}",
        "[ab]*a[ab]{12}",
        ".*\\d$",
    ];
    let values = [
        "",
        "/",
        "/v1/",
        "/v12/x/y",
        "/a/ab",
        "/a/abc",
        "/a/日本語",
        "/a/ab-c",
        "/straße/x",
        "/STRASSE/x",
        "/STRAßE/xy",
        "/x/word",
        "/x/word é",
        "/x/wordé",
        "wörd",
        "ab",
        "abc",
        "/svc.Echo/Get",
        "/a/b/Get",
        "abcé",
        "éé",
        "/api/v1/users/bob/x.y",
        "/api/v3/users/b/c",
        "abababababababababababab",
        "aaaaaaaaaaaaaaaaaaaaaaab",
        "x7",
        "x\n7",
    ];
    for source in patterns {
        let pattern = Pattern::new(source).expect("compiles");
        let hir = super::super::anchored(source).expect("parses");
        let engine = meta::Regex::builder()
            .configure(super::super::engine())
            .build_from_hir(&hir)
            .expect("builds");
        for value in values {
            assert_eq!(
                pattern.is_match(value),
                engine.is_match(value),
                "{source:?} on {value:?}"
            );
        }
    }
}
