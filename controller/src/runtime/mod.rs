//! The controller's I/O shell: watch the cluster, translate, render and apply dedicated data
//! planes, push configs to proxy pods, write statuses and Events.
//!
//! Every round works from the whole snapshot of the watch caches ([`stores`]): the translation
//! is cheap and pure, so recomputing everything keeps the logic in one place and makes a missed
//! event impossible to miss for long (rounds also run on a resync period, and sooner while a
//! pod lacks its config or when something kept ends with time alone: [`schedule`]). Writes are skipped when the cluster already holds what
//! a round computed.
//!
//! Here: the run loop and the round (planes, pushes, tunnel documents). `apply` writes and
//! removes a plane's objects, and stamps the shared pool's Deployment, in tasks of their own
//! ([`crate::in_flight`]) that no round waits for,
//! `report` writes statuses, Events and the ownership list ([`status`] builds the statuses), in
//! tasks of their own (a round waits for the writes briefly, for Events not at all),
//! [`lease`] elects the one replica that acts, [`health`] serves the controller's endpoint,
//! [`api_client`] builds the Kubernetes client, whose calls but watches are bounded in time.

pub mod api_client;
mod apply;
mod drift;
pub mod health;
pub mod lease;
pub mod optional_apis;
pub mod ownership_parents;
pub mod pod_states;
mod report;
mod schedule;
pub mod status;
pub mod stores;

pub use apply::{fresh_token, REPLICAS_HANDOVER_MANAGER};
pub use report::EventLimits;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gateway_api::experimental::gateways::Gateway;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::{EventType, Reporter};
use kube::{Client, Resource, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tracing::Instrument as _;

use crate::class_parameters::{self, ClassDefaults, ClassSettings, ConfigVerdict};
use crate::cloudflare::{self, TunnelApi, TunnelSync, TunnelTarget};
use crate::gateway_config::DEFAULT_API_TOKEN_KEY;
use crate::held::Held;
use crate::in_flight::InFlight;
use crate::push::{self, PlaneRound, PodOutcome, Pusher};
use crate::render::{
    self, GoControllerNames, PlaneNames, RenderError, RenderSettings, Rendered, CLASS_LABEL,
    GATEWAY_LABEL,
};
use crate::translate::{self, ObjectKey, Options, PlaneKey, Snapshot, TunnelIdentity};
use drift::{LivePlane, OwnedFields};
use stores::{PlaneObjects, Stores, UnreadableRoute};

/// The API calls the runtime makes, as RBAC rules: (API group, resource, verbs). The chart's
/// roles grant exactly these (a test holds them equal). `create` on the rendered kinds is for
/// server-side apply's first write of an object. The Lease calls touch only the controller's own
/// Lease (`--leader-election-id`, in its namespace): the chart holds `get` and `update` to that
/// name (a `create` names no object yet, so RBAC cannot hold it to one).
/// API discovery (which of the optional APIs are served, and how: [`optional_apis`]) takes no
/// rule: every authenticated client may read it (`system:discovery`).
pub const REQUIRED_RBAC: &[(&str, &str, &[&str])] = &[
    (
        "gateway.networking.k8s.io",
        "gatewayclasses",
        &["list", "watch"],
    ),
    ("gateway.networking.k8s.io", "gateways", &["list", "watch"]),
    (
        "gateway.networking.k8s.io",
        "httproutes",
        &["list", "watch"],
    ),
    (
        "gateway.networking.k8s.io",
        "grpcroutes",
        &["list", "watch"],
    ),
    (
        "gateway.networking.k8s.io",
        "referencegrants",
        &["list", "watch"],
    ),
    (
        "gateway.networking.k8s.io",
        "backendtlspolicies",
        &["list", "watch"],
    ),
    (
        "gateway.networking.k8s.io",
        "gatewayclasses/status",
        &["patch"],
    ),
    ("gateway.networking.k8s.io", "gateways/status", &["patch"]),
    // ListenerSets, read at whichever of the two is served.
    (
        "gateway.networking.k8s.io",
        "listenersets",
        &["list", "watch"],
    ),
    (
        "gateway.networking.k8s.io",
        "listenersets/status",
        &["patch"],
    ),
    (
        "gateway.networking.x-k8s.io",
        "xlistenersets",
        &["list", "watch"],
    ),
    (
        "gateway.networking.x-k8s.io",
        "xlistenersets/status",
        &["patch"],
    ),
    // Rendered objects block their Gateway's deletion until they are gone
    // (`blockOwnerDeletion`); where the OwnerReferencesPermissionEnforcement admission plugin
    // runs (OpenShift), setting that takes `update` on the owner's finalizers.
    (
        "gateway.networking.k8s.io",
        "gateways/finalizers",
        &["update"],
    ),
    ("gateway.networking.k8s.io", "httproutes/status", &["patch"]),
    ("gateway.networking.k8s.io", "grpcroutes/status", &["patch"]),
    (
        "gateway.networking.k8s.io",
        "backendtlspolicies/status",
        &["patch"],
    ),
    ("cf.k8s.lex.la", "gatewayconfigs", &["list", "watch"]),
    ("cf.k8s.lex.la", "gatewayconfigs/status", &["patch"]),
    ("cf.k8s.lex.la", "accesspolicies", &["list", "watch"]),
    ("cf.k8s.lex.la", "externalbackends", &["list", "watch"]),
    ("cf.k8s.lex.la", "gatewayclassconfigs", &["list", "watch"]),
    ("cf.k8s.lex.la", "gatewayclassconfigs/status", &["patch"]),
    // Backends of kind ServiceImport, where the Multi-Cluster Services API is served.
    (
        "multicluster.x-k8s.io",
        "serviceimports",
        &["list", "watch"],
    ),
    // Their metadata: the bundle version of Gateway API's (GatewayClass `SupportedVersion`),
    // and when those of ReferenceGrant, ListenerSet and ServiceImport change (discovery is
    // then asked again what is served).
    (
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        &["list", "watch"],
    ),
    ("", "namespaces", &["list", "watch"]),
    // The CA certificates BackendTLSPolicies name.
    ("", "configmaps", &["list", "watch"]),
    (
        "",
        "services",
        &["list", "watch", "get", "create", "patch", "delete"],
    ),
    // `patch`: the generated token Secret takes the Gateway's infrastructure labels and
    // annotations by server-side apply.
    (
        "",
        "secrets",
        &["list", "watch", "get", "create", "patch", "delete"],
    ),
    ("discovery.k8s.io", "endpointslices", &["list", "watch"]),
    // The rendered planes' pods, whose state says why a plane takes no config (still starting,
    // an image that cannot be pulled). A controller refused it goes on without.
    ("", "pods", &["list", "watch"]),
    (
        "apps",
        "deployments",
        &["list", "watch", "get", "create", "patch", "delete"],
    ),
    (
        "networking.k8s.io",
        "networkpolicies",
        &["list", "watch", "get", "create", "patch", "delete"],
    ),
    (
        "autoscaling",
        "horizontalpodautoscalers",
        &["list", "watch", "get", "create", "patch", "delete"],
    ),
    ("events.k8s.io", "events", &["create", "patch"]),
    (
        "coordination.k8s.io",
        "leases",
        &["get", "create", "update"],
    ),
];

/// The verbs on NetworkPolicies a controller that renders none needs
/// ([`RenderSettings::network_policy`] off): finding and removing the ones it rendered before.
pub const NETWORK_POLICY_CLEANUP: &[&str] = &["list", "watch", "get", "delete"];

/// [`REQUIRED_RBAC`] for a controller that renders the planes' NetworkPolicies
/// (`network_policy`) or not: then it only cleans them up ([`NETWORK_POLICY_CLEANUP`]).
pub fn required_rbac(
    network_policy: bool,
) -> Vec<(&'static str, &'static str, &'static [&'static str])> {
    REQUIRED_RBAC
        .iter()
        .map(|&(group, resource, verbs)| match resource {
            "networkpolicies" if !network_policy => (group, resource, NETWORK_POLICY_CLEANUP),
            _ => (group, resource, verbs),
        })
        .collect()
}

/// The field manager of the controller's server-side applies, and its Events' reporter.
pub const FIELD_MANAGER: &str = "cftunnel-controller";
/// Route condition set while a plane's pods have not taken its config for a sustained run.
pub const PROXY_CONFIG_PUSHED: &str = "cf.k8s.lex.la/ProxyConfigPushed";
/// Route condition set, beside `Accepted=True`, on a route its tunnel serves from the last
/// document written while the tunnel's newer document cannot be written.
pub const TUNNEL_DOCUMENT_WRITTEN: &str = "cf.k8s.lex.la/TunnelDocumentWritten";
/// The port name of the config API on rendered and shared proxy Services.
const CONFIG_PORT_NAME: &str = "config";
/// How often at most each tunnel's ingress document is read back, by default: a call per
/// tunnel, so a hundred tunnels spend a twelfth of the API's rate limit (1,200 calls per five
/// minutes per user, whatever the token, shared with the user's dashboard and other tools).
pub const DEFAULT_TUNNEL_READ_BACK: Duration = Duration::from_secs(300);
/// Changes arriving together are handled in one round.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// An unchanged plane is applied again this often, besides whenever the watches show one of
/// its objects departing from what was applied ([`drift`]), plus up to [`REAPPLY_SPREAD`] by
/// its Gateway's uid, so that planes applied together are not all applied again together.
const REAPPLY_AFTER: Duration = Duration::from_secs(300);
/// How long the plane of a Gateway moved to a class not listed stays: the class may come with
/// the same apply and be seen a little after the Gateway.
const UNLISTED_CLASS_GRACE: Duration = Duration::from_secs(10);
/// See [`REAPPLY_AFTER`].
const REAPPLY_SPREAD: Duration = Duration::from_secs(60);
/// Broken planes whose pods are asked for their config at once, at most.
const READ_BACKS_AT_ONCE: usize = 8;

/// Plane applies at once, at most, and plane removals likewise. Each is a few requests in a row,
/// so this many keep the API server busy enough at start without a burst its priority and
/// fairness limits would queue.
const APPLIES_AT_ONCE: usize = 16;

/// The wait before a render whose apply failed is applied again, doubled at each failure in a
/// row up to [`APPLY_RETRY_MAX`]; a changed render is applied at once. Rounds come with every
/// change in the cluster: a plane failing at each would keep the API server (or the admission
/// webhook that refuses it) busy with the same writes.
const APPLY_RETRY_FIRST: Duration = Duration::from_secs(5);
/// See [`APPLY_RETRY_FIRST`].
const APPLY_RETRY_MAX: Duration = Duration::from_secs(300);

/// When the plane of Gateway `uid` is applied again though unchanged: [`REAPPLY_AFTER`] and a
/// share of [`REAPPLY_SPREAD`] the uid picks.
fn reapply_after(uid: &str) -> Duration {
    let spread = uid
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    REAPPLY_AFTER + Duration::from_millis(spread % (REAPPLY_SPREAD.as_millis() as u64 + 1))
}

/// The chart-deployed proxy pool that serves every Gateway without a GatewayConfig.
#[derive(Debug, Clone)]
pub struct SharedPlane {
    /// Its headless Service: the pods to push to are its EndpointSlices'.
    pub service: ObjectKey,
    /// The Secret and key holding its config-API token.
    pub auth_secret: ObjectKey,
    pub auth_key: String,
    /// The Secret and key holding the class tunnel's connector token, for Gateway addresses.
    pub tunnel_secret: Option<(ObjectKey, String)>,
    /// Its Deployment, whose token variable the controller points at the Secret the class
    /// settles on (a GatewayClassConfig's `tunnelTokenSecretRef` over `tunnel_secret`), and
    /// whose pod template it stamps with the digest of that token
    /// ([`render::TUNNEL_TOKEN_HASH_ANNOTATION`]), so that a new one rolls the pool.
    pub deployment: Option<ObjectKey>,
}

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Its `proxy_image` is not read: the planes the translation judges are those rendered
    /// with `render`, once a round.
    pub translate: Options,
    pub render: RenderSettings,
    pub shared: Option<SharedPlane>,
    /// A round runs at least this often, changes or not (re-pushes to restarted pods), and
    /// sooner while a pod lacks its config (after as long as it has, from 1 s up to this).
    pub resync: Duration,
    /// Each tunnel's ingress document is read back from Cloudflare at most this often once
    /// written, and written again if it was changed there (the dashboard, another tool).
    pub tunnel_read_back: Duration,
    pub push_timeout: Duration,
    /// Failed push rounds in a row before routes report it.
    pub sustained_after: u32,
    /// How long those rounds must have been failing, too.
    pub sustained_for: Duration,
    /// How long rounds that find no pod of a plane listed keep its run of failed pushes (and
    /// a failure told) going: a pod replaced, its successor not listed yet.
    pub podless_keep: Duration,
    /// How long a plane's pods may be starting (none of their containers run yet), and its
    /// pushes failing, while its sustained push failure is not reported
    /// ([`pod_states::START_GRACE`]).
    pub start_grace: Duration,
    /// This controller's pod, named in its Events.
    pub instance: Option<String>,
    /// The Cloudflare API (tunnel ingress documents).
    pub cloudflare_api_base: String,
    /// The controller's Cloudflare API token, for tunnels whose GatewayConfig names none (and
    /// the shared plane's). Without one, those tunnels' documents are not written.
    pub cloudflare_api_token: Option<String>,
    /// Leader election among replicas; `None`: this replica always reconciles.
    pub lease: Option<lease::LeaseOptions>,
    /// How long, once the other watch caches are filled, to wait for the optional kinds' first
    /// lists (BackendTLSPolicy, ExternalBackend, GatewayClassConfig, ServiceImport,
    /// AccessPolicy) before waiting on only for those whose list is merely late, not refused as
    /// absent or forbidden ([`stores::CRD_WAIT`]).
    pub crd_wait: Duration,
    /// How API discovery tells where ReferenceGrant, ListenerSet and ServiceImport are
    /// served: at start-up, when their CRDs change, and while a watch fails as not served.
    pub api_discovery: optional_apis::ApiDiscovery,
    /// The ConfigMap listing this controller's parents for hostname-ownership admission
    /// ([`ownership_parents`]); `None`: not listed.
    pub ownership_parents: Option<ObjectKey>,
    /// How the controller's Events share the API server.
    pub events: EventLimits,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            translate: Options::default(),
            render: RenderSettings::default(),
            shared: None,
            resync: Duration::from_secs(30),
            tunnel_read_back: DEFAULT_TUNNEL_READ_BACK,
            push_timeout: Duration::from_secs(5),
            sustained_after: push::DEFAULT_SUSTAINED_AFTER,
            sustained_for: push::DEFAULT_SUSTAINED_FOR,
            podless_keep: push::DEFAULT_PODLESS_KEEP,
            start_grace: pod_states::START_GRACE,
            instance: None,
            cloudflare_api_base: cloudflare::DEFAULT_API_BASE.to_owned(),
            cloudflare_api_token: None,
            lease: None,
            crd_wait: stores::CRD_WAIT,
            api_discovery: optional_apis::ApiDiscovery::default(),
            ownership_parents: None,
            events: EventLimits::default(),
        }
    }
}

