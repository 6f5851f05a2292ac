use http_body_util::BodyExt;
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Method, StatusCode};
use serde_json::{json, Value};

use super::*;
use crate::kube_api::target::{parse_path, parse_query};

const RULES: &[Rule] = &[
    ("gateway.networking.k8s.io", "gateways", &["list", "watch"]),
    ("gateway.networking.k8s.io", "gateways/status", &["patch"]),
    ("apps", "deployments", &["get", "create", "patch", "delete"]),
    ("apps", "deployments/scale", &["update"]),
    ("", "secrets", &["get"]),
];

fn verb(method: Method, path: &str, query: &str) -> String {
    let target = parse_path(path).expect("a resource path");
    verb_of(&target, &parse_query(Some(query)), &method)
}

fn allows(method: Method, path: &str, query: &str) -> bool {
    let target = parse_path(path).expect("a resource path");
    granted(RULES, &target, &parse_query(Some(query)), &method)
}

#[test]
fn methods_map_to_the_api_servers_verbs() {
    let secrets = "/api/v1/namespaces/ns/secrets";
    let secret = "/api/v1/namespaces/ns/secrets/s";
    let cases = [
        (Method::GET, secret, "", "get"),
        (Method::HEAD, secret, "", "get"),
        (Method::GET, secrets, "", "list"),
        (Method::GET, secrets, "watch=true", "watch"),
        (Method::GET, secrets, "watch=1", "watch"),
        (Method::GET, secrets, "watch=false", "list"),
        // A watch of one object is a `get` by path, as kube's `Api::watch` never sends.
        (Method::GET, secret, "watch=true", "get"),
        (Method::POST, secrets, "", "create"),
        (Method::PATCH, secret, "", "patch"),
        (Method::PUT, secret, "", "update"),
        (Method::DELETE, secret, "", "delete"),
        (Method::DELETE, secrets, "", "deletecollection"),
        (Method::OPTIONS, secrets, "", "options"),
    ];
    for (method, path, query, expected) in cases {
        assert_eq!(
            verb(method.clone(), path, query),
            expected,
            "{method} {path}?{query}"
        );
    }
}

#[test]
fn a_subresource_is_a_resource_of_its_own() {
    let status = parse_path("/apis/gateway.networking.k8s.io/v1/namespaces/ns/gateways/g/status")
        .expect("a path");
    assert_eq!(resource_of(&status), "gateways/status");
    let scale = parse_path("/apis/apps/v1/namespaces/ns/deployments/web/scale").expect("a path");
    assert_eq!(resource_of(&scale), "deployments/scale");

    let gateways = "/apis/gateway.networking.k8s.io/v1/namespaces/ns/gateways";
    assert!(allows(Method::GET, gateways, "watch=true"));
    assert!(!allows(Method::PATCH, &format!("{gateways}/g"), ""));
    assert!(allows(Method::PATCH, &format!("{gateways}/g/status"), ""));
    assert!(!allows(
        Method::PATCH,
        "/apis/apps/v1/namespaces/ns/deployments/web/scale",
        ""
    ));
    assert!(allows(
        Method::PUT,
        "/apis/apps/v1/namespaces/ns/deployments/web/scale",
        ""
    ));
}

#[test]
fn a_rule_grants_its_verbs_in_its_group_only() {
    assert!(allows(Method::GET, "/api/v1/namespaces/ns/secrets/s", ""));
    assert!(!allows(Method::GET, "/api/v1/namespaces/ns/secrets", ""));
    assert!(!allows(
        Method::PUT,
        "/apis/apps/v1/namespaces/ns/deployments/web",
        ""
    ));
    // The same plural in another group is another resource.
    assert!(!allows(
        Method::GET,
        "/apis/example.com/v1/namespaces/ns/secrets/s",
        ""
    ));
    let target = parse_path("/api/v1/namespaces/ns/secrets/s").expect("a path");
    assert!(!granted(&[], &target, &Params::new(), &Method::GET));
}

#[test]
fn only_the_cluster_admins_bearer_token_is_the_user() {
    let headers = |value: &'static str| {
        let mut headers = HeaderMap::new();
        headers.insert(
            hyper::header::AUTHORIZATION,
            HeaderValue::from_static(value),
        );
        headers
    };
    assert!(is_user(&headers("Bearer cluster-admin")));
    assert!(!is_user(&headers("Bearer another")));
    assert!(!is_user(&headers("Basic cluster-admin")));
    assert!(!is_user(&HeaderMap::new()));
}

async fn body(reply: Reply) -> (StatusCode, Value) {
    let code = reply.status();
    let bytes = reply
        .into_body()
        .collect()
        .await
        .expect("a full body")
        .to_bytes();
    (code, serde_json::from_slice(&bytes).expect("JSON"))
}

#[tokio::test]
async fn a_refusal_is_worded_as_the_authorizer_words_it() {
    let target = parse_path("/apis/apps/v1/namespaces/tenant-a/deployments/web").expect("a path");
    let (code, status) = body(forbidden(&target, &Params::new(), &Method::PUT)).await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    assert_eq!(
        status,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "deployments.apps \"web\" is forbidden: User \"system:serviceaccount:cftunnel-system:cftunnel-controller\" cannot update resource \"deployments\" in API group \"apps\" in the namespace \"tenant-a\"",
               "reason": "Forbidden", "details": {"group": "apps", "kind": "deployments", "name": "web"}, "code": 403})
    );

    let namespaces = parse_path("/api/v1/namespaces").expect("a path");
    let (_, status) = body(forbidden(&namespaces, &Params::new(), &Method::GET)).await;
    assert_eq!(
        status["message"],
        "namespaces is forbidden: User \"system:serviceaccount:cftunnel-system:cftunnel-controller\" cannot list resource \"namespaces\" in API group \"\" at the cluster scope"
    );

    let (code, status) = body(forbidden_path("/apis", &Method::GET)).await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    assert_eq!(
        status["message"],
        "forbidden: User \"system:serviceaccount:cftunnel-system:cftunnel-controller\" cannot get path \"/apis\""
    );
}
