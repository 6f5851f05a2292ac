use super::super::{check, document, rule, Cache, Costs, Pattern, PATTERN_BUDGET};
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
    // What the rules before it take moves with them: the reason says only the rule's own.
    assert!(
        message.starts_with(&format!(
            "regex takes {} compiled",
            super::size(cost(&costly(n)))
        )) && message.contains(&format!("more than the {} MiB", PATTERN_BUDGET >> 20))
            && !message.contains("before it"),
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

/// The document of `config`'s rules at `kept`.
fn only(config: &Config, kept: &[usize]) -> Config {
    Config {
        rules: kept.iter().map(|&i| config.rules[i].clone()).collect(),
        ..Config::default()
    }
}

/// Every position of `config` but those `cut` leaves out.
fn kept_after(config: &Config, cut: &[(usize, super::Invalid)]) -> Vec<usize> {
    (0..config.rules.len())
        .filter(|i| !cut.iter().any(|(at, _)| at == i))
        .collect()
}

#[test]
fn a_cut_leaves_out_the_rules_not_served_yet_and_the_proxy_takes_the_rest() {
    let n = fitting();
    // The rule no proxy holds the regex of comes first in the document: a proxy counting in
    // document order would refuse the last, serving, one.
    let mut rules = vec![path_rule(&costly(n))];
    rules.extend((0..n).map(|i| path_rule(&costly(i))));
    rules.push(json!({"backends": []}));
    let config = doc(rules);
    let all: Vec<usize> = (0..config.rules.len()).collect();
    let mut cache = Cache::default();
    for r in &config.rules {
        check(r, &mut cache).expect("passes");
    }
    let costs = Costs::of(&config.rules, &mut cache, |_| true);
    assert!(costs.total(&all) > PATTERN_BUDGET);
    let refused = document(&config, &mut Cache::default()).expect_err("past the budget");
    assert_eq!(refused.index, n, "a proxy refuses the rule that crosses it");

    let cut = costs.cut(&all, |i| i != 0);
    let at: Vec<usize> = cut.iter().map(|(i, _)| *i).collect();
    assert_eq!(at, [0], "the rule not served yet goes, alone");
    let (_, why) = &cut[0];
    assert_eq!(why.field, "matches[0].path");
    assert!(
        why.message
            .contains(&format!("{} MiB", PATTERN_BUDGET >> 20))
            && why
                .message
                .contains("rules naming a regex the proxies do not hold yet go first"),
        "{}",
        why.message
    );
    let rest = only(&config, &kept_after(&config, &cut));
    document(&rest, &mut Cache::default()).expect("a proxy takes what is left");
    assert!(costs.total(&kept_after(&config, &cut)) <= PATTERN_BUDGET);

    // A rule the document cannot do without stays, and a served one goes in its place.
    let fixed = Costs::of(&config.rules, &mut cache, |i| i != 0);
    let cut = fixed.cut(&all, |i| i != 0);
    assert!(
        !cut.is_empty() && cut.iter().all(|&(i, _)| i != 0),
        "{cut:?}"
    );
    let rest = only(&config, &kept_after(&config, &cut));
    document(&rest, &mut Cache::default()).expect("a proxy takes what is left");
}

/// A rule left out is told why in words that are its own: what another rule of the document
/// (another tenant's) adds or takes away does not change them.
#[test]
fn a_cut_rules_reason_does_not_move_with_the_other_rules() {
    let n = fitting();
    let served: Vec<_> = (0..n).map(|i| path_rule(&costly(i))).collect();
    let reason = |new: &[usize]| {
        let mut rules: Vec<_> = new.iter().map(|&i| path_rule(&costly(i))).collect();
        rules.extend(served.iter().cloned());
        let config = doc(rules);
        let all: Vec<usize> = (0..config.rules.len()).collect();
        let costs = Costs::of(&config.rules, &mut Cache::default(), |_| true);
        let cut = costs.cut(&all, |i| i >= new.len());
        let at: Vec<usize> = cut.iter().map(|(i, _)| *i).collect();
        assert_eq!(at, (0..new.len()).collect::<Vec<_>>(), "the new rules go");
        cut[0].1.message.clone()
    };
    // Another new rule beside it makes the document's regexes take more.
    assert_eq!(reason(&[n]), reason(&[n, n + 1]));
}

#[test]
fn among_served_rules_the_costliest_go_first() {
    let n = fitting();
    // A pattern four times a costly one's, served like the rest.
    let big = "/big/\\w{3,32}/\\w{3,32}/\\w{3,32}/\\w{3,32}";
    assert!(cost(big) > 3 * cost(&costly(0)), "{} bytes", cost(big));
    let mut rules: Vec<_> = (0..n).map(|i| path_rule(&costly(i))).collect();
    rules.insert(n / 2, path_rule(big));
    let config = doc(rules);
    let all: Vec<usize> = (0..config.rules.len()).collect();
    let costs = Costs::of(&config.rules, &mut Cache::default(), |_| true);
    let cut = costs.cut(&all, |_| true);
    let at: Vec<usize> = cut.iter().map(|(i, _)| *i).collect();
    assert_eq!(at, [n / 2], "the costliest rule, which frees enough alone");
    let rest = only(&config, &kept_after(&config, &cut));
    document(&rest, &mut Cache::default()).expect("a proxy takes what is left");
}

#[test]
fn a_rule_whose_patterns_others_name_stays_while_another_frees_enough() {
    let n = fitting();
    // Served: the first n - 1 costly patterns. Not served yet: one rule naming costly(n), and
    // two later ones naming costly(n - 1) both, which together fit with the served ones.
    let mut rules: Vec<_> = (0..n - 1).map(|i| path_rule(&costly(i))).collect();
    let single = rules.len();
    rules.push(path_rule(&costly(n)));
    rules.push(path_rule(&costly(n - 1)));
    rules.push(json!({"matches": [
        {"path": {"type": "PathPrefix", "value": "/p"}, "headers": [{"name": "a", "type": "RegularExpression", "value": costly(n - 1)}]}
    ], "backends": []}));
    let config = doc(rules);
    let all: Vec<usize> = (0..config.rules.len()).collect();
    let costs = Costs::of(&config.rules, &mut Cache::default(), |_| true);
    let cut = costs.cut(&all, |i| i < single);
    let at: Vec<usize> = cut.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        at,
        [single],
        "the two sharing a pattern would each free nothing"
    );
    let rest = only(&config, &kept_after(&config, &cut));
    document(&rest, &mut Cache::default()).expect("a proxy takes what is left");
}

