//! Config pushes to the proxy pods of a data plane (`PUT /config` on each pod's config port).
//! A pod is pushed to only when it lacks the plane's current version; versions keep increasing
//! across controller restarts; a rotated token's predecessor is kept for pods not yet rolled;
//! a rule a pod refuses is left out and the rest pushed in the same round.
//! See docs/design/config-pushes.md.
//!
//! [`Pusher`] runs each plane's push as a task of its own and reports the outcomes; a push
//! ([`plane`]) versions the plane's document, leaves out refused rules and brings every pod to
//! it through the pods' config API ([`client`]).

mod client;
mod plane;

pub use client::served_document;
use plane::{sync_plane, PlaneState, Sustained};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cftunnel_config::valid::Costs;
use cftunnel_config::Config;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::sync::{Notify, Semaphore};
use tokio::task::{AbortHandle, JoinError, JoinSet};
use tracing::Instrument as _;

use crate::translate::PlaneKey;

/// Rounds in a row with a failed pod before a plane's failure counts as sustained.
pub const DEFAULT_SUSTAINED_AFTER: u32 = 3;
/// How long a plane's pushes must have been failing, too, before it counts as sustained:
/// rounds follow changes anywhere in the cluster, so a pod that takes seconds to start can
/// fail several rounds within a second.
pub const DEFAULT_SUSTAINED_FOR: Duration = Duration::from_secs(30);
/// How long rounds with no pod listed keep a plane's run of failed pushes going, by default:
/// long enough for a replaced pod's successor to be scheduled and listed, short enough that a
/// plane scaled to zero stops being reported soon.
pub const DEFAULT_PODLESS_KEEP: Duration = Duration::from_secs(60);
/// How long a round waits for the pushes it starts before it goes on without them: pushes
/// to pods that answer take milliseconds.
pub const ROUND_WAIT: Duration = Duration::from_secs(1);
/// Planes pushed to at once; the pushes of others wait for a turn.
const CONCURRENT_PLANES: usize = 32;

/// What happened at one pod in a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodOutcome {
    /// It already had the plane's current version.
    Current,
    /// It took the push.
    Pushed,
    /// It could not be reached or refused the push; the reason is for conditions and Events.
    Failed(String),
}

/// A rule of the plane's document that a pod refused, or that the pusher left out for the
/// regex budget, left out of what the plane was pushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedRule {
    /// Its position in the document the round was given (not in the one pushed).
    pub rule: usize,
    /// Its `name` (`<namespace>/<route>/<rule>`).
    pub name: Option<String>,
    /// The pod that refused it; `None`: the pusher left it out before any pod saw it, the
    /// document's regexes being past what a proxy takes ([`cftunnel_config::valid::Costs`]).
    pub pod: Option<SocketAddr>,
    /// Why, naming the field: the pod's reason (`rules[3].matches[0].path: ...`, position in
    /// the document the pod was pushed), or the pusher's (`matches[0].path: ...`, in the
    /// rule).
    pub reason: String,
}

