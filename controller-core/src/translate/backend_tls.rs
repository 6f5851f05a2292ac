//! BackendTLSPolicy (Gateway API `v1`): which policy covers a Service port, the TLS settings
//! it gives the proxy for it, and each policy's status towards the Gateways whose routes use
//! the ports it covers.
//!
//! Selection follows the spec's `targetRefs`: a policy targets a Service, or one of its ports
//! by name (`sectionName`). For a port, a policy naming that port is used before one naming
//! the whole Service (both are accepted). Among policies naming the same target, the oldest
//! wins, then the first by `{namespace}/{name}`; the others do not apply to it. A policy that
//! lost a target still applies to the targets it did not lose: its status says `Accepted=False`
//! (`Conflicted`) towards the Gateways whose routes use a target it lost, and is its own
//! towards the others, so each Gateway's entry says whether the policy is in force there.
//!
//! A policy that is not accepted for a reason of its own (no usable CA certificate, an invalid
//! hostname, an unsupported `wellKnownCACertificates`) still covers its targets, and their
//! backends fail closed (500): a request never goes out in plain text, or to a backend whose
//! certificate cannot be checked, because a policy asking for TLS is broken.
//!
//! `options` are implementation-specific and none is defined here: they are ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use cftunnel_config::{valid, BackendProtocol, BackendTls};
use gateway_api::backendtlspolicies::{
    BackendTlsPolicy, BackendTlsPolicyValidationSubjectAltNamesType,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use super::status::{Condition, ConditionType, ParentRef, PolicyAncestorStatus, Reason};
use super::{ObjectKey, Precedence};

/// The key of a CA certificate in a ConfigMap or Secret `caCertificateRefs` names.
pub(super) const CA_KEY: &str = "ca.crt";
/// The only `wellKnownCACertificates` set defined: the proxy's built-in web roots.
const WELL_KNOWN_SYSTEM: &str = "System";

/// A Service port as policies target it: namespace, Service, port name (`None`: unnamed).
pub(crate) type PortKey = (String, String, Option<String>);

/// A policy target: namespace, Service, and the port name of `sectionName` (`None`: the whole
/// Service).
type Target = (String, String, Option<String>);

/// What a policy says once its references are resolved.
#[derive(Debug, Clone)]
struct Judged {
    /// The settings its backends get; `None`: they fail closed.
    tls: Option<BackendTls>,
    accepted: Condition,
    resolved_refs: Condition,
    targets: Vec<Target>,
}

/// Every BackendTLSPolicy of a snapshot, judged, and the one covering each target.
#[derive(Debug, Default)]
pub(crate) struct Policies {
    judged: BTreeMap<ObjectKey, Judged>,
    winners: BTreeMap<Target, ObjectKey>,
    /// Policies that lost targets, with the policy that took each.
    conflicted: BTreeMap<ObjectKey, Vec<(Target, ObjectKey)>>,
}

/// What the policy covering a Service port gives it: TLS settings, or `None` when the policy
/// cannot be used and the port's backends fail closed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Covered<'p> {
    pub(super) tls: Option<&'p BackendTls>,
}

/// Lookups of the objects `caCertificateRefs` name.
pub(crate) struct CaSources<'a> {
    pub(crate) config_maps: &'a BTreeMap<(&'a str, &'a str), &'a ConfigMap>,
    pub(crate) secrets: &'a BTreeMap<(&'a str, &'a str), &'a Secret>,
}

impl Policies {
    pub(crate) fn new(policies: &[Arc<BackendTlsPolicy>], sources: &CaSources<'_>) -> Self {
        let mut ordered: Vec<(&BackendTlsPolicy, &str, &str)> = policies
            .iter()
            .map(Arc::as_ref)
            .filter_map(|p| {
                Some((
                    p,
                    p.metadata.namespace.as_deref()?,
                    p.metadata.name.as_deref()?,
                ))
            })
            .collect();
        ordered.sort_by(|a, b| {
            Precedence::new(a.0.metadata.creation_timestamp.as_ref(), a.1, a.2).cmp(
                &Precedence::new(b.0.metadata.creation_timestamp.as_ref(), b.1, b.2),
            )
        });
        let mut out = Self::default();
        for (policy, namespace, name) in ordered {
            let key = ObjectKey::new(namespace, name);
            let judged = judge(policy, namespace, sources);
            for target in &judged.targets {
                match out.winners.get(target) {
                    None => {
                        out.winners.insert(target.clone(), key.clone());
                    }
                    Some(winner) if *winner == key => {}
                    Some(winner) => {
                        out.conflicted
                            .entry(key.clone())
                            .or_default()
                            .push((target.clone(), winner.clone()));
                    }
                }
            }
            out.judged.insert(key, judged);
        }
        out
    }

