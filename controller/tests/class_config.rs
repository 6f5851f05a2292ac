//! The controller against an API server with a GatewayClassConfig: the class's credentials
//! Secret, not the controller's flag, writes the class tunnel's ingress document (the fake
//! Cloudflare API accepts only the class's token); the config's `SecretsResolved` and `Valid`
//! and the class's `Accepted` follow it, and say `InvalidParameters` when it stops resolving.

use std::time::{Duration, Instant};

use cftunnel_controller::runtime::{self, RuntimeOptions, SharedPlane, REQUIRED_RBAC};
use cftunnel_controller::translate::ObjectKey;
use cftunnel_testkit::cloudflare_api::CloudflareApi;
use cftunnel_testkit::kube_api::ApiServer;
use cftunnel_tunnel::Token;
use serde_json::{json, Value};

const SHARED_TUNNEL_ID: &str = "c4a1e7d2-9b36-4f08-a5c3-6e2b8d0f1a97";
const ACCOUNT: &str = "0123456789abcdef0123456789abcdef";

fn seed() -> String {
    let token = Token::new(
        ACCOUNT,
        b"class secret".to_vec(),
        SHARED_TUNNEL_ID.parse().expect("uuid"),
    )
    .encode();
    format!(
        r#"
apiVersion: v1
kind: Namespace
metadata: {{name: cftunnel-system}}
---
apiVersion: v1
kind: Secret
metadata: {{name: shared-auth, namespace: cftunnel-system}}
stringData: {{token: pool-secret}}
---
apiVersion: v1
kind: Secret
metadata: {{name: shared-tunnel, namespace: cftunnel-system}}
stringData: {{tunnel-token: "{token}"}}
---
apiVersion: v1
kind: Secret
metadata: {{name: class-credentials, namespace: cftunnel-system}}
stringData: {{api-token: class-api-token}}
---
apiVersion: cf.k8s.lex.la/v1alpha1
kind: GatewayClassConfig
metadata: {{name: main}}
spec:
  tunnelID: "{SHARED_TUNNEL_ID}"
  cloudflareCredentialsSecretRef: {{name: class-credentials}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: cloudflare-tunnel}}
spec:
  controllerName: cf.k8s.lex.la/tunnel-controller
  parametersRef: {{group: cf.k8s.lex.la, kind: GatewayClassConfig, name: main}}
"#
    )
}

/// The shared pool, on the class tunnel of the seed's Secret.
fn shared_plane() -> SharedPlane {
    SharedPlane {
        service: ObjectKey::new("cftunnel-system", "cftunnel-proxy"),
        auth_secret: ObjectKey::new("cftunnel-system", "shared-auth"),
        auth_key: "token".to_owned(),
        tunnel_secret: Some((
            ObjectKey::new("cftunnel-system", "shared-tunnel"),
            "tunnel-token".to_owned(),
        )),
        deployment: None,
    }
}

/// A controller running on the stand-in API server, stopped cleanly by [`Controller::stop`].
struct Controller {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    health: std::sync::Arc<runtime::health::Health>,
}

impl Controller {
    fn start(api: &ApiServer, options: RuntimeOptions) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let health = std::sync::Arc::new(runtime::health::Health::default());
        let task = tokio::spawn(runtime::run(api.client(), options, health.clone(), async {
            let _ = stopped.await;
        }));
        Self { stop, task, health }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task
            .await
            .expect("the controller task ends")
            .expect("the controller stops cleanly");
    }
}

async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let by = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < by, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// `(status, reason, message, observedGeneration)` of condition `kind` in `conditions`.
fn condition(object: &Value, kind: &str) -> Option<(String, String, String, Option<i64>)> {
    let c = object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)?;
    Some((
        c["status"].as_str()?.to_owned(),
        c["reason"].as_str()?.to_owned(),
        c["message"].as_str().unwrap_or_default().to_owned(),
        c["observedGeneration"].as_i64(),
    ))
}

#[tokio::test]
async fn a_gateway_class_config_supplies_the_credentials_and_its_status_says_whether_it_resolves() {
    tokio::time::timeout(Duration::from_secs(60), scenario())
        .await
        .expect("the scenario finishes in time");
}