/// One round of [`Pusher::sync`] for a plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaneOutcome {
    /// The version the plane's pods should now hold.
    pub version: i64,
    pub pods: Vec<(SocketAddr, PodOutcome)>,
    /// Rules left out because a pod refused them (this round or, while its pods are the same,
    /// an earlier one).
    pub refused: Vec<RefusedRule>,
    /// `refused` is all the plane's pods refuse of this round's document: every pod listed
    /// answered the last push (but those down and not serving, which hold no config, while
    /// one is up) and the round was not cut off (it pushes a bounded number of times, and
    /// stops leaving rules out while a pod still refuses one: what it found is only part, until
    /// a round every pod answers finds the rest), or the plane is scaled to zero. Otherwise
    /// `refused` is only part of it (what was found, and what earlier rounds found, as it
    /// was); so is a stale outcome's.
    pub refusals_known: bool,
    /// A pod answered the round's last push and the round was not cut off: what `refused`
    /// says the pods refuse, some of them do refuse, though it may not be all of it (another
    /// pod did not answer). Enough to tell a route its rule is refused; not enough to take a
    /// refusal back ([`PlaneOutcome::refusals_known`]). Not of a stale outcome.
    pub refusals_heard: bool,
    /// No pod has been listed for longer than a run of failures is kept through such a gap
    /// ([`Pusher::keeping_runs_without_pods`]): the plane is scaled to zero, and what its pods
    /// refused is forgotten. A shorter gap (a pod gone before its successor is listed) keeps
    /// the refusals in `refused` as they were.
    pub scaled_to_zero: bool,
    /// Rounds in a row, this one included, in which some pod failed; rounds with no pod
    /// listed between them neither count nor break the run, for a while
    /// ([`Pusher::keeping_runs_without_pods`]).
    pub failed_rounds: u32,
    /// `failed_rounds` reached the threshold, over the time the pusher asks for: report it
    /// (`ProxyConfigPushed=False`), a one-off blip (or a pod starting) does not.
    pub sustained_failure: bool,
    /// How long the plane's current run of failed rounds has lasted, this one included
    /// (zero when this round failed nothing): pods all still being created are judged by it
    /// as well as by their age, so pods replaced before they start do not keep a lasting
    /// failure unreported.
    pub failing_for: Duration,
    /// How long the plane's pushes took this round, all pods and re-pushes included.
    pub duration: std::time::Duration,
    /// Returned before: the plane's next push still runs, and this is the last one's outcome
    /// again. Count and log an outcome only once.
    pub repeated: bool,
    /// Of a push of an earlier round's document, which differs from this round's: the pods
    /// hold that one (or failed to take it), and the next push runs. Its refusals are placed
    /// in this round's document, leaving out rules it no longer has.
    pub stale: bool,
    /// A pod refused every config-API token the plane has (the current one, and the one
    /// before the last rotation while it is known): it was started with another, and only a
    /// restart onto the current one brings it back.
    pub token_refused: bool,
    /// Failed pods that serve nothing, from any config: their config port refused the
    /// connection (nothing listens there: a container not running, its image not pulled or
    /// crash-looping) and they are not serving. Their failures are the plane's (counted,
    /// logged), not its routes': they make no failure sustained, while another pod of the
    /// plane holds the config.
    pub idle: Vec<SocketAddr>,
}

impl PlaneOutcome {
    /// Every pod of the plane is idle: none holds the config, so the plane serves nothing
    /// (an image that cannot be pulled, a crash loop). Their failures count towards a
    /// sustained failure then, and are its routes' where no other plane on its tunnel serves
    /// them: running no connector, the plane gets none of the tunnel's requests.
    pub fn all_down(&self) -> bool {
        all_idle(&self.pods, &self.idle)
    }

    /// Every pod holds the current version.
    pub fn all_current(&self) -> bool {
        self.pods
            .iter()
            .all(|(_, o)| !matches!(o, PodOutcome::Failed(_)))
    }
}

/// Whether every one of `pods` is `idle` (and there is one).
fn all_idle(pods: &[(SocketAddr, PodOutcome)], idle: &[SocketAddr]) -> bool {
    !pods.is_empty() && pods.iter().all(|(pod, _)| idle.contains(pod))
}

/// Keeps each plane's version and failure count between rounds, and the pushes still running.
///
/// Each plane's push runs as a task of its own. A round waits for the pushes it starts for a
/// bounded time at most ([`Pusher::waiting_at_most`]); one still running then (a pod that
/// accepts connections and never answers) goes on without holding up the round, and so every
/// other plane's next push. Its outcome is reported by the first round after it finishes.
#[derive(Debug)]
pub struct Pusher {
    planes: HashMap<PlaneKey, Plane>,
    running: JoinSet<Pushed>,
    /// One permit per plane that may be pushed to at once.
    turns: Arc<Semaphore>,
    timeout: Duration,
    sustained: Sustained,
    /// How long a round waits for the pushes it starts; `None`: until they finish.
    wait: Option<Duration>,
    /// Told when a push the round stopped waiting for finishes.
    wake: Option<Arc<Notify>>,
}

