use std::collections::BTreeMap;

use super::*;

fn crd(name: &str, version: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        annotations: version.map(|v| {
            BTreeMap::from([
                (BUNDLE_VERSION_ANNOTATION.to_owned(), v.to_owned()),
                (
                    "gateway.networking.k8s.io/channel".to_owned(),
                    "standard".to_owned(),
                ),
            ])
        }),
        ..ObjectMeta::default()
    }
}

/// The five CRDs the controller reads, all at `version`.
fn install(version: &str) -> Vec<ObjectMeta> {
    [
        "gatewayclasses",
        "gateways",
        "grpcroutes",
        "httproutes",
        "referencegrants",
    ]
    .iter()
    .map(|plural| {
        crd(
            &format!("{plural}.gateway.networking.k8s.io"),
            Some(version),
        )
    })
    .collect()
}

/// [`check`] of CRDs that could be read: `crds`.
fn listed(crds: &[ObjectMeta]) -> CrdVersions {
    check(&Some(crds.to_vec()))
}

fn versions(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|v| (*v).to_owned()).collect()
}

#[test]
fn crds_of_a_supported_release_are_supported() {
    for version in ["v1.5.0", "v1.5.1", "v1.6.0", "v1.6.1", "v1.6.0-rc.1"] {
        assert_eq!(
            listed(&install(version)),
            CrdVersions::Supported(versions(&[version])),
            "{version}"
        );
    }
    let condition = listed(&install("v1.6.1")).condition(Some(3));
    assert_eq!(
        (
            condition.kind,
            condition.status,
            condition.reason,
            condition.observed_generation
        ),
        (
            ConditionType::SupportedVersion,
            true,
            Reason::SupportedVersion,
            Some(3)
        )
    );
    assert_eq!(
        condition.message,
        "Gateway API CRDs at bundle version v1.6.1 (supported: v1.5.x to v1.6.x)"
    );
}

#[test]
fn crds_of_two_supported_releases_are_supported_and_both_named() {
    let mut crds = install("v1.6.1");
    crds[0] = crd("gatewayclasses.gateway.networking.k8s.io", Some("v1.5.1"));
    assert_eq!(
        listed(&crds),
        CrdVersions::Supported(versions(&["v1.5.1", "v1.6.1"]))
    );
    assert_eq!(
        listed(&crds).condition(None).message,
        "Gateway API CRDs at bundle versions v1.5.1, v1.6.1 (supported: v1.5.x to v1.6.x)"
    );
}

#[test]
fn a_newer_minor_an_older_minor_and_another_major_are_unsupported() {
    for version in [
        "v1.7.0",
        "v1.4.1",
        "v1.1.0",
        "v2.0.0",
        "v2.6.1",
        "v0.6.0",
        "v0.0.0-dev",
    ] {
        let mut crds = install("v1.6.1");
        crds[1] = crd("gateways.gateway.networking.k8s.io", Some(version));
        assert_eq!(
            listed(&crds),
            CrdVersions::Unsupported(vec![VersionProblem::Unsupported {
                crd: "gateways.gateway.networking.k8s.io".to_owned(),
                version: version.to_owned(),
            }]),
            "{version}"
        );
    }
    let mut crds = install("v1.6.1");
    crds[1] = crd("gateways.gateway.networking.k8s.io", Some("v1.7.0"));
    let condition = listed(&crds).condition(Some(1));
    assert_eq!(
        (condition.status, condition.reason),
        (false, Reason::UnsupportedVersion)
    );
    assert_eq!(
        condition.message,
        "served on a best-effort basis: gateways.gateway.networking.k8s.io has bundle version \
         v1.7.0 (supported: v1.5.x to v1.6.x)"
    );
}

