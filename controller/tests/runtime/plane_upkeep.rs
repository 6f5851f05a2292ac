//! Keeping a dedicated plane in step with its Gateway when its objects go in other ways than
//! the controller's own: a Deployment deleted in the foreground, removals refused, held or
//! already under way, a GatewayClass whose status this build cannot read, a plane moved to
//! another tunnel whose new pods are not ready (the controller restarting meanwhile), a record
//! of a move left on a Deployment after it, and a NetworkPolicy switched off that a finalizer
//! holds. Likewise the shared pool's Deployment, whose stamp an admission webhook holds. A
//! failed apply, or tunnel document write, is tried again as its wait ends, however quiet the
//! cluster. A generated config-API token Secret edited to a token no proxy takes is written
//! anew.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cftunnel_testkit::kube_api::ApiServer;
use cftunnel_tunnel::Token;
use serde_json::{json, Value};

use super::{
    chart_pool, chart_shared_plane, class_token, class_tunnel_secret, condition, config_slice,
    eventually, proxy_pod, settled, shop_goes_away, shop_serves, uuid_of, within, yaml, Tenant,
    OTHER_TUNNEL_ID, TUNNEL_ID,
};

/// The third tenant's Gateway (tenant-c/third) without its GatewayConfig: back on the shared
/// plane, so its dedicated plane is removed.
const THIRD_ON_THE_SHARED_PLANE: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: third, namespace: tenant-c}\nspec:\n  gatewayClassName: cloudflare-tunnel\n  listeners: [{name: http, port: 80, protocol: HTTP, hostname: blog.example.com}]\n";

/// `object` as the API server holds it while a foreground cascade deletes it: marked, and held
/// by the finalizer the garbage collector removes once its dependents are gone.
fn being_deleted(mut object: Value) -> Value {
    object["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    object["metadata"]["finalizers"] = json!(["foregroundDeletion"]);
    object
}

/// Counts the requests `picks` picks, holding none.
fn count(
    t: &Tenant,
    picks: impl Fn(&cftunnel_testkit::kube_api::Call<'_>) -> bool + Send + Sync + 'static,
) -> (Arc<AtomicUsize>, impl Drop) {
    let n = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&n);
    let hold = t.api.hold(move |c| {
        if picks(c) {
            counted.fetch_add(1, Ordering::SeqCst);
        }
        false
    });
    (n, hold)
}

/// `kubectl delete deployment --cascade=foreground` (as Argo CD deletes): the Deployment stays,
/// being deleted, while its pods go, and a round applies the plane over it. Once it is gone the
/// plane is applied anew within seconds, not at the next periodic apply minutes later.
#[tokio::test]
async fn a_deployment_deleted_in_the_foreground_is_put_back_once_gone() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 1").await;
        let deployment = || {
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
        };
        let live = eventually("the plane's Deployment", deployment).await;
        settled(&t.api).await;

        let (applies, _counting) = count(&t, |c| {
            c.method == "PATCH"
                && c.kind == "Deployment"
                && c.body.pointer("/metadata/namespace") == Some(&json!("tenant-a"))
        });
        t.api.put(being_deleted(live));
        eventually(
            "the controller's apply over the Deployment being deleted",
            || (applies.load(Ordering::SeqCst) > 0).then_some(()),
        )
        .await;
        settled(&t.api).await;

        // Its pods are gone: the garbage collector removes the finalizer, and it goes.
        assert!(t
            .api
            .delete("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge"));
        let back = within(5, "the Deployment put back", deployment).await;
        assert!(back.pointer("/metadata/deletionTimestamp").is_none());
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Removing a plane is a task of its own that no round waits for: a DELETE an admission
/// webhook holds (here for far longer than the test) holds up no other tenant's route change.
#[tokio::test]
async fn a_removal_that_hangs_holds_up_no_other_tenants_route_change() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (t, edge) = Tenant::with_pod("replicas: 1").await;
        shop_serves(&edge, 200).await;
        eventually("the third tenant's plane", || {
            t.api
                .get("apps/v1", "Deployment", "tenant-c", "cf-proxy-third")
        })
        .await;

        let hung = t
            .api
            .hold(|c| c.method == "DELETE" && c.kind == "Deployment");
        t.api.put(yaml(THIRD_ON_THE_SHARED_PLANE));
        tokio::time::timeout(Duration::from_secs(10), hung.arrived(1))
            .await
            .expect("the removal at the API server");

        tokio::time::timeout(Duration::from_secs(5), shop_goes_away(&t, &edge))
            .await
            .expect("the route change reaches its pod while the removal hangs");
        hung.release();
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A removal refused (an admission webhook, a missing RBAC rule) is not sent again at every
/// round, which every change in the cluster starts: as a failed apply, it waits first (5 s,
/// doubling), and the plane goes once the refusal is lifted.
#[tokio::test]
async fn a_refused_removal_waits_before_it_is_sent_again() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 1").await;
        let deployment = || {
            t.api
                .get("apps/v1", "Deployment", "tenant-c", "cf-proxy-third")
        };
        eventually("the third tenant's plane", deployment).await;

        let deletes = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&deletes);
        let refused = t.api.forbid(move |c| {
            let ours = c.method == "DELETE" && c.kind == "Deployment";
            if ours {
                counted.fetch_add(1, Ordering::SeqCst);
            }
            ours
        });
        t.api.put(yaml(THIRD_ON_THE_SHARED_PLANE));
        eventually("a removal refused", || {
            (deletes.load(Ordering::SeqCst) > 0).then_some(())
        })
        .await;
        // Rounds every 100 ms and at each change meanwhile: none sends it again.
        t.rounds(4, Duration::from_millis(500)).await;
        assert_eq!(deletes.load(Ordering::SeqCst), 1, "sent once");

        drop(refused);
        within(15, "the plane removed once allowed", || {
            deployment().is_none().then_some(())
        })
        .await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// An object of a plane to remove that is being deleted already (a finalizer holds it) is not
/// deleted again at each round; the rest of the plane goes.
#[tokio::test]
async fn a_plane_object_being_deleted_is_not_deleted_again() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 1").await;
        let deployment = || {
            t.api
                .get("apps/v1", "Deployment", "tenant-c", "cf-proxy-third")
        };
        let live = eventually("the third tenant's plane", deployment).await;
        settled(&t.api).await;
        t.api.put(being_deleted(live));
        settled(&t.api).await;

        let (deletes, _counting) = count(&t, |c| c.method == "DELETE" && c.kind == "Deployment");
        t.api.put(yaml(THIRD_ON_THE_SHARED_PLANE));
        eventually("the rest of the plane removed", || {
            t.api
                .get("v1", "Service", "tenant-c", "cf-proxy-third-config")
                .is_none()
                .then_some(())
        })
        .await;
        t.rounds(3, Duration::from_millis(300)).await;
        assert_eq!(deletes.load(Ordering::SeqCst), 0, "not deleted again");
        assert!(deployment().is_some(), "left to its finalizer");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A NetworkPolicy labelled as the controller labels its own, under the name of a plane the