/// Runs until `shutdown` completes.
///
/// # Errors
/// None yet: failures of single objects are logged, reported in statuses and Events, and
/// retried on the next round.
pub async fn run(
    client: Client,
    options: RuntimeOptions,
    health: Arc<health::Health>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut shutdown = std::pin::pin!(shutdown);
    let changed = Arc::new(Notify::new());
    let mut tasks = JoinSet::new();
    let pool = options.shared.as_ref().and_then(|s| s.deployment.as_ref());
    let stores = Stores::start(
        &client,
        options.api_discovery,
        pool,
        Arc::clone(&changed),
        &health,
        &mut tasks,
    );
    tokio::select! {
        ready = stores.wait_until_ready(options.crd_wait) => {
            if !ready {
                anyhow::bail!("a watch cache stopped before its first list");
            }
        }
        () = &mut shutdown => return Ok(()),
    }
    tracing::info!("watch caches filled");
    health.set_ready();
    // Whether this replica leads, kept current by the elector's own task. It gives the Lease
    // up when `stop_elector` is sent or dropped, so also when this future is dropped.
    let (stop_elector, elector_stopped) = tokio::sync::oneshot::channel::<()>();
    let (_always_leading, mut leading, mut elector) = match options.lease.clone() {
        Some(lease) => {
            let (rx, task) = lease::spawn(client.clone(), lease, async move {
                let _ = elector_stopped.await;
            });
            (None, rx, Some(task))
        }
        None => {
            let (tx, rx) = tokio::sync::watch::channel(Some(lease::Term::default()));
            (Some(tx), rx, None)
        }
    };
    let mut schedule = schedule::Schedule::new(options.resync, tokio::time::Instant::now());
    // Built afresh for each term as leader: what it remembers may be stale after another
    // replica's term. One paused while this replica did not lead resumes if it takes the
    // Lease back in the same term (nobody else led meanwhile), rather than re-applying,
    // re-pushing and re-writing everything right after an API server blip.
    let mut reconciler: Option<(lease::Term, Reconciler)> = None;
    let mut paused: Option<(lease::Term, Reconciler)> = None;
    let mut pending = true;
    loop {
        tokio::select! {
            () = changed.notified() => {
                tokio::time::sleep(DEBOUNCE).await;
                pending = true;
            }
            () = tokio::time::sleep_until(schedule.next()) => {
                schedule.passed(tokio::time::Instant::now());
                pending = true;
            }
            changed = leading.changed() => {
                if changed.is_err() {
                    // The elector is gone: nobody renews, so nobody may act as leader.
                    anyhow::bail!("the leader election task stopped");
                }
            }
            () = &mut shutdown => break,
        }
        let term = *leading.borrow_and_update();
        health.leading.set(i64::from(term.is_some()));
        let Some(term) = term else {
            // A standby reports no failures, nor any plane's pushes, nor what it watches: the
            // leader does, so a sum across replicas counts each once.
            health.push_failing_planes.set(0);
            health.push_seconds.clear();
            health.push_failures.clear();
            health.watched_objects.clear();
            health.render_failing_gateways.set(0);
            health.tunnel_failing_planes.set(0);
            health.unreached_planes.set(0);
            if let Some((term, mut r)) = reconciler.take() {
                tracing::info!("not leading: another replica reconciles");
                // A round cut off midway leaves what it wrote unrecorded: not resumed.
                if !r.cut {
                    r.pause();
                    paused = Some((term, r));
                }
            }
            continue;
        };
        if reconciler.as_ref().is_some_and(|(t, _)| *t != term) {
            reconciler = None;
        }
        let (_, reconciler) = match &mut reconciler {
            Some(r) => r,
            None => {
                pending = true;
                let resumed = paused.take().filter(|(t, _)| *t == term);
                if resumed.is_some() {
                    tracing::info!("leading again, and no other replica led meanwhile: reconciling on from where this one was");
                } else {
                    tracing::info!("leading: reconciling");
                }
                reconciler.insert(resumed.unwrap_or_else(|| {
                    (
                        term,
                        Reconciler::new(
                            client.clone(),
                            options.clone(),
                            &health,
                            stores.listener_set_resource.clone(),
                            Arc::clone(&changed),
                        ),
                    )
                }))
            }
        };
        if !pending {
            continue;
        }
        pending = false;
        let deployments: Vec<Deployment> = stores
            .deployments
            .state()
            .iter()
            .map(|d| (**d).clone())
            .collect();
        let snapshot = stores.snapshot();
        let watched = stores.plane_objects();
        let pods = stores.pods.state();
        let unreadable_routes = stores.unreadable_routes();
        let pool = stores
            .pool
            .as_ref()
            .and_then(|p| p.state().into_iter().next());
        for (kind, count) in stores.counts() {
            health
                .watched_objects
                .get_or_create(&health::KindLabel { kind })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        let mut lost = leading.clone();
        let started = tokio::time::Instant::now();
        tokio::select! {
            () = reconciler.round(&snapshot, &deployments, pool.as_deref(), &watched, &pods, &unreadable_routes) => {
                health.rounds.inc();
                health.round_seconds.observe(started.elapsed().as_secs_f64());
                reconciler.report(&health);
                let ended = tokio::time::Instant::now();
                schedule.ran(started, ended, reconciler.behind.iter().cloned());
                if let Some(at) = reconciler.next_due(started.into_std()) {
                    schedule.also_at(tokio::time::Instant::from_std(at));
                }
            }
            // Another replica may take over once the Lease lapses: stop writing at once.
            _ = lost.wait_for(Option::is_none) => {
                tracing::warn!("the leader Lease lapsed during a round; the rest of it is dropped");
                reconciler.applies.abort_all();
                reconciler.removals.abort_all();
                reconciler.pool_writes.abort_all();
                reconciler.tunnel_sync.abort_all();
                // Forgotten even so: should the Lease be back in the same term before the next
                // turn of the loop sees it lapsed, this reconciler carries on and makes them
                // again.
                reconciler.abort_reports();
                reconciler.cut = true;
            }
            () = &mut shutdown => break,
        }
    }
    // Its applies in flight stop before the Lease is given up.
    drop(reconciler);
    drop(paused);
    let _ = stop_elector.send(());
    if let Some(elector) = &mut elector {
        let _ = elector.await;
    }
    tasks.shutdown().await;
    Ok(())
}

/// What a round needs to remember of the previous ones.
struct Reconciler {
    client: Client,
    /// The config contract's compiled patterns and parsed targets, kept from round to round,
    /// so that an unchanged regex is compiled once rather than every round.
    contract: cftunnel_config::valid::Cache,
    /// Where ListenerSet statuses are written: the resource served now.
    listener_set_resource: optional_apis::Served,
    options: RuntimeOptions,
    pusher: Pusher,
    /// What the Events are published through ([`Reconciler::event`]).
    recorders: report::Recorders,
    /// Per plane: why its pushes keep failing, while they do.
    push_failures: HashMap<PlaneKey, PushFailure>,
    /// Planes whose failure is not reported while their pods start, logged as such once.
    starting_told: HashSet<PlaneKey>,
    /// The pods the last round's pushes left without their plane's config: the next round
    /// comes soon for them ([`schedule`]), as nothing else would start one.
    behind: Vec<(PlaneKey, std::net::SocketAddr)>,
    /// Gateways of planes we rendered, moved to a class not listed, since when.
    class_unlisted: HashMap<ObjectKey, std::time::Instant>,
    /// Status fields the cluster's CRDs drop.
    pruned: Arc<std::sync::Mutex<status::Pruned>>,
    /// Status writes and Events still running, and those that failed lately.
    status_writes: report::StatusWrites,
    /// Per Gateway: the last render error, while it lasts (its `Programmed` says it).
    render_failures: HashMap<ObjectKey, String>,
    /// Per Gateway: the render error told in a `RenderFailed` Event, so a persisting one is not
    /// re-sent.
    render_failed_told: HashMap<ObjectKey, String>,
    /// Whether the render failures an earlier leader told (as Gateways' status says) were
    /// taken in: they stand, told, until this process's own applies say otherwise.
    render_failures_inherited: bool,
    /// Per Gateway: a `ProxyProvisioned` Event not taken yet (no room for it), with the
    /// Gateway and its note: offered again at each round.
    provisioned_untold: HashMap<ObjectKey, (k8s_openapi::api::core::v1::ObjectReference, String)>,
    tunnel_api: Option<TunnelApi>,
    tunnel_sync: TunnelSync,
    /// Per plane: why its tunnel's ingress document could not be written this round.
    tunnel_failures: HashMap<PlaneKey, String>,
    /// Planes whose tunnel's ingress document is still being written at the end of the round
    /// (the write outlived the round's wait), with no failure before it.
    tunnel_writing: HashSet<PlaneKey>,
    /// Per plane some Gateway depends on: why no push reaches it this round (no pod listed,
    /// no config-API token). No push fails then, so without this nothing would say the config
    /// is nowhere.
    unreached: HashMap<PlaneKey, String>,
    /// Per route and warning condition (TunnelShared, RouteShadowed): the message told in an
    /// Event, so one goes out only when the condition appears or changes.
    condition_told: HashMap<(String, &'static str), String>,
    /// Per route: why proxy pods refused some of its rules this round (each rule left out of
    /// its plane's document, the rest pushed), with the plane ([`report::refused_rules`]).
    refused_rules: BTreeMap<translate::RouteKey, Vec<(PlaneKey, String)>>,
    /// What this round's outcomes say of what each plane's pods refuse: only what was heard
    /// is told, and only what all of a plane's pods answered is taken as their answer.
    refusal_answers: report::RefusalAnswers,
    /// What routes were told of their refused rules, by this process or an earlier leader.
    refusals_told: report::RefusalsTold,
    /// Routes told their plane's pods have not taken the config: an Event once per run of
    /// failures.
    push_failed_told: HashSet<String>,
    /// Routes this process has reported on since it took the lead: for one not among them,
    /// the warnings its status already carries were told by an earlier leader.
    reported_routes: HashSet<String>,
    /// Planes with a push outcome of this process's since it took the lead. Until then, a
    /// refusal of a route's rule its status carries stands.
    pushed_planes: HashSet<PlaneKey>,
    /// Planes whose routes an earlier leader told their pods, or those of another plane on
    /// their tunnel, had not taken the config (as their status said when this process took
    /// the lead; `None` before its first round), with the other planes of their tunnels. A
    /// tunnel's planes keep what they were told until each has a verdict of this process's
    /// own ([`Reconciler::settle_inherited`]): a new leader would otherwise take the report
    /// back for the rounds a run of failures takes, or the start grace, and tell it again
    /// after.
    inherited_push_failures: Option<HashMap<PlaneKey, report::Inherited>>,
    /// When this process took the lead.
    took_lead: std::time::Instant,
    /// Per Gateway uid: the plane last applied.
    applied: HashMap<String, AppliedPlane>,
    /// Per Gateway uid: the render whose apply failed last, answered with its error until the
    /// wait is over ([`APPLY_RETRY_FIRST`]).
    apply_failures: Held<String>,
    /// Per Gateway uid: the apply running.
    applies: InFlight<String, Finished>,
    /// Per Gateway uid: the removal of its plane running ([`Reconciler::remove_plane`]), with
    /// its Gateway and whether it deleted anything.
    removals: InFlight<String, (ObjectKey, Result<bool, String>)>,
    /// Per Gateway uid: the removal that failed last, not started again until its wait is over
    /// (as [`Reconciler::apply_failures`]).
    removal_failures: Held<String>,
    /// Per Gateway uid: the move of its plane to another tunnel, until a ready replica of the
    /// pod template on it is seen; its Deployment's other ready replicas are on the tunnel
    /// before ([`Reconciler::dedicated`]). Its Deployment records it meanwhile
    /// ([`TUNNEL_BEFORE_ANNOTATION`]), for a replica that starts, or takes the lead, mid-move.
    moving: HashMap<String, Move>,
    /// Gateway uids whose plane's Deployment this replica has looked at since it leads: a move
    /// its Deployment records is read back only at the first look (a move applied before
    /// then). A record left over on it later (another field manager keeps it) starts no move.
    moves_looked_at: HashSet<String>,
    /// Per Gateway whose generated token Secret holds no token yet: the config-API token its
    /// plane is rendered with (see the round).
    fresh_tokens: BTreeMap<ObjectKey, String>,
    /// Gateways whose plane, never applied, is being applied (or waits for a free apply),
    /// with the address it will have.
    applying_first: BTreeMap<ObjectKey, String>,
    /// Gateways whose plane was never applied (being applied, or its first apply failed), with
    /// the tunnel their render names: where another plane of the round serves that tunnel, it
    /// serves their routes meanwhile, and its document carries them.
    unapplied_tunnels: BTreeMap<ObjectKey, TunnelIdentity>,
    /// The token digest the shared pool's Deployment was last seen stamped with, and when:
    /// checked again when the token changes, and every [`REAPPLY_AFTER`] besides. Recorded
    /// once the stamp's write is read back finished ([`Reconciler::pool_writes`]).
    pool_stamp: Option<(String, std::time::Instant)>,
    /// The writes to the shared pool's Deployment running, one per [`PoolWrite`], each of its
    /// stamp (the token's digest and Secret, or the config-API token's digest).
    pool_writes: InFlight<PoolWrite, PoolWritten>,
    /// `/metrics`' push series, per plane.
    push_seconds: Family<health::PlaneLabel, Histogram, fn() -> Histogram>,
    push_failure_counts: Family<health::PlaneLabel, Counter>,
    /// The class tunnel and credentials this round runs with ([`class_parameters`]).
    class: ClassSettings,
    /// The class's API token as of the last round its config resolved (`Some(None)`: it
    /// named none). While the class config does not resolve, dedicated planes without a token
    /// of their own keep writing with it: the operator's broken class config is no reason for
    /// every tenant's routes to go pending.
    class_api_token: Option<Option<String>>,
    /// The class tunnel as last read, for the rounds its token cannot be read.
    class_tunnel: Option<TunnelIdentity>,
    /// Per GatewayClassConfig: its verdict this round, for its status.
    class_configs: BTreeMap<String, ConfigVerdict>,
    /// Per dedicated plane: the config every one of its pods last took and the token they
    /// take. A plane whose GatewayConfig stops resolving keeps serving this, pods that start
    /// meanwhile included, until it resolves again or the Gateway goes.
    last_good: HashMap<ObjectKey, LastGood>,
    /// Per broken plane without a [`LastGood`] here: when its pods were last asked for the
    /// config they serve ([`Reconciler::start_read_back`]), at most once per resync.
    read_back_at: HashMap<ObjectKey, std::time::Instant>,
    /// The reads back running, by plane.
    read_backs: InFlight<ObjectKey, Option<LastGood>>,
    /// A round was cut off midway (the Lease lapsed): what it wrote is not all recorded, so
    /// this reconciler is not resumed in a later turn.
    cut: bool,
}

/// A write to the shared pool's Deployment: see [`Reconciler::pool_writes`]. Each is a
/// request or two to the chart's Deployment, which an admission webhook may hold up to the API
/// timeout: no round waits for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum PoolWrite {
    /// Pointing it at the class tunnel's token ([`Reconciler::stamp_shared_pool`]).
    TunnelToken,
    /// Rolling it onto the config-API token its pods refuse
    /// ([`Reconciler::roll_pool_refusing_token`]).
    ConfigToken,
}

/// A write to the shared pool's Deployment as its task hands it back.
struct PoolWritten {
    /// The token Secret and key the pool was pointed at; none for a roll.
    source: Option<(ObjectKey, String)>,
    /// Whether it wrote, or why it failed.
    result: Result<bool, String>,
}

/// A plane's move to another tunnel: see [`Reconciler::moving`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Move {
    to: uuid::Uuid,
    from: uuid::Uuid,
}

/// The annotation on a plane's Deployment naming the tunnel its pods ran on before a move to
/// the one [`render::annotated_tunnel`] names, while the move is under way
/// ([`Reconciler::moving`]); applied with the move, and applied away once a ready replica of
/// the pod template on the new tunnel is seen.
const TUNNEL_BEFORE_ANNOTATION: &str = "cf.k8s.lex.la/tunnel-before";

/// `plane` with its Deployment recording the move from tunnel `from`, when it moves.
fn mark_moving(plane: &mut render::DataPlane, from: Option<uuid::Uuid>) {
    if let Some(from) = from {
        plane
            .deployment
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(TUNNEL_BEFORE_ANNOTATION.to_owned(), from.to_string());
    }
}

/// Whether a ready replica of `deployment`'s pod template, which runs on `tunnel`, is seen.
fn connected_on(deployment: &Deployment, tunnel: uuid::Uuid) -> bool {
    render::annotated_tunnel(deployment).is_some_and(|(id, _)| id == tunnel)
        && apply::ready_on_template(deployment) > 0
}

/// The move to `to` that `deployment` records ([`TUNNEL_BEFORE_ANNOTATION`]) from another
/// tunnel, while no ready replica on `to` is seen.
fn recorded_move(deployment: &Deployment, to: uuid::Uuid) -> Option<Move> {
    let from: uuid::Uuid = deployment
        .metadata
        .annotations
        .as_ref()?
        .get(TUNNEL_BEFORE_ANNOTATION)?
        .parse()
        .ok()?;
    let on = render::annotated_tunnel(deployment)?.0;
    (from != to && on == to && !connected_on(deployment, to)).then_some(Move { to, from })
}

