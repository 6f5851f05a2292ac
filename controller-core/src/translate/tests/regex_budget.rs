//! What a plane's regexes take ([`Output::costs`]): weighed per plane as a proxy counts them,
//! with the controller's own rules (a listener's isolation rule), and rules the caller added,
//! never among those left out.

use super::*;
use cftunnel_config::valid::{self, Pattern, PATTERN_BUDGET};

/// About half a megabyte compiled each: Unicode word characters, repeated.
fn costly(i: usize) -> String {
    format!("/a{i:03}/\\\\w{{3,32}}")
}

#[test]
fn a_plane_past_the_budget_loses_route_rules_and_keeps_its_isolation_rules() {
    let mut spent = 0;
    let fit = (0..)
        .take_while(|&i| {
            let source = costly(i).replace("\\\\", "\\");
            spent += Pattern::new(&source).expect("compiles").cost();
            spent <= PATTERN_BUDGET
        })
        .count();
    let mut manifests = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
# Older than the base Gateway gw: this one keeps its listener for any host over gw's.
metadata: {name: iso, namespace: infra, creationTimestamp: "2020-01-01T00:00:00Z"}
spec:
  gatewayClassName: cf
  listeners:
  - {name: any, port: 80, protocol: HTTP}
  - {name: abc, port: 80, protocol: HTTP, hostname: abc.example.com}
---
"#
    .to_owned();
    for i in 0..=fit {
        manifests.push_str(&http_route(
            "infra",
            &format!("r{i}"),
            &format!(
                "  parentRefs: [{{name: iso, sectionName: any}}]\n  rules:\n  - matches: [{{path: {{type: RegularExpression, value: \"{}\"}}}}]\n    backendRefs: [{{name: v2, port: 8080}}]",
                costly(i)
            ),
        ));
    }
    let out = run(&manifests);
    let doc = shared(&out);
    let owners = &out.owners[&PlaneKey::Shared];
    let isolation: Vec<usize> = (0..doc.rules.len())
        .filter(|&i| owners[i].is_none())
        .collect();
    assert!(!isolation.is_empty(), "the listener abc's isolation rule");
    let costs = out.costs(&PlaneKey::Shared, &mut valid::Cache::default());
    let all: Vec<usize> = (0..doc.rules.len()).collect();
    assert!(costs.total(&all) > PATTERN_BUDGET);

    // Even as rules naming a regex no proxy holds yet, which go first, the isolation rules
    // stay.
    let cut = costs.cut(&all, |i| owners[i].is_some());
    assert!(!cut.is_empty());
    assert!(cut.iter().all(|(i, _)| owners[*i].is_some()), "{cut:?}");
    let kept = Config {
        rules: (0..doc.rules.len())
            .filter(|i| !cut.iter().any(|(at, _)| at == i))
            .map(|i| doc.rules[i].clone())
            .collect(),
        ..Config::default()
    };
    assert!(kept.rules.len() < doc.rules.len());
    valid::document(&kept, &mut valid::Cache::default()).expect("a proxy takes what is left");

    // A plane whose rules name no regex past the controller's own weighs nothing.
    let out = run(&http_route(
        "infra",
        "plain",
        "  parentRefs: [{name: gw}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
    ));
    let costs = out.costs(&PlaneKey::Shared, &mut valid::Cache::default());
    assert!(costs.is_empty(), "{costs:?}");
}
