//! The APIs the controller reads only where the API server serves them, at whichever of their
//! versions or kinds it serves: ReferenceGrant (`v1`, else `v1beta1` on Gateway API CRDs up to
//! v1.4), ListenerSet (`ListenerSet` at `gateway.networking.k8s.io/v1`, else the experimental
//! `XListenerSet`) and ServiceImport (the Multi-Cluster Services API).
//!
//! One mechanism serves all three ([`watch`]): API discovery tells which candidate is served,
//! and the watch caching the API's objects follows it. Discovery is asked at start-up (again
//! until it answers: no candidate is guessed), and again whenever
//! - one of the API's CRDs is created, changed (its served versions) or deleted: the
//!   controller's watch of CustomResourceDefinitions ([`CrdTriggers`]) says so, or
//! - the watch keeps failing because what it watches is not served ([`ApiDiscovery::recheck_after`]),
//!   which covers a controller whose RBAC cannot watch CRDs, or
//! - nothing is watched but one of the API's CRDs exists (discovery can lag a CRD's
//!   `Established`): every `recheck_after` while that lasts.
//!
//! The watch then moves to the candidate served, whose first list replaces what the cache
//! holds; when none is served (discovery said so twice, `recheck_after` apart: a single 404 can
//! be a passing fault of discovery) the cache is emptied (routes naming a ServiceImport are refused
//! `InvalidKind`, Gateways take no ListenerSet), except for a [`OptionalApi::required`] API
//! (ReferenceGrant), whose watch stays on its first candidate and keeps the controller from
//! becoming ready until it is served. Which resource the cache holds is published once its
//! first list is done ([`Served`]): ListenerSet statuses are written there.

use std::sync::Arc;
use std::time::Duration;

use cftunnel_controller_core::snapshot::UnreadableObject;
use futures_util::stream::BoxStream;
use futures_util::{future, stream, Stream, StreamExt, TryStreamExt};
use gateway_api::experimental::listenersets::{ListenerSet, ListenerSetSpec, ListenerSetStatus};
use gateway_api::experimental::referencegrants::{ReferenceGrant, ReferenceGrantSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind, PartialObjectMeta};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{watch as signal, Notify};
use tokio::time::Instant;

use crate::service_import::{ServiceImport, MULTICLUSTER_GROUP};
use crate::translate::{EXPERIMENTAL_GATEWAY_API_GROUP, GATEWAY_API_GROUP};

/// How discovery of the optional APIs is asked, and asked again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiDiscovery {
    /// The wait after discovery first fails at start-up; doubled after each failure in a row,
    /// up to `retry_max`.
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// How long a watch may fail because what it watches is not served (404) before discovery
    /// is asked again, and again as long as it does; also the wait before asking again after
    /// discovery failed once the controller runs.
    pub recheck_after: Duration,
}

impl Default for ApiDiscovery {
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

/// One way an API may be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
}

impl Candidate {
    fn resource(&self) -> ApiResource {
        let gvk = GroupVersionKind::gvk(self.group, self.version, self.kind);
        ApiResource::from_gvk_with_plural(&gvk, self.plural)
    }

    /// The name of the CRD that serves it: `PLURAL.GROUP`.
    pub fn crd_name(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }
}

/// An API read where served, as the type `K` whatever candidate serves it.
pub struct OptionalApi<K> {
    /// What logs call it.
    pub name: &'static str,
    /// Where it may be served, the preferred first.
    pub candidates: &'static [Candidate],
    /// When none is served: watch the first candidate anyway, whose failing watch keeps the
    /// cache from filling and so the controller from becoming ready (`true`), or cache
    /// nothing (`false`).
    pub required: bool,
    /// What it takes to make it served, for the log.
    pub install_hint: &'static str,
    /// An event of any candidate as `K`; `None` for an object that cannot be read so (logged).
    pub read: fn(watcher::Event<DynamicObject>) -> Option<watcher::Event<K>>,
}

