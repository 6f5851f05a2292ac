//! The leader election (`runtime::lease`) against the test API server over HTTP on loopback,
//! observed through what the controller gets from it: the `leading` receiver. Covered here are
//! the paths where the API server does not cooperate: renewals it holds unanswered (for longer
//! than the Lease lasts), writes it answers 409 because another replica wrote the Lease first,
//! a give-up on stop that finds the Lease changed hands or is never answered, durations that
//! are not whole seconds, and a Lease deleted or its holder cleared by someone else while a
//! replica leads (told apart from a give-up on stop, which another replica takes at once).

use std::time::Duration;

use cftunnel_controller::runtime::lease::{self, LeaseOptions};
use cftunnel_controller::runtime::REQUIRED_RBAC;
use cftunnel_testkit::kube_api::{ApiServer, Call};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};
use tokio::sync::{oneshot, watch};

const NAMESPACE: &str = "cftunnel-system";
const NAME: &str = "cftunnel-controller";

/// How long a test may wait for something that must happen.
const PATIENCE: Duration = Duration::from_secs(5);

/// One elector, as a controller replica runs it.
struct Replica {
    leading: watch::Receiver<Option<lease::Term>>,
    /// Its Lease duration: with no Lease at all, it waits this long before creating one.
    duration: Duration,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Replica {
    fn start(api: &ApiServer, identity: &str, duration: Duration, renew: Duration) -> Self {
        let options = LeaseOptions {
            namespace: NAMESPACE.to_owned(),
            name: NAME.to_owned(),
            identity: identity.to_owned(),
            duration,
            renew,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let (leading, task) = lease::spawn(api.client(), options, async {
            let _ = stopped.await;
        });
        Self {
            leading,
            duration,
            stop,
            task,
        }
    }

    /// Waits until this replica's leading is `value` (past the duration: where there is no
    /// Lease yet, it waits that long before creating one).
    async fn becomes(&mut self, value: bool, what: &str) {
        let patience = PATIENCE + self.duration;
        tokio::time::timeout(patience, self.leading.wait_for(|l| l.is_some() == value))
            .await
            .unwrap_or_else(|_| panic!("timed out waiting until {what}"))
            .expect("the elector publishes");
    }

    /// Whether this replica leads at any moment within `window`.
    async fn leads_within(&mut self, window: Duration) -> bool {
        tokio::time::timeout(window, self.leading.wait_for(Option::is_some))
            .await
            .is_ok()
    }

    /// Stops the elector and waits for its task to end.
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the elector ends in time")
            .expect("the elector task");
    }
}

fn lease(api: &ApiServer) -> Value {
    api.get("coordination.k8s.io/v1", "Lease", NAMESPACE, NAME)
        .expect("the Lease exists")
}

fn holder(api: &ApiServer) -> Option<String> {
    lease(api)
        .pointer("/spec/holderIdentity")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

fn resource_version(lease: &Value) -> Value {
    lease["metadata"]["resourceVersion"].clone()
}

/// A time the Lease's spec records (`renewTime`, `acquireTime`).
fn spec_time(lease: &Value, field: &str) -> Timestamp {
    lease["spec"][field]
        .as_str()
        .unwrap_or_else(|| panic!("a {field}"))
        .parse()
        .unwrap_or_else(|e| panic!("an RFC 3339 {field}: {e}"))
}

fn renew_time(lease: &Value) -> Timestamp {
    spec_time(lease, "renewTime")
}

/// Whether two replicas are ever seen leading at once, from now until one of them has ended.
/// Seeing both lead means both did; a short overlap between two looks could go unseen.
fn watch_for_two_leaders(a: &Replica, b: &Replica) -> tokio::task::JoinHandle<bool> {
    let (mut a, mut b) = (a.leading.clone(), b.leading.clone());
    tokio::spawn(async move {
        loop {
            if a.borrow_and_update().is_some() && b.borrow_and_update().is_some() {
                return true;
            }
            tokio::select! {
                changed = a.changed() => if changed.is_err() { return false },
                changed = b.changed() => if changed.is_err() { return false },
            }
        }
    })
}

fn micro_time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// The Lease as a replica elsewhere writes it: `holder` (none: cleared; given up on stop when
/// the duration is 1 s), renewed now.
fn lease_of(holder: Option<&str>, duration_seconds: i64, transitions: i64) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration_seconds,
            "renewTime": micro_time(Timestamp::now()),
            "leaseTransitions": transitions,
        },
    })
}