/// Why a plane's pushes keep failing: see [`Reconciler::push_failures`].
struct PushFailure {
    reason: String,
    /// Every pod of the plane is down ([`push::PlaneOutcome::all_down`]): it runs no
    /// connector, so the edge hands it none of its tunnel's requests, and the other planes on
    /// the tunnel serve them.
    all_down: bool,
    /// Its pods (all down) are still being created, within the grace
    /// ([`RuntimeOptions::start_grace`]), and its failure has not been reported in this run
    /// ([`pod_states::PodStates::Starting`]): not reported on its routes, nor counted as
    /// failing, though it serves nothing all the same (for the other planes on its tunnel).
    starting: bool,
}

/// A plane as last applied: see [`Reconciler::applied`].
struct AppliedPlane {
    /// Of the render applied.
    digest: Vec<u8>,
    at: std::time::Instant,
    /// What the applies returned of the fields the render sets ([`drift`]).
    fields: OwnedFields,
    /// What its pods were applied with.
    served: Served,
    /// Labels or annotations its render dropped are still on its generated token Secret
    /// ([`apply::AuthSecret::leftover`]): it is applied again at the next round.
    secret_leftover: bool,
}

/// What a plane's pods run with, as far as its round needs: the tokens (connector and config
/// API) and the names of its objects. A plane whose new render is not applied yet, or failed
/// to apply, is pushed to and documented as it runs, not as it would after the apply: with a
/// changed tunnel token, say, its pods are still on the old tunnel.
#[derive(Clone)]
struct Served {
    credentials: render::Credentials,
    names: PlaneNames,
    address: String,
}

impl Served {
    fn of(credentials: render::Credentials, plane: &render::DataPlane) -> Self {
        Self {
            credentials,
            names: plane.names.clone(),
            address: plane.address.clone(),
        }
    }
}

/// Where a plane's apply stands in a round.
enum Applying {
    /// Applied lately, and its objects still hold what was applied.
    Intact(Served),
    /// Being applied again, or waiting for a free apply, with what its pods run with: they
    /// still take their routes.
    Pending(Served),
    /// Never applied, being applied or waiting for a free apply: the address it will have.
    First(String),
    /// Not applied: see [`NotApplied`].
    Failed(NotApplied),
}

impl Applying {
    /// A plane whose apply runs or waits for room: pending with what its pods run with, or
    /// applied for the first time.
    fn waiting(as_applied: Option<Served>, plane: &render::DataPlane) -> Self {
        match as_applied {
            Some(served) => Self::Pending(served),
            None => Self::First(plane.address.clone()),
        }
    }
}

/// Why a plane was not applied, with what its pods run with when the plane was applied before
/// (as in [`Applying::Pending`]; `None` as for [`Applying::First`]).
struct NotApplied {
    reason: String,
    as_applied: Option<Served>,
}

/// What a plane's pods run with while its render is not applied.
enum RunsWith<'a> {
    /// No pods: the plane was never applied, as far as this replica and the caches tell.
    Nothing,
    /// The render's credentials: its live Deployment's pod template carries them already (an
    /// apply that wrote the Deployment and failed after it), or the plane ran before this
    /// replica led (a restart, a new leader) and nothing tells otherwise.
    ThisRender,
    /// As this replica last applied it.
    AsApplied(&'a Served),
}

/// An apply as its task hands it back.
struct Finished {
    key: ObjectKey,
    gateway: k8s_openapi::api::core::v1::ObjectReference,
    /// The Event's note, when the apply changed something.
    note: String,
    /// Whether the apply changed anything, and what it applied.
    result: Result<(bool, AppliedPlane), String>,
}

/// What a dedicated plane last served: see [`Reconciler::last_good`].
struct LastGood {
    /// The Gateway's: one deleted and made again under its name starts afresh.
    uid: String,
    config: cftunnel_config::Config,
    token: String,
    service: String,
    /// The tunnel its pods run on: while other planes serve it, they are what the pods get.
    tunnel: Option<PlaneTunnel>,
}

/// How the tunnel a broken plane's pods run on is known.
#[derive(Debug, Clone, PartialEq)]
enum PlaneTunnel {
    /// From the connector token they were given.
    Token(TunnelIdentity),
    /// From its Deployment's annotations ([`render::annotated_tunnel`]), read back while the
    /// token's Secret cannot be read (its deletion may be the breakage): the tunnel id and the
    /// proof for its Gateway. It is the tunnel of a plane of the round the proof holds for, so
    /// an annotation edited to name another tenant's tunnel joins no plane.
    Annotated { id: uuid::Uuid, proof: String },
}

/// Of `tunnels`, those the planes of a round may run on, the one `last`'s pods run on
/// ([`PlaneTunnel`]).
fn tunnel_among(last: &LastGood, tunnels: &[TunnelIdentity]) -> Option<TunnelIdentity> {
    match last.tunnel.as_ref()? {
        PlaneTunnel::Token(tunnel) => Some(*tunnel),
        PlaneTunnel::Annotated { id, proof } => tunnels
            .iter()
            .copied()
            .find(|t| t.id == *id && t.proven_by(&last.uid, proof)),
    }
}

/// A data plane as far as a round got with it.
struct PlaneInfo {
    address: String,
    ready: bool,
    token: String,
    pods: Vec<std::net::SocketAddr>,
    /// Of `pods`, those not serving.
    not_serving: Vec<std::net::SocketAddr>,
    /// The Service whose EndpointSlices list `pods`.
    service: ObjectKey,
    /// Where its tunnel's ingress document goes; `None` when no API token is configured for it,
    /// an error when the one its GatewayConfig names cannot be read.
    tunnel: Option<Result<TunnelTarget, String>>,
    /// Planes share a document only when they share this (the tunnel and its secret).
    identity: Option<TunnelIdentity>,
    /// A broken plane's, serving what it last served: the rules of the planes on its tunnel
    /// only while one applied (or the shared pool) is there, its own kept rules otherwise.
    kept: bool,
}

impl Reconciler {
    fn new(
        client: Client,
        options: RuntimeOptions,
        health: &health::Health,
        listener_set_resource: optional_apis::Served,
        wake: Arc<Notify>,
    ) -> Self {
        let events = options.events;
        let read_back = options.tunnel_read_back;
        let reporter = Reporter {
            controller: FIELD_MANAGER.to_owned(),
            instance: options.instance.clone(),
        };
        let tunnel_api = match TunnelApi::new(
            &options.cloudflare_api_base,
            options.push_timeout * 2,
        ) {
            Ok(api) => Some(api.counted(health.api_calls.clone())),
            Err(e) => {
                tracing::error!(error = %e, "no Cloudflare API client: tunnel ingress documents are not written");
                None
            }
        };
        if options.cloudflare_api_token.is_none() {
            tracing::warn!(
                "no Cloudflare API token: ingress documents are written only for tunnels whose \
                 GatewayConfig names cloudflareCredentialsSecretRef (requests are routed by the \
                 proxy either way; the document lists the tunnel's public hostnames)"
            );
        }
        Self {
            contract: cftunnel_config::valid::Cache::default(),
            push_seconds: health.push_seconds.clone(),
            push_failure_counts: health.push_failures.clone(),
            pusher: Pusher::new(options.push_timeout, options.sustained_after)
                .failing_for(options.sustained_for)
                .keeping_runs_without_pods(options.podless_keep)
                .waiting_at_most(push::ROUND_WAIT, Arc::clone(&wake)),
            recorders: report::Recorders::new(client.clone(), reporter),
            client,
            options,
            push_failures: HashMap::new(),
            starting_told: HashSet::new(),
            behind: Vec::new(),
            pruned: Default::default(),
            status_writes: report::StatusWrites::new(Arc::clone(&wake), events),
            class_unlisted: HashMap::new(),
            render_failures: HashMap::new(),
            render_failed_told: HashMap::new(),
            render_failures_inherited: false,
            provisioned_untold: HashMap::new(),
            listener_set_resource,
            last_good: HashMap::new(),
            read_back_at: HashMap::new(),
            read_backs: InFlight::new(READ_BACKS_AT_ONCE, Arc::clone(&wake)),
            tunnel_api,
            tunnel_sync: TunnelSync::default()
                .waiting_at_most(push::ROUND_WAIT, Arc::clone(&wake))
                .reading_back(read_back),
            tunnel_failures: HashMap::new(),
            tunnel_writing: HashSet::new(),
            unreached: HashMap::new(),
            condition_told: HashMap::new(),
            refused_rules: BTreeMap::new(),
            refusal_answers: report::RefusalAnswers::default(),
            refusals_told: report::RefusalsTold::default(),
            push_failed_told: HashSet::new(),
            reported_routes: HashSet::new(),
            pushed_planes: HashSet::new(),
            inherited_push_failures: None,
            took_lead: std::time::Instant::now(),
            applied: HashMap::new(),
            apply_failures: Held::new(APPLY_RETRY_FIRST, APPLY_RETRY_MAX).waking(Arc::clone(&wake)),
            removals: InFlight::new(APPLIES_AT_ONCE, Arc::clone(&wake)),
            removal_failures: Held::new(APPLY_RETRY_FIRST, APPLY_RETRY_MAX)
                .waking(Arc::clone(&wake)),
            moving: HashMap::new(),
            moves_looked_at: HashSet::new(),
            // One of each kind at most.
            pool_writes: InFlight::new(2, Arc::clone(&wake)),
            applies: InFlight::new(APPLIES_AT_ONCE, wake),
            fresh_tokens: BTreeMap::new(),
            applying_first: BTreeMap::new(),
            unapplied_tunnels: BTreeMap::new(),
            class: ClassSettings::default(),
            class_api_token: None,
            class_tunnel: None,
            class_configs: BTreeMap::new(),
            pool_stamp: None,
            cut: false,
        }
    }

    /// Stops what runs on its own while this replica does not lead: applies, writes to the
    /// shared pool, pushes, tunnel writes, status writes, Events and reads back. What it
    /// remembers stays, for a return to leading in the same term, but that it told what the
    /// Events dropped unanswered tell: it makes them again then (one the API server stored
    /// without answering in time shows twice). The timers of held failures ([`Held::waking`])
    /// run on: a wake while standing by costs one idle pass of the loop, and one that comes
    /// after the lead returns tries the write again.
    fn pause(&mut self) {
        self.applies.abort_all();
        self.removals.abort_all();
        self.pool_writes.abort_all();
        self.pusher.abort_all();
        self.tunnel_sync.abort_all();
        self.read_backs.abort_all();
        self.abort_reports();
    }

