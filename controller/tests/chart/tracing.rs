//! The tracing values: the same OpenTelemetry settings reach the controller and the shared
//! pool's proxy through the standard `OTEL_*` variables, as each program reads them; none are
//! set while no endpoint is.

use super::*;
use cftunnel_telemetry::{TraceArgs, TraceSettings};
use clap::CommandFactory;

/// The flags a program whose flags are `command` takes from the `OTEL_*` variables of
/// `container` (the headers, from a Secret, left out: the test checks their reference).
fn otel_flags(command: &clap::Command, container: &Container) -> Vec<String> {
    let mut flags = Vec::new();
    for var in container.env.iter().flatten() {
        if !var.name.starts_with("OTEL_") || var.name == "OTEL_EXPORTER_OTLP_HEADERS" {
            continue;
        }
        let arg = command
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|e| e == var.name.as_str()))
            .unwrap_or_else(|| panic!("{} reads no {}", command.get_name(), var.name));
        let value = var
            .value
            .clone()
            .unwrap_or_else(|| panic!("{}: a value", var.name));
        flags.push(format!(
            "--{}={value}",
            arg.get_long().expect("a long flag")
        ));
    }
    flags
}

/// The trace settings of a proxy container, as the proxy reads its variables.
fn proxy_settings(container: &Container) -> Option<TraceSettings> {
    let flags = otel_flags(&cftunnel_proxy::cli::Args::command(), container);
    cftunnel_proxy::cli::Args::try_parse_from(
        std::iter::once("cftunnel-proxy".to_owned()).chain(flags),
    )
    .unwrap_or_else(|e| panic!("the proxy takes its tracing variables: {e}"))
    .traces
    .settings("cftunnel-proxy")
    .unwrap_or_else(|e| panic!("the proxy takes its tracing settings: {e}"))
}

#[test]
fn the_tracing_values_reach_the_controller_and_the_pool_as_otel_variables() {
    let Some(tools) =
        tools("the_tracing_values_reach_the_controller_and_the_pool_as_otel_variables")
    else {
        return;
    };
    let mut traced = 0;
    for file in values_files() {
        let values = values(&file, "");
        let rendered = render(tools, &file, "");
        let controller: Deployment = rendered.one("Deployment", &controller_name(RELEASE));
        let pool: Deployment = rendered.one("Deployment", &pool_name(RELEASE));
        // The controller, its arguments and its tracing variables as the chart sets them.
        let cli = Cli::command();
        let run_command = cli.find_subcommand("run").expect("the run command");
        let mut run = controller_run(&controller);
        let namespace = run.controller_namespace.clone();
        let args = container(&controller).args.clone().expect("arguments");
        let with_env = Cli::try_parse_from(
            std::iter::once("cftunnel-controller".to_owned())
                .chain(args)
                .chain(otel_flags(run_command, container(&controller))),
        )
        .unwrap_or_else(|e| panic!("{file}: the controller takes its tracing variables: {e}"));
        if let Command::Run(parsed) = with_env.command {
            run = *parsed;
            run.controller_namespace = namespace;
        }
        let from_controller = run
            .traces
            .settings("cftunnel-controller")
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let from_pool = proxy_settings(container(&pool));
        // A dedicated plane the controller renders traces as the pool does.
        let from_plane = proxy_settings(container(&plane(&options(&run)).deployment));
        assert_eq!(from_plane, from_pool, "{file}: a dedicated plane");

        let endpoint = string(&values, "tracing.endpoint");
        if endpoint.is_empty() {
            assert_eq!((from_controller, from_pool), (None, None), "{file}");
            for deployment in [&controller, &pool] {
                let otel: Vec<&str> = container(deployment)
                    .env
                    .iter()
                    .flatten()
                    .map(|e| e.name.as_str())
                    .filter(|n| n.starts_with("OTEL_"))
                    .collect();
                assert!(otel.is_empty(), "{file}: {otel:?} while tracing is off");
            }
            continue;
        }
        traced += 1;
        // What the values say, given as flags.
        let expected = TraceArgs {
            endpoint: Some(endpoint),
            protocol: Some(string(&values, "tracing.protocol")),
            sampler: Some(string(&values, "tracing.sampler")),
            sampler_arg: Some(string(&values, "tracing.ratio")),
            ..TraceArgs::default()
        };
        // Resource attributes arrive decoded, whatever characters they hold.
        let attributes: Vec<(String, String)> =
            label_map(at(&values, "tracing.resourceAttributes"))
                .into_iter()
                .collect();
        for (program, got) in [
            ("cftunnel-controller", from_controller),
            ("cftunnel-proxy", from_pool),
        ] {
            let got = got.unwrap_or_else(|| panic!("{file}: {program} traces"));
            let mut want = expected
                .settings(program)
                .expect("valid")
                .expect("tracing on");
            want.resource_attributes = attributes.clone();
            assert_eq!(got, want, "{file}: {program}");
        }
        let secret = string(&values, "tracing.headers.existingSecret");
        for deployment in [&controller, &pool] {
            let main = container(deployment);
            if secret.is_empty() {
                assert!(env(main, "OTEL_EXPORTER_OTLP_HEADERS").is_none(), "{file}");
            } else {
                assert_eq!(
                    secret_key(main, "OTEL_EXPORTER_OTLP_HEADERS"),
                    (secret.clone(), string(&values, "tracing.headers.key")),
                    "{file}"
                );
            }
        }
    }
    assert!(traced > 0, "some values file turns tracing on");
}