/// Writes of the Lease (create or replace) naming `identity` as the holder.
fn writes_as(identity: &'static str) -> impl Fn(&Call<'_>) -> bool + Send + Sync + 'static {
    move |c| {
        matches!(c.method, "POST" | "PUT")
            && c.kind == "Lease"
            && c.body.pointer("/spec/holderIdentity") == Some(&json!(identity))
    }
}

/// A replace of the Lease that names no holder: a give-up.
fn give_up(c: &Call<'_>) -> bool {
    c.method == "PUT" && c.kind == "Lease" && c.body.pointer("/spec/holderIdentity").is_none()
}

/// The API server stops answering the leader's renewals: it stops leading no later than 80 %
/// of the duration after its last renewal that got through began, so before any other
/// replica could count the Lease out; while the renewals stay unanswered (longer than the
/// Lease lasts) it does not lead; once they are answered it leads again on its own Lease.
#[tokio::test]
async fn a_renewal_that_hangs_ends_leadership_before_the_lease_can_lapse() {
    // a stops leading 4 s after its last renewal began, 1 s before the Lease lapses: room for
    // a busy machine to be late in seeing it.
    let duration = Duration::from_secs(5);
    tokio::time::timeout(Duration::from_secs(30), async {
        let api = ApiServer::builder().rbac(REQUIRED_RBAC).start().await;
        // The renewal after the last one that got through starts a renew period later and may
        // wait a renew period before it counts as failed: a leader that stepped down only then
        // would lead 6 s after its last renewal, past the Lease's 5 s.
        let renew = Duration::from_secs(3);
        let mut a = Replica::start(&api, "replica-a", duration, renew);
        a.becomes(true, "a leads a free Lease").await;
        let transitions = lease(&api)["spec"]["leaseTransitions"].clone();
        let term = *a.leading.borrow();

        let hold = api.hold(writes_as("replica-a"));
        hold.arrived(1).await;
        // Renewals are made one at a time: the Lease now holds the last one that got through.
        let last = lease(&api);
        a.becomes(false, "a steps down").await;
        let after = Timestamp::now().duration_since(renew_time(&last));
        assert!(
            after.as_secs_f64() < duration.as_secs_f64(),
            "a led {after:?} after its last renewal, past the Lease's duration"
        );
        assert!(
            after.as_secs_f64() > duration.mul_f64(0.8).as_secs_f64() - 0.1,
            "a stepped down {after:?} after its last renewal, while it was still valid"
        );

        // Held past the Lease's whole duration: a does not lead, and wrote nothing.
        let overdue = renew_time(&last)
            .checked_add(duration.mul_f64(1.25))
            .expect("a time");
        let wait = Duration::try_from(overdue.duration_since(Timestamp::now()))
            .unwrap_or_default()
            .max(Duration::from_millis(500));
        assert!(!a.leads_within(wait).await, "a leads while unanswered");
        assert_eq!(resource_version(&lease(&api)), resource_version(&last));

        // The API server answers again, long after: a renews its own Lease and leads.
        hold.release();
        a.becomes(true, "a leads again").await;
        assert_eq!(holder(&api).as_deref(), Some("replica-a"));
        assert_eq!(
            lease(&api)["spec"]["leaseTransitions"],
            transitions,
            "the same holder's term"
        );
        assert_eq!(*a.leading.borrow(), term, "and a says so");
        a.stop().await;
        assert_eq!(holder(&api), None, "the Lease was given up");
    })
    .await
    .expect("in time");
}

