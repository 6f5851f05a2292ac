//! Config pushes to real proxies on loopback: each pod gets the plane's config once, again after
//! it restarts in place, never an older version, and failures say which pod and why.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use cftunnel_config::valid::Costs;
use cftunnel_config::{Backend, Config, Rule};
use cftunnel_controller::push::{PlaneOutcome, PlaneRound, PodOutcome, Pusher};
use cftunnel_controller::translate::{ObjectKey, PlaneKey};
use cftunnel_proxy::{Server, ServerOptions};
use cftunnel_testkit::echo::EchoServer;

const TOKEN: &str = "plane-token";

fn plane() -> PlaneKey {
    PlaneKey::Dedicated(ObjectKey::new("tenant-a", "edge"))
}

fn config(backend: SocketAddr, host: &str) -> Config {
    Config {
        rules: vec![Rule {
            hostnames: vec![host.to_owned()],
            backends: vec![Backend {
                url: format!("http://{backend}"),
                weight: 1,
                ..Backend::default()
            }],
            ..Rule::default()
        }],
        ..Config::default()
    }
}

async fn proxy_at(admin: SocketAddr) -> Server {
    proxy_with_token(admin, TOKEN).await
}

async fn proxy_with_token(admin: SocketAddr, token: &str) -> Server {
    Server::start(
        ServerOptions {
            admin_addr: admin,
            auth_token: Some(token.to_owned()),
            ..ServerOptions::default()
        },
        None,
    )
    .await
    .expect("the proxy starts")
}