/// Gateway does not have, is not a plane left to remove: nothing removes it, so it costs no
/// reads round after round, and it is left alone.
#[tokio::test]
async fn a_labelled_network_policy_the_gateway_does_not_control_costs_no_reads_per_round() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start_with("replicas: 1", |api| {
            api.delete("apps/v1", "Deployment", "tenant-b", "cf-proxy-other");
            api.put(yaml(&super::gateway(false)));
            api.put(yaml(
                "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: cf-proxy-edge, namespace: tenant-a, labels: {app.kubernetes.io/managed-by: cftunnel-controller}}\nspec: {podSelector: {matchLabels: {app: leftover}}}\n",
            ));
        })
        .await;
        eventually("the Gateway's status", || {
            t.api
                .get(
                    "gateway.networking.k8s.io/v1",
                    "Gateway",
                    "tenant-a",
                    "edge",
                )
                .and_then(|g| condition(&g["status"]["conditions"], "Accepted").cloned())
        })
        .await;
        settled(&t.api).await;
        let kinds = ["Deployment", "Service", "NetworkPolicy", "Secret"];
        let reads = || kinds.map(|k| t.api.accepts(k).len());
        let before = reads();
        // Rounds run every 100 ms.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(reads(), before, "no reads of {kinds:?}");
        assert!(t
            .api
            .get("networking.k8s.io/v1", "NetworkPolicy", "tenant-a", "cf-proxy-edge")
            .is_some());
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A GatewayClass whose status this build cannot read (`supportedFeatures` as plain names, as
/// Gateway API v1.1 wrote them; the controller's own writes refused here, so it stays so) is
/// read all the same: past the wait after which a class gone takes its planes away, the plane
/// is there and its Gateway is served.
#[tokio::test]
async fn a_class_whose_status_this_build_cannot_read_keeps_its_planes() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (t, edge) = Tenant::with_pod("replicas: 1").await;
        shop_serves(&edge, 200).await;

        let _refused = t
            .api
            .forbid(|c| c.method == "PATCH" && c.kind == "GatewayClass");
        t.api.set_status(
            "gateway.networking.k8s.io/v1",
            "GatewayClass",
            "",
            "cloudflare-tunnel",
            json!({"supportedFeatures": ["HTTPRoute", "Gateway"]}),
        );
        tokio::time::sleep(Duration::from_secs(12)).await;
        assert!(
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
                .is_some(),
            "the plane stays"
        );
        shop_goes_away(&t, &edge).await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A plane whose connector token moves to another tunnel is `Programmed` there only once a
/// replica of the pod template on it is ready: until then its Deployment's ready replicas are
/// its old pods, connectors of the tunnel before (a rollout never takes one away before its
/// successor is ready, so one whose new pods never register leaves them so for good).
#[tokio::test]
async fn a_plane_moved_to_another_tunnel_is_programmed_once_a_replica_on_it_is_ready() {
    moved_to_another_tunnel(false).await;
}

/// A controller that starts (a restart, another replica taking the lead) while a plane's move
/// to another tunnel is under way knows of it from the plane's Deployment, which records the
/// tunnel before until a replica on the new one is ready: `Programmed` waits for that replica
/// as it would have, and the record goes once it is ready.
#[tokio::test]
async fn a_plane_moving_to_another_tunnel_as_the_controller_restarts_is_programmed_once_a_replica_on_it_is_ready(
) {
    moved_to_another_tunnel(true).await;
}

/// The plane of Gateway tenant-a/edge moves to another tunnel, its new pod not ready; the
/// controller restarts meanwhile, with `restart`.
async fn moved_to_another_tunnel(restart: bool) {
    const TUNNEL_BEFORE: &str = "/metadata/annotations/cf.k8s.lex.la~1tunnel-before";
    let deployment =
        |api: &ApiServer| api.get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge");
    let status = |api: &ApiServer, replicas: i32, updated: i32, ready: i32| {
        let generation = deployment(api)
            .and_then(|d| d.pointer("/metadata/generation").cloned())
            .expect("a generation");
        api.set_status(
            "apps/v1",
            "Deployment",
            "tenant-a",
            "cf-proxy-edge",
            json!({"observedGeneration": generation, "replicas": replicas,
                   "updatedReplicas": updated, "readyReplicas": ready,
                   "availableReplicas": ready}),
        );
    };
    let programmed_on = |api: &ApiServer, tunnel: &str| {
        let g = api.get(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "tenant-a",
            "edge",
        )?;
        let on =
            g.pointer("/status/addresses/0/value")? == &json!(format!("{tunnel}.cfargotunnel.com"));
        let programmed = condition(&g["status"]["conditions"], "Programmed")?.clone();
        on.then_some(programmed)
    };
    tokio::time::timeout(Duration::from_secs(60), async {
        let (mut t, _edge) = Tenant::with_pod("replicas: 2").await;
        eventually("the plane's Deployment", || deployment(&t.api)).await;
        status(&t.api, 2, 2, 2);
        eventually("Programmed on the first tunnel", || {
            programmed_on(&t.api, TUNNEL_ID).filter(|c| c["status"] == "True")
        })
        .await;

        let moved = Token::new("acct", b"moved secret".to_vec(), uuid_of(OTHER_TUNNEL_ID)).encode();
        t.api.put(yaml(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: edge-tunnel-token, namespace: tenant-a}}\nstringData: {{tunnel-token: \"{moved}\"}}\n"
        )));
        eventually("the Deployment on the new tunnel", || {
            deployment(&t.api)
                .and_then(|d| d.pointer("/metadata/annotations/cf.k8s.lex.la~1tunnel").cloned())
                .filter(|t| t.as_str().is_some_and(|t| t.ends_with(OTHER_TUNNEL_ID)))
        })
        .await;
        // The Deployment controller has seen the new template: its new pod is not ready, the
        // two ready ones are old pods, on the first tunnel.
        status(&t.api, 3, 1, 2);
        eventually("the new tunnel's address", || {
            programmed_on(&t.api, OTHER_TUNNEL_ID)
        })
        .await;
        let recorded = deployment(&t.api).and_then(|d| d.pointer(TUNNEL_BEFORE).cloned());
        assert_eq!(recorded, Some(json!(TUNNEL_ID)), "the move recorded");
        if restart {
            t.restart(|_| {}).await;
        }
        t.rounds(3, Duration::from_millis(300)).await;
        let pending = programmed_on(&t.api, OTHER_TUNNEL_ID).expect("Programmed");
        assert_eq!(
            (&pending["status"], &pending["reason"]),
            (&json!("False"), &json!("Pending")),
            "{pending}"
        );

        // Rolled out: every ready replica runs the template on the new tunnel.
        status(&t.api, 2, 2, 2);
        eventually("Programmed on the new tunnel", || {
            programmed_on(&t.api, OTHER_TUNNEL_ID).filter(|c| c["status"] == "True")
        })
        .await;
        eventually("the record of the move gone", || {
            deployment(&t.api).filter(|d| d.pointer(TUNNEL_BEFORE).is_none())
        })
        .await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A record of a move left on a plane's Deployment after the move (someone annotated it with
/// the same value, so the controller's apply leaves it there) starts no move: a later rollout
/// leaves `Programmed` as the old pods serve.
#[tokio::test]
async fn a_record_of_a_move_left_on_the_deployment_starts_no_move() {
    record_left_on_the_deployment(OTHER_TUNNEL_ID, false).await;
}

/// A controller that starts while a plane's Deployment records a move from the tunnel it is on
/// (no move at all) starts none either.
#[tokio::test]
async fn a_record_of_a_move_from_the_tunnel_the_plane_is_on_starts_no_move_on_a_restart() {
    record_left_on_the_deployment(TUNNEL_ID, true).await;
}

/// Gateway tenant-a/edge's Deployment annotated by someone as moved from tunnel `before`, then
/// rolling out (its new pod not ready), the controller restarting meanwhile with `restart`.
async fn record_left_on_the_deployment(before: &str, restart: bool) {
    let programmed = |api: &ApiServer| {
        api.get(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "tenant-a",
            "edge",
        )
        .and_then(|g| condition(&g["status"]["conditions"], "Programmed").cloned())
    };
    let status = |api: &ApiServer, replicas: i32, updated: i32, ready: i32| {
        let generation = api
            .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
            .and_then(|d| d.pointer("/metadata/generation").cloned())
            .expect("a generation");
        api.set_status(
            "apps/v1",
            "Deployment",
            "tenant-a",
            "cf-proxy-edge",
            json!({"observedGeneration": generation, "replicas": replicas,
                   "updatedReplicas": updated, "readyReplicas": ready,
                   "availableReplicas": ready}),
        );
    };
    tokio::time::timeout(Duration::from_secs(60), async {
        let (mut t, _edge) = Tenant::with_pod("replicas: 2").await;
        eventually("the plane's Deployment", || {
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
        })
        .await;
        status(&t.api, 2, 2, 2);
        eventually("Programmed", || {
            programmed(&t.api).filter(|c| c["status"] == "True")
        })
        .await;

        let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
            kube::Api::namespaced(t.api.user_client(), "tenant-a");
        deployments
            .patch(
                "cf-proxy-edge",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"annotations": {
                    "cf.k8s.lex.la/tunnel-before": before,
                }}})),
            )
            .await
            .expect("the Deployment annotated");
        // A rollout: its new pod is not ready, the two ready ones are old pods.
        status(&t.api, 3, 1, 2);
        if restart {
            t.restart(|_| {}).await;
        }
        t.rounds(3, Duration::from_millis(300)).await;
        let programmed = programmed(&t.api).expect("Programmed");
        assert_eq!(programmed["status"], "True", "{programmed}");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The planes' NetworkPolicy switched off while the Gateway's one is being deleted, held by a
/// finalizer: the apply leaves it to its finalizer, and the plane is then intact, not applied
/// again (some ten requests) at every round. Once the policy is gone, the plane is applied
/// once for it, and is quiet again.
#[tokio::test]
async fn a_network_policy_held_by_a_finalizer_costs_no_apply_per_round_once_switched_off() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut t = Tenant::start_with("replicas: 1", |api| {
            api.delete("apps/v1", "Deployment", "tenant-b", "cf-proxy-other");
        })
        .await;
        let policy = |t: &Tenant| {
            t.api.get(
                "networking.k8s.io/v1",
                "NetworkPolicy",
                "tenant-a",
                "cf-proxy-edge",
            )
        };
        let live = eventually("the NetworkPolicy", || policy(&t)).await;
        settled(&t.api).await;
        t.api.put(being_deleted(live));
        settled(&t.api).await;

        let (applies, _counting) = count(&t, |c| {
            c.method == "PATCH"
                && c.kind == "Deployment"
                && c.body.pointer("/metadata/namespace") == Some(&json!("tenant-a"))
        });
        // Rounds every 100 ms: quiet for a second and a half means none applies the plane.
        let quiet = |applies: Arc<AtomicUsize>| async move {
            loop {
                let before = applies.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1500)).await;
                if applies.load(Ordering::SeqCst) == before {
                    return;
                }
            }
        };
        t.restart(|options| options.render.network_policy = false)
            .await;
        eventually("the plane applied without its NetworkPolicy", || {
            (applies.load(Ordering::SeqCst) > 0).then_some(())
        })
        .await;
        tokio::time::timeout(Duration::from_secs(10), quiet(Arc::clone(&applies)))
            .await
            .expect("applied once, not at every round");
        assert!(policy(&t).is_some(), "left to its finalizer");

        // The finalizer done, it goes: the plane is applied for it, once.
        let before = applies.load(Ordering::SeqCst);
        assert!(t.api.delete(
            "networking.k8s.io/v1",
            "NetworkPolicy",
            "tenant-a",
            "cf-proxy-edge"
        ));
        within(5, "the plane applied once the policy is gone", || {
            (applies.load(Ordering::SeqCst) > before).then_some(())
        })
        .await;
        tokio::time::timeout(Duration::from_secs(10), quiet(Arc::clone(&applies)))
            .await
            .expect("quiet again");
        assert!(policy(&t).is_none(), "not rendered again");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Whether `call` is the controller's patch stamping the shared pool's pod template with its
