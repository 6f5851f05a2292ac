//! What a round reports: statuses (merge patches of the status subresources, written only when
//! they differ) of GatewayClasses, Gateways, GatewayConfigs and routes, Events, and the
//! hostname-ownership list ([`ownership_parents`]). All go out in the background
//! ([`StatusWrites`]), so none that hangs holds up a round.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use gateway_api::backendtlspolicies::BackendTlsPolicy;
use gateway_api::experimental::gatewayclasses::GatewayClass;
use gateway_api::experimental::gateways::Gateway;
use gateway_api::experimental::grpcroutes::GrpcRoute;
use gateway_api::experimental::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams};
use kube::core::DynamicObject;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::{json, Value};
use tokio::sync::oneshot::{self, error::TryRecvError};
use tokio::sync::{Notify, Semaphore};
use tokio::task::{self, JoinSet};
use tracing::Instrument as _;

use super::status::{self, set_programmed_pending, ConfigUser, KubeCondition, Truth};
use super::stores::UnreadableRoute;
use super::{
    object_key, ownership_parents, PlaneInfo, PushFailure, Reconciler, PROXY_CONFIG_PUSHED,
    TUNNEL_DOCUMENT_WRITTEN,
};
use crate::gateway_class_config::{GatewayClassConfig, GATEWAY_CLASS_CONFIG_KIND};
use crate::gateway_config::GatewayConfig;
use crate::held::Held;
use crate::in_flight::{Finished, InFlight};
use crate::push;
use crate::render;
use crate::translate::{self, ConditionType, ObjectKey, PlaneKey, Reason, RouteKind, Snapshot};
pub(super) use recorders::Recorders;

/// The events API refuses a note longer than this many bytes (bytes, not characters).
const NOTE_LIMIT: usize = 1024;

/// `note` cut to [`NOTE_LIMIT`] bytes, at a character boundary.
fn clipped(note: &str) -> &str {
    &note[..note.floor_char_boundary(NOTE_LIMIT)]
}

/// The most status writes in flight at once, this round's and those earlier rounds left
/// running.
const WRITES_AT_ONCE: usize = 16;
/// How long a status write that failed waits before the same status is sent again, doubling
/// with each failure in a row up to [`RETRY_MAX`]. A status a webhook keeps refusing (or that
/// keeps timing out) would otherwise be sent again at every round. Another status of the
/// object goes at once.
const RETRY_FIRST: Duration = Duration::from_secs(5);
/// See [`RETRY_FIRST`].
const RETRY_MAX: Duration = Duration::from_secs(300);

/// What a write is of: an object's status (by its URL), or an object the controller keeps whole
/// (by its URL: the hostname-ownership list's ConfigMap), each its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum WriteKey {
    Status(String),
    Object(String),
}

/// How a status write ended.
enum Written {
    Done,
    /// The object changed since the status was computed: the round its watch event starts
    /// writes it afresh ([`StatusWrites::conflicted`]).
    Conflict,
    Failed(String),
}

/// The writes a round's report makes (status patches, the ownership list), collected, and
/// started together once all are known ([`StatusWrites::run`]).
#[derive(Default)]
pub(super) struct Writes {
    /// Status patches and the ownership list, each with what it is of and the digest of what it
    /// says.
    patches: Vec<(WriteKey, Vec<u8>, BoxFuture<'static, Written>)>,
    /// Objects whose status already says what the round wants: a write of something else
    /// still running for them is dropped, and a failure of an earlier one forgotten.
    settled: Vec<WriteKey>,
    /// Every object whose status the round looked at.
    seen: HashSet<WriteKey>,
}

/// How Events share the API server ([`StatusWrites::event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventLimits {
    /// The most Events being posted at once. Events take turns of their own: an events API
    /// that hangs (an admission webhook on `events` that times out) holds up no status write.
    pub at_once: usize,
    /// The most Events about one namespace's objects being posted at once: while one
    /// namespace's posts hang (a webhook on its `events`), the other turns stay free for the
    /// other namespaces'. A small share of [`EventLimits::at_once`], so that several
    /// namespaces' posts that hang still leave turns to the rest.
    pub at_once_per_namespace: usize,
    /// The most Events waiting for their turn, or for the Event before them about the same
    /// object; those being posted are not counted. A bound on memory: past it, an Event is
    /// refused, and made again in a later round.
    pub waiting: usize,
    /// The most Events about one namespace's objects waiting: one tenant's burst leaves room
    /// for the others'. A small share of [`EventLimits::waiting`], so that several namespaces
    /// whose Events hang (each filling its own places) still leave places to the rest.
    pub waiting_per_namespace: usize,
    /// How long one post may take. Events are best effort: one not answered by then is given
    /// up (logged, not sent again), so a webhook that hangs on a namespace's `events` holds
    /// each of its turns this long at most.
    pub post_timeout: Duration,
}

impl Default for EventLimits {
    fn default() -> Self {
        Self {
            at_once: 8,
            at_once_per_namespace: 1,
            waiting: 1024,
            waiting_per_namespace: 64,
            post_timeout: Duration::from_secs(5),
        }
    }
}

/// An Event to publish ([`Reconciler::event`]), with the object it is about.
pub(super) struct EventPost {
    /// The object's kind, namespace and name: Events about it go out one after another.
    regarding: String,
    /// The object's namespace (empty for one of the cluster's): its Events share its turns.
    namespace: String,
    /// For the log.
    reason: String,
    /// What its maker records as told once the Event is taken ([`Reconciler::untell`]).
    told: Told,
    post: BoxFuture<'static, ()>,
}

/// What an Event tells, as its maker records it, so that one not sent is made again: records
/// are kept only for Events [`StatusWrites::event`] took, and forgotten for those dropped
/// before they were answered ([`StatusWrites::abort_all`], [`Reconciler::untell`]).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Told {
    /// A route's warning condition (`TunnelShared`, `RouteShadowed`) and its message.
    Condition {
        route: String,
        reason: &'static str,
        message: String,
    },
    /// The rules of a route one plane's pods refused, by their [`refusal_key`]s, and what was
    /// told of that plane before (put back should the Event not go).
    RuleRefused {
        route: String,
        plane: PlaneKey,
        keys: RefusalKeys,
        before: Option<RefusalKeys>,
    },
    /// A route's config push failing, once per run of failures.
    PushFailed { route: String },
    /// Why a Gateway's plane could not be applied.
    RenderFailed { gateway: ObjectKey, reason: String },
    /// A Gateway's plane applied, with a change: no record keeps it from being made again, so
    /// one not sent is kept to be sent ([`Reconciler::tell_provisioned`]).
    Provisioned {
        gateway: ObjectKey,
        regarding: ObjectReference,
        note: String,
    },
}

/// Turns and waiting places of Events: all of them, or one namespace's.
struct Lane {
    turns: Semaphore,
    /// Events waiting ([`EventLimits::waiting`]).
    waiting: AtomicUsize,
    places: usize,
    /// An Event was refused for want of a place: the round that makes it again is started
    /// once half the places are free.
    wanted: AtomicBool,
}

impl Lane {
    fn new(turns: usize, places: usize) -> Arc<Self> {
        Arc::new(Self {
            turns: Semaphore::new(turns.max(1)),
            waiting: AtomicUsize::new(0),
            places: places.max(1),
            wanted: AtomicBool::new(false),
        })
    }

    /// A place to wait in, unless all are taken: then the refusal is noted, for `wake` to be
    /// notified as places free.
    fn place(self: &Arc<Self>, wake: &Arc<Notify>) -> Option<Place> {
        let taken = self
            .waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.places).then_some(n + 1)
            })
            .is_ok();
        if taken {
            return Some(Place {
                lane: Arc::clone(self),
                wake: Arc::clone(wake),
            });
        }
        self.wanted.store(true, Ordering::SeqCst);
        // Places freed since the check above saw the flag unset: wake for them.
        self.freed(wake);
        None
    }

    /// Notifies `wake` if an Event was refused and half the places are free.
    fn freed(&self, wake: &Notify) {
        if self.waiting.load(Ordering::SeqCst) <= self.places / 2
            && self.wanted.swap(false, Ordering::SeqCst)
        {
            wake.notify_one();
        }
    }
}

/// An Event's place in a [`Lane`], given back as it is posted (or dropped).
struct Place {
    lane: Arc<Lane>,
    wake: Arc<Notify>,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.lane.waiting.fetch_sub(1, Ordering::SeqCst);
        self.lane.freed(&self.wake);
    }
}

/// Status writes, the ownership list and Events, each a task of its own, [`WRITES_AT_ONCE`]
/// writes at a time. A round waits for the writes it starts for [`push::ROUND_WAIT`] at most:
/// one the API server is slow to answer (an admission webhook on a status or on ConfigMaps
/// that times out) goes on by itself, so one tenant's slow writes hold up no other tenant's
/// next push. A write still running is not started again for the same status at the same
/// resourceVersion, and is dropped for a newer one (whose resourceVersion keeps the older one,
/// should it land after all, from overwriting it); one that failed is held back for a while
/// ([`RETRY_FIRST`]), and the round after its wait sends it again. Once its object says what
/// the round wants, its failures are forgotten.
///
/// Events ([`StatusWrites::event`]) are deduplicated where they are made (one per new reason
/// or message), go out in the order they were made per object (each waits for the one before
/// it about the same object), take turns of their own ([`EventLimits`]: so many at once, and
/// so many per namespace), and no round waits for them. One the API server answered, whatever
/// it answered, or did not answer in time, is not sent again (a failure is logged). One
/// refused for want of room (too many waiting, in all or in its namespace) is not recorded as
/// told, and is made again in a later round: once half the room is free, a round is started
/// for it. Those not answered when this replica stops leading are dropped, their records
/// forgotten ([`StatusWrites::abort_all`]); at shutdown they are dropped with the rest.
pub(super) struct StatusWrites {
    /// By [`write_digest`]: what each says, and the resourceVersion it is written at.
    running: InFlight<WriteKey, Written>,
    /// By [`content_digest`]: what each said. Starts a round as each one's wait ends: nothing
    /// else may start one then.
    failed: Held<WriteKey>,
    /// By [`write_digest`]: what each write refused as a conflict said, at the resourceVersion
    /// it was written at. The object changed since (the watch cache is behind): the watch event
    /// of its newer resourceVersion starts the round that writes it afresh, and until the
    /// cache has it, writing the same again is refused the same.
    conflicted: HashMap<WriteKey, Vec<u8>>,
    /// Starts a round as room for refused Events frees.
    wake: Arc<Notify>,
    turns: Arc<Semaphore>,
    limits: EventLimits,
    /// Every Event being published.
    events: JoinSet<()>,
    /// What each Event task not ended yet tells, numbered in the order the Events were made.
    unanswered: HashMap<task::Id, (u64, Told)>,
    /// The number the next Event taken gets in [`StatusWrites::unanswered`].
    made: u64,
    /// The turns and places of all Events.
    all_events: Arc<Lane>,
    /// Those of each namespace's, while it has Events.
    namespaces: HashMap<String, Arc<Lane>>,
    /// Per object ([`EventPost::regarding`]): the end of the last Event started about it, which
    /// the next one waits for. Closed once that Event's task ends, however it ends.
    event_chains: HashMap<String, oneshot::Receiver<()>>,
    /// Events refused for want of room since the last round's end.
    refused: usize,
}

