//! Watch caches of every kind the controller reads, and one signal that any of them changed.
//!
//! CustomResourceDefinitions are watched by metadata only (their schemas are large and unread),
//! and only Gateway API's are kept.
//!
//! ReferenceGrant is read at `v1` where the API server serves it (Gateway API CRDs from v1.5
//! on), else at `v1beta1` (CRDs up to v1.4), whose spec is the same: which one, API discovery
//! tells at start-up ([`reference_grant_version`]), and again whenever the watch keeps failing
//! because the version watched is not served (CRDs installed or upgraded since), the watch
//! then moving to the version served; the cache holds `v1` objects either way.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::{future, stream, FutureExt, Stream, StreamExt, TryStreamExt};
use gateway_api::backendtlspolicies::BackendTlsPolicy;
use gateway_api::experimental::gatewayclasses::GatewayClass;
use gateway_api::experimental::gateways::Gateway;
use gateway_api::experimental::grpcroutes::GrpcRoute;
use gateway_api::experimental::httproutes::HttpRoute;
use gateway_api::experimental::listenersets::{ListenerSet, ListenerSetSpec, ListenerSetStatus};
use gateway_api::experimental::referencegrants::{ReferenceGrant, ReferenceGrantSpec};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind, PartialObjectMeta};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::access_policy::AccessPolicy;
use crate::external_backend::ExternalBackend;
use crate::gateway_class_config::GatewayClassConfig;
use crate::gateway_config::GatewayConfig;
use crate::service_import::{ServiceImport, MULTICLUSTER_GROUP};
use crate::translate::bundle_version::{is_gateway_api_crd, CRD_ACCESS};
use crate::translate::{Snapshot, EXPERIMENTAL_GATEWAY_API_GROUP, GATEWAY_API_GROUP};

/// How long the Gateway API CRDs' first list may lag the other caches' before the controller
/// reconciles without it. It feeds only GatewayClass `SupportedVersion` and needs an RBAC rule
/// an older ClusterRole lacks, so it must gate nothing for long; waiting a little keeps the
/// first status written from saying False only because that list came a moment late.
pub const CRD_WAIT: Duration = Duration::from_secs(5);

/// The label every rendered object carries; only such Deployments are watched.
pub const MANAGED_BY_SELECTOR: &str = "app.kubernetes.io/managed-by=cftunnel-controller";

/// The version ReferenceGrant is watched at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReferenceGrantVersion {
    /// `v1`: Gateway API CRDs from v1.5 on, and the `gateway-api` crate's type.
    V1,
    /// `v1beta1`: the only version CRDs up to v1.4 serve; each object is read as `v1`.
    V1beta1,
}

impl ReferenceGrantVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V1beta1 => "v1beta1",
        }
    }
}

/// How the version ReferenceGrant is watched at is found, and found again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReferenceGrantDiscovery {
    /// The wait after discovery first fails at start-up; doubled after each failure in a row,
    /// up to `retry_max`.
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// How long the watch may fail because the version watched is not served (404) before
    /// discovery is asked again which one is; and again as long as it does.
    pub recheck_after: Duration,
}

impl Default for ReferenceGrantDiscovery {
    fn default() -> Self {
        Self {
            retry_min: Duration::from_millis(500),
            retry_max: Duration::from_secs(10),
            recheck_after: Duration::from_secs(30),
        }
    }
}

/// Once discovery's retries wait `retry_max`, each failure is logged no more often than this.
const DISCOVERY_WARN_EVERY: Duration = Duration::from_secs(60);

/// Whether `e` is the API server's 404: nothing is served there (its body is a `Status`, or
/// for an unknown group version plain text, whose code kube keeps).
fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 404)
}

/// Whether a watch failed because its resource is not served at the version watched.
fn watch_not_served(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => is_not_found(e),
        watcher::Error::WatchError(status) => status.code == 404,
        _ => false,
    }
}