/// A proxy on the address a stopped one had; the old listener may take a moment to close.
async fn restarted_at(admin: SocketAddr) -> Server {
    for _ in 0..100 {
        if std::net::TcpListener::bind(admin).is_ok() {
            return proxy_at(admin).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{admin} was not released");
}

async fn proxy() -> Server {
    proxy_at(SocketAddr::from(([127, 0, 0, 1], 0))).await
}

async fn get(addr: SocketAddr, path: &str, host: &str, bearer: Option<&str>) -> (u16, String) {
    let answer = support::request(addr, "GET", path, host, bearer, "")
        .await
        .expect("the server answers");
    (
        answer.status,
        String::from_utf8_lossy(&answer.body).into_owned(),
    )
}

/// The version a proxy reports on its config API.
async fn held(server: &Server) -> i64 {
    let (status, body) = get(server.admin_addr(), "/config", "proxy", Some(TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    let state: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    state["version"].as_i64().expect("a version")
}

async fn echo() -> EchoServer {
    support::echo("tenant-a", "web").await
}

#[tokio::test]
async fn each_pod_gets_the_config_once_and_again_after_restarting_in_place() {
    let backend = echo().await;
    let (a, b) = (proxy().await, proxy().await);
    let pods = [a.admin_addr(), b.admin_addr()];
    let mut pusher = Pusher::default();
    let first = config(backend.http_addr(), "one.example.com");

    let round = pusher.sync(&plane(), &first, TOKEN, &pods).await;
    assert_eq!(
        round.pods,
        vec![(pods[0], PodOutcome::Pushed), (pods[1], PodOutcome::Pushed)]
    );
    assert!(round.all_current() && !round.sustained_failure);
    let v1 = round.version;
    assert_eq!((held(&a).await, held(&b).await), (v1, v1));
    let data = a.data_addr();
    assert_eq!(get(data, "/", "one.example.com", None).await.0, 200);

    // Nothing changed: nothing is pushed.
    let round = pusher.sync(&plane(), &first, TOKEN, &pods).await;
    assert_eq!(round.version, v1);
    assert!(round.pods.iter().all(|(_, o)| *o == PodOutcome::Current));

    // A changed config gets a later version everywhere.
    let second = config(backend.http_addr(), "two.example.com");
    let round = pusher.sync(&plane(), &second, TOKEN, &pods).await;
    let v2 = round.version;
    assert!(v2 > v1);
    assert!(round.pods.iter().all(|(_, o)| *o == PodOutcome::Pushed));
    assert_eq!(
        get(b.data_addr(), "/", "two.example.com", None).await.0,
        200
    );

    // Pod a restarts in place: same address, no table yet (it answers 502
    // until configured). Only it is pushed to.
    let admin = a.admin_addr();
    a.shutdown().await;
    let a = restarted_at(admin).await;
    assert_eq!(
        get(a.data_addr(), "/", "two.example.com", None).await.0,
        502
    );
    let round = pusher.sync(&plane(), &second, TOKEN, &pods).await;
    assert_eq!(round.version, v2);
    assert_eq!(
        round.pods,
        vec![
            (pods[0], PodOutcome::Pushed),
            (pods[1], PodOutcome::Current)
        ]
    );
    assert_eq!(held(&a).await, v2);
    assert_eq!(
        get(a.data_addr(), "/", "two.example.com", None).await.0,
        200
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn a_new_controller_moves_past_a_version_a_pod_already_holds() {
    let backend = echo().await;
    let pod = proxy().await;
    // An earlier controller, its clock far ahead, pushed this.
    let ahead = i64::from(i32::MAX) * 1_000_000;
    let mut earlier = config(backend.http_addr(), "old.example.com");
    earlier.version = ahead;
    pod.apply(earlier).await.expect("applied");

    let round = Pusher::default()
        .sync(
            &plane(),
            &config(backend.http_addr(), "new.example.com"),
            TOKEN,
            &[pod.admin_addr()],
        )
        .await;
    assert_eq!(round.version, ahead + 1);
    assert_eq!(round.pods[0].1, PodOutcome::Pushed);
    assert_eq!(held(&pod).await, ahead + 1);
    assert_eq!(
        get(pod.data_addr(), "/", "new.example.com", None).await.0,
        200
    );
    pod.shutdown().await;
}

#[tokio::test]
async fn failures_name_the_pod_and_count_as_sustained_only_when_repeated() {
    let backend = echo().await;
    let good = proxy().await;
    let (gone, _held) =
        cftunnel_testkit::ports::refusing_addr().expect("an address that refuses connections");
    let doc = config(backend.http_addr(), "app.example.com");
    let mut pusher = Pusher::new(Duration::from_secs(2), 3);

    for round in 1..=3u32 {
        let outcome = pusher
            .sync(&plane(), &doc, "not-the-token", &[good.admin_addr()])
            .await;
        match &outcome.pods[0].1 {
            PodOutcome::Failed(reason) => assert!(
                reason.contains("refused the config-API token (401)"),
                "{reason}"
            ),
            other => panic!("a wrong token is refused, got {other:?}"),
        }
        assert_eq!(outcome.failed_rounds, round);
        assert_eq!(outcome.sustained_failure, round == 3, "round {round}");
    }

    // One pod unreachable: the other still gets the config; the round counts as failed.
    let outcome = pusher
        .sync(&plane(), &doc, TOKEN, &[good.admin_addr(), gone])
        .await;
    assert_eq!(outcome.pods[0].1, PodOutcome::Pushed);
    match &outcome.pods[1].1 {
        PodOutcome::Failed(reason) => assert!(
            reason.contains(&format!("connecting to {gone}")),
            "{reason}"
        ),
        other => panic!("an unreachable pod fails, got {other:?}"),
    }
    assert!(outcome.sustained_failure);
    assert_eq!(
        get(good.data_addr(), "/", "app.example.com", None).await.0,
        200
    );

    // The first round that reaches every pod clears it.
    let outcome = pusher
        .sync(&plane(), &doc, TOKEN, &[good.admin_addr()])
        .await;
    assert_eq!(outcome.pods[0].1, PodOutcome::Current);
    assert_eq!(
        (outcome.failed_rounds, outcome.sustained_failure),
        (0, false)
    );
    good.shutdown().await;
}

#[tokio::test]
async fn a_plane_whose_pod_hangs_does_not_hold_up_the_others() {
    let backend = echo().await;
    let healthy = proxy().await;
    // Accepts connections and never answers.
    let hanging = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let hanging_addr = hanging.local_addr().expect("addr");
    let _held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((conn, _)) = hanging.accept().await {
            open.push(conn);
        }
    });
    let doc = config(backend.http_addr(), "app.example.com");
    let stuck = PlaneKey::Dedicated(ObjectKey::new("tenant-b", "stuck"));
    let healthy_pods = [healthy.admin_addr()];
    let stuck_pods = [hanging_addr];
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel();
    let round = {
        let doc = doc.clone();
        let (stuck, plane) = (stuck.clone(), plane());
        tokio::spawn(async move {
            let mut pusher = Pusher::new(Duration::from_secs(4), 3);
            let outcomes = pusher
                .sync_all(vec![
                    PlaneRound {
                        plane: stuck,
                        config: &doc,
                        costs: Costs::NONE,
                        token: TOKEN,
                        pods: &stuck_pods,
                        not_serving: &[],
                    },
                    PlaneRound {
                        plane,
                        config: &doc,
                        costs: Costs::NONE,
                        token: TOKEN,
                        pods: &healthy_pods,
                        not_serving: &[],
                    },
                ])
                .await;
            let _ = done_tx.send(());
            outcomes
        })
    };
    // The healthy plane has its config while the stuck one is still waiting for an answer.
    let by = std::time::Instant::now() + Duration::from_secs(3);
    while get(healthy.data_addr(), "/", "app.example.com", None)
        .await
        .0
        != 200
    {
        assert!(
            std::time::Instant::now() < by,
            "the healthy plane is pushed to"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        done_rx.try_recv().is_err(),
        "the round is still waiting on the stuck pod"
    );
    let outcomes = round.await.expect("round");
    assert!(
        matches!(&outcomes[0].1.pods[0].1, PodOutcome::Failed(r) if r.contains("no answer within")),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[1].1.pods[0].1, PodOutcome::Pushed);
    healthy.shutdown().await;
}

/// A pod of a plane that takes connections and never answers (its node gone) holds up no other
/// pod of the same plane: each pod goes from its version to its push on its own, so the healthy
/// one has the config at once, while the push still waits out the stuck one's timeout.
#[tokio::test]
async fn a_pod_that_hangs_holds_up_no_other_pod_of_its_plane() {
    let backend = echo().await;
    let healthy = proxy().await;
    let (hanging, _) = never_answers().await;
    let doc = config(backend.http_addr(), "app.example.com");
    let pods = [hanging, healthy.admin_addr()];
    let started = std::time::Instant::now();
    let round = tokio::spawn(async move {
        let mut pusher = Pusher::new(Duration::from_secs(5), 3);
        pusher.sync(&plane(), &doc, TOKEN, &pods).await
    });
    let by = started + Duration::from_secs(1);
    while get(healthy.data_addr(), "/", "app.example.com", None)
        .await
        .0
        != 200
    {
        assert!(
            std::time::Instant::now() < by,
            "the healthy pod has its config within a second"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !round.is_finished(),
        "the push still waits on the stuck pod"
    );
    let outcome = round.await.expect("round");
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "the stuck pod was waited for"
    );
    let by_pod: std::collections::HashMap<_, _> = outcome.pods.iter().cloned().collect();
    assert!(
        matches!(&by_pod[&hanging], PodOutcome::Failed(r) if r.contains("no answer within")),
        "{outcome:?}"
    );
    assert_eq!(by_pod[&healthy.admin_addr()], PodOutcome::Pushed);
    assert_eq!(held(&healthy).await, outcome.version);
    healthy.shutdown().await;
}

/// Pushes a plane of two pods an earlier controller, its clock far ahead, left at the versions
/// `first` (none: never pushed) and `second` with its own documents; the second pod answers
/// slower. Returns the version the plane ends on and what each pod then holds.
async fn push_past_an_earlier_controller(first: Option<i64>, second: i64) -> (i64, i64, i64) {
    let backend = echo().await;
    let pods = (proxy().await, proxy().await);
    for (pod, version) in [(&pods.0, first), (&pods.1, Some(second))] {
        if let Some(version) = version {
            let mut earlier = config(backend.http_addr(), "old.example.com");
            earlier.version = version;
            pod.apply(earlier).await.expect("applied");
        }
    }
    let doc = config(backend.http_addr(), "app.example.com");
    let slow = support::slow_port(pods.1.admin_addr(), Duration::from_millis(200)).await;
    let outcome = Pusher::default()
        .sync(&plane(), &doc, TOKEN, &[pods.0.admin_addr(), slow])
        .await;
    assert!(outcome.all_current(), "{outcome:?}");
    let held = (held(&pods.0).await, held(&pods.1).await);
    pods.0.shutdown().await;
    pods.1.shutdown().await;
    (outcome.version, held.0, held.1)
}

/// Pods of one plane found at different versions, one ahead of the controller's (pushed by an
/// earlier one) and slower to answer: the one that answered first, pushed the controller's
/// version, is brought past the one ahead too, so every pod ends on one version.
#[tokio::test]
async fn pods_of_a_plane_end_on_one_version_past_one_found_ahead() {
    let far = i64::from(i32::MAX) * 1_000_000;
    let ended = push_past_an_earlier_controller(None, far).await;
    assert_eq!(ended, (far + 1, far + 1, far + 1));
}

/// Two pods an earlier controller left at consecutive versions with its own documents: the
/// one found first raises the version to just past it, which the other already holds with a
/// document that is not ours. That one is not taken for current: both end on one version
/// past both, with this controller's document.
#[tokio::test]
async fn a_pod_at_the_version_raised_to_is_not_taken_for_current() {
    let far = i64::from(i32::MAX) * 1_000_000;
    let ended = push_past_an_earlier_controller(Some(far), far + 1).await;
    assert_eq!(ended, (far + 2, far + 2, far + 2));
}

/// A pod that serves nothing (its config port refuses connections, and it is not serving)
/// fails every round, counted, but makes no failure sustained: a failure of a serving pod is
/// sustained only after its own rounds, as ever.
#[tokio::test]
async fn a_pod_that_serves_nothing_makes_no_failure_sustained() {
    let backend = echo().await;
    let good = proxy().await;
    let (gone, _held) =
        cftunnel_testkit::ports::refusing_addr().expect("an address that refuses connections");
    let doc = config(backend.http_addr(), "app.example.com");
    let mut pusher = Pusher::new(Duration::from_secs(2), 2);
    let pods = [good.admin_addr(), gone];
    for _ in 0..4 {
        let outcomes = pusher
            .sync_all(vec![PlaneRound {
                plane: plane(),
                config: &doc,
                costs: Costs::NONE,
                token: TOKEN,
                pods: &pods,
                not_serving: &[gone],
            }])
            .await;
        let outcome = &outcomes[0].1;
        assert!(
            matches!(outcome.pods[1].1, PodOutcome::Failed(_)),
            "{outcome:?}"
        );
        assert_eq!(outcome.idle, [gone]);
        assert!(!outcome.sustained_failure, "{outcome:?}");
    }
    // Serving, the same pod's failures are sustained after their rounds.
    let outcome = pusher.sync(&plane(), &doc, TOKEN, &pods).await;
    assert!(outcome.idle.is_empty());
    assert!(!outcome.sustained_failure, "one round");
    let outcome = pusher.sync(&plane(), &doc, TOKEN, &pods).await;
    assert!(outcome.sustained_failure, "two rounds");
    good.shutdown().await;
}

/// A listener that accepts connections and never answers, as a pod whose proxy is stuck, and
/// the count of connections it took.
async fn never_answers() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = taken.clone();
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            open.push(conn);
        }
    });
    (addr, taken)
}

/// A round that waits a bounded time for its pushes goes on without a stuck one, which runs on
/// by itself, wakes the caller when it ends and is reported by the next round; a round that
/// finds the plane's next push still running returns that outcome again, marked as seen, and
/// as stale once the plane's document has changed.
#[tokio::test]
async fn a_stuck_push_goes_on_without_the_round_and_is_reported_by_a_later_one() {
    let backend = echo().await;
    let healthy = proxy().await;
    let (stuck_pod, dialed) = never_answers().await;
    let stuck_pods = [stuck_pod];
    let dialed = || dialed.load(std::sync::atomic::Ordering::SeqCst);
    let healthy_pods = [healthy.admin_addr()];
    let stuck = PlaneKey::Dedicated(ObjectKey::new("tenant-b", "stuck"));
    let doc = config(backend.http_addr(), "app.example.com");
    let changed = config(backend.http_addr(), "other.example.com");
    let rounds = |stuck_doc| {
        vec![
            PlaneRound {
                plane: stuck.clone(),
                config: stuck_doc,
                costs: Costs::NONE,
                token: TOKEN,
                pods: &stuck_pods,
                not_serving: &[],
            },
            PlaneRound {
                plane: plane(),
                config: &doc,
                costs: Costs::NONE,
                token: TOKEN,
                pods: &healthy_pods,
                not_serving: &[],
            },
        ]
    };
    let wake = std::sync::Arc::new(tokio::sync::Notify::new());
    let mut pusher = Pusher::new(Duration::from_secs(2), 3)
        .waiting_at_most(Duration::from_millis(300), wake.clone());

    let started = std::time::Instant::now();
    let first = pusher.sync_all(rounds(&doc)).await;
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "the round waited {:?}",
        started.elapsed()
    );
    // The stuck plane has no outcome yet; the healthy one was pushed to.
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].0, plane());
    assert_eq!(first[0].1.pods[0].1, PodOutcome::Pushed);
    assert_eq!(
        get(healthy.data_addr(), "/", "app.example.com", None)
            .await
            .0,
        200
    );

    // The stuck push ends at its timeout and says so.
    tokio::time::timeout(Duration::from_secs(5), wake.notified())
        .await
        .expect("the end of the stuck push wakes the caller");
    let second = pusher.sync_all(rounds(&doc)).await;
    assert_eq!(second.len(), 2, "{second:?}");
    let (plane_key, outcome) = &second[0];
    assert_eq!(*plane_key, stuck);
    assert!(
        matches!(&outcome.pods[0].1, PodOutcome::Failed(r) if r.contains("no answer within")),
        "{outcome:?}"
    );
    assert!(!outcome.repeated && !outcome.stale, "{outcome:?}");
    assert_eq!(second[1].1.pods[0].1, PodOutcome::Current);
    // The round that reports it does not push the same again to the pod that never answered:
    // the next change (or resync) does.
    assert_eq!(dialed(), 1, "the stuck pod was not pushed to again");

    // Its next push is running: the round repeats the outcome, seen, and stale for a new
    // document.
    let third = pusher.sync_all(rounds(&changed)).await;
    let outcome = &third[0].1;
    assert!(outcome.repeated && outcome.stale, "{outcome:?}");
    assert_eq!(dialed(), 2, "a changed document is pushed");
    assert!(!third[1].1.repeated, "{third:?}");
    healthy.shutdown().await;
}

