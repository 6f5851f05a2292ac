use super::*;
use crate::translate::TunnelIdentity;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// Limits small enough to reach in a test; posts given up after a minute.
fn limits(at_once: usize, at_once_per_namespace: usize, waiting: usize) -> EventLimits {
    EventLimits {
        at_once,
        at_once_per_namespace,
        waiting,
        waiting_per_namespace: waiting,
        post_timeout: Duration::from_secs(60),
    }
}

/// An Event about `regarding` (`namespace/name`) that runs `post`.
fn post(
    regarding: &str,
    post: impl std::future::Future<Output = ()> + Send + 'static,
) -> EventPost {
    let namespace = regarding.split('/').next().unwrap_or_default();
    EventPost {
        regarding: regarding.to_owned(),
        namespace: namespace.to_owned(),
        reason: "Test".to_owned(),
        told: Told::PushFailed {
            route: regarding.to_owned(),
        },
        post: Box::pin(post),
    }
}

/// An Event about `regarding` that sends `name` once posted.
fn sends(
    regarding: &str,
    name: &'static str,
    sent: &tokio::sync::mpsc::UnboundedSender<&'static str>,
) -> EventPost {
    let sent = sent.clone();
    post(regarding, async move {
        let _ = sent.send(name);
    })
}

async fn next(posted: &mut UnboundedReceiver<&'static str>) -> Option<&'static str> {
    tokio::time::timeout(Duration::from_secs(5), posted.recv())
        .await
        .expect("an Event posted")
}

#[tokio::test]
async fn events_about_one_object_go_out_in_order() {
    // Turns enough for both objects of the namespace.
    let mut writes = StatusWrites::new(Arc::new(Notify::new()), limits(8, 2, 64));
    let (sent, mut posted) = unbounded_channel();
    let (release, released) = oneshot::channel::<()>();
    let a1 = sent.clone();
    assert!(writes.event(post("ns/a", async move {
        let _ = released.await;
        let _ = a1.send("a1");
    })));
    assert!(writes.event(sends("ns/a", "a2", &sent)));
    assert!(writes.event(sends("ns/b", "b1", &sent)));
    assert_eq!(
        next(&mut posted).await,
        Some("b1"),
        "another object's goes at once"
    );
    let _ = release.send(());
    assert_eq!(next(&mut posted).await, Some("a1"));
    assert_eq!(
        next(&mut posted).await,
        Some("a2"),
        "after the one before it"
    );
}

/// More Events than may wait, all made at once on a healthy API server: those refused
/// are made again as the round woken for them comes, and every one is posted.
#[tokio::test]
async fn a_burst_past_the_bound_is_posted_whole_as_rounds_make_the_refused_again() {
    let wake = Arc::new(Notify::new());
    let mut writes = StatusWrites::new(Arc::clone(&wake), limits(2, 2, 4));
    let (sent, mut posted) = unbounded_channel();
    const NAMES: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    let mut untold: Vec<&'static str> = NAMES.to_vec();
    let mut offers = 0;
    while !untold.is_empty() {
        offers += 1;
        assert!(offers < 20, "still refused: {untold:?}");
        untold.retain(|name| !writes.event(sends(&format!("ns/{name}"), name, &sent)));
        if offers == 1 {
            assert_eq!(untold.len(), 6, "4 wait, the rest are refused");
        }
        if !untold.is_empty() {
            tokio::time::timeout(Duration::from_secs(5), wake.notified())
                .await
                .expect("a round, as room frees");
            writes.take_finished();
        }
    }
    let mut all = Vec::new();
    for _ in NAMES {
        all.extend(next(&mut posted).await);
    }
    all.sort_unstable();
    assert_eq!(all, NAMES);
}

/// The bound is on Events waiting: one being posted leaves its place to the next.
#[tokio::test]
async fn events_being_posted_take_no_place() {
    let mut writes = StatusWrites::new(Arc::new(Notify::new()), limits(1, 1, 1));
    let (started, mut posting) = unbounded_channel();
    assert!(writes.event(post("ns/a", async move {
        let _ = started.send("a");
        std::future::pending::<()>().await;
    })));
    assert_eq!(next(&mut posting).await, Some("a"));
    assert!(writes.event(post("ns/b", std::future::pending())));
    assert!(
        !writes.event(post("ns/c", std::future::pending())),
        "one waits already"
    );
}

/// One namespace's Events that hang (a webhook on its `events`) hold its own turns only:
/// another namespace's Event goes at once.
#[tokio::test]
async fn one_namespaces_events_that_hang_leave_the_others_their_turns() {
    let mut writes = StatusWrites::new(Arc::new(Notify::new()), limits(3, 1, 64));
    let (sent, mut posted) = unbounded_channel();
    for name in ["a/1", "a/2", "a/3", "a/4"] {
        assert!(writes.event(post(name, std::future::pending())));
    }
    assert!(writes.event(sends("b/1", "b1", &sent)));
    assert_eq!(next(&mut posted).await, Some("b1"));
}

/// Several namespaces whose Events hang (a webhook on each one's `events`), each with all the
/// Events it may have waiting, leave turns and places to the others: by default a namespace
/// may take only a small share of them.
#[tokio::test]
async fn several_namespaces_whose_events_hang_leave_room_for_another() {
    let mut writes = StatusWrites::new(Arc::new(Notify::new()), EventLimits::default());
    let (sent, mut posted) = unbounded_channel();
    let hung = ["a", "b", "c", "d"];
    let mut taken = 0;
    // Again once those first taken are being posted, and so no longer wait.
    for _ in 0..2 {
        for namespace in hung {
            while writes.event(post(
                &format!("{namespace}/{taken}"),
                std::future::pending(),
            )) {
                taken += 1;
                assert!(taken < 10_000, "a bound on those waiting");
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        writes.event(sends("e/1", "e1", &sent)),
        "another namespace's Event finds a place"
    );
    assert_eq!(next(&mut posted).await, Some("e1"), "and a turn");
}

/// A post the API server does not answer is given up after its timeout, and frees its
/// turn for the next.
#[tokio::test(start_paused = true)]
async fn an_event_post_that_hangs_is_given_up_after_its_timeout() {
    let timeout = Duration::from_secs(5);
    let limits = EventLimits {
        post_timeout: timeout,
        ..limits(1, 1, 64)
    };
    let mut writes = StatusWrites::new(Arc::new(Notify::new()), limits);
    let (sent, mut posted) = unbounded_channel();
    let started = tokio::time::Instant::now();
    assert!(writes.event(post("a/1", std::future::pending())));
    assert!(writes.event(sends("b/1", "b1", &sent)));
    let b1 = tokio::time::timeout(Duration::from_secs(60), posted.recv())
        .await
        .expect("posted once the hung one is given up");
    assert_eq!(b1, Some("b1"));
    assert!(started.elapsed() >= timeout, "{:?}", started.elapsed());
    tokio::time::sleep(Duration::from_millis(10)).await;
    writes.take_finished();
    assert!(writes.unanswered.is_empty(), "both ended");
}

/// A post that panics is a bug in the post: logged, and no status write is held back nor
/// round scheduled for it.
#[tokio::test]
async fn a_panicking_event_post_is_logged_only() {
    let wake = Arc::new(Notify::new());
    let mut writes = StatusWrites::new(Arc::clone(&wake), EventLimits::default());
    assert!(writes.event(post("a/1", async { panic!("a bug in a post") })));
    tokio::time::timeout(Duration::from_secs(5), async {
        while !writes.unanswered.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
            writes.take_finished();
        }
    })
    .await
    .expect("the post ended");
    assert!(
        writes.failed.is_empty(),
        "no write held back, no round scheduled"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(100), wake.notified())
            .await
            .is_err(),
        "no round woken"
    );
}

/// Dropping every Event (this replica stopped leading) hands back what those not answered
/// told, for their records to be forgotten; those answered are not among them.
#[tokio::test]
async fn dropping_the_events_hands_back_what_the_unanswered_told() {
    let mut writes = StatusWrites::new(Arc::new(Notify::new()), EventLimits::default());
    let (sent, mut posted) = unbounded_channel();
    assert!(writes.event(sends("a/answered", "answered", &sent)));
    assert_eq!(next(&mut posted).await, Some("answered"));
    assert!(writes.event(post("a/unanswered", std::future::pending())));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        writes.abort_all(),
        [Told::PushFailed {
            route: "a/unanswered".to_owned()
        }]
    );
    assert!(writes.unanswered.is_empty());
    assert!(writes.event(sends("a/later", "later", &sent)));
    assert_eq!(next(&mut posted).await, Some("later"));
}