async fn scenario() {
    let api = ApiServer::builder()
        .rbac(REQUIRED_RBAC)
        .seed(seed())
        .start()
        .await;
    let cloudflare = CloudflareApi::start().await;
    // Only the class's token may write the account's tunnels: the flag's would be refused.
    cloudflare.allow(ACCOUNT, "class-api-token");
    let options = RuntimeOptions {
        resync: Duration::from_millis(150),
        shared: Some(shared_plane()),
        cloudflare_api_base: cloudflare.base(),
        cloudflare_api_token: Some("flag-api-token".to_owned()),
        push_timeout: Duration::from_secs(2),
        ..RuntimeOptions::default()
    };
    let controller = Controller::start(&api, options);

    let (_, document) = eventually("the class tunnel's ingress document", || {
        cloudflare.config(ACCOUNT, SHARED_TUNNEL_ID)
    })
    .await;
    assert!(
        document.pointer("/ingress").is_some(),
        "an ingress document: {document}"
    );
    let config = || {
        api.get("cf.k8s.lex.la/v1alpha1", "GatewayClassConfig", "", "main")
            .expect("the GatewayClassConfig exists")
    };
    let valid = eventually("the config's conditions", || {
        let c = config();
        Some((condition(&c, "SecretsResolved")?, condition(&c, "Valid")?))
    })
    .await;
    assert_eq!(
        (valid.0 .0.as_str(), valid.0 .1.as_str()),
        ("True", "SecretsFound")
    );
    assert_eq!(
        (valid.1 .0.as_str(), valid.1 .1.as_str()),
        ("True", "Valid")
    );
    assert_eq!(valid.1 .3, Some(1), "observedGeneration");
    let class = || {
        api.get(
            "gateway.networking.k8s.io/v1",
            "GatewayClass",
            "",
            "cloudflare-tunnel",
        )
        .expect("the GatewayClass exists")
    };
    let accepted = eventually("the class accepted", || condition(&class(), "Accepted")).await;
    assert_eq!(
        (accepted.0.as_str(), accepted.1.as_str()),
        ("True", "Accepted")
    );

    // The config now names a Secret that is not there: invalid, and the class not accepted.
    let mut changed = config();
    changed["spec"]["cloudflareCredentialsSecretRef"] = json!({"name": "absent"});
    api.put(changed);
    let missing = eventually("SecretsMissing", || {
        condition(&config(), "SecretsResolved").filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(missing.1, "SecretsMissing");
    assert!(
        missing
            .2
            .contains("Secret cftunnel-system/absent not found"),
        "{}",
        missing.2
    );
    assert_eq!(missing.3, Some(2), "observedGeneration");
    let invalid = condition(&config(), "Valid").expect("Valid");
    assert_eq!(
        (invalid.0.as_str(), invalid.1.as_str()),
        ("False", "Invalid")
    );
    let refused = eventually("the class refused", || {
        condition(&class(), "Accepted").filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(refused.1, "InvalidParameters");
    assert!(
        refused.2.contains("GatewayClassConfig main"),
        "{}",
        refused.2
    );

    controller.stop().await;
}

/// The SHA-256 of `token`, in hex, as the pool's pod template carries it.
fn sha256(token: &str) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The shared pool runs on the class tunnel's token, flag < class config: without a
/// `tunnelTokenSecretRef` its token variable reads the flag's Secret; once the class config
/// names one, the controller points the variable there and stamps the token's digest, which
/// rolls the pool; a new token in that Secret rolls it again. When the Secret named is missing,
/// the config says `SecretsResolved=False` and the pool keeps running on its last token.
#[tokio::test]
async fn the_class_configs_tunnel_token_moves_the_shared_pool() {
    tokio::time::timeout(Duration::from_secs(60), pool_scenario())
        .await
        .expect("the scenario finishes in time");
}

async fn pool_scenario() {
    const ANNOTATION: &str = "cf.k8s.lex.la/tunnel-token-hash";
    let class_token = |secret: &[u8]| {
        Token::new(
            ACCOUNT,
            secret.to_vec(),
            SHARED_TUNNEL_ID.parse().expect("uuid"),
        )
        .encode()
    };
    let flag_token = class_token(b"class secret");
    let api = ApiServer::builder()
        .rbac(REQUIRED_RBAC)
        .seed(seed())
        .start()
        .await;
    // As the chart renders the pool.
    let chart_pool: Value = serde_yaml_ng::from_str(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: cftunnel-proxy, namespace: cftunnel-system, labels: {app.kubernetes.io/managed-by: Helm}}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app.kubernetes.io/name: cftunnel-proxy}}\n  template:\n    metadata: {labels: {app.kubernetes.io/name: cftunnel-proxy}}\n    spec:\n      containers:\n      - name: proxy\n        image: cftunnel-proxy:1\n        env:\n        - {name: TUNNEL_TOKEN, valueFrom: {secretKeyRef: {name: shared-tunnel, key: tunnel-token}}}\n        - {name: PROXY_AUTH_TOKEN, valueFrom: {secretKeyRef: {name: shared-auth, key: token}}}\n",
    ).expect("YAML");
    api.put(chart_pool.clone());
    let cloudflare = CloudflareApi::start().await;
    cloudflare.allow(ACCOUNT, "class-api-token");
    let options = RuntimeOptions {
        resync: Duration::from_millis(150),
        shared: Some(SharedPlane {
            service: ObjectKey::new("cftunnel-system", "cftunnel-proxy"),
            auth_secret: ObjectKey::new("cftunnel-system", "shared-auth"),
            auth_key: "token".to_owned(),
            tunnel_secret: Some((
                ObjectKey::new("cftunnel-system", "shared-tunnel"),
                "tunnel-token".to_owned(),
            )),
            deployment: Some(ObjectKey::new("cftunnel-system", "cftunnel-proxy")),
        }),
        cloudflare_api_base: cloudflare.base(),
        push_timeout: Duration::from_secs(2),
        ..RuntimeOptions::default()
    };
    let controller = Controller::start(&api, options);
    let template = || {
        api.get("apps/v1", "Deployment", "cftunnel-system", "cftunnel-proxy")
            .and_then(|d| d.pointer("/spec/template").cloned())
            .expect("the pool's Deployment")
    };
    // The Secret and key the token variable reads, and the digest stamped.
    let pool = || {
        let t = template();
        let env = t
            .pointer("/spec/containers/0/env")
            .and_then(Value::as_array)
            .and_then(|env| env.iter().find(|v| v["name"] == "TUNNEL_TOKEN").cloned())
            .expect("TUNNEL_TOKEN");
        let source = env.pointer("/valueFrom/secretKeyRef").cloned();
        (source, t["metadata"]["annotations"][ANNOTATION].clone())
    };
    let becomes = |secret: &'static str, token: String| {
        let want = (
            Some(json!({"name": secret, "key": "tunnel-token"})),
            json!(sha256(&token)),
        );
        let pool = &pool;
        async move {
            eventually(&format!("the pool on {secret}"), || {
                let now = pool();
                (now == want).then_some(())
            })
            .await;
        }
    };
    // No tunnelTokenSecretRef: the flag's Secret.
    becomes("shared-tunnel", flag_token.clone()).await;

    let config = || {
        api.get("cf.k8s.lex.la/v1alpha1", "GatewayClassConfig", "", "main")
            .expect("the GatewayClassConfig exists")
    };
    let put_class_tunnel = |token: &str| {
        api.put(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "class-tunnel", "namespace": "cftunnel-system"},
            "stringData": {"tunnel-token": token}}));
    };
    let first = class_token(b"first class secret");
    put_class_tunnel(&first);
    let mut named = config();
    named["spec"]["tunnelTokenSecretRef"] = json!({"name": "class-tunnel"});
    api.put(named);
    becomes("class-tunnel", first).await;
    // The other containers' variables, and the rest of the Deployment, are as the chart wrote.
    let auth = template()
        .pointer("/spec/containers/0/env/1/valueFrom/secretKeyRef/name")
        .cloned();
    assert_eq!(auth, Some(json!("shared-auth")));
    assert_eq!(
        template().pointer("/spec/containers/0/image"),
        Some(&json!("cftunnel-proxy:1"))
    );

    // Rotated in the class config's Secret: rolled to the new token.
    let second = class_token(b"second class secret");
    put_class_tunnel(&second);
    becomes("class-tunnel", second.clone()).await;

    // A `helm upgrade` writes the chart's Deployment back, on the chart's token: pointed again
    // at once, not when the pool's stamp is next due (minutes).
    api.put(chart_pool);
    becomes("class-tunnel", second).await;

    // The Secret named is missing: the config says so, and the pool stays on its token.
    let before = template();
    let mut missing = config();
    missing["spec"]["tunnelTokenSecretRef"] = json!({"name": "absent"});
    api.put(missing);
    let resolved = eventually("SecretsMissing", || {
        condition(&config(), "SecretsResolved").filter(|c| c.0 == "False")
    })
    .await;
    assert!(
        resolved.2.contains("cftunnel-system/absent"),
        "{}",
        resolved.2
    );
    // Rounds go on (the class's status is written each one): the pool is left alone.
    eventually("the class refused", || {
        let class = api.get(
            "gateway.networking.k8s.io/v1",
            "GatewayClass",
            "",
            "cloudflare-tunnel",
        )?;
        condition(&class, "Accepted").filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(template(), before, "the pool keeps its last token");

    controller.stop().await;
}

const TENANT_TUNNEL_ID: &str = "5d0f3a2b-7c41-4e96-b8a2-1f6e9c3d7b05";

/// The connector token of the tenant's own tunnel, in the class's account.
fn tenant_token() -> Token {
    Token::new(
        ACCOUNT,
        b"tenant secret".to_vec(),
        TENANT_TUNNEL_ID.parse().expect("uuid"),
    )
}

/// A tenant's dedicated Gateway on its own tunnel ([`tenant_token`]), whose GatewayConfig names
/// no API token: the class's writes its ingress document.
fn tenant_seed() -> String {
    let token = tenant_token().encode();
    format!(
        r#"
apiVersion: v1
kind: Namespace
metadata: {{name: tenant-a, labels: {{kubernetes.io/metadata.name: tenant-a}}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: edge-tunnel-token, namespace: tenant-a}}
stringData: {{tunnel-token: "{token}"}}
---
apiVersion: cf.k8s.lex.la/v1alpha1
kind: GatewayConfig
metadata: {{name: edge-config, namespace: tenant-a}}
spec: {{tunnelTokenSecretRef: {{name: edge-tunnel-token}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: tenant-a}}
spec:
  gatewayClassName: cloudflare-tunnel
  infrastructure: {{parametersRef: {{group: cf.k8s.lex.la, kind: GatewayConfig, name: edge-config}}}}
  listeners: [{{name: http, port: 80, protocol: HTTP}}]
"#
    )
}

fn tenant_route(name: &str, hostname: &str) -> Value {
    serde_yaml_ng::from_str(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: tenant-a}}\nspec: {{parentRefs: [{{name: edge}}], hostnames: [{hostname}], rules: [{{}}]}}\n"
    ))
    .expect("a route")
}

