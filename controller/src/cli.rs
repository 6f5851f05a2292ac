//! The command line: `cftunnel-controller translate` renders the proxy config a cluster state
//! would produce, with no cluster.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};

use crate::manifest;
use crate::translate::{
    self, ObjectKey, Options, Output, PlaneKey, Snapshot, Statuses, DEFAULT_CLUSTER_DOMAIN,
    DEFAULT_CONTROLLER_NAME,
};

/// Gateway API controller for Cloudflare Tunnel data planes.
#[derive(Debug, Parser)]
#[command(name = "cftunnel-controller", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the proxy config a set of manifests produces (stdout, JSON) and the conditions
    /// every owned object would get (stderr).
    Translate(TranslateArgs),
}

#[derive(Debug, Args)]
pub struct TranslateArgs {
    /// Manifest file or folder of manifests (*.yaml, *.yml, *.json); repeatable.
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<PathBuf>,
    /// Print the data plane of this Gateway (NAMESPACE/NAME). Default: the shared plane.
    #[arg(long, conflicts_with = "all_planes")]
    pub gateway: Option<GatewayName>,
    /// Print every data plane, as a JSON object keyed by plane (`shared`, `gateway NS/NAME`).
    #[arg(long)]
    pub all_planes: bool,
    /// Treat Gateways of this class as ours even without a GatewayClass object.
    #[arg(long)]
    pub gateway_class_name: Option<String>,
    /// GatewayClasses with this controllerName are ours.
    #[arg(long, default_value = DEFAULT_CONTROLLER_NAME)]
    pub controller_name: String,
    /// Cluster DNS domain used for Services without EndpointSlices.
    #[arg(long, default_value = DEFAULT_CLUSTER_DOMAIN)]
    pub cluster_domain: String,
}

/// `NAMESPACE/NAME` of a Gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayName(pub ObjectKey);

impl FromStr for GatewayName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self(ObjectKey::new(ns, name)))
            }
            _ => Err(format!("expected NAMESPACE/NAME, got {s:?}")),
        }
    }
}

impl fmt::Display for GatewayName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Runs `translate`: config JSON to `out`, conditions to `err`.
///
/// # Errors
/// Unreadable or invalid manifests, an unknown `--gateway`, or no way to tell which Gateways
/// are ours.
pub fn run_translate(
    args: &TranslateArgs,
    out: &mut impl Write,
    err: &mut impl Write,
) -> anyhow::Result<()> {
    let mut snapshot = Snapshot::default();
    for path in &args.files {
        load_path(&mut snapshot, path)?;
    }

    let mut class = args.gateway_class_name.clone();
    if let Some(GatewayName(key)) = &args.gateway {
        let Some(gw) = snapshot.gateways.iter().find(|g| {
            g.metadata.namespace.as_deref() == Some(key.namespace.as_str())
                && g.metadata.name.as_deref() == Some(key.name.as_str())
        }) else {
            bail!("Gateway {key} is not in the manifests");
        };
        match &class {
            Some(c) if *c != gw.spec.gateway_class_name => bail!(
                "Gateway {key} is of class {}, not {c}",
                gw.spec.gateway_class_name
            ),
            _ => class = Some(gw.spec.gateway_class_name.clone()),
        }
    } else if class.is_none()
        && !snapshot
            .gateway_classes
            .iter()
            .any(|c| c.spec.controller_name == args.controller_name)
    {
        bail!(
            "no GatewayClass with controllerName {} in the manifests; pass --gateway-class-name or --gateway",
            args.controller_name
        );
    }

    let options = Options {
        controller_name: args.controller_name.clone(),
        gateway_class_name: class,
        cluster_domain: args.cluster_domain.clone(),
    };
    let output = translate::translate(&snapshot, &options);
    write_statuses(err, &output)?;

    if args.all_planes {
        serde_json::to_writer_pretty(&mut *out, &output.configs).context("writing the configs")?;
        writeln!(out)?;
        return Ok(());
    }
    let plane = match &args.gateway {
        None => PlaneKey::Shared,
        Some(GatewayName(key)) => match output.planes.get(key) {
            Some(plane) => plane.clone(),
            None => bail!("Gateway {key} is not accepted, so no data plane serves it"),
        },
    };
    let config = output
        .configs
        .get(&plane)
        .with_context(|| format!("no config for the {plane} plane"))?;
    serde_json::to_writer_pretty(&mut *out, config).context("writing the config")?;
    writeln!(out)?;
    Ok(())
}

fn load_path(snapshot: &mut Snapshot, path: &Path) -> anyhow::Result<()> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if meta.is_dir() {
        let mut entries = Vec::new();
        for entry in
            std::fs::read_dir(path).with_context(|| format!("reading {}", path.display()))?
        {
            let p = entry?.path();
            let manifest = p
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
            if manifest || p.is_dir() {
                entries.push(p);
            }
        }
        entries.sort();
        for p in entries {
            load_path(snapshot, &p)?;
        }
        return Ok(());
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    manifest::load_into(snapshot, &text, &path.display().to_string())?;
    Ok(())
}

/// Human-readable conditions, one object per line and one listener or parent per indented line.
pub fn write_statuses(w: &mut impl Write, output: &Output) -> std::io::Result<()> {
    let Statuses {
        gateway_classes,
        gateways,
        routes,
    } = &output.statuses;
    let join = |conditions: &[translate::Condition]| {
        conditions
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    };
    for (name, conditions) in gateway_classes {
        writeln!(w, "GatewayClass {name}: {}", join(conditions))?;
    }
    for (key, status) in gateways {
        let plane = output
            .planes
            .get(key)
            .map_or_else(|| "no plane".to_owned(), ToString::to_string);
        writeln!(w, "Gateway {key} ({plane}): {}", join(&status.conditions))?;
        for l in &status.listeners {
            writeln!(
                w,
                "  listener {}: attachedRoutes={}; {}",
                l.name,
                l.attached_routes,
                join(&l.conditions)
            )?;
        }
    }
    for (key, parents) in routes {
        writeln!(w, "{key}")?;
        for p in parents {
            writeln!(w, "  parent {}: {}", p.parent_ref, join(&p.conditions))?;
        }
    }
    Ok(())
}
