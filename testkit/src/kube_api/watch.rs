//! Watches: the writes after the request's `resourceVersion`, then live ones, as
//! newline-delimited JSON events, until `timeoutSeconds` (60 by default) or the client goes.
//! A label-selected watch sees an object that stops (starts) matching as DELETED (ADDED), as
//! from the API server's watch cache. As on a real API server, a watch of a version no longer
//! served ends once the CRDs change (and watching it again is 404).
//!
//! A watch from resourceVersion 0 (or none) starts with the selected objects as they are, as
//! ADDED, then sends what comes after, as a real server does.
//!
//! Simplifications: watches never expire (no 410 Gone) and send no bookmarks.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::Response;
use serde_json::{json, Value};

use super::cluster::Cluster;
use super::partial_metadata::{as_partial_metadata, wants_metadata};
use super::request::Req;
use super::response::Reply;
use super::selector::Selection;
use super::served::serves;
use super::store::{Entry, Event};

/// How a watch that selects what `selects` does sees a write: the event it is sent as, with the
/// object; `None` when the watch does not see it.
fn seen(entry: &Entry, selects: impl Fn(&Value) -> bool) -> Option<(Event, Value)> {
    // As the API server's watch cache: a modification that moves an object out of (into) the
    // selection is its deletion (addition).
    let now = selects(&entry.object);
    let before = entry.previous.as_ref().map(&selects);
    let event = match (entry.event, before, now) {
        (Event::Added | Event::Deleted, _, true) => entry.event,
        (Event::Modified, Some(false), true) => Event::Added,
        (Event::Modified, _, true) => Event::Modified,
        (Event::Modified, Some(true), false) => Event::Deleted,
        _ => return None,
    };
    // An object leaving the selection is sent as it was in it.
    let object = match (event, &entry.previous) {
        (Event::Deleted, Some(previous)) if entry.event == Event::Modified => previous.clone(),
        _ => entry.object.clone(),
    };
    Some((event, object))
}