/// tunnel token's digest (no plane's render carries that annotation).
fn pool_stamp(call: &cftunnel_testkit::kube_api::Call<'_>) -> bool {
    call.method == "PATCH"
        && call.kind == "Deployment"
        && call
            .body
            .pointer("/spec/template/metadata/annotations/cf.k8s.lex.la~1tunnel-token-hash")
            .is_some()
}

/// Pointing the shared pool at its tunnel token is a write no round waits for: a patch of the
/// pool's Deployment that an admission webhook holds (here for far longer than the test) holds
/// up no tenant's config, and is not sent again meanwhile. Once it is answered the stamp is
/// recorded, and later rounds do not write it again.
#[tokio::test]
async fn a_pool_stamp_that_hangs_holds_up_no_other_tenants_route_change() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let edge = proxy_pod("s3cr3t").await;
        let stamps = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&stamps);
        let mut held = None;
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    edge.admin_addr().port(),
                    true,
                ));
                api.put(chart_pool());
                api.put(class_tunnel_secret(&class_token(b"class secret"), ""));
                held = Some(api.hold(move |c| {
                    let stamp = pool_stamp(c);
                    if stamp {
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                    stamp
                }));
            },
            ApiServer::client,
            |options| options.shared = Some(chart_shared_plane(true)),
        )
        .await;
        let hung = held.expect("the pool's stamps are held");
        tokio::time::timeout(Duration::from_secs(20), hung.arrived(1))
            .await
            .expect("the pool's stamp at the API server");

        tokio::time::timeout(Duration::from_secs(15), shop_serves(&edge, 200))
            .await
            .expect("tenant-a's config reaches its pod while the pool's stamp hangs");
        tokio::time::timeout(Duration::from_secs(5), shop_goes_away(&t, &edge))
            .await
            .expect("tenant-a's route change reaches its pod while the pool's stamp hangs");
        assert_eq!(
            stamps.load(Ordering::SeqCst),
            1,
            "not sent again while it hangs"
        );

        hung.release();
        within(10, "the pool stamped", || {
            t.api
                .get("apps/v1", "Deployment", "cftunnel-system", "cftunnel-proxy")
                .and_then(|d| {
                    d.pointer(
                        "/spec/template/metadata/annotations/cf.k8s.lex.la~1tunnel-token-hash",
                    )
                    .cloned()
                })
        })
        .await;
        let (patches, _counting) = count(&t, pool_stamp);
        // Rounds every 100 ms and at each change meanwhile.
        t.rounds(4, Duration::from_millis(300)).await;
        assert_eq!(patches.load(Ordering::SeqCst), 0, "stamped once");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A plane whose apply failed once is applied again as the failure's wait (5 s) ends, though
/// nothing in the cluster changes meanwhile and no resync is due for minutes: the wait's end
/// starts the round, rather than whatever round comes next.
#[tokio::test]
async fn a_failed_apply_is_tried_again_as_its_wait_ends_in_a_quiet_cluster() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let attempts = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&attempts);
        let mut failing = None;
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                // The first apply of tenant-a's Deployment fails; those after it land.
                failing = Some(api.fail(500, move |c| {
                    c.method == "PATCH"
                        && c.kind == "Deployment"
                        && c.body.pointer("/metadata/namespace") == Some(&json!("tenant-a"))
                        && counted.fetch_add(1, Ordering::SeqCst) == 0
                }));
            },
            ApiServer::client,
            |options| options.resync = Duration::from_secs(600),
        )
        .await;
        let _failing = failing.expect("the first apply fails");
        eventually("the plane's apply failed", || {
            (attempts.load(Ordering::SeqCst) > 0).then_some(())
        })
        .await;
        let failed_at = std::time::Instant::now();

        within(20, "the plane applied after the failure's wait", || {
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
        })
        .await;
        assert!(
            failed_at.elapsed() >= Duration::from_secs(4),
            "held back for its wait, not applied again by the rounds its failure's status starts"
        );
        assert_eq!(attempts.load(Ordering::SeqCst), 2, "applied twice");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A tunnel document write that failed (the tunnel not there yet) wakes the loop as its wait
