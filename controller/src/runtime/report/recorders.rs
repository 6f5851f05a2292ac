//! How Events are published: kube's recorder, one per object and reason, kept while the note
//! stays the same.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use kube::runtime::events::{Recorder, Reporter};

/// How long after one Event the next saying the same about the same object is folded into it
/// (a series): kube's recorder keeps an Event that long after it was last seen.
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// The recorders Events are published through: one per object and reason, replaced when the
/// note changes. kube's recorder folds an Event into an earlier one of the same reason about
/// the same object (a series, counted), keeping the earlier note: one shared by every Event
/// would show a changed message, or a second plane's refusal, as the first's. One kept while
/// the note stays folds an Event sent again as it was (a push failure back, a drift applied
/// again), which would otherwise be an object more each time.
pub(in crate::runtime) struct Recorders {
    client: kube::Client,
    reporter: Reporter,
    said: Arc<std::sync::Mutex<Said>>,
}

/// What [`Recorders`] holds, by the Event's object and reason.
#[derive(Default)]
struct Said {
    by_subject: HashMap<(String, String), LastSaid>,
    /// Recorders made so far: each one's number.
    made: u64,
}

/// The last Event of a reason about one object.
struct LastSaid {
    note: String,
    recorder: Recorder,
    /// Its recorder's number.
    made: u64,
    used: std::time::Instant,
}

/// Replaces the recorder an Event went through, should the Event it folds into be gone
/// (deleted): kube's recorder would add to it, in vain, until it forgot it.
pub(in crate::runtime) struct Renew {
    said: Arc<std::sync::Mutex<Said>>,
    subject: (String, String),
    made: u64,
    client: kube::Client,
    reporter: Reporter,
}

impl Renew {
    /// A recorder with nothing folded into it, held in place of the one handed out (unless
    /// another has taken its place since) so that the Events after fold into the new one.
    pub(super) fn renew(&self) -> Recorder {
        let fresh = Recorder::new(self.client.clone(), self.reporter.clone());
        let mut said = self.said.lock().unwrap_or_else(PoisonError::into_inner);
        let made = said.made + 1;
        if let Some(last) = said.by_subject.get_mut(&self.subject) {
            if last.made == self.made {
                last.recorder = fresh.clone();
                last.made = made;
                said.made = made;
            }
        }
        fresh
    }
}

impl Recorders {
    pub(in crate::runtime) fn new(client: kube::Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            said: Arc::default(),
        }
    }

    /// The recorder of an Event of `reason` saying `note` about `of`, and how to replace it.
    pub(super) fn of(&self, of: &str, reason: &str, note: &str) -> (Recorder, Renew) {
        self.of_at(std::time::Instant::now(), of, reason, note)
    }

    fn of_at(
        &self,
        now: std::time::Instant,
        of: &str,
        reason: &str,
        note: &str,
    ) -> (Recorder, Renew) {
        let mut said = self.said.lock().unwrap_or_else(PoisonError::into_inner);
        said.by_subject
            .retain(|_, last| now.saturating_duration_since(last.used) < SERIES_WINDOW);
        let subject = (of.to_owned(), reason.to_owned());
        let renew = |made| Renew {
            said: Arc::clone(&self.said),
            subject: subject.clone(),
            made,
            client: self.client.clone(),
            reporter: self.reporter.clone(),
        };
        if let Some(last) = said.by_subject.get_mut(&subject) {
            if last.note == note {
                last.used = now;
                return (last.recorder.clone(), renew(last.made));
            }
        }
        said.made += 1;
        let made = said.made;
        let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
        let last = LastSaid {
            note: note.to_owned(),
            recorder: recorder.clone(),
            made,
            used: now,
        };
        said.by_subject.insert(subject.clone(), last);
        (recorder, renew(made))
    }

    /// The number of the recorder held for `reason` about `of`, if one is.
    #[cfg(test)]
    fn held(&self, of: &str, reason: &str) -> Option<u64> {
        let said = self.said.lock().unwrap_or_else(PoisonError::into_inner);
        let subject = (of.to_owned(), reason.to_owned());
        said.by_subject.get(&subject).map(|last| last.made)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Event saying what the last of its reason about the same object said shares its recorder
    /// (kube's folds them into a series); one saying something else gets a new one, which the next
    /// saying that shares; the series window counts from the last use.
    #[tokio::test]
    async fn events_share_a_recorder_only_with_the_last_saying_the_same() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        let client = kube::Client::try_from(config).expect("a client");
        let recorders = Recorders::new(client, "cftunnel".into());
        let start = std::time::Instant::now();
        let (route, refused) = ("HTTPRoute tenant/cors", "ProxyRuleRefused");
        let at = |minutes: u64, note: &str| {
            let now = start + Duration::from_secs(minutes * 60);
            recorders.of_at(now, route, refused, note);
            recorders.held(route, refused)
        };
        let first = at(0, "rule 0");
        assert_eq!(at(5, "rule 0"), first, "the same again: one series");
        assert_eq!(at(10, "rule 0"), first, "counted from the last use");
        let other = at(10, "rule 1");
        assert_ne!(other, first, "another note: an Event of its own");
        let back = at(10, "rule 0");
        assert!(back != other && back != first, "and back: one more");
        // A recorder replaced (its Event deleted) is held in place of the one handed out, unless
        // another has taken its place since.
        let (_, renew) =
            recorders.of_at(start + Duration::from_secs(600), route, refused, "rule 0");
        renew.renew();
        let renewed = at(10, "rule 0");
        assert_ne!(renewed, back, "a new recorder in its place");
        assert_eq!(at(10, "rule 0"), renewed, "which those after share");
        let (_, stale) =
            recorders.of_at(start + Duration::from_secs(600), route, refused, "rule 0");
        let newer = at(10, "rule 2");
        stale.renew();
        assert_eq!(recorders.held(route, refused), newer, "a newer entry stays");
        // Another reason or object has its own.
        recorders.of_at(start, route, "RouteShadowed", "rule 0");
        assert!(recorders.held(route, "RouteShadowed").is_some());
        recorders.of_at(
            start + SERIES_WINDOW * 3,
            "HTTPRoute tenant/www",
            refused,
            "rule 0",
        );
        assert_eq!(
            recorders.held(route, refused),
            None,
            "unused past the window: let go"
        );
    }
}