    /// The failure counts, for `/metrics`.
    fn report(&self, health: &health::Health) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let reported = self.push_failures.values().filter(|f| !f.starting);
        health.push_failing_planes.set(count(reported.count()));
        health
            .render_failing_gateways
            .set(count(self.render_failures.len()));
        health
            .tunnel_failing_planes
            .set(count(self.tunnel_failures.len()));
        health.unreached_planes.set(count(self.unreached.len()));
    }

    /// `pool` is the shared pool's Deployment as watched, when the controller points it at
    /// the class tunnel's token.
    async fn round(
        &mut self,
        snapshot: &Snapshot,
        deployments: &[Deployment],
        pool: Option<&Deployment>,
        watched: &PlaneObjects,
        pods: &[Arc<Pod>],
        unreadable_routes: &[UnreadableRoute],
    ) {
        self.take_finished_applies(snapshot);
        self.take_finished_removals();
        self.take_finished_pool_writes();
        self.applying_first.clear();
        self.unapplied_tunnels.clear();
        let mut translate_options = self.options.translate.clone();
        // The flags, overridden by the GatewayClassConfig the controller's classes name.
        let class = class_parameters::settle(
            snapshot,
            &translate_options.controller_name,
            &ClassDefaults {
                namespace: self.options.render.controller_namespace.clone(),
                tunnel_secret: self
                    .options
                    .shared
                    .as_ref()
                    .and_then(|s| s.tunnel_secret.clone()),
                api_token: self.options.cloudflare_api_token.clone(),
                pool_namespace: self
                    .options
                    .shared
                    .as_ref()
                    .and_then(|s| s.deployment.as_ref())
                    .map(|d| d.namespace.clone()),
            },
        );
        if class.shared.held != self.class.held {
            if let Some(reason) = &class.shared.held {
                tracing::warn!(%reason, "the class tunnel's ingress document is not written");
            }
        }
        // While the class tunnel's token cannot be read (the class config not resolving, its
        // Secret gone for a while), the pool runs on the token it started with (see
        // `stamp_shared_pool`): the tunnel last read stands, and with it the one set of routes
        // that tunnel's connectors all serve.
        let read = class.shared.tunnel_token.as_ref().map(TunnelIdentity::of);
        let unreadable =
            class.shared.held.is_some() || (class.shared.tunnel_secret.is_some() && read.is_none());
        if !unreadable {
            self.class_tunnel = read;
        }
        translate_options.shared_tunnel = if unreadable { self.class_tunnel } else { read };
        translate_options.refused_classes = class.refused;
        self.class = class.shared;
        if self.class.held.is_none() {
            self.class_api_token = Some(self.class.api_token.clone());
        }
        self.class_configs = class.configs;
        // Each dedicated plane is rendered once a round: the translation accepts its Gateway by
        // this render, and the same render is applied below.
        // A Gateway whose generated token Secret holds no token yet (being created, or its
        // creation refused) keeps the token drawn for it from round to round, so its render
        // stays the same: a failed apply is held back by its render's digest. Once the Secret
        // holds one, the render asks for none and the drawn token is dropped, so a Secret
        // deleted later (to rotate the token) gets a new one.
        let mut drawn = std::mem::take(&mut self.fresh_tokens);
        let mut plans = render::plan(snapshot, &self.options.render, |key| {
            let token = match drawn.remove(key) {
                Some(token) => token,
                None => apply::fresh_token().ok()?,
            };
            self.fresh_tokens.insert(key.clone(), token.clone());
            Some(token)
        });
        // A plane whose tunnel move is not applied yet serves with its old tunnel's planes.
        translate_options.running_tunnels = self.running_tunnels(snapshot, &plans, deployments);
        // Read back meanwhile; kept below for the planes found broken.
        let read_back: HashMap<ObjectKey, LastGood> = self
            .read_backs
            .finished()
            .into_iter()
            .filter_map(|(key, _, last)| Some((key, last??)))
            .collect();
        let kept_tunnels = self.kept_tunnels(snapshot, &read_back, &plans, &translate_options);
        let mut output = translate::translate_keeping(
            snapshot,
            &translate_options,
            &plans,
            &kept_tunnels,
            &mut self.contract,
        );
        if !self.render_failures_inherited {
            self.render_failures_inherited = true;
            self.inherit_render_failures(snapshot, &output);
        }
        let mut planes: BTreeMap<PlaneKey, PlaneInfo> = BTreeMap::new();
        let mut broken = Vec::new();
        // Gateways on a class not listed, since when: kept only for those still so.
        let mut class_unlisted = HashMap::new();
        let previously_unlisted = std::mem::take(&mut self.class_unlisted);

        for gw in &snapshot.gateways {
            let Some(key) = object_key(gw) else { continue };
            // Being deleted: the garbage collector removes its plane; re-applying would fight it.
            if gw.metadata.deletion_timestamp.is_some() {
                if let Some(uid) = &gw.metadata.uid {
                    self.applies.abort(uid);
                    self.removals.abort(uid);
                }
                continue;
            }
            let ours = output.statuses.gateways.contains_key(&key);
            match output.planes.get(&key) {
                Some(PlaneKey::Dedicated(_)) => {
                    let plan = plans.remove(&key);
                    if let Some(info) =
                        self.dedicated(gw, &key, plan, snapshot, deployments, watched)
                    {
                        planes.insert(PlaneKey::Dedicated(key), info);
                    }
                }
                // Back on the shared plane, or moved to another controller's class: its plane
                // goes. (Not accepted for bad parameters: its plane keeps serving, see above.)
                Some(PlaneKey::Shared) => {
                    self.remove_plane(gw, &key, snapshot, deployments, watched)
                }
                // Another controller's: its plane goes only if this controller rendered it
                // (for a class of its own the Gateway has left). Another installation renders
                // planes of the same names and owner for its own classes, which are not ours
                // to remove. A Gateway moved to a class not listed keeps it for a while: one
                // apply that creates a class of ours and moves the Gateway to it may be seen
                // Gateway first, and the plane must not go (and its token change) for that.
                None if !ours => {
                    let class_listed = snapshot.gateway_classes.iter().any(|c| {
                        c.metadata.name.as_deref() == Some(gw.spec.gateway_class_name.as_str())
                    });
                    let waited = class_listed || {
                        let since = previously_unlisted
                            .get(&key)
                            .copied()
                            .unwrap_or_else(std::time::Instant::now);
                        class_unlisted.insert(key.clone(), since);
                        since.elapsed() >= UNLISTED_CLASS_GRACE
                    };
                    if waited
                        && rendered_for_our_class(
                            gw,
                            snapshot,
                            deployments,
                            &self.options.translate.controller_name,
                        )
                    {
                        self.remove_plane(gw, &key, snapshot, deployments, watched)
                    }
                }
                // Ours, but its GatewayConfig does not resolve: its plane keeps serving.
                None => broken.push(key),
            }
        }
        self.class_unlisted = class_unlisted;
        let mut shared_gateway_address = None;
        // What is wrong with the shared pool's config-API token this round, if anything.
        let mut shared_token_problem = None;
        if let Some(shared) = &self.options.shared {
            let address = shared_address(
                snapshot,
                &self.class,
                translate_options.shared_tunnel,
                &output.planes,
            );
            shared_gateway_address = Some(address.clone()).filter(|a| !a.is_empty());
            match shared_plane(
                shared,
                snapshot,
                &self.class,
                translate_options.shared_tunnel,
                address,
            ) {
                Ok(info) => {
                    planes.insert(PlaneKey::Shared, info);
                }
                Err(problem) => shared_token_problem = Some(problem),
            }
        }
        self.last_good.retain(|key, _| {
            broken.contains(key)
                || output.planes.get(key) == Some(&PlaneKey::Dedicated(key.clone()))
        });
        self.read_back_at.retain(|key, _| broken.contains(key));
        self.read_backs.retain(|key| broken.contains(key));
        for (key, last) in read_back {
            if broken.contains(&key) {
                self.last_good.insert(key, last);
            }
        }
        let broken_gateways: Vec<(&ObjectKey, &Arc<Gateway>)> = broken
            .iter()
            .filter_map(|key| {
                let gw = snapshot
                    .gateways
                    .iter()
                    .find(|g| object_key(*g).as_ref() == Some(key))?;
                Some((key, gw))
            })
            .collect();
        for (key, gw) in &broken_gateways {
            let known = self
                .last_good
                .get(*key)
                .is_some_and(|l| Some(l.uid.as_str()) == gw.metadata.uid.as_deref());
            if !known {
                self.start_read_back(gw, key, snapshot, deployments);
            }
        }
        let kept: Vec<(&ObjectKey, &LastGood)> = broken_gateways
            .iter()
            .filter_map(|(key, gw)| {
                let last = self.last_good.get(*key)?;
                (Some(last.uid.as_str()) == gw.metadata.uid.as_deref()).then_some((*key, last))
            })
            .collect();
        // A broken plane keeps serving its last config, less the routes that no longer name
        // its Gateway (deleted or detached since: those are served nowhere). Where other
        // planes serve its tunnel, the edge spreads the tunnel's requests over all their pods:
        // every plane on it then gets the tunnel's current routes and the broken Gateways' own
        // rules as they last served them, so no route deleted elsewhere stays reachable
        // through the broken pods and the broken Gateway's routes are served by every pod.
        // Where none does, the broken planes on the tunnel get those own rules alone.
        let mut on_tunnel: HashMap<TunnelIdentity, KeptRules> = HashMap::new();
        for (key, last) in &kept {
            if let Some(tunnel) = kept_tunnels.get(*key) {
                on_tunnel
                    .entry(*tunnel)
                    .or_default()
                    .add(last, snapshot, &output, key);
            }
        }
        for (plane, info) in &planes {
            let kept = info.identity.and_then(|t| on_tunnel.get(&t));
            if let (Some(kept), Some(config)) = (kept, output.configs.get_mut(plane)) {
                kept.add_to(config);
            }
        }
        // Its tunnel's config where other planes serve it; otherwise the own rules of the
        // broken planes on its tunnel, or its own alone where its tunnel is not known.
        // With the owners of the plane a config is taken from, so that its regexes are weighed
        // as that plane's are ([`translate::Output::costs`]).
        let configs: Vec<(
            cftunnel_config::Config,
            Option<Vec<Option<translate::RouteKey>>>,
        )> = kept
            .iter()
            .map(|(key, last)| {
                let tunnel = kept_tunnels.get(*key);
                let served = tunnel.and_then(|t| {
                    planes
                        .iter()
                        .find_map(|(plane, info)| (info.identity == Some(*t)).then_some(plane))
                });
                if let Some(config) = served.and_then(|plane| output.configs.get(plane)) {
                    let owners = served.and_then(|plane| output.owners.get(plane)).cloned();
                    return (config.clone(), owners);
                }
                let mut config = cftunnel_config::Config::default();
                match tunnel.and_then(|t| on_tunnel.get(t)) {
                    Some(kept) => kept.add_to(&mut config),
                    None => {
                        let mut alone = KeptRules::default();
                        alone.add(last, snapshot, &output, key);
                        alone.add_to(&mut config);
                    }
                }
                (config, None)
            })
            .collect();
        for ((key, last), (config, owners)) in kept.into_iter().zip(configs) {
            let plane = PlaneKey::Dedicated(key.clone());
            output.configs.insert(plane.clone(), config);
            if let Some(owners) = owners {
                output.owners.insert(plane.clone(), owners);
            }
            let (pods, not_serving) = plane_pods(snapshot, &key.namespace, &last.service);
            planes.insert(
                plane,
                PlaneInfo {
                    address: String::new(),
                    ready: false,
                    token: last.token.clone(),
                    pods,
                    not_serving,
                    service: ObjectKey::new(&key.namespace, &last.service),
                    // Nothing changed for its tunnel: its document stays as last written.
                    tunnel: None,
                    // Its pods take a share of the tunnel's requests: a push they fail fails
                    // the routes of every Gateway on it.
                    identity: kept_tunnels.get(key).copied(),
                    kept: true,
                },
            );
        }
        self.render_failures
            .retain(|key, _| output.statuses.gateways.contains_key(key));
        self.render_failed_told
            .retain(|key, _| output.statuses.gateways.contains_key(key));
        self.provisioned_untold
            .retain(|key, _| output.statuses.gateways.contains_key(key));
        let uids: std::collections::HashSet<&str> = snapshot
            .gateways
            .iter()
            .filter_map(|g| g.metadata.uid.as_deref())
            .collect();
        self.applied.retain(|uid, _| uids.contains(uid.as_str()));
        self.apply_failures
            .retain(|uid| uids.contains(uid.as_str()));
        self.applies.retain(|uid| uids.contains(uid.as_str()));
        self.removals.retain(|uid| uids.contains(uid.as_str()));
        self.removal_failures
            .retain(|uid| uids.contains(uid.as_str()));
        self.moving.retain(|uid, _| uids.contains(uid.as_str()));
        self.moves_looked_at
            .retain(|uid| uids.contains(uid.as_str()));
        self.stamp_shared_pool(snapshot, pool);
        self.note_unreached(
            &planes,
            &output.planes,
            translate_options.shared_tunnel,
            shared_token_problem.as_deref(),
        );

        // Weighed as the documents stand, with the rules kept for broken planes.
        let costs: BTreeMap<&PlaneKey, cftunnel_config::valid::Costs> = output
            .configs
            .keys()
            .filter(|plane| planes.contains_key(*plane))
            .map(|plane| (plane, output.costs(plane, &mut self.contract)))
            .filter(|(_, costs)| !costs.is_empty())
            .collect();
        let rounds: Vec<PlaneRound<'_>> = output
            .configs
            .iter()
            .filter_map(|(plane, config)| {
                let info = planes.get(plane)?;
                Some(PlaneRound {
                    plane: plane.clone(),
                    config,
                    costs: costs
                        .get(plane)
                        .unwrap_or(cftunnel_config::valid::Costs::NONE),
                    token: &info.token,
                    pods: &info.pods,
                    not_serving: &info.not_serving,
                })
            })
            .collect();
        // Tunnel documents and pushes at once: a slow Cloudflare call holds up no push. One
        // span holds them, so a round's Cloudflare calls and pushes are one trace.
        let span = tracing::info_span!(
            "config.sync",
            cftunnel.planes = i64::try_from(rounds.len()).unwrap_or(i64::MAX)
        );
        let ((tunnel_failures, tunnel_writing), outcomes) = async {
            tokio::join!(
                sync_tunnels(
                    self.tunnel_api.as_ref(),
                    &mut self.tunnel_sync,
                    &output,
                    &planes
                ),
                self.pusher.sync_all(rounds),
            )
        }
        .instrument(span)
        .await;
        self.tunnel_failures = tunnel_failures;
        self.tunnel_writing = tunnel_writing;
        self.behind = outcomes
            .iter()
            .flat_map(|(plane, outcome)| {
                outcome
                    .pods
                    .iter()
                    .filter(|(_, o)| matches!(o, PodOutcome::Failed(_)))
                    .map(move |(pod, _)| (plane.clone(), *pod))
            })
            .collect();
        // What every pod of a plane now holds is what it serves if its configuration breaks.
        for (plane, outcome) in &outcomes {
            let PlaneKey::Dedicated(key) = plane else {
                continue;
            };
            // What its pods hold is not this round's config (its next push still runs).
            if outcome.pods.is_empty() || !outcome.all_current() || outcome.stale {
                continue;
            }
            // A broken plane given its tunnel's routes holds those now.
            if broken.contains(key) {
                let (Some(config), Some(last)) =
                    (output.configs.get(plane), self.last_good.get_mut(key))
                else {
                    continue;
                };
                if last.config != *config {
                    last.config = config.clone();
                }
                continue;
            }
            let (Some(config), Some(info), Some(gw)) = (
                output.configs.get(plane),
                planes.get(plane),
                snapshot
                    .gateways
                    .iter()
                    .find(|g| object_key(*g).as_ref() == Some(key)),
            ) else {
                continue;
            };
            let (Some(uid), Ok(names)) = (gw.metadata.uid.as_deref(), PlaneNames::for_gateway(gw))
            else {
                continue;
            };
            match self.last_good.get_mut(key) {
                Some(last)
                    if last.uid == uid
                        && last.config == *config
                        && last.token == info.token
                        && last.tunnel == info.identity.map(PlaneTunnel::Token) => {}
                _ => {
                    self.last_good.insert(
                        key.clone(),
                        LastGood {
                            uid: uid.to_owned(),
                            config: config.clone(),
                            token: info.token.clone(),
                            service: names.service,
                            tunnel: info.identity.map(PlaneTunnel::Token),
                        },
                    );
                }
            }
        }
        self.refused_rules = report::refused_rules(&output, &outcomes);
        self.refusal_answers = report::RefusalAnswers::of(&outcomes);
        if self.inherited_push_failures.is_none() {
            let told = self.planes_told_push_failed(snapshot, &output, &planes);
            self.inherited_push_failures = Some(told);
        }
        for (plane, outcome) in &outcomes {
            if outcome.refusals_known {
                self.pushed_planes.insert(plane.clone());
            }
            if !outcome.pods.is_empty() {
                self.inherited_pushed(plane);
            }
        }
        for (plane, outcome) in &outcomes {
            // Its next push still runs: this one was counted when it came.
            if outcome.repeated {
                continue;
            }
            let pushed = outcome
                .pods
                .iter()
                .filter(|(_, o)| *o == PodOutcome::Pushed)
                .count();
            if pushed > 0 {
                tracing::info!(%plane, version = outcome.version, pods = pushed, "config pushed");
            }
            let label = plane_label(plane);
            let mut failed: u64 = 0;
            for (pod, result) in &outcome.pods {
                if let PodOutcome::Failed(reason) = result {
                    tracing::warn!(%plane, %pod, %reason, "config push failed");
                    failed += 1;
                }
            }
            if pushed > 0 || failed > 0 {
                self.push_seconds
                    .get_or_create(&label)
                    .observe(outcome.duration.as_secs_f64());
            }
            if failed > 0 {
                self.push_failure_counts
                    .get_or_create(&label)
                    .inc_by(failed);
            }
            // What the pods' state says of a plane whose pods are all down, once that is to be
            // reported: they may only be starting. A failure reported in this run of failures
            // (the plane's entry is not `starting`) stays reported until a push succeeds.
            let states = match planes.get(plane) {
                Some(info) if outcome.all_down() && outcome.sustained_failure => {
                    let reported = self.push_failures.get(plane).is_some_and(|f| !f.starting)
                        || self.inherited_told(plane);
                    let run = pod_states::FailureRun {
                        failing_for: outcome.failing_for,
                        reported,
                        grace: self.options.start_grace,
                    };
                    pod_states::judge(
                        &info.service.namespace,
                        &outcome.idle,
                        pods,
                        k8s_openapi::jiff::Timestamp::now(),
                        run,
                    )
                }
                _ => pod_states::PodStates::Unknown,
            };
            // A pod that serves nothing (see `PlaneOutcome::idle`) fails the plane (metrics,
            // logs), not its routes, which the other pods serve; unless none serves them.
            let serving_failure = outcome.pods.iter().find_map(|(pod, o)| match o {
                PodOutcome::Failed(r) if outcome.all_down() => Some(match states.told() {
                    Some(told) => format!(
                        "every pod of the plane is down (its config port refuses connections \
                         and it is not serving): {told}; {pod}: {r}"
                    ),
                    None => format!(
                        "every pod of the plane is down (its config port refuses connections \
                         and it is not serving: an image that cannot be pulled, a crash loop); \
                         {pod}: {r}"
                    ),
                }),
                PodOutcome::Failed(_) if outcome.idle.contains(pod) => None,
                PodOutcome::Failed(r) => Some(format!("{pod}: {r}")),
                _ => None,
            });
            match serving_failure {
                Some(reason) if outcome.sustained_failure => {
                    let starting = match &states {
                        pod_states::PodStates::Starting { pod, since } => {
                            if self.starting_told.insert(plane.clone()) {
                                tracing::info!(
                                    %plane,
                                    pod,
                                    since = ?since,
                                    failing_for = ?outcome.failing_for,
                                    grace = ?self.options.start_grace,
                                    "the plane's pods are still starting; its failed config \
                                     pushes are not reported on its routes until the first \
                                     pod has been starting, or the pushes failing, for `grace`"
                                );
                            }
                            true
                        }
                        _ => {
                            self.starting_told.remove(plane);
                            false
                        }
                    };
                    let failure = PushFailure {
                        reason,
                        all_down: outcome.all_down(),
                        starting,
                    };
                    // Reported, or its pods all still starting (it runs no connector, and
                    // fails no other plane's routes): a verdict either way.
                    self.inherit_no_more(plane);
                    self.push_failures.insert(plane.clone(), failure);
                }
                // No pod listed: nothing was pushed, so a failure told stays while its run
                // does ([`RuntimeOptions::podless_keep`]).
                None if outcome.pods.is_empty() && outcome.failed_rounds > 0 => {}
                None => {
                    self.push_failures.remove(plane);
                    self.starting_told.remove(plane);
                    // With no pod listed nothing was pushed: what an earlier leader told stays
                    // as long as this process would keep a run of failures of its own
                    // ([`Reconciler::settle_inherited`]).
                    if !outcome.pods.is_empty() {
                        self.inherit_no_more(plane);
                    }
                }
                Some(_) => {}
            }
        }
        self.settle_inherited(&planes);
        self.roll_pool_refusing_token(&outcomes, &planes, pool);
        // Series of planes that went away go with them.
        for plane in self.pusher.planes() {
            if !output.configs.contains_key(plane) {
                let label = plane_label(plane);
                self.push_seconds.remove(&label);
                self.push_failure_counts.remove(&label);
            }
        }
        self.pusher
            .retain(|plane| output.configs.contains_key(plane));
        self.push_failures
            .retain(|plane, _| output.configs.contains_key(plane));
        self.starting_told
            .retain(|plane| output.configs.contains_key(plane));
        if let Some(inherited) = &mut self.inherited_push_failures {
            inherited.retain(|plane, _| output.configs.contains_key(plane));
        }
        self.pushed_planes
            .retain(|plane| output.configs.contains_key(plane));
        self.refusals_told
            .retain_planes(|plane| output.configs.contains_key(plane));

        self.write_statuses(
            snapshot,
            unreadable_routes,
            &output,
            &planes,
            shared_gateway_address,
        )
        .await;
    }

    /// Records the planes no push can reach this round, saying so in the log when that
    /// starts or its reason changes; their Gateways' `Programmed` says it while it lasts.
    ///
    /// Only planes some Gateway depends on count: every dedicated plane (its Gateway's, served
    /// or kept on its last config), and the shared pool while a Gateway is served by it
    /// (`served`, from the translation) or by a plane on the class tunnel (`shared_tunnel`),
    /// whose requests the edge also hands to the pool. An idle pool is not a fault. The pool is
    /// left out of `planes` when its token is missing or `shared_token_problem` says what else.
    fn note_unreached(
        &mut self,
        planes: &BTreeMap<PlaneKey, PlaneInfo>,
        served: &BTreeMap<ObjectKey, PlaneKey>,
        shared_tunnel: Option<TunnelIdentity>,
        shared_token_problem: Option<&str>,
    ) {
        let shared_used = served.values().any(|p| *p == PlaneKey::Shared)
            || shared_tunnel.is_some_and(|tunnel| {
                planes.iter().any(|(plane, info)| {
                    matches!(plane, PlaneKey::Dedicated(_)) && info.identity == Some(tunnel)
                })
            });
        let depended = |plane: &PlaneKey| *plane != PlaneKey::Shared || shared_used;
        let mut unreached: HashMap<PlaneKey, String> = planes
            .iter()
            .filter(|(plane, info)| depended(plane) && info.pods.is_empty())
            .map(|(plane, info)| {
                let reason = format!(
                    "no proxy pod is listed to receive the config: the EndpointSlices of \
                     Service {} list none that is not terminating",
                    info.service
                );
                (plane.clone(), reason)
            })
            .collect();
        if let Some(shared) = &self.options.shared {
            if shared_used && !planes.contains_key(&PlaneKey::Shared) {
                let problem = shared_token_problem.unwrap_or("is missing");
                let reason = format!(
                    "the shared proxy pool's config-API token (key {:?} of Secret {}) {problem}, \
                     so no config is pushed to it",
                    shared.auth_key, shared.auth_secret
                );
                unreached.insert(PlaneKey::Shared, reason);
            }
        }
        for (plane, reason) in &unreached {
            if self.unreached.get(plane) != Some(reason) {
                tracing::warn!(%plane, %reason, "no config push reaches the data plane");
            }
        }
        self.unreached = unreached;
    }

    /// Starts reading back, from its running pods, the config a broken plane serves (at most
    /// once per resync): a controller that starts, or takes the lead, during the breakage
    /// has none in memory. The read runs by itself ([`InFlight`]), so pods that never answer
    /// hold up no round; the round after it ends takes it in.
    fn start_read_back(
        &mut self,
        gw: &Gateway,
        key: &ObjectKey,
        snapshot: &Snapshot,
        deployments: &[Deployment],
    ) {
        if self.read_backs.running(key).is_some() || self.read_backs.is_full() {
            return;
        }
        let now = std::time::Instant::now();
        if self
            .read_back_at
            .get(key)
            .is_some_and(|at| now.duration_since(*at) < self.options.resync)
        {
            return;
        }
        self.read_back_at.insert(key.clone(), now);
        let Some(uid) = gw.metadata.uid.clone() else {
            return;
        };
        let Ok(names) = PlaneNames::for_gateway(gw) else {
            return;
        };
        let Some(deployment) = deployments.iter().find(|d| {
            d.metadata.namespace.as_deref() == Some(key.namespace.as_str())
                && d.metadata.name.as_deref() == Some(names.deployment.as_str())
                && apply::controlled_by(d.owner_references(), &uid)
        }) else {
            return;
        };
        // What the pods read from the environment the Deployment gives them.
        let from_env = |name: &str| {
            let reference = apply::env_secret_ref(deployment, name)?;
            secret_text(
                snapshot,
                &ObjectKey::new(&key.namespace, &reference.name),
                &reference.key,
            )
        };
        let Some(token) = from_env(render::AUTH_TOKEN_ENV) else {
            return;
        };
        let tunnel = from_env(render::TUNNEL_TOKEN_ENV)
            .and_then(|t| t.parse::<cftunnel_config::Token>().ok())
            .map(|t| PlaneTunnel::Token(TunnelIdentity::of(&t)))
            .or_else(|| {
                let (id, proof) = render::annotated_tunnel(deployment)?;
                Some(PlaneTunnel::Annotated {
                    id,
                    proof: proof.to_owned(),
                })
            });
        let (pods, _) = plane_pods(snapshot, &key.namespace, &names.service);
        let timeout = self.options.push_timeout;
        let plane = key.clone();
        self.read_backs.start(key.clone(), Vec::new(), async move {
            for pod in pods {
                match push::served_document(pod, &token, timeout).await {
                    Ok(config) => {
                        tracing::info!(%plane, %pod, "read back the config the plane's pods serve");
                        return Some(LastGood {
                            uid,
                            config,
                            token,
                            service: names.service,
                            tunnel,
                        });
                    }
                    Err(reason) => {
                        tracing::debug!(%plane, %pod, %reason, "no config read back")
                    }
                }
            }
            None
        });
    }

    /// Applies a dedicated plane as the round rendered it (`plan`); `None` when it could not be
    /// applied.
    fn dedicated(
        &mut self,
        gw: &Gateway,
        key: &ObjectKey,
        plan: Option<Result<Rendered, RenderError>>,
        snapshot: &Snapshot,
        deployments: &[Deployment],
        watched: &PlaneObjects,
    ) -> Option<PlaneInfo> {
        let config_name = gw
            .spec
            .infrastructure
            .as_ref()
            .and_then(|i| i.parameters_ref.as_ref())
            .map(|r| r.name.clone())?;
        let config = snapshot.gateway_configs.iter().find(|c| {
            c.metadata.namespace.as_deref() == Some(key.namespace.as_str())
                && c.metadata.name.as_deref() == Some(config_name.as_str())
        })?;
        // Objects are owned by the Gateway's uid; one from the API server always has it.
        let uid = gw.metadata.uid.as_deref()?;
        let rendered = plan?.map(|r| (r.credentials, r.plane));
        let render_tunnel = rendered
            .as_ref()
            .ok()
            .map(|(credentials, _)| TunnelIdentity::of(&credentials.tunnel));
        let applied = match rendered {
            Ok((credentials, plane)) => {
                // Every object of the plane is watched, so an edit or a deletion starts a round
                // that puts it back (see `drift`).
                let ns = key.namespace.as_str();
                let here = |meta: &kube::api::ObjectMeta, name: &str| {
                    meta.namespace.as_deref() == Some(ns) && meta.name.as_deref() == Some(name)
                };
                let names = &plane.names;
                let live = LivePlane {
                    deployment: deployments
                        .iter()
                        .find(|d| here(&d.metadata, &names.deployment)),
                    service: snapshot
                        .services
                        .iter()
                        .map(Arc::as_ref)
                        .find(|s| here(&s.metadata, &names.service)),
                    // Without one rendered, only one the Gateway controls is left over to
                    // remove: someone else's of that name is no reason to apply again.
                    network_policy: watched
                        .network_policy(ns, &names.network_policy)
                        .filter(|p| {
                            plane.network_policy.is_some()
                                || gw.metadata.uid.as_deref().is_some_and(|uid| {
                                    apply::controlled_by(p.owner_references(), uid)
                                })
                        }),
                    autoscaler: watched.autoscaler(ns, &names.autoscaler),
                    auth_secret: snapshot
                        .secrets
                        .iter()
                        .map(Arc::as_ref)
                        .find(|s| here(&s.metadata, &names.auth_secret)),
                };
                self.apply_dedicated(gw, key, config, credentials, plane, &live)
            }
            Err(e) => Applying::Failed(NotApplied {
                reason: e.to_string(),
                as_applied: None,
            }),
        };
        let Served {
            credentials,
            names,
            address,
        } = match applied {
            Applying::Intact(served) => {
                self.render_failures.remove(key);
                self.render_failed_told.remove(key);
                served
            }
            Applying::Pending(as_applied) => as_applied,
            Applying::First(address) => {
                self.applying_first.insert(key.clone(), address);
                self.unapplied_tunnels
                    .extend(render_tunnel.map(|t| (key.clone(), t)));
                return None;
            }
            Applying::Failed(NotApplied { reason, as_applied }) => {
                self.apply_failed(&gw.object_ref(&()), key, reason);
                if as_applied.is_none() {
                    self.unapplied_tunnels
                        .extend(render_tunnel.map(|t| (key.clone(), t)));
                }
                // A plane applied before keeps getting its routes: an admission webhook or the
                // API server failing is no reason for its tenant's route changes to stop.
                as_applied?
            }
        };
        let deployment = deployments.iter().find(|d| {
            d.metadata.namespace.as_deref() == Some(key.namespace.as_str())
                && d.metadata.name.as_deref() == Some(names.deployment.as_str())
        });
        let tunnel = credentials.tunnel.tunnel_id();
        let ready = match self.moving.get(uid) {
            // Moved to another tunnel: the Deployment's ready replicas may all be pods of its
            // older template, connectors of the tunnel before (a rollout whose new pods never
            // register leaves them so). Only a ready one of the template on this tunnel is one
            // of its connectors. The address is this tunnel's meanwhile, as for a plane applied
            // the first time: its document is the one the plane's routes are written to now,
            // and `Programmed` says no connector serves it yet.
            Some(moving) if moving.to == tunnel => {
                let connected = deployment.is_some_and(|d| connected_on(d, tunnel));
                if connected {
                    self.moving.remove(uid);
                }
                connected
            }
            _ => {
                deployment
                    .and_then(|d| d.status.as_ref())
                    .and_then(|s| s.ready_replicas)
                    .unwrap_or(0)
                    > 0
            }
        };
        let api_token = match &config.spec.cloudflare_credentials_secret_ref {
            Some(r) => {
                let key_name = r.key_or(DEFAULT_API_TOKEN_KEY);
                render::read_secret_text(&snapshot.secrets, &key.namespace, &r.name, key_name)
                    .map(|token| Some((token, None)))
                    .map_err(|e| {
                        format!(
                            "{e} (spec.cloudflareCredentialsSecretRef of GatewayConfig {}/{config_name})",
                            key.namespace
                        )
                    })
            }
            // The class's token (the controller's own by default) reaches tunnels the tenant
            // may not own: prove it does. While the class config does not resolve, the one it
            // last gave; none if it has not resolved since this replica leads.
            None => match &self.class_api_token {
                Some(token) => Ok(token
                    .clone()
                    .map(|token| (token, Some(credentials.tunnel.tunnel_secret().to_vec())))),
                None => Err(format!(
                    "no Cloudflare API token: GatewayConfig {}/{config_name} names none, and the class's: {}",
                    key.namespace,
                    self.class.held.as_deref().unwrap_or("the class config does not resolve")
                )),
            },
        };
        let tunnel = match api_token {
            Ok(Some((api_token, verify_secret))) => Some(Ok(TunnelTarget {
                account: credentials.tunnel.account_tag().to_owned(),
                tunnel: credentials.tunnel.tunnel_id(),
                api_token,
                verify_secret,
            })),
            Ok(None) => None,
            Err(reason) => Some(Err(reason)),
        };
        let (pods, not_serving) = plane_pods(snapshot, &key.namespace, &names.service);
        Some(PlaneInfo {
            address,
            ready,
            token: credentials.auth_token,
            pods,
            not_serving,
            service: ObjectKey::new(&key.namespace, &names.service),
            identity: Some(TunnelIdentity::of(&credentials.tunnel)),
            tunnel,
            kept: false,
        })
    }

    /// What the pods of a plane (of the Gateway `uid`) run with while `plane`, its render, is
    /// not applied, by `deployment`, its live Deployment (see [`RunsWith`]).
    fn runs_with(
        &self,
        uid: &str,
        plane: &render::DataPlane,
        deployment: Option<&Deployment>,
    ) -> RunsWith<'_> {
        let controlled = deployment.filter(|d| apply::controlled_by(d.owner_references(), uid));
        let on_this_render = controlled.is_some_and(|d| {
            credentials_hash(d).is_some()
                && credentials_hash(d) == credentials_hash(&plane.deployment)
        });
        match self.applied.get(uid) {
            Some(applied) if !on_this_render => RunsWith::AsApplied(&applied.served),
            _ if controlled.is_some() => RunsWith::ThisRender,
            _ => RunsWith::Nothing,
        }
    }

    /// The dedicated planes whose pods run on another tunnel than their render names: see
    /// [`Options::running_tunnels`].
    fn running_tunnels(
        &self,
        snapshot: &Snapshot,
        plans: &render::Plans,
        deployments: &[Deployment],
    ) -> BTreeMap<ObjectKey, TunnelIdentity> {
        snapshot
            .gateways
            .iter()
            .filter_map(|gw| {
                let key = object_key(gw)?;
                let uid = gw.metadata.uid.as_deref()?;
                let rendered = plans.get(&key)?.as_ref().ok()?;
                let deployment = deployments.iter().find(|d| {
                    d.metadata.namespace.as_deref() == Some(key.namespace.as_str())
                        && d.metadata.name.as_deref()
                            == Some(rendered.plane.names.deployment.as_str())
                });
                let RunsWith::AsApplied(served) = self.runs_with(uid, &rendered.plane, deployment)
                else {
                    return None;
                };
                let running = TunnelIdentity::of(&served.credentials.tunnel);
                (running != TunnelIdentity::of(&rendered.credentials.tunnel))
                    .then_some((key, running))
            })
            .collect()
    }

    /// The tunnel the pods of each plane whose [`LastGood`] is known run on, per Gateway of
    /// `snapshot` it is of (not one made again under its name, nor one being deleted): should
    /// the translation not accept the Gateway, that plane keeps serving there
    /// ([`translate::translate_keeping`]), and this is the tunnel it serves. `read_back` holds
    /// those read back since the last round, not yet in [`Reconciler::last_good`]. A tunnel
    /// known by the Deployment's annotation is one of those the round's planes run on: that
    /// their renders or pods name, the class tunnel, or that of a plane kept on its token.
    fn kept_tunnels(
        &self,
        snapshot: &Snapshot,
        read_back: &HashMap<ObjectKey, LastGood>,
        plans: &render::Plans,
        options: &Options,
    ) -> BTreeMap<ObjectKey, TunnelIdentity> {
        let last_of = |key: &ObjectKey| read_back.get(key).or_else(|| self.last_good.get(key));
        let tokens = self.last_good.values().chain(read_back.values());
        let tunnels: Vec<TunnelIdentity> = plans
            .values()
            .filter_map(|plan| plan.as_ref().ok())
            .map(|rendered| TunnelIdentity::of(&rendered.credentials.tunnel))
            .chain(options.running_tunnels.values().copied())
            .chain(options.shared_tunnel)
            .chain(tokens.filter_map(|last| match last.tunnel {
                Some(PlaneTunnel::Token(tunnel)) => Some(tunnel),
                _ => None,
            }))
            .collect();
        snapshot
            .gateways
            .iter()
            .filter(|gw| gw.metadata.deletion_timestamp.is_none())
            .filter_map(|gw| {
                let key = object_key(gw)?;
                let last = last_of(&key)?;
                if gw.metadata.uid.as_deref() != Some(last.uid.as_str()) {
                    return None;
                }
                let tunnel = tunnel_among(last, &tunnels)?;
                Some((key, tunnel))
            })
            .collect()
    }

    /// Starts applying a rendered plane unless it was applied lately and `live`, the watch
    /// caches' view of its objects, still holds what was applied ([`drift`]), or an apply of
    /// this render runs. A render whose apply failed is held back for a while ([`Held`]).
    fn apply_dedicated(
        &mut self,
        gw: &Gateway,
        key: &ObjectKey,
        config: &crate::gateway_config::GatewayConfig,
        credentials: render::Credentials,
        plane: render::DataPlane,
        live: &LivePlane<'_>,
    ) -> Applying {
        let uid = gw.metadata.uid.clone().unwrap_or_default();
        // What its pods run with: they take their routes while it is applied again.
        let runs_with = self.runs_with(&uid, &plane, live.deployment);
        // The tunnel of the pods of its Deployment's template now: a render on another moves
        // them there, and until a ready replica on that one is seen, its ready replicas are
        // connectors of this one ([`Reconciler::dedicated`]).
        let running = match &runs_with {
            RunsWith::AsApplied(served) => Some(served.credentials.tunnel.tunnel_id()),
            _ => live
                .deployment
                .and_then(render::annotated_tunnel)
                .map(|(id, _)| id),
        };
        let as_applied = match runs_with {
            RunsWith::Nothing => None,
            RunsWith::ThisRender => Some(Served::of(credentials.clone(), &plane)),
            RunsWith::AsApplied(served) => Some(served.clone()),
        };
        let to = credentials.tunnel.tunnel_id();
        let controlled = live
            .deployment
            .filter(|d| apply::controlled_by(d.owner_references(), &uid));
        let first_look = controlled.is_some() && self.moves_looked_at.insert(uid.clone());
        match running {
            Some(from) if from != to => {
                self.moving.insert(uid.clone(), Move { to, from });
            }
            _ => match self.moving.get(&uid) {
                Some(moving) if moving.to != to => {
                    self.moving.remove(&uid);
                }
                Some(_) => {}
                // A move applied before this replica led, as its Deployment records it.
                None => {
                    let recorded = controlled
                        .filter(|_| first_look)
                        .and_then(|d| recorded_move(d, to));
                    if let Some(moving) = recorded {
                        self.moving.insert(uid.clone(), moving);
                    }
                }
            },
        }
        let mut plane = plane;
        let moving_from = self.moving.get(&uid).map(|m| m.from);
        mark_moving(&mut plane, moving_from);
        // An unchanged render that was applied lately, and whose objects still hold what was
        // applied, is not applied again: that would be ten requests per Gateway per round.
        let digest = rendered_digest(&plane);
        let intact = self.applied.get(&uid).is_some_and(|applied| {
            applied.digest == digest
                && !applied.secret_leftover
                && applied.at.elapsed() < reapply_after(&uid)
                && applied.fields == OwnedFields::of(&plane, live)
                && drift::secret_intact(&plane, live)
                && !generated_secret_left(&plane, live, &uid)
        });
        if intact {
            // Back to the render applied: an apply of another one would undo it.
            if self
                .applies
                .running(&uid)
                .is_some_and(|running| running != digest.as_slice())
            {
                self.applies.abort(&uid);
            }
            return Applying::Intact(Served::of(credentials, &plane));
        }
        // A removal still running would take away what is applied.
        self.removals.abort(&uid);
        self.removal_failures.succeeded(&uid);
        if let Some(error) = self.apply_failures.error(&uid, &digest) {
            return Applying::Failed(NotApplied {
                reason: error.to_owned(),
                as_applied,
            });
        }
        let running = self.applies.running(&uid);
        // One of an earlier render is superseded, so it takes no room of its own.
        let start =
            running != Some(digest.as_slice()) && (running.is_some() || !self.applies.is_full());
        if !start {
            return Applying::waiting(as_applied, &plane);
        }
        let waiting = Applying::waiting(as_applied, &plane);
        let key = key.clone();
        let note = match &plane.network_policy {
            Some(_) => format!(
                "rendered Deployment {}, Service {} and NetworkPolicy {}",
                plane.names.deployment, plane.names.service, plane.names.network_policy
            ),
            None => format!(
                "rendered Deployment {} and Service {}",
                plane.names.deployment, plane.names.service
            ),
        };
        let gateway = gw.object_ref(&());
        let apply = apply_now(
            self.client.clone(),
            self.options.render.clone(),
            gw.clone(),
            config.clone(),
            credentials,
            (plane, moving_from),
            uid.clone(),
        );
        self.applies.start(uid, digest, async move {
            Finished {
                key,
                gateway,
                note,
                result: apply.await,
            }
        });
        waiting
    }

    /// Takes in the applies finished since the last round: the planes applied, and the
    /// failures, held back until their wait is over. Their Events go out in the background;
    /// `ProxyProvisioned` Events not taken before are offered again first, those of Gateways
    /// still there (the same object, not being deleted).
    fn take_finished_applies(&mut self, snapshot: &Snapshot) {
        let there = |key: &ObjectKey, regarding: &k8s_openapi::api::core::v1::ObjectReference| {
            snapshot.gateways.iter().any(|g| {
                object_key(g).as_ref() == Some(key)
                    && g.metadata.uid == regarding.uid
                    && g.metadata.deletion_timestamp.is_none()
            })
        };
        self.provisioned_untold
            .retain(|key, (regarding, _)| there(key, regarding));
        for (gateway, (regarding, note)) in std::mem::take(&mut self.provisioned_untold) {
            self.tell_provisioned(gateway, regarding, note);
        }
        for (uid, digest, done) in self.applies.finished() {
            let Some(done) = done else {
                // A bug in the apply: held back as a failure of its render, not tried at once
                // again.
                tracing::error!(%uid, "applying a data plane panicked");
                self.apply_failures.failed(
                    uid,
                    digest,
                    "applying the data plane panicked".to_owned(),
                );
                continue;
            };
            match done.result {
                Ok((changed, applied)) => {
                    self.applied.insert(uid.clone(), applied);
                    self.apply_failures.succeeded(&uid);
                    self.render_failures.remove(&done.key);
                    self.render_failed_told.remove(&done.key);
                    if changed {
                        tracing::info!(gateway = %done.key, "applied the data plane");
                        self.tell_provisioned(done.key, done.gateway, done.note);
                    }
                }
                Err(reason) => {
                    self.apply_failures.failed(uid, digest, reason.clone());
                    self.apply_failed(&done.gateway, &done.key, reason);
                }
            }
        }
    }

    /// Logs why a Gateway's plane could not be rendered or applied, and tells it in an Event
    /// (in the background) when the reason is new; its `Programmed` condition says it while it
    /// lasts. An Event not taken (no room for it) is made again in a later round, as the
    /// failure lasts.
    fn apply_failed(
        &mut self,
        gateway: &k8s_openapi::api::core::v1::ObjectReference,
        key: &ObjectKey,
        reason: String,
    ) {
        tracing::warn!(gateway = %key, %reason, "rendering the data plane failed");
        // Its plane is no longer as last applied.
        self.provisioned_untold.remove(key);
        if self.render_failed_told.get(key) != Some(&reason) {
            let told = report::Told::RenderFailed {
                gateway: key.clone(),
                reason: reason.clone(),
            };
            let event = self.event(
                gateway,
                EventType::Warning,
                "RenderFailed",
                "Render",
                &reason,
                told,
            );
            if self.status_writes.event(event) {
                self.render_failed_told.insert(key.clone(), reason.clone());
            }
        }
        self.render_failures.insert(key.clone(), reason);
    }

    /// Keeps the shared pool on the class tunnel's connector token: its pods' token variable
    /// reads the Secret the class settles on (the GatewayClassConfig's `tunnelTokenSecretRef`,
    /// else `--shared-tunnel-secret`), and its pod template is stamped with the digest of the
    /// token that Secret holds. The pods read the token at start, so a new Secret or a new
    /// token in it (rotated by hand or by a secrets operator) rolls them. While the class
    /// config does not resolve (its Secret missing, say), or the token does not parse, the
    /// pool is left on the token it runs with rather than new pods failing.
    ///
    /// The write runs in a task of its own ([`Reconciler::pool_writes`]) that no round waits
    /// for, one at a time: a newer stamp waits for the running one to end, since a write
    /// dropped for it could still land after it. The stamp is recorded once a round reads it
    /// finished
    /// ([`Reconciler::take_finished_pool_writes`]).
    fn stamp_shared_pool(&mut self, snapshot: &Snapshot, pool: Option<&Deployment>) {
        let Some(shared) = &self.options.shared else {
            return;
        };
        let Some(deployment) = &shared.deployment else {
            return;
        };
        if self.class.held.is_some() {
            // Told once a round already: the class config does not resolve.
            return;
        }
        let Some(source) = self.class.tunnel_secret.clone() else {
            return;
        };
        let (secret, key) = &source;
        let Some(token) = secret_text(snapshot, secret, key) else {
            return;
        };
        if let Err(error) = token.parse::<cftunnel_config::Token>() {
            if self.pool_stamp.as_ref().is_none_or(|(d, _)| !d.is_empty()) {
                tracing::warn!(%secret, %key, %error, "the shared pool's tunnel token does not parse; the pool is not rolled to it");
            }
            // Remembered as no digest, so the warning is not repeated every round.
            self.pool_stamp = Some((String::new(), std::time::Instant::now()));
            return;
        }
        // The Secret named is part of what was stamped: another one holding the same token
        // still repoints the pods.
        let digest = render::token_digest(&token);
        let stamp = format!("{digest} {secret}:{key}");
        // A pool that no longer takes it (a `helm upgrade` wrote the chart's token back) is
        // pointed again at once, not when the stamp is due.
        let fresh = self
            .pool_stamp
            .as_ref()
            .is_some_and(|(d, at)| *d == stamp && at.elapsed() < REAPPLY_AFTER)
            && pool.is_none_or(|live| {
                apply::pool_takes_token(
                    live,
                    render::TUNNEL_TOKEN_HASH_ANNOTATION,
                    &digest,
                    &source,
                )
            });
        // One at a time: a write dropped for a newer one may still land after it (its request
        // sent), pointing the pool back. The next round, which this one's end brings, writes
        // the newer stamp.
        if fresh || self.pool_writes.running(&PoolWrite::TunnelToken).is_some() {
            return;
        }
        let (client, deployment) = (self.client.clone(), deployment.clone());
        self.pool_writes
            .start(PoolWrite::TunnelToken, stamp.into_bytes(), async move {
                let result = apply::point_pool_at_token(
                    &client,
                    &deployment,
                    render::TUNNEL_TOKEN_HASH_ANNOTATION,
                    &digest,
                    &source,
                )
                .await;
                PoolWritten {
                    source: Some(source),
                    result,
                }
            });
    }

    /// Rolls the shared pool when one of its pods refused the config-API token it is pushed
    /// with: the pods read the token once, at start, and one whose Secret was changed outside
    /// Helm takes only the token before, which the pushes no longer offer once the controller
    /// that knew it is gone. Once per token: the stamp is its digest, not written again while
    /// its write runs ([`Reconciler::pool_writes`], which no round waits for) nor once the pool
    /// as watched carries it.
    fn roll_pool_refusing_token(
        &mut self,
        outcomes: &[(PlaneKey, push::PlaneOutcome)],
        planes: &BTreeMap<PlaneKey, PlaneInfo>,
        pool: Option<&Deployment>,
    ) {
        let refused = outcomes
            .iter()
            .any(|(plane, o)| *plane == PlaneKey::Shared && o.token_refused && !o.repeated);
        let (Some(deployment), Some(info)) = (
            self.options
                .shared
                .as_ref()
                .and_then(|s| s.deployment.as_ref()),
            planes.get(&PlaneKey::Shared),
        ) else {
            return;
        };
        if !refused {
            return;
        }
        let digest = render::token_digest(&info.token);
        // One at a time, as the stamp's: a dropped write could still land after a newer one.
        if self.pool_writes.running(&PoolWrite::ConfigToken).is_some() {
            return;
        }
        if !apply::pool_needs_roll(pool, render::AUTH_TOKEN_HASH_ANNOTATION, &digest) {
            return;
        }
        let (client, deployment) = (self.client.clone(), deployment.clone());
        self.pool_writes.start(
            PoolWrite::ConfigToken,
            digest.clone().into_bytes(),
            async move {
                let result = apply::roll_pool(
                    &client,
                    &deployment,
                    render::AUTH_TOKEN_HASH_ANNOTATION,
                    &digest,
                )
                .await
                .map(|()| true);
                PoolWritten {
                    source: None,
                    result,
                }
            },
        );
    }

    /// Takes in the writes to the shared pool finished since the last round: a stamp that
    /// landed is recorded ([`Reconciler::pool_stamp`]); one that failed is not, so the next
    /// round writes it again.
    fn take_finished_pool_writes(&mut self) {
        let Some(deployment) = self
            .options
            .shared
            .as_ref()
            .and_then(|s| s.deployment.clone())
        else {
            return;
        };
        for (write, stamp, done) in self.pool_writes.finished() {
            let PoolWritten { source, result } = done.unwrap_or_else(|| PoolWritten {
                source: None,
                result: Err("the write ended in a panic".to_owned()),
            });
            match (write, result) {
                (PoolWrite::TunnelToken, Ok(stamped)) => {
                    if let (true, Some((secret, key))) = (stamped, &source) {
                        tracing::info!(%deployment, %secret, %key, "the shared pool's tunnel token changed: rolling the pool");
                    }
                    let stamp = String::from_utf8_lossy(&stamp).into_owned();
                    self.pool_stamp = Some((stamp, std::time::Instant::now()));
                }
                (PoolWrite::TunnelToken, Err(reason)) => {
                    tracing::warn!(%deployment, %reason, "pointing the shared pool at its tunnel token failed")
                }
                (PoolWrite::ConfigToken, Ok(_)) => {
                    tracing::warn!(%deployment, "shared pool pods refuse the config-API token: rolling the pool onto it")
                }
                (PoolWrite::ConfigToken, Err(reason)) => {
                    tracing::warn!(%deployment, %reason, "rolling the shared pool onto its config-API token failed")
                }
            }
        }
    }

    /// Starts removing what is left of a Gateway's dedicated plane, in a task of its own that
    /// no round waits for ([`InFlight`]), as applies run: a removal is several requests in a
    /// row, and one held by an admission webhook up to the API timeout would hold up every
    /// tenant's round. The watched caches say whether anything is left (so Gateways that never
    /// had a plane cost no API calls): the Deployment, or any object applied before it, which
    /// stays behind when the Deployment could not be; only objects the Gateway controls and
    /// that are not being deleted already (a finalizer holds them) count, as only those are
    /// deleted. A removal that failed is not started again until its wait is over ([`Held`]).
    fn remove_plane(
        &mut self,
        gw: &Gateway,
        key: &ObjectKey,
        snapshot: &Snapshot,
        deployments: &[Deployment],
        watched: &PlaneObjects,
    ) {
        // Its plane goes: what was kept of its renders no longer holds. A Gateway that comes
        // back to a dedicated plane failing for the same reason is told again.
        self.render_failures.remove(key);
        self.render_failed_told.remove(key);
        self.provisioned_untold.remove(key);
        let (Some(uid), Ok(names), Ok(go)) = (
            gw.metadata.uid.clone(),
            PlaneNames::for_gateway(gw),
            GoControllerNames::for_gateway(gw),
        ) else {
            return;
        };
        // An apply still running would put back what is removed.
        self.applies.abort(&uid);
        self.moving.remove(&uid);
        let ns = key.namespace.as_str();
        let left = plane_objects(ns, &uid, &names, snapshot, deployments)
            .any(|meta| meta.deletion_timestamp.is_none())
            || watched
                .network_policy(ns, &names.network_policy)
                .is_some_and(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && apply::controlled_by(p.owner_references(), &uid)
                });
        if !left {
            return;
        }
        self.applied.remove(&uid);
        if self.removals.running(&uid).is_some()
            || self.removals.is_full()
            || self.removal_failures.error(&uid, &[]).is_some()
        {
            return;
        }
        let (client, key) = (self.client.clone(), key.clone());
        self.removals.start(uid.clone(), Vec::new(), async move {
            let removed = apply::remove_plane(&client, &names, &go, &key.namespace, &uid).await;
            (key, removed)
        });
    }

    /// Takes in the removals finished since the last round, holding back those that failed
    /// until their wait is over.
    fn take_finished_removals(&mut self) {
        for (uid, digest, done) in self.removals.finished() {
            match done {
                Some((key, Ok(removed))) => {
                    self.removal_failures.succeeded(&uid);
                    if removed {
                        tracing::info!(gateway = %key, "removed the dedicated data plane");
                    }
                }
                Some((key, Err(reason))) => {
                    tracing::warn!(gateway = %key, %reason, "removing the data plane failed");
                    self.removal_failures.failed(uid, digest, reason);
                }
                None => {
                    tracing::error!(%uid, "removing a data plane panicked");
                    self.removal_failures.failed(
                        uid,
                        digest,
                        "removing the data plane panicked".to_owned(),
                    );
                }
            }
        }
    }
}

