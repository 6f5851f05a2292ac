//! Leader election on a `coordination.k8s.io/v1` Lease, so several controller replicas can run
//! and only one writes.
//!
//! The holder renews the Lease every `renew` period; a Lease not renewed for its duration is
//! free to take. Every write names the resourceVersion it read, so two replicas racing for a
//! free Lease cannot both win. A holder that cannot renew within the duration stops acting as
//! leader before anyone else can take over.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::{Api, Client};

/// Who competes for which Lease, and how long a holder keeps it unrenewed.
#[derive(Debug, Clone)]
pub struct LeaseOptions {
    pub namespace: String,
    pub name: String,
    /// This replica (its pod name, made unique).
    pub identity: String,
    pub duration: Duration,
    pub renew: Duration,
}

/// One replica's view of the Lease.
pub struct Elector {
    api: Api<Lease>,
    options: LeaseOptions,
    /// When this replica last renewed successfully; it leads while that is within `duration`.
    renewed: Option<tokio::time::Instant>,
}

impl Elector {
    pub fn new(client: Client, options: LeaseOptions) -> Self {
        Self {
            api: Api::namespaced(client, &options.namespace),
            options,
            renewed: None,
        }
    }

    /// Whether this replica holds the Lease now (it renewed within the Lease's duration, minus
    /// a margin for clocks).
    pub fn leading(&self) -> bool {
        self.renewed
            .is_some_and(|at| at.elapsed() < self.options.duration.mul_f32(0.8))
    }

    /// Tries to take or renew the Lease once; returns whether this replica leads.
    pub async fn try_lead(&mut self) -> bool {
        match self.attempt().await {
            Ok(true) => self.renewed = Some(tokio::time::Instant::now()),
            Ok(false) => self.renewed = None,
            Err(e) => {
                tracing::warn!(error = %e, lease = %self.options.name, "renewing the leader Lease failed")
            }
        }
        self.leading()
    }

    async fn attempt(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let duration_secs = i32::try_from(self.options.duration.as_secs()).unwrap_or(i32::MAX);
        let me = self.options.identity.as_str();
        let Some(mut lease) = self.api.get_opt(&self.options.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.options.name.clone()),
                    namespace: Some(self.options.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.to_owned()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.as_deref().unwrap_or_default();
        let expired = spec.renew_time.as_ref().is_none_or(|MicroTime(at)| {
            let lasts = SignedDuration::from_secs(i64::from(
                spec.lease_duration_seconds.unwrap_or(duration_secs),
            ));
            at.checked_add(lasts).map_or(true, |until| until < now)
        });
        if holder != me && !holder.is_empty() && !expired {
            return Ok(false);
        }
        let taking_over = holder != me;
        let transitions = spec.lease_transitions.unwrap_or(0);
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(me.to_owned()),
            lease_duration_seconds: Some(duration_secs),
            acquire_time: if taking_over {
                Some(MicroTime(now))
            } else {
                spec.acquire_time
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(if taking_over {
                transitions.saturating_add(1)
            } else {
                transitions
            }),
            ..spec
        });
        // The resourceVersion read makes this a compare-and-swap.
        match self
            .api
            .replace(&self.options.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up (on shutdown), so another replica need not wait for it to expire.
    pub async fn release(&mut self) {
        if !self.leading() {
            return;
        }
        self.renewed = None;
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.options.name).await {
            let ours = lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                == Some(self.options.identity.as_str());
            if let (true, Some(spec)) = (ours, lease.spec.as_mut()) {
                spec.holder_identity = None;
                let _ = self
                    .api
                    .replace(&self.options.name, &PostParams::default(), &lease)
                    .await;
            }
        }
    }

    /// How often to call [`Elector::try_lead`].
    pub fn renew_every(&self) -> Duration {
        self.options.renew
    }
}
