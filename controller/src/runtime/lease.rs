//! Leader election on a `coordination.k8s.io/v1` Lease, so several controller replicas can run
//! and only one writes. A task of its own renews the Lease; every write is a compare-and-swap
//! on the resourceVersion read, another holder's Lease expires only by this replica's monotonic
//! clock, and a holder stops leading before anyone else may take over.
//! See docs/design/leader-election.md.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

/// Who competes for which Lease, and how long a holder keeps it unrenewed.
#[derive(Debug, Clone)]
pub struct LeaseOptions {
    pub namespace: String,
    pub name: String,
    /// This replica (its pod name, made unique).
    pub identity: String,
    /// How long a holder keeps the Lease unrenewed; recorded in whole seconds, rounded up.
    pub duration: Duration,
    /// How often the holder renews, and how long the give-up on stop may take. One renewal may
    /// take as long as the holder may lead without one (80 % of `duration`): a slow API server
    /// delays renewals, it does not fail them.
    pub renew: Duration,
}

/// Starts the elector; the receiver says whether this replica leads now, and in which term
/// ([`Term`]). Completing `stop` publishes `None`, gives the Lease up (so another replica need
/// not wait for it to expire) and ends the task, within about two `renew` periods whether or
/// not the API server answers.
pub fn spawn(
    client: Client,
    options: LeaseOptions,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> (watch::Receiver<Option<Term>>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(None);
    let task = tokio::spawn(async move {
        let mut elector = Elector::new(client, options);
        let mut stop = std::pin::pin!(stop);
        let mut ticks = tokio::time::interval(elector.options.renew);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let publish = |now: Option<Term>| {
            tx.send_if_modified(|was| std::mem::replace(was, now) != now);
        };
        loop {
            // Leadership ends at its deadline, whether or not a renewal is under way then, and
            // whether or not it passed while this task was not running.
            let deadline = elector.deadline();
            if deadline.is_none() {
                elector.renewed = None;
                publish(None);
            }
            tokio::select! {
                _ = ticks.tick() => {
                    let renew = elector.options.renew;
                    let tick = {
                        let attempt = elector.try_lead();
                        tokio::pin!(attempt);
                        tokio::select! {
                            leading = &mut attempt => Tick::Done(leading),
                            () = sleep_until_some(deadline) => Tick::Lapsed,
                            () = &mut stop => {
                                // Nothing more is written as leader. A write under way may
                                // land: it is let finish, for a renew period at most, so the
                                // give-up reads what it wrote.
                                publish(None);
                                let _ = tokio::time::timeout(renew, &mut attempt).await;
                                Tick::Stop
                            }
                        }
                    };
                    match tick {
                        Tick::Done(leading) => publish(leading.then_some(elector.term)),
                        // The loop's top ends the leadership whose deadline passed.
                        Tick::Lapsed => {}
                        Tick::Stop => break,
                    }
                }
                () = sleep_until_some(deadline) => {}
                () = &mut stop => break,
            }
        }
        tx.send_replace(None);
        elector.release().await;
    });
    (rx, task)
}

/// How a renewal attempt ended.
enum Tick {
    /// Whether this replica leads.
    Done(bool),
    /// The deadline came first.
    Lapsed,
    /// The elector is stopping.
    Stop,
}

/// Completes at `deadline`, never without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// A run of this replica's leadership that no other replica's interrupted: it starts when the
/// replica takes the Lease from another holder (or from none), and goes on across renewals,
/// also ones that come after this replica stopped leading for a while, as long as the Lease
/// still names it. A replica taking the Lease back in the same term knows nobody else acted
/// meanwhile, so what it remembers of its own writes still holds.
///
/// Read off the Lease record itself (its transitions and the acquire time of its holder), not
/// from which writes were answered: a take-over the API server committed but whose answer was
/// lost still shows as a new term when the next renewal reads the record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Term {
    transitions: i32,
    acquired: Option<Timestamp>,
}

