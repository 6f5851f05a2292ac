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

/// A run of failed pushes of a minute, not reported yet.
const RUN: FailureRun = FailureRun {
    failing_for: Duration::from_secs(60),
    reported: false,
    grace: START_GRACE,
};

fn judged(down: &[&str], pods: &[Arc<Pod>]) -> PodStates {
    judged_in(RUN, down, pods)
}

fn judged_in(run: FailureRun, down: &[&str], pods: &[Arc<Pod>]) -> PodStates {
    let down: Vec<SocketAddr> = down.iter().map(|ip| at(ip)).collect();
    judge("tenant-a", &down, pods, now(), run)
}

/// A pod whose container `proxy` has restarted 4 times, its last run ended by `exit_code`
/// (`reason`), now in `state`.
fn crash_looping(exit_code: i32, reason: &str, state: Value) -> Arc<Pod> {
    let mut proxy = container(state, 4);
    proxy["lastState"] = json!({"terminated": {"exitCode": exit_code, "reason": reason,
        "startedAt": "2026-12-01T11:58:00Z", "finishedAt": "2026-12-01T11:58:03Z"}});
    pod(
        "cf-proxy-edge-a",
        "10.0.0.5",
        600,
        json!({"phase": "Running", "containerStatuses": [proxy]}),
    )
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
fn pods_starting_past_the_grace_are_reported_as_such() {
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
            waiting: "ContainerCreating".to_owned(),
            grace: START_GRACE,
        }
    );
    assert_eq!(
        judged.told().as_deref(),
        Some("its pods have been starting for more than 10 minutes (pod cf-proxy-edge-a: ContainerCreating)")
    );
    // The grace is the caller's.
    let long = FailureRun {
        grace: Duration::from_secs(3600),
        ..RUN
    };
    assert!(matches!(
        judged_in(long, &["10.0.0.5"], &pods),
        PodStates::Starting { .. }
    ));
}

/// How long they have been starting is not counted in what is told: a count would change the
/// routes' condition, and rewrite their status, at every round.
#[test]
fn how_long_pods_have_been_starting_is_told_without_a_count() {
    let told = |age: i64| {
        let pods = [pending(
            "cf-proxy-edge-a",
            "10.0.0.5",
            age,
            "PodInitializing",
            "",
        )];
        judged(&["10.0.0.5"], &pods).told()
    };
    let first = told(11 * 60);
    assert_eq!(
        first.as_deref(),
        Some("its pods have been starting for more than 10 minutes (pod cf-proxy-edge-a: PodInitializing)")
    );
    for age in [12 * 60, 3 * 3600, 4 * 86400] {
        assert_eq!(told(age), first, "{age} s");
    }
}

/// Pods replaced before they start (preempted, their node reclaimed) are each young: the
/// plane's pushes failing past the grace report it all the same.
#[test]
fn a_failure_run_past_the_grace_with_young_pods_is_starting_too_long() {
    let pods = [pending(
        "cf-proxy-edge-q",
        "10.0.0.5",
        90,
        "ContainerCreating",
        "",
    )];
    let run = FailureRun {
        failing_for: START_GRACE + Duration::from_secs(1),
        ..RUN
    };
    let judged = judged_in(run, &["10.0.0.5"], &pods);
    assert_eq!(
        judged,
        PodStates::StartingTooLong {
            pod: "cf-proxy-edge-q".to_owned(),
            waiting: "ContainerCreating".to_owned(),
            grace: START_GRACE,
        }
    );
    assert!(judged.told().is_some());
    // Just under the grace, both ways: not yet.
    let run = FailureRun {
        failing_for: START_GRACE - Duration::from_secs(1),
        ..RUN
    };
    assert!(matches!(
        judged_in(run, &["10.0.0.5"], &pods),
        PodStates::Starting { .. }
    ));
}