    /// The policy covering port `port_name` of Service `namespace/service`: one naming the
    /// port, else one naming the whole Service.
    pub(super) fn covering(
        &self,
        namespace: &str,
        service: &str,
        port_name: Option<&str>,
    ) -> Option<Covered<'_>> {
        // Every backend of every rule asks: with no policy, no key is built to look up.
        if self.winners.is_empty() {
            return None;
        }
        let target = |section: Option<&str>| {
            (
                namespace.to_owned(),
                service.to_owned(),
                section.map(str::to_owned),
            )
        };
        let policy = port_name
            .and_then(|p| self.winners.get(&target(Some(p))))
            .or_else(|| self.winners.get(&target(None)))?;
        let judged = self.judged.get(policy)?;
        Some(Covered {
            tls: judged.tls.as_ref(),
        })
    }

    /// Each policy's ancestors: every Gateway in `users` of a Service port the policy targets,
    /// with its conditions (`Accepted`, `ResolvedRefs`, both computed from `generation`).
    /// Policies that apply to no Gateway of ours get an empty list.
    pub(super) fn statuses(
        &self,
        policies: &[Arc<BackendTlsPolicy>],
        users: &BTreeMap<PortKey, BTreeSet<ParentRef>>,
    ) -> BTreeMap<ObjectKey, Vec<PolicyAncestorStatus>> {
        let mut out = BTreeMap::new();
        for policy in policies {
            let (Some(namespace), Some(name)) = (
                policy.metadata.namespace.as_deref(),
                policy.metadata.name.as_deref(),
            ) else {
                continue;
            };
            let key = ObjectKey::new(namespace, name);
            let Some(judged) = self.judged.get(&key) else {
                continue;
            };
            let generation = policy.metadata.generation;
            let lost = self.conflicted.get(&key).map(Vec::as_slice).unwrap_or(&[]);
            // Each Gateway using a port the policy targets, with the first target it lost that
            // Gateway's routes use, if any.
            let mut ancestors: BTreeMap<ParentRef, Option<&(Target, ObjectKey)>> = BTreeMap::new();
            for (port, gateways) in users {
                let covers = |(ns, svc, section): &Target| {
                    *ns == port.0
                        && *svc == port.1
                        && section
                            .as_deref()
                            .is_none_or(|s| port.2.as_deref() == Some(s))
                };
                if !judged.targets.iter().any(covers) {
                    continue;
                }
                let lost_here = lost.iter().find(|(target, _)| covers(target));
                for gateway in gateways {
                    let entry = ancestors.entry(gateway.clone()).or_default();
                    *entry = entry.or(lost_here);
                }
            }
            let mut resolved_refs = judged.resolved_refs.clone();
            resolved_refs.observed_generation = generation;
            let mut accepted = judged.accepted.clone();
            accepted.observed_generation = generation;
            let conflicted = |(target, winner): &(Target, ObjectKey)| {
                Condition::new(
                    ConditionType::Accepted,
                    false,
                    Reason::Conflicted,
                    format!(
                        "{} is targeted by BackendTLSPolicy {winner} too, which takes precedence (older, or first by namespace/name)",
                        describe(target)
                    ),
                    generation,
                )
            };
            out.insert(
                key,
                ancestors
                    .into_iter()
                    .map(|(ancestor_ref, lost)| PolicyAncestorStatus {
                        ancestor_ref,
                        conditions: vec![
                            lost.map_or_else(|| accepted.clone(), conflicted),
                            resolved_refs.clone(),
                        ],
                    })
                    .collect(),
            );
        }
        out
    }
}

