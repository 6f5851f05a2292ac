//! What the controller reports, and when: status writes, Events and the hostname-ownership list
//! that hang hold up no other tenant, and Events about one object go out in order; one
//! namespace's Events that hang hold up no other namespace's, a burst past the bound on those
//! waiting all goes out, and one dropped unanswered as the Lease lapses goes out once leading
//! again (not one answered before, nor a `ProxyProvisioned` of a Gateway deleted meanwhile);
//! status writes and list writes that fail or conflict are not sent again at every
//! round, but are once their wait is over or the object changed under them (the list is
//! written at the version watched); a new Gateway's routes wait for its plane and tunnel
//! document, unless another plane on its tunnel serves them (a broken one does not); a plane
//! whose pods are all down is reported on its routes, unless another plane on its tunnel
//! serves them, not while they are still being created, and with the reason their containers
//! wait for once they fail (with a guess where the Pod list is refused); other controllers' conditions on our route parents give way to ours at the
//! CRD's cap; and a Gateway back from the shared plane is told its render failure again.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use cftunnel_controller::runtime::{
    ownership_parents, EventLimits, RuntimeOptions, SharedPlane, REQUIRED_RBAC,
};
use cftunnel_controller::translate::ObjectKey;
use cftunnel_proxy::Server;
use cftunnel_testkit::cloudflare_api::CloudflareApi;
use cftunnel_testkit::kube_api::{ApiServer, Call, Forbid, Rule};
use cftunnel_tunnel::Token;
use serde_json::{json, Value};

use super::{
    closed_port, config_slice, counted, host_serves, internal_failing_beside_edge, older_pool,
    on_the_pool, pool_controller, pool_slice, proxy_pod, push_failures, route_condition,
    route_parent, rule_refusals_told, seeded_shared_plane, shared_seed, shop_serves,
    stop_controller, uuid_of, written_without, Tenant, CORS_ROUTE, PROXY_CONFIG_PUSHED, TUNNEL_ID,
};
use crate::support::{self, condition, eventually, yaml};

/// Whether `call` writes the status of an HTTPRoute with a parent in `namespace`.
fn route_status_in(call: &Call<'_>, namespace: &str) -> bool {
    call.method == "PATCH"
        && call.kind == "HTTPRoute"
        && call
            .body
            .pointer("/status/parents")
            .and_then(Value::as_array)
            .is_some_and(|parents| {
                parents
                    .iter()
                    .any(|p| p["parentRef"]["namespace"] == namespace)
            })
}

/// A route status write the API server does not answer (an admission webhook on
/// `httproutes/status` that hangs) holds up no other tenant: the round waits for its status
/// writes briefly, and another tenant's route change reaches its pod.
#[tokio::test]
async fn a_route_status_write_that_hangs_holds_up_no_other_tenants_push() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let edge = proxy_pod("s3cr3t").await;
        let mut held = None;
        let t = Tenant::start_with("replicas: 1", |api| {
            api.put(config_slice(
                "tenant-a",
                "cf-proxy-edge-config",
                edge.admin_addr().port(),
                true,
            ));
            held = Some(api.hold(|c| route_status_in(c, "tenant-c")));
        })
        .await;
        let hold = held.expect("tenant-c's route status writes are held");
        shop_serves(&edge, 200).await;
        tokio::time::timeout(Duration::from_secs(20), hold.arrived(1))
            .await
            .expect("tenant-c's route status write");

        let deleted = Instant::now();
        t.api.delete(
            "gateway.networking.k8s.io/v1",
            "HTTPRoute",
            "tenant-a",
            "shop",
        );
        shop_serves(&edge, 404).await;
        assert!(
            deleted.elapsed() < Duration::from_secs(10),
            "tenant-a's change took {:?}",
            deleted.elapsed()
        );
        hold.release();
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Event posts given up after a minute, not the default seconds: tests that hold them for a
/// while see them answered once released.
fn patient(options: &mut RuntimeOptions) {
    options.events.post_timeout = Duration::from_secs(60);
}

/// Whether `call` posts an Event about the object named `name`.
fn event_post_about(call: &Call<'_>, name: &str) -> bool {
    call.method == "POST" && call.kind == "Event" && call.body["regarding"]["name"] == name
}

/// The stored Events about the object named `name`, oldest first: `(reason, type)`.
fn events_about(api: &ApiServer, name: &str) -> Vec<(String, String)> {
    let mut events: Vec<(u64, String, String)> = api
        .list("Event")
        .into_iter()
        .filter(|e| e["regarding"]["name"] == name)
        .map(|e| {
            let version = e["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse().ok())
                .expect("a stored object's resourceVersion");
            let text = |field: &str| e[field].as_str().unwrap_or_default().to_owned();
            (version, text("reason"), text("type"))
        })
        .collect();
    events.sort();
    events.into_iter().map(|(_, r, t)| (r, t)).collect()
}

/// Every Event posted: the name of the object it is about and its reason, in the order the
/// posts reached the API server (held ones included).
type EventPosts = Arc<Mutex<Vec<(String, String)>>>;

/// Records the Events posted ([`EventPosts`]) while the guard lives.
fn record_event_posts(api: &ApiServer) -> (EventPosts, Forbid) {
    let posted = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&posted);
    let guard = api.forbid(move |c| {
        if c.method == "POST" && c.kind == "Event" {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            recorded
                .lock()
                .expect("the recorded posts")
                .push((text(&c.body["regarding"]["name"]), text(&c.body["reason"])));
        }
        false
    });
    (posted, guard)
}

/// Fails every apply of tenant-c's plane and changes its render: Gateway `third` gets a
/// `RenderFailed` Event.
fn fail_third_apply(api: &ApiServer) -> Forbid {
    let failing = api.fail(500, |c| {
        c.method == "PATCH"
            && c.kind == "Deployment"
            && c.body.pointer("/metadata/namespace") == Some(&json!("tenant-c"))
    });
    api.put(yaml(
        "apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayConfig\nmetadata: {name: third-config, namespace: tenant-c}\nspec: {tunnelTokenSecretRef: {name: third-tunnel-token}, replicas: 3}\n",
    ));
    failing
}

/// A controller that takes over (a restart here) from one that told a Gateway its plane could
/// not be applied, and finds the apply failing for the same reason, which the Gateway's status
/// says, keeps saying so in the status and sends no second `RenderFailed`.
#[tokio::test]
async fn a_new_leader_does_not_tell_again_a_render_failure_the_gateways_status_says() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut t = Tenant::start("replicas: 1").await;
        eventually("third's ProxyProvisioned", || {
            events_about(&t.api, "third")
                .contains(&("ProxyProvisioned".into(), "Normal".into()))
                .then_some(())
        })
        .await;
        let failing = fail_third_apply(&t.api);
        eventually("third's RenderFailed, and its Programmed saying so", || {
            let programmed = t
                .api
                .get(
                    "gateway.networking.k8s.io/v1",
                    "Gateway",
                    "tenant-c",
                    "third",
                )
                .and_then(|g| condition(g.pointer("/status/conditions")?, "Programmed").cloned())?;
            let says = programmed["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("the data plane could not be applied: "));
            (times_told(&t.api, "third", "RenderFailed") == 1 && says).then_some(())
        })
        .await;

        let dropped = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&dropped);
        let _watching = t.api.forbid(move |c| {
            let third = c.method == "PATCH" && c.kind == "Gateway" && c.name == Some("third");
            let said = c
                .body
                .to_string()
                .contains("the data plane could not be applied");
            if third && !said {
                flag.store(true, Ordering::SeqCst);
            }
            false
        });
        let applies = failing.count();
        t.restart(|_| {}).await;
        let failures = |t: &Tenant| {
            t.api
                .list("Event")
                .into_iter()
                .filter(|e| e["reason"] == "RenderFailed")
                .count()
        };
        // The new controller's own apply fails, the same way.
        tokio::time::timeout(Duration::from_secs(20), failing.refused(applies + 1))
            .await
            .expect("the new controller's apply of third, failing");
        t.rounds(3, Duration::from_millis(300)).await;
        assert_eq!(
            times_told(&t.api, "third", "RenderFailed"),
            1,
            "told once, by the first controller ({} RenderFailed Events)",
            failures(&t)
        );
        assert!(
            !dropped.load(Ordering::SeqCst),
            "the Gateway's status was written without the failure"
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// An Event the API server does not answer (an admission webhook on `events` that hangs, or an
/// API server slow on them) holds up no other tenant: one tenant's `RenderFailed` goes out by
/// itself while another tenant's route change reaches its pod, and is published, once, when
/// the API server answers.
#[tokio::test]
async fn an_event_that_hangs_holds_up_no_other_tenants_push() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let edge = proxy_pod("s3cr3t").await;
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    edge.admin_addr().port(),
                    true,
                ));
            },
            ApiServer::client,
            patient,
        )
        .await;
        shop_serves(&edge, 200).await;
        eventually("third's ProxyProvisioned", || {
            events_about(&t.api, "third")
                .contains(&("ProxyProvisioned".into(), "Normal".into()))
                .then_some(())
        })
        .await;

        // The test's API client waits far longer than the test.
        let hold = t.api.hold(|c| event_post_about(c, "third"));
        let (posted, _recording) = record_event_posts(&t.api);
        let _failing = fail_third_apply(&t.api);
        tokio::time::timeout(Duration::from_secs(20), hold.arrived(1))
            .await
            .expect("third's RenderFailed posted");

        t.api.delete(
            "gateway.networking.k8s.io/v1",
            "HTTPRoute",
            "tenant-a",
            "shop",
        );
        shop_serves(&edge, 404).await;

        hold.release();
        assert_eq!(hold.answered(1).await, [201], "published once answered");
        eventually("third's RenderFailed", || {
            events_about(&t.api, "third")
                .contains(&("RenderFailed".into(), "Warning".into()))
                .then_some(())
        })
        .await;
        t.rounds(3, Duration::from_millis(300)).await;
        let third: Vec<_> = posted
            .lock()
            .expect("the recorded posts")
            .iter()
            .filter(|(name, _)| name == "third")
            .cloned()
            .collect();
        assert_eq!(
            third,
            [("third".to_owned(), "RenderFailed".to_owned())],
            "posted once"
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Events held from the start (the events API down as the controller starts) hold up no
/// plane: the planes are applied and pushed to while their `ProxyProvisioned` waits. Events
/// about one object go out in the order they were made: a Gateway's `RenderFailed` waits for
/// its `ProxyProvisioned` still unanswered, and follows it once that is.
#[tokio::test]
async fn events_held_from_the_start_hold_up_no_push_and_go_out_in_order() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let edge = proxy_pod("s3cr3t").await;
        let (mut held, mut recording) = (None, None);
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    edge.admin_addr().port(),
                    true,
                ));
                recording = Some(record_event_posts(api));
                held = Some(api.hold(|c| c.method == "POST" && c.kind == "Event"));
            },
            ApiServer::client,
            patient,
        )
        .await;
        let hold = held.expect("every Event post is held");
        let (posted, _recording) = recording.expect("Event posts are recorded");
        let about = |name: &str| -> Vec<String> {
            posted
                .lock()
                .expect("the recorded posts")
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, reason)| reason.clone())
                .collect()
        };
        shop_serves(&edge, 200).await;
        eventually("third's ProxyProvisioned posted", || {
            (about("third") == ["ProxyProvisioned"]).then_some(())
        })
        .await;

        let _failing = fail_third_apply(&t.api);
        eventually("third's failed apply reported", || {
            t.api
                .get(
                    "gateway.networking.k8s.io/v1",
                    "Gateway",
                    "tenant-c",
                    "third",
                )
                .and_then(|g| condition(&g["status"]["conditions"], "Programmed").cloned())
                .filter(|c| {
                    c["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("the data plane could not be applied"))
                })
        })
        .await;
        t.rounds(3, Duration::from_millis(300)).await;
        assert_eq!(
            about("third"),
            ["ProxyProvisioned"],
            "its RenderFailed waits for the ProxyProvisioned before it"
        );

        hold.release();
        let third = eventually("third's Events published", || {
            let third = events_about(&t.api, "third");
            (third.len() == 2).then_some(third)
        })
        .await;
        assert_eq!(
            third,
            [
                ("ProxyProvisioned".to_owned(), "Normal".to_owned()),
                ("RenderFailed".to_owned(), "Warning".to_owned())
            ]
        );
        assert_eq!(about("third"), ["ProxyProvisioned", "RenderFailed"]);
        eventually("edge's ProxyProvisioned published", || {
            events_about(&t.api, "edge")
                .contains(&("ProxyProvisioned".into(), "Normal".into()))
                .then_some(())
        })
        .await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// HTTPRoute `name` in tenant-a repeating route shop's match: told `RouteShadowed`.
fn shop_copy(name: &str) -> Value {
    yaml(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: tenant-a}}\nspec:\n  parentRefs: [{{name: edge}}]\n  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]\n"
    ))
}