/// ends, so the next call, started by that wake rather than by a change or a resync, writes it.
#[tokio::test]
async fn a_failed_tunnel_write_wakes_the_loop_as_its_wait_ends() {
    use cftunnel_controller::cloudflare::{TunnelApi, TunnelSync, TunnelTarget};
    use cftunnel_testkit::cloudflare_api::CloudflareApi;
    tokio::time::timeout(Duration::from_secs(30), async {
        let cloudflare = CloudflareApi::start().await;
        cloudflare.allow("acct", "controller-token");
        let api = TunnelApi::new(&cloudflare.base(), Duration::from_secs(5)).expect("client");
        let target = TunnelTarget {
            account: "acct".to_owned(),
            tunnel: uuid_of(TUNNEL_ID),
            api_token: "controller-token".to_owned(),
            verify_secret: Some(b"the real secret".to_vec()),
        };
        let document = json!({"ingress": [{"hostname": "a.example.com", "service": "http://localhost:8080"}, {"service": "http_status:404"}]});
        let wake = Arc::new(tokio::sync::Notify::new());
        let mut sync = TunnelSync::with_retry(Duration::from_millis(500), Duration::from_secs(60))
            .waiting_at_most(Duration::from_secs(5), Arc::clone(&wake));
        // Before the call: its failure's wait starts within it.
        let failed_at = std::time::Instant::now();
        sync.sync(&api, &target, &document)
            .await
            .expect_err("no such tunnel");
        // The write's end has told the wake already.
        let _ = tokio::time::timeout(Duration::from_millis(100), wake.notified()).await;
        let real = Token::new("acct", b"the real secret".to_vec(), uuid_of(TUNNEL_ID));
        cloudflare.add_tunnel("acct", TUNNEL_ID, &real.encode());

        tokio::time::timeout(Duration::from_secs(5), wake.notified())
            .await
            .expect("the failure's wait ends with a wake");
        assert!(
            failed_at.elapsed() >= Duration::from_millis(400),
            "not before the wait ends"
        );
        assert_eq!(sync.sync(&api, &target, &document).await, Ok(true));
        assert_eq!(
            cloudflare.config("acct", TUNNEL_ID).map(|(_, d)| d),
            Some(document)
        );
    })
    .await
    .expect("in time");
}

/// Calls of `sync` as the run loop makes them: each once `wake` is told (within 10 s), until
/// `done` holds after one. Returns each call's result.
async fn calls_until(
    sync: &mut cftunnel_controller::cloudflare::TunnelSync,
    api: &cftunnel_controller::cloudflare::TunnelApi,
    target: &cftunnel_controller::cloudflare::TunnelTarget,
    document: &Value,
    wake: &tokio::sync::Notify,
    mut done: impl FnMut() -> bool,
) -> Vec<Result<bool, String>> {
    let mut results = Vec::new();
    loop {
        tokio::time::timeout(Duration::from_secs(10), wake.notified())
            .await
            .expect("a wake comes");
        results.push(sync.sync(api, target, document).await);
        if done() {
            return results;
        }
    }
}

/// A tunnel sync that reads documents back every `period`: failed writes tried again after
/// 5 s, a call waiting 5 s at most for its writes, `wake` told as they end.
fn reading_back_sync(
    period: Duration,
    wake: &Arc<tokio::sync::Notify>,
) -> cftunnel_controller::cloudflare::TunnelSync {
    cftunnel_controller::cloudflare::TunnelSync::with_retry(
        Duration::from_secs(5),
        Duration::from_secs(60),
    )
    .waiting_at_most(Duration::from_secs(5), Arc::clone(wake))
    .reading_back(period)
}

/// The stand-in Cloudflare API, a client counted in `registry`, the controller's target on
/// it, and the document it writes: `a.example.com` and `b.example.com`.
async fn read_back_setup(
    registry: &mut prometheus_client::registry::Registry,
) -> (
    cftunnel_testkit::cloudflare_api::CloudflareApi,
    cftunnel_controller::cloudflare::TunnelApi,
    cftunnel_controller::cloudflare::TunnelTarget,
    Value,
) {
    use cftunnel_controller::cloudflare::{ApiCalls, TunnelApi, TunnelTarget};
    let cloudflare = cftunnel_testkit::cloudflare_api::CloudflareApi::start().await;
    cloudflare.allow("acct", "controller-token");
    let calls = ApiCalls::default();
    calls.register(registry);
    let api = TunnelApi::new(&cloudflare.base(), Duration::from_secs(5))
        .expect("client")
        .counted(calls);
    let target = TunnelTarget {
        account: "acct".to_owned(),
        tunnel: uuid_of(TUNNEL_ID),
        api_token: "controller-token".to_owned(),
        verify_secret: None,
    };
    let document = json!({"ingress": [
        {"hostname": "a.example.com", "service": "http://localhost:8080"},
        {"hostname": "b.example.com", "service": "http://localhost:8080"},
        {"service": "http_status:404"},
    ]});
    (cloudflare, api, target, document)
}

/// A tunnel's document is read back once a period (300 ms here) after it was written: found
/// unchanged, it is not written again. Changed behind the controller's back (in the
/// dashboard, as the account's owner: `b.example.com` dropped, `c.example.com` added), the
/// read that finds it wakes the loop, the next call writes the controller's document again,
/// and the drift is counted.
#[tokio::test]
async fn a_tunnel_document_changed_elsewhere_is_written_again_once_read_back() {
    use cftunnel_controller::cloudflare::TunnelApi;
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut registry = prometheus_client::registry::Registry::default();
        let (cloudflare, api, target, document) = read_back_setup(&mut registry).await;
        let wake = Arc::new(tokio::sync::Notify::new());
        let period = Duration::from_millis(300);
        let mut sync = reading_back_sync(period, &wake);
        let writing = std::time::Instant::now();
        assert_eq!(sync.sync(&api, &target, &document).await, Ok(true));
        let puts = cloudflare.put_events().len();
        let writes = cloudflare.writes();
        let requests = cloudflare.requests();

        let results = calls_until(&mut sync, &api, &target, &document, &wake, || {
            cloudflare.requests() >= requests + 2
        })
        .await;
        assert!(results.iter().all(|r| *r == Ok(false)), "{results:?}");
        assert_eq!(
            cloudflare.put_events().len(),
            puts,
            "read back, not written"
        );
        assert!(
            writing.elapsed() >= period * 2,
            "read at most once a period"
        );

        let dashboard = TunnelApi::new(&cloudflare.base(), Duration::from_secs(5)).expect("client");
        let edited = json!({"ingress": [
            {"hostname": "a.example.com", "service": "http://localhost:8080"},
            {"hostname": "c.example.com", "service": "http://localhost:8080"},
            {"service": "http_status:404"},
        ]});
        dashboard
            .put_configuration(&target, &edited)
            .await
            .expect("edited in the dashboard");
        let results = calls_until(&mut sync, &api, &target, &document, &wake, || {
            cloudflare.config("acct", TUNNEL_ID).map(|(_, d)| d) == Some(document.clone())
        })
        .await;
        assert_eq!(
            results.last(),
            Some(&Ok(true)),
            "written again: {results:?}"
        );
        assert_eq!(cloudflare.writes(), writes + 2, "the edit and the write");
        let b = ["b.example.com".to_owned()];
        assert!(sync.landed(&target.tunnel).is_some_and(|l| l.carries(&b)));
        assert_eq!(drifts(&registry), 1, "drifts counted");
    })
    .await
    .expect("in time");
}

