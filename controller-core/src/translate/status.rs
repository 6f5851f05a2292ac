//! The status the translation computes for every object it owns: condition types and reasons
//! follow the Gateway API spec (`gateway.networking.k8s.io/v1`, "Conditions" of GatewayClass,
//! Gateway, listeners and route parents).

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::{ObjectKey, RouteKey};

/// A condition type from the Gateway API spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum ConditionType {
    Accepted,
    Programmed,
    ResolvedRefs,
    Conflicted,
    PartiallyInvalid,
    /// GatewayClass: whether the Gateway API CRDs in the cluster are a release we support.
    SupportedVersion,
    /// `cf.k8s.lex.la/TunnelShared`: the route's Gateway shares its tunnel with dedicated
    /// Gateways of other namespaces.
    TunnelShared,
    /// `cf.k8s.lex.la/RouteShadowed`: an older route serves some of the route's matches.
    RouteShadowed,
}

impl ConditionType {
    /// The spelling used in `status.conditions[].type`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "Accepted",
            Self::Programmed => "Programmed",
            Self::ResolvedRefs => "ResolvedRefs",
            Self::Conflicted => "Conflicted",
            Self::PartiallyInvalid => "PartiallyInvalid",
            Self::SupportedVersion => "SupportedVersion",
            Self::TunnelShared => "cf.k8s.lex.la/TunnelShared",
            Self::RouteShadowed => "cf.k8s.lex.la/RouteShadowed",
        }
    }
}

/// A condition reason from the Gateway API spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Reason {
    Accepted,
    Programmed,
    ResolvedRefs,
    Invalid,
    InvalidParameters,
    ListenersNotValid,
    /// `Programmed=False`: an address `spec.addresses` asks for is not the Gateway's.
    AddressNotAssigned,
    UnsupportedProtocol,
    InvalidRouteKinds,
    NoConflicts,
    /// A listener's hostname conflicts with another listener's (of its Gateway on its port, or,
    /// on the shared plane, of a Gateway before its own in precedence with the same scheme); on
    /// a route parent, the route lost a listener to a route of the other kind (HTTPRoute,
    /// GRPCRoute) with intersecting hostnames. The spec defines no route reason for that case.
    HostnameConflict,
    ProtocolConflict,
    NoMatchingParent,
    NotAllowedByListeners,
    NoMatchingListenerHostname,
    /// The route's namespace may not publish a hostname the route would serve (hostname
    /// ownership).
    HostnameNotPermitted,
    BackendNotFound,
    InvalidKind,
    RefNotPermitted,
    UnsupportedValue,
    SupportedVersion,
    UnsupportedVersion,
    TunnelShared,
    /// Gateway `ResolvedRefs`: `spec.tls.backend.clientCertificateRef` cannot be used.
    InvalidClientCertificateRef,
    /// Listener `ResolvedRefs`: a `tls.certificateRefs` entry cannot be used.
    InvalidCertificateRef,
    /// BackendTLSPolicy `ResolvedRefs`: a `caCertificateRefs` entry cannot be used.
    InvalidCACertificateRef,
    /// BackendTLSPolicy `Accepted`: no `caCertificateRefs` entry can be used.
    NoValidCACertificate,
    /// BackendTLSPolicy `Accepted`: another policy takes precedence for the same target.
    Conflicted,
    /// `cf.k8s.lex.la/RouteShadowed`: the older route matches first.
    OlderRouteMatches,
    /// ListenerSet `Accepted`: its parent Gateway's `allowedListeners` does not admit its
    /// namespace.
    NotAllowed,
    /// ListenerSet `Accepted`: its parent Gateway is not accepted.
    ParentNotAccepted,
}

impl Reason {
    /// The spelling used in `status.conditions[].reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "Accepted",
            Self::Programmed => "Programmed",
            Self::ResolvedRefs => "ResolvedRefs",
            Self::Invalid => "Invalid",
            Self::InvalidParameters => "InvalidParameters",
            Self::ListenersNotValid => "ListenersNotValid",
            Self::AddressNotAssigned => "AddressNotAssigned",
            Self::UnsupportedProtocol => "UnsupportedProtocol",
            Self::InvalidRouteKinds => "InvalidRouteKinds",
            Self::NoConflicts => "NoConflicts",
            Self::HostnameConflict => "HostnameConflict",
            Self::ProtocolConflict => "ProtocolConflict",
            Self::NoMatchingParent => "NoMatchingParent",
            Self::NotAllowedByListeners => "NotAllowedByListeners",
            Self::NoMatchingListenerHostname => "NoMatchingListenerHostname",
            Self::HostnameNotPermitted => "HostnameNotPermitted",
            Self::BackendNotFound => "BackendNotFound",
            Self::InvalidKind => "InvalidKind",
            Self::RefNotPermitted => "RefNotPermitted",
            Self::UnsupportedValue => "UnsupportedValue",
            Self::SupportedVersion => "SupportedVersion",
            Self::UnsupportedVersion => "UnsupportedVersion",
            Self::TunnelShared => "TunnelShared",
            Self::InvalidClientCertificateRef => "InvalidClientCertificateRef",
            Self::InvalidCertificateRef => "InvalidCertificateRef",
            Self::InvalidCACertificateRef => "InvalidCACertificateRef",
            Self::NoValidCACertificate => "NoValidCACertificate",
            Self::Conflicted => "Conflicted",
            Self::OlderRouteMatches => "OlderRouteMatches",
            Self::NotAllowed => "NotAllowed",
            Self::ParentNotAccepted => "ParentNotAccepted",
        }
    }
}