/// A push that outlived its round's wait and ended with every pod taking it is reported by a
/// round with another document: stale, it says nothing of what the pods refuse of that one.
#[tokio::test]
async fn a_stale_outcome_does_not_know_what_the_pods_refuse() {
    let backend = echo().await;
    let pod = proxy().await;
    let slow = support::slow_port(pod.admin_addr(), Duration::from_millis(400)).await;
    let doc = config(backend.http_addr(), "app.example.com");
    let changed = config(backend.http_addr(), "other.example.com");
    let wake = std::sync::Arc::new(tokio::sync::Notify::new());
    let mut pusher = Pusher::new(Duration::from_secs(5), 3)
        .waiting_at_most(Duration::from_millis(100), wake.clone());
    let round = |config| {
        vec![PlaneRound {
            plane: plane(),
            config,
            costs: Costs::NONE,
            token: TOKEN,
            pods: std::slice::from_ref(&slow),
            not_serving: &[],
        }]
    };
    assert!(pusher.sync_all(round(&doc)).await.is_empty());
    tokio::time::timeout(Duration::from_secs(10), wake.notified())
        .await
        .expect("the end of the slow push wakes the caller");
    let later = pusher.sync_all(round(&changed)).await;
    let outcome = &later[0].1;
    assert!(outcome.all_current() && outcome.stale, "{outcome:?}");
    assert!(
        !outcome.refusals_known && !outcome.refusals_heard,
        "{outcome:?}"
    );
    pod.shutdown().await;
}