/// A read back that fails (the API answers 429), or whose answer holds no configuration
/// (`"config": null`), is left for the next period: the tunnel is not reported failing,
/// nothing is written, and what it serves stays as written.
#[tokio::test]
async fn a_failed_tunnel_read_back_changes_nothing() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut registry = prometheus_client::registry::Registry::default();
        let (cloudflare, api, target, document) = read_back_setup(&mut registry).await;
        let wake = Arc::new(tokio::sync::Notify::new());
        let mut sync = reading_back_sync(Duration::from_millis(300), &wake);
        assert_eq!(sync.sync(&api, &target, &document).await, Ok(true));
        let puts = cloudflare.put_events().len();
        let requests = cloudflare.requests();
        // No wait asked for: the limit holds up no later call.
        cloudflare.rate_limit_next(0);
        cloudflare.replace_config("acct", TUNNEL_ID, Value::Null);

        // The refused read, then two periods' reads of no configuration.
        let results = calls_until(&mut sync, &api, &target, &document, &wake, || {
            cloudflare.requests() >= requests + 3
        })
        .await;
        assert!(results.iter().all(|r| *r == Ok(false)), "{results:?}");
        assert_eq!(cloudflare.put_events().len(), puts, "nothing written");
        let b = ["b.example.com".to_owned()];
        assert!(sync.landed(&target.tunnel).is_some_and(|l| l.carries(&b)));
        let mut metrics = String::new();
        prometheus_client::encoding::text::encode(&mut metrics, &registry).expect("encoded");
        assert!(
            metrics.contains(
                "cloudflare_api_errors_total{call=\"get_configuration\",status=\"429\"} 1\n"
            ),
            "the read was refused: {metrics}"
        );
        assert!(
            metrics.contains("cloudflare_tunnel_document_drifts_total 0\n"),
            "{metrics}"
        );
    })
    .await
    .expect("in time");
}

/// The calls `sync_all` of `work` the run loop makes while `how_long` runs: one each time
/// `wake` is told. Returns how many.
async fn calls_during(
    sync: &mut cftunnel_controller::cloudflare::TunnelSync,
    api: &cftunnel_controller::cloudflare::TunnelApi,
    work: &[(cftunnel_controller::cloudflare::TunnelTarget, Value)],
    wake: &tokio::sync::Notify,
    how_long: Duration,
) -> usize {
    let until = tokio::time::Instant::now() + how_long;
    let mut calls = 0;
    while tokio::time::timeout_at(until, wake.notified())
        .await
        .is_ok()
    {
        sync.sync_all(api, work.to_vec()).await;
        calls += 1;
    }
    calls
}

/// Waits (within 5 s) for `wake` without ever pausing, so that what follows comes the instant
/// it is told: a run loop on a core of its own, woken while the task that told it is still
/// ending.
fn told_at_once(wake: &tokio::sync::Notify) {
    let until = std::time::Instant::now() + Duration::from_secs(5);
    let notified = wake.notified();
    let mut notified = std::pin::pin!(notified);
    while futures_util::FutureExt::now_or_never(notified.as_mut()).is_none() {
        assert!(std::time::Instant::now() < until, "a wake comes within 5 s");
        std::hint::spin_loop();
    }
}

/// A read back that finds a drift has what it found taken in by the call its wake brings,
/// however soon that call comes: the task that told the wake may not have finished yet.
/// Six times over (a race the call wins only now and then), the controller's document
/// another each time (so each is read a period after its write, 2 s here: the read ends long
/// before the next timer), and changed elsewhere at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_call_a_drift_wakes_writes_the_document_again() {
    use cftunnel_controller::cloudflare::TunnelApi;
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut registry = prometheus_client::registry::Registry::default();
        let (cloudflare, api, target, _) = read_back_setup(&mut registry).await;
        let wake = Arc::new(tokio::sync::Notify::new());
        let mut sync = reading_back_sync(Duration::from_secs(2), &wake);
        let other = TunnelApi::new(&cloudflare.base(), Duration::from_secs(5)).expect("client");
        let edited = json!({"ingress": [{"service": "http_status:404"}]});
        for i in 0..6 {
            let document = json!({"ingress": [
                {"hostname": format!("v{i}.example.com"), "service": "http://localhost:8080"},
                {"service": "http_status:404"},
            ]});
            assert_eq!(sync.sync(&api, &target, &document).await, Ok(true));
            forget_wake(&wake).await;
            other
                .put_configuration(&target, &edited)
                .await
                .expect("written by the other writer");
            tokio::time::timeout(Duration::from_secs(5), wake.notified())
                .await
                .expect("the read's timer wakes");
            assert_eq!(sync.sync(&api, &target, &document).await, Ok(false));
            told_at_once(&wake);
            assert_eq!(
                sync.sync(&api, &target, &document).await,
                Ok(true),
                "read {i}: the drift it woke for is written again"
            );
        }
    })
    .await
    .expect("in time");
}

/// Forgets a wake told before now, if one was.
async fn forget_wake(wake: &tokio::sync::Notify) {
    let _ = tokio::time::timeout(Duration::from_millis(20), wake.notified()).await;
}

/// Waits (within 5 s) until `cloudflare` has answered `requests` requests in all.
async fn answered(cloudflare: &cftunnel_testkit::cloudflare_api::CloudflareApi, requests: usize) {
    tokio::time::timeout(Duration::from_secs(5), async {
        while cloudflare.requests() < requests {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{requests} requests answered within 5 s, not {}",
            cloudflare.requests()
        )
    });
}

/// A read back that finds the document as written wakes nobody: each of three reads comes
/// with the one wake of its period's timer, and none follows it in the 400 ms after it is
/// answered (the next falls due a second after it started).
#[tokio::test]
async fn a_tunnel_read_back_that_finds_no_drift_wakes_nothing() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut registry = prometheus_client::registry::Registry::default();
        let (cloudflare, api, target, document) = read_back_setup(&mut registry).await;
        let wake = Arc::new(tokio::sync::Notify::new());
        let period = Duration::from_secs(1);
        let mut sync = reading_back_sync(period, &wake);
        let mut last = std::time::Instant::now();
        assert_eq!(sync.sync(&api, &target, &document).await, Ok(true));
        // The write's end told it.
        forget_wake(&wake).await;
        let puts = cloudflare.put_events().len();
        let requests = cloudflare.requests();
        for read in 1..=3 {
            tokio::time::timeout(Duration::from_secs(5), wake.notified())
                .await
                .expect("the read's timer wakes");
            assert!(
                last.elapsed() >= period,
                "read {read} falls due a period on"
            );
            last = std::time::Instant::now();
            assert_eq!(sync.sync(&api, &target, &document).await, Ok(false));
            answered(&cloudflare, requests + read).await;
            assert!(
                tokio::time::timeout(Duration::from_millis(400), wake.notified())
                    .await
                    .is_err(),
                "read {read} found nothing, and woke the loop"
            );
        }
        assert_eq!(cloudflare.put_events().len(), puts, "nothing written");
        assert_eq!(drifts(&registry), 0, "drifts counted");
    })
    .await
    .expect("in time");
}