/// How many times the object named `name` was told `reason`: the recorder patches an Event
/// made again into the stored one, counting it in its series.
fn times_told(api: &ApiServer, name: &str, reason: &str) -> u64 {
    api.list("Event")
        .into_iter()
        .filter(|e| e["regarding"]["name"] == name && e["reason"] == reason)
        .map(|e| e["series"]["count"].as_u64().unwrap_or(1))
        .sum()
}

/// Whether route `name` was told it is shadowed, in an Event the API server stored.
fn told_shadowed(api: &ApiServer, name: &str) -> bool {
    events_about(api, name).contains(&("RouteShadowed".into(), "Warning".into()))
}

/// More Events at once than may wait (here 4), on an API server that answers them all at
/// once: those refused for want of room are not taken as told, and go out in later rounds, so
/// every route shadowed is told.
#[tokio::test]
async fn a_burst_of_events_past_the_bound_all_go_out() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let copies: Vec<String> = (0..12).map(|i| format!("shop-copy-{i}")).collect();
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                for name in &copies {
                    api.put(shop_copy(name));
                }
            },
            ApiServer::client,
            |options| {
                options.events = EventLimits {
                    waiting: 4,
                    waiting_per_namespace: 4,
                    ..EventLimits::default()
                }
            },
        )
        .await;
        eventually("every copy told it is shadowed", || {
            copies
                .iter()
                .all(|name| told_shadowed(&t.api, name))
                .then_some(())
        })
        .await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// One namespace's Events the API server does not answer (a webhook on that namespace's
/// `events` that hangs) hold that namespace's turns only: another namespace's Event goes out
/// meanwhile, though more of the first's wait than there are turns in all.
#[tokio::test]
async fn one_namespaces_events_that_hang_hold_up_no_other_namespaces() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut held = None;
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                held = Some(api.hold(|c| {
                    c.method == "POST"
                        && c.kind == "Event"
                        && c.body["regarding"]["namespace"] == "tenant-a"
                }));
                for i in 0..6 {
                    api.put(shop_copy(&format!("shop-copy-{i}")));
                }
            },
            ApiServer::client,
            |options| {
                options.events = EventLimits {
                    at_once: 4,
                    at_once_per_namespace: 1,
                    post_timeout: Duration::from_secs(60),
                    ..EventLimits::default()
                }
            },
        )
        .await;
        let hold = held.expect("tenant-a's Events are held");
        tokio::time::timeout(Duration::from_secs(20), hold.arrived(1))
            .await
            .expect("tenant-a's Events posted");
        eventually("third's ProxyProvisioned", || {
            events_about(&t.api, "third")
                .contains(&("ProxyProvisioned".into(), "Normal".into()))
                .then_some(())
        })
        .await;
        assert!(
            hold.answered(0).await.is_empty(),
            "tenant-a's Events are still held"
        );
        hold.release();
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Waits until the API server has taken no write but the Lease's renewals for half a second.
async fn settled_but_the_lease(api: &ApiServer) {
    loop {
        let rv = api.resource_version();
        tokio::time::sleep(Duration::from_millis(500)).await;
        if api.writes_since(rv).iter().all(|w| w.contains("leases")) {
            return;
        }
    }
}

/// A Lease of 2 s renewed every 200 ms; rounds only on changes (a round under way as the Lease
/// lapses is cut off, and the replica starts afresh, telling everything again, rather than
/// resuming); Event posts given up after a minute.
fn leasing(options: &mut RuntimeOptions) {
    options.lease = Some(cftunnel_controller::runtime::lease::LeaseOptions {
        namespace: "cftunnel-system".to_owned(),
        name: "cftunnel-controller".to_owned(),
        identity: "replica-a".to_owned(),
        duration: Duration::from_secs(2),
        renew: Duration::from_millis(200),
    });
    options.resync = Duration::from_secs(3600);
    patient(options);
}

/// Holds the replica's Lease renewals until it stops leading (its health server at `health`
/// says so), runs `meanwhile`, and waits until it leads again in the same term.
async fn lapse(api: &ApiServer, health: std::net::SocketAddr, meanwhile: impl FnOnce()) {
    let renewals = api.hold(|c| {
        c.method == "PUT"
            && c.kind == "Lease"
            && c.body.pointer("/spec/holderIdentity") == Some(&json!("replica-a"))
    });
    renewals.arrived(1).await;
    super::metric_becomes(health, "cftunnel_controller_leading", 0).await;
    meanwhile();
    renewals.release();
    super::metric_becomes(health, "cftunnel_controller_leading", 1).await;
}

/// An Event the API server has not answered as this replica stops leading is dropped with the
/// rest, and what it told forgotten: leading again in the same term (nobody else led), the
/// replica makes it again, and it is published. It resumes rather than starting afresh: an
/// Event answered before the lapse is not made again.
#[tokio::test]
async fn an_event_unanswered_as_the_lease_lapses_goes_out_once_leading_again() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start_tuned("replicas: 1", |_| {}, ApiServer::client, leasing).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let health = listener.local_addr().expect("addr");
        let serving = tokio::spawn(cftunnel_controller::runtime::health::serve(
            listener,
            t.health.clone(),
        ));
        eventually("blog accepted", || blog_accepted(&t.api, 1)).await;
        // Older than shop-copy (by name, if made in the same second): its message names shop
        // only, whatever comes after.
        t.api.put(shop_copy("shop-aa"));
        eventually("shop-aa's RouteShadowed published", || {
            told_shadowed(&t.api, "shop-aa").then_some(())
        })
        .await;
        settled_but_the_lease(&t.api).await;

        // The first post of shop-copy's RouteShadowed is held, unanswered.
        let first = AtomicBool::new(false);
        let held = t.api.hold(move |c| {
            event_post_about(c, "shop-copy")
                && c.body["reason"] == "RouteShadowed"
                && !first.swap(true, Ordering::SeqCst)
        });
        t.api.put(shop_copy("shop-copy"));
        tokio::time::timeout(Duration::from_secs(20), held.arrived(1))
            .await
            .expect("shop-copy's RouteShadowed posted");
        settled_but_the_lease(&t.api).await;

        lapse(&t.api, health, || {}).await;
        eventually("shop-copy's RouteShadowed published", || {
            told_shadowed(&t.api, "shop-copy").then_some(())
        })
        .await;
        t.rounds(3, Duration::from_millis(300)).await;
        assert_eq!(
            events_about(&t.api, "shop-aa"),
            [("RouteShadowed".to_owned(), "Warning".to_owned())],
            "told once, before the lapse"
        );
        assert_eq!(times_told(&t.api, "shop-aa", "RouteShadowed"), 1);
        drop(held);
        serving.abort();
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A controller that takes over from one that told a route the failure of another Gateway's
/// pods on its tunnel (`internal`'s, which refuse every push) keeps the report though the
/// route's own plane takes the config at once, until its own run of failures of `internal`
/// is reported: no moment without it, no second Event.
#[tokio::test]
async fn a_new_leader_keeps_a_failure_of_another_plane_on_the_tunnel_told_before() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (mut t, _edge, _held) = internal_failing_beside_edge().await;
        eventually("shop's ProxyConfigPushFailed", || {
            (times_told(&t.api, "shop", "ProxyConfigPushFailed") == 1).then_some(())
        })
        .await;
        let told = route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED);

        let (dropped, _watching) = written_without(&t.api, "shop", PROXY_CONFIG_PUSHED);
        let before = internal_failures(&t);
        t.restart(|_| {}).await;
        // Past the new controller's sustained rounds (three).
        eventually("the new controller's failed pushes to internal", || {
            (internal_failures(&t) >= before + 4).then_some(())
        })
        .await;
        t.rounds(3, Duration::from_millis(300)).await;
        assert_eq!(
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
                .map(|c| c["reason"].clone()),
            told.map(|c| c["reason"].clone())
        );
        assert!(
            !dropped.load(Ordering::SeqCst),
            "shop's status was written without the report"
        );
        assert_eq!(
            times_told(&t.api, "shop", "ProxyConfigPushFailed"),
            1,
            "{:?}",
            events_about(&t.api, "shop")
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Rounds so far, on `/metrics` (the same across a restart: the new controller counts on).
fn rounds(t: &Tenant) -> u64 {
    counted(&t.health, "cftunnel_controller_rounds_total")
}

/// Failed pushes to tenant-a/internal's pods so far, on `/metrics`.
fn internal_failures(t: &Tenant) -> u64 {
    push_failures(&t.health, "tenant-a/internal")
}

/// A controller that takes over (a restart here, as for another replica taking the lead) from
/// one that told a route a warning (`RouteShadowed`) sends it no second Event: the route's
/// status carries the warning, so it was told.
#[tokio::test]
async fn a_new_leader_does_not_tell_again_the_warnings_a_routes_status_carries() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut t = Tenant::start("replicas: 1").await;
        eventually("blog accepted", || blog_accepted(&t.api, 1)).await;
        t.api.put(shop_copy("shop-aa"));
        eventually("shop-aa's RouteShadowed told", || {
            (told_shadowed(&t.api, "shop-aa")
                && route_condition(&t.api, "tenant-a", "shop-aa", "cf.k8s.lex.la/RouteShadowed")
                    .is_some())
            .then_some(())
        })
        .await;

        t.restart(|_| {}).await;
        // The new controller's rounds: another route made and told.
        t.api.put(shop_copy("shop-ab"));
        eventually("shop-ab's RouteShadowed told", || {
            told_shadowed(&t.api, "shop-ab").then_some(())
        })
        .await;
        t.rounds(3, Duration::from_millis(300)).await;
        assert_eq!(
            times_told(&t.api, "shop-aa", "RouteShadowed"),
            1,
            "told once, by the first controller"
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A `ProxyProvisioned` unanswered as the Lease lapses is kept to be sent again once leading
/// again, but not for a Gateway deleted meanwhile.
#[tokio::test]
async fn a_provisioned_event_unanswered_as_the_lease_lapses_is_not_sent_for_a_gateway_deleted_meanwhile(
) {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start_tuned("replicas: 1", |_| {}, ApiServer::client, leasing).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let health = listener.local_addr().expect("addr");
        let serving = tokio::spawn(cftunnel_controller::runtime::health::serve(
            listener,
            t.health.clone(),
        ));
        eventually("edge's ProxyProvisioned", || {
            (times_told(&t.api, "edge", "ProxyProvisioned") == 1).then_some(())
        })
        .await;
        settled_but_the_lease(&t.api).await;

        // The recorder patches an Event made again (the same note) into the stored one.
        let edge_provisioned = |c: &Call<'_>| {
            (c.method == "POST" || c.method == "PATCH")
                && c.kind == "Event"
                && c.body["regarding"]["name"] == "edge"
                && c.body["reason"] == "ProxyProvisioned"
        };
        let held = t.api.hold(edge_provisioned);
        let sent = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&sent);
        let _counting = t.api.forbid(move |c| {
            if edge_provisioned(c) {
                counted.fetch_add(1, Ordering::SeqCst);
            }
            false
        });
        t.configure("replicas: 2");
        tokio::time::timeout(Duration::from_secs(20), held.arrived(1))
            .await
            .expect("edge's second ProxyProvisioned sent");
        settled_but_the_lease(&t.api).await;

        lapse(&t.api, health, || {
            t.api.delete(
                "gateway.networking.k8s.io/v1",
                "Gateway",
                "tenant-a",
                "edge",
            );
        })
        .await;
        t.rounds(3, Duration::from_millis(300)).await;
        assert_eq!(sent.load(Ordering::SeqCst), 1, "not sent again");
        drop(held);
        serving.abort();
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A Gateway whose plane failed to apply and that goes back to the shared plane leaves nothing
/// of that failure behind: it is counted failing no more, and back on a dedicated plane that
/// fails for the same reason, it is told again.
#[tokio::test]
async fn a_gateway_back_from_the_shared_plane_is_told_its_render_failure_again() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 1").await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let health = listener.local_addr().expect("addr");
        let serving = tokio::spawn(cftunnel_controller::runtime::health::serve(
            listener,
            t.health.clone(),
        ));
        let told = |reason: &str| times_told(&t.api, "edge", reason);
        eventually("edge's ProxyProvisioned", || {
            (told("ProxyProvisioned") == 1).then_some(())
        })
        .await;

        // Another Gateway of the seed fails to apply throughout.
        const FAILING: &str = "cftunnel_controller_render_failing_gateways";
        let others = super::metric(health, FAILING).await.expect("the gauge");
        let _failing = t.api.fail(500, |c| {
            c.method == "PATCH"
                && c.kind == "Deployment"
                && c.body.pointer("/metadata/namespace") == Some(&json!("tenant-a"))
                && c.body.pointer("/metadata/name") == Some(&json!("cf-proxy-edge"))
        });
        t.configure("replicas: 3");
        eventually("edge's RenderFailed", || {
            (told("RenderFailed") == 1).then_some(())
        })
        .await;
        super::metric_becomes(health, FAILING, others + 1).await;

        t.api.put(yaml(&super::gateway(false)));
        eventually("edge's plane removed", || {
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
                .is_none()
                .then_some(())
        })
        .await;
        super::metric_becomes(health, FAILING, others).await;

        t.api.put(yaml(&super::gateway(true)));
        eventually("edge's RenderFailed told again", || {
            (told("RenderFailed") == 2).then_some(())
        })
        .await;
        serving.abort();
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The controller's rules, and those of the hostname-ownership list's ConfigMap.
static WITH_OWNERSHIP_LIST: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    REQUIRED_RBAC
        .iter()
        .copied()
        .chain([ownership_parents::RBAC])
        .collect()
});