/// A push that outlived its round's wait and failed is reported even when the next push of
/// its plane (to other pods) finishes first: the earlier outcome comes out in the next round,
/// and the later one in the round after, so neither a failure nor a duration goes uncounted.
#[tokio::test]
async fn a_slow_push_is_reported_though_a_quicker_one_follows_it() {
    let backend = echo().await;
    let healthy = proxy().await;
    let (stuck_pod, _) = never_answers().await;
    let doc = config(backend.http_addr(), "app.example.com");
    let wake = std::sync::Arc::new(tokio::sync::Notify::new());
    let mut pusher = Pusher::new(Duration::from_millis(800), 3)
        .waiting_at_most(Duration::from_millis(200), wake.clone());
    let round = |pods| {
        vec![PlaneRound {
            plane: plane(),
            config: &doc,
            costs: Costs::NONE,
            token: TOKEN,
            pods,
            not_serving: &[],
        }]
    };
    let stuck = [stuck_pod];
    let moved = [healthy.admin_addr()];
    assert!(
        pusher.sync_all(round(&stuck)).await.is_empty(),
        "still running"
    );
    tokio::time::timeout(Duration::from_secs(5), wake.notified())
        .await
        .expect("woken");
    // The plane's pods changed meanwhile: pushed to at once, and done within the wait.
    let first = pusher.sync_all(round(&moved)).await;
    assert!(
        matches!(&first[0].1.pods[0].1, PodOutcome::Failed(r) if r.contains("no answer within")),
        "the slow push's outcome first: {first:?}"
    );
    assert!(!first[0].1.repeated);
    let second = pusher.sync_all(round(&moved)).await;
    assert_eq!(
        second[0].1.pods,
        vec![(healthy.admin_addr(), PodOutcome::Pushed)]
    );
    assert!(!second[0].1.repeated, "then the quick one's: {second:?}");
    healthy.shutdown().await;
}

/// Rounds follow changes anywhere in the cluster, so a pod that is still starting can fail
/// several of them within a second: a failure counts as sustained only once its failed rounds
/// have also lasted the time the pusher asks for.
#[tokio::test]
async fn a_failure_is_sustained_only_once_it_has_lasted() {
    let backend = echo().await;
    let (starting, _held) =
        cftunnel_testkit::ports::refusing_addr().expect("an address that refuses connections");
    let doc = config(backend.http_addr(), "app.example.com");
    let lasting = Duration::from_millis(600);
    let mut pusher = Pusher::new(Duration::from_secs(2), 3).failing_for(lasting);
    for round in 1..=5u32 {
        let outcome = pusher.sync(&plane(), &doc, TOKEN, &[starting]).await;
        assert_eq!(outcome.failed_rounds, round);
        assert!(!outcome.sustained_failure, "round {round}, at once");
    }
    tokio::time::sleep(lasting).await;
    let outcome = pusher.sync(&plane(), &doc, TOKEN, &[starting]).await;
    assert!(
        outcome.sustained_failure,
        "failing for {lasting:?} and 6 rounds"
    );
}

/// The plane's token rotates: pods started before it still hold the old token until the
/// rollout replaces them. They keep getting route changes with it, and the round does not
/// count as failed; a pod that takes neither token still fails.
#[tokio::test]
async fn pods_that_still_hold_the_token_before_a_rotation_keep_getting_pushes() {
    let backend = echo().await;
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let old = proxy_with_token(any, TOKEN).await;
    let mut pusher = Pusher::new(Duration::from_secs(2), 1);
    let first = config(backend.http_addr(), "one.example.com");
    let round = pusher
        .sync(&plane(), &first, TOKEN, &[old.admin_addr()])
        .await;
    assert_eq!(round.pods[0].1, PodOutcome::Pushed);

    let new = proxy_with_token(any, "rotated").await;
    let pods = [old.admin_addr(), new.admin_addr()];
    let second = config(backend.http_addr(), "two.example.com");
    let round = pusher.sync(&plane(), &second, "rotated", &pods).await;
    assert_eq!(
        round.pods,
        vec![(pods[0], PodOutcome::Pushed), (pods[1], PodOutcome::Pushed)]
    );
    assert!(!round.sustained_failure, "a rotation is not a failure");
    for server in [&old, &new] {
        assert_eq!(
            get(server.data_addr(), "/", "two.example.com", None)
                .await
                .0,
            200
        );
    }
    let round = pusher.sync(&plane(), &second, "rotated", &pods).await;
    assert!(round.pods.iter().all(|(_, o)| *o == PodOutcome::Current));

    // The rollout is over once every pod takes the new token: the old one is forgotten, and
    // an address still holding it is refused rather than offered it.
    let round = pusher
        .sync(&plane(), &second, "rotated", &[new.admin_addr()])
        .await;
    assert!(round.all_current());
    let round = pusher
        .sync(&plane(), &second, "rotated", &[old.admin_addr()])
        .await;
    assert!(
        matches!(&round.pods[0].1, PodOutcome::Failed(r) if r.contains("(401)")),
        "{:?}",
        round.pods
    );

    let stranger = proxy_with_token(any, "someone-else").await;
    let round = pusher
        .sync(&plane(), &second, "rotated", &[stranger.admin_addr()])
        .await;
    assert!(
        matches!(&round.pods[0].1, PodOutcome::Failed(r) if r.contains("(401)")),
        "{:?}",
        round.pods
    );
    assert!(round.sustained_failure);
    for server in [old, new, stranger] {
        server.shutdown().await;
    }
}