/// ReferenceGrant: `v1` (Gateway API CRDs from v1.5 on), else `v1beta1` (up to v1.4), whose
/// spec is the same. Required: Gateway API is not usable without it.
pub static REFERENCE_GRANTS: OptionalApi<ReferenceGrant> = OptionalApi {
    name: "ReferenceGrant",
    candidates: &[
        Candidate {
            group: GATEWAY_API_GROUP,
            version: "v1",
            kind: "ReferenceGrant",
            plural: "referencegrants",
        },
        Candidate {
            group: GATEWAY_API_GROUP,
            version: "v1beta1",
            kind: "ReferenceGrant",
            plural: "referencegrants",
        },
    ],
    required: true,
    install_hint: "the Gateway API CRDs must be installed (v1.5 or v1.6 supported; from v1.1 \
                   they work); the controller is not ready until ReferenceGrant is served",
    read: reference_grant_v1,
};

/// ListenerSet: `ListenerSet` at `gateway.networking.k8s.io/v1` (Gateway API CRDs from v1.5
/// on), else the experimental `XListenerSet` at `gateway.networking.x-k8s.io/v1alpha1`, whose
/// spec is the same.
pub static LISTENER_SETS: OptionalApi<ListenerSet> = OptionalApi {
    name: "ListenerSet",
    candidates: &[
        Candidate {
            group: GATEWAY_API_GROUP,
            version: "v1",
            kind: "ListenerSet",
            plural: "listenersets",
        },
        Candidate {
            group: EXPERIMENTAL_GATEWAY_API_GROUP,
            version: "v1alpha1",
            kind: "XListenerSet",
            plural: "xlistenersets",
        },
    ],
    required: false,
    install_hint: "Gateways take no ListenerSet until its CRD is installed",
    read: listener_set_v1,
};

/// ServiceImport (`multicluster.x-k8s.io/v1alpha1`): where served, routes may use it as a
/// backend.
pub static SERVICE_IMPORTS: OptionalApi<ServiceImport> = OptionalApi {
    name: "ServiceImport",
    candidates: &[Candidate {
        group: MULTICLUSTER_GROUP,
        version: "v1alpha1",
        kind: "ServiceImport",
        plural: "serviceimports",
    }],
    required: false,
    install_hint: "backendRefs naming one are refused (InvalidKind) until the Multi-Cluster \
                   Services API is installed",
    read: readable_unnoted::<ServiceImport>,
};

/// The resource an optional API's cache holds the objects of now: `None` while none is served.
pub type Served = signal::Receiver<Option<ApiResource>>;

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