impl StatusWrites {
    /// `wake` starts a round: after a failed write's wait, or as room for refused Events frees.
    pub(super) fn new(wake: Arc<Notify>, limits: EventLimits) -> Self {
        Self {
            // Not woken by every write that lands: the watch event of its object starts the
            // round that takes it in.
            running: InFlight::new(usize::MAX, Arc::new(Notify::new())),
            failed: Held::new(RETRY_FIRST, RETRY_MAX).waking(Arc::clone(&wake)),
            conflicted: HashMap::new(),
            wake,
            turns: Arc::new(Semaphore::new(WRITES_AT_ONCE)),
            limits,
            events: JoinSet::new(),
            unanswered: HashMap::new(),
            made: 0,
            all_events: Lane::new(limits.at_once, limits.waiting),
            namespaces: HashMap::new(),
            event_chains: HashMap::new(),
            refused: 0,
        }
    }

    /// Starts publishing `event` in the background, once the Events started before it about
    /// the same object have ended and a turn is free; nothing waits for it. Whether it was
    /// taken: not when [`EventLimits::waiting`] Events wait already, or
    /// [`EventLimits::waiting_per_namespace`] of its namespace. Its maker then records nothing
    /// and makes it again in a later round.
    pub(super) fn event(&mut self, event: EventPost) -> bool {
        let EventPost {
            regarding,
            namespace,
            reason,
            told,
            post,
        } = event;
        let limits = self.limits;
        let lane = Arc::clone(self.namespaces.entry(namespace).or_insert_with(|| {
            Lane::new(limits.at_once_per_namespace, limits.waiting_per_namespace)
        }));
        let places = self
            .all_events
            .place(&self.wake)
            .and_then(|all| Some((all, lane.place(&self.wake)?)));
        let Some(places) = places else {
            tracing::debug!(%regarding, %reason, "too many Events wait for the API server; this one is made again in a later round");
            self.refused += 1;
            return false;
        };
        let (ended, end) = oneshot::channel::<()>();
        let before = self.event_chains.insert(regarding.clone(), end);
        let all = Arc::clone(&self.all_events);
        let timeout = limits.post_timeout;
        let task = self.events.spawn(async move {
            // Dropped as the task ends, finished or dropped: the next Event about the object
            // goes then.
            let _ended = ended;
            if let Some(before) = before {
                // Closed, never sent: its end is all that is waited for.
                let _ = before.await;
            }
            // Never closed; were they, the Event would go ahead without a turn. The
            // namespace's first: an Event waiting for it holds none of the others'.
            let _own = lane.turns.acquire().await.ok();
            let _turn = all.turns.acquire().await.ok();
            // Posting: no longer waiting.
            drop(places);
            if tokio::time::timeout(timeout, post).await.is_err() {
                tracing::warn!(%regarding, %reason, ?timeout, "publishing an Event took too long; it is not sent again");
            }
        });
        self.unanswered.insert(task.id(), (self.made, told));
        self.made += 1;
        true
    }

    /// Whether what `content` (its [`content_digest`]) says of `key`, computed from the object
    /// at `resource_version`, needs no new write: a write of it at that resourceVersion runs
    /// or was refused as a conflict, or one of it failed lately. One running at an older
    /// resourceVersion names it (status patches and the ownership list alike), so it is bound
    /// for a conflict, which changes nothing on the object: no watch event would start the
    /// round that writes it afresh. (A write where none was watched names none: it makes the
    /// object, whose watch event starts the next round.)
    fn covered(&self, key: &WriteKey, content: &[u8], resource_version: Option<&str>) -> bool {
        let digest = write_digest(content, resource_version);
        self.running.running(key) == Some(digest.as_slice())
            || self.conflicted.get(key) == Some(&digest)
            || self.failed.error(key, content).is_some()
    }

    /// Takes in the writes and Events finished since the last call.
    fn take_finished(&mut self) {
        let done = self.running.finished();
        self.settle(done);
        while let Some(ended) = self.events.try_join_next_with_id() {
            let id = match ended {
                Ok((id, ())) => id,
                Err(e) => {
                    if e.is_panic() {
                        tracing::error!("publishing an Event panicked");
                    }
                    e.id()
                }
            };
            self.unanswered.remove(&id);
        }
        // Objects whose last Event has ended: the next one about them waits for nothing.
        self.event_chains
            .retain(|_, end| matches!(end.try_recv(), Err(TryRecvError::Empty)));
        // Namespaces with no Event left: only this map holds their lane.
        self.namespaces
            .retain(|_, lane| Arc::strong_count(lane) > 1);
    }

    fn settle(&mut self, done: Vec<Finished<WriteKey, Written>>) {
        for (key, digest, outcome) in done {
            let error = match outcome {
                Some(Written::Done) => {
                    self.failed.succeeded(&key);
                    self.conflicted.remove(&key);
                    continue;
                }
                Some(Written::Conflict) => {
                    self.failed.succeeded(&key);
                    self.conflicted.insert(key, digest);
                    continue;
                }
                Some(Written::Failed(error)) => error,
                None => {
                    tracing::error!(?key, "writing a status panicked");
                    "writing the status panicked".to_owned()
                }
            };
            // The round comes once the wait is over.
            self.failed.failed(key, content_of(&digest).to_vec(), error);
        }
    }

    /// Starts the round's `writes` and waits for them, [`push::ROUND_WAIT`] at most.
    async fn run(&mut self, writes: Writes) {
        let Writes {
            patches,
            settled,
            seen,
        } = writes;
        if self.refused > 0 {
            tracing::warn!(
                refused = self.refused,
                "too many Events wait for the API server; those refused are made again in a later round"
            );
            self.refused = 0;
        }
        for key in &settled {
            self.running.abort(key);
            self.conflicted.remove(key);
            // Its next failure, however much later, waits the first wait again.
            self.failed.succeeded(key);
        }
        self.failed.retain(|key| seen.contains(key));
        self.conflicted.retain(|key, _| seen.contains(key));
        let mut started = Vec::with_capacity(patches.len());
        for (key, digest, job) in patches {
            let turns = Arc::clone(&self.turns);
            self.running.start(key.clone(), digest, async move {
                // Never closed; were it, the write would go ahead without a turn.
                let _turn = turns.acquire().await.ok();
                job.await
            });
            started.push(key);
        }
        // Last started first: turns are handed out in order, so the wait's check for one of
        // them still running mostly stops at the first.
        started.reverse();
        let deadline = tokio::time::Instant::now() + push::ROUND_WAIT;
        let done = self.running.finished_by(&started, Some(deadline)).await;
        self.settle(done);
    }

    /// Drops every write and Event running (this replica no longer leads), and returns what
    /// the Events not answered yet told, in the order they were made, for their records to be
    /// forgotten: a replica that leads again in the same term makes them again.
    pub(super) fn abort_all(&mut self) -> Vec<Told> {
        // Those answered meanwhile are not made again.
        self.take_finished();
        self.running.abort_all();
        self.events.abort_all();
        self.event_chains.clear();
        // The dropped Events' places and turns go with their lanes.
        self.all_events = Lane::new(self.limits.at_once, self.limits.waiting);
        self.namespaces.clear();
        self.refused = 0;
        let mut unanswered: Vec<(u64, Told)> = self.unanswered.drain().map(|(_, u)| u).collect();
        unanswered.sort_unstable_by_key(|(made, _)| *made);
        unanswered.into_iter().map(|(_, told)| told).collect()
    }
}

/// The digest of a write of `content` (a [`content_digest`]) at `resource_version`: the
/// content's digest, then the resourceVersion.
fn write_digest(content: &[u8], resource_version: Option<&str>) -> Vec<u8> {
    let mut digest = content.to_vec();
    digest.extend_from_slice(resource_version.unwrap_or_default().as_bytes());
    digest
}

/// The [`content_digest`] a [`write_digest`] starts with.
fn content_of(digest: &[u8]) -> &[u8] {
    digest.get(..CONTENT_DIGEST_LEN).unwrap_or(digest)
}

/// The length of a [`content_digest`] (SHA-256).
const CONTENT_DIGEST_LEN: usize = 32;

/// A digest of what a status says, to tell writes apart: without its `lastTransitionTime`s, as
/// a condition whose status changes gets a new one at every round until it is written.
fn content_digest(status: &Value) -> Vec<u8> {
    fn untimed(value: &mut Value) {
        match value {
            Value::Object(fields) => {
                fields.remove("lastTransitionTime");
                fields.values_mut().for_each(untimed);
            }
            Value::Array(items) => items.iter_mut().for_each(untimed),
            _ => {}
        }
    }
    let mut status = status.clone();
    untimed(&mut status);
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, status.to_string().as_bytes())
        .as_ref()
        .to_vec()
}

/// How a Gateway's `Programmed` message begins while its plane cannot be applied.
const RENDER_FAILED: &str = "the data plane could not be applied: ";

/// How a route's `ProxyConfigPushed=False` (`PushFailed`) message begins.
const PUSH_FAILED: &str = "the proxy pods have not taken the config: ";
/// How the reason of a failure that is another plane's on the route's tunnel begins, and what
/// follows the plane's name: `the pods of <plane>, on the same tunnel: <its reason>`.
const PEERS_PODS: &str = "the pods of ";
const ON_THE_SAME_TUNNEL: &str = ", on the same tunnel: ";

/// Whether a `PushFailed` message tells another plane's failure on the route's tunnel.
fn is_peers_failure(message: &str) -> bool {
    message
        .strip_prefix(PUSH_FAILED)
        .and_then(|reason| reason.strip_prefix(PEERS_PODS))
        .is_some_and(|rest| rest.contains(ON_THE_SAME_TUNNEL))
}

/// What an earlier leader told of a plane's pushes, kept by a new one
/// ([`Reconciler::inherited_push_failures`]).
#[derive(Debug)]
pub(super) struct Inherited {
    /// The plane's own routes carried its own failure; otherwise it is a plane of a tunnel
    /// whose routes carried another plane's failure, or a peer on such a tunnel.
    pub(super) told: bool,
    /// This process has a verdict of its own on the plane.
    pub(super) decided: bool,
    /// When a push of this process's last tried the plane's listed pods (or it took the lead).
    pub(super) pushed: std::time::Instant,
}

