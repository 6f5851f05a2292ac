use super::*;

use serde_json::{json, Value};

const NOW: &str = "2026-12-01T12:00:00Z";

fn now() -> Timestamp {
    NOW.parse().expect("a timestamp")
}

/// A pod of tenant-a named `name` at `ip`, created `age_secs` before [`NOW`], with `status`
/// (its `podIP` added).
fn pod(name: &str, ip: &str, age_secs: i64, mut status: Value) -> Arc<Pod> {
    let created = now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(age_secs))
        .expect("a time");
    status["podIP"] = ip.into();
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "tenant-a", "creationTimestamp": created.to_string()},
            "status": status,
        }))
        .expect("a Pod"),
    )
}

/// A container status named `proxy` in `state`, restarted `restarts` times.
fn container(state: Value, restarts: i32) -> Value {
    json!({"name": "proxy", "image": "proxy:1", "imageID": "", "ready": false, "restartCount": restarts, "state": state})
}

fn waiting(reason: &str, message: &str) -> Value {
    json!({"waiting": {"reason": reason, "message": message}})
}

/// A Pending pod whose one container waits with `reason`.
fn pending(name: &str, ip: &str, age_secs: i64, reason: &str, message: &str) -> Arc<Pod> {
    pod(
        name,
        ip,
        age_secs,
        json!({"phase": "Pending", "containerStatuses": [container(waiting(reason, message), 0)]}),
    )
}

fn at(ip: &str) -> SocketAddr {
    SocketAddr::new(ip.parse().expect("an IP"), 8081)
}

fn judged(down: &[&str], pods: &[Arc<Pod>]) -> PodStates {
    let down: Vec<SocketAddr> = down.iter().map(|ip| at(ip)).collect();
    judge("tenant-a", &down, pods, now(), START_GRACE)
}

#[test]
fn pods_whose_containers_are_being_created_are_starting() {
    let pods = [
        pending("cf-proxy-edge-a", "10.0.0.5", 90, "ContainerCreating", ""),
        pending("cf-proxy-edge-b", "10.0.0.6", 30, "ContainerCreating", ""),
    ];
    assert_eq!(
        judged(&["10.0.0.5", "10.0.0.6"], &pods),
        PodStates::Starting {
            pod: "cf-proxy-edge-a".to_owned(),
            since: Duration::from_secs(90),
        }
    );
    assert_eq!(judged(&["10.0.0.5"], &pods).told(), None);
}

#[test]
fn pods_initializing_or_not_yet_given_containers_are_starting() {
    let init_running = pod(
        "init",
        "10.0.0.5",
        60,
        json!({"phase": "Pending",
               "initContainerStatuses": [{"name": "setup", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0, "state": {"running": {}}}],
               "containerStatuses": [container(waiting("PodInitializing", ""), 0)]}),
    );
    let unstarted = pod("new", "10.0.0.6", 60, json!({"phase": "Pending"}));
    for pods in [[init_running.clone()], [unstarted.clone()]] {
        let ip = pods[0].status.as_ref().and_then(|s| s.pod_ip.clone());
        let ip = ip.expect("an IP");
        assert!(
            matches!(judged(&[&ip], &pods), PodStates::Starting { .. }),
            "{pods:?}"
        );
    }
}

#[test]
fn pods_starting_past_the_grace_are_reported_with_how_long() {
    let pods = [pending(
        "cf-proxy-edge-a",
        "10.0.0.5",
        12 * 60 + 30,
        "ContainerCreating",
        "",
    )];
    let judged = judged(&["10.0.0.5"], &pods);
    assert_eq!(
        judged,
        PodStates::StartingTooLong {
            pod: "cf-proxy-edge-a".to_owned(),
            since: Duration::from_secs(750),
            waiting: "ContainerCreating".to_owned(),
        }
    );
    assert_eq!(
        judged.told().as_deref(),
        Some("its pods have been starting for 12 minutes (pod cf-proxy-edge-a: ContainerCreating)")
    );
    // The grace is the caller's.
    let down = [at("10.0.0.5")];
    assert!(matches!(
        judge("tenant-a", &down, &pods, now(), Duration::from_secs(3600)),
        PodStates::Starting { .. }
    ));
}