/// Whether `gw`'s plane was rendered by this controller: its objects' Gateway API class label
/// names one of `controller_name`'s GatewayClasses (as [`render::class_label`] writes a class
/// name), or a class since deleted while the Gateway is on no class listed.
///
/// A class since deleted may have been another installation's: nothing on a plane tells the
/// installations apart but its class (they share field manager and labels). A Gateway moved
/// from such a class to another of that installation's, the old class deleted meanwhile,
/// keeps a plane labelled for the deleted class that its own controller relabels once it
/// leads again; so while the Gateway's class is listed, and not ours, its plane is left to
/// that class's controller. (Ours, for a class of ours deleted as its Gateway moved to another
/// controller's, is then left too; it goes with its Gateway, which controls it.)
///
/// A plane none of whose objects carries the label is not taken for ours: another
/// installation's, rendered by a version that left out class names too long for a label
/// value, looks just like that. Ours carry the label since the first apply of this version, so
/// what is left alone is at most a plane whose Gateway left before that apply; it goes with
/// its Gateway, which controls it.
fn rendered_for_our_class(
    gw: &Gateway,
    snapshot: &Snapshot,
    deployments: &[Deployment],
    controller_name: &str,
) -> bool {
    let (Some(namespace), Some(uid), Ok(names)) = (
        gw.metadata.namespace.as_deref(),
        gw.metadata.uid.as_deref(),
        PlaneNames::for_gateway(gw),
    ) else {
        return false;
    };
    let class_listed = snapshot
        .gateway_classes
        .iter()
        .any(|c| c.metadata.name.as_deref() == Some(gw.spec.gateway_class_name.as_str()));
    let ours = plane_objects(namespace, uid, &names, snapshot, deployments)
        .filter_map(|meta| meta.labels.as_ref()?.get(CLASS_LABEL))
        .any(|label| {
            let class = snapshot.gateway_classes.iter().find(|c| {
                c.metadata
                    .name
                    .as_deref()
                    .is_some_and(|name| render::class_label(name) == *label)
            });
            match class {
                Some(class) => class.spec.controller_name == controller_name,
                None => !class_listed,
            }
        });
    ours
}