impl Reconciler {
    /// An Event to publish through [`StatusWrites::event`], which records `told` once taken.
    pub(super) fn event(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
        told: Told,
    ) -> EventPost {
        let note = clipped(note);
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note.to_owned()),
            action: action.to_owned(),
            secondary: None,
        };
        let text = |field: &Option<String>| field.clone().unwrap_or_default();
        let namespace = text(&regarding.namespace);
        let of = format!(
            "{} {namespace}/{}",
            text(&regarding.kind),
            text(&regarding.name)
        );
        let (recorder, renew) = self.recorders.of(&of, reason, note);
        let object = regarding.clone();
        let regarding = of.clone();
        let post = async move {
            let mut published = recorder.publish(&event, &object).await;
            if matches!(&published, Err(kube::Error::Api(e)) if e.code == 404) {
                // The Event it would add to is gone (deleted): a new one says it, and those
                // after fold into that one.
                published = renew.renew().publish(&event, &object).await;
            }
            if let Err(e) = published {
                tracing::warn!(error = %e, reason = %event.reason, regarding = %of, "publishing an Event failed");
            }
        };
        EventPost {
            regarding,
            namespace,
            reason: reason.to_owned(),
            told,
            post: Box::pin(post.in_current_span()),
        }
    }

    /// Drops every status write and Event running (this replica stopped leading, or a round
    /// was cut off as the Lease lapsed) and forgets what the Events not answered told
    /// ([`Reconciler::untell`]): should this reconciler carry on in the same term, its next
    /// round makes them again.
    pub(super) fn abort_reports(&mut self) {
        // Newest first: of a Gateway's `ProxyProvisioned`s dropped, the newest note is kept;
        // of a route's `ProxyRuleRefused`s, each puts back what was told before it, so the
        // oldest's is what stands.
        for told in self.status_writes.abort_all().into_iter().rev() {
            self.untell(told);
        }
    }

    /// Forgets that `told` was told, its Event dropped before it was answered: the next round
    /// makes it again. A record since replaced by a newer one stays: that one's Event tells
    /// it. A `ProxyProvisioned` is kept to be offered again, unless one is kept already (newer:
    /// it was refused after every one taken, or handed back before this one).
    fn untell(&mut self, told: Told) {
        match told {
            Told::Condition {
                route,
                reason,
                message,
            } => {
                let key = (route, reason);
                if self.condition_told.get(&key) == Some(&message) {
                    self.condition_told.remove(&key);
                }
            }
            Told::RuleRefused {
                route,
                plane,
                keys,
                before,
            } => {
                self.refusals_told.untell(&route, &plane, &keys, before);
            }
            Told::PushFailed { route } => {
                self.push_failed_told.remove(&route);
            }
            Told::RenderFailed { gateway, reason } => {
                if self.render_failed_told.get(&gateway) == Some(&reason) {
                    self.render_failed_told.remove(&gateway);
                }
            }
            Told::Provisioned {
                gateway,
                regarding,
                note,
            } => {
                self.provisioned_untold
                    .entry(gateway)
                    .or_insert((regarding, note));
            }
        }
    }

    /// Tells that Gateway `gateway`'s plane was applied with a change (`note`), or keeps it to
    /// be told in a later round ([`Reconciler::provisioned_untold`]) if there is no room for
    /// the Event now.
    pub(super) fn tell_provisioned(
        &mut self,
        gateway: ObjectKey,
        regarding: ObjectReference,
        note: String,
    ) {
        let told = Told::Provisioned {
            gateway: gateway.clone(),
            regarding: regarding.clone(),
            note: note.clone(),
        };
        let event = self.event(
            &regarding,
            EventType::Normal,
            "ProxyProvisioned",
            "Render",
            &note,
            told,
        );
        if self.status_writes.event(event) {
            self.provisioned_untold.remove(&gateway);
        } else {
            self.provisioned_untold.insert(gateway, (regarding, note));
        }
    }

    pub(super) async fn write_statuses(
        &mut self,
        snapshot: &Snapshot,
        unreadable_routes: &[UnreadableRoute],
        output: &translate::Output,
        planes: &BTreeMap<PlaneKey, PlaneInfo>,
        shared_address: Option<String>,
    ) {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let controller = self.options.translate.controller_name.clone();
        let controller = &controller;
        let push_failed = push_failed(&self.push_failures, planes);
        self.status_writes.take_finished();
        let mut writes = Writes::default();

        for class in &snapshot.gateway_classes {
            let name = class.name_any();
            let Some(conditions) = output.statuses.gateway_classes.get(&name) else {
                continue;
            };
            let existing = class
                .status
                .as_ref()
                .and_then(|s| serde_json::to_value(s).ok());
            let desired = status::gateway_class(
                conditions,
                translate::SUPPORTED_FEATURES,
                existing.as_ref(),
                &now,
            );
            let api: Api<GatewayClass> = Api::all(self.client.clone());
            let version = class.resource_version();
            self.patch_status(&mut writes, api, &name, version, existing.as_ref(), desired);
        }

        // Why each Gateway is not programmed yet, when it is pending: its ListenerSets wait too.
        let mut pending_gateways: BTreeMap<ObjectKey, String> = BTreeMap::new();
        for gw in &snapshot.gateways {
            let Some(key) = object_key(gw) else { continue };
            let Some(desired) = output.statuses.gateways.get(&key) else {
                continue;
            };
            let mut conditions: Vec<KubeCondition> =
                desired.conditions.iter().map(KubeCondition::from).collect();
            let mut addresses = Vec::new();
            match output.planes.get(&key) {
                Some(plane @ PlaneKey::Dedicated(_)) => match planes.get(plane) {
                    Some(info) => {
                        addresses.push(info.address.clone());
                        // The more specific reason first: the first one set stays. A plane
                        // applied before is pushed to while a new apply of it fails.
                        if let Some(reason) = self.render_failures.get(&key) {
                            set_programmed_pending(
                                &mut conditions,
                                &format!("{RENDER_FAILED}{reason}"),
                            );
                        }
                        if let Some(reason) = self.unreached.get(plane) {
                            set_programmed_pending(&mut conditions, reason);
                        }
                        if !info.ready {
                            set_programmed_pending(
                                &mut conditions,
                                "waiting for a ready proxy replica (a registered tunnel connector)",
                            );
                        }
                    }
                    // Events expire: the reason stays in the condition, also while the plane
                    // is applied again.
                    None => match (
                        self.render_failures.get(&key),
                        self.applying_first.get(&key),
                    ) {
                        (Some(reason), _) => set_programmed_pending(
                            &mut conditions,
                            &format!("{RENDER_FAILED}{reason}"),
                        ),
                        (None, Some(address)) => {
                            addresses.push(address.clone());
                            set_programmed_pending(
                                &mut conditions,
                                "the data plane is being applied",
                            );
                        }
                        (None, None) => set_programmed_pending(
                            &mut conditions,
                            "the data plane could not be applied",
                        ),
                    },
                },
                Some(PlaneKey::Shared) => {
                    addresses.extend(shared_address.clone());
                    if let Some(reason) = self.unreached.get(&PlaneKey::Shared) {
                        set_programmed_pending(&mut conditions, reason);
                    }
                }
                None => {}
            }
            let existing = gw
                .status
                .as_ref()
                .and_then(|s| serde_json::to_value(s).ok());
            if let Some(pending) = conditions.iter().find(|c| {
                c.kind == "Programmed" && c.status == Truth::False && c.reason == "Pending"
            }) {
                pending_gateways.insert(key.clone(), pending.message.clone());
            }
            let value = status::gateway(desired, &conditions, &addresses, existing.as_ref(), &now);
            let api: Api<Gateway> = Api::namespaced(self.client.clone(), &key.namespace);
            self.patch_status(
                &mut writes,
                api,
                &key.name,
                gw.resource_version(),
                existing.as_ref(),
                value,
            );
        }

        self.write_listener_set_statuses(&mut writes, snapshot, output, &pending_gateways, &now);
        self.write_gateway_config_statuses(&mut writes, snapshot, output, &now);
        self.write_gateway_class_config_statuses(&mut writes, snapshot, &now);
        self.write_backend_tls_policy_statuses(&mut writes, snapshot, output, &now);

        let route_objects = snapshot
            .http_routes
            .iter()
            .map(|r| {
                (
                    RouteKind::Http,
                    r.metadata.clone(),
                    r.status.as_ref().and_then(|s| serde_json::to_value(s).ok()),
                    r.object_ref(&()),
                )
            })
            .chain(snapshot.grpc_routes.iter().map(|r| {
                (
                    RouteKind::Grpc,
                    r.metadata.clone(),
                    r.status.as_ref().and_then(|s| serde_json::to_value(s).ok()),
                    r.object_ref(&()),
                )
            }));
        let on_tunnels = self.on_their_tunnels(output, planes);
        let mut routes_seen = BTreeSet::new();
        for (kind, meta, existing, regarding) in route_objects {
            let (Some(ns), Some(name)) = (meta.namespace.clone(), meta.name.clone()) else {
                continue;
            };
            let route_key = translate::RouteKey {
                kind,
                key: ObjectKey::new(&ns, &name),
            };
            let ours = output
                .statuses
                .routes
                .get(&route_key)
                .cloned()
                .unwrap_or_default();
            let had_ours = existing
                .as_ref()
                .and_then(|s| s.get("parents"))
                .and_then(Value::as_array)
                .is_some_and(|p| p.iter().any(|p| status::written_by(p, controller)));
            if ours.is_empty() && !had_ours {
                continue;
            }
            // What an earlier leader told a parent of the config pushed, with `reason`
            // (`PushFailed`, `RuleRefused`), as the status says: the condition.
            let told_before = |parent: &translate::ParentRef, reason: &str| {
                status::condition_before(
                    existing.as_ref(),
                    controller,
                    [parent],
                    PROXY_CONFIG_PUSHED,
                )
                .filter(|c| c["status"] == "False" && c["reason"] == reason)
            };
            let message = |c: &Value| c["message"].as_str().unwrap_or_default().to_owned();
            let told_key = route_key.to_string();
            routes_seen.insert(told_key.clone());
            // A route this process reports on for the first time since it took the lead: what
            // its status already says, an earlier leader wrote and told in an Event; a new
            // leader telling it again would send every warning twice.
            let first_report = self.reported_routes.insert(told_key.clone());
            // The refusals of the route's rules an earlier leader told each parent, as its
            // status says now: taken in before this process writes its own.
            if first_report {
                let config_planes: Vec<&PlaneKey> = output.configs.keys().collect();
                let told = ours
                    .iter()
                    .filter_map(|parent| {
                        let c = told_before(&parent.parent_ref, "RuleRefused")?;
                        let serving = self.serving_plane(output, planes, &parent.parent_ref);
                        Some(ToldBefore::new(
                            parent.parent_ref.clone(),
                            c["observedGeneration"].as_i64(),
                            message(c),
                            &config_planes,
                            serving,
                        ))
                    })
                    .collect();
                self.refusals_told.inherit(&told_key, told);
            }
            // The refusals of the route's rules, per plane: an Event when what a plane's pods
            // refuse changes, and none for what an earlier leader told of the route as it is.
            // Of the planes whose refusals some parent's condition shows. Weighed before the
            // conditions are, which show what an earlier leader told only while it stands.
            let shown: BTreeSet<&PlaneKey> = ours
                .iter()
                .filter(|parent| {
                    parent
                        .condition(ConditionType::Accepted)
                        .is_some_and(|c| c.status)
                })
                .filter_map(|parent| self.serving_plane(output, planes, &parent.parent_ref))
                .flat_map(|plane| planes_serving(plane, planes, &self.push_failures))
                .collect();
            let refused: Vec<(PlaneKey, String)> = self
                .refused_rules
                .get(&route_key)
                .into_iter()
                .flatten()
                .filter(|(plane, _)| shown.contains(plane))
                .cloned()
                .collect();
            let refused = refused.as_slice();
            let untold = self.refusals_told.untold(
                &told_key,
                refused,
                &self.refusal_answers,
                meta.generation,
            );
            let adjust = |i: usize, conditions: &mut Vec<KubeCondition>| {
                let Some(parent) = ours.get(i) else { return };
                let accepted = parent
                    .condition(ConditionType::Accepted)
                    .is_some_and(|c| c.status);
                if !accepted {
                    return;
                }
                let Some(plane) = output
                    .statuses
                    .parent_gateway(&parent.parent_ref)
                    .and_then(|gateway| output.planes.get(&gateway))
                else {
                    return;
                };
                // Judged by the plane that serves it (see `Reconciler::serving_peer`).
                let plane = self.serving_peer(plane, planes).unwrap_or(plane);
                // A new Gateway's plane not applied yet, or whose first apply failed, with no
                // other plane on its tunnel: no pod serves the route and its tunnel's document
                // does not carry it (the document is written once the plane is applied). A
                // plane applied before is in `planes` while it is applied again, and its
                // routes are judged below.
                if let PlaneKey::Dedicated(gateway) = plane {
                    let waits = match (
                        planes.contains_key(plane),
                        self.render_failures.get(gateway),
                    ) {
                        (true, _) => None,
                        (false, Some(reason)) => Some(format!(
                            "the Gateway's data plane could not be applied: {reason}"
                        )),
                        (false, None) => self
                            .applying_first
                            .contains_key(gateway)
                            .then(|| "the Gateway's data plane is being applied".to_owned()),
                    };
                    if let Some(message) = waits {
                        for c in conditions.iter_mut().filter(|c| c.kind == "Accepted") {
                            c.status = Truth::Unknown;
                            c.reason = "Pending".to_owned();
                            c.message = message.clone();
                        }
                        return;
                    }
                }
                // Only this Gateway's tunnel failed: its routes are pending, no one else's. A
                // route the tunnel's last document carries as it is now is served: it stays
                // accepted (DNS records follow `Accepted`), pending on a condition of its own;
                // one the document does not carry waits for it.
                if let Some(reason) = self.tunnel_failures.get(plane) {
                    let message =
                        format!("the tunnel's ingress document could not be written: {reason}");
                    let carried = on_tunnels
                        .get(plane)
                        .and_then(|routes| routes.get(&route_key))
                        .copied()
                        .unwrap_or(false);
                    if carried {
                        conditions.push(KubeCondition {
                            kind: TUNNEL_DOCUMENT_WRITTEN.to_owned(),
                            status: Truth::False,
                            reason: "Pending".to_owned(),
                            message: format!(
                                "{message}; the route is served as the tunnel's last document has it"
                            ),
                            observed_generation: meta.generation,
                        });
                    } else {
                        for c in conditions.iter_mut().filter(|c| c.kind == "Accepted") {
                            c.status = Truth::Unknown;
                            c.reason = "Pending".to_owned();
                            c.message = message.clone();
                        }
                    }
                } else if self.tunnel_writing.contains(plane) {
                    // The write outlived the round: a route the tunnel's last document carries
                    // is served as it is; one it does not waits for the write, as it would for
                    // a failed one. With no document of the tunnel's seen written by this
                    // process (it has just taken the lead, or the tunnel is new to it: a
                    // Gateway moved to another tunnel), a route accepted before stays so: a
                    // new leader's first writes would otherwise flip every route it serves.
                    let waits = match on_tunnels.get(plane) {
                        Some(routes) => !routes.get(&route_key).copied().unwrap_or(false),
                        None => !status::accepted_before(
                            existing.as_ref(),
                            controller,
                            &parent.parent_ref,
                        ),
                    };
                    if waits {
                        for c in conditions.iter_mut().filter(|c| c.kind == "Accepted") {
                            c.status = Truth::Unknown;
                            c.reason = "Pending".to_owned();
                            c.message = "the tunnel's ingress document is being written".to_owned();
                        }
                    }
                }
                if let Some((_, reason)) = push_failed.get(plane) {
                    conditions.push(KubeCondition {
                        kind: PROXY_CONFIG_PUSHED.to_owned(),
                        status: Truth::False,
                        reason: "PushFailed".to_owned(),
                        message: format!("{PUSH_FAILED}{reason}"),
                        observed_generation: meta.generation,
                    });
                } else if let Some(told) = self
                    .inherited(plane)
                    .then(|| told_before(&parent.parent_ref, "PushFailed"))
                    .flatten()
                {
                    conditions.push(KubeCondition {
                        kind: PROXY_CONFIG_PUSHED.to_owned(),
                        status: Truth::False,
                        reason: "PushFailed".to_owned(),
                        message: message(told),
                        observed_generation: meta.generation,
                    });
                } else if let Some(told) = self
                    .refusals_told
                    // Said of the route as it is (a rule since changed may be refused no
                    // more), by an earlier leader.
                    .inherited(&told_key, &parent.parent_ref, meta.generation)
                    .filter(|_| {
                        planes_serving(plane, planes, &self.push_failures)
                            .iter()
                            .any(|p| !self.pushed_planes.contains(*p))
                    })
                {
                    // A plane serving the parent not answering this process's pushes yet: the
                    // refusal of the route as it is stands until their pods say (or some pods
                    // of a plane it names refuse more than it said, which takes it in).
                    conditions.push(KubeCondition {
                        kind: PROXY_CONFIG_PUSHED.to_owned(),
                        status: Truth::False,
                        reason: "RuleRefused".to_owned(),
                        message: told.to_owned(),
                        observed_generation: meta.generation,
                    });
                } else if let Some(message) =
                    self.refused_rules.get(&route_key).and_then(|refused| {
                        refusals_of(refused, &planes_serving(plane, planes, &self.push_failures))
                    })
                {
                    conditions.push(KubeCondition {
                        kind: PROXY_CONFIG_PUSHED.to_owned(),
                        status: Truth::False,
                        reason: "RuleRefused".to_owned(),
                        message,
                        observed_generation: meta.generation,
                    });
                }
            };
            let value = status::route(&ours, &adjust, controller, existing.as_ref(), &now);
            // The Event mirrors the condition, once per run of failures.
            let serving = |parent: &translate::RouteParentStatus| {
                self.serving_plane(output, planes, &parent.parent_ref)
            };
            let failed_now = ours.iter().find_map(|parent| {
                serving(parent)
                    .and_then(|p| push_failed.get(p))
                    .map(|(_, reason)| reason)
            });
            // Told by an earlier leader, and kept: no Event, now or as this process's own
            // verdict takes over.
            let inherited_told = ours.iter().any(|parent| {
                serving(parent).is_some_and(|p| self.inherited(p))
                    && told_before(&parent.parent_ref, "PushFailed").is_some()
            });
            let before = |kind: &str| {
                let parents = ours.iter().map(|parent| &parent.parent_ref);
                first_report
                    .then(|| status::condition_before(existing.as_ref(), controller, parents, kind))
                    .flatten()
            };
            let said = |condition: &Value, truth: &str, reason: Option<&str>, message: &str| {
                condition["status"] == truth
                    && reason.is_none_or(|reason| condition["reason"] == reason)
                    && condition["message"] == message
            };
            // Conditions that warn the route's owner: an Event when one appears or its message
            // changes. Each record is kept only once its Event is taken: one refused for want
            // of room is made again in a later round.
            for (kind, reason) in [
                (ConditionType::TunnelShared, "TunnelShared"),
                (ConditionType::RouteShadowed, "RouteShadowed"),
            ] {
                let message = ours
                    .iter()
                    .find_map(|parent| parent.condition(kind).map(|c| c.message.clone()));
                let key = (told_key.clone(), reason);
                if let Some(message) = &message {
                    if before(kind.as_str()).is_some_and(|c| said(c, "True", None, message)) {
                        self.condition_told.insert(key.clone(), message.clone());
                    }
                }
                match message {
                    Some(message) if self.condition_told.get(&key) != Some(&message) => {
                        let told = Told::Condition {
                            route: told_key.clone(),
                            reason,
                            message: message.clone(),
                        };
                        let event = self.event(
                            &regarding,
                            EventType::Warning,
                            reason,
                            "Route",
                            &message,
                            told,
                        );
                        if self.status_writes.event(event) {
                            self.condition_told.insert(key, message);
                        }
                    }
                    Some(_) => {}
                    None => {
                        self.condition_told.remove(&key);
                    }
                }
            }
            for Untold {
                plane,
                keys,
                before,
            } in untold
            {
                let note = refusals_of(refused, &[&plane]).unwrap_or_default();
                let told = Told::RuleRefused {
                    route: told_key.clone(),
                    plane: plane.clone(),
                    keys: keys.clone(),
                    before: before.clone(),
                };
                let event = self.event(
                    &regarding,
                    EventType::Warning,
                    "ProxyRuleRefused",
                    "Push",
                    &note,
                    told,
                );
                if self.status_writes.event(event) {
                    self.refusals_told.took(&told_key, &plane, keys);
                } else if let Some(before) = before {
                    // Made again in a later round; what was told before it stays told.
                    self.refusals_told.took(&told_key, &plane, before);
                }
            }
            match failed_now {
                _ if inherited_told => {
                    self.push_failed_told.insert(told_key.clone());
                }
                Some(reason) if !self.push_failed_told.contains(&told_key) => {
                    let note = format!("{PUSH_FAILED}{reason}");
                    let told = Told::PushFailed {
                        route: told_key.clone(),
                    };
                    let event = self.event(
                        &regarding,
                        EventType::Warning,
                        "ProxyConfigPushFailed",
                        "Push",
                        &note,
                        told,
                    );
                    if self.status_writes.event(event) {
                        self.push_failed_told.insert(told_key.clone());
                    }
                }
                Some(_) => {}
                None => {
                    self.push_failed_told.remove(&told_key);
                }
            }
            let (client, version) = (self.client.clone(), meta.resource_version.clone());
            match kind {
                RouteKind::Http => {
                    let api: Api<HttpRoute> = Api::namespaced(client, &ns);
                    self.patch_status(&mut writes, api, &name, version, existing.as_ref(), value);
                }
                RouteKind::Grpc => {
                    let api: Api<GrpcRoute> = Api::namespaced(client, &ns);
                    self.patch_status(&mut writes, api, &name, version, existing.as_ref(), value);
                }
            }
        }
        self.condition_told
            .retain(|(route, _), _| routes_seen.contains(route));
        self.refusals_told.retain(&routes_seen);
        self.push_failed_told
            .retain(|route| routes_seen.contains(route));
        self.reported_routes
            .retain(|route| routes_seen.contains(route));
        self.write_unreadable_route_statuses(&mut writes, unreadable_routes, controller, &now);
        self.write_ownership_parents(&mut writes, snapshot, output);
        self.status_writes.run(writes).await;
    }

    /// Writes this controller's parents into the hostname-ownership ConfigMap when the watched
    /// one lists others ([`ownership_parents`]), as a status is written: in the background,
    /// at the resourceVersion watched, and held back for a while after a failure. An admission
    /// webhook on ConfigMaps that hangs, or one that refuses, would otherwise hold up or cost
    /// every round; and a write dropped for a newer one may still land, which its
    /// resourceVersion, older by then, turns into a conflict rather than an overwrite.
    fn write_ownership_parents(
        &self,
        writes: &mut Writes,
        snapshot: &Snapshot,
        output: &translate::Output,
    ) {
        let Some(configmap) = &self.options.ownership_parents else {
            return;
        };
        let key = WriteKey::Object(format!(
            "/api/v1/namespaces/{}/configmaps/{}",
            configmap.namespace, configmap.name
        ));
        writes.seen.insert(key.clone());
        let Some(due) = ownership_parents::due(configmap, snapshot, &output.statuses) else {
            writes.settled.push(key);
            return;
        };
        let content = content_digest(&Value::String(due.list.clone()));
        let version = due.resource_version.as_deref();
        if self.status_writes.covered(&key, &content, version) {
            return;
        }
        let digest = write_digest(&content, version);
        let write = ownership_parents::write(
            self.client.clone(),
            configmap.clone(),
            due.list,
            due.resource_version,
        );
        let write = async move {
            match write.await {
                Ok(()) => Written::Done,
                Err(kube::Error::Api(e)) if e.code == 409 => Written::Conflict,
                Err(e) => Written::Failed(e.to_string()),
            }
        };
        writes
            .patches
            .push((key, digest, Box::pin(write.in_current_span())));
    }

    /// The plane that serves `parent`: its Gateway's, or the peer that serves it in its place
    /// ([`Reconciler::serving_peer`]).
    fn serving_plane<'p>(
        &self,
        output: &'p translate::Output,
        planes: &'p BTreeMap<PlaneKey, PlaneInfo>,
        parent: &translate::ParentRef,
    ) -> Option<&'p PlaneKey> {
        let gateway = output.statuses.parent_gateway(parent)?;
        let plane = output.planes.get(&gateway)?;
        Some(self.serving_peer(plane, planes).unwrap_or(plane))
    }

    /// For the plane of a Gateway never applied (being applied, or its first apply failed),
    /// another plane of the round on the tunnel its render names that serves it
    /// ([`serves_its_tunnel`]), if any: every plane on a tunnel is given the union of its
    /// routes (the documented move of a Gateway onto a plane of its own on the class tunnel
    /// leaves the shared pool there), so that plane's pods serve the Gateway's routes and the
    /// tunnel's document, written from it, carries them. A broken plane alone on the tunnel
    /// keeps its own rules, and pods all down or none listed serve nothing.
    fn serving_peer<'p>(
        &self,
        plane: &PlaneKey,
        planes: &'p BTreeMap<PlaneKey, PlaneInfo>,
    ) -> Option<&'p PlaneKey> {
        let PlaneKey::Dedicated(gateway) = plane else {
            return None;
        };
        if planes.contains_key(plane) {
            return None;
        }
        let tunnel = self.unapplied_tunnels.get(gateway)?;
        planes
            .iter()
            .find(|(peer, info)| {
                info.identity.as_ref() == Some(tunnel)
                    && serves_its_tunnel(peer, info, planes, &self.push_failures)
            })
            .map(|(peer, _)| peer)
    }

    /// Takes in the render failures an earlier leader told, as the Gateways' `Programmed`
    /// says: each stands, told, until this process's own apply of the plane says otherwise
    /// (applied, or failing for another reason, which is told). A new leader would otherwise
    /// take the message back in its first round, and tell it again in a second `RenderFailed`
    /// once its own apply fails.
    pub(super) fn inherit_render_failures(
        &mut self,
        snapshot: &Snapshot,
        output: &translate::Output,
    ) {
        for gateway in &snapshot.gateways {
            let Some(key) = object_key(gateway) else {
                continue;
            };
            // A dedicated plane's only.
            if !matches!(output.planes.get(&key), Some(PlaneKey::Dedicated(_))) {
                continue;
            }
            let told = gateway
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .filter(|c| c.type_ == "Programmed" && c.status == "False")
                .find_map(|c| c.message.strip_prefix(RENDER_FAILED));
            if let Some(reason) = told {
                self.render_failures.insert(key.clone(), reason.to_owned());
                self.render_failed_told.insert(key, reason.to_owned());
            }
        }
    }

    /// Whether `plane`'s routes keep the push failure an earlier leader told them
    /// ([`Reconciler::inherited_push_failures`]).
    pub(super) fn inherited(&self, plane: &PlaneKey) -> bool {
        self.inherited_push_failures
            .as_ref()
            .is_some_and(|planes| planes.contains_key(plane))
    }

    /// Whether `plane`'s own routes were told its own failure by an earlier leader, and this
    /// process has no verdict on it yet: its run of failures was reported, and its pods being
    /// created again say so at once. (A plane whose routes were told another plane's failure,
    /// or nothing, goes by the grace.)
    pub(super) fn inherited_told(&self, plane: &PlaneKey) -> bool {
        self.inherited_push_failures
            .as_ref()
            .and_then(|planes| planes.get(plane))
            .is_some_and(|inherited| inherited.told && !inherited.decided)
    }

    /// `plane` has a verdict of this process's own ([`Reconciler::settle_inherited`]).
    pub(super) fn inherit_no_more(&mut self, plane: &PlaneKey) {
        if let Some(inherited) = self
            .inherited_push_failures
            .as_mut()
            .and_then(|planes| planes.get_mut(plane))
        {
            inherited.decided = true;
        }
    }

    /// A push of this process's reached `plane`'s listed pods, or tried to.
    pub(super) fn inherited_pushed(&mut self, plane: &PlaneKey) {
        if let Some(inherited) = self
            .inherited_push_failures
            .as_mut()
            .and_then(|planes| planes.get_mut(plane))
        {
            inherited.pushed = std::time::Instant::now();
        }
    }

    /// Ends what an earlier leader told the planes of each tunnel whose every plane has a
    /// verdict of this process's own: a route's failure may have been another plane's on its
    /// tunnel, which a push reaching the route's own pods says nothing of.
    ///
    /// A plane no push of this process's has reached for as long as it keeps a run of
    /// failures with no pod listed (no pod, no config-API token) counts as decided: nothing
    /// this process does would decide it, and what was told would otherwise stand for good.
    /// One with no pod listed runs no connector: it holds up its own routes only, not its
    /// tunnel's.
    pub(super) fn settle_inherited(&mut self, planes: &BTreeMap<PlaneKey, PlaneInfo>) {
        let Some(inherited) = &mut self.inherited_push_failures else {
            return;
        };
        let keep = self.options.podless_keep;
        let tunnel = |plane: &PlaneKey| planes.get(plane).and_then(|info| info.identity.as_ref());
        // The tunnels held, by planes with pods listed.
        let holding: Vec<_> = inherited
            .iter()
            .filter(|(_, i)| !i.decided && i.pushed.elapsed() < keep)
            .map(|(plane, _)| {
                let listed = planes.get(plane).is_some_and(|info| !info.pods.is_empty());
                (plane.clone(), tunnel(plane).filter(|_| listed))
            })
            .collect();
        inherited.retain(|plane, _| {
            holding.iter().any(|(other, other_tunnel)| {
                other == plane || (other_tunnel.is_some() && *other_tunnel == tunnel(plane))
            })
        });
    }

    /// When something kept ends with time alone, the soonest after `after` (the start of the
    /// round that judged it): a plane with no pod listed comes to count as scaled to zero, or
    /// what an earlier leader told of a plane no push reaches is kept no longer
    /// ([`Reconciler::settle_inherited`]). A round then says so, rather than the next one a
    /// change or the resync brings; one that fell within the round that judged it, after the
    /// judging, is due at once. (On the process's clock: a test pausing tokio's would see the
    /// instant come before the process does.)
    pub(super) fn next_due(&self, after: std::time::Instant) -> Option<std::time::Instant> {
        let keep = self.options.podless_keep;
        let inherited = self
            .inherited_push_failures
            .iter()
            .flatten()
            .filter(|(_, i)| !i.decided)
            .filter_map(|(_, i)| i.pushed.checked_add(keep));
        inherited
            .chain(self.pusher.next_scaled_to_zero(after))
            .filter(|at| *at > after)
            .min()
    }

    /// The planes an earlier leader told routes their pods had not taken the config
    /// (`ProxyConfigPushed=False`, `PushFailed`, in the routes' status as watched), each judged
    /// by the plane that serves the route's parent, as [`Reconciler::report`] tells it. A
    /// leader that has just taken over and finds such a plane's pods being created goes on
    /// telling it, rather than take it back for the start grace.
    pub(super) fn planes_told_push_failed(
        &self,
        snapshot: &Snapshot,
        output: &translate::Output,
        planes: &BTreeMap<PlaneKey, PlaneInfo>,
    ) -> HashMap<PlaneKey, Inherited> {
        let controller = self.options.translate.controller_name.as_str();
        let statuses = snapshot
            .http_routes
            .iter()
            .map(|r| {
                (
                    RouteKind::Http,
                    r.metadata.namespace.as_deref(),
                    r.metadata.name.as_deref(),
                    r.status.as_ref().and_then(|s| serde_json::to_value(s).ok()),
                )
            })
            .chain(snapshot.grpc_routes.iter().map(|r| {
                (
                    RouteKind::Grpc,
                    r.metadata.namespace.as_deref(),
                    r.metadata.name.as_deref(),
                    r.status.as_ref().and_then(|s| serde_json::to_value(s).ok()),
                )
            }));
        // Planes whose routes carried a failure, and those whose own failure it was.
        let (mut failing, mut told) = (HashSet::new(), HashSet::new());
        for (kind, ns, name, existing) in statuses {
            let (Some(ns), Some(name), Some(existing)) = (ns, name, existing) else {
                continue;
            };
            let route_key = translate::RouteKey {
                kind,
                key: ObjectKey::new(ns, name),
            };
            let Some(ours) = output.statuses.routes.get(&route_key) else {
                continue;
            };
            for parent in ours {
                let failed = status::condition_before(
                    Some(&existing),
                    controller,
                    [&parent.parent_ref],
                    PROXY_CONFIG_PUSHED,
                )
                .filter(|c| c["status"] == "False" && c["reason"] == "PushFailed")
                .map(|c| c["message"].as_str().unwrap_or_default());
                let plane = output
                    .statuses
                    .parent_gateway(&parent.parent_ref)
                    .and_then(|gateway| output.planes.get(&gateway));
                if let (Some(message), Some(plane)) = (failed, plane) {
                    let plane = self.serving_peer(plane, planes).unwrap_or(plane);
                    failing.insert(plane.clone());
                    if !is_peers_failure(message) {
                        told.insert(plane.clone());
                    }
                }
            }
        }
        // The failure told may have been another plane's on the tunnel: every plane of it is
        // kept, told its own failure or not.
        let tunnels: Vec<_> = failing
            .iter()
            .filter_map(|plane| planes.get(plane)?.identity.as_ref())
            .collect();
        let peers = planes
            .iter()
            .filter(|(_, info)| info.identity.as_ref().is_some_and(|t| tunnels.contains(&t)))
            .map(|(plane, _)| plane.clone());
        let since = self.took_lead;
        failing
            .into_iter()
            .chain(peers)
            .map(|plane| {
                let inherited = Inherited {
                    told: told.contains(&plane),
                    decided: false,
                    pushed: since,
                };
                (plane, inherited)
            })
            .collect()
    }

    /// Per plane whose tunnel's document could not be written, or is still being written,
    /// whether the document last
    /// written to the tunnel it serves now carries every rule of each route on it: the tunnel
    /// then serves the route as it is. A route missing is not carried (nor is any before this
    /// process has written the tunnel). One pass over each such plane's rules.
    fn on_their_tunnels<'o>(
        &self,
        output: &'o translate::Output,
        planes: &BTreeMap<PlaneKey, PlaneInfo>,
    ) -> HashMap<&'o PlaneKey, HashMap<&'o translate::RouteKey, bool>> {
        let mut out = HashMap::new();
        for (plane, owners) in &output.owners {
            if !self.tunnel_failures.contains_key(plane) && !self.tunnel_writing.contains(plane) {
                continue;
            }
            let (Some(carried), Some(config)) = (
                planes
                    .get(plane)
                    .and_then(|info| info.identity)
                    .and_then(|identity| self.tunnel_sync.landed(&identity.id)),
                output.configs.get(plane),
            ) else {
                continue;
            };
            let mut routes: HashMap<&translate::RouteKey, bool> = HashMap::new();
            for (owner, rule) in owners.iter().zip(&config.rules) {
                if let Some(route) = owner {
                    let on = carried.carries(&rule.hostnames);
                    *routes.entry(route).or_insert(true) &= on;
                }
            }
            out.insert(plane, routes);
        }
        out
    }

    /// A route this build cannot read is left out of every plane: where our parents said it
    /// was accepted, they now say it is not, and why (the decoder's words), so that neither
    /// its owner nor what follows `Accepted` (DNS records) takes it as served.
    fn write_unreadable_route_statuses(
        &self,
        writes: &mut Writes,
        routes: &[UnreadableRoute],
        controller: &str,
        now: &str,
    ) {
        for route in routes {
            let message = format!(
                "this controller cannot read the route, which no proxy serves: {}",
                route.noted.error
            );
            let Some(value) = status::unreadable_route(
                route.noted.status.as_ref(),
                controller,
                route.noted.generation,
                &message,
                now,
            ) else {
                continue;
            };
            let resource = match route.key.kind {
                RouteKind::Http => kube::core::ApiResource::erase::<HttpRoute>(&()),
                RouteKind::Grpc => kube::core::ApiResource::erase::<GrpcRoute>(&()),
            };
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), &route.key.key.namespace, &resource);
            self.patch_status_of(
                writes,
                &resource.kind,
                api,
                &route.key.key.name,
                route.noted.resource_version.clone(),
                route.noted.status.as_ref(),
                value,
            );
        }
    }

    /// Writes the status of each ListenerSet whose parent is one of our Gateways, at the
    /// version it is read at (`ListenerSet`, or the experimental `XListenerSet`).
    fn write_listener_set_statuses(
        &self,
        writes: &mut Writes,
        snapshot: &Snapshot,
        output: &translate::Output,
        pending: &BTreeMap<ObjectKey, String>,
        now: &str,
    ) {
        let Some(resource) = self.listener_set_resource.borrow().clone() else {
            return;
        };
        for set in &snapshot.listener_sets {
            let Some(key) = object_key(set) else { continue };
            let Some(desired) = output.statuses.listener_sets.get(&key) else {
                continue;
            };
            let existing = set
                .status
                .as_ref()
                .and_then(|s| serde_json::to_value(s).ok());
            let mut value = status::listener_set(
                desired,
                pending.get(&desired.gateway).map(String::as_str),
                existing.as_ref(),
                now,
            );
            if resource.kind == "XListenerSet" {
                // Its status is read through the v1 type, which has no listener ports: what
                // else it says decides whether to write (the ports follow the spec, whose
                // changes change the observed generation).
                if status::contains(existing.as_ref(), &value) {
                    continue;
                }
                // The experimental kind requires each listener's port in its status.
                status::add_listener_ports(&mut value, &set.spec.listeners);
            }
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), &key.namespace, &resource);
            self.patch_status_of(
                writes,
                &resource.kind,
                api,
                &key.name,
                set.resource_version(),
                existing.as_ref(),
                value,
            );
        }
    }

    /// Writes each GatewayConfig's status: which Gateways of the controller name it, and
    /// whether their planes render from it, with the message of their `InvalidParameters`.
    fn write_gateway_config_statuses(
        &self,
        writes: &mut Writes,
        snapshot: &Snapshot,
        output: &translate::Output,
        now: &str,
    ) {
        for config in &snapshot.gateway_configs {
            let (Some(namespace), Some(name)) = (
                config.metadata.namespace.as_deref(),
                config.metadata.name.as_deref(),
            ) else {
                continue;
            };
            let naming: Vec<&Arc<Gateway>> = snapshot
                .gateways
                .iter()
                .filter(|gw| {
                    gw.metadata.namespace.as_deref() == Some(namespace)
                        && gw.metadata.deletion_timestamp.is_none()
                        && render::config_name(gw) == Some(name)
                })
                .collect();
            let users: Vec<ConfigUser> = naming
                .iter()
                .filter_map(|gw| {
                    let key = object_key(gw)?;
                    // Only the controller's Gateways: another class's are not its to judge.
                    let status = output.statuses.gateways.get(&key)?;
                    let render_error = status
                        .conditions
                        .iter()
                        .find(|c| {
                            c.kind == ConditionType::Accepted
                                && !c.status
                                && c.reason == Reason::InvalidParameters
                        })
                        .map(|c| c.message.clone());
                    Some(ConfigUser {
                        gateway: key.name,
                        render_error,
                    })
                })
                .collect();
            // Named by Gateways of other classes only: theirs to judge. Two controllers each
            // writing their own `InUse` would overwrite each other at every round.
            if users.is_empty() && !naming.is_empty() {
                continue;
            }
            let existing = config
                .status
                .as_ref()
                .and_then(|s| serde_json::to_value(s).ok());
            let desired =
                status::gateway_config(config.metadata.generation, &users, existing.as_ref(), now);
            let api: Api<GatewayConfig> = Api::namespaced(self.client.clone(), namespace);
            self.patch_status(
                writes,
                api,
                name,
                config.resource_version(),
                existing.as_ref(),
                desired,
            );
        }
    }

    /// Writes the `SecretsResolved` and `Valid` of each GatewayClassConfig one of the
    /// controller's classes names, as this round judged it
    /// ([`crate::class_parameters::settle`]).
    fn write_gateway_class_config_statuses(
        &self,
        writes: &mut Writes,
        snapshot: &Snapshot,
        now: &str,
    ) {
        // Which controllers' GatewayClasses name each config: one named by none of ours is not
        // ours to judge. The verdict depends on each controller's own namespace, so two
        // installations writing theirs on a config no class names (yet, or any more) would
        // overwrite each other at every round.
        let controller = &self.options.translate.controller_name;
        let mut named: BTreeMap<&str, bool> = BTreeMap::new();
        for class in &snapshot.gateway_classes {
            let Some(p) = &class.spec.parameters_ref else {
                continue;
            };
            if p.group == translate::GATEWAY_CONFIG_GROUP && p.kind == GATEWAY_CLASS_CONFIG_KIND {
                *named.entry(p.name.as_str()).or_default() |=
                    class.spec.controller_name == *controller;
            }
        }
        for config in &snapshot.gateway_class_configs {
            let Some(name) = config.metadata.name.as_deref() else {
                continue;
            };
            if named.get(name) != Some(&true) {
                continue;
            }
            let Some(verdict) = self.class_configs.get(name) else {
                continue;
            };
            let wanted: Vec<KubeCondition> = verdict
                .conditions()
                .into_iter()
                .map(|(kind, status, reason, message)| KubeCondition {
                    kind: kind.to_owned(),
                    status: if status { Truth::True } else { Truth::False },
                    reason: reason.to_owned(),
                    message,
                    observed_generation: verdict.generation,
                })
                .collect();
            let existing = config
                .status
                .as_ref()
                .and_then(|s| serde_json::to_value(s).ok());
            let desired = json!({
                "conditions": status::conditions(
                    &wanted,
                    existing.as_ref().and_then(|s| s.get("conditions")),
                    now,
                ),
            });
            let api: Api<GatewayClassConfig> = Api::all(self.client.clone());
            self.patch_status(
                writes,
                api,
                name,
                config.resource_version(),
                existing.as_ref(),
                desired,
            );
        }
    }

    /// Writes each BackendTLSPolicy's ancestors: ours (one per Gateway of the controller whose
    /// routes use a port the policy targets), beside other controllers' entries. A policy that
    /// applies to none of our Gateways loses the entries we wrote before, and is not written
    /// when it has none.
    fn write_backend_tls_policy_statuses(
        &self,
        writes: &mut Writes,
        snapshot: &Snapshot,
        output: &translate::Output,
        now: &str,
    ) {
        let controller = &self.options.translate.controller_name;
        for policy in &snapshot.backend_tls_policies {
            let Some(key) = object_key(policy) else {
                continue;
            };
            let ours = output
                .statuses
                .backend_tls_policies
                .get(&key)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let existing = policy
                .status
                .as_ref()
                .and_then(|s| serde_json::to_value(s).ok());
            let had_ours = existing
                .as_ref()
                .and_then(|s| s.get("ancestors"))
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|a| status::written_by(a, controller)));
            if ours.is_empty() && !had_ours {
                continue;
            }
            let desired = status::policy(ours, controller, existing.as_ref(), now);
            let api: Api<BackendTlsPolicy> = Api::namespaced(self.client.clone(), &key.namespace);
            self.patch_status(
                writes,
                api,
                &key.name,
                policy.resource_version(),
                existing.as_ref(),
                desired,
            );
        }
    }

    /// Writes `desired` as the object's status (a merge patch of the status subresource)
    /// unless the object already says it, a write of it still runs, or one failed lately
    /// ([`StatusWrites`]). The patch carries the resourceVersion the status was
    /// computed from: if the object changed meanwhile (another controller wrote its parent),
    /// the API server refuses it and the round its watch event starts writes it afresh.
    fn patch_status<K>(
        &self,
        writes: &mut Writes,
        api: Api<K>,
        name: &str,
        resource_version: Option<String>,
        existing: Option<&Value>,
        desired: Value,
    ) where
        K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
        K: Send + 'static,
        K::DynamicType: Default,
    {
        let kind = K::kind(&K::DynamicType::default()).into_owned();
        self.patch_status_of(
            writes,
            &kind,
            api,
            name,
            resource_version,
            existing,
            desired,
        );
    }

    /// [`Self::patch_status`] for an object of `kind`, through `api` of any resource.
    #[allow(clippy::too_many_arguments)]
    fn patch_status_of<K>(
        &self,
        writes: &mut Writes,
        kind: &str,
        api: Api<K>,
        name: &str,
        resource_version: Option<String>,
        existing: Option<&Value>,
        mut desired: Value,
    ) where
        K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
        K: Send + 'static,
    {
        // The lock is never held across an await.
        let pruned = self.pruned.clone();
        pruned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .strip(kind, &mut desired, std::time::Instant::now());
        let key = WriteKey::Status(format!("{}/{name}", api.resource_url()));
        writes.seen.insert(key.clone());
        if status::contains(existing, &desired) {
            writes.settled.push(key);
            return;
        }
        let content = content_digest(&desired);
        if self
            .status_writes
            .covered(&key, &content, resource_version.as_deref())
        {
            return;
        }
        let digest = write_digest(&content, resource_version.as_deref());
        let (kind, name) = (kind.to_owned(), name.to_owned());
        let write = async move {
            let patch = json!({
                "metadata": { "resourceVersion": resource_version },
                "status": desired,
            });
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(written) => {
                    let written = serde_json::to_value(&written).ok();
                    let dropped = pruned
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .learn(
                            &kind,
                            &patch["status"],
                            written.as_ref().and_then(|w| w.get("status")),
                            std::time::Instant::now(),
                        );
                    if !dropped.is_empty() {
                        tracing::info!(
                            %kind,
                            fields = %dropped.join(", "),
                            "the cluster's CRD has no such status fields; they are left out"
                        );
                    }
                    Written::Done
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    tracing::debug!(
                        name,
                        "status changed meanwhile; rewritten once the object's newer version is seen"
                    );
                    Written::Conflict
                }
                Err(e) => {
                    tracing::warn!(%kind, name, error = %e, "writing status failed");
                    Written::Failed(e.to_string())
                }
            }
        };
        writes
            .patches
            .push((key, digest, Box::pin(write.in_current_span())));
    }
}