/// What the pusher holds of one plane.
#[derive(Debug, Default)]
struct Plane {
    /// Between pushes; `None` while one runs (its task holds it).
    state: Option<PlaneState>,
    running: Option<Running>,
    /// The last push that finished, for the rounds that find the next one still running.
    last: Option<Finished>,
    /// A push that finished unreported before `last` did: reported first.
    earlier: Option<Finished>,
}

#[derive(Debug)]
struct Running {
    id: tokio::task::Id,
    abort: AbortHandle,
    /// [`DONE`] and [`DETACHED`].
    flags: Arc<AtomicU8>,
}

/// Set by a push's task as it finishes.
const DONE: u8 = 1;
/// Set once the round stops waiting for the push: from then on its end wakes the loop.
const DETACHED: u8 = 2;

#[derive(Debug)]
struct Finished {
    outcome: PlaneOutcome,
    /// The document the push was given: its refusals are placed by position in it.
    config: Arc<Config>,
    /// The pods and token it was given.
    pods: Vec<SocketAddr>,
    token: String,
    /// It outlived its round's wait.
    detached: bool,
    /// Whether a round has returned it already.
    reported: bool,
}

impl Finished {
    /// It outlived its round's wait and failed, and this round would push the same again:
    /// a pod that takes connections and never answers would otherwise be pushed to again
    /// by the round that reports it, which the push's end starts, one round per timeout.
    fn failed_alike(&self, round: &PlaneRound<'_>) -> bool {
        !self.reported
            && self.detached
            && !self.outcome.all_current()
            && self.pods == round.pods
            && self.token == round.token
            && *self.config == *round.config
    }
}

/// What a push's task hands back.
struct Pushed {
    plane: PlaneKey,
    state: PlaneState,
    outcome: PlaneOutcome,
    config: Arc<Config>,
    pods: Vec<SocketAddr>,
    token: String,
}

impl Default for Pusher {
    fn default() -> Self {
        Self::new(Duration::from_secs(5), DEFAULT_SUSTAINED_AFTER)
    }
}

impl Pusher {
    /// `timeout` bounds each request to a pod; `sustained_after` is the number of failed rounds
    /// in a row that makes a failure sustained (however short a time they took; see
    /// [`Pusher::failing_for`]). Rounds wait for their pushes to finish (see
    /// [`Pusher::waiting_at_most`]).
    pub fn new(timeout: Duration, sustained_after: u32) -> Self {
        Self {
            planes: HashMap::new(),
            running: JoinSet::new(),
            turns: Arc::new(Semaphore::new(CONCURRENT_PLANES)),
            timeout,
            sustained: Sustained {
                rounds: sustained_after.max(1),
                lasting: Duration::ZERO,
                podless: DEFAULT_PODLESS_KEEP,
            },
            wait: None,
            wake: None,
        }
    }

    /// A failure counts as sustained only once its failed rounds have lasted `lasting` too.
    pub fn failing_for(mut self, lasting: Duration) -> Self {
        self.sustained.lasting = lasting;
        self
    }

    /// Rounds with no pod listed keep a plane's run of failed rounds going for `keep` (a pod
    /// replaced, its successor not listed yet); past it the run ends (scaled to zero).
    pub fn keeping_runs_without_pods(mut self, keep: Duration) -> Self {
        self.sustained.podless = keep;
        self
    }

    /// When the next plane with no pod listed comes to count as scaled to zero
    /// ([`Pusher::keeping_runs_without_pods`]), if one is to after `after`: the round then
    /// ends its run of failures and forgets what its pods refused.
    pub fn next_scaled_to_zero(&self, after: std::time::Instant) -> Option<std::time::Instant> {
        self.planes
            .values()
            .filter_map(|plane| plane.state.as_ref()?.podless_since())
            .filter_map(|since| since.checked_add(self.sustained.podless))
            .filter(|at| *at > after)
            .min()
    }