/// The objects of the plane `names` of the Gateway `uid` in `namespace` that the caches hold
/// and the Gateway controls: its Deployment (by its Gateway label, so under the Go
/// controller's name too), its config Service and its token Secret. One it does not control is
/// never removed, so it must not count as a plane left to remove: a Deployment someone else
/// labelled would cost a removal's reads at every round.
fn plane_objects<'a>(
    namespace: &'a str,
    uid: &'a str,
    names: &'a PlaneNames,
    snapshot: &'a Snapshot,
    deployments: &'a [Deployment],
) -> impl Iterator<Item = &'a kube::api::ObjectMeta> + 'a {
    let owned = move |meta: &kube::api::ObjectMeta, name: &str| {
        meta.namespace.as_deref() == Some(namespace)
            && meta.name.as_deref() == Some(name)
            && apply::controlled_by(meta.owner_references.as_deref().unwrap_or_default(), uid)
    };
    let deployments = deployments
        .iter()
        .filter(move |d| {
            d.metadata.namespace.as_deref() == Some(namespace)
                && d.labels().get(GATEWAY_LABEL) == Some(&names.gateway_label)
                && apply::controlled_by(d.owner_references(), uid)
        })
        .map(|d| &d.metadata);
    let services = snapshot
        .services
        .iter()
        .map(|s| &s.metadata)
        .filter(move |m| owned(m, &names.service));
    let secrets = snapshot
        .secrets
        .iter()
        .map(|s| &s.metadata)
        .filter(move |m| owned(m, &names.auth_secret));
    deployments.chain(services).chain(secrets)
}

