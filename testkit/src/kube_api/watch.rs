//! Watches: the writes after the request's `resourceVersion`, then live ones, as
//! newline-delimited JSON events, until `timeoutSeconds` (60 by default) or the client goes.
//! A label-selected watch sees an object that stops (starts) matching as DELETED (ADDED), as
//! from the API server's watch cache. As on a real API server, a watch of a version no longer
//! served ends once the CRDs change (and watching it again is 404).
//!
//! Simplifications: watches never expire (no 410 Gone) and send no bookmarks; a watch from
//! resourceVersion 0 (or none) replays every write since the start, where a real server
//! sends the objects as they are, as ADDED.

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
use super::selector::selects;
use super::served::serves;
use super::store::{Entry, Event};

/// How a watch with `selector` sees a write: the event it is sent as, with the object; `None`
/// when the watch does not see it.
fn seen(entry: &Entry, selector: &str) -> Option<(Event, Value)> {
    // As the API server's watch cache: a modification that moves an object out of (into) the
    // selection is its deletion (addition).
    let now = selects(selector, &entry.object);
    let before = entry.previous.as_ref().map(|p| selects(selector, p));
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
    let selector = req.params.get("labelSelector").cloned().unwrap_or_default();
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
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
        loop {
            // Marked seen before the log is read: a write after the read wakes the loop again.
            changed.borrow_and_update();
            // The version is no longer served (the CRDs changed): the watch ends.
            if !serves(cluster.crds(), &group, &version, &plural) {
                return;
            }
            let (events, latest): (Vec<String>, u64) = {
                let store = cluster.lock();
                let events = store
                    .writes_since(sent)
                    .filter(|e| {
                        e.group == group
                            && e.plural == plural
                            && namespace.as_ref().is_none_or(|n| *n == e.namespace)
                    })
                    .filter_map(|e| {
                        let (event, mut object) = seen(e, &selector)?;
                        if let Some(meta) =
                            object.get_mut("metadata").and_then(Value::as_object_mut)
                        {
                            meta.insert("resourceVersion".into(), e.rv.to_string().into());
                        }
                        if metadata_only {
                            object = as_partial_metadata(&object);
                        } else if let Some(o) = object.as_object_mut() {
                            o.insert("apiVersion".into(), api_version.clone().into());
                            o.insert("kind".into(), kind.into());
                        }
                        Some(format!(
                            "{}\n",
                            json!({"type": event.as_str(), "object": object})
                        ))
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
        assert_eq!(seen(&added, ""), Some((Event::Added, labelled("web", 1))));
        let modified = entry(
            Event::Modified,
            labelled("api", 2),
            Some(labelled("web", 1)),
        );
        assert_eq!(
            seen(&modified, ""),
            Some((Event::Modified, labelled("api", 2)))
        );
        let deleted = entry(Event::Deleted, labelled("web", 1), None);
        assert_eq!(
            seen(&deleted, ""),
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
            seen(&left, "app=web"),
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
            seen(&entered, "app=web"),
            Some((Event::Added, labelled("web", 2)))
        );
    }

    #[test]
    fn writes_outside_the_selection_are_not_seen() {
        let selector = "app=web";
        let added = entry(Event::Added, labelled("api", 1), None);
        assert_eq!(seen(&added, selector), None);
        let modified = entry(
            Event::Modified,
            labelled("api", 2),
            Some(labelled("api", 1)),
        );
        assert_eq!(seen(&modified, selector), None);
        let deleted = entry(Event::Deleted, labelled("api", 1), None);
        assert_eq!(seen(&deleted, selector), None);
        let stayed = entry(
            Event::Modified,
            labelled("web", 2),
            Some(labelled("web", 1)),
        );
        assert_eq!(
            seen(&stayed, selector),
            Some((Event::Modified, labelled("web", 2)))
        );
    }
}