/// The first of `candidates` the API server serves, asking API discovery for each group
/// version's resources (which any authenticated client may read, `system:discovery`); `None`
/// when none is (a group version not served at all is 404).
///
/// # Errors
/// Any failure of discovery but a 404 (a timeout, a 5xx, a refusal): what is served is then
/// unknown.
async fn served_candidate(
    client: &Client,
    candidates: &[Candidate],
) -> Result<Option<usize>, kube::Error> {
    for (i, c) in candidates.iter().enumerate() {
        match client
            .list_api_group_resources(&format!("{}/{}", c.group, c.version))
            .await
        {
            Ok(list) if list.resources.iter().any(|r| r.name == c.plural) => return Ok(Some(i)),
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// The CRD watch's side of the optional APIs: which CRD names concern which API.
#[derive(Default, Clone)]
pub struct CrdTriggers {
    apis: Vec<CrdTrigger>,
}

/// One API's CRD names, its signal, and which of those CRDs exist now.
#[derive(Clone)]
struct CrdTrigger {
    names: Vec<String>,
    changed: Arc<Notify>,
    present: Arc<CrdsPresent>,
}

/// Which of an API's CRDs the CRD watch holds now.
#[derive(Debug, Default)]
struct CrdsPresent(std::sync::Mutex<std::collections::BTreeSet<String>>);

impl CrdsPresent {
    fn update(&self, f: impl FnOnce(&mut std::collections::BTreeSet<String>)) {
        if let Ok(mut names) = self.0.lock() {
            f(&mut names);
        }
    }

    fn any(&self) -> bool {
        self.0.lock().is_ok_and(|names| !names.is_empty())
    }
}

impl CrdTriggers {
    /// The signal of an API whose CRDs are `candidates'`, and which of them exist.
    fn add(&mut self, candidates: &[Candidate]) -> (Arc<Notify>, Arc<CrdsPresent>) {
        let changed = Arc::new(Notify::new());
        let present = Arc::new(CrdsPresent::default());
        let mut names: Vec<String> = candidates.iter().map(Candidate::crd_name).collect();
        names.dedup();
        self.apis.push(CrdTrigger {
            names,
            changed: Arc::clone(&changed),
            present: Arc::clone(&present),
        });
        (changed, present)
    }

    /// Tells each API one of whose CRDs an event of the CRD watch concerns; after each full
    /// list every API, as a CRD deleted while the watch was down shows in no event.
    pub fn crd_event(&self, event: &watcher::Event<PartialObjectMeta<CustomResourceDefinition>>) {
        fn concerned<'a>(
            apis: &'a [CrdTrigger],
            name: &'a str,
        ) -> impl Iterator<Item = &'a CrdTrigger> + 'a {
            apis.iter()
                .filter(move |a| a.names.iter().any(|n| n == name))
        }
        match event {
            watcher::Event::Apply(crd) => {
                let name = crd.name_any();
                for api in concerned(&self.apis, &name) {
                    api.present.update(|names| {
                        names.insert(name.clone());
                    });
                    api.changed.notify_one();
                }
            }
            watcher::Event::Delete(crd) => {
                let name = crd.name_any();
                for api in concerned(&self.apis, &name) {
                    api.present.update(|names| {
                        names.remove(&name);
                    });
                    api.changed.notify_one();
                }
            }
            // A new list: what exists is what it lists.
            watcher::Event::Init => {
                for api in &self.apis {
                    api.present.update(std::collections::BTreeSet::clear);
                }
            }
            watcher::Event::InitApply(crd) => {
                let name = crd.name_any();
                for api in concerned(&self.apis, &name) {
                    api.present.update(|names| {
                        names.insert(name.clone());
                    });
                }
            }
            watcher::Event::InitDone => {
                for api in &self.apis {
                    api.changed.notify_one();
                }
            }
        }
    }
}

/// The watch events of `api`, at whichever candidate is served (see the module docs), and the
/// resource whose objects they are once listed. `triggers` learns the API's CRD names.
pub fn watch<K>(
    client: &Client,
    api: &'static OptionalApi<K>,
    discovery: ApiDiscovery,
    triggers: &mut CrdTriggers,
) -> (
    impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    Served,
)
where
    K: Send + 'static,
{
    let (served, receiver) = signal::channel(None);
    let (crd_changed, crds_present) = triggers.add(api.candidates);
    let watch = OptionalWatch {
        client: client.clone(),
        api,
        discovery,
        crd_changed,
        crds_present,
        discovered_at: Instant::now(),
        unserved_since: None,
        watched: None,
        events: stream::pending().boxed(),
        not_served_since: None,
        retry_at: None,
        served,
        publish: None,
    };
    let events = stream::unfold(watch, |mut watch| async move {
        let event = watch.next().await?;
        Some((event, watch))
    });
    (events, receiver)
}

/// What moves one optional API's watch: see [`watch`].
struct OptionalWatch<K: 'static> {
    client: Client,
    api: &'static OptionalApi<K>,
    discovery: ApiDiscovery,
    /// Notified when one of its CRDs changed.
    crd_changed: Arc<Notify>,
    /// Which of its CRDs exist: while one does and discovery says nothing is served (its
    /// discovery may lag the CRD's `Established`), discovery is asked again every
    /// `recheck_after`.
    crds_present: Arc<CrdsPresent>,
    /// When discovery last answered.
    discovered_at: Instant,
    /// Since when discovery has said nothing is served while a served candidate is watched:
    /// one answer does not empty the cache (a 404 can be a passing fault of discovery), only
    /// the same answer again `recheck_after` later.
    unserved_since: Option<Instant>,
    /// The candidate watched (`Some(None)`: none is served); `None` before the first discovery.
    watched: Option<Option<usize>>,
    events: BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>,
    /// Since when the watch has failed as not served, without an event in between.
    not_served_since: Option<Instant>,
    /// When to ask discovery again after it failed.
    retry_at: Option<Instant>,
    served: signal::Sender<Option<ApiResource>>,
    /// What to publish as served once the watch's first list is done.
    publish: Option<Option<ApiResource>>,
}

/// What woke an [`OptionalWatch`].
enum Wake<E> {
    CrdChanged,
    Recheck,
    Event(Option<E>),
}

impl<K: Send + 'static> OptionalWatch<K> {
    async fn next(&mut self) -> Option<Result<watcher::Event<K>, watcher::Error>> {
        if self.watched.is_none() {
            let served = discover_until_answered(&self.client, self.api, self.discovery).await;
            self.discovered_at = Instant::now();
            self.switch(served);
        }
        loop {
            let recheck_after = self.discovery.recheck_after;
            // Nothing is watched, but a CRD of the API exists: look again.
            let crd_unserved = self.watched == Some(None) && self.crds_present.any();
            let recheck_at = [
                self.not_served_since.map(|since| since + recheck_after),
                self.unserved_since.map(|since| since + recheck_after),
                crd_unserved.then(|| self.discovered_at + recheck_after),
                self.retry_at,
            ]
            .into_iter()
            .flatten()
            .min();
            let wake = tokio::select! {
                () = self.crd_changed.notified() => Wake::CrdChanged,
                () = async {
                    match recheck_at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => future::pending().await,
                    }
                } => Wake::Recheck,
                event = self.events.next() => Wake::Event(event),
            };
            match wake {
                Wake::CrdChanged | Wake::Recheck => self.rediscover().await,
                Wake::Event(event) => {
                    let event = event?;
                    self.observe(&event);
                    return Some(event);
                }
            }
        }
    }

    /// Asks discovery again; moves the watch if another candidate is served now, or none
    /// (when discovery says so twice, `recheck_after` apart).
    async fn rediscover(&mut self) {
        let answer = served_candidate(&self.client, self.api.candidates).await;
        self.discovered_at = Instant::now();
        match answer {
            Ok(None) if matches!(self.watched, Some(Some(_))) => {
                self.retry_at = None;
                match self.unserved_since {
                    Some(since) if since.elapsed() >= self.discovery.recheck_after => {
                        self.switch(None);
                    }
                    Some(_) => {}
                    None => {
                        tracing::info!(
                            "API discovery finds no {} served, while one is watched; asking \
                             again in {:?} before the watch stops",
                            self.api.name,
                            self.discovery.recheck_after
                        );
                        self.unserved_since = Some(Instant::now());
                    }
                }
            }
            Ok(served) => {
                self.retry_at = None;
                self.unserved_since = None;
                if self.watched != Some(served) {
                    self.switch(served);
                } else if self.not_served_since.is_some() {
                    // Asked again after another `recheck_after` while the watch keeps failing.
                    self.not_served_since = Some(Instant::now());
                    tracing::debug!(
                        "the watch of {} fails as not served, and discovery finds nothing else \
                         served; asking again in {:?}",
                        self.api.name,
                        self.discovery.recheck_after
                    );
                }
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "API discovery for {} failed; asking again in {:?}",
                    self.api.name,
                    self.discovery.recheck_after
                );
                self.retry_at = Some(Instant::now() + self.discovery.recheck_after);
            }
        }
    }

    /// Watches `served` (an index of the candidates), or nothing when `None`.
    fn switch(&mut self, served: Option<usize>) {
        let api = self.api;
        let first = self.watched.is_none();
        self.watched = Some(served);
        self.not_served_since = None;
        self.unserved_since = None;
        let watched = served.or(api.required.then_some(0));
        match (served, watched.and_then(|i| api.candidates.get(i))) {
            (Some(_), Some(c)) => tracing::info!(
                "watching {} as {} at {}/{}",
                api.name,
                c.kind,
                c.group,
                c.version
            ),
            (None, _) if first && !api.required => tracing::info!(
                "no {} is served ({}): {}; watched for with no restart",
                api.name,
                crd_names(api),
                api.install_hint
            ),
            (None, _) => tracing::warn!(
                "no {} is served any more ({}): {}; watched for with no restart",
                api.name,
                crd_names(api),
                api.install_hint
            ),
            (Some(_), None) => {}
        }
        match watched.and_then(|i| api.candidates.get(i)) {
            Some(c) => {
                let resource = c.resource();
                self.events = watcher(
                    Api::<DynamicObject>::all_with(self.client.clone(), &resource),
                    watcher::Config::default(),
                )
                .try_filter_map(move |event| future::ready(Ok((api.read)(event))))
                .boxed();
                self.publish = Some(served.map(|_| resource));
            }
            None => {
                // A list of nothing: the cache forgets what it held.
                self.events =
                    stream::iter([Ok(watcher::Event::Init), Ok(watcher::Event::InitDone)])
                        .chain(stream::pending())
                        .boxed();
                self.publish = Some(None);
            }
        }
    }

    /// Notes what an event of the watch says about what is served.
    fn observe(&mut self, event: &Result<watcher::Event<K>, watcher::Error>) {
        match event {
            // A watch whose list fails starts over with `Init` before each retry's error: not
            // a sign anything is served.
            Ok(watcher::Event::Init) => {}
            Ok(watcher::Event::InitDone) => {
                self.not_served_since = None;
                if let Some(resource) = self.publish.take() {
                    self.served.send_replace(resource);
                }
            }
            Ok(_) => self.not_served_since = None,
            Err(e) if watch_not_served(e) => {
                self.not_served_since.get_or_insert_with(Instant::now);
            }
            Err(_) => {}
        }
    }
}