/// A write of the hostname-ownership list the API server does not answer (an admission webhook
/// on ConfigMaps that hangs) holds up no round: the planes are applied and pushed to
/// meanwhile, and the list is written once the API server answers.
#[tokio::test]
async fn an_ownership_list_write_that_hangs_holds_up_no_push() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let edge = proxy_pod("s3cr3t").await;
        let configmap = ObjectKey::new("cftunnel-system", "cf-hostname-ownership");
        let mut held = None;
        let t = Tenant::start_granted(
            "replicas: 1",
            WITH_OWNERSHIP_LIST.as_slice(),
            |api| {
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    edge.admin_addr().port(),
                    true,
                ));
                held = Some(api.hold(|c| c.method == "PATCH" && c.kind == "ConfigMap"));
            },
            ApiServer::client,
            |options| options.ownership_parents = Some(configmap.clone()),
        )
        .await;
        let hold = held.expect("the list's writes are held");
        tokio::time::timeout(Duration::from_secs(20), hold.arrived(1))
            .await
            .expect("the list's write");

        shop_serves(&edge, 200).await;
        t.api.delete(
            "gateway.networking.k8s.io/v1",
            "HTTPRoute",
            "tenant-a",
            "shop",
        );
        shop_serves(&edge, 404).await;

        hold.release();
        let list = eventually("the list written", || {
            t.api
                .get("v1", "ConfigMap", &configmap.namespace, &configmap.name)
                .and_then(|c| {
                    c["data"][ownership_parents::DATA_KEY]
                        .as_str()
                        .map(str::to_owned)
                })
        })
        .await;
        assert!(list.contains("Gateway/tenant-a/edge\n"), "{list}");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The hostname-ownership list's ConfigMap.
fn ownership_list() -> ObjectKey {
    ObjectKey::new("cftunnel-system", "cf-hostname-ownership")
}

/// The seed's tenants, the controller keeping the hostname-ownership list, `before` run on the
/// API server first.
async fn listing_tenant(before: impl FnOnce(&ApiServer)) -> Tenant {
    Tenant::start_granted(
        "replicas: 1",
        WITH_OWNERSHIP_LIST.as_slice(),
        before,
        ApiServer::client,
        |options| options.ownership_parents = Some(ownership_list()),
    )
    .await
}

/// The list as the API server holds it.
fn listed(api: &ApiServer) -> Option<String> {
    let key = ownership_list();
    api.get("v1", "ConfigMap", &key.namespace, &key.name)
        .and_then(|c| {
            c["data"][ownership_parents::DATA_KEY]
                .as_str()
                .map(str::to_owned)
        })
}

/// Whether `call` writes the list.
fn list_write(call: &Call<'_>) -> bool {
    call.method == "PATCH" && call.kind == "ConfigMap"
}

/// A write of the list the API server refuses (a webhook on ConfigMaps) is not sent again at
/// every round: it waits, and is sent again once its wait is over (5 s).
#[tokio::test]
async fn a_refused_ownership_list_write_waits_before_it_is_sent_again() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let sent = Arc::new(AtomicUsize::new(0));
        let mut refusal = None;
        let t = listing_tenant(|api| {
            let counted = Arc::clone(&sent);
            refusal = Some(api.forbid(move |c| {
                let list = list_write(c);
                // The first is refused.
                list && counted.fetch_add(1, Ordering::SeqCst) == 0
            }));
        })
        .await;
        let refusal = refusal.expect("the list's first write is refused");
        tokio::time::timeout(Duration::from_secs(20), refusal.refused(1))
            .await
            .expect("the refused write");
        let refused = Instant::now();
        // Rounds at each change and every 100 ms meanwhile: none sends it again.
        t.rounds(3, Duration::from_millis(500)).await;
        assert_eq!(sent.load(Ordering::SeqCst), 1, "sent once while it waits");
        let list = eventually("the list written", || listed(&t.api)).await;
        assert!(list.contains("Gateway/tenant-a/edge\n"), "{list}");
        assert!(
            refused.elapsed() >= Duration::from_secs(4),
            "sent again after {:?}, before its wait was over",
            refused.elapsed()
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The list is written at the ConfigMap's resourceVersion as watched, so that a write answered
/// late cannot put an older list back over a newer one. One refused as a conflict (the
/// ConfigMap changed, and the watch has not brought it yet) is not sent again at that version
/// round after round; once the newer version is seen, the list is written at that one.
#[tokio::test]
async fn an_ownership_list_write_refused_as_a_conflict_is_written_again_at_the_newer_version() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = listing_tenant(|_| {}).await;
        let key = ownership_list();
        let configmap = || {
            t.api
                .get("v1", "ConfigMap", &key.namespace, &key.name)
                .expect("the list's ConfigMap")
        };
        let version = |c: &Value| c["metadata"]["resourceVersion"].as_str().map(str::to_owned);
        eventually("the list written", || {
            listed(&t.api).filter(|l| l.contains("Gateway/tenant-c/third\n"))
        })
        .await;
        super::settled(&t.api).await;

        // The versions the list's writes name; the first is refused as a conflict.
        let named = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&named);
        let _recording = t.api.forbid(move |c| {
            if list_write(c) {
                recorded.lock().expect("the recorded versions").push(
                    c.body["metadata"]["resourceVersion"]
                        .as_str()
                        .map(str::to_owned),
                );
            }
            false
        });
        let first = AtomicBool::new(false);
        let conflict = t.api.fail(409, move |c| {
            list_write(c) && !first.swap(true, Ordering::SeqCst)
        });
        let watched = version(&configmap());
        // Gateway third gone: the list is due without it.
        t.api.delete(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "tenant-c",
            "third",
        );
        tokio::time::timeout(Duration::from_secs(10), conflict.refused(1))
            .await
            .expect("the list's write refused");
        // Rounds meanwhile, past the 5 s a failed write waits: none sends it again at the same
        // version.
        t.rounds(12, Duration::from_millis(500)).await;
        assert_eq!(
            *named.lock().expect("the recorded versions"),
            [watched],
            "written once, at the version watched"
        );

        // Someone labels the ConfigMap: its newer version seen, the list is written at it.
        let mut labelled = configmap();
        labelled["metadata"]["labels"] = json!({"team": "blue"});
        let newer = version(&t.api.put(labelled));
        let list = eventually("the list written without third", || {
            listed(&t.api).filter(|l| !l.contains("tenant-c"))
        })
        .await;
        assert!(list.contains("Gateway/tenant-a/edge\n"), "{list}");
        let named = named.lock().expect("the recorded versions").clone();
        assert_eq!(named.get(1), Some(&newer), "{named:?}");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A route status the API server refuses is not sent again at every round: it waits, and is