/// Whether the pods of `plane` (`info`) serve the routes of every plane on its tunnel: it is
/// given them (an applied plane or the shared pool is; a broken one only while such a plane is
/// on its tunnel, as it keeps its own rules alone otherwise), it has pods listed, and they are
/// not all down (then it runs no connector, and the edge hands it none of the tunnel's
/// requests).
fn serves_its_tunnel(
    plane: &PlaneKey,
    info: &PlaneInfo,
    planes: &BTreeMap<PlaneKey, PlaneInfo>,
    failures: &HashMap<PlaneKey, PushFailure>,
) -> bool {
    let given = !info.kept
        || planes
            .values()
            .any(|i| !i.kept && i.identity.is_some() && i.identity == info.identity);
    given && !runs_no_connector(info, failures.get(plane))
}

/// The planes whose pods serve the routes of `plane` (the one serving a parent): it, and the
/// others on its tunnel that serve them ([`serves_its_tunnel`]), each given the union of the
/// tunnel's routes and handed a share of its requests. A rule any of them refuses is not
/// served for that share.
fn planes_serving<'p>(
    plane: &'p PlaneKey,
    planes: &'p BTreeMap<PlaneKey, PlaneInfo>,
    failures: &HashMap<PlaneKey, PushFailure>,
) -> Vec<&'p PlaneKey> {
    let tunnel = planes.get(plane).and_then(|info| info.identity.as_ref());
    let peers = planes.iter().filter(move |(peer, info)| {
        *peer != plane
            && tunnel.is_some()
            && info.identity.as_ref() == tunnel
            && serves_its_tunnel(peer, info, planes, failures)
    });
    std::iter::once(plane)
        .chain(peers.map(|(peer, _)| peer))
        .collect()
}

