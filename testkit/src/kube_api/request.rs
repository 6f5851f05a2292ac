//! A request to a resource, read and parsed, as the handlers of each verb take it, with the
//! answers they share: the object's key, the writer's field manager, `apiVersion` and `kind`
//! stamped on what is returned, and 404, 409 (stale resourceVersion) and 422 (invalid).

use hyper::StatusCode;
use serde_json::Value;

use super::response::{status, Reply};
use super::schema;
use super::store::Key;
use super::target::{Params, Target};

/// A request body as the object it carries (a Secret's `stringData` folded into `data`).
pub(super) fn json_body(body: &[u8]) -> Option<Value> {
    let mut object = serde_json::from_slice::<Value>(body).ok()?;
    schema::normalize_secret(&mut object);
    Some(object)
}

/// A request, parsed.
pub(super) struct Req<'a> {
    pub(super) target: &'a Target,
    pub(super) kind: &'static str,
    pub(super) api_version: &'a str,
    pub(super) params: &'a Params,
    /// The `Accept` header.
    pub(super) accept: &'a str,
}

impl Req<'_> {
    /// The key of the object `name` in the request's resource and namespace.
    pub(super) fn key(&self, name: &str) -> Key {
        (
            self.target.group.clone(),
            self.target.plural.clone(),
            self.target.namespace.clone().unwrap_or_default(),
            name.to_owned(),
        )
    }

    /// The object the path names (empty for a collection).
    pub(super) fn name(&self) -> String {
        self.target.name.clone().unwrap_or_default()
    }

    /// The writer's field manager, as the request names it.
    pub(super) fn manager(&self) -> &str {
        self.params
            .get("fieldManager")
            .map_or("unknown", String::as_str)
    }

    /// `object` with the request's `apiVersion` and `kind`, as answered.
    pub(super) fn typed(&self, mut object: Value) -> Value {
        if let Some(o) = object.as_object_mut() {
            o.insert("apiVersion".into(), self.api_version.into());
            o.insert("kind".into(), self.kind.into());
        }
        object
    }

    /// 409 for a write naming a resourceVersion that is no longer current.
    pub(super) fn stale(&self, name: &str) -> Reply {
        status(
            StatusCode::CONFLICT,
            "Conflict",
            &format!("Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again", self.target.plural),
        )
    }

    /// The 422 the API server's validation answers an object it refuses ([`schema::invalid`]),
    /// replacing `existing` if it is an update.
    pub(super) fn invalid(
        &self,
        name: &str,
        object: &Value,
        existing: Option<&Value>,
    ) -> Option<Reply> {
        let message = schema::invalid(self.kind, &self.target.group, name, object, existing)?;
        Some(status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            &message,
        ))
    }

    pub(super) fn not_found(&self, name: &str) -> Reply {
        status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!(
                "{}.{} \"{name}\" not found",
                self.target.plural, self.target.group
            ),
        )
    }
}