/// The operator's class config breaking (its credentials Secret gone) holds up the class
/// tunnel, not the tenants: a dedicated plane whose GatewayConfig names no token keeps its
/// ingress document written with the token the class last gave, and its routes stay accepted.
#[tokio::test]
async fn a_broken_class_config_holds_up_no_tenants_tunnel() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let api = ApiServer::builder()
            .rbac(REQUIRED_RBAC)
            .seed(format!("{}---{}", seed(), tenant_seed()))
            .start()
            .await;
        api.put(tenant_route("shop", "shop.example.com"));
        let cloudflare = CloudflareApi::start().await;
        cloudflare.allow(ACCOUNT, "class-api-token");
        cloudflare.add_tunnel(ACCOUNT, TENANT_TUNNEL_ID, &tenant_token().encode());
        let options = RuntimeOptions {
            resync: Duration::from_millis(150),
            translate: cftunnel_controller::translate::Options {
                proxy_image: Some("proxy:1".to_owned()),
                ..Default::default()
            },
            render: cftunnel_controller::render::RenderSettings {
                proxy_image: Some("proxy:1".to_owned()),
                ..Default::default()
            },
            shared: Some(shared_plane()),
            cloudflare_api_base: cloudflare.base(),
            push_timeout: Duration::from_secs(2),
            ..RuntimeOptions::default()
        };
        let controller = Controller::start(&api, options);
        let lists = |hostname: &'static str| {
            let cloudflare = &cloudflare;
            move || {
                cloudflare
                    .config(ACCOUNT, TENANT_TUNNEL_ID)
                    .filter(|(_, d)| d.to_string().contains(hostname))
            }
        };
        eventually("the tenant's document", lists("shop.example.com")).await;

        // The class config stops resolving.
        let mut config = api
            .get("cf.k8s.lex.la/v1alpha1", "GatewayClassConfig", "", "main")
            .expect("the GatewayClassConfig");
        config["spec"]["cloudflareCredentialsSecretRef"] = json!({"name": "absent"});
        api.put(config);
        let class = || {
            api.get(
                "gateway.networking.k8s.io/v1",
                "GatewayClass",
                "",
                "cloudflare-tunnel",
            )
            .expect("the GatewayClass")
        };
        eventually("the class refused", || {
            condition(&class(), "Accepted").filter(|c| c.0 == "False")
        })
        .await;

        // The tenant's new route still reaches its tunnel, and is accepted.
        api.put(tenant_route("blog", "blog.example.com"));
        eventually("the tenant's new hostname", lists("blog.example.com")).await;
        let accepted = eventually("the new route's status", || {
            let route = api.get(
                "gateway.networking.k8s.io/v1",
                "HTTPRoute",
                "tenant-a",
                "blog",
            )?;
            let parent = route.pointer("/status/parents/0")?.clone();
            condition(&json!({"status": parent}), "Accepted")
        })
        .await;
        assert_eq!(accepted.0, "True", "{accepted:?}");

        controller.stop().await;
    })
    .await
    .expect("in time");
}