/// Discovery at start-up, asked again with a wait doubling from `retry_min` to `retry_max`
/// (each failure logged, at that cap once per [`DISCOVERY_WARN_EVERY`]) until it answers.
async fn discover_until_answered<K>(
    client: &Client,
    api: &OptionalApi<K>,
    discovery: ApiDiscovery,
) -> Option<usize> {
    let mut wait = discovery.retry_min;
    let mut failures: u32 = 0;
    let mut warned: Option<Instant> = None;
    loop {
        match served_candidate(client, api.candidates).await {
            Ok(served) => return served,
            Err(e) => {
                failures = failures.saturating_add(1);
                if wait < discovery.retry_max
                    || warned.is_none_or(|at| at.elapsed() >= DISCOVERY_WARN_EVERY)
                {
                    tracing::warn!(
                        error = %e,
                        failures,
                        retry_in = ?wait,
                        "API discovery failed; asking again before watching {}",
                        api.name
                    );
                    warned = Some(Instant::now());
                }
                tokio::time::sleep(wait).await;
                wait = wait.saturating_mul(2).min(discovery.retry_max);
            }
        }
    }
}

/// The CRD names of `api`, for the log.
fn crd_names<K>(api: &OptionalApi<K>) -> String {
    let mut names: Vec<String> = api.candidates.iter().map(Candidate::crd_name).collect();
    names.dedup();
    names.join(" or ")
}