/// sent again once its wait is over. A changed status goes at once.
#[tokio::test]
async fn a_refused_route_status_waits_before_it_is_sent_again() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 1").await;
        let accepted = |generation: i64| {
            let api = &t.api;
            move || {
                route_condition(api, "tenant-c", "blog", "Accepted")
                    .filter(|c| c["status"] == "True" && c["observedGeneration"] == generation)
            }
        };
        eventually("blog accepted", accepted(1)).await;

        let sent = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&sent);
        let refusal = t.api.forbid(move |c| {
            let blog = route_status_in(c, "tenant-c");
            if blog {
                counted.fetch_add(1, Ordering::SeqCst);
            }
            blog
        });
        let blog = || {
            yaml("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: blog, namespace: tenant-c}\nspec:\n  parentRefs: [{name: third}]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n")
        };
        // A new generation: its status says so, and the write is refused.
        t.api.put(blog());
        tokio::time::timeout(Duration::from_secs(20), refusal.refused(1))
            .await
            .expect("the refused write");
        // Rounds every 100 ms, and at each change, meanwhile: none sends it again.
        t.rounds(3, Duration::from_millis(500)).await;
        assert_eq!(sent.load(Ordering::SeqCst), 1, "sent once while it waits");
        // Its wait over, it is sent again.
        eventually("the write sent again", || {
            (sent.load(Ordering::SeqCst) >= 2).then_some(())
        })
        .await;

        // Allowed, a changed status goes at once.
        refusal.lift();
        t.api.put(blog());
        let written = Instant::now();
        eventually("blog's new generation written", accepted(3)).await;
        assert!(
            written.elapsed() < Duration::from_secs(5),
            "written after {:?}",
            written.elapsed()
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A tenant whose Gateway's plane is new, its tunnel's document written through the stand-in
/// Cloudflare API with the tenant's own token, `before` run on the API server before the
/// controller starts. Every write of route `shop`'s status saying `Accepted=True` is checked
/// against the document while the returned guard lives: the flag is set if one went out before
/// the document carried the route's hostname.
async fn new_plane(
    before: impl FnOnce(&ApiServer),
) -> (Arc<CloudflareApi>, Tenant, Arc<AtomicBool>, Forbid) {
    let cloudflare = Arc::new(CloudflareApi::start().await);
    cloudflare.allow("acct", "cf-token-a");
    let base = cloudflare.base();
    let early = Arc::new(AtomicBool::new(false));
    let (document, flag) = (Arc::clone(&cloudflare), Arc::clone(&early));
    let mut watching = None;
    let t = Tenant::start_tuned(
        "replicas: 1, cloudflareCredentialsSecretRef: {name: edge-cf}",
        |api| {
            watching = Some(api.forbid(move |c| {
                let accepted = route_status_in(c, "tenant-a")
                    && c.body
                        .pointer("/status/parents")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(|p| condition(&p["conditions"], "Accepted"))
                        .any(|a| a["status"] == "True");
                let carried = || {
                    document
                        .config("acct", TUNNEL_ID)
                        .is_some_and(|(_, d)| d.to_string().contains("shop.example.com"))
                };
                if accepted && !carried() {
                    flag.store(true, Ordering::SeqCst);
                }
                false
            }));
            before(api);
        },
        ApiServer::client,
        |options| options.cloudflare_api_base = base,
    )
    .await;
    let watching = watching.expect("route shop's status writes are watched");
    (cloudflare, t, early, watching)
}

/// Waits for route `shop` to be `Accepted=Unknown` (`Pending`) with a message starting with
/// `message`.
async fn shop_pending(t: &Tenant, message: &str) {
    let pending = eventually(&format!("shop pending: {message}"), || {
        route_condition(&t.api, "tenant-a", "shop", "Accepted").filter(|c| {
            c["status"] == "Unknown"
                && c["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with(message))
        })
    })
    .await;
    assert_eq!(pending["reason"], "Pending");
}

/// Waits for route `shop` to be `Accepted=True`, and checks it was not before its tunnel's
/// document carried it.
async fn shop_accepted_once_documented(t: &Tenant, cloudflare: &CloudflareApi, early: &AtomicBool) {
    eventually("shop accepted", || {
        route_condition(&t.api, "tenant-a", "shop", "Accepted").filter(|c| c["status"] == "True")
    })
    .await;
    assert!(
        !early.load(Ordering::SeqCst),
        "Accepted=True went out before the tunnel's document carried the route"
    );
    assert!(cloudflare
        .config("acct", TUNNEL_ID)
        .is_some_and(|(_, d)| d.to_string().contains("shop.example.com")));
    assert!(t
        .api
        .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
        .is_some());
}

fn plane_deployment_write(c: &Call<'_>) -> bool {
    c.method == "PATCH"
        && c.kind == "Deployment"
        && c.body.pointer("/metadata/namespace") == Some(&json!("tenant-a"))
}

/// A new Gateway's routes are not accepted while its plane is being applied: no pod serves
/// them and its tunnel's document lacks them. They are once both are there.
#[tokio::test]
async fn a_new_gateways_routes_wait_while_its_plane_is_applied() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut held = None;
        let (cloudflare, t, early, _watching) = new_plane(|api| {
            held = Some(api.hold(plane_deployment_write));
        })
        .await;
        let hold = held.expect("the plane's apply is held");
        shop_pending(&t, "the Gateway's data plane is being applied").await;
        t.rounds(2, Duration::from_millis(300)).await;
        assert!(
            cloudflare.config("acct", TUNNEL_ID).is_none(),
            "no document before the plane"
        );
        hold.release();
        shop_accepted_once_documented(&t, &cloudflare, &early).await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A new Gateway whose first apply fails: its routes say so, `Accepted=Unknown`, not
/// `Accepted=True` with no pod and no document; accepted once the plane is applied.
#[tokio::test]
async fn a_new_gateways_routes_wait_while_its_first_apply_fails() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut failing = None;
        let (cloudflare, t, early, _watching) = new_plane(|api| {
            failing = Some(api.fail(500, plane_deployment_write));
        })
        .await;
        let failing = failing.expect("the plane's apply fails");
        shop_pending(&t, "the Gateway's data plane could not be applied: ").await;
        t.rounds(2, Duration::from_millis(300)).await;
        assert!(!early.load(Ordering::SeqCst));
        drop(failing);
        shop_accepted_once_documented(&t, &cloudflare, &early).await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Whether `call` writes the status of HTTPRoute tenant-a/intranet (its parent Gateway
/// `internal`) saying it is accepted.
fn intranet_accepted_written(call: &Call<'_>) -> bool {
    route_status_in(call, "tenant-a")
        && call
            .body
            .pointer("/status/parents")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|p| p["parentRef"]["name"] == "internal")
            .filter_map(|p| condition(&p["conditions"], "Accepted"))
            .any(|a| a["status"] == "True")
}

/// A new Gateway whose first apply fails, on a tunnel whose only other plane is a broken
/// Gateway's (its GatewayConfig gone): the broken plane keeps serving its own routes as they
/// last were, not the new Gateway's, so these wait, `Accepted=Unknown`, and are never
/// accepted meanwhile.
#[tokio::test]
async fn a_new_gateways_routes_wait_while_its_first_apply_fails_beside_a_broken_plane_on_its_tunnel(
) {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (t, edge) = Tenant::with_pod("replicas: 1").await;
        shop_serves(&edge, 200).await;
        // Gateway edge breaks: its plane keeps serving what it last served.
        t.api.put(yaml(
            &super::gateway(true).replace("name: edge-config", "name: gone"),
        ));
        eventually("edge refused", || {
            t.api
                .get(
                    "gateway.networking.k8s.io/v1",
                    "Gateway",
                    "tenant-a",
                    "edge",
                )
                .and_then(|g| condition(&g["status"]["conditions"], "Accepted").cloned())
                .filter(|c| c["reason"] == "InvalidParameters")
        })
        .await;
        t.rounds(2, Duration::from_millis(300)).await;
        shop_serves(&edge, 200).await;

        let accepted = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&accepted);
        let _watching = t.api.forbid(move |c| {
            if intranet_accepted_written(c) {
                flag.store(true, Ordering::SeqCst);
            }
            false
        });
        let _failing = t.api.fail(500, plane_deployment_write);
        // Gateway internal, new, on edge's tunnel.
        let same = Token::new("acct", b"tunnel secret".to_vec(), uuid_of(TUNNEL_ID)).encode();
        let internal = super::dedicated_gateway(
            "tenant-a",
            "internal",
            &same,
            Some("internal.example.com"),
        );
        for doc in internal.split("\n---\n").filter(|d| !d.trim().is_empty()) {
            t.api.put(yaml(doc));
        }
        t.api.put(yaml(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: intranet, namespace: tenant-a}\nspec:\n  parentRefs: [{name: internal}]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n",
        ));
        let pending = eventually("intranet pending", || {
            route_condition(&t.api, "tenant-a", "intranet", "Accepted").filter(|c| {
                c["status"] == "Unknown"
                    && c["message"].as_str().is_some_and(|m| {
                        m.starts_with("the Gateway's data plane could not be applied: ")
                    })
            })
        })
        .await;
        assert_eq!(pending["reason"], "Pending");
        t.rounds(3, Duration::from_millis(300)).await;
        assert!(
            !accepted.load(Ordering::SeqCst),
            "intranet was written accepted: {:?}",
            route_condition(&t.api, "tenant-a", "intranet", "Accepted")
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A plane whose pods are all down (their config ports refuse connections, and none is
/// serving: an image that cannot be pulled, a crash loop) serves nothing: after the sustained
/// rounds its routes say so. A pod that takes the config clears it.
#[tokio::test]
async fn a_plane_whose_pods_are_all_down_is_reported_on_its_routes() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (down, _held) = closed_port();
        let t = Tenant::start_with("replicas: 1", |api| {
            api.put(config_slice(
                "tenant-a",
                "cf-proxy-edge-config",
                down,
                false,
            ));
        })
        .await;
        let failed = eventually("ProxyConfigPushed=False", || {
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
        })
        .await;
        assert_eq!(failed["status"], "False");
        assert_eq!(failed["reason"], "PushFailed");
        let message = failed["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(
                "the proxy pods have not taken the config: every pod of the plane is down"
            ),
            "{message}"
        );
        assert!(
            message.contains(&format!("127.0.0.1:{down}: connecting to 127.0.0.1")),
            "{message}"
        );

        let edge = proxy_pod("s3cr3t").await;
        t.api.put(config_slice(
            "tenant-a",
            "cf-proxy-edge-config",
            edge.admin_addr().port(),
            false,
        ));
        shop_serves(&edge, 200).await;
        eventually("ProxyConfigPushed gone", || {
            route_parent(&t.api, "tenant-a", "shop")
                .filter(|p| condition(&p["conditions"], PROXY_CONFIG_PUSHED).is_none())
        })
        .await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The name of the plane's pod in [`plane_pod`].
const PLANE_POD: &str = "cf-proxy-edge-7c9d5b8f6-q2xkz";

/// tenant-a/edge's plane's pod on 127.0.0.1, where [`config_slice`] lists it, as the kubelet
/// reports it: Pending, never started, its proxy container waiting for `reason`.
fn plane_pod(reason: &str, message: &str) -> Value {
    plane_pod_named(PLANE_POD, reason, message)
}

/// [`plane_pod`], named `name`: the pod that replaces it.
fn plane_pod_named(name: &str, reason: &str, message: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "tenant-a",
            "labels": {
                "app.kubernetes.io/managed-by": "cftunnel-controller",
                "app.kubernetes.io/name": "cftunnel-proxy",
                "cf.k8s.lex.la/gateway": "edge",
            },
        },
        "spec": {"containers": [{"name": "proxy", "image": "proxy:1"}]},
        "status": {
            "phase": "Pending",
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "containerStatuses": [{
                "name": "proxy", "image": "proxy:1", "imageID": "", "ready": false,
                "restartCount": 0, "started": false,
                "state": {"waiting": {"reason": reason, "message": message}},
            }],
        },
    })
}