/// The shared Gateways' addresses, by name, as their statuses list them.
fn shared_addresses(api: &ApiServer) -> Vec<Option<Value>> {
    ["public", "internal"]
        .iter()
        .map(|name| {
            api.get("gateway.networking.k8s.io/v1", "Gateway", "tenant-s", name)
                .and_then(|g| g.pointer("/status/addresses").cloned())
        })
        .collect()
}

/// While the class config does not resolve (its credentials Secret deleted), the shared pool
/// serves on the class tunnel it last read: every shared Gateway keeps that tunnel's address,
/// which external-dns and the like follow.
#[tokio::test]
async fn a_class_config_that_stops_resolving_leaves_the_shared_gateways_their_address() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let gateways = ["public", "internal"]
            .iter()
            .map(|name| {
                format!(
                    "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: tenant-s}}\nspec:\n  gatewayClassName: cloudflare-tunnel\n  listeners: [{{name: http, port: 80, protocol: HTTP, hostname: {name}.example.com}}]\n"
                )
            })
            .collect::<Vec<_>>()
            .join("---\n");
        let api = ApiServer::builder()
            .rbac(REQUIRED_RBAC)
            .seed(format!("{}---\n{gateways}", seed()))
            .start()
            .await;
        let cloudflare = CloudflareApi::start().await;
        cloudflare.allow(ACCOUNT, "class-api-token");
        let options = RuntimeOptions {
            resync: Duration::from_millis(150),
            shared: Some(shared_plane()),
            cloudflare_api_base: cloudflare.base(),
            push_timeout: Duration::from_secs(2),
            ..RuntimeOptions::default()
        };
        let controller = Controller::start(&api, options);
        let address = json!([{"type": "Hostname", "value": format!("{SHARED_TUNNEL_ID}.cfargotunnel.com")}]);
        let every = vec![Some(address); 2];
        eventually("the shared Gateways' address", || {
            (shared_addresses(&api) == every).then_some(())
        })
        .await;

        assert!(api.delete("v1", "Secret", "cftunnel-system", "class-credentials"));
        let class = || {
            api.get(
                "gateway.networking.k8s.io/v1",
                "GatewayClass",
                "",
                "cloudflare-tunnel",
            )
            .expect("the GatewayClass")
        };
        eventually("the class refused", || {
            condition(&class(), "Accepted").filter(|c| c.0 == "False")
        })
        .await;
        // Rounds run at every resync; several of them, each writing the Gateways' statuses.
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            assert_eq!(shared_addresses(&api), every, "the address stays");
        }
        controller.stop().await;

        // A controller that starts meanwhile has read no tunnel: the Gateways keep the address
        // they show.
        let restarted = RuntimeOptions {
            resync: Duration::from_millis(150),
            shared: Some(shared_plane()),
            cloudflare_api_base: cloudflare.base(),
            push_timeout: Duration::from_secs(2),
            ..RuntimeOptions::default()
        };
        let controller = Controller::start(&api, restarted);
        let rounds = || {
            let text = controller.health.metrics_text().ok()?;
            text.lines()
                .find_map(|l| l.strip_prefix("cftunnel_controller_rounds_total "))?
                .parse::<f64>()
                .ok()
        };
        eventually("rounds of the restarted controller", || {
            rounds().filter(|n| *n >= 3.0)
        })
        .await;
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            assert_eq!(shared_addresses(&api), every, "the address stays after a restart");
        }
        controller.stop().await;
    })
    .await
    .expect("in time");
}