/// A plane whose pods run two releases during an upgrade: the older one cannot read a CORS
/// filter. Its refusal names the rule; the rule is left out and the rest of the document is
/// pushed in the same round to every pod, so both serve the same routes; later rounds push
/// the document without it at once, pods joining beside them too, until the pod that refused
/// is gone.
#[tokio::test]
async fn a_rule_an_older_pod_refuses_is_left_out_and_the_rest_is_pushed_in_the_same_round() {
    use cftunnel_controller::push::RefusedRule;
    use cftunnel_testkit::older_proxy::OlderProxy;

    let backend = echo().await;
    let (current, behind) = (proxy().await, proxy().await);
    let older = OlderProxy::start(behind.admin_addr())
        .await
        .expect("the older pod starts");
    let pods = [current.admin_addr(), older.addr()];
    let rule = |host: &str, name: &str| Rule {
        name: Some(name.to_owned()),
        ..config(backend.http_addr(), host).rules.remove(0)
    };
    let cors = cors_filter();
    let doc = Config {
        rules: vec![
            rule("one.example.com", "shop/one/0"),
            Rule {
                filters: vec![cors],
                ..rule("cors.example.com", "shop/cors/0")
            },
            rule("three.example.com", "shop/three/0"),
        ],
        ..Config::default()
    };
    let mut pusher = Pusher::default();

    let round = pusher.sync(&plane(), &doc, TOKEN, &pods).await;
    assert_eq!(round.refused.len(), 1, "{round:?}");
    let RefusedRule {
        rule,
        name,
        pod,
        reason,
    } = &round.refused[0];
    assert_eq!(
        (*rule, name.as_deref(), *pod),
        (1, Some("shop/cors/0"), Some(older.addr()))
    );
    assert!(
        reason.contains("rules[1].filters[0].type: unknown variant `CORS`"),
        "{reason}"
    );
    assert!(round.all_current(), "every pod took the rest: {round:?}");
    assert_eq!(held(&current).await, round.version);
    assert_eq!(held(&behind).await, round.version, "the older pod too");
    for server in [&current, &behind] {
        let data = server.data_addr();
        assert_eq!(get(data, "/", "one.example.com", None).await.0, 200);
        assert_eq!(get(data, "/", "three.example.com", None).await.0, 200);
        assert_eq!(
            get(data, "/", "cors.example.com", None).await.0,
            404,
            "both pods serve the same document"
        );
    }

    // The next round pushes nothing and still reports the refusal.
    let again = pusher.sync(&plane(), &doc, TOKEN, &pods).await;
    assert_eq!(again.version, round.version);
    assert!(again.pods.iter().all(|(_, o)| *o == PodOutcome::Current));
    assert_eq!(again.refused, round.refused);

    // A pod that joins beside them (the autoscaler at work) does not make the plane find the
    // refusal out again: it gets the same document, at the same version.
    let joined = proxy().await;
    let scaled_pods = [pods[0], pods[1], joined.admin_addr()];
    let scaled = pusher.sync(&plane(), &doc, TOKEN, &scaled_pods).await;
    assert_eq!(scaled.version, round.version, "{scaled:?}");
    assert_eq!(scaled.refused, round.refused);
    assert!(scaled.all_current(), "{scaled:?}");
    assert_eq!(held(&joined).await, round.version);

    // The older pod is gone (the rollout finished): the whole document is offered again.
    let upgraded = pusher.sync(&plane(), &doc, TOKEN, &pods[..1]).await;
    assert!(upgraded.refused.is_empty(), "{upgraded:?}");
    assert!(upgraded.version > round.version);
    assert_eq!(
        get(current.data_addr(), "/", "cors.example.com", None)
            .await
            .0,
        200
    );
}

/// More rules refused than a round leaves out (seven): the round does not know all the pods
/// refuse, nor does a round after it that no pod answers (what was found stands, still only
/// part), and the next round every pod answers finds the rest; one that some pods answer
/// (another failing) hears what they refuse, not all of it. A round after the pod that
/// refused is replaced keeps the refusals it did not reach again, as they were, rather than
/// drop them for a round: one whose pods do not answer yet (it reached none), and one cut off
/// (the replacing pod, of the same release, refusing more than the round leaves out).
#[tokio::test]
async fn a_round_cut_off_keeps_the_refusals_it_did_not_check_again() {
    use cftunnel_testkit::older_proxy::OlderProxy;

    let backend = echo().await;
    let behind = proxy().await;
    let older = OlderProxy::start(behind.admin_addr())
        .await
        .expect("the older pod starts");
    let cors = cors_filter();
    let rule = |i: usize| Rule {
        name: Some(format!("shop/cors{i}/0")),
        filters: vec![cors.clone()],
        ..config(backend.http_addr(), &format!("cors{i}.example.com"))
            .rules
            .remove(0)
    };
    let doc = Config {
        rules: (0..10).map(rule).collect(),
        ..Config::default()
    };
    let mut pusher = Pusher::default();
    let by = |round: &cftunnel_controller::push::PlaneOutcome, pod: SocketAddr| {
        round.refused.iter().filter(|r| r.pod == Some(pod)).count()
    };

    let first = pusher.sync(&plane(), &doc, TOKEN, &[older.addr()]).await;
    assert_eq!(
        (
            first.refused.len(),
            first.refusals_known,
            first.refusals_heard
        ),
        (7, false, false),
        "{first:?}"
    );
    // The pod's config port goes away for a round: no pod answers, and the seven found stand,
    // still only part of what the pods refuse.
    let closed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let away = support::gated_port(older.addr(), closed).await;
    let unheard = pusher.sync(&plane(), &doc, TOKEN, &[away]).await;
    assert_eq!(
        (
            by(&unheard, older.addr()),
            unheard.refusals_known,
            unheard.refusals_heard
        ),
        (7, false, false),
        "{unheard:?}"
    );
    let second = pusher.sync(&plane(), &doc, TOKEN, &[older.addr()]).await;
    assert_eq!(
        (
            second.refused.len(),
            second.refusals_known,
            second.refusals_heard
        ),
        (10, true, true),
        "{second:?}"
    );
    // Beside a pod that does not answer: heard, not known.
    let some = pusher
        .sync(&plane(), &doc, TOKEN, &[older.addr(), away])
        .await;
    assert_eq!(
        (some.refused.len(), some.refusals_known, some.refusals_heard),
        (10, false, true),
        "{some:?}"
    );

    let replacing = OlderProxy::start(behind.admin_addr())
        .await
        .expect("the replacing pod starts");
    let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let not_up = support::gated_port(replacing.addr(), open).await;
    let unanswered = pusher.sync(&plane(), &doc, TOKEN, &[not_up]).await;
    assert!(!unanswered.all_current(), "{unanswered:?}");
    assert_eq!(
        (by(&unanswered, older.addr()), unanswered.refusals_known),
        (10, false),
        "{unanswered:?}"
    );
    let third = pusher
        .sync(&plane(), &doc, TOKEN, &[replacing.addr()])
        .await;
    assert!(!third.refusals_known, "{third:?}");
    assert_eq!(
        (by(&third, replacing.addr()), by(&third, older.addr())),
        (7, 3),
        "{third:?}"
    );
    let fourth = pusher
        .sync(&plane(), &doc, TOKEN, &[replacing.addr()])
        .await;
    assert!(fourth.refusals_known, "{fourth:?}");
    assert_eq!(by(&fourth, replacing.addr()), 10, "{fourth:?}");
}