/// A read back the API answers only after the next has fallen due (300 ms on, its timer gone
/// off meanwhile, finding the read still running) wakes the loop as it ends, though it found
/// the document as written, and the call it brings reads the tunnel again.
#[tokio::test]
async fn a_read_back_that_outlives_its_period_wakes_the_loop_for_the_next() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut registry = prometheus_client::registry::Registry::default();
        let (cloudflare, api, target, document) = read_back_setup(&mut registry).await;
        let wake = Arc::new(tokio::sync::Notify::new());
        let period = Duration::from_millis(300);
        let mut sync = reading_back_sync(period, &wake);
        assert_eq!(sync.sync(&api, &target, &document).await, Ok(true));
        forget_wake(&wake).await;
        let requests = cloudflare.requests();
        tokio::time::timeout(Duration::from_secs(5), wake.notified())
            .await
            .expect("the read's timer wakes");
        let hold = cloudflare.hold_reads();
        assert_eq!(sync.sync(&api, &target, &document).await, Ok(false));
        // Past the period and its share: the timer for the next read goes off, and the call
        // it brings finds the read still running.
        tokio::time::timeout(Duration::from_secs(5), wake.notified())
            .await
            .expect("the next read's timer wakes");
        assert_eq!(sync.sync(&api, &target, &document).await, Ok(false));
        forget_wake(&wake).await;
        drop(hold);
        answered(&cloudflare, requests + 1).await;
        tokio::time::timeout(Duration::from_secs(2), wake.notified())
            .await
            .expect("the overdue read's end wakes the loop");
        assert_eq!(sync.sync(&api, &target, &document).await, Ok(false));
        answered(&cloudflare, requests + 2).await;
        assert_eq!(drifts(&registry), 0, "drifts counted");
    })
    .await
    .expect("in time");
}

/// `n` tunnels of `target`'s account and token (`Uuid`s 0x100 on), each with a document of
/// its own (`t{i}.example.com`).
fn tunnels(
    target: &cftunnel_controller::cloudflare::TunnelTarget,
    n: u128,
) -> Vec<(cftunnel_controller::cloudflare::TunnelTarget, Value)> {
    (0..n)
        .map(|i| {
            let target = cftunnel_controller::cloudflare::TunnelTarget {
                tunnel: uuid::Uuid::from_u128(0x100 + i),
                ..target.clone()
            };
            let document = json!({"ingress": [
                {"hostname": format!("t{i}.example.com"), "service": "http://localhost:8080"},
                {"service": "http_status:404"},
            ]});
            (target, document)
        })
        .collect()
}

/// Calls `sync_all` of `work` until every document of it is written (eight are written at
/// once).
async fn write_all(
    sync: &mut cftunnel_controller::cloudflare::TunnelSync,
    api: &cftunnel_controller::cloudflare::TunnelApi,
    work: &[(cftunnel_controller::cloudflare::TunnelTarget, Value)],
) {
    use cftunnel_controller::cloudflare::Synced;
    for _ in 0..50 {
        let results = sync.sync_all(api, work.to_vec()).await;
        if results.iter().all(|r| *r == Ok(Synced::Held)) {
            return;
        }
        assert!(
            results
                .iter()
                .all(|r| matches!(r, Ok(Synced::Wrote | Synced::Behind | Synced::Held))),
            "{results:?}"
        );
    }
    panic!("every document written within 50 calls");
}

/// Tunnels all due (written together, a period and its tenth ago) are all read back after
/// the one call that finds them due, with no other call: two at a time, the others waiting
/// for a place.
#[tokio::test]
async fn every_tunnel_due_is_read_back_after_one_call_two_at_a_time() {
    use cftunnel_controller::cloudflare::Synced;
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut registry = prometheus_client::registry::Registry::default();
        let (cloudflare, api, target, _) = read_back_setup(&mut registry).await;
        let api = api.paced(Duration::from_millis(1), 1000);
        let wake = Arc::new(tokio::sync::Notify::new());
        let period = Duration::from_millis(300);
        let mut sync = reading_back_sync(period, &wake);
        let work = tunnels(&target, 5);
        write_all(&mut sync, &api, &work).await;
        let puts = cloudflare.put_events().len();
        // Each falls due a period and up to a tenth of it after its write.
        tokio::time::sleep(period + period / 10 + Duration::from_millis(50)).await;
        let requests = cloudflare.requests();
        let hold = cloudflare.hold();
        let results = sync.sync_all(&api, work.clone()).await;
        assert_eq!(results, vec![Ok(Synced::Held); 5]);
        tokio::time::timeout(Duration::from_secs(5), async {
            while cloudflare.held() < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("two reads at the API");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(cloudflare.held(), 2, "two at once, no more");
        drop(hold);
        answered(&cloudflare, requests + 5).await;
        assert_eq!(cloudflare.put_events().len(), puts, "nothing written");
    })
    .await
    .expect("in time");
}

/// With more tunnels due than reads may be outstanding (64), one call starts 64; the end of
/// the last of them wakes the loop (long before the next read falls due, four seconds on), and
/// the call it brings starts the rest.
#[tokio::test]
async fn reads_back_beyond_64_start_once_those_outstanding_end() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut registry = prometheus_client::registry::Registry::default();
        let (cloudflare, api, target, _) = read_back_setup(&mut registry).await;
        let api = api.paced(Duration::from_millis(1), 1000);
        let wake = Arc::new(tokio::sync::Notify::new());
        let period = Duration::from_secs(4);
        let mut sync = reading_back_sync(period, &wake);
        let work = tunnels(&target, 66);
        write_all(&mut sync, &api, &work).await;
        tokio::time::sleep(period + period / 10 + Duration::from_millis(50)).await;
        forget_wake(&wake).await;
        let requests = cloudflare.requests();
        let hold = cloudflare.hold();
        sync.sync_all(&api, work.clone()).await;
        drop(hold);
        // Well before the next read falls due.
        tokio::time::timeout(period / 2, wake.notified())
            .await
            .expect("the last read outstanding wakes the loop");
        assert_eq!(cloudflare.requests(), requests + 64, "64 read, 2 left");
        sync.sync_all(&api, work.clone()).await;
        answered(&cloudflare, requests + 66).await;
    })
    .await
    .expect("in time");
}

/// The tunnel documents `registry`'s client found changed elsewhere.
fn drifts(registry: &prometheus_client::registry::Registry) -> u64 {
    let mut metrics = String::new();
    prometheus_client::encoding::text::encode(&mut metrics, registry).expect("encoded");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("cloudflare_tunnel_document_drifts_total "))
        .map_or(0, |n| n.parse().expect("a count"))
}

/// Reads back of `registry`'s client that failed without a request, the API token waiting out
/// a 429.
fn reads_not_sent(registry: &prometheus_client::registry::Registry) -> u64 {
    let mut metrics = String::new();
    prometheus_client::encoding::text::encode(&mut metrics, registry).expect("encoded");
    metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix(
                "cloudflare_api_errors_total{call=\"get_configuration\",status=\"rate_limited\"} ",
            )
        })
        .map_or(0, |n| n.parse().expect("a count"))
}

/// Reads back of `registry`'s client that found no API to call (connection refused).
fn reads_unreachable(registry: &prometheus_client::registry::Registry) -> u64 {
    let mut metrics = String::new();
    prometheus_client::encoding::text::encode(&mut metrics, registry).expect("encoded");
    metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix(
                "cloudflare_api_errors_total{call=\"get_configuration\",status=\"unreachable\"} ",
            )
        })
        .map_or(0, |n| n.parse().expect("a count"))
}