/// The objects of one kind that this build cannot read, by namespace and name, with why:
/// left out of the cache, and named to whatever refers to them.
#[derive(Debug, Default)]
pub struct Unreadable {
    noted: std::sync::Mutex<Notes>,
    /// Whether a noted object's status is kept, for a kind whose status says it is unreadable.
    keeps_status: bool,
}

/// What [`Unreadable`] holds under its lock.
#[derive(Debug, Default)]
struct Notes {
    objects: std::collections::BTreeMap<(String, String), Noted>,
    /// While a new list comes in, the objects it noted so far. Those noted before stay until
    /// it is done, as the cache keeps its objects until then: a round in between still sees
    /// every object, read or not.
    relisted: Option<std::collections::BTreeSet<(String, String)>>,
}

/// An object this build cannot read: why, and what of it its status is written against.
#[derive(Debug, Clone)]
pub struct Noted {
    pub error: String,
    pub generation: Option<i64>,
    pub resource_version: Option<String>,
    pub status: Option<serde_json::Value>,
}

impl Unreadable {
    /// For a kind whose unreadable objects' status is written: it keeps what that needs.
    pub fn keeping_status() -> Self {
        Self {
            keeps_status: true,
            ..Self::default()
        }
    }

    fn notes(&self) -> std::sync::MutexGuard<'_, Notes> {
        self.noted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn note(&self, namespace: Option<String>, name: String, noted: Option<Noted>) {
        let mut notes = self.notes();
        let key = (namespace.unwrap_or_default(), name);
        match noted {
            Some(noted) => {
                if let Some(relisted) = notes.relisted.as_mut() {
                    relisted.insert(key.clone());
                }
                notes.objects.insert(key, noted);
            }
            // One that reads now stays noted until a list under way is done, as the cache
            // shows it only then; that list's end forgets it.
            None if notes.relisted.is_some() => {}
            None => {
                notes.objects.remove(&key);
            }
        }
    }

