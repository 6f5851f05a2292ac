//! What the state of a plane's pods says of why none of them takes its config: still being
//! created (a push failing meanwhile is no fault yet, within a grace), or failing for a reason
//! the kubelet gives (an image it cannot pull, a crash loop), which the route's condition then
//! names.
//!
//! What is told stays the same while the failure does (no count of minutes, no kubelet
//! message that changes at each retry): each change rewrites the status of every route of the
//! plane.
//!
//! Only pods with an IP are judged: the plane's down pods are the addresses its EndpointSlices
//! list. A pod not scheduled yet, or whose volumes do not mount (a Secret it names missing),
//! has none, so it is listed nowhere; a plane of such pods only is told as having no proxy pod
//! listed.
//!
//! Pure: the pods (as the watch cache holds them), the plane's run of failed pushes and the
//! time are given, nothing is read.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;

/// How long a plane whose pods are all still being created goes unreported: pulling a large
/// image onto a fresh node, or init containers waiting for what they need, take minutes.
/// Counted from the first pod's creation and from the start of the plane's failed pushes
/// alike ([`FailureRun`]), so pods replaced before they ever start (preempted, their spot node
/// reclaimed during a slow pull) do not keep a lasting failure unreported.
pub const START_GRACE: Duration = Duration::from_secs(600);

/// The most of a kubelet's message a route's condition carries: an image pull's can run to a
/// registry's whole error answer.
const MESSAGE_MAX: usize = 300;

/// The waiting reasons of a container the kubelet is still creating: its image being pulled,
/// its sandbox being set up, its pod's init containers running.
const CREATING: &[&str] = &["ContainerCreating", "PodInitializing"];

/// The waiting reasons of a container whose image cannot be pulled: the kubelet alternates
/// them, one at each retry.
const PULL_FAILING: &[&str] = &["ErrImagePull", "ImagePullBackOff"];

/// The plane's current run of failed pushes, which its starting pods are judged by as well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureRun {
    /// How long its pushes have been failing ([`crate::push::PlaneOutcome::failing_for`]).
    pub failing_for: Duration,
    /// Its failure has been reported in this run already: it stays reported, whatever its
    /// pods do, until a push succeeds (a condition that comes and goes while pushes keep
    /// failing tells nothing).
    pub reported: bool,
    /// How long pods being created go unreported ([`START_GRACE`] unless configured).
    pub grace: Duration,
}

/// What the down pods of a plane say, as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodStates {
    /// Every down pod is still being created, the first for less than the grace, and the
    /// plane's pushes have been failing for less than it too: not reported.
    Starting {
        /// The one created first.
        pod: String,
        /// Since it was created.
        since: Duration,
    },
    /// Every down pod is still being created, but the first for longer than the grace, or
    /// the plane's pushes have been failing for longer (its pods replaced before they start).
    StartingTooLong {
        pod: String,
        /// What it waits on: its container's waiting reason, or its init containers.
        waiting: String,
        /// The grace, told as the time they have been starting for at least: a count that
        /// grows would rewrite the routes' status at each round.
        grace: Duration,
    },
    /// Every down pod is being created, within the grace, but the plane's failure was already
    /// reported in this run ([`FailureRun::reported`]): its pods were replaced.
    StartingAgain { pod: String, waiting: String },
    /// A down pod's container fails.
    Failing {
        pod: String,
        container: String,
        failure: Failure,
    },
    /// A down pod not found among those watched (not yet seen, or not watched at all: the
    /// Pod list is not permitted), or one whose state tells nothing (running, terminated).
    Unknown,
}

/// How a container fails, in terms that stay while it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Its image cannot be pulled (`ErrImagePull` or `ImagePullBackOff`, one failure): the
    /// image it names (the container status's `image`), without the kubelet's message, which
    /// changes with the reason.
    CannotPull { image: String },
    /// It has exited and been restarted, and is waiting in `CrashLoopBackOff` or running
    /// between back-offs: how it last exited (`lastState.terminated`), when known. The
    /// back-off's message, which grows at each restart, is left out.
    KeepsExiting {
        exit_code: Option<i32>,
        /// The kubelet's: `Error`, `OOMKilled`, ...
        reason: Option<String>,
    },
    /// It waits for another reason (`CreateContainerConfigError`, `InvalidImageName`, ...),
    /// whose message stays the same while it does.
    Waiting {
        reason: String,
        /// The kubelet's, cut to 300 characters; empty when it gave none.
        message: String,
    },
}

impl PodStates {
    /// What a report of the plane's push failure says of its pods, in place of a guess;
    /// `None` for a state that says nothing ([`PodStates::Starting`] is not reported).
    pub fn told(&self) -> Option<String> {
        match self {
            Self::Failing {
                pod,
                container,
                failure,
            } => Some(format!(
                "pod {pod}: container {container} {}",
                failure.told()
            )),
            Self::StartingTooLong {
                pod,
                waiting,
                grace,
            } => Some(format!(
                "its pods have been starting for more than {} (pod {pod}: {waiting})",
                spoken(*grace)
            )),
            Self::StartingAgain { pod, waiting } => Some(format!(
                "its pods are being created again (pod {pod}: {waiting})"
            )),
            Self::Starting { .. } | Self::Unknown => None,
        }
    }
}

