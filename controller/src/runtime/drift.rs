//! Telling a plane someone edited away from its render from an unchanged one, with no API call.
//!
//! After applying a plane the round keeps, per object, the fields the render sets as the API
//! server returned them ([`OwnedFields`], from [`render::owned_fields`]). Every later round
//! takes the same fields of the watch caches' objects: equal, and the plane is left alone;
//! different (a Deployment's image edited, a NetworkPolicy opened, an object deleted or its
//! label removed, which takes it out of the label-selected watch), and it is applied again,
//! which server-side apply with force restores. The watches start that round within moments of
//! the edit. An unchanged plane so costs no request at all; fields the render does not set are
//! not compared (server-side apply could not restore them anyway), but for the keys of a
//! selector, which server-side apply replaces whole, and the plane is applied again every few
//! minutes besides.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde::Serialize;
use serde_json::Value;

use super::apply::Applied;
use crate::render::{self, DataPlane};

/// The objects of a plane as the watch caches hold them; `None` for one they lack. Without a
/// rendered NetworkPolicy, `network_policy` is one the Gateway controls, left from before the
/// policies were switched off.
#[derive(Default)]
pub(super) struct LivePlane<'a> {
    pub(super) deployment: Option<&'a Deployment>,
    pub(super) service: Option<&'a Service>,
    pub(super) network_policy: Option<&'a NetworkPolicy>,
    pub(super) autoscaler: Option<&'a HorizontalPodAutoscaler>,
    pub(super) auth_secret: Option<&'a Secret>,
}

/// Per object of a plane, the fields its render sets, as held live.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct OwnedFields(BTreeMap<&'static str, Value>);

/// What stands for the fields of a Deployment being deleted, or of a NetworkPolicy the plane
/// no longer has that is: no apply can restore or remove them.
const BEING_DELETED: &str = "being deleted";

impl OwnedFields {
    /// The fields of the objects `live` holds; an object it lacks is left out, so the fields
    /// of a plane that lost one differ from those of the plane applied. A Deployment being
    /// deleted (a foreground cascade keeps it while its pods go) counts as neither there nor
    /// missing: it differs from the plane applied, and a plane applied while it was being
    /// deleted differs from one without it, so that its final disappearance is drift too and
    /// the plane is applied anew then, not minutes later.
    pub(super) fn of(plane: &DataPlane, live: &LivePlane<'_>) -> Self {
        let mut fields = BTreeMap::new();
        if live
            .deployment
            .is_some_and(|d| d.metadata.deletion_timestamp.is_some())
        {
            fields.insert("Deployment", Value::from(BEING_DELETED));
        }
        let mut add = |kind, rendered: Value, live: Option<Value>| {
            if let Some(live) = live {
                fields.insert(kind, render::owned_fields(&rendered, &live));
            }
        };
        let deployment = live
            .deployment
            .filter(|d| d.metadata.deletion_timestamp.is_none());
        add(
            "Deployment",
            value(&plane.deployment),
            deployment.map(value),
        );
        add("Service", value(&plane.service), live.service.map(value));
        if let Some(policy) = &plane.network_policy {
            add(
                "NetworkPolicy",
                value(policy),
                live.network_policy.map(value),
            );
        }
        if let Some(autoscaler) = &plane.autoscaler {
            add(
                "HorizontalPodAutoscaler",
                value(autoscaler),
                live.autoscaler.map(value),
            );
        }
        // Switched off, yet one is there: unlike the plane applied, which removed it. One
        // being deleted already (a finalizer holds it) is neither: the apply leaves it to its
        // finalizer, and returns it as it is, so a plane applied meanwhile is intact until it
        // is gone, and its disappearance is drift.
        if plane.network_policy.is_none() {
            match live.network_policy {
                Some(p) if p.metadata.deletion_timestamp.is_some() => {
                    fields.insert("NetworkPolicy", Value::from(BEING_DELETED));
                }
                Some(_) => {
                    fields.insert("NetworkPolicy", Value::Bool(true));
                }
                None => {}
            }
        }
        Self(fields)
    }

    /// The fields of the objects as their applies returned them.
    pub(super) fn applied(plane: &DataPlane, applied: &Applied) -> Self {
        Self::of(
            plane,
            &LivePlane {
                deployment: Some(&applied.deployment),
                service: Some(&applied.service),
                network_policy: applied.network_policy.as_ref(),
                autoscaler: applied.autoscaler.as_ref(),
                auth_secret: None,
            },
        )
    }
}

/// Whether the generated token Secret the plane needs is there with the labels and annotations
/// it was given (which is all that is applied to it: a token a proxy takes is never rewritten,
/// and one it does not take makes the render draw another, which the apply writes).
pub(super) fn secret_intact(plane: &DataPlane, live: &LivePlane<'_>) -> bool {
    let Some(rendered) = &plane.auth_secret else {
        return true;
    };
    let Some(secret) = live.auth_secret else {
        return false;
    };
    let holds = |want: &Option<BTreeMap<String, String>>,
                 have: &Option<BTreeMap<String, String>>| {
        want.iter()
            .flatten()
            .all(|(k, v)| have.as_ref().and_then(|h| h.get(k)) == Some(v))
    };
    holds(&rendered.metadata.labels, &secret.metadata.labels)
        && holds(&rendered.metadata.annotations, &secret.metadata.annotations)
}

fn value(object: &impl Serialize) -> Value {
    serde_json::to_value(object).unwrap_or(Value::Null)
}