/// A round with no pod listed (the pod that refused gone before its successor is listed)
/// keeps the refusals as they were, and says the plane is not scaled to zero; once no pod has
/// been listed for longer than the pusher keeps runs of failures through such a gap, the
/// refusals go.
#[tokio::test]
async fn refusals_stand_through_a_round_with_no_pod_listed_until_scaled_to_zero() {
    use cftunnel_testkit::older_proxy::OlderProxy;

    let backend = echo().await;
    let behind = proxy().await;
    let older = OlderProxy::start(behind.admin_addr())
        .await
        .expect("the older pod starts");
    let cors = cors_filter();
    let mut doc = config(backend.http_addr(), "cors.example.com");
    doc.rules[0].name = Some("shop/cors/0".to_owned());
    doc.rules[0].filters = vec![cors];

    for (keep, kept) in [(Duration::from_secs(600), true), (Duration::ZERO, false)] {
        let mut pusher = Pusher::default().keeping_runs_without_pods(keep);
        let round = pusher.sync(&plane(), &doc, TOKEN, &[older.addr()]).await;
        assert_eq!(round.refused.len(), 1, "{round:?}");
        let podless = pusher.sync(&plane(), &doc, TOKEN, &[]).await;
        assert_eq!(podless.scaled_to_zero, !kept, "{podless:?}");
        if kept {
            assert_eq!(podless.refused, round.refused, "kept through the gap");
        } else {
            assert!(podless.refused.is_empty(), "{podless:?}");
        }
    }
}

/// A document grown larger than the pods take (413) loses, in the same round, the rules they
/// do not serve yet (the largest first) until it fits: a rule they serve stays, however
/// large, so one tenant's growth costs that tenant's new rules, not another tenant's routes
/// or every tenant's updates.
#[tokio::test]
async fn a_document_grown_too_large_for_the_pods_leaves_out_its_new_rules() {
    use cftunnel_config::{Filter, FilterType, Header, HeaderModifier};
    let backend = echo().await;
    let pod = Server::start(
        ServerOptions {
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            auth_token: Some(TOKEN.to_owned()),
            max_config_bytes: 16 * 1024,
            ..ServerOptions::default()
        },
        None,
    )
    .await
    .expect("the proxy starts");
    let rule = |host: &str, name: &str, bulk: usize| {
        let mut filter = Filter::new(FilterType::RequestHeaderModifier);
        filter.request_header_modifier = Some(HeaderModifier {
            set: vec![Header {
                name: "x-bulk".to_owned(),
                value: "b".repeat(bulk),
            }],
            ..HeaderModifier::default()
        });
        Rule {
            name: Some(name.to_owned()),
            filters: vec![filter],
            ..config(backend.http_addr(), host).rules.remove(0)
        }
    };
    let mut pusher = Pusher::default();
    let pods = [pod.admin_addr()];
    // Served: a small rule and a large one.
    let mut doc = Config {
        rules: vec![
            rule("one.example.com", "shop/one/0", 10),
            rule("big.example.com", "bulk/big/0", 10 * 1024),
        ],
        ..Config::default()
    };
    let round = pusher.sync(&plane(), &doc, TOKEN, &pods).await;
    assert!(round.all_current() && round.refused.is_empty(), "{round:?}");

    // Another tenant adds rules that take it past the limit: they go, all in this round.
    for i in 0..6 {
        doc.rules.push(rule(
            &format!("new{i}.example.com"),
            &format!("new/r{i}/0"),
            1024,
        ));
    }
    let round = pusher.sync(&plane(), &doc, TOKEN, &pods).await;
    assert!(round.all_current(), "the rest was taken: {round:?}");
    let refused: Vec<&str> = round
        .refused
        .iter()
        .filter_map(|r| r.name.as_deref())
        .collect();
    assert!(!refused.is_empty(), "{round:?}");
    assert!(
        refused.iter().all(|name| name.starts_with("new/")),
        "only rules not served yet go: {refused:?}"
    );
    assert!(
        round.refused[0]
            .reason
            .contains("larger than its pods take"),
        "{}",
        round.refused[0].reason
    );
    let data = pod.data_addr();
    assert_eq!(get(data, "/", "one.example.com", None).await.0, 200);
    assert_eq!(
        get(data, "/", "big.example.com", None).await.0,
        200,
        "the served large rule stays"
    );
    let served_new = (0..6).filter(|i| !refused.contains(&format!("new/r{i}/0").as_str()));
    for i in served_new {
        assert_eq!(
            get(data, "/", &format!("new{i}.example.com"), None).await.0,
            200
        );
    }

    // A controller that starts afresh (a restart, a new leader), and the large rule edited in
    // the same round as more new rules come: the pods say what they serve, the edited rule is
    // still theirs by name, and only new rules go.
    doc.rules[1] = rule("big.example.com", "bulk/big/0", 10 * 1024 + 100);
    doc.rules
        .push(rule("later.example.com", "later/r/0", 2 * 1024));
    let mut fresh = Pusher::default();
    let round = fresh.sync(&plane(), &doc, TOKEN, &pods).await;
    assert!(round.all_current(), "{round:?}");
    let refused: Vec<&str> = round
        .refused
        .iter()
        .filter_map(|r| r.name.as_deref())
        .collect();
    assert!(
        !refused.is_empty()
            && refused
                .iter()
                .all(|n| n.starts_with("new/") || n.starts_with("later/")),
        "{refused:?}"
    );
    assert_eq!(get(data, "/", "big.example.com", None).await.0, 200);
    assert_eq!(get(data, "/", "one.example.com", None).await.0, 200);
}