/// One computed condition. `lastTransitionTime` is left to the writer of the status, which owns
/// the clock; the translation is pure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: ConditionType,
    pub status: bool,
    pub reason: Reason,
    pub message: String,
    /// The `metadata.generation` of the object the condition was computed from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl Condition {
    pub(crate) fn new(
        kind: ConditionType,
        status: bool,
        reason: Reason,
        message: impl Into<String>,
        observed_generation: Option<i64>,
    ) -> Self {
        Self {
            kind,
            status,
            reason,
            message: message.into(),
            observed_generation,
        }
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = if self.status { "True" } else { "False" };
        write!(
            f,
            "{}={} ({})",
            self.kind.as_str(),
            status,
            self.reason.as_str()
        )?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

/// Status of one listener of a Gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerStatus {
    pub name: String,
    pub attached_routes: i32,
    /// Route kinds the listener accepts (`HTTPRoute`, `GRPCRoute`).
    pub supported_kinds: Vec<String>,
    pub conditions: Vec<Condition>,
}

/// Status of one Gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    pub conditions: Vec<Condition>,
    pub listeners: Vec<ListenerStatus>,
    /// How many ListenerSets are attached and accepted (`status.attachedListenerSets`).
    pub attached_listener_sets: i32,
}

/// Status of one ListenerSet whose parent is one of our Gateways.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerSetStatus {
    /// The parent Gateway.
    pub gateway: ObjectKey,
    pub conditions: Vec<Condition>,
    /// Its listeners' statuses; none when the Gateway does not admit it.
    pub listeners: Vec<ListenerStatus>,
}

/// What a route parent, or policy ancestor, is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum ParentKind {
    #[default]
    Gateway,
    ListenerSet,
    /// A ListenerSet named the experimental way (`gateway.networking.x-k8s.io`
    /// `XListenerSet`), as routes on Gateway API CRDs before v1.5 name it: its status entry
    /// names it so too.
    XListenerSet,
}

impl ParentKind {
    /// The Kubernetes kind.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gateway => "Gateway",
            Self::ListenerSet => "ListenerSet",
            Self::XListenerSet => "XListenerSet",
        }
    }

    /// The API group of the kind.
    pub fn group(self) -> &'static str {
        match self {
            Self::Gateway | Self::ListenerSet => crate::snapshot::GATEWAY_API_GROUP,
            Self::XListenerSet => crate::snapshot::EXPERIMENTAL_GATEWAY_API_GROUP,
        }
    }

    fn is_gateway(&self) -> bool {
        *self == Self::Gateway
    }
}

/// The parent a route status entry is about, as written in the route's `parentRefs`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    /// A Gateway, or a ListenerSet attached to one of our Gateways.
    #[serde(default, skip_serializing_if = "ParentKind::is_gateway")]
    pub kind: ParentKind,
    pub namespace: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

impl fmt::Display for ParentRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind != ParentKind::Gateway {
            write!(f, "{} ", self.kind.as_str())?;
        }
        write!(f, "{}/{}", self.namespace, self.name)?;
        if let Some(section) = &self.section_name {
            write!(f, "/{section}")?;
        }
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

/// Status of a route towards one of its parents (`status.parents[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    pub parent_ref: ParentRef,
    pub conditions: Vec<Condition>,
}

impl RouteParentStatus {
    /// The condition of `kind`, if computed.
    pub fn condition(&self, kind: ConditionType) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }
}

/// Status of a policy towards one Gateway whose routes it applies to (`status.ancestors[]`,
/// Gateway API `PolicyAncestorStatus`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyAncestorStatus {
    /// The Gateway (`sectionName` and `port` unset).
    pub ancestor_ref: ParentRef,
    pub conditions: Vec<Condition>,
}

impl PolicyAncestorStatus {
    /// The condition of `kind`, if computed.
    pub fn condition(&self, kind: ConditionType) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }
}

/// Every status the translation computed, keyed by object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Statuses {
    pub gateway_classes: BTreeMap<String, Vec<Condition>>,
    pub gateways: BTreeMap<ObjectKey, GatewayStatus>,
    /// Only parents that belong to a Gateway of ours appear here.
    pub routes: BTreeMap<RouteKey, Vec<RouteParentStatus>>,
    /// Every BackendTLSPolicy of the snapshot, with one entry per Gateway of ours whose
    /// routes use a Service port it covers (empty when there is none, so a writer can drop
    /// entries it wrote before).
    pub backend_tls_policies: BTreeMap<ObjectKey, Vec<PolicyAncestorStatus>>,
    /// Every ListenerSet whose parent is one of our Gateways, and each still marked accepted
    /// by a Gateway that no longer exists (told so; its `gateway` is none of `gateways`).
    pub listener_sets: BTreeMap<ObjectKey, ListenerSetStatus>,
}

impl Statuses {
    /// The Gateway a route parent belongs to: the Gateway itself, or a ListenerSet's parent.
    pub fn parent_gateway(&self, parent: &ParentRef) -> Option<ObjectKey> {
        let key = ObjectKey::new(&parent.namespace, &parent.name);
        match parent.kind {
            ParentKind::Gateway => Some(key),
            ParentKind::ListenerSet | ParentKind::XListenerSet => {
                self.listener_sets.get(&key).map(|s| s.gateway.clone())
            }
        }
    }
}