/// The 64 reads back one call starts may all end before that call is through with the
/// tunnels due after them (here each fails at once: the API's address refuses connections,
/// and 4,000 more tunnels are due). Their end still wakes the loop for those left, well
/// before the next read falls due, and the calls it brings start them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_back_left_for_lack_of_room_start_even_when_those_outstanding_end_at_once() {
    use cftunnel_controller::cloudflare::{ApiCalls, TunnelApi};
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut registry = prometheus_client::registry::Registry::default();
        let (_cloudflare, api, target, _) = read_back_setup(&mut registry).await;
        let api = api.paced(Duration::from_millis(1), 100_000);
        let wake = Arc::new(tokio::sync::Notify::new());
        let period = Duration::from_secs(8);
        let mut sync = reading_back_sync(period, &wake);
        let work = tunnels(&target, 64 + 4000);
        // A few at a time: each call goes through every tunnel it is given.
        for some in work.chunks(64) {
            write_all(&mut sync, &api, some).await;
        }
        tokio::time::sleep(period + period / 10 + Duration::from_millis(50)).await;
        // The same records, read through an address that refuses connections.
        let (closed, _held) =
            cftunnel_testkit::ports::refusing_addr().expect("an address that refuses connections");
        let gone = format!("http://{closed}");
        let mut unreachable = prometheus_client::registry::Registry::default();
        let calls = ApiCalls::default();
        calls.register(&mut unreachable);
        let api = TunnelApi::new(&gone, Duration::from_secs(5))
            .expect("client")
            .counted(calls)
            .paced(Duration::from_millis(1), 100_000);
        forget_wake(&wake).await;
        let called = tokio::time::Instant::now();
        sync.sync_all(&api, work.clone()).await;
        // Long before the next read falls due, a period after this call.
        let until = called + Duration::from_secs(5);
        while reads_unreachable(&unreachable) < 128 {
            tokio::time::timeout_at(until, wake.notified())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "woken for the reads left; {} read so far",
                        reads_unreachable(&unreachable)
                    )
                });
            sync.sync_all(&api, work.clone()).await;
        }
    })
    .await
    .expect("in time");
}

/// While the API token waits out a 429 (2 s here), tunnels that fall due are not read: each
/// read would fail at once, sending nothing, and the end of each batch of 64 would bring the
/// next round at once, back to back through every tunnel due. The one wake comes as the 429's
/// wait ends, and the calls it brings read all 70.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_due_during_a_429_are_read_back_once_its_wait_ends() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut registry = prometheus_client::registry::Registry::default();
        let (cloudflare, api, target, _) = read_back_setup(&mut registry).await;
        let api = api.paced(Duration::from_millis(1), 100_000);
        let wake = Arc::new(tokio::sync::Notify::new());
        let period = Duration::from_secs(4);
        let mut sync = reading_back_sync(period, &wake);
        let work = tunnels(&target, 70);
        for some in work.chunks(64) {
            write_all(&mut sync, &api, some).await;
        }
        tokio::time::sleep(period + period / 10 + Duration::from_millis(50)).await;
        cloudflare.rate_limit_next(2);
        api.get_configuration(&target)
            .await
            .expect_err("answered 429");
        let limited = tokio::time::Instant::now();
        forget_wake(&wake).await;
        let requests = cloudflare.requests();
        sync.sync_all(&api, work.clone()).await;
        tokio::time::timeout(Duration::from_secs(10), wake.notified())
            .await
            .expect("woken as the 429's wait ends");
        assert!(
            limited.elapsed() >= Duration::from_millis(1900),
            "no round before the wait ends: woken after {:?}",
            limited.elapsed()
        );
        assert_eq!(reads_not_sent(&registry), 0, "no read failed unsent");
        assert_eq!(cloudflare.requests(), requests, "nothing read meanwhile");
        sync.sync_all(&api, work.clone()).await;
        tokio::time::timeout(Duration::from_secs(5), wake.notified())
            .await
            .expect("the end of the 64 reads wakes the loop for the 6 left");
        sync.sync_all(&api, work.clone()).await;
        answered(&cloudflare, requests + 70).await;
    })
    .await
    .expect("in time");
}

/// Calls of `sync` on each wake (within 10 s) until one writes: when that call started and
/// when it ended.
async fn rewritten(
    sync: &mut cftunnel_controller::cloudflare::TunnelSync,
    api: &cftunnel_controller::cloudflare::TunnelApi,
    target: &cftunnel_controller::cloudflare::TunnelTarget,
    document: &Value,
    wake: &tokio::sync::Notify,
) -> (std::time::Instant, std::time::Instant) {
    loop {
        tokio::time::timeout(Duration::from_secs(10), wake.notified())
            .await
            .expect("a wake comes");
        let started = std::time::Instant::now();
        if sync.sync(api, target, document).await == Ok(true) {
            return (started, std::time::Instant::now());
        }
    }
}

/// Something else that keeps writing the tunnel (edited again right after each of the
/// controller's writes) finds the controller reading it back less often: a period after the
/// first write, two after the first rewrite, four after the second (a period being a second
/// here). The read that then finds the document as written brings the period back at once:
/// the next read comes a period after it, not four. On several threads, so that the reads'
/// ends and the calls interleave as they do in the controller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_changed_elsewhere_again_and_again_is_read_back_less_often() {
    use cftunnel_controller::cloudflare::TunnelApi;
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut registry = prometheus_client::registry::Registry::default();
        let (cloudflare, api, target, document) = read_back_setup(&mut registry).await;
        let wake = Arc::new(tokio::sync::Notify::new());
        let period = Duration::from_secs(1);
        let mut sync = reading_back_sync(period, &wake);
        let other = TunnelApi::new(&cloudflare.base(), Duration::from_secs(5)).expect("client");
        let edited = json!({"ingress": [
            {"hostname": "a.example.com", "service": "http://localhost:8080"},
            {"service": "http_status:404"},
        ]});
        let mut wrote = std::time::Instant::now();
        assert_eq!(sync.sync(&api, &target, &document).await, Ok(true));
        for (drifts, periods) in [(1, 1), (2, 2)] {
            other
                .put_configuration(&target, &edited)
                .await
                .expect("written by the other writer");
            let (started, ended) = rewritten(&mut sync, &api, &target, &document, &wake).await;
            let waited = ended - wrote;
            assert!(
                waited >= period * periods,
                "drift {drifts} found {waited:?} after the write before, not {periods} periods"
            );
            assert!(
                waited < period * (periods + 1),
                "drift {drifts} found {waited:?} after the write before: too late"
            );
            wrote = started;
        }
        // Left alone now: read four periods on, found as written, and a period after that
        // read again.
        let reads = cloudflare.config_reads().len();
        let puts = cloudflare.put_events().len();
        calls_until(&mut sync, &api, &target, &document, &wake, || {
            cloudflare.config_reads().len() >= reads + 2
        })
        .await;
        let at = cloudflare.config_reads();
        let (found, next) = (at[reads], at[reads + 1]);
        let waited = found - wrote;
        assert!(
            waited >= period * 4 && waited < period * 5,
            "read {waited:?} after the last write, not four periods"
        );
        // Four periods again, had the count of drifts held on.
        let after = next - found;
        assert!(
            after >= period / 2 && after < period * 5 / 2,
            "read again {after:?} after the read that found the document as written, not a period"
        );
        assert_eq!(cloudflare.put_events().len(), puts, "nothing written");
        assert_eq!(drifts(&registry), 2, "drifts counted");
    })
    .await
    .expect("in time");
}