/// Whether a plane runs no connector, so the edge hands it none of its tunnel's requests: it
/// has no pod listed, or every pod of it is down (`failure`, its push failure if it has one).
fn runs_no_connector(info: &PlaneInfo, failure: Option<&PushFailure>) -> bool {
    info.pods.is_empty() || failure.is_some_and(|f| f.all_down)
}

/// Each plane whose routes a push failure fails, with the plane that failed and why: its own,
/// or another's on its tunnel. The planes on a tunnel serve the union of its routes and the
/// edge hands each a share of its requests, so one whose pods have not taken the config fails
/// the routes of every Gateway on the tunnel.
///
/// But for a plane whose pods are all down: it runs no connector, so the edge hands it none of
/// the tunnel's requests. Its failure is no other plane's; and its own routes', only while no
/// other plane on its tunnel serves them ([`serves_its_tunnel`]), as that
/// one's pods serve them otherwise, reported by its own failure if it has one. The Gateway's
/// `Programmed` (no ready replica) tells of its pods either way. Nor while they are all still
/// being created, within the grace: that is no fault yet.
fn push_failed(
    failures: &HashMap<PlaneKey, PushFailure>,
    planes: &BTreeMap<PlaneKey, PlaneInfo>,
) -> HashMap<PlaneKey, (PlaneKey, String)> {
    let mut failed = HashMap::new();
    if failures.is_empty() {
        return failed;
    }
    for (plane, info) in planes {
        // The other planes on its tunnel.
        let others = || {
            planes.iter().filter(move |(p, i)| {
                *p != plane && info.identity.is_some() && i.identity == info.identity
            })
        };
        let peer = || {
            others().find_map(|(p, i)| {
                let failure = failures.get(p).filter(|f| !runs_no_connector(i, Some(f)))?;
                Some((p, &failure.reason))
            })
        };
        let served_by_others = || others().any(|(p, i)| serves_its_tunnel(p, i, planes, failures));
        // Not while its pods are still starting ([`PushFailure::starting`]).
        let own = failures
            .get_key_value(plane)
            .filter(|(_, f)| !f.starting)
            .filter(|(_, f)| !runs_no_connector(info, Some(f)) || !served_by_others());
        match (own, own.is_none().then(peer).flatten()) {
            (Some((by, failure)), _) => {
                failed.insert(plane.clone(), (by.clone(), failure.reason.clone()));
            }
            (None, Some((by, reason))) => {
                let whose = match by {
                    PlaneKey::Shared => "the shared pool".to_owned(),
                    gateway => gateway.to_string(),
                };
                let reason = format!("{PEERS_PODS}{whose}{ON_THE_SAME_TUNNEL}{reason}");
                failed.insert(plane.clone(), (by.clone(), reason));
            }
            (None, None) => {}
        }
    }
    failed
}