impl Failure {
    /// What the container does, after its name.
    fn told(&self) -> String {
        match self {
            Self::CannotPull { image } if image.is_empty() => {
                "cannot pull its image (ImagePullBackOff)".to_owned()
            }
            Self::CannotPull { image } => format!("cannot pull image {image} (ImagePullBackOff)"),
            Self::KeepsExiting {
                exit_code: Some(code),
                reason: Some(reason),
            } => format!("keeps exiting: exit code {code} ({reason})"),
            Self::KeepsExiting {
                exit_code: Some(code),
                reason: None,
            } => format!("keeps exiting: exit code {code}"),
            Self::KeepsExiting {
                exit_code: None, ..
            } => "keeps exiting (CrashLoopBackOff)".to_owned(),
            Self::Waiting { reason, message } if message.is_empty() => {
                format!("is waiting: {reason}")
            }
            Self::Waiting { reason, message } => format!("is waiting: {reason}: {message}"),
        }
    }
}

/// What the pods at `down` (config-API addresses of the plane's pods in `namespace`, all down)
/// say, from `pods` (the watched ones) as of `now`, the plane's pushes having failed as `run`
/// says.
///
/// A pod is found by its IP (`status.podIPs`, else `status.podIP`) in `namespace`. Any failing
/// pod makes the plane [`PodStates::Failing`] (the first, by address); otherwise every one must
/// be found and starting for the plane to be starting, [`PodStates::Starting`] only while both
/// the first created and the failure run are younger than the grace, and the failure has not
/// been reported yet.
pub fn judge(
    namespace: &str,
    down: &[SocketAddr],
    pods: &[Arc<Pod>],
    now: Timestamp,
    run: FailureRun,
) -> PodStates {
    let mut starting: Vec<(&Pod, String)> = Vec::new();
    let mut unknown = down.is_empty();
    for address in down {
        let Some(pod) = pod_at(namespace, address.ip(), pods) else {
            unknown = true;
            continue;
        };
        match state_of(pod) {
            PodState::Failing { container, failure } => {
                return PodStates::Failing {
                    pod: name_of(pod),
                    container,
                    failure,
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
    let pod = name_of(first);
    if since >= run.grace || run.failing_for >= run.grace {
        PodStates::StartingTooLong {
            pod,
            waiting,
            grace: run.grace,
        }
    } else if run.reported {
        PodStates::StartingAgain { pod, waiting }
    } else {
        PodStates::Starting { pod, since }
    }
}

/// One pod's state.
#[derive(Debug, PartialEq, Eq)]
enum PodState {
    /// No container of it has started yet: what it waits on.
    Starting(String),
    Failing {
        container: String,
        failure: Failure,
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
    // A container (or init container) that fails makes the pod failing, whatever the others
    // do.
    let failing = inits
        .iter()
        .map(|c| (c, true))
        .chain(containers.iter().map(|c| (c, false)))
        .find_map(|(c, init)| Some((c, failure_of(c, init)?)));
    if let Some((c, failure)) = failing {
        return PodState::Failing {
            container: c.name.clone(),
            failure,
        };
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
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "ContainerCreating".to_owned());
        return PodState::Starting(reason);
    }
    // No container status yet: init containers running, or not even those (its sandbox, which
    // its IP comes with, is just set up).
    if inits
        .iter()
        .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
    {
        return PodState::Starting("init containers running".to_owned());
    }
    PodState::Starting("ContainerCreating".to_owned())
}

/// How `c` (an init container if `init`) fails, if it does: it waits for a reason other than
/// being created, or it has exited and been restarted ([`Failure::KeepsExiting`]), whether it
/// waits for its back-off to end or runs until it exits again. Either is told the same, so a
/// crash loop reads the same all through its cycle.
fn failure_of(c: &ContainerStatus, init: bool) -> Option<Failure> {
    let state = c.state.as_ref();
    let waiting = state
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| Some((w.reason.as_deref().filter(|r| !r.is_empty())?, w)));
    let last_exit = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    match waiting {
        Some((reason, _)) if PULL_FAILING.contains(&reason) => Some(Failure::CannotPull {
            image: c.image.clone(),
        }),
        Some(("CrashLoopBackOff", _)) => Some(keeps_exiting(last_exit)),
        Some((reason, w)) if !CREATING.contains(&reason) => Some(Failure::Waiting {
            reason: reason.to_owned(),
            message: cut(w.message.as_deref().unwrap_or_default(), MESSAGE_MAX),
        }),
        // Running, terminated, or being created (again): failing only if it exited before.
        _ => {
            // An init container that ended well is done, however many tries it took.
            let done = init
                && state
                    .and_then(|s| s.terminated.as_ref())
                    .is_some_and(|t| t.exit_code == 0);
            let restarted = c.restart_count > 0 && last_exit.is_some();
            (restarted && !done).then(|| keeps_exiting(last_exit))
        }
    }
}

fn keeps_exiting(last_exit: Option<&ContainerStateTerminated>) -> Failure {
    Failure::KeepsExiting {
        exit_code: last_exit.map(|t| t.exit_code),
        reason: last_exit
            .and_then(|t| t.reason.clone())
            .filter(|r| !r.is_empty()),
    }
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

/// `d` in whole seconds under a minute, then in whole minutes, or hours or days once it is
/// that long.
fn spoken(d: Duration) -> String {
    let minutes = d.as_secs() / 60;
    let (n, unit) = if minutes == 0 {
        (d.as_secs(), "second")
    } else if minutes < 120 {
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
