//! Watch caches of every kind the controller reads, and one signal that any of them changed.
//!
//! CustomResourceDefinitions are watched by metadata only (their schemas are large and unread),
//! and only Gateway API's are kept.
//!
//! ReferenceGrant is read at `v1` where the API server serves it (Gateway API CRDs from v1.5
//! on), else at `v1beta1` (CRDs up to v1.4), whose spec is the same: which one, API discovery
//! tells at start-up ([`reference_grant_version`]); the cache holds `v1` objects either way.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{future, FutureExt, Stream, StreamExt, TryStreamExt};
use gateway_api::experimental::gatewayclasses::GatewayClass;
use gateway_api::experimental::gateways::Gateway;
use gateway_api::experimental::grpcroutes::GrpcRoute;
use gateway_api::experimental::httproutes::HttpRoute;
use gateway_api::experimental::referencegrants::{ReferenceGrant, ReferenceGrantSpec};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind, PartialObjectMeta};
use kube::error::DiscoveryError;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::gateway_config::GatewayConfig;
use crate::translate::bundle_version::{is_gateway_api_crd, CRD_ACCESS};
use crate::translate::{Snapshot, GATEWAY_API_GROUP};

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

/// The version of ReferenceGrant to watch, from API discovery (which any authenticated client
/// may read, `system:discovery`): `v1` when the API server serves it there, else `v1beta1` when
/// served there (logged at info). When it serves neither (Gateway API CRDs not installed), or
/// discovery fails, `v1` (logged): its watch retries until the kind is served.
pub async fn reference_grant_version(client: &Client) -> ReferenceGrantVersion {
    let plural = ReferenceGrant::plural(&());
    let group = match kube::discovery::group(client, GATEWAY_API_GROUP).await {
        Ok(group) => Some(group),
        Err(kube::Error::Discovery(
            DiscoveryError::MissingApiGroup(_) | DiscoveryError::EmptyApiGroup(_),
        )) => None,
        Err(e) => {
            tracing::warn!(
                error = %e,
                "API discovery of {GATEWAY_API_GROUP} failed; watching ReferenceGrant at v1, \
                 as Gateway API CRDs from v1.5 serve it"
            );
            return ReferenceGrantVersion::V1;
        }
    };
    let served = |version: ReferenceGrantVersion| {
        group.as_ref().is_some_and(|g| {
            g.versioned_resources(version.as_str())
                .iter()
                .any(|(resource, _)| resource.plural == plural)
        })
    };
    if served(ReferenceGrantVersion::V1) {
        ReferenceGrantVersion::V1
    } else if served(ReferenceGrantVersion::V1beta1) {
        tracing::info!(
            "watching ReferenceGrant at {GATEWAY_API_GROUP}/v1beta1: the installed Gateway API \
             CRDs predate v1.5 and do not serve it at v1"
        );
        ReferenceGrantVersion::V1beta1
    } else {
        tracing::error!(
            "the API server serves no ReferenceGrant ({plural}.{GATEWAY_API_GROUP} at v1 or \
             v1beta1): the Gateway API CRDs must be installed (v1.5 or v1.6 supported; from \
             v1.1 they work). The controller is not ready until ReferenceGrant is served at \
             v1; after installing CRDs older than v1.5, restart it"
        );
        ReferenceGrantVersion::V1
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

/// Read-only views of the watch caches.
#[derive(Clone)]
pub struct Stores {
    pub gateway_classes: Store<GatewayClass>,
    pub gateways: Store<Gateway>,
    pub http_routes: Store<HttpRoute>,
    pub grpc_routes: Store<GrpcRoute>,
    pub reference_grants: Store<ReferenceGrant>,
    pub namespaces: Store<Namespace>,
    pub services: Store<Service>,
    pub endpoint_slices: Store<EndpointSlice>,
    pub gateway_configs: Store<GatewayConfig>,
    pub secrets: Store<Secret>,
    /// The rendered proxy Deployments (their ready replicas gate `Programmed`).
    pub deployments: Store<Deployment>,
    /// The rendered NetworkPolicies (a deleted one is put back at once).
    pub network_policies: Store<NetworkPolicy>,
    /// The rendered autoscalers (likewise).
    pub autoscalers: Store<HorizontalPodAutoscaler>,
    /// Gateway API's CustomResourceDefinitions, metadata only (their bundle versions).
    pub gateway_api_crds: Store<PartialObjectMeta<CustomResourceDefinition>>,
}

/// A kind of rendered object whose loss the controller repairs at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PlaneObject {
    NetworkPolicy,
    Autoscaler,
}

/// The rendered NetworkPolicies and autoscalers there are now, by namespace and name.
#[derive(Debug, Default)]
pub struct PlaneObjects(std::collections::BTreeSet<(PlaneObject, String, String)>);

impl PlaneObjects {
    pub fn has(&self, kind: PlaneObject, namespace: &str, name: &str) -> bool {
        self.0
            .contains(&(kind, namespace.to_owned(), name.to_owned()))
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
    /// Starts a watch per kind, ReferenceGrant at `reference_grants`; each event, including the
    /// first list, notifies `changed`. The tasks stop when `tasks` is dropped.
    pub fn start(
        client: &Client,
        reference_grants: ReferenceGrantVersion,
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
            reference_grants: match reference_grants {
                ReferenceGrantVersion::V1 => {
                    watch(Api::all(client.clone()), all(), &changed, tasks)
                }
                ReferenceGrantVersion::V1beta1 => {
                    cache(reference_grants_v1beta1(client, all()), &changed, tasks)
                }
            },
            namespaces: watch(Api::all(client.clone()), all(), &changed, tasks),
            services: watch(Api::all(client.clone()), all(), &changed, tasks),
            endpoint_slices: watch(Api::all(client.clone()), all(), &changed, tasks),
            gateway_configs: watch(Api::all(client.clone()), all(), &changed, tasks),
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

    /// The rendered NetworkPolicies and autoscalers the caches hold now.
    pub fn plane_objects(&self) -> PlaneObjects {
        fn key<K: Resource>(kind: PlaneObject, o: &K) -> Option<(PlaneObject, String, String)> {
            Some((kind, o.meta().namespace.clone()?, o.meta().name.clone()?))
        }
        PlaneObjects(
            self.network_policies
                .state()
                .iter()
                .filter_map(|p| key(PlaneObject::NetworkPolicy, &**p))
                .chain(
                    self.autoscalers
                        .state()
                        .iter()
                        .filter_map(|a| key(PlaneObject::Autoscaler, &**a)),
                )
                .collect(),
        )
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
        let crds = tokio::time::timeout(crd_wait, self.gateway_api_crds.wait_until_ready()).await;
        if !matches!(crds, Ok(Ok(()))) {
            tracing::warn!(
                waited = ?crd_wait,
                needs = CRD_ACCESS,
                "Gateway API CRDs not listed in time; reconciling without them, GatewayClass \
                 SupportedVersion=False until they are (the controller's RBAC must grant `needs`)"
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
            namespaces: cloned(&self.namespaces),
            services: cloned(&self.services),
            endpoint_slices: cloned(&self.endpoint_slices),
            gateway_configs: cloned(&self.gateway_configs),
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