/// The shared pool's pods are the chart's, not the controller's, and their state is read
/// all the same: the pool's only pod cannot pull its image, and the route the pool serves is
/// told so, naming the pod.
#[tokio::test]
async fn the_shared_pools_pods_are_told_of_as_a_planes_are() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let echo = support::echo("tenant-s", "web-s").await;
        let (down, _held) = closed_port();
        let pool_pod = "cftunnel-proxy-6b7f9c4d8-x2x9k";
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                let pool = std::net::SocketAddr::from(([127, 0, 0, 1], down));
                for doc in shared_seed(pool, echo.http_addr()).split("\n---\n") {
                    if !doc.trim().is_empty() && !doc.contains("kind: EndpointSlice") {
                        api.put(yaml(doc));
                    }
                }
                api.put(config_slice(
                    "cftunnel-system",
                    "cftunnel-proxy",
                    down,
                    false,
                ));
                // As the chart labels it.
                let mut pod = plane_pod_named(
                    pool_pod,
                    "ImagePullBackOff",
                    "Back-off pulling image proxy:1",
                );
                pod["metadata"]["namespace"] = json!("cftunnel-system");
                pod["metadata"]["labels"] = json!({
                    "app.kubernetes.io/name": "cftunnel-proxy",
                    "app.kubernetes.io/instance": "cftunnel",
                    "app.kubernetes.io/managed-by": "Helm",
                });
                api.put(pod);
            },
            ApiServer::client,
            |options| {
                options.shared = Some(seeded_shared_plane());
            },
        )
        .await;
        let failed = eventually("ProxyConfigPushed=False on www", || {
            route_condition(&t.api, "tenant-s", "www", PROXY_CONFIG_PUSHED)
        })
        .await;
        assert_eq!(failed["reason"], "PushFailed");
        let message = failed["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!(
                "pod {pool_pod}: container proxy cannot pull image proxy:1 (ImagePullBackOff)"
            )),
            "{message}"
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A controller that takes over from one that told the shared pool's route its pods had not
/// taken the config, and cannot push to the pool at all (its config-API token unreadable: the
/// Secret gone), keeps the report only as long as it would keep a run of failures with no pod
/// listed (2 s here), not for good.
#[tokio::test]
async fn a_new_leader_that_cannot_push_to_a_plane_keeps_what_was_told_of_it_for_a_while() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let echo = support::echo("tenant-s", "web-s").await;
        let (down, _held) = closed_port();
        let shared = |options: &mut RuntimeOptions| {
            options.podless_keep = Duration::from_secs(2);
            options.shared = Some(seeded_shared_plane());
        };
        let mut t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                let pool = std::net::SocketAddr::from(([127, 0, 0, 1], down));
                for doc in shared_seed(pool, echo.http_addr()).split("\n---\n") {
                    if !doc.trim().is_empty() {
                        api.put(yaml(doc));
                    }
                }
            },
            ApiServer::client,
            shared,
        )
        .await;
        eventually("ProxyConfigPushed=False on www", || {
            route_condition(&t.api, "tenant-s", "www", PROXY_CONFIG_PUSHED)
        })
        .await;
        // The token goes while no route status can be written, and the lead changes hands.
        let frozen = t
            .api
            .forbid(|c| c.method == "PATCH" && c.kind == "HTTPRoute" && c.name == Some("www"));
        assert!(t
            .api
            .delete("v1", "Secret", "cftunnel-system", "shared-auth"));
        let rounds = rounds(&t);
        t.restart(shared).await;
        drop(frozen);
        // From the new controller's first round, which comes after it took the lead.
        eventually("the new controller's first round", || {
            (self::rounds(&t) > rounds).then_some(())
        })
        .await;
        let first_round = Instant::now();
        t.rounds(2, Duration::from_millis(300)).await;
        assert!(
            route_condition(&t.api, "tenant-s", "www", PROXY_CONFIG_PUSHED).is_some(),
            "kept at first"
        );
        eventually("ProxyConfigPushed gone from www", || {
            route_condition(&t.api, "tenant-s", "www", PROXY_CONFIG_PUSHED)
                .is_none()
                .then_some(())
        })
        .await;
        // The first round is seen once it has ended, and up to a poll late.
        assert!(
            first_round.elapsed() >= Duration::from_millis(1500),
            "{:?}",
            first_round.elapsed()
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Whether `call` reports a push failure: a route status with `ProxyConfigPushed`, or a
/// `ProxyConfigPushFailed` Event.
fn push_failure_reported(call: &Call<'_>) -> bool {
    let condition = call.method == "PATCH"
        && call.kind == "HTTPRoute"
        && call.body.to_string().contains(PROXY_CONFIG_PUSHED);
    let event = call.method == "POST"
        && call.kind == "Event"
        && call.body["reason"] == "ProxyConfigPushFailed";
    condition || event
}

/// Failed pushes to tenant-a/edge's pods so far, on `/metrics`.
fn failed_pushes(t: &Tenant) -> u64 {
    push_failures(&t.health, "tenant-a/edge")
}

/// `cftunnel_controller_push_failing_planes` on `/metrics`.
fn failing_planes(t: &Tenant) -> Option<u64> {
    let text = t.health.metrics_text().ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("cftunnel_controller_push_failing_planes "))
        .and_then(|n| n.trim().parse().ok())
}

/// A plane whose only pod is still being created (its image being pulled) fails its pushes
/// past the sustained rounds, and nothing is reported: no `ProxyConfigPushed=False`, no
/// Event. Once the pod's container waits for `ImagePullBackOff`, the route says so, naming the
/// pod and its image, and says the same while the kubelet retries (`ErrImagePull`, another
/// message); the pod replaced by one being created again, the route stays reported, with no
/// second Event; a pod that takes the config clears it. `cftunnel_controller_push_failing_planes`
/// counts the plane from its first report on, not before.
#[tokio::test]
async fn a_plane_whose_pods_are_still_being_created_is_reported_only_once_they_fail() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let (down, _held) = closed_port();
        let reported = Arc::new(AtomicBool::new(false));
        let mut watching = None;
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    down,
                    false,
                ));
                api.put(plane_pod("ContainerCreating", ""));
                let flag = Arc::clone(&reported);
                watching = Some(api.forbid(move |c| {
                    if push_failure_reported(c) {
                        flag.store(true, Ordering::SeqCst);
                    }
                    false
                }));
            },
            ApiServer::client,
            // The stand-in stamps every object created at 2026-12-01T00:00:00Z: a grace that
            // long ago keeps the pod starting.
            |options| options.start_grace = Duration::from_secs(100 * 365 * 86_400),
        )
        .await;
        // Past the sustained rounds (three), and a few rounds' status writes after.
        eventually("four failed pushes", || {
            (failed_pushes(&t) >= 4).then_some(())
        })
        .await;
        t.rounds(3, Duration::from_millis(300)).await;
        assert!(
            !reported.load(Ordering::SeqCst),
            "a push failure was reported: {:?}; Events {:?}",
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED),
            events_about(&t.api, "shop")
        );
        // Nor counted as failing.
        assert_eq!(failing_planes(&t), Some(0));

        // The kubelet gives up pulling the image.
        t.api.put(plane_pod(
            "ImagePullBackOff",
            "Back-off pulling image proxy:1",
        ));
        let failed = eventually("ProxyConfigPushed=False", || {
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
        })
        .await;
        assert_eq!(failed["status"], "False");
        assert_eq!(failed["reason"], "PushFailed");
        let message = failed["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(&format!(
                "the proxy pods have not taken the config: every pod of the plane is down (its \
                 config port refuses connections and it is not serving): pod {PLANE_POD}: \
                 container proxy cannot pull image proxy:1 (ImagePullBackOff); \
                 127.0.0.1:{down}: "
            )),
            "{message}"
        );
        let event = eventually("a ProxyConfigPushFailed Event", || {
            t.api
                .list("Event")
                .into_iter()
                .find(|e| e["reason"] == "ProxyConfigPushFailed")
        })
        .await;
        let note = event["note"].as_str().unwrap_or_default();
        assert!(note.contains("ImagePullBackOff"), "{note}");
        eventually("the plane counted as failing", || {
            (failing_planes(&t) == Some(1)).then_some(())
        })
        .await;

        // The kubelet retries the pull: the route says the same.
        t.api.put(plane_pod(
            "ErrImagePull",
            "rpc error: code = NotFound desc = failed to pull and unpack image \"proxy:1\"",
        ));
        t.rounds(3, Duration::from_millis(300)).await;
        let again = route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED);
        assert_eq!(
            again.as_ref().and_then(|c| c["message"].as_str()),
            Some(message),
            "{again:?}"
        );

        // The pod is replaced by one being created: pushes still fail, so the route stays
        // reported, now saying so, with no second Event; and so while no pod is listed at all
        // (the successor not scheduled yet).
        t.api.put(empty_config_slice());
        assert!(t.api.delete("v1", "Pod", "tenant-a", PLANE_POD));
        t.rounds(3, Duration::from_millis(300)).await;
        let listless = route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED);
        assert_eq!(
            listless.as_ref().map(|c| &c["message"]),
            Some(&failed["message"]),
            "still reported with no pod listed"
        );
        assert_eq!(failing_planes(&t), Some(1));
        t.api.put(config_slice(
            "tenant-a",
            "cf-proxy-edge-config",
            down,
            false,
        ));
        let replacement = "cf-proxy-edge-7c9d5b8f6-r8wtn";
        t.api
            .put(plane_pod_named(replacement, "ContainerCreating", ""));
        let recreated = eventually("the route told the pods are created again", || {
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED).filter(|c| {
                c["message"].as_str().is_some_and(|m| {
                    m.contains(&format!(
                        "its pods are being created again (pod {replacement}: ContainerCreating)"
                    ))
                })
            })
        })
        .await;
        assert_eq!(recreated["status"], "False");
        t.rounds(3, Duration::from_millis(300)).await;
        let still = route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED);
        assert_eq!(
            still.as_ref().map(|c| &c["message"]),
            Some(&recreated["message"])
        );
        assert_eq!(failing_planes(&t), Some(1));
        assert_eq!(
            times_told(&t.api, "shop", "ProxyConfigPushFailed"),
            1,
            "{:?}",
            events_about(&t.api, "shop")
        );

        let edge = proxy_pod("s3cr3t").await;
        t.api.put(config_slice(
            "tenant-a",
            "cf-proxy-edge-config",
            edge.admin_addr().port(),
            false,
        ));
        shop_serves(&edge, 200).await;
        eventually("ProxyConfigPushed gone", || {
            route_parent(&t.api, "tenant-a", "shop")
                .filter(|p| condition(&p["conditions"], PROXY_CONFIG_PUSHED).is_none())
        })
        .await;
        drop(watching);
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A controller that takes over (a restart here, as for another replica taking the lead) from
/// one that told a plane's routes their pods have not taken the config goes on from what their
/// status says: it sends no second Event for the same run of failures, and, the pod replaced
/// by one being created, keeps the route reported ("being created again") rather than take the
/// report back for the start grace.
#[tokio::test]
async fn a_new_leader_goes_on_from_the_push_failure_an_earlier_one_told() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let (down, _held) = closed_port();
        let grace = |options: &mut RuntimeOptions| {
            options.start_grace = Duration::from_secs(100 * 365 * 86_400);
        };
        let mut t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    down,
                    false,
                ));
                api.put(plane_pod(
                    "ImagePullBackOff",
                    "Back-off pulling image proxy:1",
                ));
            },
            ApiServer::client,
            grace,
        )
        .await;
        let failed = eventually("ProxyConfigPushed=False", || {
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
        })
        .await;
        assert_eq!(failed["reason"], "PushFailed");
        eventually("a ProxyConfigPushFailed Event", || {
            (times_told(&t.api, "shop", "ProxyConfigPushFailed") == 1).then_some(())
        })
        .await;

        // From here on, no status of shop's written without the report.
        let (dropped, _watching) = written_without(&t.api, "shop", PROXY_CONFIG_PUSHED);

        // Same pod, same failure: the new controller's rounds tell nothing new, its own run
        // of failures reported (past the sustained rounds, three) included.
        let before = failed_pushes(&t);
        t.restart(grace).await;
        eventually("the new controller's failed pushes", || {
            (failed_pushes(&t) >= before + 4).then_some(())
        })
        .await;
        t.rounds(3, Duration::from_millis(300)).await;
        assert_eq!(
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
                .map(|c| c["message"].clone()),
            Some(failed["message"].clone())
        );
        assert_eq!(
            times_told(&t.api, "shop", "ProxyConfigPushFailed"),
            1,
            "{:?}",
            events_about(&t.api, "shop")
        );

        // The pod gone, its successor not listed yet, as the lead changes hands again: no
        // pod is listed to push to, and the report stands.
        assert!(t.api.delete("v1", "Pod", "tenant-a", PLANE_POD));
        t.api.put(empty_config_slice());
        t.restart(grace).await;
        t.rounds(3, Duration::from_millis(300)).await;
        assert_eq!(
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
                .map(|c| c["message"].clone()),
            Some(failed["message"].clone()),
            "kept with no pod listed"
        );
        // The successor, being created.
        let replacement = "cf-proxy-edge-7c9d5b8f6-r8wtn";
        t.api.put(config_slice(
            "tenant-a",
            "cf-proxy-edge-config",
            down,
            false,
        ));
        t.api
            .put(plane_pod_named(replacement, "ContainerCreating", ""));
        let recreated = eventually("the route told the pods are created again", || {
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED).filter(|c| {
                c["message"].as_str().is_some_and(|m| {
                    m.contains(&format!(
                        "its pods are being created again (pod {replacement}: ContainerCreating)"
                    ))
                })
            })
        })
        .await;
        assert_eq!(recreated["status"], "False");
        t.rounds(3, Duration::from_millis(300)).await;
        assert_eq!(
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
                .map(|c| c["message"].clone()),
            Some(recreated["message"].clone()),
            "still reported"
        );
        assert_eq!(failing_planes(&t), Some(1));
        assert_eq!(
            times_told(&t.api, "shop", "ProxyConfigPushFailed"),
            1,
            "{:?}",
            events_about(&t.api, "shop")
        );
        assert!(
            !dropped.load(Ordering::SeqCst),
            "a new controller wrote the route's status without the report"
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A plane reported failing whose pods are then all gone (scaled to zero) is reported no more
/// once no pod has been listed for a while (2 s here): nothing is pushed that could fail.
#[tokio::test]
async fn a_reported_plane_scaled_to_zero_is_reported_no_more() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (down, _held) = closed_port();
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    down,
                    false,
                ));
                api.put(plane_pod(
                    "ImagePullBackOff",
                    "Back-off pulling image proxy:1",
                ));
            },
            ApiServer::client,
            |options| options.podless_keep = Duration::from_secs(2),
        )
        .await;
        eventually("ProxyConfigPushed=False", || {
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
        })
        .await;
        eventually("the plane counted as failing", || {
            (failing_planes(&t) == Some(1)).then_some(())
        })
        .await;

        t.api.put(empty_config_slice());
        assert!(t.api.delete("v1", "Pod", "tenant-a", PLANE_POD));
        let since = Instant::now();
        // Rounds keep coming meanwhile (a resync does too, later).
        while route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED).is_some() {
            assert!(
                since.elapsed() < Duration::from_secs(20),
                "still reported with no pod listed for long"
            );
            t.rounds(1, Duration::from_millis(300)).await;
        }
        assert!(
            since.elapsed() >= Duration::from_secs(2),
            "not before the keep"
        );
        assert_eq!(failing_planes(&t), Some(0));
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// [`internal_failing_beside_edge`], `shop` (on `edge`) and `intranet` told `internal`'s
/// failure; then, while no route status can be written, `change` run on the API server and the
/// lead changing hands (a restart) to a controller `tune` changes: the controller, the moment
/// it started, and what the first one set up.
async fn internal_changed_as_the_lead_changes_hands(
    change: impl FnOnce(&ApiServer),
    tune: impl FnOnce(&mut RuntimeOptions),
) -> (
    Tenant,
    Instant,
    (Server, CloudflareApi, tokio::net::TcpSocket),
) {
    let (mut t, edge, (cloudflare, held)) = internal_failing_beside_edge().await;
    eventually("shop's ProxyConfigPushFailed", || {
        (times_told(&t.api, "shop", "ProxyConfigPushFailed") == 1).then_some(())
    })
    .await;
    eventually("intranet told internal's failure", || {
        route_condition(&t.api, "tenant-a", "intranet", PROXY_CONFIG_PUSHED)
            .filter(|c| c["reason"] == "PushFailed")
    })
    .await;
    let frozen = t
        .api
        .forbid(|c| c.method == "PATCH" && c.kind == "HTTPRoute");
    change(&t.api);
    let base = cloudflare.base();
    let restarted = Instant::now();
    t.restart(|options| {
        options.cloudflare_api_base = base;
        tune(options);
    })
    .await;
    // Lifted before the new controller's first round (it has not run yet).
    drop(frozen);
    (t, restarted, (edge, cloudflare, held))
}