#[test]
fn a_pod_the_scheduler_cannot_place_says_why_once_past_the_grace() {
    let pods = [pod(
        "cf-proxy-edge-a",
        "10.0.0.5",
        3 * 3600,
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
               "message": "0/3 nodes are available: 3 Insufficient cpu."}]}),
    )];
    assert_eq!(
        judged(&["10.0.0.5"], &pods).told().as_deref(),
        Some("its pods have been starting for 3 hours (pod cf-proxy-edge-a: not scheduled: 0/3 nodes are available: 3 Insufficient cpu.)")
    );
}

#[test]
fn each_waiting_reason_but_being_created_is_failing() {
    for (reason, message) in [
        ("ErrImagePull", "rpc error: code = NotFound desc = failed to pull and unpack image \"ghcr.io/example/proxy:nope\""),
        ("ImagePullBackOff", "Back-off pulling image \"ghcr.io/example/proxy:nope\""),
        ("CrashLoopBackOff", "back-off 5m0s restarting failed container=proxy pod=cf-proxy-edge-a_tenant-a"),
        ("CreateContainerConfigError", "secret \"edge-tunnel-token\" not found"),
        ("InvalidImageName", "Failed to apply default image tag \"proxy:\": couldn't parse image name"),
    ] {
        // Young or old: a failure is no start.
        for age in [5, 3600] {
            let pods = [pending("cf-proxy-edge-a", "10.0.0.5", age, reason, message)];
            let judged = judged(&["10.0.0.5"], &pods);
            assert_eq!(
                judged,
                PodStates::Failing {
                    pod: "cf-proxy-edge-a".to_owned(),
                    container: "proxy".to_owned(),
                    reason: reason.to_owned(),
                    message: message.to_owned(),
                }
            );
            assert_eq!(
                judged.told(),
                Some(format!(
                    "pod cf-proxy-edge-a: container proxy is waiting: {reason}: {message}"
                ))
            );
        }
    }
}

#[test]
fn a_failing_init_container_fails_the_pod() {
    let pods = [pod(
        "cf-proxy-edge-a",
        "10.0.0.5",
        30,
        json!({"phase": "Pending",
               "initContainerStatuses": [{"name": "setup", "image": "busybox:nope", "imageID": "", "ready": false, "restartCount": 0,
                                          "state": {"waiting": {"reason": "ImagePullBackOff"}}}],
               "containerStatuses": [container(waiting("PodInitializing", ""), 0)]}),
    )];
    assert_eq!(
        judged(&["10.0.0.5"], &pods).told().as_deref(),
        Some("pod cf-proxy-edge-a: container setup is waiting: ImagePullBackOff")
    );
}

#[test]
fn one_failing_pod_among_starting_ones_fails_the_plane() {
    let pods = [
        pending("cf-proxy-edge-a", "10.0.0.5", 30, "ContainerCreating", ""),
        pending(
            "cf-proxy-edge-b",
            "10.0.0.6",
            30,
            "ImagePullBackOff",
            "Back-off",
        ),
    ];
    assert!(matches!(
        judged(&["10.0.0.5", "10.0.0.6"], &pods),
        PodStates::Failing { pod, .. } if pod == "cf-proxy-edge-b"
    ));
}

#[test]
fn a_long_message_is_cut_on_one_line() {
    let long = format!("first line\n{}", "é".repeat(400));
    let pods = [pending("a", "10.0.0.5", 30, "ErrImagePull", &long)];
    let PodStates::Failing { message, .. } = judged(&["10.0.0.5"], &pods) else {
        panic!("failing");
    };
    assert_eq!(message.chars().count(), MESSAGE_MAX + 1);
    assert!(message.starts_with("first line éé"), "{message}");
    assert!(message.ends_with('…'), "{message}");
}