/// How [`refused_rules`] opens a refusal a pod made: `proxy pod 10.0.0.5:8081 of the ...`.
const BY_POD: &str = "proxy pod ";
/// How [`refused_rules`] words a rule left out for the regex budget, after `the {plane} `.
const NO_ROOM: &str = "plane's document has no room for the regexes of";
/// What [`refused_rules`]'s refusals are joined with in a condition's message.
const REFUSALS_JOINED: &str = "; ";

/// Per route, the rules of it that proxy pods refused this round, each with the plane whose
/// pods did and the reason, in one order whatever the order they were found in (by
/// [`refusal_key`]), each once. A rule of the controller's own (no route) that a pod refuses
/// is a controller bug: logged.
pub(super) fn refused_rules(
    output: &translate::Output,
    outcomes: &[(PlaneKey, push::PlaneOutcome)],
) -> BTreeMap<translate::RouteKey, Vec<(PlaneKey, String)>> {
    let mut keyed: BTreeMap<translate::RouteKey, Vec<(String, PlaneKey, String)>> = BTreeMap::new();
    for (plane, outcome) in outcomes {
        for refused in &outcome.refused {
            let owner = output
                .owners
                .get(plane)
                .and_then(|owners| owners.get(refused.rule))
                .and_then(Option::as_ref);
            let name = refused.name.as_deref().unwrap_or("without a name");
            let by = match refused.pod {
                Some(pod) => format!("{BY_POD}{pod} of the {plane} plane refused"),
                None => format!("the {plane} {NO_ROOM}"),
            };
            match owner {
                Some(route) => {
                    let said = format!(
                        "{by} rule {name}, which is left out (the route's other rules are \
                         served): {}",
                        refused.reason
                    );
                    let entry = (refusal_key(&said), plane.clone(), said);
                    keyed.entry(route.clone()).or_default().push(entry);
                }
                None => tracing::error!(
                    %plane,
                    rule = name,
                    pod = ?refused.pod,
                    reason = %refused.reason,
                    "a rule of the controller's own is left out"
                ),
            }
        }
    }
    keyed
        .into_iter()
        .map(|(route, mut refused)| {
            refused.sort_unstable();
            refused.dedup_by(|a, b| a.0 == b.0);
            let refused = refused
                .into_iter()
                .map(|(_, plane, said)| (plane, said))
                .collect();
            (route, refused)
        })
        .collect()
}