/// `internal`'s config EndpointSlice, listing no pod.
fn internal_without_pods(api: &ApiServer) {
    let mut slice = config_slice("tenant-a", "cf-proxy-internal-config", 8081, true);
    slice["endpoints"] = json!([]);
    api.put(slice);
}

/// A controller that takes over from one that told `internal`'s route its pods had not taken
/// the config, and `shop` (on `edge`, the same tunnel) the same, finds no pod of `internal`
/// listed (they were deleted as the lead changed hands). Nothing it pushes reaches `internal`,
/// so its route keeps the report only as long as this process would keep a run of failures
/// with no pod listed (3 s here), not for good; and `internal`, running no connector, holds
/// up no report of `shop`'s meanwhile: `edge`'s pushes decide that.
#[tokio::test]
async fn a_new_leader_keeps_a_podless_planes_report_for_a_while_and_on_its_own_routes() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let keep = Duration::from_secs(3);
        let (t, restarted, _held) =
            internal_changed_as_the_lead_changes_hands(internal_without_pods, |options| {
                options.podless_keep = keep;
            })
            .await;
        let intranet = || route_condition(&t.api, "tenant-a", "intranet", PROXY_CONFIG_PUSHED);
        eventually("shop told internal's failure no more", || {
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
                .is_none()
                .then_some(())
        })
        .await;
        assert!(
            restarted.elapsed() < keep - Duration::from_secs(1),
            "shop's report held by internal: {:?}",
            restarted.elapsed()
        );
        assert_eq!(
            intranet().map(|c| c["reason"].clone()),
            Some(json!("PushFailed")),
            "internal's own route keeps it"
        );
        eventually("intranet told internal's failure no more", || {
            intranet().is_none().then_some(())
        })
        .await;
        assert!(restarted.elapsed() >= keep, "{:?}", restarted.elapsed());
        assert_eq!(times_told(&t.api, "shop", "ProxyConfigPushFailed"), 1);
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A controller that takes over from one that told `shop` (on `edge`) the failure of
/// `internal`'s pods on its tunnel keeps the report while `internal`'s pushes go on failing
/// with no verdict of its own yet, though `edge`'s pods take the config: and also through
/// rounds in which `edge` has no pod listed (its pod replaced, the successor not listed yet),
/// `edge` being on `internal`'s tunnel all the same. `shop`'s status is never written without
/// it.
#[tokio::test]
async fn a_new_leader_keeps_a_tunnel_peers_failure_through_rounds_the_routes_plane_has_no_pod() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (t, _, (edge, _cloudflare, _held)) = internal_changed_as_the_lead_changes_hands(
            |_| {},
            |options| {
                // No verdict on internal's failures within the test.
                options.sustained_for = Duration::from_secs(600);
            },
        )
        .await;
        let (dropped, _watching) = written_without(&t.api, "shop", PROXY_CONFIG_PUSHED);
        let first = rounds(&t);
        // edge's pushes taken: its own verdict.
        eventually("the new controller's rounds", || {
            (rounds(&t) >= first + 2).then_some(())
        })
        .await;
        t.api.put(empty_config_slice());
        t.rounds(3, Duration::from_millis(300)).await;
        t.api.put(config_slice(
            "tenant-a",
            "cf-proxy-edge-config",
            edge.admin_addr().port(),
            true,
        ));
        t.rounds(2, Duration::from_millis(300)).await;
        assert!(
            !dropped.load(Ordering::SeqCst),
            "shop's status was written without the report"
        );
        assert!(route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED).is_some());
        assert_eq!(times_told(&t.api, "shop", "ProxyConfigPushFailed"), 1);
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A controller that takes over from one that told `shop` (on `edge`) the failure of
/// `internal`'s pods on its tunnel, and finds `internal`'s only pod replaced by one being
/// created (within the start grace): once its own rounds judge `internal`'s pods all starting,
/// that is its verdict on `internal`, which runs no connector and so fails no route of
/// `edge`'s. `shop`'s report goes, with no Event.
#[tokio::test]
async fn a_new_leader_takes_back_a_tunnel_peers_failure_once_that_planes_pods_are_all_starting() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (down, _down) = closed_port();
        let (t, _, _held) = internal_changed_as_the_lead_changes_hands(
            |api| {
                // Only shop carries the failure: internal was told nothing of its own.
                assert!(api.delete(
                    "gateway.networking.k8s.io/v1",
                    "HTTPRoute",
                    "tenant-a",
                    "intranet"
                ));
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-internal-config",
                    down,
                    false,
                ));
                api.put(plane_pod_named(
                    "cf-proxy-internal-5d8c7b9f4-k3lmn",
                    "ContainerCreating",
                    "",
                ));
            },
            |options| options.start_grace = Duration::from_secs(100 * 365 * 86_400),
        )
        .await;
        let before = internal_failures(&t);
        eventually("shop told internal's failure no more", || {
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
                .is_none()
                .then_some(())
        })
        .await;
        // Past the sustained rounds (three) of the new controller's own failed pushes.
        assert!(
            internal_failures(&t) >= before + 3,
            "{}",
            internal_failures(&t)
        );
        assert_eq!(failing_planes(&t), Some(0), "starting, not reported");
        assert_eq!(times_told(&t.api, "shop", "ProxyConfigPushFailed"), 1);
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A controller that takes over from one that told a route a rule of it was refused, and finds
/// the pool upgraded: its pod takes the rule now, and a second pod is listed down and not
/// serving (its config port refusing connections, not ready). That pod holds no config, so
/// the up pod's answer is the pool's: the refusal is taken back though not every listed pod
/// answered, and nothing is reported of the down one. The pool rolled back to the older
/// release then (the same pod, the route unchanged), the refusal is new, and told.
#[tokio::test]
async fn a_refusal_a_new_leader_kept_goes_once_the_up_pod_takes_the_rule_beside_a_down_one() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (echo, pool, older) = older_pool().await;
        let (api, stop, controller) = on_the_pool(
            older.addr(),
            echo.http_addr(),
            &format!("---\n{CORS_ROUTE}"),
        )
        .await;
        eventually("RuleRefused on the CORS route", || {
            route_condition(&api, "tenant-s", "cors", PROXY_CONFIG_PUSHED)
                .filter(|c| c["reason"] == "RuleRefused")
        })
        .await;
        eventually("a ProxyRuleRefused Event", || {
            (rule_refusals_told(&api) == 1).then_some(())
        })
        .await;
        stop_controller(stop, controller).await;

        let (down, _down) = closed_port();
        api.put(pool_slice(pool.admin_addr().port(), true));
        api.put(config_slice(
            "cftunnel-system",
            "cftunnel-proxy",
            down,
            false,
        ));
        let (stop, controller, _) = pool_controller(&api);
        eventually("the refusal taken back", || {
            route_condition(&api, "tenant-s", "cors", PROXY_CONFIG_PUSHED)
                .is_none()
                .then_some(())
        })
        .await;
        let served = cftunnel_controller::push::served_document(
            pool.admin_addr(),
            "pool-secret",
            Duration::from_secs(5),
        )
        .await
        .expect("the pool's document");
        assert!(
            served
                .rules
                .iter()
                .any(|r| r.name.as_deref() == Some("tenant-s/cors/0")),
            "the up pod serves the rule"
        );
        assert!(route_condition(&api, "tenant-s", "www", PROXY_CONFIG_PUSHED).is_none());
        assert_eq!(rule_refusals_told(&api), 1);

        api.put(pool_slice(older.addr().port(), true));
        // The pod holds the document the upgraded one took (both front one proxy): a route
        // added, the document changes and is pushed, leaving the CORS route as it was.
        api.put(yaml("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: later, namespace: tenant-s}\nspec:\n  parentRefs: [{name: public}]\n  rules:\n  - matches: [{path: {type: Exact, value: /cart}}]\n    filters: [{type: RequestRedirect, requestRedirect: {hostname: shop.example.com}}]\n"));
        eventually("the refusal told again", || {
            (rule_refusals_told(&api) == 2).then_some(())
        })
        .await;
        eventually("RuleRefused on the CORS route again", || {
            route_condition(&api, "tenant-s", "cors", PROXY_CONFIG_PUSHED)
                .filter(|c| c["reason"] == "RuleRefused")
        })
        .await;
        stop_controller(stop, controller).await;
    })
    .await
    .expect("in time");
}