fn describe((namespace, service, section): &Target) -> String {
    match section {
        Some(port) => format!("port {port} of Service {namespace}/{service}"),
        None => format!("Service {namespace}/{service}"),
    }
}

/// Resolves a policy's references and checks its settings with the config contract.
fn judge(policy: &BackendTlsPolicy, namespace: &str, sources: &CaSources<'_>) -> Judged {
    let targets: Vec<Target> = policy
        .spec
        .target_refs
        .iter()
        .filter(|t| t.group.is_empty() && t.kind == "Service")
        .map(|t| (namespace.to_owned(), t.name.clone(), t.section_name.clone()))
        .collect();
    let v = &policy.spec.validation;
    let refs = v.ca_certificate_refs.iter().flatten().map(|r| CaRef {
        group: &r.group,
        kind: &r.kind,
        name: &r.name,
    });
    let cas = ca_certificates(
        "spec.validation.caCertificateRefs",
        refs,
        namespace,
        sources,
    );
    let resolved_refs = match cas.problems.first() {
        None => Condition::new(
            ConditionType::ResolvedRefs,
            true,
            Reason::ResolvedRefs,
            "",
            None,
        ),
        Some((reason, _)) => Condition::new(
            ConditionType::ResolvedRefs,
            false,
            *reason,
            cas.problems
                .iter()
                .map(|(_, m)| m.as_str())
                .collect::<Vec<_>>()
                .join("; "),
            None,
        ),
    };
    let refused = |reason: Reason, message: String| Judged {
        tls: None,
        accepted: Condition::new(ConditionType::Accepted, false, reason, message, None),
        resolved_refs: resolved_refs.clone(),
        targets: targets.clone(),
    };
    let has_refs = !v
        .ca_certificate_refs
        .as_deref()
        .unwrap_or_default()
        .is_empty();
    let well_known = v
        .well_known_ca_certificates
        .as_deref()
        .filter(|w| !w.is_empty());
    let ca_bundle = match (has_refs, well_known) {
        (true, Some(_)) => {
            return refused(
                Reason::Invalid,
                "spec.validation: only one of caCertificateRefs and wellKnownCACertificates may be set".to_owned(),
            )
        }
        (false, None) => {
            return refused(
                Reason::Invalid,
                "spec.validation: one of caCertificateRefs and wellKnownCACertificates must be set"
                    .to_owned(),
            )
        }
        (false, Some(WELL_KNOWN_SYSTEM)) => None,
        (false, Some(other)) => {
            return refused(
                Reason::Invalid,
                format!(
                    "spec.validation.wellKnownCACertificates: {other:?} is not supported (only {WELL_KNOWN_SYSTEM:?})"
                ),
            )
        }
        (true, None) if cas.bundle.is_empty() => {
            return refused(
                Reason::NoValidCACertificate,
                "no entry of spec.validation.caCertificateRefs can be used".to_owned(),
            )
        }
        (true, None) => Some(cas.bundle),
    };
    let subject_alt_names = v
        .subject_alt_names
        .iter()
        .flatten()
        .map(|san| match san.r#type {
            BackendTlsPolicyValidationSubjectAltNamesType::Hostname => san.hostname.as_deref(),
            BackendTlsPolicyValidationSubjectAltNamesType::Uri => san.uri.as_deref(),
        });
    let tls = match settings(
        "spec.validation",
        ca_bundle,
        Some(&v.hostname),
        subject_alt_names,
    ) {
        Ok(tls) => tls,
        Err(message) => return refused(Reason::Invalid, message),
    };
    Judged {
        tls: Some(tls),
        accepted: Condition::new(ConditionType::Accepted, true, Reason::Accepted, "", None),
        resolved_refs,
        targets,
    }
}