/// What of a Lease tells whether its holder still renews: the holder (`None`: none) and the
/// renew time.
type Record = (Option<String>, Option<Timestamp>);

/// The Lease record as last seen (`None`: there was no Lease), and when this replica first saw
/// it so.
struct Observed {
    record: Option<Record>,
    since: Instant,
}

/// The duration a holder records when it gives the Lease up on stop, with no holder, as
/// client-go does: what tells a release, which another replica may take at once, from a holder
/// cleared by someone else, which it may not (and which a holder would not leave at 1 s unless
/// its own duration was that short, when waiting it out costs no more).
const RELEASED_SECS: i32 = 1;

struct Elector {
    api: Api<Lease>,
    options: LeaseOptions,
    /// When the write of the last successful renewal was sent: the API server committed it no
    /// sooner, so no other replica can have seen it sooner and started counting its duration.
    renewed: Option<Instant>,
    /// When the write of the attempt under way was sent.
    sent: Option<Instant>,
    observed: Option<Observed>,
    /// This replica has seen a Lease: one missing now was deleted, perhaps under a holder
    /// that has not noticed yet. Missing from the start (a first install), it is created at
    /// once.
    saw_lease: bool,
    /// The term of the record this replica last wrote as holder.
    term: Term,
}

impl Elector {
    fn new(client: Client, options: LeaseOptions) -> Self {
        Self {
            api: Api::namespaced(client, &options.namespace),
            options,
            renewed: None,
            sent: None,
            observed: None,
            saw_lease: false,
            term: Term::default(),
        }
    }

    /// When this replica stops leading unless it renews: 80 % of the Lease's duration after
    /// the write of its last successful renewal was sent, before any other replica can take
    /// the Lease.
    fn deadline(&self) -> Option<Instant> {
        self.renewed
            .map(|at| at + self.options.duration.mul_f32(0.8))
            .filter(|d| *d > Instant::now())
    }

    fn leading(&self) -> bool {
        self.deadline().is_some()
    }