/// The plane's config EndpointSlice, listing no pod.
fn empty_config_slice() -> Value {
    yaml(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: cf-proxy-edge-config-x1, namespace: tenant-a, labels: {kubernetes.io/service-name: cf-proxy-edge-config, endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io}}\naddressType: IPv4\nports: [{name: config, port: 8081}]\nendpoints: []\n",
    )
}

/// A plane whose only pod stays `ContainerCreating` past the grace (a few seconds here; the
/// stand-in stamps the pod days ago) is reported, and counted in
/// `cftunnel_controller_push_failing_planes`, in words that do not change from round to round
/// (no count of how long), with one Event.
#[tokio::test]
async fn a_plane_whose_pods_stay_created_past_the_grace_is_reported_in_words_that_stay() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let (down, _held) = closed_port();
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    down,
                    false,
                ));
                api.put(plane_pod("ContainerCreating", ""));
            },
            ApiServer::client,
            |options| options.start_grace = Duration::from_secs(5),
        )
        .await;
        let failed = eventually("ProxyConfigPushed=False", || {
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
        })
        .await;
        assert_eq!(failed["reason"], "PushFailed");
        let message = failed["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(&format!(
                "the proxy pods have not taken the config: every pod of the plane is down (its \
                 config port refuses connections and it is not serving): its pods have been \
                 starting for more than 5 seconds (pod {PLANE_POD}: ContainerCreating); \
                 127.0.0.1:{down}: "
            )),
            "{message}"
        );
        eventually("the plane counted as failing", || {
            (failing_planes(&t) == Some(1)).then_some(())
        })
        .await;
        // Rounds later, it says the same, and was told once.
        t.rounds(3, Duration::from_millis(300)).await;
        let again = route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED);
        assert_eq!(
            again.as_ref().and_then(|c| c["message"].as_str()),
            Some(message),
            "{again:?}"
        );
        assert_eq!(
            times_told(&t.api, "shop", "ProxyConfigPushFailed"),
            1,
            "{:?}",
            events_about(&t.api, "shop")
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The controller's rules without the Pod watch's, as an older chart's ClusterRole grants.
static WITHOUT_PODS: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    REQUIRED_RBAC
        .iter()
        .copied()
        .filter(|(group, resource, _)| (*group, *resource) != ("", "pods"))
        .collect()
});

/// A controller refused the Pod list runs on without the pods' state: a plane whose pods are
/// all down is reported after the sustained rounds with the guess at why, though its pod's
/// container waits for `ImagePullBackOff`.
#[tokio::test]
async fn without_the_pod_list_a_plane_whose_pods_are_all_down_is_reported_with_a_guess() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (down, _held) = closed_port();
        let t = Tenant::start_granted(
            "replicas: 1",
            WITHOUT_PODS.as_slice(),
            |api| {
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    down,
                    false,
                ));
                api.put(plane_pod(
                    "ImagePullBackOff",
                    "Back-off pulling image proxy:1",
                ));
            },
            ApiServer::client,
            |_| {},
        )
        .await;
        let failed = eventually("ProxyConfigPushed=False", || {
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
        })
        .await;
        let message = failed["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(&format!(
                "the proxy pods have not taken the config: every pod of the plane is down (its \
                 config port refuses connections and it is not serving: an image that cannot be \
                 pulled, a crash loop); 127.0.0.1:{down}: "
            )),
            "{message}"
        );
        // It was refused, not merely not asked.
        let refused = t
            .health
            .metrics_text()
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("cftunnel_controller_watch_failures_total{kind=\"Pod\"} "))
            .and_then(|n| n.trim().parse::<u64>().ok());
        assert!(refused.is_some_and(|n| n >= 1), "{refused:?}");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Another controller's conditions on our parent entry of a route stay, as long as the entry
/// has room: Gateway API's CRDs take eight conditions per parent, and refuse the whole status
/// write past that. Ours go in; theirs give way, the last first.
#[tokio::test]
async fn other_controllers_conditions_on_our_route_parent_give_way_to_ours_at_the_cap() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (t, edge) = Tenant::with_pod("replicas: 1").await;
        shop_serves(&edge, 200).await;
        eventually("shop accepted", || {
            route_condition(&t.api, "tenant-a", "shop", "Accepted")
                .filter(|c| c["status"] == "True")
        })
        .await;
        let route = || {
            t.api
                .get(
                    "gateway.networking.k8s.io/v1",
                    "HTTPRoute",
                    "tenant-a",
                    "shop",
                )
                .expect("the route")
        };
        // Six of theirs beside our two: eight, the most the entry takes.
        let mut status = route()["status"].clone();
        let ours = status["parents"]
            .as_array_mut()
            .and_then(|parents| {
                parents
                    .iter_mut()
                    .find(|p| p["controllerName"] == super::CONTROLLER)
            })
            .expect("our parent");
        let theirs: Vec<Value> = (1..=6)
            .map(|i| {
                json!({"type": format!("example.com/Policy{i}Affected"), "status": "True", "reason": "Applied", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"})
            })
            .collect();
        let conditions = ours["conditions"].as_array_mut().expect("conditions");
        assert_eq!(conditions.len(), 2, "{conditions:?}");
        conditions.extend(theirs.iter().cloned());
        let types = |conditions: &Value| -> Vec<String> {
            conditions
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["type"].as_str().map(str::to_owned))
                .collect()
        };
        let mut expected = types(&ours["conditions"]);
        t.api.set_status(
            "gateway.networking.k8s.io/v1",
            "HTTPRoute",
            "tenant-a",
            "shop",
            status,
        );
        // As the CRD's `maxItems` does.
        let _cap = t.api.fail(422, |c| {
            c.method == "PATCH"
                && c.kind == "HTTPRoute"
                && c.body
                    .pointer("/status/parents")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .any(|p| p["conditions"].as_array().is_some_and(|c| c.len() > 8))
        });

        // A third of ours: the plane's pod goes out of reach.
        let (closed, _held) = closed_port();
        t.api.put(config_slice(
            "tenant-a",
            "cf-proxy-edge-config",
            closed,
            true,
        ));
        let parent = eventually("ProxyConfigPushed=False written", || {
            route_parent(&t.api, "tenant-a", "shop")
                .filter(|p| condition(&p["conditions"], PROXY_CONFIG_PUSHED).is_some())
        })
        .await;
        expected.retain(|kind| kind != "example.com/Policy6Affected");
        expected.push(PROXY_CONFIG_PUSHED.to_owned());
        assert_eq!(types(&parent["conditions"]), expected);
        for kept in &theirs[..5] {
            assert_eq!(condition(&parent["conditions"], kept["type"].as_str().unwrap_or_default()), Some(kept));
        }
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The seed's tenants beside the shared pool, whose pod `pool` is listed, on the class tunnel:
/// the one Gateway tenant-a/edge's token opens. `before` runs on the API server too.
async fn beside_the_pool_on_its_tunnel(pool: &Server, before: impl FnOnce(&ApiServer)) -> Tenant {
    let class_token = Token::new("acct", b"tunnel secret".to_vec(), uuid_of(TUNNEL_ID)).encode();
    let pool_port = pool.admin_addr().port();
    Tenant::start_tuned(
        "replicas: 1",
        |api| {
            api.put(yaml("apiVersion: v1\nkind: Secret\nmetadata: {name: shared-auth, namespace: cftunnel-system}\nstringData: {token: pool-secret}\n"));
            api.put(yaml(&format!(
                "apiVersion: v1\nkind: Secret\nmetadata: {{name: class-tunnel, namespace: cftunnel-system}}\nstringData: {{tunnel-token: \"{class_token}\"}}\n"
            )));
            api.put(config_slice("cftunnel-system", "cftunnel-proxy", pool_port, true));
            before(api);
        },
        ApiServer::client,
        |options| {
            options.shared = Some(SharedPlane {
                deployment: None,
                service: ObjectKey::new("cftunnel-system", "cftunnel-proxy"),
                auth_secret: ObjectKey::new("cftunnel-system", "shared-auth"),
                auth_key: "token".to_owned(),
                tunnel_secret: Some((
                    ObjectKey::new("cftunnel-system", "class-tunnel"),
                    "tunnel-token".to_owned(),
                )),
            });
        },
    )
    .await
}

/// Whether `call` writes a status of an HTTPRoute in `namespace` in which our parent's
/// condition `kind` is there and `status` is not `True`.
fn route_status_without(call: &Call<'_>, namespace: &str, kind: &str) -> bool {
    route_status_in(call, namespace)
        && call
            .body
            .pointer("/status/parents")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|p| p["controllerName"] == super::CONTROLLER)
            .filter_map(|p| condition(&p["conditions"], kind))
            .any(|c| c["status"] != "True")
}

