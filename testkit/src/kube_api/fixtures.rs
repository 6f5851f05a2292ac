//! For the handlers' tests: a cluster holding given objects, requests built as the front
//! parses them, and answers decoded.

use std::sync::Arc;

use http_body_util::BodyExt;
use serde_json::Value;

use super::cluster::Cluster;
use super::request::Req;
use super::response::Reply;
use super::served::{api_version, kind_of};
use super::store::{key_of, Event};
use super::target::{parse_path, parse_query};

/// A cluster holding `objects`, created in order (resourceVersions 1, 2, …).
pub(super) fn cluster_with(objects: &[Value]) -> Arc<Cluster> {
    let cluster = Arc::new(Cluster::new());
    let mut store = cluster.lock();
    for object in objects {
        let key = key_of(object).expect("a served kind");
        let created = store.created(object.clone(), &key.2);
        cluster.write(&mut store, key, created, Event::Added);
    }
    drop(store);
    cluster
}

/// `handle`'s result for a request to `path_and_query` with `accept`, parsed as the front
/// parses it.
pub(super) fn request<R>(
    path_and_query: &str,
    accept: &str,
    handle: impl FnOnce(&Req<'_>) -> R,
) -> R {
    let (path, query) = match path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path_and_query, None),
    };
    let target = parse_path(path).expect("a resource path");
    let params = parse_query(query);
    let kind = kind_of(&target.plural).expect("a served resource");
    let api_version = api_version(&target.group, &target.version);
    handle(&Req {
        target: &target,
        kind,
        api_version: &api_version,
        params: &params,
        accept,
    })
}

/// An answer's status code and JSON body.
pub(super) async fn decoded(reply: Reply) -> (u16, Value) {
    let code = reply.status().as_u16();
    let body = reply
        .into_body()
        .collect()
        .await
        .expect("a whole body")
        .to_bytes();
    (code, serde_json::from_slice(&body).expect("a JSON body"))
}