/// A plane reported (its image could not be pulled) whose pods are then replaced by new ones,
/// being created within the grace, stays reported until a push succeeds.
#[test]
fn a_reported_plane_whose_pods_are_created_again_stays_reported() {
    let pods = [pending(
        "cf-proxy-edge-new",
        "10.0.0.5",
        20,
        "ContainerCreating",
        "",
    )];
    let reported = FailureRun {
        reported: true,
        ..RUN
    };
    let judged = judged_in(reported, &["10.0.0.5"], &pods);
    assert_eq!(
        judged,
        PodStates::StartingAgain {
            pod: "cf-proxy-edge-new".to_owned(),
            waiting: "ContainerCreating".to_owned(),
        }
    );
    assert_eq!(
        judged.told().as_deref(),
        Some("its pods are being created again (pod cf-proxy-edge-new: ContainerCreating)")
    );
    // Past the grace, it is told as such, reported or not.
    let long = FailureRun {
        failing_for: START_GRACE,
        ..reported
    };
    assert!(matches!(
        judged_in(long, &["10.0.0.5"], &pods),
        PodStates::StartingTooLong { .. }
    ));
}

/// A pod not scheduled (or whose volumes do not mount) has no IP: it is none of the down pods,
/// which are addresses, and is found at none.
#[test]
fn a_pod_without_an_ip_is_found_at_no_address() {
    let mut unscheduled = pod(
        "cf-proxy-edge-a",
        "",
        3 * 3600,
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
               "message": "0/3 nodes are available: 3 Insufficient cpu."}]}),
    );
    Arc::make_mut(&mut unscheduled)
        .status
        .as_mut()
        .expect("a status")
        .pod_ip = None;
    assert_eq!(judged(&["10.0.0.5"], &[unscheduled]), PodStates::Unknown);
}