    /// A round waits at most `wait` for the pushes it starts; `wake` is told when one it
    /// stopped waiting for finishes, so a round reports it.
    pub fn waiting_at_most(mut self, wait: Duration, wake: Arc<Notify>) -> Self {
        self.wait = Some(wait);
        self.wake = Some(wake);
        self
    }

    /// Brings every pod of `plane` to `config`, authenticating with `token`. Its regexes are
    /// not weighed against the budget ([`PlaneRound::costs`]): a pod refuses a rule that
    /// crosses it, and the rule is left out.
    pub async fn sync(
        &mut self,
        plane: &PlaneKey,
        config: &Config,
        token: &str,
        pods: &[SocketAddr],
    ) -> PlaneOutcome {
        let round = PlaneRound {
            plane: plane.clone(),
            config,
            costs: Costs::NONE,
            token,
            pods,
            not_serving: &[],
        };
        let mut outcomes = self.sync_all(vec![round]).await;
        outcomes.pop().map_or_else(
            || PlaneOutcome {
                version: 0,
                pods: Vec::new(),
                refused: Vec::new(),
                refusals_known: false,
                refusals_heard: false,
                scaled_to_zero: false,
                failed_rounds: 0,
                sustained_failure: false,
                failing_for: Duration::ZERO,
                duration: std::time::Duration::ZERO,
                repeated: false,
                stale: false,
                token_refused: false,
                idle: Vec::new(),
            },
            |(_, outcome)| outcome,
        )
    }