/// The version the API server serves ReferenceGrant at, `v1` first, asking API discovery for
/// each version's resources (which any authenticated client may read, `system:discovery`);
/// `None` when neither version serves it (a version not served at all is 404).
///
/// # Errors
/// Any failure of discovery but a 404 (a timeout, a 5xx, a refusal): which version is served
/// is then unknown.
async fn served_reference_grant_version(
    client: &Client,
) -> Result<Option<ReferenceGrantVersion>, kube::Error> {
    let plural = ReferenceGrant::plural(&());
    for version in [ReferenceGrantVersion::V1, ReferenceGrantVersion::V1beta1] {
        let group_version = format!("{GATEWAY_API_GROUP}/{}", version.as_str());
        match client.list_api_group_resources(&group_version).await {
            Ok(list) if list.resources.iter().any(|r| r.name == plural) => {
                return Ok(Some(version))
            }
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// The version of ReferenceGrant to watch, from API discovery of `v1` and `v1beta1`: `v1` when
/// the API server serves it there, else `v1beta1` when served there (logged at info). When it
/// serves neither (Gateway API CRDs not installed), `v1` (logged): its watch retries, and
/// discovery is asked again while it fails as not served ([`Stores::start`]).
///
/// Discovery that fails otherwise is asked again, with a wait doubling from
/// `discovery.retry_min` to `discovery.retry_max` (each failure logged, at that cap once per
/// [`DISCOVERY_WARN_EVERY`]), until it answers: no version is guessed, as one the CRDs do not
/// serve would keep the controller from ever becoming ready.
pub async fn reference_grant_version(
    client: &Client,
    discovery: &ReferenceGrantDiscovery,
) -> ReferenceGrantVersion {
    let plural = ReferenceGrant::plural(&());
    let mut wait = discovery.retry_min;
    let mut failures: u32 = 0;
    let mut warned: Option<Instant> = None;
    let served = loop {
        match served_reference_grant_version(client).await {
            Ok(served) => break served,
            Err(e) => {
                failures = failures.saturating_add(1);
                if wait < discovery.retry_max
                    || warned.is_none_or(|at| at.elapsed() >= DISCOVERY_WARN_EVERY)
                {
                    tracing::warn!(
                        error = %e,
                        failures,
                        retry_in = ?wait,
                        "API discovery of the versions of {GATEWAY_API_GROUP} failed; asking \
                         again before watching ReferenceGrant"
                    );
                    warned = Some(Instant::now());
                }
                tokio::time::sleep(wait).await;
                wait = wait.saturating_mul(2).min(discovery.retry_max);
            }
        }
    };
    match served {
        Some(ReferenceGrantVersion::V1) => ReferenceGrantVersion::V1,
        Some(ReferenceGrantVersion::V1beta1) => {
            tracing::info!(
                "watching ReferenceGrant at {GATEWAY_API_GROUP}/v1beta1: the installed Gateway \
                 API CRDs predate v1.5 and do not serve it at v1"
            );
            ReferenceGrantVersion::V1beta1
        }
        None => {
            tracing::error!(
                "the API server serves no ReferenceGrant ({plural}.{GATEWAY_API_GROUP} at v1 or \
                 v1beta1): the Gateway API CRDs must be installed (v1.5 or v1.6 supported; from \
                 v1.1 they work). The controller is not ready until ReferenceGrant is served; \
                 it watches it at v1 and, while that fails, asks discovery again, so CRDs \
                 installed later are found with no restart"
            );
            ReferenceGrantVersion::V1
        }
    }
}

/// Whether the API server serves ServiceImport (`multicluster.x-k8s.io/v1alpha1`), asked of API
/// discovery once at start-up: where it does, ServiceImports are watched and backendRefs may
/// name them. A failed discovery is logged and taken as not served; installing the
/// Multi-Cluster Services API later takes a restart of the controller to be seen.
pub async fn service_imports_served(client: &Client) -> bool {
    let group_version = format!("{MULTICLUSTER_GROUP}/v1alpha1");
    let plural = ServiceImport::plural(&());
    match client.list_api_group_resources(&group_version).await {
        Ok(list) if list.resources.iter().any(|r| r.name == plural) => {
            tracing::info!(
                "watching ServiceImports ({group_version}): routes may use them as backends"
            );
            true
        }
        Ok(_) => false,
        Err(e) if is_not_found(&e) => false,
        Err(e) => {
            tracing::warn!(
                error = %e,
                "API discovery of {group_version} failed: ServiceImport backends are refused (InvalidKind) until the controller restarts"
            );
            false
        }
    }
}

/// A `v1beta1` ReferenceGrant event as the `v1` type, whose spec is the same. An object whose
/// spec cannot be read so is logged and grants nothing: skipped in a list, and removed from
/// the cache when it changes to such a spec.
fn reference_grant_v1(
    event: watcher::Event<DynamicObject>,
) -> Option<watcher::Event<ReferenceGrant>> {
    /// Its spec, read as `v1`'s; `None` (logged) when it cannot be.
    fn spec(object: &mut DynamicObject) -> Option<ReferenceGrantSpec> {
        let spec = object
            .data
            .get_mut("spec")
            .map(serde_json::Value::take)
            .unwrap_or_default();
        serde_json::from_value(spec)
            .map_err(|e| {
                tracing::warn!(
                    namespace = object.namespace().unwrap_or_default(),
                    name = object.name_any(),
                    error = %e,
                    "ReferenceGrant (v1beta1) spec unreadable; it grants nothing"
                );
            })
            .ok()
    }
    /// The cache forgets an object by its name: no spec is needed.
    fn gone(object: DynamicObject) -> watcher::Event<ReferenceGrant> {
        watcher::Event::Delete(ReferenceGrant {
            metadata: object.metadata,
            spec: ReferenceGrantSpec::default(),
        })
    }
    Some(match event {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::InitApply(mut o) => {
            let spec = spec(&mut o)?;
            watcher::Event::InitApply(ReferenceGrant {
                metadata: o.metadata,
                spec,
            })
        }
        watcher::Event::Apply(mut o) => match spec(&mut o) {
            Some(spec) => watcher::Event::Apply(ReferenceGrant {
                metadata: o.metadata,
                spec,
            }),
            None => gone(o),
        },
        watcher::Event::Delete(o) => gone(o),
    })
}

/// The watch events of ReferenceGrant at `version`, read as `v1`.
fn reference_grants_at(
    client: &Client,
    version: ReferenceGrantVersion,
) -> BoxStream<'static, Result<watcher::Event<ReferenceGrant>, watcher::Error>> {
    let config = watcher::Config::default();
    match version {
        ReferenceGrantVersion::V1 => watcher(Api::all(client.clone()), config).boxed(),
        ReferenceGrantVersion::V1beta1 => reference_grants_v1beta1(client, config).boxed(),
    }
}

/// The watch of ReferenceGrant at one version, and what it takes to move it to another.
struct ReferenceGrantWatch {
    client: Client,
    discovery: ReferenceGrantDiscovery,
    version: ReferenceGrantVersion,
    events: BoxStream<'static, Result<watcher::Event<ReferenceGrant>, watcher::Error>>,
    /// Since when the watch has failed as not served, without an event in between.
    not_served_since: Option<Instant>,
}

impl ReferenceGrantWatch {
    /// Asks discovery which version is served; if another one than the watch's, moves the
    /// watch there. Its first list then replaces what the cache holds.
    async fn recheck(&mut self) {
        // Asked again after another `recheck_after` unless this one moves the watch.
        self.not_served_since = Some(Instant::now());
        let watched = self.version.as_str();
        match served_reference_grant_version(&self.client).await {
            Ok(Some(served)) if served != self.version => {
                tracing::warn!(
                    "ReferenceGrant is not served at {GATEWAY_API_GROUP}/{watched} but at {}: \
                     the Gateway API CRDs changed; watching it there",
                    served.as_str()
                );
                self.version = served;
                self.events = reference_grants_at(&self.client, served);
                self.not_served_since = None;
            }
            Ok(_) => tracing::debug!(
                "ReferenceGrant's watch at {GATEWAY_API_GROUP}/{watched} fails as not served, \
                 and no other version serves it; asking again in {:?}",
                self.discovery.recheck_after
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "ReferenceGrant's watch at {GATEWAY_API_GROUP}/{watched} fails as not served, and \
                 API discovery of the versions serving it failed; asking again in {:?}",
                self.discovery.recheck_after
            ),
        }
    }
}

/// The watch events of ReferenceGrant, first at `version`. While the watch fails because that
/// version is not served, discovery is asked again every `discovery.recheck_after`, and the
/// watch moves to the version served, if another ([`ReferenceGrantWatch::recheck`]).
fn reference_grants(
    client: &Client,
    version: ReferenceGrantVersion,
    discovery: ReferenceGrantDiscovery,
) -> impl Stream<Item = Result<watcher::Event<ReferenceGrant>, watcher::Error>> + Send + 'static {
    let watch = ReferenceGrantWatch {
        client: client.clone(),
        discovery,
        version,
        events: reference_grants_at(client, version),
        not_served_since: None,
    };
    stream::unfold(watch, |mut watch| async move {
        if watch
            .not_served_since
            .is_some_and(|since| since.elapsed() >= watch.discovery.recheck_after)
        {
            watch.recheck().await;
        }
        let event = watch.events.next().await?;
        match &event {
            // A watch whose list fails starts over with `Init` before each retry's error: not
            // a sign the version is served.
            Ok(watcher::Event::Init) => {}
            Ok(_) => watch.not_served_since = None,
            Err(e) if watch_not_served(e) => {
                watch.not_served_since.get_or_insert_with(Instant::now);
            }
            Err(_) => {}
        }
        Some((event, watch))
    })
}

/// The watch events of ReferenceGrant at `v1beta1`, read as `v1`.
fn reference_grants_v1beta1(
    client: &Client,
    config: watcher::Config,
) -> impl Stream<Item = Result<watcher::Event<ReferenceGrant>, watcher::Error>> + Send + 'static {
    let gvk = GroupVersionKind::gvk(
        GATEWAY_API_GROUP,
        ReferenceGrantVersion::V1beta1.as_str(),
        &ReferenceGrant::kind(&()),
    );
    let resource = ApiResource::from_gvk_with_plural(&gvk, &ReferenceGrant::plural(&()));
    watcher(
        Api::<DynamicObject>::all_with(client.clone(), &resource),
        config,
    )
    .try_filter_map(|event| future::ready(Ok(reference_grant_v1(event))))
}