/// An API server that answers every Lease call only after a while, the renewal's two calls
/// together taking longer than the renew period but less than the leader may go without one:
/// the leader's renewals are late, not failed, and it leads throughout; stopping it does not
/// wait for the renewal under way.
#[tokio::test]
async fn a_slow_api_server_delays_renewals_without_ending_leadership() {
    let duration = Duration::from_secs(5);
    let renew = Duration::from_millis(500);
    let per_call = Duration::from_millis(1200);
    tokio::time::timeout(Duration::from_secs(40), async {
        let api = std::sync::Arc::new(ApiServer::builder().rbac(REQUIRED_RBAC).start().await);
        let mut a = Replica::start(&api, "replica-a", duration, renew);
        a.becomes(true, "a leads a free Lease").await;
        let term = *a.leading.borrow();

        // Each Lease call is held for `per_call` after it arrives: a new hold is made before the
        // last is released, so no call slips through between them.
        let slow = {
            let api = std::sync::Arc::clone(&api);
            tokio::spawn(async move {
                let mut hold = api.hold(|c: &Call<'_>| c.kind == "Lease");
                loop {
                    hold.arrived(1).await;
                    tokio::time::sleep(per_call).await;
                    let next = api.hold(|c: &Call<'_>| c.kind == "Lease");
                    hold.release();
                    hold = next;
                }
            })
        };
        let stepped_down = tokio::time::timeout(duration * 2, a.leading.wait_for(Option::is_none))
            .await
            .is_ok();
        assert!(
            !stepped_down,
            "a stopped leading while its renewals were only slow"
        );
        assert_eq!(*a.leading.borrow(), term, "in the same term");
        assert_eq!(holder(&api).as_deref(), Some("replica-a"));

        let stopping = std::time::Instant::now();
        slow.abort();
        a.stop().await;
        assert!(
            stopping.elapsed() < duration,
            "the stop waited {:?}",
            stopping.elapsed()
        );
    })
    .await
    .expect("in time");
}

/// Stopped while its renewal's write is held by the API server, answered a moment later: the
/// stop ends, and the Lease is given up rather than left naming a replica that is gone.
#[tokio::test]
async fn a_stop_during_a_renewal_gives_up_what_the_renewal_wrote() {
    let duration = Duration::from_secs(5);
    let renew = Duration::from_millis(500);
    tokio::time::timeout(Duration::from_secs(30), async {
        let api = ApiServer::builder().rbac(REQUIRED_RBAC).start().await;
        let mut a = Replica::start(&api, "replica-a", duration, renew);
        a.becomes(true, "a leads a free Lease").await;

        let renewal = api.hold(writes_as("replica-a"));
        renewal.arrived(1).await;
        let give_up_held = api.hold(give_up);
        let stopping = tokio::spawn(a.stop());
        tokio::time::sleep(Duration::from_millis(200)).await;
        renewal.release();
        give_up_held.arrived(1).await;
        give_up_held.release();
        stopping.await.expect("the stop");
        assert_eq!(holder(&api), None, "the Lease was given up");
    })
    .await
    .expect("in time");
}

/// Two replicas; the API server stops answering the leader a but still answers the standby b.
/// a stops leading before b takes the Lease over (the duration, not whole seconds, is
/// recorded rounded up, so b waits longer than a leads); when a's renewals are answered at
/// last, they find b's record (409) and a stays a standby.
#[tokio::test]
async fn a_leader_cut_off_steps_down_before_a_standby_takes_over() {
    let duration = Duration::from_millis(1800);
    let renew = Duration::from_millis(100);
    tokio::time::timeout(Duration::from_secs(20), async {
        let api = ApiServer::builder().rbac(REQUIRED_RBAC).start().await;
        let mut a = Replica::start(&api, "replica-a", duration, renew);
        a.becomes(true, "a leads a free Lease").await;
        let mut b = Replica::start(&api, "replica-b", duration, renew);
        assert!(
            !b.leads_within(Duration::from_millis(500)).await,
            "b leads while a renews"
        );

        let two_leaders = watch_for_two_leaders(&a, &b);
        let hold = api.hold(writes_as("replica-a"));
        hold.arrived(1).await;
        // Renewals are made one at a time: the Lease now holds a's last one that got through.
        let last = lease(&api);
        a.becomes(false, "a steps down").await;
        b.becomes(true, "b takes the unrenewed Lease over").await;
        assert!(a.leading.borrow().is_none());
        let taken = lease(&api);
        assert_eq!(taken["spec"]["holderIdentity"], json!("replica-b"));
        // a leads no longer than 80 % of its duration after its last renewal began, which is
        // no later than the time it recorded; b counted that record out on its own clock only
        // after seeing it unchanged for the recorded duration, which must not be shorter.
        let waited = spec_time(&taken, "acquireTime").duration_since(renew_time(&last));
        assert!(
            waited.as_secs_f64() >= duration.as_secs_f64(),
            "b took the Lease over {waited:?} after a's last renewal, within a's duration"
        );
        assert_eq!(taken["spec"]["leaseTransitions"], json!(1));
        assert_eq!(
            taken["spec"]["leaseDurationSeconds"],
            json!(2),
            "1.8 s, rounded up"
        );

        // a's renewals are answered at last: b's record stands and a does not lead.
        hold.release();
        assert!(
            !a.leads_within(Duration::from_secs(1)).await,
            "a leads again beside b"
        );
        assert_eq!(holder(&api).as_deref(), Some("replica-b"));
        b.becomes(true, "b leads on its record").await;

        a.stop().await;
        assert_eq!(
            holder(&api).as_deref(),
            Some("replica-b"),
            "a standby gives nothing up"
        );
        b.stop().await;
        assert_eq!(holder(&api), None);
        assert!(
            !two_leaders.await.expect("the watch for two leaders"),
            "a and b led at once"
        );
    })
    .await
    .expect("in time");
}

/// a reads the Lease (`seed`, or none), and while its write to take it is on the way another
/// replica writes the Lease: a's write is answered 409 and a does not lead, neither then nor
/// later while the other holds the Lease, and stopping a leaves the other's record alone.
async fn a_lost_race_is_not_leadership(seed: Option<Value>, answer_reason: &str) {
    tokio::time::timeout(Duration::from_secs(20), async {
        let api = ApiServer::builder().rbac(REQUIRED_RBAC).start().await;
        if let Some(seed) = seed {
            api.put(seed);
        }
        let hold = api.hold(writes_as("replica-a"));
        // A renew period longer than the race takes: the answer reaches a.
        let mut a = Replica::start(
            &api,
            "replica-a",
            Duration::from_secs(2),
            Duration::from_secs(1),
        );
        hold.arrived(1).await;
        let rival = api.put(lease_of(Some("replica-b"), 30, 1));
        hold.release();
        assert_eq!(hold.answered(1).await, vec![409], "{answer_reason}");
        assert!(
            !a.leads_within(Duration::from_millis(1500)).await,
            "a leads on a lost race"
        );
        assert_eq!(lease(&api), rival, "a wrote nothing");
        a.stop().await;
        assert_eq!(lease(&api), rival, "a gave up nothing of b's");
    })
    .await
    .expect("in time");
}

#[tokio::test]
async fn a_take_over_answered_409_conflict_is_not_leadership() {
    // A Lease given up: a reads it free and replaces it naming the resourceVersion it read.
    a_lost_race_is_not_leadership(Some(lease_of(None, 1, 0)), "Conflict").await;
}

#[tokio::test]
async fn a_create_answered_409_already_exists_is_not_leadership() {
    // No Lease yet: a creates one.
    a_lost_race_is_not_leadership(None, "AlreadyExists").await;
}

/// a stops leading and gives the Lease up, but another replica wrote the Lease after a read
/// it: the give-up is answered 409 and the other's record stands.
#[tokio::test]
async fn the_give_up_on_stop_leaves_a_record_written_since_alone() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let api = ApiServer::builder().rbac(REQUIRED_RBAC).start().await;
        let mut a = Replica::start(
            &api,
            "replica-a",
            Duration::from_secs(2),
            Duration::from_secs(1),
        );
        a.becomes(true, "a leads a free Lease").await;
        let hold = api.hold(give_up);
        let _ = a.stop.send(());
        hold.arrived(1).await;
        assert!(
            a.leading.borrow().is_none(),
            "a stops leading before it gives up"
        );
        let rival = api.put(lease_of(Some("replica-b"), 2, 1));
        hold.release();
        assert_eq!(hold.answered(1).await, vec![409]);
        tokio::time::timeout(PATIENCE, a.task)
            .await
            .expect("the elector ends in time")
            .expect("the elector task");
        assert_eq!(lease(&api), rival, "b's record stands");
    })
    .await
    .expect("in time");
}