    /// [`Pusher::sync`] for several planes at once: a plane whose pods time out does not hold
    /// up the others. A plane whose push from an earlier round still runs is not pushed again
    /// until it finishes; meanwhile its last outcome is returned, marked
    /// [`PlaneOutcome::repeated`] once reported (a plane with none yet is left out).
    pub async fn sync_all(&mut self, rounds: Vec<PlaneRound<'_>>) -> Vec<(PlaneKey, PlaneOutcome)> {
        let now = wall_clock_ms();
        if self.wait.is_none() {
            while let Some(done) = self.running.join_next_with_id().await {
                self.settle(done);
            }
        }
        while let Some(done) = self.running.try_join_next_with_id() {
            self.settle(done);
        }
        let mut waiting = std::collections::HashSet::new();
        let mut started = std::collections::HashSet::new();
        for round in &rounds {
            let plane = self.planes.entry(round.plane.clone()).or_default();
            if plane.running.is_some() || plane.last.as_ref().is_some_and(|l| l.failed_alike(round))
            {
                continue;
            }
            let state = plane
                .state
                .take()
                .unwrap_or_else(|| PlaneState::new(now, round.token));
            // The document the last push was given, if it is this one: not copied again.
            let config = match state.pushed_from() {
                Some(config) if **config == *round.config => Arc::clone(config),
                _ => Arc::new(round.config.clone()),
            };
            let owned = OwnedRound {
                plane: round.plane.clone(),
                config,
                costs: round.costs.clone(),
                token: round.token.to_owned(),
                pods: round.pods.to_vec(),
                not_serving: round.not_serving.to_vec(),
            };
            // Made here, so it is a child of the caller's span.
            let span = tracing::info_span!(
                "config.push",
                otel.status_code = tracing::field::Empty,
                otel.status_description = tracing::field::Empty,
                cftunnel.plane = %round.plane,
                cftunnel.pods = count(round.pods.len()),
                cftunnel.config_version = tracing::field::Empty,
                cftunnel.pods_pushed = tracing::field::Empty,
                cftunnel.pods_failed = tracing::field::Empty,
            );
            let flags = Arc::new(AtomicU8::new(0));
            let push = push_plane(
                owned,
                state,
                Push {
                    now,
                    timeout: self.timeout,
                    sustained: self.sustained,
                    flags: Arc::clone(&flags),
                    wake: self.wake.clone(),
                    turns: Arc::clone(&self.turns),
                },
            )
            .instrument(span);
            let abort = self.running.spawn(push);
            waiting.insert(abort.id());
            started.insert(&round.plane);
            plane.running = Some(Running {
                id: abort.id(),
                abort,
                flags,
            });
        }
        let deadline = self.wait.map(|wait| tokio::time::Instant::now() + wait);
        while !waiting.is_empty() {
            let next = match deadline {
                Some(at) => tokio::time::timeout_at(at, self.running.join_next_with_id())
                    .await
                    .ok()
                    .flatten(),
                None => self.running.join_next_with_id().await,
            };
            let Some(done) = next else { break };
            waiting.remove(&self.settle(done));
        }
        if let Some(wake) = &self.wake {
            for running in self.planes.values().filter_map(|p| p.running.as_ref()) {
                // Finished between the wait's end and now: its outcome is for the next round.
                if running.flags.fetch_or(DETACHED, Ordering::SeqCst) & DONE != 0 {
                    wake.notify_one();
                }
            }
        }
        rounds
            .iter()
            .filter_map(|round| {
                let plane = self.planes.get_mut(&round.plane)?;
                let earlier = plane.earlier.is_some();
                let last = match plane.earlier.as_mut() {
                    // The one after it is reported by the next round.
                    Some(earlier) => {
                        if let Some(wake) = &self.wake {
                            wake.notify_one();
                        }
                        earlier
                    }
                    None => plane.last.as_mut()?,
                };
                let mut outcome = last.outcome.clone();
                outcome.repeated = last.reported;
                last.reported = true;
                // Started this round and finished: it was given this round's document.
                let this_rounds =
                    !earlier && started.contains(&round.plane) && plane.running.is_none();
                if !this_rounds && *last.config != *round.config {
                    outcome.stale = true;
                    outcome.refusals_known = false;
                    outcome.refusals_heard = false;
                    outcome.refused = placed_in(&outcome.refused, &last.config, round.config);
                }
                plane.earlier = None;
                Some((round.plane.clone(), outcome))
            })
            .collect()
    }

    /// Takes back a push's task: the plane's state and outcome, or (the task panicked or was
    /// aborted) nothing, so the plane starts afresh. Returns the task's id.
    fn settle(&mut self, done: Result<(tokio::task::Id, Pushed), JoinError>) -> tokio::task::Id {
        match done {
            Ok((id, pushed)) => {
                if let Some(plane) = self.planes.get_mut(&pushed.plane) {
                    if let Some(running) = plane.running.take_if(|r| r.id == id) {
                        plane.state = Some(pushed.state);
                        // Not yet reported: it goes out before this one.
                        if let Some(unreported) = plane.last.take_if(|l| !l.reported) {
                            plane.earlier.get_or_insert(unreported);
                        }
                        plane.last = Some(Finished {
                            outcome: pushed.outcome,
                            config: pushed.config,
                            pods: pushed.pods,
                            token: pushed.token,
                            detached: running.flags.load(Ordering::SeqCst) & DETACHED != 0,
                            reported: false,
                        });
                    }
                }
                id
            }
            Err(e) => {
                let id = e.id();
                if e.is_panic() {
                    tracing::error!(error = %e, "a config push failed unexpectedly");
                }
                for plane in self.planes.values_mut() {
                    if plane.running.as_ref().is_some_and(|r| r.id == id) {
                        plane.running = None;
                    }
                }
                id
            }
        }
    }

    /// Stops every push still running; their planes start afresh at their next round.
    pub fn abort_all(&mut self) {
        self.running.abort_all();
    }