#[test]
fn a_pod_that_ran_before_is_not_starting() {
    // Its container restarted and is being created again (its sandbox was lost): not a start.
    let recreated = pod(
        "cf-proxy-edge-a",
        "10.0.0.5",
        30,
        json!({"phase": "Running", "containerStatuses": [container(waiting("ContainerCreating", ""), 1)]}),
    );
    // Pending again, but its container's last run is recorded.
    let mut last = container(waiting("ContainerCreating", ""), 0);
    last["lastState"] = json!({"terminated": {"exitCode": 137, "reason": "OOMKilled"}});
    let rerun = pod(
        "cf-proxy-edge-b",
        "10.0.0.6",
        30,
        json!({"phase": "Pending", "containerStatuses": [last]}),
    );
    let running = pod(
        "cf-proxy-edge-c",
        "10.0.0.7",
        30,
        json!({"phase": "Running", "containerStatuses": [container(json!({"running": {"startedAt": NOW}}), 0)]}),
    );
    for (ip, pods) in [
        ("10.0.0.5", [recreated]),
        ("10.0.0.6", [rerun]),
        ("10.0.0.7", [running]),
    ] {
        assert_eq!(judged(&[ip], &pods), PodStates::Unknown, "{pods:?}");
    }
}

#[test]
fn a_starting_pod_beside_a_running_one_tells_nothing() {
    let pods = [
        pending("cf-proxy-edge-a", "10.0.0.5", 30, "ContainerCreating", ""),
        pod(
            "cf-proxy-edge-b",
            "10.0.0.6",
            30,
            json!({"phase": "Running", "containerStatuses": [container(json!({"running": {}}), 0)]}),
        ),
    ];
    assert_eq!(judged(&["10.0.0.5", "10.0.0.6"], &pods), PodStates::Unknown);
}

#[test]
fn pods_are_found_by_their_ips_in_the_planes_namespace() {
    // Dual stack: `podIPs` lists both, `podIP` the first.
    let mut dual = pending("dual", "10.0.0.5", 30, "ImagePullBackOff", "");
    Arc::make_mut(&mut dual)
        .status
        .as_mut()
        .expect("a status")
        .pod_ips = Some(
        ["10.0.0.5", "fd00::5"]
            .into_iter()
            .map(|ip| k8s_openapi::api::core::v1::PodIP { ip: ip.to_owned() })
            .collect(),
    );
    let failing = |pods: &[Arc<Pod>], ip: &str| matches!(judged(&[ip], pods), PodStates::Failing { pod, .. } if pod == "dual");
    assert!(failing(&[dual.clone()], "fd00::5"));
    assert!(failing(&[dual.clone()], "10.0.0.5"));
    assert!(!failing(&[dual.clone()], "10.0.0.9"));
    // Another namespace's pod at the address is not the plane's.
    let mut elsewhere = dual.clone();
    Arc::make_mut(&mut elsewhere).metadata.namespace = Some("tenant-b".to_owned());
    assert_eq!(judged(&["10.0.0.5"], &[elsewhere]), PodStates::Unknown);
    // Of two pods at one IP, the one created last.
    let old = pending("old", "10.0.0.5", 3600, "CrashLoopBackOff", "");
    let new = pending("new", "10.0.0.5", 30, "ContainerCreating", "");
    assert!(matches!(
        judged(&["10.0.0.5"], &[old, new]),
        PodStates::Starting { pod, .. } if pod == "new"
    ));
}

#[test]
fn without_the_pods_nothing_is_known() {
    assert_eq!(judged(&["10.0.0.5"], &[]), PodStates::Unknown);
    // One pod found starting, the other not found at all.
    let pods = [pending("a", "10.0.0.5", 30, "ContainerCreating", "")];
    assert_eq!(judged(&["10.0.0.5", "10.0.0.6"], &pods), PodStates::Unknown);
    assert_eq!(judged(&[], &pods), PodStates::Unknown);
    assert_eq!(PodStates::Unknown.told(), None);
}

#[test]
fn durations_are_spoken_in_minutes_then_hours_then_days() {
    let spoken_secs = |s: u64| spoken(Duration::from_secs(s));
    assert_eq!(spoken_secs(61), "1 minute");
    assert_eq!(spoken_secs(600), "10 minutes");
    assert_eq!(spoken_secs(119 * 60), "119 minutes");
    assert_eq!(spoken_secs(120 * 60), "2 hours");
    assert_eq!(spoken_secs(3 * 86400), "3 days");
}
