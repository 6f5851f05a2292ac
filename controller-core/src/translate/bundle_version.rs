//! Whether the Gateway API CRDs in the cluster are a release this controller supports: the
//! GatewayClass condition `SupportedVersion`, read from each Gateway API CRD's
//! `gateway.networking.k8s.io/bundle-version` annotation.
//!
//! Gateway API lets an implementation either refuse a class over unsupported CRDs
//! (`Accepted=False`, `UnsupportedVersion`) or serve them on a best-effort basis
//! (`Accepted=True` with `SupportedVersion=False`). We take the best-effort option: CRDs of
//! another release mostly add or drop optional fields, which the translation reads as absent,
//! so refusing every Gateway over them would take down more than it protects.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::RangeInclusive;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::status::{Condition, ConditionType, Reason};
use super::GATEWAY_API_GROUP;

/// The annotation every Gateway API CRD carries, naming the release it comes from.
pub const BUNDLE_VERSION_ANNOTATION: &str = "gateway.networking.k8s.io/bundle-version";

/// The access reading the CRDs takes, as messages name it: the controller's CRD watch.
pub const CRD_ACCESS: &str = "list and watch on customresourcedefinitions.apiextensions.k8s.io";

/// The major Gateway API release whose CRDs we support: with [`SUPPORTED_MINORS`], releases
/// v1.5 to v1.6 (any patch release, and their pre-releases such as `v1.5.0-rc.1`).
///
/// * From v1.5: the controller reads every kind at the version of the `gateway-api` crate's
///   types, ReferenceGrant at `v1` included, which the CRDs serve from v1.5.0 on. Older
///   bundles from v1.1 (which brought GRPCRoute `v1`) still work, unsupported: they serve
///   ReferenceGrant as `v1beta1` only, whose spec is the same, and the controller finds that
///   out through API discovery and reads it there (`runtime::stores`).
/// * To v1.6: the newest release the repository is built and tested against. The
///   `gateway-api` crate 0.22 is generated from v1.5.1, and the conformance replay's cases are
///   those of v1.6.1 (plus four of main's).
pub const SUPPORTED_MAJOR: u64 = 1;
/// The minor releases of [`SUPPORTED_MAJOR`] whose CRDs we support (see there).
pub const SUPPORTED_MINORS: RangeInclusive<u64> = 5..=6;

/// Whether a CustomResourceDefinition named `name` is one of Gateway API's: CRDs are named
/// `<plural>.<group>`, and Gateway API's group is `gateway.networking.k8s.io`.
pub fn is_gateway_api_crd(name: &str) -> bool {
    name.strip_suffix(GATEWAY_API_GROUP)
        .and_then(|rest| rest.strip_suffix('.'))
        .is_some_and(|plural| !plural.is_empty() && !plural.contains('.'))
}

/// A bundle version: `vMAJOR.MINOR.PATCH`, optionally with a `-PRERELEASE` suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleVersion {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl BundleVersion {
    /// Parses an annotation value; `None` when it is not of the form above.
    pub fn parse(text: &str) -> Option<Self> {
        let release = text.strip_prefix('v')?;
        let (core, pre_release) = match release.split_once('-') {
            Some((core, pre)) => (core, Some(pre)),
            None => (release, None),
        };
        let pre_release_ok = pre_release.is_none_or(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        });
        if !pre_release_ok {
            return None;
        }
        // `u64::from_str` takes a leading `+`; a version number does not.
        let number = |s: &str| {
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        };
        let mut parts = core.split('.');
        let version = Self {
            major: number(parts.next()?)?,
            minor: number(parts.next()?)?,
            patch: number(parts.next()?)?,
        };
        parts.next().is_none().then_some(version)
    }

    /// Whether CRDs of this release are supported.
    pub fn is_supported(self) -> bool {
        self.major == SUPPORTED_MAJOR && SUPPORTED_MINORS.contains(&self.minor)
    }
}

/// The supported releases, as messages name them.
fn supported_releases() -> String {
    format!(
        "v{SUPPORTED_MAJOR}.{}.x to v{SUPPORTED_MAJOR}.{}.x",
        SUPPORTED_MINORS.start(),
        SUPPORTED_MINORS.end()
    )
}

/// Why one Gateway API CRD does not count as supported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionProblem {
    /// It has no bundle-version annotation.
    Missing { crd: String },
    /// Its annotation is not a version (see [`BundleVersion::parse`]).
    Unparsable { crd: String, value: String },
    /// Its version is outside the supported releases.
    Unsupported { crd: String, version: String },
}