/// Where ListenerSets are read: `ListenerSet` at `gateway.networking.k8s.io/v1` (Gateway API
/// CRDs from v1.5 on), else the experimental `XListenerSet` at
/// `gateway.networking.x-k8s.io/v1alpha1` (experimental CRDs before v1.5), whose spec is the
/// same; `None` when neither is served. API discovery decides, once at start-up: CRDs
/// installed later are read after a restart.
pub async fn listener_set_resource(client: &Client) -> Option<ApiResource> {
    let candidates = [
        (GATEWAY_API_GROUP, "v1", "ListenerSet", "listenersets"),
        (
            EXPERIMENTAL_GATEWAY_API_GROUP,
            "v1alpha1",
            "XListenerSet",
            "xlistenersets",
        ),
    ];
    for (group, version, kind, plural) in candidates {
        match client
            .list_api_group_resources(&format!("{group}/{version}"))
            .await
        {
            Ok(list) if list.resources.iter().any(|r| r.name == plural) => {
                tracing::info!("reading ListenerSets as {kind} at {group}/{version}");
                let gvk = GroupVersionKind::gvk(group, version, kind);
                return Some(ApiResource::from_gvk_with_plural(&gvk, plural));
            }
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => {
                // A ListenerSet CRD may well be installed: watch the standard one, whose
                // watch retries, rather than ignoring every ListenerSet.
                tracing::warn!(
                    error = %e,
                    "API discovery of {group}/{version} failed; reading ListenerSets at \
                     {GATEWAY_API_GROUP}/v1"
                );
                let gvk = GroupVersionKind::gvk(GATEWAY_API_GROUP, "v1", "ListenerSet");
                return Some(ApiResource::from_gvk_with_plural(&gvk, "listenersets"));
            }
        }
    }
    tracing::info!(
        "no ListenerSet is served (neither listenersets.{GATEWAY_API_GROUP}/v1 nor \
         xlistenersets.{EXPERIMENTAL_GATEWAY_API_GROUP}/v1alpha1): Gateways take no \
         ListenerSet until the CRD is installed and the controller restarted"
    );
    None
}