/// Applies a plane rendered for Gateway `gw` ([`Reconciler::apply_dedicated`]): with a
/// generated token, first makes sure its Secret exists, and renders again with the token the
/// cluster holds if the watch cache's view of it was stale, its Deployment recording the move
/// from tunnel `moving_from` then too ([`mark_moving`]). Whether the apply changed anything,
/// and what it applied.
async fn apply_now(
    client: Client,
    settings: RenderSettings,
    gw: Gateway,
    config: crate::gateway_config::GatewayConfig,
    credentials: render::Credentials,
    (plane, moving_from): (render::DataPlane, Option<uuid::Uuid>),
    uid: String,
) -> Result<(bool, AppliedPlane), String> {
    let mut leftover = false;
    let (credentials, plane) = match &plane.auth_secret {
        Some(secret) => {
            let held = apply::ensure_auth_secret(&client, secret, &uid).await?;
            leftover = held.leftover;
            if held.token == credentials.auth_token && held.key == credentials.auth_ref.key {
                (credentials, plane)
            } else {
                // The one render of a plane a round repeats: the Secret holds another token
                // than the watch cache showed (it lags, or another replica created the
                // Secret), and the pods read that one. The translation's decision stands:
                // acceptance and tunnel do not depend on the config-API token.
                let credentials = credentials.with_auth_token(held.token, &held.key);
                let mut plane = render::render(&gw, &config, &credentials, &settings)
                    .map_err(|e| e.to_string())?;
                mark_moving(&mut plane, moving_from);
                (credentials, plane)
            }
        }
        None => (credentials, plane),
    };
    let namespace = plane.deployment.namespace().unwrap_or_default();
    let go = GoControllerNames::for_gateway(&gw).map_err(|e| e.to_string())?;
    let applied = apply::apply_plane(&client, &plane, &go, &namespace, &uid, FIELD_MANAGER).await?;
    Ok((
        applied.changed,
        AppliedPlane {
            digest: rendered_digest(&plane),
            at: std::time::Instant::now(),
            fields: OwnedFields::applied(&plane, &applied),
            served: Served::of(credentials, &plane),
            secret_leftover: leftover,
        },
    ))
}

/// Whether the watch caches hold the generated config-API token Secret of `uid`'s plane though
/// it is done with ([`apply::generated_secret_unused`]): the plane is applied again, which
/// deletes it.
fn generated_secret_left(plane: &render::DataPlane, live: &LivePlane<'_>, uid: &str) -> bool {
    live.auth_secret
        .is_some_and(|s| apply::controlled_by(s.owner_references(), uid))
        && live
            .deployment
            .is_some_and(|d| apply::generated_secret_unused(plane, d))
}

/// The digest of the credentials a Deployment's pod template carries
/// ([`render::CREDENTIALS_HASH_ANNOTATION`]).
fn credentials_hash(deployment: &Deployment) -> Option<&str> {
    apply::template_annotation(deployment, render::CREDENTIALS_HASH_ANNOTATION)
}

/// The rules broken planes on one tunnel serve of their own ([`own_rules`]), as they last
/// served them.
#[derive(Default)]
struct KeptRules {
    rules: Vec<cftunnel_config::Rule>,
    grpc: bool,
}

impl KeptRules {
    /// Takes the own rules of the broken Gateway `gateway`, whose plane last served `last`.
    fn add(
        &mut self,
        last: &LastGood,
        snapshot: &Snapshot,
        output: &translate::Output,
        gateway: &ObjectKey,
    ) {
        self.rules
            .extend(own_rules(&last.config, snapshot, output, gateway));
        self.grpc |= last.config.has_grpc_route;
    }

    /// Adds them to `config`, each once. A route a healthy Gateway on the tunnel has too is
    /// served on that Gateway's hostnames as it is now: a rule of the same name for the same
    /// hostnames is not taken from the broken plane's last config. So what the planes are
    /// given is the same from round to round, however often the broken plane's last config is
    /// the tunnel's config of the round before, and the route keeps its hostnames through the
    /// broken Gateway.
    fn add_to(&self, config: &mut cftunnel_config::Config) {
        let current: HashSet<(&str, &[String])> = config
            .rules
            .iter()
            .filter_map(|r| Some((r.name.as_deref()?, r.hostnames.as_slice())))
            .collect();
        let mut added = HashSet::new();
        let own: Vec<cftunnel_config::Rule> = self
            .rules
            .iter()
            .filter(|r| {
                r.name
                    .as_deref()
                    .is_some_and(|n| !current.contains(&(n, r.hostnames.as_slice())))
                    && added.insert(*r)
            })
            .cloned()
            .collect();
        config.rules.extend(own);
        config.has_grpc_route |= self.grpc;
    }
}

/// The rules of a broken Gateway `gateway`'s last config that are its own: those of the routes
/// that still name it as a parent (rule names are `namespace/route/rule`), each for the
/// hostnames the route gets through the Gateway's listeners now ([`hosts_through`]), and its
/// listeners' rules of the controller's own (listener isolation), named
/// `namespace/owner/kind:listener` after the Gateway or a ListenerSet attached to it (a rule's
/// name in a route has no `:`). Its other rules came from other planes on its tunnel, and so
/// did a route's rules for the hostnames of another Gateway it names or named: those are served
/// as the other planes serve them now (not at all, once the route has left that Gateway).
/// Names do not tell an HTTPRoute from a GRPCRoute of the same name: while one of the two names
/// the Gateway, the other's rules go with it, for the hostnames of either.
fn own_rules(
    last: &cftunnel_config::Config,
    snapshot: &Snapshot,
    output: &translate::Output,
    gateway: &ObjectKey,
) -> Vec<cftunnel_config::Rule> {
    let routes = hosts_through(snapshot, output, gateway);
    // `listener:NAME` after the Gateway, `listenerset-listener:NAME` after a ListenerSet, which
    // is its own only while attached to it, whatever its name.
    let its_listeners = |ns: &str, name: &str, rest: &str| {
        if rest.starts_with("listener:") {
            (ns, name) == (gateway.namespace.as_str(), gateway.name.as_str())
        } else {
            attached_set(output, &ObjectKey::new(ns, name), gateway)
        }
    };
    last.rules
        .iter()
        .filter_map(|rule| {
            let mut parts = rule.name.as_deref().unwrap_or_default().splitn(3, '/');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(ns), Some(name), Some(rest)) if rest.contains(':') => {
                    its_listeners(ns, name, rest).then(|| rule.clone())
                }
                (Some(ns), Some(name), _) => routes.get(&(ns, name))?.cut(rule),
                _ => None,
            }
        })
        .collect()
}

/// Whether the ListenerSet `set`'s status says it is attached to Gateway `gateway`.
fn attached_set(output: &translate::Output, set: &ObjectKey, gateway: &ObjectKey) -> bool {
    output
        .statuses
        .listener_sets
        .get(set)
        .is_some_and(|status| status.gateway == *gateway)
}

/// The hosts a route gets through one Gateway's listeners.
#[derive(Default)]
struct Through {
    /// Through a listener without a hostname, the route having none: every host.
    any: bool,
    /// Lower-cased.
    hosts: BTreeSet<String>,
}

impl Through {
    /// `rule` for those of its hostnames the route gets here; `None` when it gets none of
    /// them. A rule without hostnames (every host) is kept only where the route gets every
    /// host.
    fn cut(&self, rule: &cftunnel_config::Rule) -> Option<cftunnel_config::Rule> {
        if rule.hostnames.is_empty() {
            return self.any.then(|| rule.clone());
        }
        let hostnames: Vec<String> = rule
            .hostnames
            .iter()
            .filter(|h| self.hosts.contains(&h.to_ascii_lowercase()))
            .cloned()
            .collect();
        (!hostnames.is_empty()).then(|| cftunnel_config::Rule {
            hostnames,
            ..rule.clone()
        })
    }
}

/// The hosts each route (by namespace and name, whichever its kind) that names the Gateway
/// `gateway` gets through it now: for each of the route's parents that is the Gateway or a
/// ListenerSet attached to it, the listeners of that parent its sectionName and port select,
/// each intersected with the route's hostnames as the translation does
/// ([`translate::route_hosts_through`]). A listener is selected by sectionName and port alone:
/// what its allowedRoutes admit is not asked, so a route the Gateway refuses may keep hosts.
fn hosts_through<'s>(
    snapshot: &'s Snapshot,
    output: &'s translate::Output,
    gateway: &ObjectKey,
) -> BTreeMap<(&'s str, &'s str), Through> {
    let gw = snapshot
        .gateways
        .iter()
        .find(|g| object_key(*g).as_ref() == Some(gateway));
    // Each route's `spec.hostnames`, by kind, namespace and name.
    let keyed = |meta: &'s kube::api::ObjectMeta, hostnames: &'s Option<Vec<String>>| {
        Some((
            (meta.namespace.as_deref()?, meta.name.as_deref()?),
            hostnames.as_deref().unwrap_or_default(),
        ))
    };
    let http: HashMap<(&str, &str), &[String]> = snapshot
        .http_routes
        .iter()
        .filter_map(|r| keyed(&r.metadata, &r.spec.hostnames))
        .collect();
    let grpc: HashMap<(&str, &str), &[String]> = snapshot
        .grpc_routes
        .iter()
        .filter_map(|r| keyed(&r.metadata, &r.spec.hostnames))
        .collect();
    let mut routes: BTreeMap<(&str, &str), Through> = BTreeMap::new();
    for (route, parents) in &output.statuses.routes {
        let (ns, name) = (route.key.namespace.as_str(), route.key.name.as_str());
        let hostnames = match route.kind {
            translate::RouteKind::Http => http.get(&(ns, name)),
            translate::RouteKind::Grpc => grpc.get(&(ns, name)),
        };
        let hostnames: &[String] = hostnames.copied().unwrap_or_default();
        for parent in parents {
            let p = &parent.parent_ref;
            if output.statuses.parent_gateway(p).as_ref() != Some(gateway) {
                continue;
            }
            let through = routes.entry((ns, name)).or_default();
            let listeners: Vec<(&str, i32, Option<&str>)> = match p.kind {
                translate::ParentKind::Gateway => gw
                    .iter()
                    .flat_map(|g| &g.spec.listeners)
                    .map(|l| (l.name.as_str(), l.port, l.hostname.as_deref()))
                    .collect(),
                translate::ParentKind::ListenerSet | translate::ParentKind::XListenerSet => {
                    let key = ObjectKey::new(&p.namespace, &p.name);
                    snapshot
                        .listener_sets
                        .iter()
                        .filter(|set| object_key(*set).as_ref() == Some(&key))
                        .flat_map(|set| &set.spec.listeners)
                        .map(|l| (l.name.as_str(), l.port, l.hostname.as_deref()))
                        .collect()
                }
            };
            let selected = listeners.into_iter().filter(|(name, port, _)| {
                p.section_name.as_deref().is_none_or(|s| s == *name)
                    && p.port.is_none_or(|want| want == *port)
            });
            for (_, _, hostname) in selected {
                match translate::route_hosts_through(hostname, hostnames) {
                    Some(hosts) if hosts.is_empty() => through.any = true,
                    Some(hosts) => through.hosts.extend(hosts),
                    None => {}
                }
            }
        }
    }
    routes
}

