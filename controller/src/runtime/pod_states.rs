//! What the state of a plane's pods says of why none of them takes its config: still being
//! created (a push failing meanwhile is no fault yet), or failing for a reason the kubelet
//! gives (an image it cannot pull, a crash loop), which the route's condition then names.
//!
//! Pure: the pods (as the watch cache holds them) and the time are given, nothing is read.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;

/// How long a plane's pods may be starting before its push failure is reported all the same:
/// pulling a large image onto a fresh node takes minutes, but a volume that never mounts (a
/// Secret missing) keeps a pod `ContainerCreating` for good.
pub const START_GRACE: Duration = Duration::from_secs(600);

/// The most of a kubelet's message a route's condition carries: an image pull's can run to a
/// registry's whole error answer.
const MESSAGE_MAX: usize = 300;

/// The waiting reasons of a container the kubelet is still creating: its image being pulled,
/// its sandbox and volumes being set up, its pod's init containers running.
const CREATING: &[&str] = &["ContainerCreating", "PodInitializing"];

/// What the down pods of a plane say, as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodStates {
    /// Every down pod is still being created, none for [`START_GRACE`] yet.
    Starting {
        /// The one created first.
        pod: String,
        /// Since it was created.
        since: Duration,
    },
    /// Every down pod is still being created, the first created for longer than the grace.
    StartingTooLong {
        pod: String,
        since: Duration,
        /// What it waits on: a container's waiting reason, or why it is not scheduled.
        waiting: String,
    },
    /// A down pod's container waits for a reason other than being created.
    Failing {
        pod: String,
        container: String,
        /// The kubelet's: `ImagePullBackOff`, `CrashLoopBackOff`, ...
        reason: String,
        /// The kubelet's, cut to [`MESSAGE_MAX`] characters; empty when it gave none.
        message: String,
    },
    /// A down pod not found among those watched (not yet seen, or not watched at all: the
    /// Pod list is not permitted), or one whose state tells nothing (running, terminated).
    Unknown,
}

impl PodStates {
    /// What a report of the plane's push failure says of its pods, in place of a guess;
    /// `None` for a state that says nothing ([`PodStates::Starting`] is not reported).
    pub fn told(&self) -> Option<String> {
        match self {
            Self::Failing {
                pod,
                container,
                reason,
                message,
            } => Some(if message.is_empty() {
                format!("pod {pod}: container {container} is waiting: {reason}")
            } else {
                format!("pod {pod}: container {container} is waiting: {reason}: {message}")
            }),
            Self::StartingTooLong {
                pod,
                since,
                waiting,
            } => Some(format!(
                "its pods have been starting for {} (pod {pod}: {waiting})",
                spoken(*since)
            )),
            Self::Starting { .. } | Self::Unknown => None,
        }
    }
}

/// What the pods at `down` (config-API addresses of the plane's pods in `namespace`, all down)
/// say, from `pods` (the watched ones) as of `now`; pods still being created for less than
/// `grace` are [`PodStates::Starting`].
///
/// A pod is found by its IP (`status.podIPs`, else `status.podIP`) in `namespace`. Any failing
/// pod makes the plane [`PodStates::Failing`] (the first, by address); otherwise every one must
/// be found and starting for the plane to be starting.
pub fn judge(
    namespace: &str,
    down: &[SocketAddr],
    pods: &[Arc<Pod>],
    now: Timestamp,
    grace: Duration,
) -> PodStates {
    let mut starting: Vec<(&Pod, String)> = Vec::new();
    let mut unknown = down.is_empty();
    for address in down {
        let Some(pod) = pod_at(namespace, address.ip(), pods) else {
            unknown = true;
            continue;
        };
        match state_of(pod) {
            PodState::Failing {
                container,
                reason,
                message,
            } => {
                return PodStates::Failing {
                    pod: name_of(pod),
                    container,
                    reason,
                    message: cut(&message, MESSAGE_MAX),
                }
            }
            PodState::Starting(waiting) => starting.push((pod, waiting)),
            PodState::Other => unknown = true,
        }
    }
    if unknown {
        return PodStates::Unknown;
    }
    // The first created; one without a creation time (the API server always sets one) counts
    // as created now.
    let created = |pod: &Pod| pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let Some((first, waiting)) = starting
        .into_iter()
        .min_by_key(|(pod, _)| created(pod).unwrap_or(now))
    else {
        return PodStates::Unknown;
    };
    let since = created(first)
        .map(|at| now.duration_since(at))
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default();
    if since < grace {
        PodStates::Starting {
            pod: name_of(first),
            since,
        }
    } else {
        PodStates::StartingTooLong {
            pod: name_of(first),
            since,
            waiting,
        }
    }
}

