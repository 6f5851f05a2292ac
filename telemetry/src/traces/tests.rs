use super::*;
use clap::Parser;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    traces: TraceArgs,
}

fn settings(args: &[&str]) -> Result<Option<TraceSettings>, SettingError> {
    Cli::try_parse_from(std::iter::once("prog").chain(args.iter().copied()))
        .expect("flags parse")
        .traces
        .settings("cftunnel-test")
}

fn on(args: &[&str]) -> TraceSettings {
    settings(args).expect("valid settings").expect("tracing on")
}

#[test]
fn tracing_is_off_without_an_endpoint_or_when_disabled() {
    assert_eq!(settings(&[]), Ok(None));
    assert_eq!(settings(&["--otel-endpoint", ""]), Ok(None));
    assert_eq!(
        settings(&["--otel-endpoint", "http://c:4318", "--otel-sdk-disabled"]),
        Ok(None)
    );
    assert_eq!(
        settings(&[
            "--otel-endpoint",
            "http://c:4318",
            "--otel-traces-exporter",
            "none"
        ]),
        Ok(None)
    );
}

#[test]
fn the_base_endpoint_gets_the_traces_path_over_http_only() {
    let http = on(&["--otel-endpoint", "http://collector:4318/"]);
    assert_eq!(http.endpoint, "http://collector:4318/v1/traces");
    assert_eq!(http.protocol, Protocol::HttpProtobuf);
    let grpc = on(&[
        "--otel-endpoint",
        "http://collector:4317",
        "--otel-protocol",
        "grpc",
    ]);
    assert_eq!(grpc.endpoint, "http://collector:4317/");
    assert_eq!(grpc.protocol, Protocol::Grpc);
    // The signal's own endpoint and protocol win, the endpoint used as given.
    let own = on(&[
        "--otel-endpoint",
        "http://collector:4317",
        "--otel-traces-endpoint",
        "https://traces.example/in",
        "--otel-protocol",
        "grpc",
        "--otel-traces-protocol",
        "http/protobuf",
    ]);
    assert_eq!(own.endpoint, "https://traces.example/in");
    assert_eq!(own.protocol, Protocol::HttpProtobuf);
}

#[test]
fn samplers_follow_the_specifications_names_and_default() {
    let default = on(&["--otel-endpoint", "http://c:4318"]);
    assert_eq!(
        default.sampler,
        Sampler {
            parent_based: true,
            ratio: 1.0
        }
    );
    let ratio = on(&[
        "--otel-endpoint",
        "http://c:4318",
        "--otel-traces-sampler",
        "parentbased_traceidratio",
        "--otel-traces-sampler-arg",
        "0.01",
    ]);
    assert_eq!(
        ratio.sampler,
        Sampler {
            parent_based: true,
            ratio: 0.01
        }
    );
    let off = on(&[
        "--otel-endpoint",
        "http://c:4318",
        "--otel-traces-sampler",
        "always_off",
    ]);
    assert_eq!(off.sampler.ratio, 0.0);
    assert!(!off.sampler.parent_based);
}