/// A plane's document past the regex budget a proxy holds: the rule its pods do not serve yet
/// is left out before any pod sees it, wherever it sits in the document, and every rule they
/// serve stays. A pod counting in document order would refuse the last rule instead, which
/// another tenant's route may own.
#[tokio::test]
async fn past_the_regex_budget_the_rule_not_served_yet_goes_before_any_pod_sees_it() {
    use cftunnel_config::valid::{Pattern, PATTERN_BUDGET};
    use cftunnel_config::{Match, PathMatch, PathMatchType};

    let backend = echo().await;
    let servers = [proxy().await, proxy().await];
    let pods: Vec<SocketAddr> = servers.iter().map(Server::admin_addr).collect();
    // About half a megabyte compiled each: Unicode word characters, repeated.
    let costly = |i: usize| format!("/a{i:03}/\\w{{3,32}}");
    let rule = |i: usize, name: &str| Rule {
        name: Some(name.to_owned()),
        matches: vec![Match {
            path: Some(PathMatch {
                kind: PathMatchType::RegularExpression,
                value: costly(i),
            }),
            ..Match::default()
        }],
        ..config(backend.http_addr(), &format!("r{i}.example.com"))
            .rules
            .remove(0)
    };
    let mut spent = 0;
    let fit = (0..)
        .take_while(|&i| {
            spent += Pattern::new(&costly(i)).expect("compiles").cost();
            spent <= PATTERN_BUDGET
        })
        .count();
    let mut doc = Config {
        rules: (0..fit).map(|i| rule(i, &format!("old/r{i}/0"))).collect(),
        ..Config::default()
    };
    let mut pusher = Pusher::default();
    let first = weighed_round(&mut pusher, &pods, &doc).await;
    assert!(first.all_current() && first.refused.is_empty(), "{first:?}");

    // Another tenant's new rule, placed first.
    doc.rules.insert(0, rule(fit, "new/r/0"));
    let second = weighed_round(&mut pusher, &pods, &doc).await;
    assert!(second.all_current(), "the pods take the rest: {second:?}");
    assert_eq!(second.refused.len(), 1, "{second:?}");
    let refused = &second.refused[0];
    assert_eq!(
        (refused.rule, refused.name.as_deref(), refused.pod),
        (0, Some("new/r/0"), None)
    );
    assert!(
        refused
            .reason
            .starts_with("matches[0].path: the document's regexes take")
            && refused
                .reason
                .contains("rules naming a regex the proxies do not hold yet go first"),
        "{}",
        refused.reason
    );
    for server in &servers {
        let data = server.data_addr();
        let last = fit - 1;
        let path = format!("/a{last:03}/served");
        let host = format!("r{last}.example.com");
        assert_eq!(get(data, &path, &host, None).await.0, 200, "still served");
        let path = format!("/a{fit:03}/new");
        let host = format!("r{fit}.example.com");
        assert_eq!(get(data, &path, &host, None).await.0, 404, "not served");
    }
    // It stays out while the rules served take the budget, and a controller that starts
    // afresh (a restart, a new leader) asks a pod what it serves and leaves out the same.
    let third = weighed_round(&mut pusher, &pods, &doc).await;
    assert_eq!(third.refused, second.refused);
    let restarted = weighed_round(&mut Pusher::default(), &pods, &doc).await;
    assert_eq!(restarted.refused, second.refused);
    // A plane with no pods yet has none to ask: the rules go by cost alone, and nothing is
    // pushed; its pods once up are asked what they serve, and the same rule goes.
    let mut podless = Pusher::default();
    let none = weighed_round(&mut podless, &[], &doc).await;
    assert!(none.pods.is_empty() && none.refused.len() == 1, "{none:?}");
    let up = weighed_round(&mut podless, &pods, &doc).await;
    assert_eq!(up.refused, second.refused);
}

/// Past the regex budget after an older rule is edited in place to a new regex: that rule
/// goes, though its name is one the pods serve, and not the costliest serving rule beside it.
#[tokio::test]
async fn a_rule_edited_to_a_regex_the_pods_do_not_hold_goes_first() {
    use cftunnel_config::valid::Pattern;

    let backend = echo().await;
    let server = proxy().await;
    let pods = [server.admin_addr()];
    let rule = |pattern: &str, name: &str| regex_rule(backend.http_addr(), pattern, name);
    let cost = |pattern: &str| Pattern::new(pattern).expect("compiles").cost();
    let costly = |i: usize| format!("/a{i:03}/\\w{{3,32}}");
    let big = "/big/\\w{3,32}/\\w{3,32}/\\w{3,32}/\\w{3,32}";
    let edited = "/e/\\w{3,32}/\\w{3,32}";
    // The costliest serving rule, and as many costly ones beside it as fit.
    let fit = costly_that_fit(cost(big), costly);
    let mut doc = Config {
        rules: std::iter::once(rule(big, "old/big/0"))
            .chain((0..fit).map(|i| rule(&costly(i), &format!("old/r{i}/0"))))
            .collect(),
        ..Config::default()
    };
    let mut pusher = Pusher::default();
    let first = weighed_round(&mut pusher, &pods, &doc).await;
    assert!(first.all_current() && first.refused.is_empty(), "{first:?}");

    doc.rules[1] = rule(edited, "old/r0/0");
    assert!(cost(edited) < cost(big), "not the costliest");
    let round = weighed_round(&mut pusher, &pods, &doc).await;
    assert!(round.all_current(), "{round:?}");
    let refused: Vec<(usize, Option<&str>)> = round
        .refused
        .iter()
        .map(|r| (r.rule, r.name.as_deref()))
        .collect();
    assert_eq!(refused, [(1, Some("old/r0/0"))]);
}

/// A controller that starts afresh past the regex budget goes by the newest document its pods
/// hold: a rule one pod took since another's pushes began failing is served, and the rule added
/// now goes, not it. The pod with the older document answers first.
#[tokio::test]
async fn a_fresh_controller_goes_by_the_newest_document_its_pods_hold() {
    let backend = echo().await;
    let (behind, ahead) = (proxy().await, proxy().await);
    // `taken`: taken by one pod only.
    let rules = AtTheBudget::new(backend.http_addr());
    let mut doc = Config {
        rules: rules.old.clone(),
        ..Config::default()
    };
    let mut pusher = Pusher::default();
    let both = [behind.admin_addr(), ahead.admin_addr()];
    let first = weighed_round(&mut pusher, &both, &doc).await;
    assert!(first.all_current() && first.refused.is_empty(), "{first:?}");
    // Only one pod takes the next document: the other's pushes fail meanwhile.
    doc.rules.push(rules.taken.clone());
    let second = weighed_round(&mut pusher, &[ahead.admin_addr()], &doc).await;
    assert!(
        second.all_current() && second.refused.is_empty(),
        "{second:?}"
    );
    assert!(held(&ahead).await > held(&behind).await);

    // Past the budget with one more rule, seen by a controller that starts afresh; the pod
    // with the newest document answers last.
    doc.rules.insert(0, rules.new);
    let slow = support::slow_port(ahead.admin_addr(), Duration::from_millis(300)).await;
    let round = weighed_round(&mut Pusher::default(), &[behind.admin_addr(), slow], &doc).await;
    new_left_out_and_taken_served(&round, &[&behind]).await;
}

/// Regex rules that fit the budget together with no room for one more (`old`, and `taken`,
/// costlier than any of them: with nothing known of what the pods hold, the one whose going
/// frees most), and one more that would go past it (`new`, named `new/r/0`). `taken` is
/// `taken/t/0`, served at `/t/...` for `taken-t-0.example.com`.
struct AtTheBudget {
    old: Vec<Rule>,
    taken: Rule,
    new: Rule,
}