/// The watch's stream, started.
pub(super) fn watch(cluster: &Arc<Cluster>, req: &Req<'_>) -> Reply {
    let since: u64 = req
        .params
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = req
        .params
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(60u64);
    let selection = Selection::of(req.params);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    let cluster = Arc::clone(cluster);
    let group = req.target.group.clone();
    let plural = req.target.plural.clone();
    let namespace = req.target.namespace.clone();
    let api_version = req.api_version.to_owned();
    let version = req.target.version.clone();
    let kind = req.kind;
    let metadata_only = wants_metadata(req.accept, false);
    tokio::spawn(async move {
        let mut changed = cluster.subscribe();
        let mut sent = since;
        // Without a resourceVersion to start from, the selected objects as they are come first.
        let mut initial: Vec<(Event, Value, u64)> = Vec::new();
        if since == 0 {
            let store = cluster.lock();
            initial = store
                .objects()
                .filter(|((g, p, ns, _), v)| {
                    *g == group
                        && *p == plural
                        && namespace.as_ref().is_none_or(|n| n == ns)
                        && selection.selects(v)
                })
                .map(|(_, v)| {
                    let rv = v
                        .pointer("/metadata/resourceVersion")
                        .and_then(Value::as_str)
                        .and_then(|rv| rv.parse().ok())
                        .unwrap_or(0);
                    (Event::Added, v.clone(), rv)
                })
                .collect();
            sent = store.resource_version();
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
        loop {
            // Marked seen before the log is read: a write after the read wakes the loop again.
            changed.borrow_and_update();
            // The version is no longer served (the CRDs changed): the watch ends.
            if !serves(&cluster.crds(), &group, &version, &plural) {
                return;
            }
            let (events, latest): (Vec<String>, u64) = {
                let store = cluster.lock();
                let logged = store
                    .writes_since(sent)
                    .filter(|e| {
                        e.group == group
                            && e.plural == plural
                            && namespace.as_ref().is_none_or(|n| *n == e.namespace)
                    })
                    .filter_map(|e| {
                        let (event, object) = seen(e, |o| selection.selects(o))?;
                        Some((event, object, e.rv))
                    });
                let events = std::mem::take(&mut initial)
                    .into_iter()
                    .chain(logged)
                    .map(|(event, mut object, rv)| {
                        if let Some(meta) =
                            object.get_mut("metadata").and_then(Value::as_object_mut)
                        {
                            meta.insert("resourceVersion".into(), rv.to_string().into());
                        }
                        if metadata_only {
                            object = as_partial_metadata(&object);
                        } else if let Some(o) = object.as_object_mut() {
                            o.insert("apiVersion".into(), api_version.clone().into());
                            o.insert("kind".into(), kind.into());
                        }
                        format!("{}\n", json!({"type": event.as_str(), "object": object}))
                    })
                    .collect();
                (events, store.resource_version())
            };
            for line in events {
                if tx.send(Ok(Frame::data(Bytes::from(line)))).await.is_err() {
                    return;
                }
            }
            sent = latest;
            tokio::select! {
                r = changed.changed() => if r.is_err() { return },
                () = tokio::time::sleep_until(deadline) => return,
                () = tx.closed() => return,
            }
        }
    });
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut res = Response::new(BodyExt::boxed(body));
    res.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::super::selector::selects;
    use super::*;

    fn labelled(app: &str, generation: u64) -> Value {
        json!({"metadata": {"name": "a", "labels": {"app": app}, "generation": generation}})
    }

    fn entry(event: Event, object: Value, previous: Option<Value>) -> Entry {
        Entry {
            rv: 1,
            group: String::new(),
            plural: "services".to_owned(),
            namespace: "ns".to_owned(),
            event,
            object,
            previous,
        }
    }

    #[test]
    fn an_unselected_watch_sees_every_write_as_it_was() {
        let added = entry(Event::Added, labelled("web", 1), None);
        assert_eq!(
            seen(&added, |_| true),
            Some((Event::Added, labelled("web", 1)))
        );
        let modified = entry(
            Event::Modified,
            labelled("api", 2),
            Some(labelled("web", 1)),
        );
        assert_eq!(
            seen(&modified, |_| true),
            Some((Event::Modified, labelled("api", 2)))
        );
        let deleted = entry(Event::Deleted, labelled("web", 1), None);
        assert_eq!(
            seen(&deleted, |_| true),
            Some((Event::Deleted, labelled("web", 1)))
        );
    }

    #[test]
    fn an_object_leaving_the_selection_is_deleted_as_it_was_in_it() {
        let left = entry(
            Event::Modified,
            labelled("api", 2),
            Some(labelled("web", 1)),
        );
        assert_eq!(
            seen(&left, |o| selects("app=web", o)),
            Some((Event::Deleted, labelled("web", 1)))
        );
    }

    #[test]
    fn an_object_entering_the_selection_is_added() {
        let entered = entry(
            Event::Modified,
            labelled("web", 2),
            Some(labelled("api", 1)),
        );
        assert_eq!(
            seen(&entered, |o| selects("app=web", o)),
            Some((Event::Added, labelled("web", 2)))
        );
    }

    #[test]
    fn writes_outside_the_selection_are_not_seen() {
        let selector = "app=web";
        let added = entry(Event::Added, labelled("api", 1), None);
        assert_eq!(seen(&added, |o| selects(selector, o)), None);
        let modified = entry(
            Event::Modified,
            labelled("api", 2),
            Some(labelled("api", 1)),
        );
        assert_eq!(seen(&modified, |o| selects(selector, o)), None);
        let deleted = entry(Event::Deleted, labelled("api", 1), None);
        assert_eq!(seen(&deleted, |o| selects(selector, o)), None);
        let stayed = entry(
            Event::Modified,
            labelled("web", 2),
            Some(labelled("web", 1)),
        );
        assert_eq!(
            seen(&stayed, |o| selects(selector, o)),
            Some((Event::Modified, labelled("web", 2)))
        );
    }
}