    /// Tries once to take or renew the Lease; returns whether this replica leads.
    async fn try_lead(&mut self) -> bool {
        self.sent = None;
        // A renewal that ends past the time this replica may lead without one is no renewal.
        match tokio::time::timeout(self.options.duration.mul_f32(0.8), self.attempt()).await {
            Ok(Ok(true)) => self.renewed = self.sent,
            Ok(Ok(false)) => self.renewed = None,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, lease = %self.options.name, "renewing the leader Lease failed")
            }
            Err(_) => {
                tracing::warn!(lease = %self.options.name, "renewing the leader Lease timed out")
            }
        }
        self.leading()
    }

    /// The duration as the Lease records it: whole seconds, rounded up, since another replica
    /// waits this long before it takes over and this one stops leading only 80 % of its own
    /// duration after a renewal; and at least 1, as the API server refuses 0.
    fn duration_secs(&self) -> i32 {
        let duration = self.options.duration;
        let secs = duration
            .as_secs()
            .saturating_add(u64::from(duration.subsec_nanos() > 0))
            .max(1);
        i32::try_from(secs).unwrap_or(i32::MAX)
    }

    /// Whether the record seen has stayed unchanged, on this replica's clock, for `lasts`.
    fn unchanged_for(&self, lasts: Duration) -> bool {
        self.observed
            .as_ref()
            .is_some_and(|o| o.since.elapsed() >= lasts)
    }

    /// Notes the record read (`None`: no Lease), restarting the count when it changed.
    fn observe(&mut self, record: Option<Record>) {
        if self.observed.as_ref().is_none_or(|o| o.record != record) {
            self.observed = Some(Observed {
                record,
                since: Instant::now(),
            });
        }
    }

    async fn attempt(&mut self) -> Result<bool, kube::Error> {
        // In whole microseconds, as the record keeps it, so a term read back off the record
        // equals the one written.
        let now = Timestamp::now();
        let now = Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now);
        let duration_secs = self.duration_secs();
        let me = self.options.identity.clone();
        let lease = self.api.get_opt(&self.options.name).await?;
        self.observe(lease.as_ref().map(|lease| {
            let spec = lease.spec.clone().unwrap_or_default();
            (
                spec.holder_identity.filter(|h| !h.is_empty()),
                spec.renew_time.map(|MicroTime(t)| t),
            )
        }));
        self.saw_lease |= lease.is_some();
        let Some(mut lease) = lease else {
            // A Lease deleted while its holder leads: the holder puts it back in the same
            // term; anyone else that saw it waits the duration first, as for a holder that
            // stopped renewing, since the holder may not have noticed yet. None seen yet (a
            // first install): nobody leads, and it is taken at once.
            let (transitions, acquired) = if self.leading() {
                (self.term.transitions, self.term.acquired)
            } else if !self.saw_lease
                || self.unchanged_for(Duration::from_secs(
                    u64::try_from(duration_secs).unwrap_or(u64::MAX),
                ))
            {
                (0, Some(now))
            } else {
                return Ok(false);
            };
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.options.name.clone()),
                    namespace: Some(self.options.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: acquired.map(MicroTime),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(transitions),
                    ..LeaseSpec::default()
                }),
            };
            self.sent = Some(Instant::now());
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    self.term = Term {
                        transitions,
                        acquired,
                    };
                    Ok(true)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let lasts = Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(duration_secs)).unwrap_or(0),
        );
        let released = holder.is_none() && spec.lease_duration_seconds == Some(RELEASED_SECS);
        let ours = holder.as_deref() == Some(me.as_str());
        // A holder cleared by anyone but its holder on stop (an edit, say): the holder, while
        // it leads, writes itself back in the same term; anyone else waits the duration, as
        // the holder may not have noticed yet.
        let cleared_under_me = holder.is_none() && !released && self.leading();
        if !ours && !cleared_under_me && !released && !self.unchanged_for(lasts) {
            return Ok(false);
        }
        let transitions = spec.lease_transitions.unwrap_or(0);
        let (transitions, acquired) = if ours {
            (
                transitions,
                spec.acquire_time.as_ref().map(|MicroTime(t)| *t),
            )
        } else if cleared_under_me {
            (self.term.transitions, self.term.acquired)
        } else {
            (transitions.saturating_add(1), Some(now))
        };
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(me),
            lease_duration_seconds: Some(duration_secs),
            acquire_time: acquired.map(MicroTime),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..spec
        });
        // The resourceVersion read makes this a compare-and-swap.
        self.sent = Some(Instant::now());
        match self
            .api
            .replace(&self.options.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                self.term = Term {
                    transitions,
                    acquired,
                };
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up if this replica holds it.
    async fn release(&mut self) {
        if !self.leading() {
            return;
        }
        self.renewed = None;
        // An API server that does not answer must not hold the shutdown up: the Lease then
        // lapses on its own.
        match tokio::time::timeout(self.options.renew, self.give_up()).await {
            Ok(Ok(())) => {}
            Ok(Err(kube::Error::Api(e))) if e.code == 409 => {
                tracing::info!(lease = %self.options.name, "the leader Lease changed hands before it was given up")
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, lease = %self.options.name, "giving the leader Lease up failed")
            }
            Err(_) => {
                tracing::warn!(lease = %self.options.name, "giving the leader Lease up timed out")
            }
        }
    }

    /// Clears the holder if the Lease still names this replica, marked as given up
    /// ([`RELEASED_SECS`]); the resourceVersion read makes the write fail (409) if anyone wrote
    /// the Lease since.
    async fn give_up(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.options.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.options.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(RELEASED_SECS);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        self.api
            .replace(&self.options.name, &PostParams::default(), &lease)
            .await?;
        Ok(())
    }
}