/// The API server never answers the give-up: stopping still ends the elector, about a renew
/// period later, and the Lease is left to lapse.
#[tokio::test]
async fn a_give_up_that_is_never_answered_does_not_hold_the_stop_up() {
    let renew = Duration::from_millis(300);
    tokio::time::timeout(Duration::from_secs(20), async {
        let api = ApiServer::builder().rbac(REQUIRED_RBAC).start().await;
        let mut a = Replica::start(&api, "replica-a", Duration::from_secs(2), renew);
        a.becomes(true, "a leads a free Lease").await;
        let hold = api.hold(give_up);
        let _ = a.stop.send(());
        hold.arrived(1).await;
        assert!(
            a.leading.borrow().is_none(),
            "a stops leading before it gives up"
        );
        tokio::time::timeout(renew * 2 + Duration::from_secs(1), a.task)
            .await
            .expect("the elector ends without an answer")
            .expect("the elector task");
        assert_eq!(holder(&api).as_deref(), Some("replica-a"));
        drop(hold);
    })
    .await
    .expect("in time");
}

/// A sub-second duration is recorded as one second (the API server refuses 0): the replica
/// leads, and a standby waits while it renews.
#[tokio::test]
async fn a_sub_second_duration_is_recorded_as_a_whole_second() {
    let duration = Duration::from_millis(500);
    let renew = Duration::from_millis(100);
    tokio::time::timeout(Duration::from_secs(20), async {
        let api = ApiServer::builder().rbac(REQUIRED_RBAC).start().await;
        let mut a = Replica::start(&api, "replica-a", duration, renew);
        a.becomes(true, "a leads a free Lease").await;
        let taken = lease(&api);
        assert_eq!(taken["spec"]["leaseDurationSeconds"], json!(1));
        let mut b = Replica::start(&api, "replica-b", duration, renew);
        assert!(
            !b.leads_within(Duration::from_millis(1500)).await,
            "b leads while a renews"
        );
        // What the Lease records rather than whether a leads at this moment: a stops leading
        // 0.4 s after a renewal, which a busy machine can let pass before the next one.
        let renewed = lease(&api);
        assert_eq!(renewed["spec"]["holderIdentity"], json!("replica-a"));
        assert_eq!(renewed["spec"]["leaseTransitions"], json!(0));
        assert!(
            renew_time(&renewed) > renew_time(&taken),
            "a renewed the Lease meanwhile"
        );
        a.stop().await;
        b.becomes(true, "b takes the given-up Lease").await;
        b.stop().await;
    })
    .await
    .expect("in time");
}