    /// The planes pushed to so far and not yet dropped by [`Pusher::retain`].
    pub fn planes(&self) -> impl Iterator<Item = &PlaneKey> {
        self.planes.keys()
    }

    /// Keeps what is known of the planes `keep` accepts, drops the rest (planes that went away)
    /// and stops their pushes.
    pub fn retain(&mut self, keep: impl Fn(&PlaneKey) -> bool) {
        self.planes.retain(|plane, state| {
            let kept = keep(plane);
            if let (false, Some(running)) = (kept, &state.running) {
                running.abort.abort();
            }
            kept
        });
    }
}

/// The refusals of an outcome taken against `was`, placed by position in `now` (a rule no
/// longer in it is left out).
fn placed_in(refused: &[RefusedRule], was: &Config, now: &Config) -> Vec<RefusedRule> {
    refused
        .iter()
        .filter_map(|r| {
            let rule = was.rules.get(r.rule)?;
            let at = now.rules.iter().position(|x| x == rule)?;
            Some(RefusedRule {
                rule: at,
                ..r.clone()
            })
        })
        .collect()
}

/// What a plane's round came to, on its span: the version, the pods pushed and failed, and
/// an error status naming the first failure.
fn record_outcome(span: &tracing::Span, outcome: &PlaneOutcome) {
    let pods =
        |f: fn(&PodOutcome) -> bool| count(outcome.pods.iter().filter(|(_, o)| f(o)).count());
    span.record("cftunnel.config_version", outcome.version);
    span.record("cftunnel.pods_pushed", pods(|o| *o == PodOutcome::Pushed));
    span.record(
        "cftunnel.pods_failed",
        pods(|o| matches!(o, PodOutcome::Failed(_))),
    );
    if let Some((pod, reason)) = outcome.pods.iter().find_map(|(pod, o)| match o {
        PodOutcome::Failed(reason) => Some((pod, reason)),
        _ => None,
    }) {
        span.record("otel.status_code", "error");
        span.record("otel.status_description", format!("{pod}: {reason}"));
    }
}

/// A count as a span attribute: OpenTelemetry's integers are signed.
fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// One plane's push: what [`Pusher::sync_all`] takes per plane.
#[derive(Debug, Clone)]
pub struct PlaneRound<'a> {
    pub plane: PlaneKey,
    pub config: &'a Config,
    /// What the regexes of `config`'s rules take ([`crate::translate::Output::costs`]).
    pub costs: &'a Costs,
    pub token: &'a str,
    pub pods: &'a [SocketAddr],
    /// Of `pods`, those not serving (see [`not_serving_addresses`]).
    pub not_serving: &'a [SocketAddr],
}

/// A [`PlaneRound`] its task owns.
struct OwnedRound {
    plane: PlaneKey,
    config: Arc<Config>,
    costs: Costs,
    token: String,
    pods: Vec<SocketAddr>,
    not_serving: Vec<SocketAddr>,
}

/// The settings a push's task runs with.
struct Push {
    /// The wall clock at the round's start, in milliseconds: a new plane's first version.
    now: i64,
    timeout: Duration,
    sustained: Sustained,
    flags: Arc<AtomicU8>,
    wake: Option<Arc<Notify>>,
    turns: Arc<Semaphore>,
}

/// A plane's push, as its task runs it.
async fn push_plane(round: OwnedRound, state: PlaneState, push: Push) -> Pushed {
    let span = tracing::Span::current();
    // Never closed; were it, the push would go ahead without a turn.
    let _turn = push.turns.acquire().await.ok();
    let started = std::time::Instant::now();
    let (state, mut outcome) =
        sync_plane(state, &round, push.now, push.timeout, push.sustained).await;
    outcome.duration = started.elapsed();
    record_outcome(&span, &outcome);
    if push.flags.fetch_or(DONE, Ordering::SeqCst) & DETACHED != 0 {
        if let Some(wake) = &push.wake {
            wake.notify_one();
        }
    }
    Pushed {
        plane: round.plane,
        state,
        outcome,
        config: round.config,
        pods: round.pods,
        token: round.token,
    }
}

fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The config-API addresses of a plane's pods, from the EndpointSlices of its headless Service:
/// ready or not (a pod becomes ready only once it has a config), but not terminating (a
/// draining pod needs no new routes, and counting it would report a rollout as a failure).
pub fn pod_addresses(slices: &[Arc<EndpointSlice>], port_name: &str) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = endpoints(slices, port_name)
        .map(|(address, _)| address)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Of [`pod_addresses`], those of pods not serving: not ready, whatever `ready` says (a
/// Service that publishes not-ready addresses, as the planes' do, has every endpoint `ready`;
/// `serving` is the pod's own readiness). Unknown counts as serving.
pub fn not_serving_addresses(slices: &[Arc<EndpointSlice>], port_name: &str) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = endpoints(slices, port_name)
        .filter(|(_, serving)| !*serving)
        .map(|(address, _)| address)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Every address on `port_name` of the slices' endpoints that are not terminating, with
/// whether the endpoint is serving (`serving`, else `ready`, else taken as serving).
fn endpoints<'s>(
    slices: &'s [Arc<EndpointSlice>],
    port_name: &'s str,
) -> impl Iterator<Item = (SocketAddr, bool)> + 's {
    slices.iter().flat_map(move |slice| {
        let port = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(port_name))
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok());
        port.into_iter().flat_map(move |port| {
            slice
                .endpoints
                .iter()
                .flatten()
                .filter(|endpoint| {
                    !endpoint
                        .conditions
                        .as_ref()
                        .and_then(|c| c.terminating)
                        .unwrap_or(false)
                })
                .flat_map(move |endpoint| {
                    let serving = endpoint
                        .conditions
                        .as_ref()
                        .and_then(|c| c.serving.or(c.ready))
                        .unwrap_or(true);
                    endpoint
                        .addresses
                        .iter()
                        .filter_map(move |a| a.parse().ok())
                        .map(move |ip| (SocketAddr::new(ip, port), serving))
                })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_addresses_take_every_pod_but_the_terminating_ones() {
        let slices: Vec<EndpointSlice> = serde_yaml_ng::from_str(
            r#"
- metadata: {name: a}
  addressType: IPv4
  ports: [{name: data, port: 8080}, {name: config, port: 8081}]
  endpoints:
  - {addresses: [10.0.0.1], conditions: {ready: true}}
  - {addresses: [10.0.0.2], conditions: {ready: false}}
  - {addresses: [10.0.0.3], conditions: {ready: false, terminating: true}}
  - {addresses: [10.0.0.4], conditions: {ready: true, serving: false}}
  - {addresses: [10.0.0.5], conditions: {ready: true, serving: true}}
  - {addresses: [not-an-ip]}
- metadata: {name: b}
  addressType: IPv6
  ports: [{name: config, port: 8081}]
  endpoints: [{addresses: ["fd00::1"]}, {addresses: [10.0.0.1]}]
- metadata: {name: other-port}
  addressType: IPv4
  ports: [{name: data, port: 8080}]
  endpoints: [{addresses: [10.0.0.9]}]
"#,
        )
        .expect("slices parse");
        let slices: Vec<Arc<EndpointSlice>> = slices.into_iter().map(Arc::new).collect();
        let got: Vec<String> = pod_addresses(&slices, "config")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            got,
            [
                "10.0.0.1:8081",
                "10.0.0.2:8081",
                "10.0.0.4:8081",
                "10.0.0.5:8081",
                "[fd00::1]:8081"
            ]
        );
        // Of those, the ones not serving: by `serving` where it is given (a Service publishing
        // not-ready addresses has every endpoint `ready`), else `ready`.
        let not_serving: Vec<String> = not_serving_addresses(&slices, "config")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(not_serving, ["10.0.0.2:8081", "10.0.0.4:8081"]);
    }
}