/// TLS settings from the fields of a `validation` (BackendTLSPolicy's, or an ExternalBackend's
/// `tls`), checked with the contract the proxy dials with: what it would refuse is refused
/// here, the field under `field` named. `subject_alt_names` are each entry's value of its
/// type (`None`: missing); without `hostname` the URL's host is the server name.
pub(super) fn settings<'v>(
    field: &str,
    ca_bundle: Option<String>,
    hostname: Option<&str>,
    subject_alt_names: impl IntoIterator<Item = Option<&'v str>>,
) -> Result<BackendTls, String> {
    let mut names = Vec::new();
    for (i, value) in subject_alt_names.into_iter().enumerate() {
        match value.filter(|v| !v.is_empty()) {
            Some(value) => names.push(value.to_owned()),
            None => {
                return Err(format!(
                    "{field}.subjectAltNames[{i}]: the value of its type is missing"
                ))
            }
        }
    }
    if let Some(hostname) = hostname {
        valid::exact_hostname(hostname, "TLS hostname")
            .map_err(|e| format!("{field}.hostname: {e}"))?;
    }
    let tls = BackendTls {
        ca_bundle,
        server_name: hostname.map(str::to_ascii_lowercase),
        subject_alt_names: names,
        client_certificate: None,
    };
    valid::Target::new(
        "https://policy.invalid",
        BackendProtocol::Http1,
        false,
        Some(&tls),
        false,
    )
    .map_err(|e| {
        let at = match e.field.as_str() {
            "tls.serverName" => format!("{field}.hostname"),
            f => f.replacen("tls", field, 1),
        };
        format!("{at}: {}", e.message)
    })?;
    Ok(tls)
}

/// One entry of a `caCertificateRefs` list.
#[derive(Debug, Clone, Copy)]
pub(super) struct CaRef<'r> {
    pub(super) group: &'r str,
    pub(super) kind: &'r str,
    pub(super) name: &'r str,
}

/// The usable CA certificates of a `caCertificateRefs` list (BackendTLSPolicy's, or an
/// ExternalBackend's), as one PEM bundle, and why the others cannot be used.
pub(super) struct CaCertificates {
    pub(super) bundle: String,
    pub(super) problems: Vec<(Reason, String)>,
}

/// Reads each ConfigMap or Secret of `namespace` that `refs` (the list at `field`) names, and
/// keeps the `ca.crt` the config contract reads as CA certificates.
pub(super) fn ca_certificates<'r>(
    field: &str,
    refs: impl IntoIterator<Item = CaRef<'r>>,
    namespace: &str,
    sources: &CaSources<'_>,
) -> CaCertificates {
    let mut out = CaCertificates {
        bundle: String::new(),
        problems: Vec::new(),
    };
    for (i, r) in refs.into_iter().enumerate() {
        let field = format!("{field}[{i}]");
        let pem = match (r.group, r.kind) {
            ("", "ConfigMap") => match sources.config_maps.get(&(namespace, r.name)) {
                None => Err(format!("ConfigMap {namespace}/{} not found", r.name)),
                Some(cm) => cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get(CA_KEY))
                    .cloned()
                    .ok_or_else(|| format!("ConfigMap {namespace}/{} has no key {CA_KEY}", r.name)),
            },
            ("", "Secret") => match sources.secrets.get(&(namespace, r.name)) {
                None => Err(format!("Secret {namespace}/{} not found", r.name)),
                Some(secret) => crate::render::secret_value(secret, CA_KEY)
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .ok_or_else(|| format!("Secret {namespace}/{} has no key {CA_KEY}", r.name)),
            },
            (group, kind) => {
                let group = if group.is_empty() { "core" } else { group };
                out.problems.push((
                    Reason::InvalidKind,
                    format!("{field}: unsupported kind {group}/{kind} (ConfigMap or Secret)"),
                ));
                continue;
            }
        };
        match pem.and_then(|pem| {
            valid::ca_bundle(&pem)
                .map(|_| pem)
                .map_err(|e| format!("{CA_KEY} of {}: {e}", r.name))
        }) {
            Ok(pem) => {
                out.bundle.push_str(pem.trim_end());
                out.bundle.push('\n');
            }
            Err(message) => out.problems.push((
                Reason::InvalidCACertificateRef,
                format!("{field}: {message}"),
            )),
        }
    }
    out
}