/// A ListenerSet event of either kind (see [`listener_set_resource`]) as the `v1` type. An
/// object that cannot be read so is logged and left out.
fn listener_set_v1(event: watcher::Event<DynamicObject>) -> Option<watcher::Event<ListenerSet>> {
    fn read(mut object: DynamicObject) -> Option<ListenerSet> {
        let mut take = |field: &str| {
            object
                .data
                .get_mut(field)
                .map(serde_json::Value::take)
                .unwrap_or_default()
        };
        let (spec, status) = (take("spec"), take("status"));
        let spec: Result<ListenerSetSpec, _> = serde_json::from_value(spec);
        match spec {
            Ok(spec) => Some(ListenerSet {
                metadata: object.metadata,
                spec,
                status: serde_json::from_value::<Option<ListenerSetStatus>>(status)
                    .ok()
                    .flatten(),
            }),
            Err(e) => {
                tracing::warn!(
                    namespace = object.metadata.namespace.as_deref().unwrap_or_default(),
                    name = object.metadata.name.as_deref().unwrap_or_default(),
                    error = %e,
                    "ListenerSet spec unreadable; it attaches no listener"
                );
                None
            }
        }
    }
    fn gone(object: DynamicObject) -> watcher::Event<ListenerSet> {
        watcher::Event::Delete(ListenerSet {
            metadata: object.metadata,
            spec: ListenerSetSpec::default(),
            status: None,
        })
    }
    Some(match event {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(read(o)?),
        watcher::Event::Apply(o) => {
            let meta = o.metadata.clone();
            match read(o) {
                Some(set) => watcher::Event::Apply(set),
                None => gone(DynamicObject {
                    types: None,
                    metadata: meta,
                    data: serde_json::Value::Null,
                }),
            }
        }
        watcher::Event::Delete(o) => gone(o),
    })
}