/// What a route is told of the rules the pods of `of` refuse (`refused`, the route's, as
/// [`refused_rules`] words them): the condition of a parent, of the planes serving it
/// ([`planes_serving`]), and the Event of one plane's refusals. `None` when they refuse none
/// of them: what a plane not serving the parent refuses never shows on it.
fn refusals_of(refused: &[(PlaneKey, String)], of: &[&PlaneKey]) -> Option<String> {
    let said: Vec<&str> = refused
        .iter()
        .filter(|(p, _)| of.contains(&p))
        .map(|(_, said)| said.as_str())
        .collect();
    (!said.is_empty()).then(|| said.join(REFUSALS_JOINED))
}

/// The refusals a condition's message says, as [`refused_rules`] words and joins them: split
/// only where one of its refusals opens, as a pod's reason may hold the separator itself. A
/// rule left out for want of room opens with its plane's name, one of `planes` (a dedicated
/// plane's has a space in it).
fn refusals_said<'m>(message: &'m str, planes: &[&PlaneKey]) -> Vec<&'m str> {
    let no_room: Vec<String> = planes
        .iter()
        .map(|plane| format!("the {plane} {NO_ROOM}"))
        .collect();
    let opens = |rest: &str| {
        rest.starts_with(BY_POD)
            || no_room
                .iter()
                .any(|opener| rest.starts_with(opener.as_str()))
    };
    let mut said = Vec::new();
    let mut from = 0;
    for (at, _) in message.match_indices(REFUSALS_JOINED) {
        let next = at + REFUSALS_JOINED.len();
        if opens(&message[next..]) {
            said.push(&message[from..at]);
            from = next;
        }
    }
    said.push(&message[from..]);
    said
}

/// A refusal as [`refused_rules`] words it, without what depends on how the pusher came to
/// find it rather than on what was refused: the pod named (the first of the plane's pods to
/// refuse the rule, which may be another by the time a new leader finds it) and the rule's
/// position in the document that pod was pushed (`rules[3]`: which rules were left out before
/// it depends on what was found first). Refusals alike in this are one refusal, told once.
pub(super) fn refusal_key(said: &str) -> String {
    const POSITION: &str = "rules[";
    let mut key = String::with_capacity(said.len());
    let mut rest = said;
    while let Some((at, marker)) = [BY_POD, POSITION]
        .into_iter()
        .filter_map(|marker| Some((rest.find(marker)?, marker)))
        .min()
    {
        let (before, after) = rest.split_at(at + marker.len());
        key.push_str(before);
        let dropped = if marker == BY_POD {
            after.find(' ')
        } else {
            after.find(|c: char| !c.is_ascii_digit())
        };
        rest = &after[dropped.unwrap_or(after.len())..];
    }
    key.push_str(rest);
    key
}

/// The planes of `planes` that a refusal told (as [`refused_rules`] words it) names; with none
/// named (the wording of another release), `serving`, the plane that serves the parent it was
/// told of.
fn refusal_planes(
    said: &str,
    planes: &[&PlaneKey],
    serving: Option<&PlaneKey>,
) -> BTreeSet<PlaneKey> {
    let named: BTreeSet<PlaneKey> = planes
        .iter()
        .filter(|plane| said.contains(&format!("the {plane} plane")))
        .map(|&plane| plane.clone())
        .collect();
    if named.is_empty() {
        serving.into_iter().cloned().collect()
    } else {
        named
    }
}

