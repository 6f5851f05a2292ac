//! Config pushes to the proxy pods of a data plane (`PUT /config` on each pod's config port).
//! A pod is pushed to only when it lacks the plane's current version; versions keep increasing
//! across controller restarts; a rotated token's predecessor is kept for pods not yet rolled;
//! a rule a pod refuses is left out and the rest pushed in the same round.
//! See docs/design/config-pushes.md.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::digest;
use bytes::Bytes;
use cftunnel_config::{Config, Rule};
use http_body_util::{BodyExt, Full, Limited};
use hyper::StatusCode;
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
/// How long a round waits for the pushes it starts before it goes on without them: pushes
/// to pods that answer take milliseconds.
pub const ROUND_WAIT: Duration = Duration::from_secs(1);
/// Planes pushed to at once; the pushes of others wait for a turn.
const CONCURRENT_PLANES: usize = 32;
/// Longest answer read from a pod (the proxy answers with small JSON objects).
const MAX_ANSWER: usize = 64 * 1024;
/// Longest document read back from a pod: the proxy's default limit on what it takes.
const MAX_DOCUMENT: usize = 32 * 1024 * 1024;
/// Pushes of a plane in one round after pods refused rules: each leaves out at least one more
/// rule; what is left for later rounds is pushed then.
const MAX_PASSES: usize = 8;
/// How long a refusal is remembered while the pod that refused stays: after it, the whole
/// document is offered again (the pod may have been upgraded in place to a release that takes
/// the rule).
const REFUSAL_MEMORY: Duration = Duration::from_secs(600);

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

/// A rule of the plane's document that a pod refused, left out of what the plane was pushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedRule {
    /// Its position in the document the round was given (not in the one pushed).
    pub rule: usize,
    /// Its `name` (`<namespace>/<route>/<rule>`).
    pub name: Option<String>,
    /// The pod that refused it.
    pub pod: SocketAddr,
    /// The pod's reason, naming the field (`rules[3].matches[0].path: ...`, position in the
    /// document the pod was pushed).
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
    /// Rounds in a row, this one included, in which some pod failed.
    pub failed_rounds: u32,
    /// `failed_rounds` reached the threshold, over the time the pusher asks for: report it
    /// (`ProxyConfigPushed=False`), a one-off blip (or a pod starting) does not.
    pub sustained_failure: bool,
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
}

impl PlaneOutcome {
    /// Every pod holds the current version.
    pub fn all_current(&self) -> bool {
        self.pods
            .iter()
            .all(|(_, o)| !matches!(o, PodOutcome::Failed(_)))
    }
}

#[derive(Clone)]
struct PlaneState {
    version: i64,
    digest: Vec<u8>,
    /// The document and rules `digest` was taken of: an unchanged document is not encoded
    /// and hashed again every round.
    digested: Option<(Arc<Config>, Vec<usize>)>,
    /// The round's document as last given, kept so an unchanged one is not copied again.
    input: Option<Arc<Config>>,
    failed_rounds: u32,
    /// When the plane's current run of failed rounds began.
    failing_since: Option<std::time::Instant>,
    /// The token the plane's pods were last pushed to with.
    token: String,
    /// The token before the last rotation. Pods started before it still hold it until the
    /// rollout replaces them; a pod that refuses the current token is tried with this one,
    /// so a rotation neither leaves old pods without route changes nor reads as a failure.
    previous_token: Option<String>,
    /// Rules a pod refused, by content, while that pod is one of the plane's.
    refusals: Vec<Refusal>,
}

impl PlaneState {
    fn new(version: i64, token: &str) -> Self {
        Self {
            version,
            digest: Vec::new(),
            digested: None,
            input: None,
            failed_rounds: 0,
            failing_since: None,
            token: token.to_owned(),
            previous_token: None,
            refusals: Vec::new(),
        }
    }
}

/// A remembered refusal: the rule as it was pushed, who refused it, why and when.
#[derive(Debug, Clone)]
struct Refusal {
    rule: Rule,
    pod: SocketAddr,
    reason: String,
    at: std::time::Instant,
}

impl std::fmt::Debug for PlaneState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlaneState")
            .field("version", &self.version)
            .field("failed_rounds", &self.failed_rounds)
            .finish_non_exhaustive()
    }
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

/// When a plane's failing pushes are reported: after `rounds` failed rounds in a row that
/// have lasted `lasting` as well.
#[derive(Debug, Clone, Copy)]
struct Sustained {
    rounds: u32,
    lasting: Duration,
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