/// The watch events of ListenerSets at `resource`, read as the `v1` type; with none, a cache
/// that lists nothing.
fn listener_sets(
    client: &Client,
    resource: Option<&ApiResource>,
) -> BoxStream<'static, Result<watcher::Event<ListenerSet>, watcher::Error>> {
    match resource {
        Some(resource) => watcher(
            Api::<DynamicObject>::all_with(client.clone(), resource),
            watcher::Config::default(),
        )
        .try_filter_map(|event| future::ready(Ok(listener_set_v1(event))))
        .boxed(),
        None => stream::iter([Ok(watcher::Event::Init), Ok(watcher::Event::InitDone)])
            .chain(stream::pending())
            .boxed(),
    }
}

/// Read-only views of the watch caches.
#[derive(Clone)]
pub struct Stores {
    pub gateway_classes: Store<GatewayClass>,
    pub gateways: Store<Gateway>,
    pub http_routes: Store<HttpRoute>,
    pub grpc_routes: Store<GrpcRoute>,
    pub reference_grants: Store<ReferenceGrant>,
    /// ListenerSets, of whichever kind is served ([`listener_set_resource`]).
    pub listener_sets: Store<ListenerSet>,
    /// Served from Gateway API v1.4 on: like the CRDs, its first list gates rounds for at most
    /// [`CRD_WAIT`], so a cluster whose CRDs predate it (or an RBAC rule missing for it) does
    /// not keep the controller from serving.
    pub backend_tls_policies: Store<BackendTlsPolicy>,
    /// For the CA certificates BackendTLSPolicies name.
    pub config_maps: Store<ConfigMap>,
    pub namespaces: Store<Namespace>,
    pub services: Store<Service>,
    pub endpoint_slices: Store<EndpointSlice>,
    pub gateway_configs: Store<GatewayConfig>,
    /// Gates readiness for `crd_wait` at most, as a cluster upgraded without its CRD has none.
    pub gateway_class_configs: Store<GatewayClassConfig>,
    /// `None` where the API server does not serve ServiceImport ([`service_imports_served`]).
    pub service_imports: Option<Store<ServiceImport>>,
    /// The AccessPolicies route rules name; gates readiness for `crd_wait` at most, as a
    /// cluster upgraded without its CRD has none to list.
    pub access_policies: Store<AccessPolicy>,
    /// The ExternalBackends routes name; gates readiness for `crd_wait` at most, as
    /// AccessPolicies do.
    pub external_backends: Store<ExternalBackend>,
    pub secrets: Store<Secret>,
    /// The rendered proxy Deployments (their ready replicas gate `Programmed`; one deleted or
    /// edited away from its render is put back at once).
    pub deployments: Store<Deployment>,
    /// The rendered NetworkPolicies (likewise put back).
    pub network_policies: Store<NetworkPolicy>,
    /// The rendered autoscalers (likewise put back).
    pub autoscalers: Store<HorizontalPodAutoscaler>,
    /// Gateway API's CustomResourceDefinitions, metadata only (their bundle versions).
    pub gateway_api_crds: Store<PartialObjectMeta<CustomResourceDefinition>>,
}

/// A kind of rendered object that only a label-selected watch caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PlaneObject {
    NetworkPolicy,
    Autoscaler,
}