/// The term is read off the Lease record, not off which writes were answered: when a
/// replica's take-over is committed but its answer never arrives, its next renewal finds a
/// record naming it with a new acquire time and transition, and says so as a new term. What it
/// remembered from its term before may be stale: another replica may have led in between.
#[tokio::test]
async fn a_take_over_whose_answer_was_lost_is_a_new_term() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let api = ApiServer::builder().rbac(REQUIRED_RBAC).start().await;
        let mut a = Replica::start(
            &api,
            "replica-a",
            Duration::from_secs(2),
            Duration::from_millis(200),
        );
        a.becomes(true, "a leads a free Lease").await;
        let before = *a.leading.borrow();
        let transitions = lease(&api)["spec"]["leaseTransitions"]
            .as_i64()
            .expect("transitions");

        let hold = api.hold(writes_as("replica-a"));
        hold.arrived(1).await;
        a.becomes(false, "a steps down").await;
        // Meanwhile another replica led, and a's take-over after it was committed, its answer
        // lost: the record names a, with one more transition and a new acquire time.
        let mut taken = lease_of(Some("replica-a"), 2, transitions + 2);
        taken["spec"]["acquireTime"] = json!(micro_time(Timestamp::now()));
        api.put(taken);
        hold.release();
        a.becomes(true, "a leads on the record naming it").await;
        let after = *a.leading.borrow();
        assert!(after.is_some());
        assert_ne!(after, before, "a new term");
        a.stop().await;
    })
    .await
    .expect("in time");
}

/// The Lease is deleted while a leads, and a's writes are held (it cannot put it back): b
/// waits the duration, seeing no Lease, before it creates one, by which time a has stepped
/// down; the two never lead at once.
#[tokio::test]
async fn a_deleted_lease_is_taken_only_after_the_duration() {
    let duration = Duration::from_secs(3);
    let renew = Duration::from_millis(200);
    tokio::time::timeout(Duration::from_secs(20), async {
        let api = ApiServer::builder().rbac(REQUIRED_RBAC).start().await;
        let mut a = Replica::start(&api, "replica-a", duration, renew);
        a.becomes(true, "a leads a free Lease").await;
        let mut b = Replica::start(&api, "replica-b", duration, renew);
        assert!(
            !b.leads_within(Duration::from_millis(500)).await,
            "b leads while a renews"
        );
        let two_leaders = watch_for_two_leaders(&a, &b);
        let hold = api.hold(writes_as("replica-a"));
        hold.arrived(1).await;
        let deleted = Timestamp::now();
        assert!(api.delete("coordination.k8s.io/v1", "Lease", NAMESPACE, NAME));
        assert!(
            !b.leads_within(duration.mul_f64(0.8)).await,
            "b took a deleted Lease while a may still lead"
        );
        b.becomes(true, "b takes the Lease, missing for the duration")
            .await;
        let taken = lease(&api);
        assert_eq!(taken["spec"]["holderIdentity"], json!("replica-b"));
        let waited = spec_time(&taken, "acquireTime").duration_since(deleted);
        assert!(
            waited.as_secs_f64() >= duration.as_secs_f64(),
            "b took the Lease {waited:?} after it was deleted"
        );
        assert!(a.leading.borrow().is_none());
        hold.release();
        assert!(
            !a.leads_within(Duration::from_secs(1)).await,
            "a leads again beside b"
        );
        a.stop().await;
        b.stop().await;
        assert!(
            !two_leaders.await.expect("the watch for two leaders"),
            "a and b led at once"
        );
    })
    .await
    .expect("in time");
}