/// Writes each tunnel's ingress document: one per tunnel, whatever number of planes share it.
/// Returns, per plane, why its tunnel's document could not be written; and the planes whose
/// tunnel's document is still on its way.
///
/// The planes of one tunnel may name different API credentials (each Gateway's
/// GatewayConfig, or the controller's own): [`writers_for`] chooses among them, and when a
/// write fails the planes it carried are given to another writer in the same round, so one
/// Gateway's revoked or too narrow token does not keep the tunnel's document from every
/// Gateway on it. A tunnel with no writer left is reported, to each plane with the failure of
/// the credentials it names.
async fn sync_tunnels(
    api: Option<&TunnelApi>,
    sync: &mut TunnelSync,
    output: &translate::Output,
    planes: &BTreeMap<PlaneKey, PlaneInfo>,
) -> (HashMap<PlaneKey, String>, HashSet<PlaneKey>) {
    let mut failures = HashMap::new();
    let mut writing = HashSet::new();
    let mut tunnels = TunnelWriters::default();
    for (plane, info) in planes {
        match (&info.tunnel, info.identity) {
            (Some(Ok(target)), Some(identity)) => {
                if !tunnels.order.contains(&target) {
                    tunnels.order.push(target);
                }
                let (targets, on_tunnel) = tunnels.by_identity.entry(identity).or_default();
                if !targets.contains(&target) {
                    targets.push(target);
                }
                on_tunnel.push(plane);
            }
            (Some(Err(reason)), _) => {
                failures.insert(plane.clone(), reason.clone());
            }
            _ => {}
        }
    }
    // What failed this round, by writer; what each writer carries this round. A writer given
    // more in a later pass writes again all it carries.
    let mut failed: BTreeMap<&TunnelTarget, String> = BTreeMap::new();
    let mut carries: BTreeMap<&TunnelTarget, Vec<TunnelIdentity>> = BTreeMap::new();
    // Identities a write of this round took: one carried again in a later pass whose write
    // fails still holds what the earlier one wrote.
    let mut written: BTreeSet<TunnelIdentity> = BTreeSet::new();
    let mut unwritten: Vec<TunnelIdentity> = tunnels.by_identity.keys().copied().collect();
    while !unwritten.is_empty() {
        let (assigned, stranded) = writers_for(&tunnels, &unwritten, &failed, sync);
        for identity in stranded {
            for plane in tunnels.planes(&[identity]) {
                let reason = own_failure(planes.get(plane), &failed, sync)
                    .or_else(|| tunnels.failure(identity, &failed, sync))
                    .unwrap_or_else(|| "no API credentials are left to write it with".to_owned());
                failures.insert(plane.clone(), reason);
            }
        }
        let Some(api) = api else { break };
        // A call with nothing to write would still reset the read backs' alarm.
        if assigned.is_empty() {
            break;
        }
        // Writers waiting to be tried again (asked as some identity's only writer) go in a
        // pass of their own, their held failures answering: the others of their tunnel are
        // given what they leave in the next, so no writer asks with one document and then another every round.
        let waiting: BTreeSet<uuid::Uuid> = assigned
            .keys()
            .filter(|t| sync.failing(t).is_some())
            .map(|t| t.tunnel)
            .collect();
        let mut deferred = Vec::new();
        let mut asked = Vec::new();
        for (target, identities) in assigned {
            if waiting.contains(&target.tunnel) && sync.failing(target).is_none() {
                deferred.extend(identities);
                continue;
            }
            carries.entry(target).or_default().extend(identities);
            asked.push(target);
        }
        let work: Vec<(TunnelTarget, Value)> = asked
            .iter()
            .map(|target| {
                let carried = carries.get(target).map_or(&[][..], Vec::as_slice);
                let configs: Vec<&cftunnel_config::Config> = tunnels
                    .planes(carried)
                    .into_iter()
                    .filter_map(|p| output.configs.get(p))
                    .collect();
                ((*target).clone(), cloudflare::ingress_document(&configs))
            })
            .collect();
        let results = sync.sync_all(api, work).await;
        let results: Vec<_> = asked.into_iter().zip(results).collect();
        // Every failure of the pass first: no tunnel moves to a writer that failed in it.
        for (target, result) in &results {
            if let Err(reason) = result {
                failed.insert(target, reason.clone());
            }
        }
        unwritten = deferred;
        for (target, result) in results {
            match result {
                Ok(synced) => {
                    if matches!(synced, cloudflare::Synced::Wrote) {
                        tracing::info!(tunnel = %target.tunnel, "wrote the tunnel's ingress document");
                    }
                    let carried = carries.get(target).map_or(&[][..], Vec::as_slice);
                    if matches!(synced, cloudflare::Synced::Behind) {
                        writing.extend(tunnels.planes(carried).into_iter().cloned());
                    } else {
                        written.extend(carried.iter().copied());
                    }
                }
                Err(reason) => {
                    tracing::warn!(tunnel = %target.tunnel, %reason, "writing the tunnel's ingress document failed");
                    let carried = carries.remove(target).unwrap_or_default();
                    unwritten.extend(carried.into_iter().filter(|id| !written.contains(id)));
                }
            }
        }
    }
    // A tunnel whose writes fail is still served: what it last took is what it serves. The
    // writers asked this round keep their records, and those waiting to be tried again theirs.
    let kept: Vec<&TunnelTarget> = tunnels
        .by_identity
        .values()
        .flat_map(|(targets, _)| targets.iter().copied())
        .filter(|t| carries.contains_key(t) || failed.contains_key(t) || sync.failing(t).is_some())
        .collect();
    sync.retain(kept, |t| {
        planes
            .values()
            .any(|info| info.identity.is_some_and(|identity| identity.id == *t))
    });
    (failures, writing)
}

/// Per tunnel identity: the writers its planes name, in the planes' order, and its planes; and
/// every writer, in the order of the first plane naming it.
#[derive(Default)]
struct TunnelWriters<'p> {
    by_identity: BTreeMap<TunnelIdentity, (Vec<&'p TunnelTarget>, Vec<&'p PlaneKey>)>,
    order: Vec<&'p TunnelTarget>,
}

impl<'p> TunnelWriters<'p> {
    /// The planes of `identities`.
    fn planes(&self, identities: &[TunnelIdentity]) -> Vec<&'p PlaneKey> {
        identities
            .iter()
            .filter_map(|id| self.by_identity.get(id))
            .flat_map(|(_, on_tunnel)| on_tunnel.iter().copied())
            .collect()
    }

    /// The writers `identity` may be written with now: those not failed this round; of an
    /// identity with several, also not waiting to be tried again, unless `asked_anyway` (the
    /// only writer of another identity, asked whatever its wait, as a changed document goes out
    /// at once): so a writer carries the same identities, and asks with the same document, in
    /// every round its wait lasts, and its held failure answers for it.
    fn usable(
        &self,
        identity: TunnelIdentity,
        failed: &BTreeMap<&TunnelTarget, String>,
        sync: &TunnelSync,
        asked_anyway: &[&TunnelTarget],
    ) -> Vec<&'p TunnelTarget> {
        let Some((targets, _)) = self.by_identity.get(&identity) else {
            return Vec::new();
        };
        let several = targets.len() > 1;
        targets
            .iter()
            .copied()
            .filter(|t| {
                let waiting = several && sync.failing(t).is_some() && !asked_anyway.contains(t);
                !failed.contains_key(t) && !waiting
            })
            .collect()
    }

    /// A failure of one of `identity`'s writers: this round's, else one still waiting.
    fn failure(
        &self,
        identity: TunnelIdentity,
        failed: &BTreeMap<&TunnelTarget, String>,
        sync: &TunnelSync,
    ) -> Option<String> {
        let (targets, _) = self.by_identity.get(&identity)?;
        let this_round = targets.iter().find_map(|t| failed.get(t).cloned());
        this_round.or_else(|| {
            let waiting = targets.iter().find_map(|t| sync.failing(t));
            waiting.map(str::to_owned)
        })
    }
}

/// What failed of the credentials `plane` names: this round, or still waiting to be tried.
fn own_failure(
    plane: Option<&PlaneInfo>,
    failed: &BTreeMap<&TunnelTarget, String>,
    sync: &TunnelSync,
) -> Option<String> {
    let Some(Ok(own)) = plane.and_then(|info| info.tunnel.as_ref()) else {
        return None;
    };
    failed
        .get(own)
        .cloned()
        .or_else(|| sync.failing(own).map(str::to_owned))
}

/// Writers for the tunnel identities `unwritten`, tunnel by tunnel: the writer usable by the
/// most of a tunnel's identities (among equals, the one the first plane names) writes for all
/// of them, one document; then likewise for those left. Identities of one tunnel that name the
/// same credentials so share one document, which two writers would take turns replacing (a
/// tunnel whose connector token was rotated, its planes on either secret), and no document
/// ever holds the planes of two identities unless they name the very same writer. Returns the
/// writers with what each is to write, and the identities no writer is left for.
fn writers_for<'p>(
    tunnels: &TunnelWriters<'p>,
    unwritten: &[TunnelIdentity],
    failed: &BTreeMap<&TunnelTarget, String>,
    sync: &TunnelSync,
) -> (
    BTreeMap<&'p TunnelTarget, Vec<TunnelIdentity>>,
    Vec<TunnelIdentity>,
) {
    let mut assigned: BTreeMap<&TunnelTarget, Vec<TunnelIdentity>> = BTreeMap::new();
    let mut stranded = Vec::new();
    let mut by_tunnel: BTreeMap<uuid::Uuid, Vec<TunnelIdentity>> = BTreeMap::new();
    for identity in unwritten {
        by_tunnel.entry(identity.id).or_default().push(*identity);
    }
    for mut left in by_tunnel.into_values() {
        while !left.is_empty() {
            // The only writers of identities left, not failed this round: asked anyway.
            let sole: Vec<&TunnelTarget> = left
                .iter()
                .filter_map(|id| match tunnels.by_identity.get(id) {
                    Some((targets, _)) if targets.len() == 1 => targets.first().copied(),
                    _ => None,
                })
                .filter(|t| !failed.contains_key(t))
                .collect();
            let usable: Vec<(TunnelIdentity, Vec<&TunnelTarget>)> = left
                .iter()
                .map(|id| (*id, tunnels.usable(*id, failed, sync, &sole)))
                .collect();
            let count = |w: &TunnelTarget| usable.iter().filter(|(_, ts)| ts.contains(&w)).count();
            let mut best: Option<(&TunnelTarget, usize)> = None;
            for w in &tunnels.order {
                let n = count(w);
                if n > 0 && best.is_none_or(|(_, most)| n > most) {
                    best = Some((w, n));
                }
            }
            let Some((writer, _)) = best else {
                stranded.append(&mut left);
                break;
            };
            let takes: Vec<TunnelIdentity> = usable
                .iter()
                .filter(|(_, targets)| targets.contains(&writer))
                .map(|(id, _)| *id)
                .collect();
            left.retain(|id| !takes.contains(id));
            assigned.entry(writer).or_default().extend(takes);
        }
    }
    (assigned, stranded)
}

/// The identity of a rendered plane's objects.
/// A plane's `plane` label on `/metrics`: `shared`, or the Gateway's `namespace/name`.
fn plane_label(plane: &PlaneKey) -> health::PlaneLabel {
    health::PlaneLabel {
        plane: match plane {
            PlaneKey::Shared => "shared".to_owned(),
            PlaneKey::Dedicated(gateway) => gateway.to_string(),
        },
    }
}

fn rendered_digest(plane: &render::DataPlane) -> Vec<u8> {
    let objects = json!([
        plane.deployment,
        plane.service,
        plane.network_policy,
        plane.autoscaler,
        plane.auth_secret,
    ]);
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, objects.to_string().as_bytes())
        .as_ref()
        .to_vec()
}

/// The config-API addresses of the pods behind a plane's Service `namespace/service`, and of
/// those the ones not serving.
fn plane_pods(
    snapshot: &Snapshot,
    namespace: &str,
    service: &str,
) -> (Vec<std::net::SocketAddr>, Vec<std::net::SocketAddr>) {
    let slices: Vec<_> = snapshot
        .endpoint_slices
        .iter()
        .filter(|s| serves(s, namespace, service))
        .cloned()
        .collect();
    (
        push::pod_addresses(&slices, CONFIG_PORT_NAME),
        push::not_serving_addresses(&slices, CONFIG_PORT_NAME),
    )
}

/// Whether `slice` lists the pods of Service `service` in `namespace`.
fn serves(
    slice: &k8s_openapi::api::discovery::v1::EndpointSlice,
    namespace: &str,
    service: &str,
) -> bool {
    slice.metadata.namespace.as_deref() == Some(namespace)
        && slice
            .labels()
            .get("kubernetes.io/service-name")
            .map(String::as_str)
            == Some(service)
        && from_endpoint_controller(slice)
}

/// Whether Kubernetes' EndpointSlice controller wrote this slice. The controller sends its
/// bearer token to the addresses listed, so a slice anyone else labelled for the Service must
/// not count.
fn from_endpoint_controller(slice: &k8s_openapi::api::discovery::v1::EndpointSlice) -> bool {
    slice
        .labels()
        .get("endpointslice.kubernetes.io/managed-by")
        .is_some_and(|m| m == "endpointslice-controller.k8s.io")
}

fn object_key<K: kube::Resource>(object: &Arc<K>) -> Option<ObjectKey> {
    let meta = object.meta();
    Some(ObjectKey::new(meta.namespace.clone()?, meta.name.clone()?))
}

/// A Secret key's text, trimmed as the proxy trims tokens.
fn secret_text(snapshot: &Snapshot, key: &ObjectKey, field: &str) -> Option<String> {
    render::secret_text(&snapshot.secrets, &key.namespace, &key.name, field)
}

/// The tunnel address (`<tunnel id>.cfargotunnel.com`) a Gateway on the shared plane shows.
fn shown_tunnel_address(
    snapshot: &Snapshot,
    gateway_planes: &BTreeMap<ObjectKey, PlaneKey>,
) -> Option<String> {
    snapshot
        .gateways
        .iter()
        .filter(|gw| {
            object_key(gw).is_some_and(|k| gateway_planes.get(&k) == Some(&PlaneKey::Shared))
        })
        .flat_map(|gw| gw.status.iter().flat_map(|s| s.addresses.iter().flatten()))
        .map(|a| a.value.as_str())
        .find(|value| {
            value
                .strip_suffix(".cfargotunnel.com")
                .is_some_and(|id| id.parse::<uuid::Uuid>().is_ok())
        })
        .map(str::to_owned)
}

/// The tunnel the shared pool serves, as the class config names it. A class config may name
/// the tunnel by id alone: its document is still written, and no other plane is taken to
/// share it.
fn shared_identity(
    class: &ClassSettings,
    class_tunnel: Option<TunnelIdentity>,
) -> Option<TunnelIdentity> {
    class_tunnel.or_else(|| class.tunnel_id.map(TunnelIdentity::named))
}

/// The address the shared Gateways show: their tunnel's. It depends on the tunnel alone, not
/// on whether configs can be pushed to the pool: the pool's connectors serve that tunnel
/// either way, and an empty address would take the shared Gateways' `status.addresses`
/// away, and the DNS records that follow them.
fn shared_address(
    snapshot: &Snapshot,
    class: &ClassSettings,
    class_tunnel: Option<TunnelIdentity>,
    gateway_planes: &BTreeMap<ObjectKey, PlaneKey>,
) -> String {
    match shared_identity(class, class_tunnel) {
        Some(t) => render::tunnel_hostname(t.id),
        // A controller that started while the class config does not resolve has read no
        // tunnel: the shared Gateways keep the address they show, whose tunnel the pool's
        // connectors still run on (while it does not resolve, the one last read).
        None if class.held.is_some() => {
            shown_tunnel_address(snapshot, gateway_planes).unwrap_or_default()
        }
        None => String::new(),
    }
}

/// The shared pool as a plane of the round, or what is wrong with its config-API token (said
/// once, while some Gateway depends on the pool, by `Reconciler::note_unreached`: an idle
/// pool's token is no fault, and a warning every round would bury the rest).
fn shared_plane(
    shared: &SharedPlane,
    snapshot: &Snapshot,
    class: &ClassSettings,
    class_tunnel: Option<TunnelIdentity>,
    address: String,
) -> Result<PlaneInfo, String> {
    let token = secret_text(snapshot, &shared.auth_secret, &shared.auth_key)
        .ok_or_else(|| "is missing".to_owned())?;
    // The rule the pool's proxies start by: pushed with another, they would never take it.
    let token = cftunnel_config::auth_token::check(&token)
        .map_err(|e| format!("is not one a proxy takes ({e})"))?
        .to_owned();
    let identity = shared_identity(class, class_tunnel);
    let tunnel = match (
        &class.held,
        class.tunnel_id,
        &class.account_id,
        &class.api_token,
    ) {
        (Some(reason), ..) => Some(Err(reason.clone())),
        (None, Some(id), Some(account), Some(api_token)) => Some(Ok(TunnelTarget {
            account: account.clone(),
            tunnel: id,
            api_token: api_token.clone(),
            // The operator named this tunnel for the controller.
            verify_secret: None,
        })),
        _ => None,
    };
    let (pods, not_serving) = plane_pods(snapshot, &shared.service.namespace, &shared.service.name);
    Ok(PlaneInfo {
        address,
        identity,
        ready: true,
        token,
        pods,
        not_serving,
        service: shared.service.clone(),
        tunnel,
        kept: false,
    })
}