/// Those not answered are handed back in the order they were made, so that of two telling
/// the same (a Gateway's `ProxyProvisioned`s), the newest can be kept.
#[tokio::test]
async fn the_unanswered_are_handed_back_in_the_order_they_were_made() {
    let mut writes = StatusWrites::new(Arc::new(Notify::new()), EventLimits::default());
    let routes: Vec<String> = (0..16).map(|i| format!("ns{}/route-{i}", i % 3)).collect();
    for route in &routes {
        assert!(writes.event(post(route, std::future::pending())));
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    let made: Vec<Told> = routes
        .iter()
        .map(|route| Told::PushFailed {
            route: route.clone(),
        })
        .collect();
    assert_eq!(writes.abort_all(), made);
}

/// A round's writes: of `key`, one failing, or none as its object says what is wanted.
fn round(key: &WriteKey, failing: bool) -> Writes {
    let mut writes = Writes::default();
    writes.seen.insert(key.clone());
    if failing {
        let content = content_digest(&json!({"list": "new"}));
        let job: BoxFuture<'static, Written> =
            Box::pin(async { Written::Failed("refused".to_owned()) });
        let digest = write_digest(&content, Some("1"));
        writes.patches.push((key.clone(), digest, job));
    } else {
        writes.settled.push(key.clone());
    }
    writes
}

/// A write that failed in a row waits longer each time; once its object says what is
/// wanted, that is forgotten: its next failure, however much later, waits the first wait.
#[tokio::test(start_paused = true)]
async fn a_settled_write_forgets_its_failures() {
    let mut writes = StatusWrites::new(Arc::new(Notify::new()), EventLimits::default());
    let key = WriteKey::Object("/api/v1/namespaces/ns/configmaps/list".to_owned());
    let content = content_digest(&json!({"list": "new"}));
    let held = |writes: &StatusWrites| writes.covered(&key, &content, Some("1"));
    for wait in [RETRY_FIRST, RETRY_FIRST * 2, RETRY_FIRST * 4] {
        writes.run(round(&key, true)).await;
        assert!(held(&writes));
        tokio::time::sleep(wait).await;
        writes.take_finished();
        assert!(!held(&writes), "{wait:?}");
    }
    writes.run(round(&key, false)).await;
    tokio::time::sleep(RETRY_MAX).await;
    writes.run(round(&key, true)).await;
    assert!(held(&writes));
    tokio::time::sleep(RETRY_FIRST).await;
    assert!(!held(&writes), "held past the first wait");
}

#[test]
fn a_note_is_cut_to_the_byte_limit_at_a_character_boundary() {
    assert_eq!(clipped("short"), "short");
    let long = format!("{}{}", "a".repeat(1020), "é".repeat(10));
    let note = clipped(&long);
    assert!(note.len() <= NOTE_LIMIT, "{} bytes", note.len());
    assert_eq!(note.len(), 1024);
    assert!(note.ends_with("éé"));
    let odd = format!("{}{}", "a".repeat(1023), "é");
    assert_eq!(clipped(&odd), "a".repeat(1023));
}

/// A refusal as [`refused_rules`] words it: `pod` of `plane` refused the route's rule 0, at
/// `position` in the document it was pushed.
fn refusal(pod: &str, plane: &PlaneKey, position: usize) -> String {
    refusal_of(0, pod, plane, position)
}

/// [`refusal`] of the route's rule `rule`.
fn refusal_of(rule: usize, pod: &str, plane: &PlaneKey, position: usize) -> String {
    format!(
        "proxy pod {pod} of the {plane} plane refused rule tenant/cors/{rule}, which is left out \
         (the route's other rules are served): rules[{position}]: unknown field `cors`"
    )
}

fn edge() -> PlaneKey {
    PlaneKey::Dedicated(ObjectKey::new("tenant", "edge"))
}

/// The Gateway the route's parent is, on the shared plane.
fn parent() -> translate::ParentRef {
    translate::ParentRef {
        kind: Default::default(),
        namespace: "tenant".to_owned(),
        name: "public".to_owned(),
        section_name: None,
        port: None,
    }
}

const ROUTE: &str = "tenant/cors";

#[test]
fn a_refusals_key_leaves_out_the_pod_and_the_rules_position() {
    let shared = PlaneKey::Shared;
    let key = refusal_key(&refusal("10.0.0.5:8081", &shared, 3));
    assert_eq!(key, refusal_key(&refusal("10.0.0.9:8081", &shared, 0)));
    assert!(
        !key.contains("10.0.0.5") && !key.contains("rules[3]"),
        "{key}"
    );
    assert!(key.contains("rules[]: unknown field `cors`"), "{key}");
    // The plane and the reason are the refusal's own.
    assert_ne!(key, refusal_key(&refusal("10.0.0.5:8081", &edge(), 3)));
    assert_ne!(
        key,
        refusal_key(&refusal("10.0.0.5:8081", &shared, 3).replace("cors", "mirror"))
    );
}

/// What an earlier leader told the route's parent, `said` joined as a condition's message.
fn told_before(told: &mut RefusalsTold, generation: i64, said: &[String]) {
    let (shared, edge) = (PlaneKey::Shared, edge());
    told.inherit(
        ROUTE,
        vec![ToldBefore::new(
            parent(),
            Some(generation),
            said.join(REFUSALS_JOINED),
            &[&shared, &edge],
            Some(&shared),
        )],
    );
}

/// What an earlier leader told a route of two planes' refusals at once, in one message.
fn told_of_both(told: &mut RefusalsTold, generation: i64) {
    let (shared, edge) = (PlaneKey::Shared, edge());
    told_before(
        told,
        generation,
        &[
            refusal("10.0.0.5:8081", &shared, 1),
            refusal("10.0.1.5:8081", &edge, 2),
        ],
    );
}

/// A round every pod of `planes` answered.
fn all_answered(planes: &HashSet<PlaneKey>) -> RefusalAnswers {
    RefusalAnswers {
        heard: planes.clone(),
        known: planes.clone(),
    }
}

/// A round some pods of `planes` answered, others failing.
fn some_answered(planes: &HashSet<PlaneKey>) -> RefusalAnswers {
    RefusalAnswers {
        heard: planes.clone(),
        known: HashSet::new(),
    }
}

/// The planes [`RefusalsTold::untold`] tells of, this round: `refused` with every plane in
/// `answered` answering and none cut off.
fn untold(
    told: &mut RefusalsTold,
    refused: &[(PlaneKey, String)],
    answered: &[&PlaneKey],
    generation: i64,
) -> Vec<PlaneKey> {
    let answered = answered.iter().map(|&p| p.clone()).collect();
    told.untold(ROUTE, refused, &all_answered(&answered), Some(generation))
        .into_iter()
        .map(|untold| untold.plane)
        .collect()
}

/// Tells the route what [`RefusalsTold::untold`] says to, as the report does once each
/// Event is taken.
fn tell(
    told: &mut RefusalsTold,
    refused: &[(PlaneKey, String)],
    answered: &[&PlaneKey],
    cut_off: &[&PlaneKey],
) -> Vec<PlaneKey> {
    let known = answered
        .iter()
        .filter(|p| !cut_off.contains(p))
        .map(|&p| p.clone())
        .collect();
    let untold = told.untold(ROUTE, refused, &all_answered(&known), Some(4));
    untold
        .into_iter()
        .map(|Untold { plane, keys, .. }| {
            told.took(ROUTE, &plane, keys);
            plane
        })
        .collect()
}

#[test]
fn an_earlier_leaders_word_on_two_planes_is_taken_as_each_plane_answers() {
    let (shared, edge) = (PlaneKey::Shared, edge());
    let mut told = RefusalsTold::default();
    told_of_both(&mut told, 4);
    assert!(told.inherited(ROUTE, &parent(), Some(4)).is_some());
    // The shared plane answers first, refusing what was told (found through another pod):
    // told already, and the edge plane's part stands.
    let now = refusal("10.0.0.7:8081", &shared, 0);
    let refused = [(shared.clone(), now.clone())];
    assert_eq!(untold(&mut told, &refused, &[&shared], 4), []);
    assert!(told.inherited(ROUTE, &parent(), Some(4)).is_some());
    // A round later the edge plane answers with its refusal: told already too.
    let now_edge = refusal("10.0.1.5:8081", &edge, 0);
    let refused = [(shared.clone(), now), (edge.clone(), now_edge)];
    assert_eq!(untold(&mut told, &refused, &[&shared, &edge], 4), []);
    // Every plane it named has answered: the word is used up.
    assert!(told.inherited(ROUTE, &parent(), Some(4)).is_none());
}

#[test]
fn an_earlier_leaders_word_is_not_taken_for_another_generation() {
    let shared = PlaneKey::Shared;
    let mut told = RefusalsTold::default();
    told_of_both(&mut told, 4);
    assert!(told.inherited(ROUTE, &parent(), Some(5)).is_none());
    let other = translate::ParentRef {
        name: "private".to_owned(),
        ..parent()
    };
    assert!(told.inherited(ROUTE, &other, Some(4)).is_none());
    let now = refusal("10.0.0.5:8081", &shared, 1);
    assert_eq!(
        untold(&mut told, &[(shared.clone(), now)], &[&shared], 5),
        [shared]
    );
}

#[test]
fn a_plane_that_takes_the_rule_again_has_its_refusal_told_anew_later() {
    let (shared, edge) = (PlaneKey::Shared, edge());
    let mut told = RefusalsTold::default();
    told_of_both(&mut told, 4);
    // The shared plane's pods answer this process's push refusing nothing (upgraded); the
    // edge plane's have not answered.
    assert_eq!(tell(&mut told, &[], &[&shared], &[]), []);
    // Rolled back, at the same generation: a refusal to tell.
    let again = (shared.clone(), refusal("10.0.0.5:8081", &shared, 1));
    assert_eq!(
        tell(&mut told, std::slice::from_ref(&again), &[&shared], &[]),
        vec![PlaneKey::Shared]
    );
    // The edge plane's part, not answered yet, still stands.
    let edge_says = (edge.clone(), refusal("10.0.1.5:8081", &edge, 2));
    let both = [again, edge_says];
    assert_eq!(tell(&mut told, &both, &[&shared, &edge], &[]), []);
    // Told once by this process: not again while it stands.
    assert_eq!(tell(&mut told, &both, &[&shared, &edge], &[]), []);
}

/// The refusals of the route's rules 0 to `rules` by the shared plane's pod.
fn refusals(rules: usize) -> Vec<(PlaneKey, String)> {
    let shared = PlaneKey::Shared;
    (0..rules)
        .map(|rule| {
            (
                shared.clone(),
                refusal_of(rule, "10.0.0.5:8081", &shared, rule),
            )
        })
        .collect()
}

/// A round that stops leaving rules out at its last pass has found some of the route's
/// refusals (seven of ten here): it tells nothing, and leaves an earlier leader's word on all
/// ten for the round that finds them all.
#[test]
fn a_round_cut_off_tells_nothing_and_leaves_an_earlier_leaders_word() {
    let shared = PlaneKey::Shared;
    let all = refusals(10);
    let said: Vec<String> = all.iter().map(|(_, said)| said.clone()).collect();
    let mut told = RefusalsTold::default();
    told_before(&mut told, 4, &said);
    assert_eq!(tell(&mut told, &all[..7], &[], &[&shared]), []);
    assert!(told.inherited(ROUTE, &parent(), Some(4)).is_some());
    assert_eq!(tell(&mut told, &all, &[&shared], &[]), []);
    // Without an earlier leader's word: one Event, for all ten, once they are found; and a
    // later round cut off (its pods replaced) neither tells again nor forgets.
    let mut told = RefusalsTold::default();
    assert_eq!(tell(&mut told, &all[..7], &[], &[&shared]), []);
    assert_eq!(
        tell(&mut told, &all, &[&shared], &[]),
        vec![PlaneKey::Shared]
    );
    assert_eq!(tell(&mut told, &all[..7], &[&shared], &[&shared]), []);
    assert_eq!(tell(&mut told, &all, &[&shared], &[]), []);
}

/// An earlier leader's word is taken for exactly the refusals it told: not for more, fewer,
/// or a reason it said otherwise (one of which another is the start).
#[test]
fn an_earlier_leaders_word_is_taken_for_what_it_told_and_no_other() {
    let shared = PlaneKey::Shared;
    let all = refusals(2);
    let said: Vec<String> = all.iter().map(|(_, said)| said.clone()).collect();
    let longer: Vec<(PlaneKey, String)> = all
        .iter()
        .map(|(plane, said)| (plane.clone(), format!("{said}, expected one of `mirror`")))
        .collect();
    for now in [&all[..1], &refusals(3)[..], &longer[..]] {
        let mut told = RefusalsTold::default();
        told_before(&mut told, 4, &said);
        assert_eq!(
            tell(&mut told, now, &[&shared], &[]),
            vec![PlaneKey::Shared],
            "{now:?}"
        );
    }
    // A shorter reason, of which the one told is the start.
    let mut told = RefusalsTold::default();
    let said: Vec<String> = longer.iter().map(|(_, said)| said.clone()).collect();
    told_before(&mut told, 4, &said);
    assert_eq!(
        tell(&mut told, &all, &[&shared], &[]),
        vec![PlaneKey::Shared]
    );
    let mut told = RefusalsTold::default();
    told_before(&mut told, 4, &said);
    assert_eq!(tell(&mut told, &longer, &[&shared], &[]), []);
}

/// A condition's message is split where one of its refusals opens, not at every `; `: a
/// reason (the note of a document too large) may hold one.
#[test]
fn a_told_message_is_split_where_its_refusals_open() {
    let shared = PlaneKey::Shared;
    let too_large = format!(
        "proxy pod 10.0.0.5:8081 of the {shared} plane refused rule tenant/cors/1, which is left \
         out (the route's other rules are served): PUT /config: 413: the plane's document is \
         larger than its pods take; rules they do not serve yet go first, then the largest, \
         until it fits"
    );
    let no_room = format!(
        "the {shared} {NO_ROOM} rule tenant/cors/2, which is left out (the route's other rules \
         are served): rules[2].matches[0].path: the document's regexes take too much"
    );
    let first = refusal("10.0.0.5:8081", &shared, 0);
    let message = [first.as_str(), &too_large, &no_room].join(REFUSALS_JOINED);
    let planes = [&shared, &edge()];
    assert_eq!(
        refusals_said(&message, &planes),
        [first.as_str(), &too_large, &no_room]
    );
    let now = [
        (shared.clone(), first),
        (shared.clone(), too_large),
        (shared.clone(), no_room),
    ];
    let mut told = RefusalsTold::default();
    told_before(&mut told, 4, &[message]);
    assert_eq!(tell(&mut told, &now, &[&shared], &[]), []);
}

/// A dedicated plane's name has a space in it (`gateway tenant/edge`): a rule left out for
/// want of room there still opens a refusal of its own, and an earlier leader's word on it is
/// taken as it stands.
#[test]
fn a_told_message_is_split_where_a_dedicated_planes_refusal_opens() {
    let edge = edge();
    let first = refusal("10.0.1.5:8081", &edge, 0);
    let no_room = format!(
        "the {edge} {NO_ROOM} rule tenant/cors/2, which is left out (the route's other rules \
         are served): rules[2].matches[0].path: the document's regexes take too much"
    );
    let message = [first.as_str(), &no_room].join(REFUSALS_JOINED);
    assert_eq!(
        refusals_said(&message, &[&PlaneKey::Shared, &edge]),
        [first.as_str(), &no_room]
    );
    let now = [(edge.clone(), first), (edge.clone(), no_room)];
    let mut told = RefusalsTold::default();
    told_before(&mut told, 4, &[message]);
    assert_eq!(tell(&mut told, &now, &[&edge], &[]), []);
}

/// Before a plane's pods answer a new leader's pushes, what it finds without them (a rule left
/// out for want of room) is only part of what they refuse: nothing is told, and the earlier
/// leader's word on the plane stands until they answer.
#[test]
fn a_plane_not_answered_yet_tells_nothing_and_leaves_an_earlier_leaders_word() {
    let shared = PlaneKey::Shared;
    let by_pod = refusal("10.0.0.5:8081", &shared, 0);
    let no_room = format!(
        "the {shared} {NO_ROOM} rule tenant/cors/2, which is left out (the route's other rules \
         are served): rules[2].matches[0].path: the document's regexes take too much"
    );
    let mut told = RefusalsTold::default();
    told_before(&mut told, 4, &[by_pod.clone(), no_room.clone()]);
    let found = [(shared.clone(), no_room.clone())];
    assert_eq!(tell(&mut told, &found, &[], &[]), []);
    assert!(told.inherited(ROUTE, &parent(), Some(4)).is_some());
    let answered = [(shared.clone(), by_pod), (shared.clone(), no_room)];
    assert_eq!(tell(&mut told, &answered, &[&shared], &[]), []);
    assert!(told.inherited(ROUTE, &parent(), Some(4)).is_none());
}

/// A route with parents on two planes, only one of whose pods refuse a rule of it: the parent
/// the other plane serves is told nothing, and the refusing plane's parent (and Event) is told
/// only that plane's refusals.
#[test]
fn a_parent_is_told_only_what_the_plane_serving_it_refuses() {
    let (shared, edge) = (PlaneKey::Shared, edge());
    let on_edge = refusal_of(1, "10.0.1.5:8081", &edge, 1);
    let refused = [(edge.clone(), on_edge.clone())];
    assert_eq!(refusals_of(&refused, &[&shared]), None);
    assert_eq!(refusals_of(&refused, &[&edge]), Some(on_edge.clone()));
    let on_shared = refusal("10.0.0.5:8081", &shared, 0);
    let refused = [(shared.clone(), on_shared.clone()), (edge.clone(), on_edge)];
    assert_eq!(refusals_of(&refused, &[&shared]), Some(on_shared));
}

/// A plane with one pod listed, on `tunnel`.
fn plane_on(tunnel: Option<&TunnelIdentity>) -> PlaneInfo {
    PlaneInfo {
        address: String::new(),
        ready: true,
        token: String::new(),
        pods: vec!["10.0.0.5:8081".parse().expect("an address")],
        not_serving: Vec::new(),
        service: ObjectKey::new("cftunnel", "pool"),
        tunnel: None,
        identity: tunnel.cloned(),
        kept: false,
    }
}

/// A route whose only parent is a Gateway with a plane of its own on the class tunnel: the
/// shared pool there is given the route too and serves a share of its requests, so what the
/// pool's pods refuse of it shows on the parent, beside the Gateway's own plane's refusals.
#[test]
fn a_parent_is_told_what_the_planes_on_its_tunnel_refuse() {
    let (shared, edge) = (PlaneKey::Shared, edge());
    let class = TunnelIdentity::of(&cftunnel_config::Token::new(
        "account",
        b"secret".to_vec(),
        "6f2b8c1e-4d0a-4c3b-9a57-1e2d3c4b5a69"
            .parse()
            .expect("uuid"),
    ));
    let other = TunnelIdentity::of(&cftunnel_config::Token::new(
        "account",
        b"secret".to_vec(),
        "0b1c2d3e-4f50-4617-8899-aabbccddeeff"
            .parse()
            .expect("uuid"),
    ));
    let planes: BTreeMap<PlaneKey, PlaneInfo> = [
        (shared.clone(), plane_on(Some(&class))),
        (edge.clone(), plane_on(Some(&class))),
    ]
    .into();
    let by_pool = refusal("10.0.0.5:8081", &shared, 0);
    let refused = [(shared.clone(), by_pool.clone())];
    let serving = planes_serving(&edge, &planes, &HashMap::new());
    assert_eq!(serving, [&edge, &shared]);
    assert_eq!(refusals_of(&refused, &serving), Some(by_pool.clone()));
    let by_edge = refusal_of(1, "10.0.1.5:8081", &edge, 1);
    let both = [(shared.clone(), by_pool), (edge.clone(), by_edge)];
    let said = refusals_of(&both, &serving).expect("both told");
    assert_eq!(refusals_said(&said, &[&shared, &edge]).len(), 2, "{said}");
    // On another tunnel, the pool serves none of the Gateway's routes.
    let apart: BTreeMap<PlaneKey, PlaneInfo> = [
        (shared.clone(), plane_on(Some(&other))),
        (edge.clone(), plane_on(Some(&class))),
    ]
    .into();
    let serving = planes_serving(&edge, &apart, &HashMap::new());
    assert_eq!(serving, [&edge]);
    assert_eq!(refusals_of(&refused, &serving), None);
}

/// What was told of a plane goes with it (its Gateway deleted, the route staying): a plane of
/// the same name later refusing the same rule is told it.
#[test]
fn what_a_plane_was_told_goes_with_the_plane() {
    let (shared, edge) = (PlaneKey::Shared, edge());
    let refused = [(edge.clone(), refusal("10.0.1.5:8081", &edge, 0))];
    let mut told = RefusalsTold::default();
    assert_eq!(tell(&mut told, &refused, &[&edge], &[]), vec![edge.clone()]);
    told.retain_planes(|plane| *plane == shared);
    assert!(told.routes.is_empty(), "nothing kept of the route");
    assert_eq!(tell(&mut told, &refused, &[&edge], &[]), [edge]);
}

/// A round some of a plane's pods answer (another failing): what they refuse is told, and
/// nothing is taken back; the round every pod answers tells nothing more of it.
#[test]
fn a_plane_some_of_whose_pods_answer_tells_what_they_refuse_and_takes_nothing_back() {
    let shared = PlaneKey::Shared;
    let mut told = RefusalsTold::default();
    let heard = HashSet::from([shared.clone()]);
    let said = refusal("10.0.0.5:8081", &shared, 1);
    let refused = [(shared.clone(), said)];
    let untold = told.untold(ROUTE, &refused, &some_answered(&heard), Some(4));
    assert_eq!(untold.len(), 1, "told though another pod fails");
    for Untold { plane, keys, .. } in untold {
        told.took(ROUTE, &plane, keys);
    }
    // The pod that refused does not answer this round, the other does: nothing taken back.
    assert!(told
        .untold(ROUTE, &[], &some_answered(&heard), Some(4))
        .is_empty());
    let all = HashSet::from([shared.clone()]);
    assert!(
        told.untold(ROUTE, &refused, &all_answered(&all), Some(4))
            .is_empty(),
        "told once"
    );
}

/// What an earlier leader told of a plane waits for all its pods: what some of them refuse
/// may be part of it.
#[test]
fn an_earlier_leaders_word_waits_for_every_pod_of_the_plane() {
    let shared = PlaneKey::Shared;
    let mut told = RefusalsTold::default();
    let word = [
        refusal("10.0.0.5:8081", &shared, 1),
        refusal_of(1, "10.0.0.5:8081", &shared, 2),
    ];
    told_before(&mut told, 4, &word);
    let heard = HashSet::from([shared.clone()]);
    // Some pods answer, saying part of what was told (the rest, failing, may say the rest).
    let part = [(shared.clone(), word[0].clone())];
    assert!(told
        .untold(ROUTE, &part, &some_answered(&heard), Some(4))
        .is_empty());
    assert!(
        told.inherited(ROUTE, &parent(), Some(4)).is_some(),
        "the word holds"
    );
    let refused = word.map(|said| (shared.clone(), said));
    assert!(
        told.untold(ROUTE, &refused, &all_answered(&heard), Some(4))
            .is_empty(),
        "the earlier leader's word still there, and taken"
    );
}

/// A round some pods answer, finding part of what was told, takes nothing back and tells
/// nothing; one finding more tells it beside what was told.
#[test]
fn a_round_some_pods_answer_tells_only_what_is_beyond_what_was_told() {
    let shared = PlaneKey::Shared;
    let all = HashSet::from([shared.clone()]);
    let first = refusal("10.0.0.5:8081", &shared, 1);
    let second = first.replace("cors", "mirror");
    let third = first.replace("cors", "teleport");
    let both = [(shared.clone(), first.clone()), (shared.clone(), second)];
    let mut told = RefusalsTold::default();
    for Untold { plane, keys, .. } in told.untold(ROUTE, &both, &all_answered(&all), Some(4)) {
        told.took(ROUTE, &plane, keys);
    }
    let part = [(shared.clone(), first.clone())];
    assert!(told
        .untold(ROUTE, &part, &some_answered(&all), Some(4))
        .is_empty());
    assert!(
        told.untold(ROUTE, &both, &all_answered(&all), Some(4))
            .is_empty(),
        "nothing taken back"
    );
    let more = [(shared.clone(), first), (shared.clone(), third)];
    let untold = told.untold(ROUTE, &more, &some_answered(&all), Some(4));
    assert_eq!(untold.len(), 1);
    assert_eq!(
        untold[0].keys.len(),
        3,
        "told beside what was told: {untold:?}"
    );
}

/// What an earlier leader told of the route at another generation holds back nothing.
#[test]
fn an_earlier_leaders_word_of_another_generation_holds_back_no_event() {
    let shared = PlaneKey::Shared;
    let mut told = RefusalsTold::default();
    told_of_both(&mut told, 4);
    let heard = HashSet::from([shared.clone()]);
    let said = refusal("10.0.0.5:8081", &shared, 1);
    let untold = told.untold(ROUTE, &[(shared, said)], &some_answered(&heard), Some(5));
    assert_eq!(untold.len(), 1, "{untold:?}");
}

/// After failover, some of a plane's pods refusing more than an earlier leader told of the
/// route as it is: told once, beside the word (kept as told, though the pod that refused it
/// does not answer), which no longer holds the condition; the round every pod answers with the
/// two tells nothing more.
#[test]
fn some_pods_refusing_beyond_an_earlier_leaders_word_are_told_beside_it() {
    let shared = PlaneKey::Shared;
    let mut told = RefusalsTold::default();
    let first = refusal("10.0.0.5:8081", &shared, 1);
    let second = refusal_of(1, "10.0.0.6:8081", &shared, 2);
    told_before(&mut told, 4, std::slice::from_ref(&first));
    assert!(told.inherited(ROUTE, &parent(), Some(4)).is_some());
    let heard = HashSet::from([shared.clone()]);
    let only_second = [(shared.clone(), second.clone())];
    let untold = told.untold(ROUTE, &only_second, &some_answered(&heard), Some(4));
    assert_eq!(untold.len(), 1, "{untold:?}");
    assert_eq!(untold[0].keys.len(), 2, "told beside the word: {untold:?}");
    assert_eq!(
        untold[0].before.as_ref().map(BTreeSet::len),
        Some(1),
        "the word, told before"
    );
    for Untold { plane, keys, .. } in untold {
        told.took(ROUTE, &plane, keys);
    }
    assert!(
        told.inherited(ROUTE, &parent(), Some(4)).is_none(),
        "the condition says what this process heard"
    );
    let both = [(shared.clone(), first), (shared.clone(), second)];
    assert!(told
        .untold(ROUTE, &both, &all_answered(&heard), Some(4))
        .is_empty());
}

/// A word naming two planes, one of whose pods some refuse more than it told: the whole word
/// counts as told, and stops holding the condition; the other plane refusing what the word
/// said of it tells nothing.
#[test]
fn a_word_on_two_planes_goes_whole_once_one_refuses_more() {
    let (shared, edge) = (PlaneKey::Shared, edge());
    let mut told = RefusalsTold::default();
    told_of_both(&mut told, 4);
    let more = [
        (shared.clone(), refusal("10.0.0.5:8081", &shared, 1)),
        (shared.clone(), refusal_of(1, "10.0.0.5:8081", &shared, 2)),
    ];
    let heard = HashSet::from([shared.clone()]);
    let untold = told.untold(ROUTE, &more, &some_answered(&heard), Some(4));
    assert_eq!(untold.len(), 1, "{untold:?}");
    assert!(told.inherited(ROUTE, &parent(), Some(4)).is_none());
    let on_edge = [(edge.clone(), refusal("10.0.1.5:8081", &edge, 2))];
    let edge_answered = HashSet::from([edge.clone()]);
    assert!(told
        .untold(ROUTE, &on_edge, &all_answered(&edge_answered), Some(4))
        .is_empty());
}

/// An Event that does not go out puts back what was told before it: the part told earlier is
/// not told again, the part it carried is. Two Events of one plane undone newest first (as
/// the report undoes them) leave what was told before both.
#[test]
fn an_event_not_sent_leaves_what_was_told_before_it() {
    let shared = PlaneKey::Shared;
    let all = HashSet::from([shared.clone()]);
    let first = (shared.clone(), refusal("10.0.0.5:8081", &shared, 1));
    let second = (shared.clone(), refusal_of(1, "10.0.0.5:8081", &shared, 2));
    let both = [first.clone(), second];
    let tell = |told: &mut RefusalsTold, refused: &[(PlaneKey, String)], answers| {
        let mut untold = told.untold(ROUTE, refused, &answers, Some(4));
        assert_eq!(untold.len(), 1, "{untold:?}");
        let untold = untold.remove(0);
        told.took(ROUTE, &untold.plane, untold.keys.clone());
        untold
    };
    let mut told = RefusalsTold::default();
    let one = tell(&mut told, std::slice::from_ref(&first), all_answered(&all));
    assert_eq!(one.before, None);
    let two = tell(&mut told, &both, some_answered(&all));
    told.untell(ROUTE, &two.plane, &two.keys, two.before);
    assert!(
        told.untold(
            ROUTE,
            std::slice::from_ref(&first),
            &all_answered(&all),
            Some(4)
        )
        .is_empty(),
        "what was told before stands"
    );
    assert_eq!(
        told.untold(ROUTE, &both, &all_answered(&all), Some(4))
            .len(),
        1,
        "what the Event carried is told again"
    );
    // Both Events undone, newest first.
    let mut told = RefusalsTold::default();
    let one = tell(&mut told, std::slice::from_ref(&first), all_answered(&all));
    let two = tell(&mut told, &both, some_answered(&all));
    told.untell(ROUTE, &two.plane, &two.keys, two.before);
    told.untell(ROUTE, &one.plane, &one.keys, one.before);
    assert_eq!(
        told.untold(
            ROUTE,
            std::slice::from_ref(&first),
            &all_answered(&all),
            Some(4)
        )
        .len(),
        1,
        "nothing was told"
    );
}

/// A plane all of whose pods answer with other than an earlier leader's word, its Event not
/// sent: the word stays told (the record takes it in), so some pods refusing what it said later
/// tell nothing; the Event's own refusal is told again.
#[test]
fn an_event_not_sent_keeps_an_earlier_leaders_word_told() {
    let shared = PlaneKey::Shared;
    let all = HashSet::from([shared.clone()]);
    let word = refusal("10.0.0.5:8081", &shared, 1);
    let other = (shared.clone(), refusal_of(1, "10.0.0.5:8081", &shared, 2));
    for dropped_later in [false, true] {
        let mut told = RefusalsTold::default();
        told_before(&mut told, 4, std::slice::from_ref(&word));
        let mut untold = told.untold(
            ROUTE,
            std::slice::from_ref(&other),
            &all_answered(&all),
            Some(4),
        );
        assert_eq!(untold.len(), 1, "{untold:?}");
        let Untold {
            plane,
            keys,
            before,
        } = untold.remove(0);
        assert_eq!(before.as_ref().map(BTreeSet::len), Some(1), "the word");
        if dropped_later {
            told.took(ROUTE, &plane, keys.clone());
            told.untell(ROUTE, &plane, &keys, before);
        } else if let Some(before) = before {
            // Refused for want of room.
            told.took(ROUTE, &plane, before);
        }
        let said = [(shared.clone(), word.clone())];
        assert!(
            told.untold(ROUTE, &said, &some_answered(&all), Some(4))
                .is_empty(),
            "the word stays told"
        );
        assert_eq!(
            told.untold(
                ROUTE,
                std::slice::from_ref(&other),
                &all_answered(&all),
                Some(4)
            )
            .len(),
            1,
            "the refusal the Event carried is told again"
        );
    }
}