    /// A round waits at most `wait` for the pushes it starts; `wake` is told when one it
    /// stopped waiting for finishes, so a round reports it.
    pub fn waiting_at_most(mut self, wait: Duration, wake: Arc<Notify>) -> Self {
        self.wait = Some(wait);
        self.wake = Some(wake);
        self
    }

    /// Brings every pod of `plane` to `config`, authenticating with `token`.
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
            token,
            pods,
        };
        let mut outcomes = self.sync_all(vec![round]).await;
        outcomes.pop().map_or_else(
            || PlaneOutcome {
                version: 0,
                pods: Vec::new(),
                refused: Vec::new(),
                failed_rounds: 0,
                sustained_failure: false,
                duration: std::time::Duration::ZERO,
                repeated: false,
                stale: false,
                token_refused: false,
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
            let config = match &state.input {
                Some(config) if **config == *round.config => Arc::clone(config),
                _ => Arc::new(round.config.clone()),
            };
            let owned = OwnedRound {
                plane: round.plane.clone(),
                config,
                token: round.token.to_owned(),
                pods: round.pods.to_vec(),
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
    pub token: &'a str,
    pub pods: &'a [SocketAddr],
}

/// A [`PlaneRound`] its task owns.
struct OwnedRound {
    plane: PlaneKey,
    config: Arc<Config>,
    token: String,
    pods: Vec<SocketAddr>,
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
    let (mut state, mut outcome) =
        sync_plane(state, &round, push.now, push.timeout, push.sustained).await;
    outcome.duration = started.elapsed();
    record_outcome(&span, &outcome);
    state.input = Some(Arc::clone(&round.config));
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

async fn sync_plane(
    mut state: PlaneState,
    round: &OwnedRound,
    now: i64,
    timeout: Duration,
    sustained: Sustained,
) -> (PlaneState, PlaneOutcome) {
    if state.token != round.token {
        state.previous_token = Some(std::mem::replace(&mut state.token, round.token.clone()));
    }
    // A refusal holds while the pod that refused stays, and for a while: a rollout (which
    // replaces that pod), or time, may bring a release that takes the rule. Pods that come and
    // go beside it (an autoscaler at work) do not make the plane find it out again.
    state
        .refusals
        .retain(|r| round.pods.contains(&r.pod) && r.at.elapsed() < REFUSAL_MEMORY);
    let rules = &round.config.rules;
    // The rules pushed, by their position in the round's document.
    let mut kept: Vec<usize> = (0..rules.len())
        .filter(|&i| !state.refusals.iter().any(|r| r.rule == rules[i]))
        .collect();
    let mut passes = 0;
    let (version, pods, previous_needed, token_refused) = loop {
        passes += 1;
        let document = || Config {
            version: 0,
            rules: kept.iter().map(|&i| rules[i].clone()).collect(),
            has_grpc_route: round.config.has_grpc_route,
        };
        let digested = state
            .digested
            .as_ref()
            .is_some_and(|(config, of)| Arc::ptr_eq(config, &round.config) && *of == kept);
        if !digested {
            let digest = config_digest(&document());
            if state.digest != digest {
                state.version = state.version.saturating_add(1).max(now);
                state.digest = digest;
            }
            state.digested = Some((Arc::clone(&round.config), kept.clone()));
        }
        let client = Client {
            token: &round.token,
            previous_token: state.previous_token.as_deref(),
            timeout,
        };
        let sent = push_document(&client, &mut state.version, document, &round.pods).await;
        let mut left_out = BTreeSet::new();
        let pods: Vec<(SocketAddr, PodOutcome)> = sent
            .puts
            .into_iter()
            .map(|(pod, put)| match put {
                Put::Current => (pod, PodOutcome::Current),
                Put::Pushed => (pod, PodOutcome::Pushed),
                Put::Failed(reason) => (pod, PodOutcome::Failed(reason)),
                Put::Refused { rule, reason } => {
                    if passes < MAX_PASSES {
                        if let Some(&i) = kept.get(rule) {
                            if left_out.insert(i) {
                                state.refusals.push(Refusal {
                                    rule: rules[i].clone(),
                                    pod,
                                    reason: reason.clone(),
                                    at: std::time::Instant::now(),
                                });
                            }
                        }
                    }
                    (pod, PodOutcome::Failed(reason))
                }
            })
            .collect();
        if left_out.is_empty() {
            break (sent.version, pods, sent.previous_needed, sent.token_refused);
        }
        tracing::warn!(
            plane = %round.plane,
            rules = left_out.len(),
            "proxy pods refused rules; pushing the document without them"
        );
        kept.retain(|i| !left_out.contains(i));
    };
    let refused = state
        .refusals
        .iter()
        .filter_map(|r| {
            let rule = rules.iter().position(|x| *x == r.rule)?;
            Some(RefusedRule {
                rule,
                name: r.rule.name.clone(),
                pod: r.pod,
                reason: r.reason.clone(),
            })
        })
        .collect();
    let mut outcome = finish(&mut state, sustained, version, pods);
    outcome.refused = refused;
    outcome.token_refused = token_refused;
    // Every pod took the current token: the rollout is over, and the one before is
    // forgotten rather than offered to whatever answers at a pod's address later.
    if !previous_needed && outcome.all_current() {
        state.previous_token = None;
    }
    (state, outcome)
}

/// What one pod did with one push.
enum Put {
    Current,
    Pushed,
    Failed(String),
    /// It refused the rule at this position of the document it was pushed.
    Refused {
        rule: usize,
        reason: String,
    },
}

/// What [`push_document`] did.
struct Sent {
    /// The version pushed.
    version: i64,
    puts: Vec<(SocketAddr, Put)>,
    /// A pod still takes only the token before the last rotation.
    previous_needed: bool,
    /// A pod refused every token the plane has.
    token_refused: bool,
}

/// Pushes the document `document` makes to every pod that lacks it; `version` is raised past
/// any newer one a pod holds. The document is made and encoded only when some pod lacks it.
async fn push_document(
    client: &Client<'_>,
    version: &mut i64,
    document: impl FnOnce() -> Config,
    pods: &[SocketAddr],
) -> Sent {
    let observed =
        futures_util::future::join_all(pods.iter().map(|&pod| client.version(pod))).await;
    // A pod ahead of us holds a push from an earlier controller: go past it.
    if let Some(ahead) = observed
        .iter()
        .filter_map(|v| v.as_ref().ok().map(|(v, _)| *v))
        .filter(|&v| v > *version)
        .max()
    {
        *version = ahead.saturating_add(1);
    }
    let version = *version;
    let mut sent = Sent {
        version,
        puts: Vec::new(),
        previous_needed: observed
            .iter()
            .any(|v| matches!(v, Ok((_, token)) if *token != client.token)),
        token_refused: observed
            .iter()
            .any(|v| matches!(v, Err(u) if u.token_refused)),
    };
    let behind = |v: &Result<(i64, &str), Unreached>| matches!(v, Ok((v, _)) if *v != version);
    if !observed.iter().any(behind) {
        sent.puts = pods
            .iter()
            .zip(observed)
            .map(|(&pod, observed)| match observed {
                Ok(_) => (pod, Put::Current),
                Err(unreached) => (pod, Put::Failed(unreached.reason)),
            })
            .collect();
        return sent;
    }
    let mut doc = document();
    doc.version = version;
    let body = match serde_json::to_vec(&doc) {
        Ok(body) => Bytes::from(body),
        Err(e) => {
            let reason = format!("encoding the config: {e}");
            sent.puts = pods
                .iter()
                .map(|&p| (p, Put::Failed(reason.clone())))
                .collect();
            return sent;
        }
    };
    let doc = &doc;
    sent.puts =
        futures_util::future::join_all(pods.iter().zip(observed).map(|(&pod, observed)| {
            let body = body.clone();
            async move {
                let put = match observed {
                    Ok((v, _)) if v == version => Put::Current,
                    Ok((_, token)) => client.put(pod, body, token, doc).await,
                    Err(unreached) => Put::Failed(unreached.reason),
                };
                (pod, put)
            }
        }))
        .await;
    sent
}

fn finish(
    state: &mut PlaneState,
    sustained: Sustained,
    version: i64,
    pods: Vec<(SocketAddr, PodOutcome)>,
) -> PlaneOutcome {
    let failed = pods.iter().any(|(_, o)| matches!(o, PodOutcome::Failed(_)));
    if failed {
        state.failed_rounds = state.failed_rounds.saturating_add(1);
        state
            .failing_since
            .get_or_insert_with(std::time::Instant::now);
    } else {
        state.failed_rounds = 0;
        state.failing_since = None;
    }
    let lasted = state
        .failing_since
        .is_some_and(|since| since.elapsed() >= sustained.lasting);
    PlaneOutcome {
        version,
        pods,
        refused: Vec::new(),
        failed_rounds: state.failed_rounds,
        sustained_failure: state.failed_rounds >= sustained.rounds && lasted,
        duration: std::time::Duration::ZERO,
        repeated: false,
        stale: false,
        token_refused: false,
    }
}

/// The config's identity without its version, so an unchanged config keeps its version.
fn config_digest(config: &Config) -> Vec<u8> {
    let mut unversioned = config.clone();
    unversioned.version = 0;
    let encoded = serde_json::to_vec(&unversioned).unwrap_or_default();
    digest::digest(&digest::SHA256, &encoded).as_ref().to_vec()
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
    let mut out = Vec::new();
    for slice in slices {
        let Some(port) = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(port_name))
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for endpoint in slice.endpoints.iter().flatten() {
            if endpoint
                .conditions
                .as_ref()
                .and_then(|c| c.terminating)
                .unwrap_or(false)
            {
                continue;
            }
            for address in &endpoint.addresses {
                if let Ok(ip) = address.parse() {
                    out.push(SocketAddr::new(ip, port));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The document `pod` serves, as it was pushed (`GET /config/document`), its config API behind
/// `token`: for a plane whose last config this controller never saw pushed (it started, or
/// took the lead, after the plane's configuration broke).
///
/// # Errors
/// The pod does not answer, refuses, has no document, or answers something else.
pub async fn served_document(
    pod: SocketAddr,
    token: &str,
    timeout: Duration,
) -> Result<Config, String> {
    let client = Client {
        token,
        previous_token: None,
        timeout,
    };
    let (status, body) = client
        .call(
            pod,
            hyper::Method::GET,
            "/config/document",
            Bytes::new(),
            token,
        )
        .await?;
    if status != StatusCode::OK {
        return Err(refusal("GET /config/document", status, &body));
    }
    serde_json::from_slice(&body).map_err(|e| format!("GET /config/document: unreadable: {e}"))
}

/// One request at a time to a pod's config API, each on its own connection: pushes are rare,
/// and a fresh connection never hits one the pod has half-closed.
struct Client<'a> {
    token: &'a str,
    previous_token: Option<&'a str>,
    timeout: Duration,
}

/// Why a pod's version could not be read.
struct Unreached {
    reason: String,
    /// It refused every token the plane has.
    token_refused: bool,
}

impl Unreached {
    fn other(reason: String) -> Self {
        Self {
            reason,
            token_refused: false,
        }
    }
}

#[derive(serde::Deserialize)]
struct ConfigState {
    version: i64,
}

impl<'a> Client<'a> {
    /// The pod's version, and the token it takes: the current one, else the one before the
    /// last rotation.
    async fn version(&self, pod: SocketAddr) -> Result<(i64, &'a str), Unreached> {
        let mut token = self.token;
        let (mut status, mut body) = self
            .call(pod, hyper::Method::GET, "/config", Bytes::new(), token)
            .await
            .map_err(Unreached::other)?;
        if let (StatusCode::UNAUTHORIZED, Some(previous)) = (status, self.previous_token) {
            token = previous;
            (status, body) = self
                .call(pod, hyper::Method::GET, "/config", Bytes::new(), token)
                .await
                .map_err(Unreached::other)?;
        }
        if status != StatusCode::OK {
            return Err(Unreached {
                reason: refusal("GET /config", status, &body),
                token_refused: status == StatusCode::UNAUTHORIZED,
            });
        }
        serde_json::from_slice::<ConfigState>(&body)
            .map(|s| (s.version, token))
            .map_err(|e| Unreached::other(format!("GET /config: unreadable answer: {e}")))
    }

    async fn put(&self, pod: SocketAddr, body: Bytes, token: &str, doc: &Config) -> Put {
        match self
            .call(pod, hyper::Method::PUT, "/config", body, token)
            .await
        {
            Err(reason) => Put::Failed(reason),
            Ok((StatusCode::OK, _)) => Put::Pushed,
            Ok((StatusCode::BAD_REQUEST, answer)) => match refused_rule(&answer, doc) {
                Some((rule, reason)) => Put::Refused {
                    rule,
                    reason: format!("PUT /config: {reason}"),
                },
                None => Put::Failed(refusal("PUT /config", StatusCode::BAD_REQUEST, &answer)),
            },
            Ok((status, answer)) => Put::Failed(refusal("PUT /config", status, &answer)),
        }
    }

    async fn call(
        &self,
        pod: SocketAddr,
        method: hyper::Method,
        path: &'static str,
        body: Bytes,
        token: &str,
    ) -> Result<(StatusCode, Bytes), String> {
        let span = tracing::info_span!(
            "config.api",
            otel.name = %format_args!("{method} {path}"),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
            http.request.method = %method,
            server.address = %pod.ip(),
            server.port = i64::from(pod.port()),
            http.response.status_code = tracing::field::Empty,
        );
        let result = self
            .exchange(pod, method, path, body, token)
            .instrument(span.clone())
            .await;
        match &result {
            Ok((status, _)) => {
                span.record("http.response.status_code", i64::from(status.as_u16()));
                if status.as_u16() >= 400 {
                    span.record("otel.status_code", "error");
                }
            }
            Err(reason) => {
                span.record("otel.status_code", "error");
                span.record("otel.status_description", reason.as_str());
            }
        }
        result
    }

    async fn exchange(
        &self,
        pod: SocketAddr,
        method: hyper::Method,
        path: &'static str,
        body: Bytes,
        token: &str,
    ) -> Result<(StatusCode, Bytes), String> {
        // Answers are small JSON objects, but for the document itself.
        let limit = if path == "/config/document" {
            MAX_DOCUMENT
        } else {
            MAX_ANSWER
        };
        let exchange = async {
            let stream = tokio::net::TcpStream::connect(pod)
                .await
                .map_err(|e| format!("connecting to {pod}: {e}"))?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .map_err(|e| format!("{pod}: {e}"))?;
            tokio::spawn(conn);
            let req = hyper::Request::builder()
                .method(method)
                .uri(path)
                .header(hyper::header::HOST, pod.to_string())
                .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(Full::new(body))
                .map_err(|e| format!("building the request: {e}"))?;
            let res = sender
                .send_request(req)
                .await
                .map_err(|e| format!("{pod}: {e}"))?;
            let status = res.status();
            let body = Limited::new(res.into_body(), limit)
                .collect()
                .await
                .map_err(|e| format!("{pod}: reading the answer: {e}"))?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| format!("{pod}: no answer within {:?}", self.timeout))?
    }
}

/// The rule a 400 names, by its position in `doc`, and the pod's reason. The proxy names it
/// in `rule` (and `name`, checked against the document, so an answer about another document is
/// not taken for one about this); a proxy of an earlier release, or one that could not read a
/// rule at all (an unknown filter type), names it only at the start of `error`
/// (`rules[3].filters[0].type: ...`, possibly after `invalid JSON: `).
fn refused_rule(answer: &[u8], doc: &Config) -> Option<(usize, String)> {
    let answer: serde_json::Value = serde_json::from_slice(answer).ok()?;
    let error = answer.get("error")?.as_str()?.to_owned();
    let rule = match answer.get("rule").and_then(serde_json::Value::as_u64) {
        Some(rule) => usize::try_from(rule).ok()?,
        None => {
            let field = error.strip_prefix("invalid JSON: ").unwrap_or(&error);
            let index = field.strip_prefix("rules[")?.split_once(']')?.0;
            index.parse().ok()?
        }
    };
    let pushed = doc.rules.get(rule)?;
    if let Some(name) = answer.get("name").and_then(serde_json::Value::as_str) {
        if pushed.name.as_deref() != Some(name) {
            return None;
        }
    }
    Some((rule, error))
}

fn refusal(what: &str, status: StatusCode, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match status {
        StatusCode::UNAUTHORIZED => format!("{what}: the pod refused the config-API token (401)"),
        _ if text.is_empty() => format!("{what}: {status}"),
        _ => format!("{what}: {status}: {text}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_its_rule_by_position_and_name_or_by_the_field_alone() {
        let rule = |name: &str| Rule {
            name: Some(name.to_owned()),
            ..Rule::default()
        };
        let doc = Config {
            rules: vec![rule("a/r/0"), rule("a/r/1")],
            ..Config::default()
        };
        let named = br#"{"error": "rules[1].matches[0].path: regex does not compile", "field": "rules[1].matches[0].path", "rule": 1, "name": "a/r/1"}"#;
        assert_eq!(
            refused_rule(named, &doc),
            Some((
                1,
                "rules[1].matches[0].path: regex does not compile".to_owned()
            ))
        );
        // An answer about another document is not taken for one about this.
        let other = br#"{"error": "rules[1].x: y", "rule": 1, "name": "b/r/1"}"#;
        assert_eq!(refused_rule(other, &doc), None);
        // An earlier release names the rule only in its message, also for a rule it could
        // not read at all.
        let older =
            br#"{"error": "invalid JSON: rules[0].filters[0].type: unknown variant `CORS`"}"#;
        assert_eq!(refused_rule(older, &doc).map(|(i, _)| i), Some(0));
        for unnamed in [
            &br#"{"error": "invalid JSON: expected value at line 1"}"#[..],
            br#"{"error": "rules[7].x: beyond the document"}"#,
            br#"not json"#,
        ] {
            assert_eq!(refused_rule(unnamed, &doc), None);
        }
    }

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
        assert_eq!(got, ["10.0.0.1:8081", "10.0.0.2:8081", "[fd00::1]:8081"]);
    }
}