impl fmt::Display for VersionProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing { crd } => {
                write!(f, "{crd} has no {BUNDLE_VERSION_ANNOTATION} annotation")
            }
            Self::Unparsable { crd, value } => {
                write!(
                    f,
                    "{crd} has bundle version {value:?}, which is not a version"
                )
            }
            Self::Unsupported { crd, version } => write!(f, "{crd} has bundle version {version}"),
        }
    }
}

/// What the Gateway API CRDs' bundle versions say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrdVersions {
    /// Every Gateway API CRD has a supported version; the versions seen.
    Supported(BTreeSet<String>),
    /// Some do not, in CRD name order.
    Unsupported(Vec<VersionProblem>),
    /// There is no Gateway API CRD to read. A cluster without them has no GatewayClass either
    /// (the GatewayClass CRD would be listed), so this is a snapshot without CRDs, such as the
    /// `translate` command's manifests when they leave them out: versions that cannot be read
    /// are not known to be supported, and count as unsupported.
    Unknown,
    /// The CRDs cannot be read (yet): the snapshot has none of their metadata, not even an
    /// empty list. In the runtime, the CRD watch has not listed them, because the controller
    /// lacks [`CRD_ACCESS`] (an older ClusterRole) or the list is slow; the runtime reconciles
    /// meanwhile. Not known to be supported either.
    Unreadable,
}

/// Reads the bundle versions of the Gateway API CRDs among `crds` (others are ignored);
/// `None` when the CRDs cannot be read (see [`crate::translate::Snapshot`]).
pub fn check(crds: &Option<Vec<ObjectMeta>>) -> CrdVersions {
    let Some(crds) = crds else {
        return CrdVersions::Unreadable;
    };
    let ours: BTreeMap<&str, Option<&str>> = crds
        .iter()
        .filter_map(|meta| {
            let name = meta.name.as_deref().filter(|n| is_gateway_api_crd(n))?;
            let version = meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(BUNDLE_VERSION_ANNOTATION))
                .map(String::as_str);
            Some((name, version))
        })
        .collect();
    if ours.is_empty() {
        return CrdVersions::Unknown;
    }
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    for (crd, value) in ours {
        let crd = crd.to_owned();
        match value.map(|v| (v, BundleVersion::parse(v))) {
            None => problems.push(VersionProblem::Missing { crd }),
            Some((value, None)) => problems.push(VersionProblem::Unparsable {
                crd,
                value: value.to_owned(),
            }),
            Some((value, Some(version))) if !version.is_supported() => {
                problems.push(VersionProblem::Unsupported {
                    crd,
                    version: value.to_owned(),
                });
            }
            Some((value, Some(_))) => {
                seen.insert(value.to_owned());
            }
        }
    }
    if problems.is_empty() {
        CrdVersions::Supported(seen)
    } else {
        CrdVersions::Unsupported(problems)
    }
}

impl CrdVersions {
    /// The `SupportedVersion` condition of a GatewayClass of `generation`. The message names
    /// the versions found and the supported ones, as the spec asks.
    pub fn condition(&self, generation: Option<i64>) -> Condition {
        let supported = supported_releases();
        let (status, reason, message) = match self {
            Self::Supported(versions) => (
                true,
                Reason::SupportedVersion,
                format!(
                    "Gateway API CRDs at bundle version{} {} (supported: {supported})",
                    if versions.len() > 1 { "s" } else { "" },
                    versions.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            ),
            Self::Unsupported(problems) => (
                false,
                Reason::UnsupportedVersion,
                format!(
                    "served on a best-effort basis: {} (supported: {supported})",
                    problems
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            ),
            Self::Unknown => (
                false,
                Reason::UnsupportedVersion,
                format!(
                    "no Gateway API CustomResourceDefinition is known, so their bundle versions cannot be checked (supported: {supported})"
                ),
            ),
            Self::Unreadable => (
                false,
                Reason::UnsupportedVersion,
                format!(
                    "the Gateway API CRD versions cannot be read: CustomResourceDefinitions are not listed yet, and reading them takes {CRD_ACCESS} (supported: {supported})"
                ),
            ),
        };
        Condition::new(
            ConditionType::SupportedVersion,
            status,
            reason,
            message,
            generation,
        )
    }
}

#[cfg(test)]
mod tests;