/// A Gateway the shared pool serves moves to a plane of its own on the class tunnel (the
/// documented migration), and that plane's first apply fails: the pool, on the same tunnel,
/// serves the Gateway's routes all along, so they stay accepted; they do not go pending for
/// a plane that does not serve them anyway.
#[tokio::test]
async fn routes_the_pool_serves_stay_accepted_while_their_gateways_own_plane_on_its_tunnel_fails_to_apply(
) {
    tokio::time::timeout(Duration::from_secs(60), async {
        let pool = proxy_pod("pool-secret").await;
        let t = beside_the_pool_on_its_tunnel(&pool, |api| {
            api.put(yaml(&super::gateway(false)));
        })
        .await;
        shop_serves(&pool, 200).await;
        eventually("shop accepted", || {
            route_condition(&t.api, "tenant-a", "shop", "Accepted")
                .filter(|c| c["status"] == "True")
        })
        .await;

        let flipped = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&flipped);
        let _watching = t.api.forbid(move |c| {
            if route_status_without(c, "tenant-a", "Accepted") {
                flag.store(true, Ordering::SeqCst);
            }
            false
        });
        let _failing = t.api.fail(500, plane_deployment_write);
        t.api.put(yaml(&super::gateway(true)));
        t.apply_failure_reported().await;
        t.rounds(3, Duration::from_millis(300)).await;
        assert!(
            !flipped.load(Ordering::SeqCst),
            "shop's Accepted left True: {:?}",
            route_condition(&t.api, "tenant-a", "shop", "Accepted")
        );
        let accepted = route_condition(&t.api, "tenant-a", "shop", "Accepted");
        assert_eq!(accepted.map(|c| c["status"].clone()), Some(json!("True")));
        shop_serves(&pool, 200).await;
        t.stop().await;
        pool.shutdown().await;
    })
    .await
    .expect("in time");
}

/// A dedicated plane on the class tunnel whose pods are all down runs no connector, so the
/// edge hands it none of the tunnel's requests: the shared pool, on the same tunnel, serves
/// them. Neither the pool's route nor the plane's own (which the pool serves) reports the
/// plane's failure, which is counted all the same.
#[tokio::test]
async fn a_plane_whose_pods_are_all_down_fails_no_route_the_other_planes_of_its_tunnel_serve() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let pool = proxy_pod("pool-secret").await;
        let echo = support::echo("tenant-s", "web-s").await;
        let (down, _held) = closed_port();
        let alarms = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&alarms);
        let mut watching = None;
        let t = beside_the_pool_on_its_tunnel(&pool, |api| {
            for doc in shared_seed(pool.admin_addr(), echo.http_addr()).split("\n---\n") {
                if !doc.trim().is_empty() {
                    api.put(yaml(doc));
                }
            }
            api.put(config_slice(
                "tenant-a",
                "cf-proxy-edge-config",
                down,
                false,
            ));
            watching = Some(api.forbid(move |c| {
                let alarm = ["tenant-s", "tenant-a"]
                    .iter()
                    .any(|ns| route_status_without(c, ns, PROXY_CONFIG_PUSHED));
                if alarm {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
                false
            }));
        })
        .await;
        host_serves(&pool, "www.example.com", 200).await;
        shop_serves(&pool, 200).await;
        eventually("the plane's failure counted", || {
            let metrics = t.health.metrics_text().ok()?;
            metrics
                .lines()
                .any(|l| l == "cftunnel_controller_push_failing_planes 1")
                .then_some(())
        })
        .await;
        t.rounds(3, Duration::from_millis(300)).await;
        assert_eq!(
            alarms.load(Ordering::SeqCst),
            0,
            "www: {:?}; shop: {:?}",
            route_condition(&t.api, "tenant-s", "www", PROXY_CONFIG_PUSHED),
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
        );
        for (namespace, route) in [("tenant-s", "www"), ("tenant-a", "shop")] {
            let accepted = route_condition(&t.api, namespace, route, "Accepted");
            assert_eq!(
                accepted.map(|c| c["status"].clone()),
                Some(json!("True")),
                "{namespace}/{route}"
            );
        }
        drop(watching);
        t.stop().await;
        pool.shutdown().await;
    })
    .await
    .expect("in time");
}

/// The seed's tenants, with no Deployment of someone else's in the way (which fails a plane at
/// every apply) and no round but those changes start: the resync is a minute.
async fn quiet_tenant(before: impl FnOnce(&ApiServer)) -> Tenant {
    Tenant::start_tuned(
        "replicas: 1",
        |api| {
            api.delete("apps/v1", "Deployment", "tenant-b", "cf-proxy-other");
            before(api);
        },
        ApiServer::client,
        |options| options.resync = Duration::from_secs(60),
    )
    .await
}

/// Route tenant-c/blog, its spec changed: its status's next generation is due.
fn blog_changed(generation: i64) -> Value {
    yaml(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: blog, namespace: tenant-c}}\nspec:\n  parentRefs: [{{name: third}}]\n  rules: [{{backendRefs: [{{name: web, port: 80}}], matches: [{{path: {{type: PathPrefix, value: /v{generation}}}}}]}}]\n"
    ))
}

/// Route tenant-c/blog's `Accepted`, once it says so of `generation`.
fn blog_accepted(api: &ApiServer, generation: i64) -> Option<Value> {
    route_condition(api, "tenant-c", "blog", "Accepted")
        .filter(|c| c["status"] == "True" && c["observedGeneration"] == generation)
}

/// A status write held at the API server while the object changes (here a label: the status
/// the controller computes stays the same) is bound for a conflict, which changes nothing and
/// so starts no round: the round the change starts writes the status afresh at the new
/// resourceVersion, and it lands within moments, not at the next resync a minute later.
#[tokio::test]
async fn a_status_the_object_changed_under_is_written_again_at_its_new_version() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = quiet_tenant(|_| {}).await;
        eventually("blog accepted", || blog_accepted(&t.api, 1)).await;
        super::settled(&t.api).await;

        // The first write of blog's status is held; later ones are not.
        let first = AtomicBool::new(false);
        let held = t
            .api
            .hold(move |c| route_status_in(c, "tenant-c") && !first.swap(true, Ordering::SeqCst));
        t.api.put(blog_changed(2));
        tokio::time::timeout(Duration::from_secs(10), held.arrived(1))
            .await
            .expect("blog's status write held");

        // Someone labels the route: a new resourceVersion, the same status due.
        let routes: kube::Api<kube::core::DynamicObject> = kube::Api::namespaced_with(
            t.api.user_client(),
            "tenant-c",
            &kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
                "gateway.networking.k8s.io",
                "v1",
                "HTTPRoute",
            )),
        );
        routes
            .patch(
                "blog",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"labels": {"team": "blue"}}})),
            )
            .await
            .expect("the label added");
        let labelled = Instant::now();
        // More than a round passes; then the held write is answered, with a conflict.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        held.release();
        super::within(4, "blog's new generation written", || {
            blog_accepted(&t.api, 2)
        })
        .await;
        assert!(
            labelled.elapsed() < Duration::from_secs(6),
            "written {:?} after the label",
            labelled.elapsed()
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A status write that failed waits before it is sent again, and is sent again once the wait
/// is over (5 s) though nothing else starts a round: the resync is a minute.
#[tokio::test]
async fn a_failed_status_write_is_sent_again_once_its_wait_is_over() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = quiet_tenant(|_| {}).await;
        eventually("blog accepted", || blog_accepted(&t.api, 1)).await;
        super::settled(&t.api).await;

        let first = AtomicBool::new(false);
        let failing = t.api.fail(500, move |c| {
            route_status_in(c, "tenant-c") && !first.swap(true, Ordering::SeqCst)
        });
        t.api.put(blog_changed(2));
        tokio::time::timeout(Duration::from_secs(10), failing.refused(1))
            .await
            .expect("blog's status write failed");
        let failed = Instant::now();
        super::within(10, "blog's new generation written", || {
            blog_accepted(&t.api, 2)
        })
        .await;
        assert!(
            failed.elapsed() >= Duration::from_secs(4),
            "sent again after {:?}, before its wait was over",
            failed.elapsed()
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A status write refused as a conflict (the object changed, and the watch has not brought its
/// newer version yet) is not sent again at the same version round after round: the newer
/// version's watch event starts the round that writes it afresh.
#[tokio::test]
async fn a_status_write_refused_as_a_conflict_waits_for_the_objects_newer_version() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = quiet_tenant(|_| {}).await;
        eventually("blog accepted", || blog_accepted(&t.api, 1)).await;
        super::settled(&t.api).await;

        let sent = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&sent);
        let conflict = t.api.fail(409, move |c| {
            let blog = route_status_in(c, "tenant-c");
            if blog {
                counted.fetch_add(1, Ordering::SeqCst);
            }
            blog
        });
        t.api.put(blog_changed(2));
        tokio::time::timeout(Duration::from_secs(10), conflict.refused(1))
            .await
            .expect("blog's status write refused");
        // Rounds meanwhile, other objects changing: none sends it again.
        t.rounds(7, Duration::from_millis(300)).await;
        let n = sent.load(Ordering::SeqCst);
        assert!(n <= 2, "sent {n} times at the same version");

        // The object's newer version seen (here a label), the status is written at it.
        conflict.lift();
        let routes: kube::Api<kube::core::DynamicObject> = kube::Api::namespaced_with(
            t.api.user_client(),
            "tenant-c",
            &kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
                "gateway.networking.k8s.io",
                "v1",
                "HTTPRoute",
            )),
        );
        routes
            .patch(
                "blog",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"labels": {"team": "blue"}}})),
            )
            .await
            .expect("the label added");
        super::within(5, "blog's new generation written", || {
            blog_accepted(&t.api, 2)
        })
        .await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A plane whose pushes failed, scaled to zero (its slice lists no pod): the run of failures
/// ends once it has had no pod for as long as such a run is kept (1 s here), at a round due
/// then, not at the next resync (a minute here) or the next change.
#[tokio::test]
async fn a_plane_scaled_to_zero_is_told_so_when_it_comes_to_count_as_such() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (closed, _held) = closed_port();
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    closed,
                    true,
                ));
                // The seed's other Gateways, whose applies are retried every few seconds (one
                // of them is refused), would bring rounds of their own.
                for (namespace, name) in [("tenant-b", "other"), ("tenant-c", "third")] {
                    api.delete("gateway.networking.k8s.io/v1", "Gateway", namespace, name);
                }
            },
            ApiServer::client,
            |options| {
                options.resync = Duration::from_secs(60);
                options.podless_keep = Duration::from_secs(1);
            },
        )
        .await;
        eventually("ProxyConfigPushed=False on shop", || {
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
        })
        .await;
        let mut slice = config_slice("tenant-a", "cf-proxy-edge-config", closed, true);
        slice["endpoints"] = json!([]);
        t.api.put(slice);
        let scaled = Instant::now();
        eventually(
            "the failure gone once the plane counts as scaled to zero",
            || {
                route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
                    .is_none()
                    .then_some(())
            },
        )
        .await;
        assert!(
            scaled.elapsed() >= Duration::from_millis(900),
            "kept through the gap: {:?}",
            scaled.elapsed()
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}