/// Someone else deletes the Lease, or clears its holder, while a leads: a puts itself back
/// at its next renewal, in the same term (nobody else led meanwhile), and b, which would have
/// to see the record unchanged for the duration first, never leads.
async fn a_leader_keeps_a_lease_tampered_with(tamper: impl FnOnce(&ApiServer)) {
    let duration = Duration::from_secs(3);
    let renew = Duration::from_millis(200);
    tokio::time::timeout(Duration::from_secs(20), async {
        let api = ApiServer::builder().rbac(REQUIRED_RBAC).start().await;
        let mut a = Replica::start(&api, "replica-a", duration, renew);
        a.becomes(true, "a leads a free Lease").await;
        let term = *a.leading.borrow();
        let mut b = Replica::start(&api, "replica-b", duration, renew);
        assert!(
            !b.leads_within(Duration::from_millis(500)).await,
            "b leads while a renews"
        );
        let two_leaders = watch_for_two_leaders(&a, &b);
        tamper(&api);
        assert!(
            !b.leads_within(duration.mul_f64(1.5)).await,
            "b took the Lease while a leads"
        );
        assert_eq!(
            holder(&api).as_deref(),
            Some("replica-a"),
            "a put itself back"
        );
        assert_eq!(*a.leading.borrow(), term, "in the same term");
        b.stop().await;
        a.stop().await;
        assert!(
            !two_leaders.await.expect("the watch for two leaders"),
            "a and b led at once"
        );
    })
    .await
    .expect("in time");
}

#[tokio::test]
async fn a_leader_puts_a_deleted_lease_back_and_no_standby_takes_it() {
    a_leader_keeps_a_lease_tampered_with(|api| {
        assert!(api.delete("coordination.k8s.io/v1", "Lease", NAMESPACE, NAME));
    })
    .await;
}

#[tokio::test]
async fn a_holder_cleared_by_someone_else_is_not_a_give_up() {
    a_leader_keeps_a_lease_tampered_with(|api| {
        let mut cleared = lease(api);
        cleared["spec"]["holderIdentity"] = Value::Null;
        api.put(cleared);
    })
    .await;
}

/// A give-up on stop is marked as one: a standby takes the Lease at once, long before the
/// duration.
#[tokio::test]
async fn a_give_up_on_stop_hands_the_lease_over_at_once() {
    let duration = Duration::from_secs(10);
    let renew = Duration::from_millis(200);
    tokio::time::timeout(Duration::from_secs(30), async {
        let api = ApiServer::builder().rbac(REQUIRED_RBAC).start().await;
        let mut a = Replica::start(&api, "replica-a", duration, renew);
        a.becomes(true, "a leads a free Lease").await;
        let mut b = Replica::start(&api, "replica-b", duration, renew);
        assert!(
            !b.leads_within(Duration::from_millis(500)).await,
            "b leads while a renews"
        );
        a.stop().await;
        assert!(
            b.leads_within(Duration::from_secs(2)).await,
            "b waited for a given-up Lease"
        );
        let taken = lease(&api);
        assert_eq!(taken["spec"]["holderIdentity"], json!("replica-b"));
        assert_eq!(taken["spec"]["leaseTransitions"], json!(1));
        b.stop().await;
        let given_up = lease(&api);
        assert_eq!(given_up["spec"]["holderIdentity"], Value::Null);
        assert_eq!(given_up["spec"]["leaseDurationSeconds"], json!(1), "marked");
    })
    .await
    .expect("in time");
}