impl AtTheBudget {
    fn new(backend: SocketAddr) -> Self {
        use cftunnel_config::valid::Pattern;
        let cost = |pattern: &str| Pattern::new(pattern).expect("compiles").cost();
        let costly = |i: usize| format!("/a{i:03}/\\w{{3,32}}");
        let taken = "/t/\\w{3,48}";
        let fit = costly_that_fit(cost(taken), costly);
        assert!(cost(taken) > cost(&costly(fit)));
        Self {
            old: (0..fit)
                .map(|i| regex_rule(backend, &costly(i), &format!("old/r{i}/0")))
                .collect(),
            taken: regex_rule(backend, taken, "taken/t/0"),
            new: regex_rule(backend, &costly(fit), "new/r/0"),
        }
    }

    /// `old` and `taken`.
    fn served(&self) -> Vec<Rule> {
        self.old.iter().chain([&self.taken]).cloned().collect()
    }
}

/// A round past the budget of [`AtTheBudget`] that went by what the pods serve: `new` left out,
/// every pod current, and `taken` served by each of `servers`.
async fn new_left_out_and_taken_served(round: &PlaneOutcome, servers: &[&Server]) {
    let refused: Vec<Option<&str>> = round.refused.iter().map(|r| r.name.as_deref()).collect();
    assert_eq!(refused, [Some("new/r/0")], "{round:?}");
    assert!(round.all_current(), "{round:?}");
    for server in servers {
        let data = server.data_addr();
        assert_eq!(
            get(data, "/t/served", "taken-t-0.example.com", None)
                .await
                .0,
            200
        );
    }
}

/// How many of the patterns `costly` makes (0, 1, ...) fit the regex budget together beside
/// patterns that take `spent` already.
fn costly_that_fit(mut spent: usize, costly: impl Fn(usize) -> String) -> usize {
    use cftunnel_config::valid::{Pattern, PATTERN_BUDGET};
    (0..)
        .take_while(|&i| {
            spent += Pattern::new(&costly(i)).expect("compiles").cost();
            spent <= PATTERN_BUDGET
        })
        .count()
}

/// A rule named `name` for the host its name makes (`/` as `-`, under `example.com`), whose
/// path must match the regex `pattern`, served by `backend`.
fn regex_rule(backend: SocketAddr, pattern: &str, name: &str) -> Rule {
    use cftunnel_config::{Match, PathMatch, PathMatchType};
    Rule {
        name: Some(name.to_owned()),
        matches: vec![Match {
            path: Some(PathMatch {
                kind: PathMatchType::RegularExpression,
                value: pattern.to_owned(),
            }),
            ..Match::default()
        }],
        ..config(backend, &format!("{}.example.com", name.replace('/', "-")))
            .rules
            .remove(0)
    }
}

/// A round of `doc` with its regexes weighed as the controller weighs a plane's.
async fn weighed_round(pusher: &mut Pusher, pods: &[SocketAddr], doc: &Config) -> PlaneOutcome {
    use cftunnel_config::valid;
    let mut cache = valid::Cache::default();
    for r in &doc.rules {
        valid::check(r, &mut cache).expect("each rule passes on its own");
    }
    let costs = valid::Costs::of(&doc.rules, &mut cache, |_| true);
    let mut outcomes = pusher
        .sync_all(vec![PlaneRound {
            plane: plane(),
            config: doc,
            costs: &costs,
            token: TOKEN,
            pods,
            not_serving: &[],
        }])
        .await;
    outcomes.pop().expect("the plane's outcome").1
}

/// Pods that hold only documents no controller pushed (applied unversioned, or read from a
/// file: version 0) are asked for them: a controller that starts afresh past the regex budget
/// goes by that document, so the rule added now goes and the costlier one the pods serve stays.
#[tokio::test]
async fn a_fresh_controller_goes_by_an_unversioned_document_when_no_pod_holds_a_pushed_one() {
    let backend = echo().await;
    let servers = [proxy().await, proxy().await];
    let rules = AtTheBudget::new(backend.http_addr());
    let mut doc = Config {
        rules: rules.served(),
        ..Config::default()
    };
    for server in &servers {
        server.apply(doc.clone()).await.expect("applied");
        assert_eq!(held(server).await, 0);
    }

    doc.rules.insert(0, rules.new);
    let pods: Vec<SocketAddr> = servers.iter().map(Server::admin_addr).collect();
    let round = weighed_round(&mut Pusher::default(), &pods, &doc).await;
    new_left_out_and_taken_served(&round, &[&servers[0], &servers[1]]).await;
}

/// A pod at version 0 (a new one, its document empty) beside one holding a pushed document
/// that cannot be read back for a round (its connection dropped after it told its version): a
/// controller that starts afresh past the regex budget does not go by the empty document, which
/// would make every rule look new for good; it asks again next round and goes by the pushed
/// one, so the rule added now goes, not the costlier one the pods serve.
#[tokio::test]
async fn a_fresh_controller_goes_by_no_empty_document_while_a_pod_holds_a_pushed_one() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let backend = echo().await;
    let (fresh, ahead) = (proxy().await, proxy().await);
    let rules = AtTheBudget::new(backend.http_addr());
    let mut doc = Config {
        rules: rules.served(),
        ..Config::default()
    };
    let first = weighed_round(&mut Pusher::default(), &[ahead.admin_addr()], &doc).await;
    assert!(first.all_current() && first.refused.is_empty(), "{first:?}");
    fresh.apply(Config::default()).await.expect("applied");
    assert!(held(&ahead).await > 0);
    assert_eq!(held(&fresh).await, 0);

    // For a round, `ahead` tells its version and nothing more, and `fresh` answers reads
    // only: nothing is pushed that would change what either holds.
    doc.rules.insert(0, rules.new);
    let open = Arc::new(AtomicBool::new(false));
    let pods = [
        support::requests_port(fresh.admin_addr(), &["GET /config"], Arc::clone(&open)).await,
        support::requests_port(ahead.admin_addr(), &["GET /config "], Arc::clone(&open)).await,
    ];
    let mut pusher = Pusher::default();
    let cut_off = weighed_round(&mut pusher, &pods, &doc).await;
    assert!(
        cut_off
            .pods
            .iter()
            .all(|(_, o)| matches!(o, PodOutcome::Failed(_))),
        "{cut_off:?}"
    );

    open.store(true, Ordering::SeqCst);
    let round = weighed_round(&mut pusher, &pods, &doc).await;
    new_left_out_and_taken_served(&round, &[&fresh, &ahead]).await;
}

/// A CORS filter allowing one origin: a filter type the older release predates.
fn cors_filter() -> cftunnel_config::Filter {
    use cftunnel_config::{Cors, Filter, FilterType};
    let mut cors = Filter::new(FilterType::Cors);
    cors.cors = Some(Cors {
        allow_origins: vec!["https://app.example.com".to_owned()],
        ..Cors::default()
    });
    cors
}
