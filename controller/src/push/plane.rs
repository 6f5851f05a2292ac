//! One plane's push: its document's version (which changes only with its content), the rules
//! its pods refused (left out, and remembered while those pods stay), and the rounds in a row
//! it has failed.

use std::collections::{BTreeSet, HashSet};
use std::hash::{BuildHasher as _, BuildHasherDefault, DefaultHasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lc_rs::digest;
use bytes::Bytes;
use cftunnel_config::valid::regex_values;
use cftunnel_config::{Config, Rule};
use futures_util::StreamExt as _;

use super::client::{Client, Put};
use super::{OwnedRound, PlaneOutcome, PodOutcome, RefusedRule};

/// Pushes of a plane in one round after pods refused rules: each leaves out at least one more
/// rule; what is left for later rounds is pushed then.
const MAX_PASSES: usize = 8;
/// Pods asked at once for their version, by a plane that does not know what they serve (see
/// [`newest_served`]).
const VERSIONS_ASKED_AT_ONCE: usize = 16;
/// Pods asked in turn for the document they serve, newest first (each answer may be a large
/// document), by a plane that does not know.
const SERVED_ASKED: usize = 4;
/// How long a refusal is remembered while the pod that refused stays: after it, the whole
/// document is offered again (the pod may have been upgraded in place to a release that takes
/// the rule).
const REFUSAL_MEMORY: Duration = Duration::from_secs(600);

#[derive(Clone)]
pub(super) struct PlaneState {
    version: i64,
    digest: Vec<u8>,
    /// The document and rules `digest` was taken of: an unchanged document is not encoded
    /// and hashed again every round.
    digested: Option<(Arc<Config>, Vec<usize>)>,
    failed_rounds: u32,
    /// When the plane's current run of failed rounds began.
    failing_since: Option<std::time::Instant>,
    /// When the plane's current stretch of rounds with no pod listed began.
    podless_since: Option<std::time::Instant>,
    /// The token the plane's pods were last pushed to with.
    token: String,
    /// The token before the last rotation. Pods started before it still hold it until the
    /// rollout replaces them; a pod that refuses the current token is tried with this one,
    /// so a rotation neither leaves old pods without route changes nor reads as a failure.
    previous_token: Option<String>,
    /// Rules a pod refused, by content, while that pod is one of the plane's.
    refusals: Vec<Refusal>,
    /// The rules (by [`rule_key`]) of the last document every pod took: a document grown
    /// past what the pods take loses the rules they do not serve yet first.
    accepted: HashSet<u64>,
    /// The regexes (by [`source_key`]) of that document: one past the regex budget loses the
    /// rules naming a regex the pods do not hold yet first (a rule edited in place to a new
    /// regex among them). `None` until known: a plane past the budget asks its pods then.
    held: Option<HashSet<u64>>,
}

impl PlaneState {
    /// Since when the plane has had no pod listed, while it has none.
    pub(super) fn podless_since(&self) -> Option<std::time::Instant> {
        self.podless_since
    }

    /// The document the last push was given (the one its digest was taken of).
    pub(super) fn pushed_from(&self) -> Option<&Arc<Config>> {
        self.digested.as_ref().map(|(config, _)| config)
    }

    pub(super) fn new(version: i64, token: &str) -> Self {
        Self {
            version,
            digest: Vec::new(),
            digested: None,
            failed_rounds: 0,
            failing_since: None,
            podless_since: None,
            token: token.to_owned(),
            previous_token: None,
            refusals: Vec::new(),
            accepted: HashSet::new(),
            held: None,
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

/// When a plane's failing pushes are reported: after `rounds` failed rounds in a row that
/// have lasted `lasting` as well.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sustained {
    pub(super) rounds: u32,
    pub(super) lasting: Duration,
    /// How long rounds with no pod listed keep a run of failures going (see [`finish`]).
    pub(super) podless: Duration,
}

pub(super) async fn sync_plane(
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
    let (held, mut rechecked): (Vec<Refusal>, Vec<Refusal>) = std::mem::take(&mut state.refusals)
        .into_iter()
        .partition(|r| round.pods.contains(&r.pod) && r.at.elapsed() < REFUSAL_MEMORY);
    state.refusals = held;
    let rules = &round.config.rules;
    // The rules pushed, by their position in the round's document.
    let mut kept: Vec<usize> = (0..rules.len())
        .filter(|&i| !state.refusals.iter().any(|r| r.rule == rules[i]))
        .collect();
    // Past the regex budget, the rules naming a regex the pods do not hold yet go first, then
    // those whose going frees most: left to the pods, the rule that crosses it in document
    // order would be refused, which may be another tenant's serving one.
    let mut over_budget = round
        .costs
        .cut(&kept, |i| holds(state.held.as_ref(), &rules[i]));
    // A controller that has not pushed to the pods yet (it started, or took the lead) asks
    // them what they serve, once a round; with no answer, it asks again next round.
    let mut asked_served = false;
    if !over_budget.is_empty() && state.held.is_none() {
        asked_served = true;
        let client = Client {
            token: &round.token,
            previous_token: state.previous_token.as_deref(),
            timeout,
        };
        if let Some(served) = newest_served(&client, &round.pods).await {
            if state.accepted.is_empty() {
                state.accepted = served.rules.iter().map(rule_key).collect();
            }
            state.held = Some(held_regexes(served.rules.iter()));
            over_budget = round
                .costs
                .cut(&kept, |i| holds(state.held.as_ref(), &rules[i]));
        }
    }
    if !over_budget.is_empty() {
        // The total is left out of each rule's reason, which would move with other rules.
        tracing::debug!(
            plane = %round.plane,
            regexes_take = round.costs.total(&kept),
            rules = over_budget.len(),
            "past the regex budget: rules left out"
        );
    }
    kept.retain(|i| over_budget.binary_search_by_key(i, |&(at, _)| at).is_err());
    let mut passes = 0;
    let (version, pods, previous_needed, token_refused, down, cut_off, answered) = loop {
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
        // A controller that has not pushed to the pods yet (it started, or took the lead)
        // and finds the document too large asks what they serve.
        let too_large = sent
            .puts
            .iter()
            .any(|(_, put)| matches!(put, Put::TooLarge { .. }));
        if too_large && state.accepted.is_empty() && !asked_served {
            asked_served = true;
            if let Some(served) = newest_served(&client, &round.pods).await {
                state.accepted = served.rules.iter().map(rule_key).collect();
            }
        }
        let mut left_out = BTreeSet::new();
        let refusals = &mut state.refusals;
        // The rule at `i` of the round's document goes, remembered as `pod`'s refusal.
        let mut leave_out = |i: usize, pod: SocketAddr, reason: &str| {
            if left_out.insert(i) {
                refusals.push(Refusal {
                    rule: rules[i].clone(),
                    pod,
                    reason: reason.to_owned(),
                    at: std::time::Instant::now(),
                });
            }
        };
        // A pod answered the push (took it, held it, or refused it): what the pods refuse is
        // heard of.
        let answered = sent
            .puts
            .iter()
            .any(|(_, put)| !matches!(put, Put::Failed(_)));
        let accepted = &state.accepted;
        let mut cut = false;
        // A pod refused a rule that is not left out: past the last pass, or not named.
        let mut refusing = false;
        let pods: Vec<(SocketAddr, PodOutcome)> = sent
            .puts
            .into_iter()
            .map(|(pod, put)| match put {
                Put::Current => (pod, PodOutcome::Current),
                Put::Pushed => (pod, PodOutcome::Pushed),
                Put::Failed(reason) => (pod, PodOutcome::Failed(reason)),
                // Too large: rules go as refused ones do, those the pods do not serve yet
                // first, then the largest, until it fits; so one tenant's growth costs that
                // tenant's new rules, not another's serving ones or every tenant's updates.
                Put::TooLarge { limit, reason } => {
                    refusing |= passes >= MAX_PASSES;
                    if passes < MAX_PASSES && !cut {
                        cut = true;
                        let note = format!(
                            "{reason}: the plane's document is larger than its pods take; rules they do not serve yet go first, then the largest, until it fits"
                        );
                        for i in fitting_cut(rules, &kept, limit, accepted) {
                            leave_out(i, pod, &note);
                        }
                    }
                    (pod, PodOutcome::Failed(reason))
                }
                Put::Refused { rule, reason } => {
                    match kept.get(rule) {
                        Some(&i) if passes < MAX_PASSES => leave_out(i, pod, &reason),
                        _ => refusing = true,
                    }
                    (pod, PodOutcome::Failed(reason))
                }
            })
            .collect();
        if left_out.is_empty() {
            break (
                sent.version,
                pods,
                sent.previous_needed,
                sent.token_refused,
                sent.down,
                refusing,
                answered,
            );
        }
        tracing::warn!(
            plane = %round.plane,
            rules = left_out.len(),
            "proxy pods refused rules; pushing the document without them"
        );
        kept.retain(|i| !left_out.contains(i));
    };
    let pushed = pods.iter().any(|(_, o)| *o == PodOutcome::Pushed);
    let idle: Vec<SocketAddr> = down
        .into_iter()
        .filter(|pod| round.not_serving.contains(pod))
        .collect();
    let mut outcome = finish(&mut state, sustained, version, pods, &idle);
    // Cut off, the round decided only the refusals it found; with none of the pods listed
    // answering its last push (a pod replaced by one not up yet), or none listed for a while
    // (a pod gone before its successor is listed), it decided none: those it set out to check
    // again and did not reach stand as they were (the next round checks them), rather than go
    // for a round and come back. Scaled to zero, the plane refuses nothing.
    if cut_off || (!answered && !outcome.scaled_to_zero) {
        rechecked.retain(|r| !state.refusals.iter().any(|found| found.rule == r.rule));
        state.refusals.append(&mut rechecked);
    }
    let refused = state
        .refusals
        .iter()
        .filter_map(|r| {
            let rule = rules.iter().position(|x| *x == r.rule)?;
            Some(RefusedRule {
                rule,
                name: r.rule.name.clone(),
                pod: Some(r.pod),
                reason: r.reason.clone(),
            })
        })
        .chain(over_budget.into_iter().map(|(rule, why)| RefusedRule {
            rule,
            name: rules[rule].name.clone(),
            pod: None,
            reason: why.to_string(),
        }))
        .collect();
    // A plane with no pods took nothing: what it holds stays unknown.
    if outcome.all_current() && !outcome.pods.is_empty() && (pushed || state.accepted.is_empty()) {
        state.accepted = kept.iter().map(|&i| rule_key(&rules[i])).collect();
        state.held = Some(held_regexes(kept.iter().map(|&i| &rules[i])));
    }
    outcome.refused = refused;
    // Every pod listed answered (the idle aside, while one is up): a round not cut off found
    // all they refuse. One cut off found part; one that not every pod answers carries what
    // earlier rounds found, which may be such a part.
    let answered_all = !outcome.pods.is_empty()
        && !super::all_idle(&outcome.pods, &idle)
        && outcome
            .pods
            .iter()
            .all(|(pod, o)| !matches!(o, PodOutcome::Failed(_)) || idle.contains(pod));
    outcome.refusals_known = !cut_off && (answered_all || outcome.scaled_to_zero);
    outcome.refusals_heard = !cut_off && answered;
    outcome.token_refused = token_refused;
    outcome.idle = idle;
    // Every pod took the current token: the rollout is over, and the one before is
    // forgotten rather than offered to whatever answers at a pod's address later.
    if !previous_needed && outcome.all_current() {
        state.previous_token = None;
    }
    (state, outcome)
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
    /// Pods whose config port refused the connection.
    down: Vec<SocketAddr>,
}

/// Pushes the document `document` makes to every pod that lacks it; `version` is raised past
/// any newer one a pod holds. The document is made and encoded only when some pod lacks it.
///
/// Each pod goes from its version to its push on its own: one that takes connections and
/// never answers holds up no other pod of the plane. A pod found ahead raises the version for
/// the pods after it; those pushed (or found current) before at a lower one are pushed the
/// raised version once all have answered, so every pod ends on one version. A pod is ahead
/// only after another controller's pushes, so that second push is rare.
async fn push_document(
    client: &Client<'_>,
    version: &mut i64,
    document: impl FnOnce() -> Config,
    pods: &[SocketAddr],
) -> Sent {
    let ours = *version;
    let raised = AtomicI64::new(ours);
    let bodies = Mutex::new(Bodies {
        make: Some(document),
        document: None,
        encoded: Vec::new(),
    });
    let push = |pod, token, at| put_at(client, &bodies, pod, token, at);
    // Per pod: the token it takes, the version it was brought to (or found at), and how.
    let reached = futures_util::future::join_all(pods.iter().map(|&pod| {
        let (raised, push) = (&raised, &push);
        async move {
            let (held, token) = match client.version(pod).await {
                Ok(observed) => observed,
                Err(unreached) => return (pod, Err(unreached)),
            };
            // A pod ahead of us holds a push from an earlier controller: go past it. So does
            // one at a version raised to past another's: that version is not ours either.
            // (No await between the load and the store: the pods' futures take turns.)
            let at = raised.load(Ordering::SeqCst);
            if held > at || (held == at && at != ours) {
                raised.store(held.saturating_add(1), Ordering::SeqCst);
            }
            let at = raised.load(Ordering::SeqCst);
            let put = if held == at {
                Put::Current
            } else {
                push(pod, token, at).await
            };
            (pod, Ok((token, at, put)))
        }
    }))
    .await;
    *version = raised.load(Ordering::SeqCst);
    let version = *version;
    let mut sent = Sent {
        version,
        puts: Vec::new(),
        previous_needed: reached
            .iter()
            .any(|(_, r)| matches!(r, Ok((token, _, _)) if *token != client.token)),
        token_refused: reached
            .iter()
            .any(|(_, r)| matches!(r, Err(u) if u.token_refused)),
        down: reached
            .iter()
            .filter(|(_, r)| matches!(r, Err(u) if u.down))
            .map(|(pod, _)| *pod)
            .collect(),
    };
    sent.puts = futures_util::future::join_all(reached.into_iter().map(|(pod, reached)| {
        let push = &push;
        async move {
            let put = match reached {
                // At a version since raised by a pod found ahead: brought to the raised one.
                Ok((token, at, Put::Current | Put::Pushed)) if at != version => {
                    push(pod, token, version).await
                }
                Ok((_, _, put)) => put,
                Err(unreached) => Put::Failed(unreached.reason),
            };
            (pod, put)
        }
    }))
    .await;
    sent
}

/// Pushes `pod` the document at version `at`, with `token`.
async fn put_at<F: FnOnce() -> Config>(
    client: &Client<'_>,
    bodies: &Mutex<Bodies<F>>,
    pod: SocketAddr,
    token: &str,
    at: i64,
) -> Put {
    let encoded = bodies
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .at(at);
    match encoded {
        Ok((doc, body)) => client.put(pod, body, token, &doc).await,
        Err(reason) => Put::Failed(reason),
    }
}

/// The plane's document, made when a pod first lacks it, and its encodings at the versions
/// pushed (one, but after a pod found ahead).
struct Bodies<F> {
    make: Option<F>,
    /// At the first version encoded; the rules are what a refusal's position is read against.
    document: Option<Arc<Config>>,
    encoded: Vec<(i64, Bytes)>,
}

impl<F: FnOnce() -> Config> Bodies<F> {
    /// The document, and its encoding at `version`.
    fn at(&mut self, version: i64) -> Result<(Arc<Config>, Bytes), String> {
        let encode = |doc: &Config| {
            serde_json::to_vec(doc)
                .map(Bytes::from)
                .map_err(|e| format!("encoding the config: {e}"))
        };
        let (doc, body) = match (&self.document, self.make.take()) {
            (Some(doc), _) => {
                if let Some((_, body)) = self.encoded.iter().find(|(v, _)| *v == version) {
                    return Ok((Arc::clone(doc), body.clone()));
                }
                // Another version (a pod was found ahead): rare, so copied.
                let mut other = Config::clone(doc);
                other.version = version;
                (Arc::clone(doc), encode(&other)?)
            }
            (None, Some(make)) => {
                let mut doc = make();
                doc.version = version;
                let body = encode(&doc)?;
                let doc = Arc::new(doc);
                self.document = Some(Arc::clone(&doc));
                (doc, body)
            }
            (None, None) => return Err("encoding the config: no document".to_owned()),
        };
        self.encoded.push((version, body.clone()));
        Ok((doc, body))
    }
}

fn finish(
    state: &mut PlaneState,
    sustained: Sustained,
    version: i64,
    pods: Vec<(SocketAddr, PodOutcome)>,
    idle: &[SocketAddr],
) -> PlaneOutcome {
    // A pod that serves nothing makes no failure sustained while another holds the config
    // (a pod down in a rollout); every pod down is (see `PlaneOutcome::all_down`).
    let failed = super::all_idle(&pods, idle)
        || pods
            .iter()
            .any(|(pod, o)| matches!(o, PodOutcome::Failed(_)) && !idle.contains(pod));
    // A round with no pod listed (a pod gone before its successor is listed) reaches none: for
    // a while it neither ends a run of failures nor lengthens it (the time without pods does
    // not count towards how long the run has lasted); past that (scaled to zero) it ends it,
    // as nothing is pushed that could fail.
    if !pods.is_empty() {
        if let Some(gap) = state.podless_since.take().map(|since| since.elapsed()) {
            if gap >= sustained.podless {
                state.failed_rounds = 0;
                state.failing_since = None;
            } else if let Some(since) = state.failing_since {
                state.failing_since = Some(since.checked_add(gap).unwrap_or(since));
            }
        }
    }
    let mut scaled_to_zero = false;
    if pods.is_empty() {
        let since = *state
            .podless_since
            .get_or_insert_with(std::time::Instant::now);
        scaled_to_zero = since.elapsed() >= sustained.podless;
        if scaled_to_zero {
            state.failed_rounds = 0;
            state.failing_since = None;
        }
    } else if failed {
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
        failed_rounds: state.failed_rounds,
        // A round that reached no pod failed nothing of its own.
        sustained_failure: !pods.is_empty() && state.failed_rounds >= sustained.rounds && lasted,
        failing_for: state
            .failing_since
            .filter(|_| !pods.is_empty())
            .map(|since| since.elapsed())
            .unwrap_or_default(),
        pods,
        refused: Vec::new(),
        refusals_known: false,
        refusals_heard: false,
        scaled_to_zero,
        duration: std::time::Duration::ZERO,
        repeated: false,
        stale: false,
        token_refused: false,
        idle: Vec::new(),
    }
}

/// Room a cut leaves below a pod's limit, as a share of it: the document's own fields and
/// a little growth.
const CUT_MARGIN: usize = 64;

/// The positions (in `rules`) of the rules of `kept` a document too large for its pods
/// leaves out: those not in `accepted` (the pods serve none of that name yet) first, then the
/// largest, until what is left fits `limit` (one rule when the pod named no limit).
fn fitting_cut(
    rules: &[Rule],
    kept: &[usize],
    limit: Option<usize>,
    accepted: &HashSet<u64>,
) -> Vec<usize> {
    let mut sized: Vec<(usize, usize, bool)> = kept
        .iter()
        .map(|&i| {
            let bytes = serde_json::to_vec(&rules[i]).map_or(0, |v| v.len()) + 1;
            (i, bytes, accepted.contains(&rule_key(&rules[i])))
        })
        .collect();
    let total: usize = sized.iter().map(|&(_, bytes, _)| bytes).sum();
    let mut over = match limit {
        Some(limit) => total.saturating_sub(limit - limit / CUT_MARGIN).max(1),
        None => 1,
    };
    sized.sort_by_key(|&(i, bytes, served)| (served, std::cmp::Reverse(bytes), i));
    let mut cut = Vec::new();
    for (i, bytes, _) in sized {
        if over == 0 {
            break;
        }
        cut.push(i);
        over = over.saturating_sub(bytes);
    }
    cut
}

/// A rule's identity across pushes: its name (`<ns>/<route>/<rule>`), so a rule edited in
/// place is still one the pods serve; its content when it has none.
fn rule_key(rule: &Rule) -> u64 {
    let hasher = BuildHasherDefault::<DefaultHasher>::default();
    match &rule.name {
        Some(name) => hasher.hash_one(name),
        None => hasher.hash_one(rule),
    }
}

/// The document the pod holding the newest version serves (versions only grow with the
/// content pushed), or, if it does not answer, the next newest's; the first few only. Every
/// pod's version is read first, a small answer each: a pod whose pushes had been failing holds
/// an older document, and going by it would make the rules added since look new.
async fn newest_served(client: &Client<'_>, pods: &[SocketAddr]) -> Option<Config> {
    let answers: Vec<_> = futures_util::stream::iter(pods.iter().copied())
        .map(|pod| async move { (pod, client.version(pod).await) })
        .buffer_unordered(VERSIONS_ASKED_AT_ONCE)
        .collect()
        .await;
    let mut versions: Vec<(i64, SocketAddr, &str)> = answers
        .into_iter()
        .filter_map(|(pod, answer)| answer.ok().map(|(version, token)| (version, pod, token)))
        .collect();
    versions.sort_unstable_by_key(|&(version, _, _)| std::cmp::Reverse(version));
    // Pods at version 0 hold no document, or one no controller pushed (read from a file, or
    // pushed unversioned): asked only when no pod holds a pushed one, since a new pod's empty
    // document would make every rule look new.
    if versions.first().is_some_and(|&(version, _, _)| version > 0) {
        versions.retain(|&(version, _, _)| version > 0);
    }
    for (_, pod, token) in versions.into_iter().take(SERVED_ASKED) {
        if let Ok(served) = super::client::served_document(pod, token, client.timeout).await {
            return Some(served);
        }
    }
    None
}

/// A regex's identity across pushes: its source.
fn source_key(source: &str) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(source)
}

/// The regexes `rules` name, as [`PlaneState::held`] keeps them.
fn held_regexes<'r>(rules: impl Iterator<Item = &'r Rule>) -> HashSet<u64> {
    rules.flat_map(regex_values).map(source_key).collect()
}

/// Whether the pods hold every regex `rule` names (none, when what they hold is not known):
/// for the regex budget it is served, adding nothing to what they hold.
fn holds(held: Option<&HashSet<u64>>, rule: &Rule) -> bool {
    held.is_some_and(|held| regex_values(rule).all(|source| held.contains(&source_key(source))))
}

/// The config's identity without its version, so an unchanged config keeps its version.
fn config_digest(config: &Config) -> Vec<u8> {
    let mut unversioned = config.clone();
    unversioned.version = 0;
    let encoded = serde_json::to_vec(&unversioned).unwrap_or_default();
    digest::digest(&digest::SHA256, &encoded).as_ref().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed() -> Vec<(SocketAddr, PodOutcome)> {
        vec![(
            SocketAddr::from(([10, 0, 0, 5], 8081)),
            PodOutcome::Failed("refused".to_owned()),
        )]
    }

    fn sustained(podless: Duration) -> Sustained {
        Sustained {
            rounds: 2,
            lasting: Duration::ZERO,
            podless,
        }
    }

    /// Rounds with no pod listed, within the keep, leave a run of failures as it was: they
    /// neither count, nor end it, nor say it is sustained.
    #[test]
    fn rounds_without_pods_keep_a_run_of_failures_for_a_while() {
        let keep = sustained(Duration::from_secs(3600));
        let mut state = PlaneState::new(1, "token");
        assert_eq!(finish(&mut state, keep, 1, failed(), &[]).failed_rounds, 1);
        for _ in 0..3 {
            let none = finish(&mut state, keep, 1, Vec::new(), &[]);
            assert_eq!(none.failed_rounds, 1);
            assert!(!none.sustained_failure);
            assert_eq!(none.failing_for, Duration::ZERO);
        }
        let again = finish(&mut state, keep, 1, failed(), &[]);
        assert_eq!(again.failed_rounds, 2);
        assert!(again.sustained_failure, "the run went on");
    }

    /// Past the keep (scaled to zero), a round with no pod ends the run, and so does the first
    /// round with pods after such a stretch.
    #[test]
    fn rounds_without_pods_past_the_keep_end_a_run_of_failures() {
        let none_kept = sustained(Duration::ZERO);
        let mut state = PlaneState::new(1, "token");
        finish(&mut state, none_kept, 1, failed(), &[]);
        assert_eq!(
            finish(&mut state, none_kept, 1, Vec::new(), &[]).failed_rounds,
            0
        );
        assert_eq!(
            finish(&mut state, none_kept, 1, failed(), &[]).failed_rounds,
            1,
            "a run of its own"
        );

        // Pods back before another round without them: the stretch ended past the keep all
        // the same.
        let mut state = PlaneState::new(1, "token");
        let keep = sustained(Duration::from_secs(3600));
        finish(&mut state, keep, 1, failed(), &[]);
        finish(&mut state, keep, 1, Vec::new(), &[]);
        let back = finish(&mut state, none_kept, 1, failed(), &[]);
        assert_eq!(back.failed_rounds, 1, "the run before the stretch ended");
        assert!(!back.sustained_failure);
    }
}