/// A read back under way while the document changes and is written (its answer held by the
/// API: all requests, the write's too, or only reads, so that it answers with the new
/// document) leaves no trace: no second write, and what the tunnel carries is what the write
/// left.
#[tokio::test]
async fn a_read_back_under_way_as_the_document_is_written_changes_nothing() {
    for reads_only in [false, true] {
        tokio::time::timeout(Duration::from_secs(30), async {
            let mut registry = prometheus_client::registry::Registry::default();
            let (cloudflare, api, target, document) = read_back_setup(&mut registry).await;
            let wake = Arc::new(tokio::sync::Notify::new());
            let period = Duration::from_millis(300);
            let mut sync = cftunnel_controller::cloudflare::TunnelSync::with_retry(
                Duration::from_secs(5),
                Duration::from_secs(60),
            )
            .waiting_at_most(Duration::from_secs(2), Arc::clone(&wake))
            .reading_back(period);
            assert_eq!(sync.sync(&api, &target, &document).await, Ok(true));
            forget_wake(&wake).await;
            tokio::time::timeout(Duration::from_secs(5), wake.notified())
                .await
                .expect("the read's timer wakes");
            let hold = if reads_only {
                cloudflare.hold_reads()
            } else {
                cloudflare.hold()
            };
            assert_eq!(sync.sync(&api, &target, &document).await, Ok(false));
            tokio::time::timeout(Duration::from_secs(5), async {
                while cloudflare.held() < 1 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .expect("the read at the API");

            let changed = json!({"ingress": [
                {"hostname": "a.example.com", "service": "http://localhost:8080"},
                {"hostname": "d.example.com", "service": "http://localhost:8080"},
                {"service": "http_status:404"},
            ]});
            let written = sync.sync(&api, &target, &changed).await;
            assert_eq!(written, Ok(reads_only), "written at once unless held");
            drop(hold);
            if !reads_only {
                let results = calls_until(&mut sync, &api, &target, &changed, &wake, || {
                    cloudflare.config("acct", TUNNEL_ID).map(|(_, d)| d) == Some(changed.clone())
                })
                .await;
                assert_eq!(results.last(), Some(&Ok(true)), "{results:?}");
            }
            let puts = cloudflare.put_events().len();
            let work = vec![(target.clone(), changed.clone())];
            calls_during(&mut sync, &api, &work, &wake, period * 3).await;
            assert_eq!(
                cloudflare.put_events().len(),
                puts,
                "written once (reads only: {reads_only})"
            );
            let landed = sync.landed(&target.tunnel).expect("landed");
            assert!(landed.carries(&["d.example.com".to_owned()]));
            assert!(!landed.carries(&["b.example.com".to_owned()]));
            assert_eq!(drifts(&registry), 0, "drifts counted");
        })
        .await
        .unwrap_or_else(|_| panic!("in time (reads only: {reads_only})"));
    }
}

/// tenant-a's generated config-API token Secret.
fn token_secret(t: &Tenant) -> Option<Value> {
    t.api.get("v1", "Secret", "tenant-a", "cf-proxy-edge-auth")
}

/// The token a Secret holds under `token`, if a proxy takes it.
fn token_a_proxy_takes(secret: &Value) -> Option<String> {
    use base64::Engine as _;
    let encoded = secret.pointer("/data/token")?.as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .expect("the API server's data is base64");
    let text = String::from_utf8(bytes).ok()?;
    cftunnel_config::auth_token::check(&text)
        .ok()
        .map(str::to_owned)
}

/// The credentials digest the render gives tenant-a's plane from the objects the API server
/// holds now: what the pod template of its Deployment carries once it is applied.
fn rendered_credentials_hash(t: &Tenant) -> Value {
    use cftunnel_controller::render;
    use k8s_openapi::api::core::v1::Secret;
    let get = |api_version: &str, kind: &str, name: &str| {
        t.api
            .get(api_version, kind, "tenant-a", name)
            .unwrap_or_else(|| panic!("{kind} tenant-a/{name}"))
    };
    let gateway: gateway_api::experimental::gateways::Gateway =
        serde_json::from_value(get("gateway.networking.k8s.io/v1", "Gateway", "edge"))
            .expect("a Gateway");
    let config: cftunnel_controller::gateway_config::GatewayConfig = serde_json::from_value(get(
        "cf.k8s.lex.la/v1alpha1",
        "GatewayConfig",
        "edge-config",
    ))
    .expect("a GatewayConfig");
    let secrets: Vec<Arc<Secret>> = t
        .api
        .list("Secret")
        .into_iter()
        .map(|s| Arc::new(serde_json::from_value(s).expect("a Secret")))
        .collect();
    let credentials =
        render::resolve(&gateway, &config, &secrets, "not drawn").expect("the credentials resolve");
    let plane = render::render(&gateway, &config, &credentials, &Tenant::options().render)
        .expect("the plane renders");
    let annotations = plane
        .deployment
        .spec
        .and_then(|s| s.template.metadata)
        .and_then(|m| m.annotations)
        .unwrap_or_default();
    json!(annotations.get(render::CREDENTIALS_HASH_ANNOTATION))
}

/// A generated token Secret edited to hold a token no proxy takes (a character outside
/// printable ASCII, a line break inside) or no token at all: the proxy would refuse it at
/// start, so its pods would exit and the rollout stick. Within a few rounds the Secret holds a
/// new token a proxy takes, the Deployment's pods are rolled onto it, and the plane is left
/// alone again: not applied at every round.
#[tokio::test]
async fn a_generated_token_secret_edited_to_a_token_no_proxy_takes_is_written_anew() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start_with("replicas: 1", |api| {
            // Without authTokenSecretRef: the controller generates the token Secret.
            api.put(yaml(
                "apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayConfig\nmetadata: {name: edge-config, namespace: tenant-a}\nspec: {tunnelTokenSecretRef: {name: edge-tunnel-token}, replicas: 1}\n",
            ));
        })
        .await;
        let mut token = eventually("the generated token", || {
            token_secret(&t).and_then(|s| token_a_proxy_takes(&s))
        })
        .await;
        settled(&t.api).await;
        let hash = || {
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
                .and_then(|d| {
                    d.pointer("/spec/template/metadata/annotations/cf.k8s.lex.la~1credentials-hash")
                        .cloned()
                })
        };
        assert_eq!(hash(), Some(rendered_credentials_hash(&t)));

        let (applies, _counting) = count(&t, |c| {
            c.method == "PATCH" && c.kind == "Deployment" && c.name == Some("cf-proxy-edge")
        });
        for edit in [
            Some("p\u{e4}ssword"),
            Some("tok\nen"),
            // Holds no token under either key.
            None,
        ] {
            let mut secret = token_secret(&t).expect("the generated Secret");
            if let Some(o) = secret.as_object_mut() {
                o.remove("data");
            }
            if let Some(edit) = edit {
                secret["stringData"] = json!({ "token": edit });
            }
            t.api.put(secret);
            let anew = within(15, &format!("a token a proxy takes after {edit:?}"), || {
                token_secret(&t)
                    .and_then(|s| token_a_proxy_takes(&s))
                    .filter(|new| *new != token)
            })
            .await;
            token = anew;
            settled(&t.api).await;
            assert_eq!(
                hash(),
                Some(rendered_credentials_hash(&t)),
                "the pods rolled onto the new token after {edit:?}"
            );
            assert_eq!(
                token_secret(&t).and_then(|s| token_a_proxy_takes(&s)),
                Some(token.clone()),
                "the new token kept"
            );
            // Rounds every 100 ms: none applies the plane again.
            let before = applies.load(Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(1500)).await;
            assert_eq!(
                applies.load(Ordering::SeqCst),
                before,
                "not applied at every round after {edit:?}"
            );
        }
        t.stop().await;
    })
    .await
    .expect("in time");
}