#[test]
fn other_waiting_reasons_are_told_with_the_kubelets_message() {
    for (reason, message) in [
        (
            "CreateContainerConfigError",
            "secret \"edge-tunnel-token\" not found",
        ),
        (
            "InvalidImageName",
            "Failed to apply default image tag \"proxy:\": couldn't parse image name",
        ),
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
                    failure: Failure::Waiting {
                        reason: reason.to_owned(),
                        message: message.to_owned(),
                    },
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

/// The kubelet alternates `ErrImagePull` and `ImagePullBackOff` at each retry, each with its
/// own message: both are told the same, by the image, so the condition stays as it is.
#[test]
fn an_image_that_cannot_be_pulled_is_told_the_same_at_each_retry() {
    let image = "ghcr.io/example/proxy:nope";
    let told = [
        ("ErrImagePull", "rpc error: code = NotFound desc = failed to pull and unpack image \"ghcr.io/example/proxy:nope\": not found"),
        ("ImagePullBackOff", "Back-off pulling image \"ghcr.io/example/proxy:nope\""),
        ("ErrImagePull", "rpc error: code = Unknown desc = failed to pull and unpack image: 429 Too Many Requests"),
    ]
    .map(|(reason, message)| {
        let mut proxy = container(waiting(reason, message), 0);
        proxy["image"] = image.into();
        let pods = [pod(
            "cf-proxy-edge-a",
            "10.0.0.5",
            120,
            json!({"phase": "Pending", "containerStatuses": [proxy]}),
        )];
        judged(&["10.0.0.5"], &pods).told()
    });
    assert_eq!(
        told[0].as_deref(),
        Some("pod cf-proxy-edge-a: container proxy cannot pull image ghcr.io/example/proxy:nope (ImagePullBackOff)")
    );
    assert_eq!(told[1], told[0]);
    assert_eq!(told[2], told[0]);
}

/// A crash-looping container waits in `CrashLoopBackOff` (with a back-off that grows in its
/// message), then runs a moment, restarted, then waits again: told the same all through, by
/// how it last exited.
#[test]
fn a_crash_looping_container_is_told_the_same_waiting_and_running() {
    let states = [
        waiting(
            "CrashLoopBackOff",
            "back-off 40s restarting failed container=proxy pod=cf-proxy-edge-a_tenant-a(5d7c)",
        ),
        json!({"running": {"startedAt": NOW}}),
        waiting(
            "CrashLoopBackOff",
            "back-off 1m20s restarting failed container=proxy pod=cf-proxy-edge-a_tenant-a(5d7c)",
        ),
        waiting("ContainerCreating", ""),
    ];
    for state in states {
        let pods = [crash_looping(1, "Error", state.clone())];
        let judged = judged(&["10.0.0.5"], &pods);
        assert_eq!(
            judged,
            PodStates::Failing {
                pod: "cf-proxy-edge-a".to_owned(),
                container: "proxy".to_owned(),
                failure: Failure::KeepsExiting {
                    exit_code: Some(1),
                    reason: Some("Error".to_owned()),
                },
            },
            "{state}"
        );
        assert_eq!(
            judged.told().as_deref(),
            Some("pod cf-proxy-edge-a: container proxy keeps exiting: exit code 1 (Error)"),
            "{state}"
        );
    }
    let oom = [crash_looping(137, "OOMKilled", json!({"running": {}}))];
    assert_eq!(
        judged(&["10.0.0.5"], &oom).told().as_deref(),
        Some("pod cf-proxy-edge-a: container proxy keeps exiting: exit code 137 (OOMKilled)")
    );
    // Its last run not recorded: told all the same, without it.
    let unrecorded = [pending(
        "cf-proxy-edge-a",
        "10.0.0.5",
        600,
        "CrashLoopBackOff",
        "back-off 5m0s restarting failed container=proxy",
    )];
    assert_eq!(
        judged(&["10.0.0.5"], &unrecorded).told().as_deref(),
        Some("pod cf-proxy-edge-a: container proxy keeps exiting (CrashLoopBackOff)")
    );
}

/// An init container that failed and then ran to its end is done: its pod is not failing
/// for it (nor starting: it ran).
#[test]
fn an_init_container_that_ended_well_after_retries_fails_nothing() {
    let status = |state: Value| {
        json!({"phase": "Pending",
               "initContainerStatuses": [{"name": "setup", "image": "busybox", "imageID": "", "ready": false,
                                          "restartCount": 2, "state": state,
                                          "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}],
               "containerStatuses": [container(waiting("PodInitializing", ""), 0)]})
    };
    let done = status(json!({"terminated": {"exitCode": 0, "reason": "Completed"}}));
    let pods = [pod("cf-proxy-edge-a", "10.0.0.5", 120, done)];
    assert_eq!(judged(&["10.0.0.5"], &pods), PodStates::Unknown);
    // While it still fails, it fails the pod.
    let failing = status(waiting("CrashLoopBackOff", "back-off 20s"));
    let pods = [pod("cf-proxy-edge-a", "10.0.0.5", 120, failing)];
    assert_eq!(
        judged(&["10.0.0.5"], &pods).told().as_deref(),
        Some("pod cf-proxy-edge-a: container setup keeps exiting: exit code 1 (Error)")
    );
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
        Some("pod cf-proxy-edge-a: container setup cannot pull image busybox:nope (ImagePullBackOff)")
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
    let pods = [pending(
        "a",
        "10.0.0.5",
        30,
        "CreateContainerConfigError",
        &long,
    )];
    let PodStates::Failing {
        failure: Failure::Waiting { message, .. },
        ..
    } = judged(&["10.0.0.5"], &pods)
    else {
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
fn durations_are_spoken_in_seconds_then_minutes_then_hours_then_days() {
    let spoken_secs = |s: u64| spoken(Duration::from_secs(s));
    assert_eq!(spoken_secs(1), "1 second");
    assert_eq!(spoken_secs(5), "5 seconds");
    assert_eq!(spoken_secs(61), "1 minute");
    assert_eq!(spoken_secs(600), "10 minutes");
    assert_eq!(spoken_secs(119 * 60), "119 minutes");
    assert_eq!(spoken_secs(120 * 60), "2 hours");
    assert_eq!(spoken_secs(3 * 86400), "3 days");
}