    /// A new list starts.
    fn relisting(&self) {
        self.notes().relisted = Some(std::collections::BTreeSet::new());
    }

    /// The new list is done: what it did not note is gone.
    fn relisted(&self) {
        let mut notes = self.notes();
        if let Some(relisted) = notes.relisted.take() {
            notes.objects.retain(|key, _| relisted.contains(key));
        }
    }

    /// Every object noted, as `(namespace, name, what was noted)`.
    pub fn noted(&self) -> Vec<(String, String, Noted)> {
        self.notes()
            .objects
            .iter()
            .map(|((ns, name), noted)| (ns.clone(), name.clone(), noted.clone()))
            .collect()
    }

    /// Every object noted, with why, as a snapshot lists it.
    pub fn list(&self) -> Vec<UnreadableObject> {
        self.notes()
            .objects
            .iter()
            .map(|((namespace, name), noted)| UnreadableObject {
                namespace: namespace.clone(),
                name: name.clone(),
                error: noted.error.clone(),
            })
            .collect()
    }
}

/// [`readable`] for a kind nothing names objects of to be told why they are missing.
fn readable_unnoted<K>(event: watcher::Event<DynamicObject>) -> Option<watcher::Event<K>>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Default,
{
    readable(event, &Unreadable::default())
}

/// A watch event of `K`'s dynamic form, read as `K`. An object that does not read so is
/// logged, noted in `unreadable` and left out: skipped in a list, and gone from the cache when
/// it changes to such a form (its status is then left as it was).
pub(super) fn readable<K>(
    event: watcher::Event<DynamicObject>,
    unreadable: &Unreadable,
) -> Option<watcher::Event<K>>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Default,
{
    fn read<K>(object: DynamicObject, unreadable: &Unreadable) -> Option<K>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let (namespace, name) = (object.namespace(), object.name_any());
        let (generation, resource_version) = (
            object.metadata.generation,
            object.metadata.resource_version.clone(),
        );
        // Taken before the parse, which consumes the object.
        let status = unreadable
            .keeps_status
            .then(|| object.data.get("status").cloned())
            .flatten();
        match object.try_parse::<K>() {
            Ok(object) => {
                unreadable.note(namespace, name, None);
                Some(object)
            }
            Err(e) => {
                tracing::warn!(
                    kind = %K::kind(&()),
                    namespace = namespace.as_deref().unwrap_or_default(),
                    name,
                    error = %e,
                    "object unreadable by this build; left out"
                );
                let noted = Noted {
                    error: e.to_string(),
                    generation,
                    resource_version,
                    status,
                };
                unreadable.note(namespace, name, Some(noted));
                None
            }
        }
    }
    /// The cache forgets an object by its name: nothing else of it is needed.
    fn gone<K: Resource + Default>(metadata: ObjectMeta) -> watcher::Event<K> {
        let mut object = K::default();
        *object.meta_mut() = metadata;
        watcher::Event::Delete(object)
    }
    Some(match event {
        // A new list: what it cannot read is noted again as it comes, and what it no longer
        // holds is forgotten once it is done.
        watcher::Event::Init => {
            unreadable.relisting();
            watcher::Event::Init
        }
        watcher::Event::InitDone => {
            unreadable.relisted();
            watcher::Event::InitDone
        }
        watcher::Event::InitApply(o) => watcher::Event::InitApply(read(o, unreadable)?),
        watcher::Event::Apply(o) => {
            let metadata = o.metadata.clone();
            match read(o, unreadable) {
                Some(object) => watcher::Event::Apply(object),
                None => gone(metadata),
            }
        }
        watcher::Event::Delete(o) => {
            unreadable.note(o.metadata.namespace.clone(), o.name_any(), None);
            gone(o.metadata)
        }
    })
}