/// What one plane's pods refuse of a route's rules, by the [`refusal_key`] of each: compared
/// as a set, so a refusal is the same whatever order its rules were found in.
pub(super) type RefusalKeys = BTreeSet<String>;

/// What a round's push outcomes say of what each plane's pods refuse: how much of it the
/// round heard decides what may be told and what taken back.
#[derive(Default)]
pub(super) struct RefusalAnswers {
    /// Planes every pod of which answered ([`push::PlaneOutcome::refusals_known`]): what they
    /// refuse is all of it.
    pub(super) known: HashSet<PlaneKey>,
    /// Planes some pod of which answered ([`push::PlaneOutcome::refusals_heard`]): what they
    /// refuse is some of it.
    pub(super) heard: HashSet<PlaneKey>,
}

impl RefusalAnswers {
    /// What `outcomes`, a round's, say.
    pub(super) fn of(outcomes: &[(PlaneKey, push::PlaneOutcome)]) -> Self {
        let planes = |said: fn(&push::PlaneOutcome) -> bool| {
            outcomes
                .iter()
                .filter(|(_, outcome)| said(outcome))
                .map(|(plane, _)| plane.clone())
                .collect()
        };
        Self {
            known: planes(|o| o.refusals_known),
            heard: planes(|o| o.refusals_heard),
        }
    }
}

/// A refusal [`RefusalsTold::untold`] says to tell a route.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Untold {
    pub(super) plane: PlaneKey,
    /// What the plane's pods refuse, as it is recorded once told.
    pub(super) keys: RefusalKeys,
    /// What was told of the plane before (`None`: nothing), by this process or an earlier
    /// leader: still told should the Event not go.
    pub(super) before: Option<RefusalKeys>,
}

/// What routes were told of the rules proxy pods refused: per route and plane, so a route
/// carried by several planes is told what each refuses as that plane's pods answer, and what
/// one plane's pods take again is forgotten without waiting for the others.
///
/// Refusals are compared by their [`refusal_key`]s: one found again by other means (another
/// pod, another order) is the same refusal.
#[derive(Default)]
pub(super) struct RefusalsTold {
    routes: HashMap<String, RouteRefusals>,
}

/// What one route was told of its refused rules.
#[derive(Default)]
struct RouteRefusals {
    /// Per plane: what its pods refuse that this process told (the union of what rounds some
    /// of its pods answered found), or took as told.
    told: BTreeMap<PlaneKey, RefusalKeys>,
    /// What an earlier leader told, as the route's status said at this process's first report
    /// on it: each kept for the planes it names until they answer this process's pushes.
    before: Vec<ToldBefore>,
}

/// A refusal an earlier leader told a route (a parent's condition).
pub(super) struct ToldBefore {
    /// The parent it was told of.
    parent: translate::ParentRef,
    /// The route's generation it was said of.
    generation: Option<i64>,
    /// The condition's message.
    message: String,
    /// Per plane it names, what it says that plane's pods refuse.
    keys: BTreeMap<PlaneKey, RefusalKeys>,
    /// The planes it names whose pods have not answered this process's pushes yet.
    planes: BTreeSet<PlaneKey>,
}

impl ToldBefore {
    /// What an earlier leader told `parent` in a condition saying `message` of the route at
    /// `generation`: each refusal it says is of the planes of `planes` it names, or, naming
    /// none, of `serving`, the plane serving the parent.
    pub(super) fn new(
        parent: translate::ParentRef,
        generation: Option<i64>,
        message: String,
        planes: &[&PlaneKey],
        serving: Option<&PlaneKey>,
    ) -> Self {
        let mut keys: BTreeMap<PlaneKey, RefusalKeys> = BTreeMap::new();
        for said in refusals_said(&message, planes) {
            for plane in refusal_planes(said, planes, serving) {
                keys.entry(plane).or_default().insert(refusal_key(said));
            }
        }
        Self {
            parent,
            generation,
            planes: keys.keys().cloned().collect(),
            keys,
            message,
        }
    }
}

impl RefusalsTold {
    /// Takes in what an earlier leader told `route`, at this process's first report on it.
    pub(super) fn inherit(&mut self, route: &str, told: Vec<ToldBefore>) {
        let told: Vec<ToldBefore> = told.into_iter().filter(|t| !t.planes.is_empty()).collect();
        if !told.is_empty() {
            self.routes.entry(route.to_owned()).or_default().before = told;
        }
    }

    /// What an earlier leader told `parent` of `route` at `generation` and stands, the planes
    /// it names not all answered yet: the condition's message.
    pub(super) fn inherited(
        &self,
        route: &str,
        parent: &translate::ParentRef,
        generation: Option<i64>,
    ) -> Option<&str> {
        self.routes
            .get(route)?
            .before
            .iter()
            .find(|told| told.parent == *parent && told.generation == generation)
            .map(|told| told.message.as_str())
    }

    /// What this round tells `route` of its rules proxy pods refuse (`refused`, this round's,
    /// each with its plane, as [`refused_rules`] words it; the route at `generation`): per
    /// plane, the keys of what its pods refuse, unless told already, by this process or by an
    /// earlier leader (whose word on a plane is taken in, and so used up, once that plane's
    /// pods answer).
    ///
    /// A plane whose round knows all its pods refuse (`answers.known`) refusing none of the
    /// route's rules takes back what it was told: a refusal it makes later is told again. One
    /// whose round heard from some of its pods only (`answers.heard`: another pod failing,
    /// say) tells what they refuse beyond what was told of it (by this process, or by an
    /// earlier leader of the route at `generation`), recorded as the union of the two, and
    /// takes nothing back; what they refuse within an earlier leader's word leaves the word
    /// waiting for all its pods, and beyond it takes the word in whole as told, so that it no
    /// longer stands for the condition. Any other plane (a round cut off, no pod answering,
    /// an outcome of an earlier document) is neither told nor taken back.
    pub(super) fn untold(
        &mut self,
        route: &str,
        refused: &[(PlaneKey, String)],
        answers: &RefusalAnswers,
        generation: Option<i64>,
    ) -> Vec<Untold> {
        let (heard, known) = (&answers.heard, &answers.known);
        let mut refusing: BTreeMap<&PlaneKey, RefusalKeys> = BTreeMap::new();
        for (plane, said) in refused {
            refusing.entry(plane).or_default().insert(refusal_key(said));
        }
        refusing.retain(|plane, _| heard.contains(*plane) || known.contains(*plane));
        let Some(told) = self.routes.get_mut(route) else {
            return refusing
                .into_iter()
                .map(|(plane, keys)| Untold {
                    plane: plane.clone(),
                    keys,
                    before: None,
                })
                .collect();
        };
        let taken = |plane: &PlaneKey| known.contains(plane) && !refusing.contains_key(plane);
        told.told.retain(|plane, _| !taken(plane));
        for before in &mut told.before {
            before.planes.retain(|plane| !taken(plane));
        }
        let mut untold = Vec::new();
        for (plane, keys) in refusing {
            // What was told of the plane: by this process, and by an earlier leader of the
            // route as it is.
            let mut word = None;
            for before in told.before.iter().filter(|b| b.generation == generation) {
                if before.planes.contains(plane) {
                    let keys = before.keys.get(plane).into_iter().flatten().cloned();
                    word.get_or_insert_with(RefusalKeys::new).extend(keys);
                }
            }
            let said: RefusalKeys = word
                .iter()
                .flatten()
                .chain(told.told.get(plane).into_iter().flatten())
                .cloned()
                .collect();
            let all_heard = known.contains(plane);
            let beyond = !keys.is_subset(&said);
            if !all_heard && word.is_some() && !beyond {
                // Some pods saying part of an earlier leader's word: it waits for all of them.
                continue;
            }
            if !all_heard && beyond {
                // Some pods saying more than was told: from now on the route is told what this
                // process hears, and the earlier leaders' words naming the plane, whole, count
                // as told.
                let words = told.before.iter_mut();
                for word in words.filter(|w| w.generation == generation && w.planes.contains(plane))
                {
                    for named in std::mem::take(&mut word.planes) {
                        let keys = word.keys.get(&named).into_iter().flatten().cloned();
                        told.told.entry(named).or_default().extend(keys);
                    }
                }
            }
            let before = (!said.is_empty()).then(|| said.clone());
            let mut told_before = false;
            for before in &mut told.before {
                if before.planes.remove(plane) {
                    told_before |=
                        before.generation == generation && before.keys.get(plane) == Some(&keys);
                }
            }
            if told_before {
                told.told.insert(plane.clone(), keys);
            } else if all_heard {
                if told.told.get(plane) != Some(&keys) {
                    untold.push(Untold {
                        plane: plane.clone(),
                        keys,
                        before,
                    });
                }
            } else if beyond {
                // Heard from some pods only: what they refuse beyond what was told is told,
                // beside it; nothing is taken back.
                untold.push(Untold {
                    plane: plane.clone(),
                    keys: said.into_iter().chain(keys).collect(),
                    before,
                });
            }
        }
        told.before.retain(|before| !before.planes.is_empty());
        if told.told.is_empty() && told.before.is_empty() {
            self.routes.remove(route);
        }
        untold
    }

    /// `route` was told `keys`, what `plane`'s pods refuse of its rules.
    pub(super) fn took(&mut self, route: &str, plane: &PlaneKey, keys: RefusalKeys) {
        let told = self.routes.entry(route.to_owned()).or_default();
        told.told.insert(plane.clone(), keys);
    }

    /// Forgets that `route` was told `keys` of `plane`, unless told something since: what it
    /// was told before, `before`, stands again.
    fn untell(
        &mut self,
        route: &str,
        plane: &PlaneKey,
        keys: &RefusalKeys,
        before: Option<RefusalKeys>,
    ) {
        let Some(told) = self.routes.get_mut(route) else {
            return;
        };
        if told.told.get(plane) != Some(keys) {
            return;
        }
        match before {
            Some(before) => {
                told.told.insert(plane.clone(), before);
            }
            None => {
                told.told.remove(plane);
                if told.told.is_empty() && told.before.is_empty() {
                    self.routes.remove(route);
                }
            }
        }
    }

    /// Forgets the routes not among `routes`.
    pub(super) fn retain(&mut self, routes: &BTreeSet<String>) {
        self.routes.retain(|route, _| routes.contains(route));
    }

    /// Forgets what was told of the planes `keep` rejects (a Gateway deleted, its routes
    /// staying): a plane of the same name later is told what its pods refuse.
    pub(super) fn retain_planes(&mut self, keep: impl Fn(&PlaneKey) -> bool) {
        self.routes.retain(|_, told| {
            told.told.retain(|plane, _| keep(plane));
            for before in &mut told.before {
                before.planes.retain(|plane| keep(plane));
            }
            told.before.retain(|before| !before.planes.is_empty());
            !told.told.is_empty() || !told.before.is_empty()
        });
    }
}

mod recorders;

#[cfg(test)]
mod tests;