/// One pod's state.
#[derive(Debug, PartialEq, Eq)]
enum PodState {
    /// No container of it has started yet: what it waits on.
    Starting(String),
    Failing {
        container: String,
        reason: String,
        message: String,
    },
    /// Running, restarted, terminated, or nothing known.
    Other,
}

fn state_of(pod: &Pod) -> PodState {
    let Some(status) = pod.status.as_ref() else {
        return PodState::Other;
    };
    let inits = status
        .init_container_statuses
        .as_deref()
        .unwrap_or_default();
    let containers = status.container_statuses.as_deref().unwrap_or_default();
    // A container (or init container) waiting for any reason but being created is failing,
    // whatever the others do.
    for c in inits.iter().chain(containers) {
        let Some(waiting) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
            continue;
        };
        let reason = waiting.reason.as_deref().unwrap_or_default();
        if !reason.is_empty() && !CREATING.contains(&reason) {
            return PodState::Failing {
                container: c.name.clone(),
                reason: reason.to_owned(),
                message: waiting.message.clone().unwrap_or_default(),
            };
        }
    }
    // Only a pod that has never run is starting: one whose containers ran before (a restart,
    // a node's reboot) is `Running` or its containers have restarted or terminated.
    if !matches!(status.phase.as_deref(), None | Some("Pending")) {
        return PodState::Other;
    }
    if inits.iter().chain(containers).any(has_restarted) {
        return PodState::Other;
    }
    if containers.iter().any(|c| !creating(c)) {
        return PodState::Other;
    }
    if let Some(c) = containers.first() {
        let reason = c
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.clone())
            .unwrap_or_else(|| "ContainerCreating".to_owned());
        return PodState::Starting(reason);
    }
    // No container status yet: init containers running, or not even those (the pod is being
    // scheduled, or its sandbox set up).
    if inits
        .iter()
        .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
    {
        return PodState::Starting("init containers running".to_owned());
    }
    PodState::Starting(unscheduled(status).unwrap_or_else(|| "Pending".to_owned()))
}

/// Whether `c` has been started before (its current state aside): it restarted, or its last
/// run is recorded.
fn has_restarted(c: &ContainerStatus) -> bool {
    c.restart_count > 0
        || c.last_state
            .as_ref()
            .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
}

/// Whether `c` has not started yet: waiting to be created (or in no state yet).
fn creating(c: &ContainerStatus) -> bool {
    let Some(state) = c.state.as_ref() else {
        return true;
    };
    state.running.is_none()
        && state.terminated.is_none()
        && state.waiting.as_ref().is_none_or(|w| {
            w.reason
                .as_deref()
                .is_none_or(|r| r.is_empty() || CREATING.contains(&r))
        })
}

/// The scheduler's word on a pod it has not placed (`PodScheduled=False`): no node has room,
/// none matches its affinity.
fn unscheduled(status: &PodStatus) -> Option<String> {
    let condition = status
        .conditions
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    let message = condition.message.as_deref().unwrap_or_default();
    Some(if message.is_empty() {
        "not scheduled".to_owned()
    } else {
        format!("not scheduled: {}", cut(message, MESSAGE_MAX))
    })
}

/// The pod of `namespace` at `ip`; of several (a pod gone while its IP went to another), the
/// one created last.
fn pod_at<'p>(namespace: &str, ip: IpAddr, pods: &'p [Arc<Pod>]) -> Option<&'p Pod> {
    pods.iter()
        .map(|p| &**p)
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
        .filter(|p| p.status.as_ref().is_some_and(|s| has_ip(s, ip)))
        .max_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

fn has_ip(status: &PodStatus, ip: IpAddr) -> bool {
    let is = |text: &str| text.parse::<IpAddr>().is_ok_and(|a| a == ip);
    match status.pod_ips.as_deref() {
        Some(ips) if !ips.is_empty() => ips.iter().any(|p| is(&p.ip)),
        _ => status.pod_ip.as_deref().is_some_and(is),
    }
}

fn name_of(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

/// `text` on one line, cut to `max` characters (an ellipsis marking the cut).
fn cut(text: &str, max: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line,
    }
}

/// `d` in whole minutes, or hours or days once it is that long.
fn spoken(d: Duration) -> String {
    let minutes = d.as_secs() / 60;
    let (n, unit) = if minutes < 120 {
        (minutes, "minute")
    } else if minutes < 2880 {
        (minutes / 60, "hour")
    } else {
        (minutes / 1440, "day")
    };
    if n == 1 {
        format!("{n} {unit}")
    } else {
        format!("{n} {unit}s")
    }
}

#[cfg(test)]
mod tests;