/// A ReferenceGrant event of either version as the `v1` type, whose spec is the same. An
/// object whose spec cannot be read so is logged and grants nothing: skipped in a list, and
/// removed from the cache when it changes to such a spec.
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
                    "ReferenceGrant spec unreadable; it grants nothing"
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

/// A ListenerSet event of either kind as the `v1` type. An object that cannot be read so is
/// logged and left out.
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

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_api::apis::standard::gateways::Gateway;

    fn gateway(port: serde_json::Value) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "hub", "namespace": "infra"},
            "spec": {"gatewayClassName": "cf", "listeners": [{"name": "web", "port": port, "protocol": "HTTP"}]},
        }))
        .expect("a dynamic object")
    }

    fn noted(unreadable: &Unreadable) -> Vec<String> {
        unreadable
            .list()
            .into_iter()
            .map(|o| format!("{}/{}", o.namespace, o.name))
            .collect()
    }

    /// An object this build cannot read stays noted while a new list comes in, as the cache
    /// keeps its objects until the list is done, and is forgotten only when the list done
    /// no longer holds it.
    #[test]
    fn an_unreadable_object_stays_noted_through_a_relist_that_still_holds_it() {
        let unreadable = Unreadable::default();
        let events = |list: Vec<watcher::Event<DynamicObject>>| {
            for event in list {
                let _ = readable::<Gateway>(event, &unreadable);
            }
        };
        events(vec![
            watcher::Event::Init,
            watcher::Event::InitApply(gateway(serde_json::json!("eighty"))),
            watcher::Event::InitDone,
        ]);
        assert_eq!(noted(&unreadable), ["infra/hub"]);

        // A relist under way: nothing is forgotten before it is done.
        let _ = readable::<Gateway>(watcher::Event::Init, &unreadable);
        assert_eq!(noted(&unreadable), ["infra/hub"], "while the list comes in");
        events(vec![
            watcher::Event::InitApply(gateway(serde_json::json!("eighty"))),
            watcher::Event::InitDone,
        ]);
        assert_eq!(noted(&unreadable), ["infra/hub"]);

        // A list that no longer holds it.
        events(vec![watcher::Event::Init, watcher::Event::InitDone]);
        assert!(noted(&unreadable).is_empty());

        // Read once it reads: during a list, only once the list is done, as the cache shows
        // it only then.
        events(vec![
            watcher::Event::Init,
            watcher::Event::InitApply(gateway(serde_json::json!("eighty"))),
            watcher::Event::InitDone,
        ]);
        events(vec![
            watcher::Event::Init,
            watcher::Event::InitApply(gateway(serde_json::json!(80))),
        ]);
        assert_eq!(noted(&unreadable), ["infra/hub"], "while the list comes in");
        events(vec![watcher::Event::InitDone]);
        assert!(noted(&unreadable).is_empty());
        events(vec![watcher::Event::Apply(gateway(serde_json::json!(
            "eighty"
        )))]);
        assert_eq!(noted(&unreadable), ["infra/hub"]);
        events(vec![watcher::Event::Apply(gateway(serde_json::json!(80)))]);
        assert!(noted(&unreadable).is_empty(), "out of a list at once");
    }
}