#[test]
fn a_crd_without_the_annotation_is_unsupported() {
    let mut crds = install("v1.6.1");
    crds[3] = crd("httproutes.gateway.networking.k8s.io", None);
    assert_eq!(
        listed(&crds),
        CrdVersions::Unsupported(vec![VersionProblem::Missing {
            crd: "httproutes.gateway.networking.k8s.io".to_owned(),
        }])
    );
    assert!(listed(&crds).condition(None).message.contains(
        "httproutes.gateway.networking.k8s.io has no gateway.networking.k8s.io/bundle-version annotation"
    ));
}

#[test]
fn an_annotation_that_is_not_a_version_is_unsupported() {
    for value in [
        "1.6.1",
        "v1.6",
        "v1.6.x",
        "v1.6.1.2",
        "v+1.6.1",
        "v1.6.1-",
        "v1.6.1+meta",
        "latest",
        "",
    ] {
        assert_eq!(BundleVersion::parse(value), None, "{value:?}");
        let mut crds = install("v1.6.1");
        crds[4] = crd("referencegrants.gateway.networking.k8s.io", Some(value));
        assert_eq!(
            listed(&crds),
            CrdVersions::Unsupported(vec![VersionProblem::Unparsable {
                crd: "referencegrants.gateway.networking.k8s.io".to_owned(),
                value: value.to_owned(),
            }]),
            "{value:?}"
        );
    }
}

#[test]
fn every_offending_crd_is_named_in_name_order() {
    let mut crds = install("v1.6.1");
    crds[4] = crd("referencegrants.gateway.networking.k8s.io", Some("v2.0.0"));
    crds[0] = crd("gatewayclasses.gateway.networking.k8s.io", None);
    let message = listed(&crds).condition(None).message;
    assert_eq!(
        message,
        "served on a best-effort basis: gatewayclasses.gateway.networking.k8s.io has no \
         gateway.networking.k8s.io/bundle-version annotation; \
         referencegrants.gateway.networking.k8s.io has bundle version v2.0.0 \
         (supported: v1.5.x to v1.6.x)"
    );
}

#[test]
fn crds_of_other_groups_are_not_read() {
    let others = [
        crd("gatewayconfigs.cf.k8s.lex.la", None),
        crd("xlistenersets.gateway.networking.x-k8s.io", Some("v9.9.9")),
        crd("widgets.example.gateway.networking.k8s.io", None),
        crd("gateway.networking.k8s.io", None),
    ];
    let mut crds = install("v1.6.1");
    crds.extend(others.iter().cloned());
    assert_eq!(listed(&crds), CrdVersions::Supported(versions(&["v1.6.1"])));
    assert_eq!(listed(&others), CrdVersions::Unknown);
}

#[test]
fn no_gateway_api_crd_at_all_is_not_known_to_be_supported() {
    assert_eq!(listed(&[]), CrdVersions::Unknown);
    let condition = CrdVersions::Unknown.condition(Some(1));
    assert_eq!(
        (condition.status, condition.reason),
        (false, Reason::UnsupportedVersion)
    );
    assert!(
        condition
            .message
            .starts_with("no Gateway API CustomResourceDefinition is known"),
        "{}",
        condition.message
    );
}

#[test]
fn crds_that_cannot_be_read_are_not_known_to_be_supported_and_the_message_says_what_it_takes() {
    assert_eq!(check(&None), CrdVersions::Unreadable);
    let condition = check(&None).condition(Some(2));
    assert_eq!(
        (
            condition.kind,
            condition.status,
            condition.reason,
            condition.observed_generation
        ),
        (
            ConditionType::SupportedVersion,
            false,
            Reason::UnsupportedVersion,
            Some(2)
        )
    );
    assert_eq!(
        condition.message,
        "the Gateway API CRD versions cannot be read: CustomResourceDefinitions are not listed \
         yet, and reading them takes list and watch on \
         customresourcedefinitions.apiextensions.k8s.io (supported: v1.5.x to v1.6.x)"
    );
    // Read but empty is another case, with its own message.
    assert_eq!(check(&Some(Vec::new())), CrdVersions::Unknown);
}