#[test]
fn new_rules_sharing_a_pattern_go_together_before_any_served_one() {
    let n = fitting();
    // Served: costly(0..n). Not served yet: two rules naming costly(n) both (one route rule
    // placed for two hostnames), neither of which frees anything alone.
    let mut rules: Vec<_> = (0..n).map(|i| path_rule(&costly(i))).collect();
    rules.push(path_rule(&costly(n)));
    rules.push(json!({"hostnames": ["b.example.com"],
        "matches": [{"path": {"type": "RegularExpression", "value": costly(n)}}], "backends": []}));
    let config = doc(rules);
    let all: Vec<usize> = (0..config.rules.len()).collect();
    let costs = Costs::of(&config.rules, &mut Cache::default(), |_| true);
    let cut = costs.cut(&all, |i| i < n);
    let at: Vec<usize> = cut.iter().map(|(i, _)| *i).collect();
    assert_eq!(at, [n, n + 1]);
    document(
        &only(&config, &kept_after(&config, &cut)),
        &mut Cache::default(),
    )
    .expect("a proxy takes what is left");
}

#[test]
fn the_rule_whose_going_frees_most_goes_and_no_more() {
    let big = "/big/\\w{3,32}/\\w{3,32}/\\w{3,32}/\\w{3,32}";
    // All served. Two rules name `big`; one of them a small pattern besides, which makes it
    // the costliest rule, though its going frees only the small pattern. Costly rules beside
    // them just past the budget, so that one of those going is enough.
    let mut spent = cost(big) + cost("[a-z]+");
    let k = (0..)
        .take_while(|&i| {
            spent += cost(&costly(i));
            spent <= PATTERN_BUDGET
        })
        .count()
        + 1;
    let n = k + 4;
    let mut rules: Vec<_> = (0..n - 4).map(|i| path_rule(&costly(i))).collect();
    rules.push(json!({"matches": [
        {"path": {"type": "RegularExpression", "value": big}},
        {"headers": [{"name": "a", "type": "RegularExpression", "value": "[a-z]+"}]}
    ], "backends": []}));
    rules.push(path_rule(big));
    let config = doc(rules);
    let all: Vec<usize> = (0..config.rules.len()).collect();
    let costs = Costs::of(&config.rules, &mut Cache::default(), |_| true);
    assert!(costs.total(&all) > PATTERN_BUDGET, "the case needs it over");
    let cut = costs.cut(&all, |_| true);
    assert_eq!(cut.len(), 1, "one costly rule is enough: {cut:?}");
    assert!(cut[0].0 < n - 4, "not one naming `big`: {cut:?}");
    document(
        &only(&config, &kept_after(&config, &cut)),
        &mut Cache::default(),
    )
    .expect("a proxy takes what is left");
}

#[test]
fn costs_count_what_a_proxy_counts() {
    let n = fitting();
    // Repeated patterns, a header named twice (the second is not matched, so not counted),
    // a rule that fails its checks, and a pattern in a rule left out of the count.
    let mut rules: Vec<_> = (0..n).map(|i| path_rule(&costly(i))).collect();
    rules.push(json!({"matches": [
        {"path": {"type": "RegularExpression", "value": costly(0)}},
        {"headers": [
            {"name": "a", "type": "RegularExpression", "value": costly(1)},
            {"name": "A", "type": "RegularExpression", "value": costly(n + 1)}
        ]}
    ], "backends": []}));
    rules.push(
        json!({"matches": [{"path": {"type": "RegularExpression", "value": costly(n + 2)}}],
        "backends": [{"url": "not a url"}]}),
    );
    let config = doc(rules);
    let all: Vec<usize> = (0..config.rules.len()).collect();
    let costs = Costs::of(&config.rules, &mut Cache::default(), |_| true);
    let expected: usize = (0..n).map(|i| cost(&costly(i))).sum();
    assert_eq!(costs.total(&all), expected);
    assert!(costs.cut(&all, |_| false).is_empty(), "it fits");
    assert_eq!(costs.total(&all[1..]), expected, "costly(0) is named again");
    assert_eq!(costs.total(&[0, 2]), cost(&costly(0)) + cost(&costly(2)));
    // Past the budget only with patterns no check reaches: weighed, and nothing goes.
    let over: usize = (0..=n + 2).map(|i| cost(&costly(i))).sum();
    assert!(over > PATTERN_BUDGET && !costs.is_empty());

    // Well within it: not weighed at all.
    let plain = doc(vec![json!({"backends": []}), path_rule("/[a-z]+")]);
    let costs = Costs::of(&plain.rules, &mut Cache::default(), |_| true);
    assert!(costs.is_empty() && costs.cut(&[0, 1], |_| false).is_empty());
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
