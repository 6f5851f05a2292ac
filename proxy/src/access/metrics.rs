//! What Cloudflare Access checks and key fetches report to `/metrics`. The instruments live
//! with the checks that bump them; the proxy's registry only asks them to register.

use super::AccessError;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TeamLabels {
    pub(super) team: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TeamOutcomeLabels {
    pub(super) team: String,
    pub(super) outcome: &'static str,
}

/// Refusals by reason (one child per [`AccessError`], created up front, so a refused request
/// only bumps an atomic) and, per team the served table names, its key fetches and the age of
/// its keys. A team's series are created when a compile first names it and removed when a
/// table stops naming it.
#[derive(Clone, Debug)]
pub struct AccessMetrics {
    refusals: [Counter; AccessError::ALL.len()],
    /// The family the children above belong to, for [`Self::register`].
    refusal_family: Family<ReasonLabels, Counter>,
    pub(super) key_fetches: Family<TeamOutcomeLabels, Counter>,
    pub(super) keys_age: Family<TeamLabels, Gauge<f64, AtomicU64>>,
    /// How many key sets of each team are alive: a table still in use keeps its own while a
    /// newer one names the team again, and the team's series go only with the last.
    pub(super) live_teams: Arc<Mutex<HashMap<String, usize>>>,
}

impl Default for AccessMetrics {
    /// Counted, and exposed only once [`Self::register`]ed (a proxy whose metrics are off and
    /// tests never do).
    fn default() -> Self {
        let refusal_family = Family::<ReasonLabels, Counter>::default();
        Self {
            refusals: AccessError::ALL.map(|e| {
                refusal_family
                    .get_or_create(&ReasonLabels { reason: e.label() })
                    .clone()
            }),
            refusal_family,
            key_fetches: Family::default(),
            keys_age: Family::default(),
            live_teams: Arc::default(),
        }
    }
}

impl AccessMetrics {
    /// Counts a refused request.
    pub fn refused(&self, reason: AccessError) {
        self.refusals[reason.index()].inc();
    }

    /// Registers the families in the proxy's registry (names fixed by the proxy contract).
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "access_refusals",
            "Requests refused by a Cloudflare Access requirement, by reason",
            self.refusal_family.clone(),
        );
        registry.register(
            "access_key_fetches",
            "Fetches of a Cloudflare Access team's signing keys, by outcome (ok, error)",
            self.key_fetches.clone(),
        );
        registry.register_with_unit(
            "access_keys_age",
            "Age of the Cloudflare Access team's signing keys in use (since their last successful \
             fetch; since the team was first named while none succeeded), as of the last fetch \
             attempt",
            Unit::Seconds,
            self.keys_age.clone(),
        );
    }
}
