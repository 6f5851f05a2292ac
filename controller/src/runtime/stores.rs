//! Watch caches of every kind the controller reads, and one signal that any of them changed.
//!
//! CustomResourceDefinitions are watched by metadata only (their schemas are large and unread),
//! and only Gateway API's are kept.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{future, FutureExt, StreamExt, TryStreamExt};
use gateway_api::experimental::gatewayclasses::GatewayClass;
use gateway_api::experimental::gateways::Gateway;
use gateway_api::experimental::grpcroutes::GrpcRoute;
use gateway_api::experimental::httproutes::HttpRoute;
use gateway_api::experimental::referencegrants::ReferenceGrant;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::gateway_config::GatewayConfig;
use crate::translate::bundle_version::{is_gateway_api_crd, CRD_ACCESS};
use crate::translate::Snapshot;

/// How long the Gateway API CRDs' first list may lag the other caches' before the controller
/// reconciles without it. It feeds only GatewayClass `SupportedVersion` and needs an RBAC rule
/// an older ClusterRole lacks, so it must gate nothing for long; waiting a little keeps the
/// first status written from saying False only because that list came a moment late.
pub const CRD_WAIT: Duration = Duration::from_secs(5);

/// The label every rendered object carries; only such Deployments are watched.
pub const MANAGED_BY_SELECTOR: &str = "app.kubernetes.io/managed-by=cftunnel-controller";

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
    /// Starts a watch per kind; each event, including the first list, notifies `changed`.
    /// The tasks stop when `tasks` is dropped.
    pub fn start(client: &Client, changed: Arc<Notify>, tasks: &mut JoinSet<()>) -> Self {
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
            let (store, writer) = reflector::store();
            let changed = Arc::clone(changed);
            let stream = watcher(api, config)
                .try_filter(move |event| {
                    future::ready(match event {
                        watcher::Event::Apply(o)
                        | watcher::Event::Delete(o)
                        | watcher::Event::InitApply(o) => keep(o),
                        watcher::Event::Init | watcher::Event::InitDone => true,
                    })
                })
                .default_backoff()
                .reflect(writer);
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
            reference_grants: watch(Api::all(client.clone()), all(), &changed, tasks),
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