#[test]
fn a_malformed_setting_names_its_variable() {
    for (args, setting) in [
        (
            &["--otel-endpoint", "collector:4318"][..],
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        (
            &[
                "--otel-endpoint",
                "http://c",
                "--otel-protocol",
                "http/json",
            ],
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        (
            &[
                "--otel-endpoint",
                "http://c",
                "--otel-traces-sampler",
                "jaeger_remote",
            ],
            "OTEL_TRACES_SAMPLER",
        ),
        (
            &[
                "--otel-endpoint",
                "http://c",
                "--otel-traces-sampler-arg",
                "2",
            ],
            "OTEL_TRACES_SAMPLER_ARG",
        ),
        (
            &["--otel-endpoint", "http://c", "--otel-headers", "nokey"],
            "OTEL_EXPORTER_OTLP_HEADERS",
        ),
        (
            &["--otel-endpoint", "http://c", "--otel-timeout", "10s"],
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ),
        (
            &[
                "--otel-endpoint",
                "http://c",
                "--otel-bsp-max-queue-size",
                "0",
            ],
            "OTEL_BSP_MAX_QUEUE_SIZE",
        ),
    ] {
        let err = settings(args).expect_err("refused");
        assert_eq!(err.setting, setting, "{args:?}: {err}");
    }
}

#[test]
fn headers_and_resource_attributes_are_url_decoded_pairs() {
    let s = on(&[
        "--otel-endpoint",
        "http://c:4318",
        "--otel-headers",
        "X-Api-Key=a%20b, tenant=t1",
        "--otel-traces-headers",
        "tenant=t2",
        "--otel-resource-attributes",
        "deployment.environment.name=prod,service.name=from-attrs,k8s.cluster.name=eu%2C1",
        "--otel-timeout",
        "2500",
    ]);
    assert_eq!(
        s.headers,
        [
            ("x-api-key".to_owned(), "a b".to_owned()),
            ("tenant".to_owned(), "t2".to_owned())
        ]
    );
    assert_eq!(s.service_name, "from-attrs");
    assert_eq!(
        s.resource_attributes,
        [
            ("deployment.environment.name".to_owned(), "prod".to_owned()),
            ("k8s.cluster.name".to_owned(), "eu,1".to_owned())
        ]
    );
    assert_eq!(s.timeout, Duration::from_millis(2500));
    let named = on(&[
        "--otel-endpoint",
        "http://c:4318",
        "--otel-service-name",
        "edge-proxy",
        "--otel-resource-attributes",
        "service.name=ignored",
    ]);
    assert_eq!(named.service_name, "edge-proxy");
    assert_eq!(
        on(&["--otel-endpoint", "http://c"]).service_name,
        "cftunnel-test"
    );
}

#[test]
fn the_batch_size_never_exceeds_the_queue() {
    let s = on(&[
        "--otel-endpoint",
        "http://c:4318",
        "--otel-bsp-max-queue-size",
        "100",
    ]);
    assert_eq!(s.batch.max_queue_size, 100);
    assert_eq!(s.batch.max_export_batch_size, 100);
    assert_eq!(s.batch.schedule_delay, Duration::from_secs(5));
}

#[test]
fn the_exporter_needs_a_runtime() {
    let s = on(&["--otel-endpoint", "http://127.0.0.1:9"]);
    assert!(matches!(Traces::start(&s), Err(StartError::NoRuntime)));
}

#[test]
fn the_settings_pass_on_as_variables_without_headers_or_service_name() {
    let args = |flags: &[&str]| {
        Cli::try_parse_from(std::iter::once("prog").chain(flags.iter().copied()))
            .expect("flags parse")
            .traces
    };
    assert!(
        args(&["--otel-protocol", "grpc"]).to_env().is_empty(),
        "off"
    );
    let on = args(&[
        "--otel-endpoint",
        "http://c:4317",
        "--otel-protocol",
        "grpc",
        "--otel-traces-sampler-arg",
        "0.5",
        "--otel-headers",
        "api-key=secret",
        "--otel-service-name",
        "mine",
    ]);
    assert_eq!(
        on.to_env(),
        [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317".to_owned()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".to_owned()),
            ("OTEL_TRACES_SAMPLER_ARG", "0.5".to_owned()),
        ]
    );
    assert!(
        args(&["--otel-endpoint", "http://c", "--otel-sdk-disabled"])
            .to_env()
            .is_empty()
    );
}

#[test]
fn planes_get_the_deployments_resource_attributes_but_not_the_controllers_identity() {
    // What the OpenTelemetry Operator injects into the controller's pod, and a cluster-wide
    // attribute with an encoded comma.
    let args = Cli::try_parse_from([
        "prog",
        "--otel-endpoint",
        "http://c:4318",
        "--otel-resource-attributes",
        "service.name=ctl,k8s.pod.name=ctl-0,deployment.environment=prod,\
         k8s.pod.uid=0f1e,service.instance.id=cftunnel.ctl-0.controller,host.name=node-7,\
         k8s.cluster.name=eu%2C1,container.id=abc,k8s.namespace.name=cftunnel,\
         k8s.deployment.name=ctl,service.namespace=edge",
    ])
    .expect("flags parse")
    .traces;
    let env = args.to_env();
    let attributes = env
        .iter()
        .find(|(name, _)| *name == "OTEL_RESOURCE_ATTRIBUTES")
        .map(|(_, value)| value.as_str());
    assert_eq!(
        attributes,
        Some("deployment.environment=prod,k8s.cluster.name=eu%2C1,service.namespace=edge")
    );
    // The plane reads them as its own settings: its service name stays the proxy's.
    let plane = Cli::try_parse_from(
        std::iter::once("proxy".to_owned()).chain(
            env.iter()
                .flat_map(|(name, value)| [flag(name).to_owned(), value.clone()]),
        ),
    )
    .expect("flags parse")
    .traces
    .settings("cftunnel-proxy")
    .expect("valid settings")
    .expect("tracing on");
    assert_eq!(plane.service_name, "cftunnel-proxy");
    assert_eq!(
        plane.resource_attributes,
        [
            ("deployment.environment".to_owned(), "prod".to_owned()),
            ("k8s.cluster.name".to_owned(), "eu,1".to_owned()),
            ("service.namespace".to_owned(), "edge".to_owned()),
        ]
    );
    // Nothing left to pass on: no variable at all.
    let own_only = Cli::try_parse_from([
        "prog",
        "--otel-endpoint",
        "http://c:4318",
        "--otel-resource-attributes",
        "service.name=ctl,k8s.pod.name=ctl-0",
    ])
    .expect("flags parse")
    .traces;
    assert!(own_only
        .to_env()
        .iter()
        .all(|(name, _)| *name != "OTEL_RESOURCE_ATTRIBUTES"));
}

/// The flag of a variable `to_env` writes.
fn flag(variable: &str) -> &'static str {
    match variable {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => "--otel-endpoint",
        "OTEL_RESOURCE_ATTRIBUTES" => "--otel-resource-attributes",
        other => panic!("no flag for {other}"),
    }
}