/// The rendered NetworkPolicies and autoscalers there are now, by namespace and name.
#[derive(Debug, Default)]
pub struct PlaneObjects {
    network_policies: BTreeMap<(String, String), Arc<NetworkPolicy>>,
    autoscalers: BTreeMap<(String, String), Arc<HorizontalPodAutoscaler>>,
}

impl PlaneObjects {
    pub fn has(&self, kind: PlaneObject, namespace: &str, name: &str) -> bool {
        let key = (namespace.to_owned(), name.to_owned());
        match kind {
            PlaneObject::NetworkPolicy => self.network_policies.contains_key(&key),
            PlaneObject::Autoscaler => self.autoscalers.contains_key(&key),
        }
    }

    pub fn network_policy(&self, namespace: &str, name: &str) -> Option<&NetworkPolicy> {
        self.network_policies
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(|p| &**p)
    }

    pub fn autoscaler(&self, namespace: &str, name: &str) -> Option<&HorizontalPodAutoscaler> {
        self.autoscalers
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(|a| &**a)
    }
}

fn cloned<K>(store: &Store<K>) -> Vec<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store
        .state()
        .iter()
        .map(|o| Arc::unwrap_or_clone(Arc::clone(o)))
        .collect()
}

impl Stores {
    /// Starts a watch per kind, ReferenceGrant at `reference_grants` first, moved as
    /// `discovery` says ([`reference_grants`]); each event, including the first list, notifies
    /// `changed`. The tasks stop when `tasks` is dropped.
    pub fn start(
        client: &Client,
        reference_grants: ReferenceGrantVersion,
        discovery: ReferenceGrantDiscovery,
        listener_set_resource: Option<&ApiResource>,
        service_imports: bool,
        changed: Arc<Notify>,
        tasks: &mut JoinSet<()>,
    ) -> Self {
        fn watch<K>(
            api: Api<K>,
            config: watcher::Config,
            changed: &Arc<Notify>,
            tasks: &mut JoinSet<()>,
        ) -> Store<K>
        where
            K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
            K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
        {
            watch_kept(api, config, |_| true, changed, tasks)
        }
        /// [`watch`], caching (and signalling) only the objects `keep` picks. `keep` must
        /// depend on nothing an object's updates can change, such as its name.
        fn watch_kept<K>(
            api: Api<K>,
            config: watcher::Config,
            keep: fn(&K) -> bool,
            changed: &Arc<Notify>,
            tasks: &mut JoinSet<()>,
        ) -> Store<K>
        where
            K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
            K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
        {
            let events = watcher(api, config).try_filter(move |event| {
                future::ready(match event {
                    watcher::Event::Apply(o)
                    | watcher::Event::Delete(o)
                    | watcher::Event::InitApply(o) => keep(o),
                    watcher::Event::Init | watcher::Event::InitDone => true,
                })
            });
            cache(events, changed, tasks)
        }
        /// Caches `events` (retrying a failed watch with backoff).
        fn cache<K>(
            events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
            changed: &Arc<Notify>,
            tasks: &mut JoinSet<()>,
        ) -> Store<K>
        where
            K: Resource + Clone + Debug + Send + Sync + 'static,
            K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
        {
            let (store, writer) = reflector::store();
            let changed = Arc::clone(changed);
            let stream = events.default_backoff().reflect(writer);
            tasks.spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(event) = stream.next().await {
                    match event {
                        // A failed watch changes nothing in the cache: no round for it.
                        Err(e) => {
                            tracing::warn!(kind = %K::kind(&K::DynamicType::default()), error = %e, "watch failed; retrying");
                        }
                        Ok(_) => changed.notify_one(),
                    }
                }
            });
            store
        }
        let all = watcher::Config::default;
        Self {
            gateway_classes: watch(Api::all(client.clone()), all(), &changed, tasks),
            gateways: watch(Api::all(client.clone()), all(), &changed, tasks),
            http_routes: watch(Api::all(client.clone()), all(), &changed, tasks),
            grpc_routes: watch(Api::all(client.clone()), all(), &changed, tasks),
            reference_grants: cache(
                self::reference_grants(client, reference_grants, discovery),
                &changed,
                tasks,
            ),
            listener_sets: cache(
                self::listener_sets(client, listener_set_resource),
                &changed,
                tasks,
            ),
            backend_tls_policies: watch(Api::all(client.clone()), all(), &changed, tasks),
            config_maps: watch(Api::all(client.clone()), all(), &changed, tasks),
            namespaces: watch(Api::all(client.clone()), all(), &changed, tasks),
            services: watch(Api::all(client.clone()), all(), &changed, tasks),
            endpoint_slices: watch(Api::all(client.clone()), all(), &changed, tasks),
            gateway_configs: watch(Api::all(client.clone()), all(), &changed, tasks),
            gateway_class_configs: watch(Api::all(client.clone()), all(), &changed, tasks),
            service_imports: service_imports
                .then(|| watch(Api::all(client.clone()), all(), &changed, tasks)),
            access_policies: watch(Api::all(client.clone()), all(), &changed, tasks),
            external_backends: watch(Api::all(client.clone()), all(), &changed, tasks),
            secrets: watch(Api::all(client.clone()), all(), &changed, tasks),
            deployments: watch(
                Api::all(client.clone()),
                all().labels(MANAGED_BY_SELECTOR),
                &changed,
                tasks,
            ),
            network_policies: watch(
                Api::all(client.clone()),
                all().labels(MANAGED_BY_SELECTOR),
                &changed,
                tasks,
            ),
            autoscalers: watch(
                Api::all(client.clone()),
                all().labels(MANAGED_BY_SELECTOR),
                &changed,
                tasks,
            ),
            // No selector can pick a CRD's group on the server (CRDs take field selectors on
            // their name only, and Gateway API's carry no common label): filtered here.
            gateway_api_crds: watch_kept(
                Api::all(client.clone()),
                all(),
                |crd| crd.metadata.name.as_deref().is_some_and(is_gateway_api_crd),
                &changed,
                tasks,
            ),
        }
    }

    /// How many objects each cache holds, by kind (for `/metrics`).
    pub fn counts(&self) -> [(&'static str, usize); 15] {
        [
            ("GatewayClass", self.gateway_classes.state().len()),
            ("Gateway", self.gateways.state().len()),
            ("HTTPRoute", self.http_routes.state().len()),
            ("GRPCRoute", self.grpc_routes.state().len()),
            ("ReferenceGrant", self.reference_grants.state().len()),
            ("ListenerSet", self.listener_sets.state().len()),
            ("Namespace", self.namespaces.state().len()),
            ("Service", self.services.state().len()),
            ("EndpointSlice", self.endpoint_slices.state().len()),
            ("GatewayConfig", self.gateway_configs.state().len()),
            ("Secret", self.secrets.state().len()),
            ("Deployment", self.deployments.state().len()),
            ("NetworkPolicy", self.network_policies.state().len()),
            ("HorizontalPodAutoscaler", self.autoscalers.state().len()),
            (
                "CustomResourceDefinition",
                self.gateway_api_crds.state().len(),
            ),
        ]
    }

    /// The rendered NetworkPolicies and autoscalers the caches hold now.
    pub fn plane_objects(&self) -> PlaneObjects {
        fn by_key<K: Resource>(objects: Vec<Arc<K>>) -> BTreeMap<(String, String), Arc<K>> {
            objects
                .into_iter()
                .filter_map(|o| {
                    let key = (o.meta().namespace.clone()?, o.meta().name.clone()?);
                    Some((key, o))
                })
                .collect()
        }
        PlaneObjects {
            network_policies: by_key(self.network_policies.state()),
            autoscalers: by_key(self.autoscalers.state()),
        }
    }

    /// Waits for the first full list of every cache but the CRDs', then at most `crd_wait` for
    /// the CRDs'; whether those other caches are filled (false: a watch task stopped first).
    ///
    /// The CRDs gate nothing past `crd_wait` (see [`CRD_WAIT`]): rounds run without them,
    /// their snapshot says they cannot be read, and their first list, whenever it comes,
    /// starts a round like any change. Not having them by then is logged once, with the RBAC
    /// rule their watch needs (each failed retry of the watch is logged too, as for any watch).
    pub async fn wait_until_ready(&self, crd_wait: Duration) -> bool {
        let results = [
            self.gateway_classes.wait_until_ready().await,
            self.gateways.wait_until_ready().await,
            self.http_routes.wait_until_ready().await,
            self.grpc_routes.wait_until_ready().await,
            self.reference_grants.wait_until_ready().await,
            self.listener_sets.wait_until_ready().await,
            self.config_maps.wait_until_ready().await,
            self.namespaces.wait_until_ready().await,
            self.services.wait_until_ready().await,
            self.endpoint_slices.wait_until_ready().await,
            self.gateway_configs.wait_until_ready().await,
            self.secrets.wait_until_ready().await,
            self.deployments.wait_until_ready().await,
            self.network_policies.wait_until_ready().await,
            self.autoscalers.wait_until_ready().await,
        ];
        if !results.iter().all(Result::is_ok) {
            return false;
        }
        let policies =
            tokio::time::timeout(crd_wait, self.backend_tls_policies.wait_until_ready()).await;
        if !matches!(policies, Ok(Ok(()))) {
            tracing::warn!(
                waited = ?crd_wait,
                "BackendTLSPolicies not listed in time (the CRD is served from Gateway API v1.4 \
                 on, and the controller's RBAC must let it list and watch them); reconciling \
                 without them until they are: backends they cover are dialled as their Service \
                 ports say"
            );
        }
        let crds = tokio::time::timeout(crd_wait, self.gateway_api_crds.wait_until_ready()).await;
        if !matches!(crds, Ok(Ok(()))) {
            tracing::warn!(
                waited = ?crd_wait,
                needs = CRD_ACCESS,
                "Gateway API CRDs not listed in time; reconciling without them, GatewayClass \
                 SupportedVersion=False until they are (the controller's RBAC must grant `needs`)"
            );
        }
        let backends =
            tokio::time::timeout(crd_wait, self.external_backends.wait_until_ready()).await;
        if !matches!(backends, Ok(Ok(()))) {
            tracing::warn!(
                waited = ?crd_wait,
                "ExternalBackends not listed in time (is the externalbackends.cf.k8s.lex.la CRD \
                 installed, and may the controller list and watch them?); reconciling without \
                 them: backendRefs naming one resolve to nothing (500) until they are listed"
            );
        }
        let configs =
            tokio::time::timeout(crd_wait, self.gateway_class_configs.wait_until_ready()).await;
        if !matches!(configs, Ok(Ok(()))) {
            tracing::warn!(
                waited = ?crd_wait,
                "GatewayClassConfigs not listed in time (is the gatewayclassconfigs.cf.k8s.lex.la \
                 CRD installed, and may the controller list and watch them?); reconciling \
                 without them: a GatewayClass naming one is not accepted until they are"
            );
        }
        let policies =
            tokio::time::timeout(crd_wait, self.access_policies.wait_until_ready()).await;
        if !matches!(policies, Ok(Ok(()))) {
            tracing::warn!(
                waited = ?crd_wait,
                "AccessPolicies not listed in time (is the accesspolicies.cf.k8s.lex.la CRD \
                 installed, and may the controller list and watch them?); reconciling without \
                 them: rules naming one answer 500 until they are listed"
            );
        }
        true
    }

    /// The translation's input, as the caches hold it now. The CRDs are `None` until their
    /// cache has had its first full list (their watch may lack RBAC: it gates nothing).
    pub fn snapshot(&self) -> Snapshot {
        let crds_listed = self
            .gateway_api_crds
            .wait_until_ready()
            .now_or_never()
            .is_some_and(|ready| ready.is_ok());
        Snapshot {
            gateway_classes: cloned(&self.gateway_classes),
            gateways: cloned(&self.gateways),
            http_routes: cloned(&self.http_routes),
            grpc_routes: cloned(&self.grpc_routes),
            reference_grants: cloned(&self.reference_grants),
            listener_sets: cloned(&self.listener_sets),
            backend_tls_policies: cloned(&self.backend_tls_policies),
            config_maps: cloned(&self.config_maps),
            namespaces: cloned(&self.namespaces),
            services: cloned(&self.services),
            endpoint_slices: cloned(&self.endpoint_slices),
            gateway_configs: cloned(&self.gateway_configs),
            gateway_class_configs: cloned(&self.gateway_class_configs),
            service_imports: self.service_imports.as_ref().map(cloned),
            access_policies: cloned(&self.access_policies),
            external_backends: cloned(&self.external_backends),
            secrets: cloned(&self.secrets),
            custom_resource_definitions: crds_listed.then(|| {
                self.gateway_api_crds
                    .state()
                    .iter()
                    .map(|crd| crd.metadata.clone())
                    .collect()
            }),
        }
    }
}
