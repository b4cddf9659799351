//! The kubectl plugin (the binary installed as `kubectl-observer` on the PATH; `observer kubectl
//! ...` is the same): what the agents know of pods, read from their PodReports through the API
//! server with the user's own kubeconfig and rights, as kubectl reads any object. No agent is
//! asked, and the user's credentials go nowhere but to the API server.
//!
//! - `kubectl observer explain POD [CONTAINER]`: one pod's lifecycle and OOM kills in full;
//! - `kubectl observer status [-n NS | -A] [-l SELECTOR]`: the pods the agents reported on, with
//!   their deaths, OOM kills and warnings.
use std::{collections::HashMap, ffi::OsString, process::ExitCode};

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::{api::ListParams, Api};

use crate::present::{
    explain::render_text,
    remote,
    report::{PodReport, Summary},
};

#[derive(Debug, clap::Args)]
pub struct KubectlArgs {
    #[command(flatten)]
    pub kube: KubeFlags,
    #[command(subcommand)]
    pub command: KubectlCommand,
}

/// kubectl's own flags for which cluster, user and namespace.
#[derive(Debug, Clone, clap::Args)]
pub struct KubeFlags {
    /// The namespace (default: the kubeconfig context's, else `default`).
    #[arg(short, long, global = true)]
    pub namespace: Option<String>,
    /// The kubeconfig context to use (default: the current one).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// kubeconfig files (default: KUBECONFIG, ~/.kube/config, the in-cluster account).
    #[arg(long, value_name = "FILES", global = true)]
    pub kubeconfig: Option<OsString>,
}

#[derive(Debug, clap::Subcommand)]
pub enum KubectlCommand {
    /// A pod's lifecycle (each container instance, its exit and how it is known) and its OOM
    /// kills in full, from its PodReport.
    Explain(ExplainArgs),
    /// The pods the agents reported on (deaths, OOM kills, memory warnings), like `kubectl get`.
    Status(StatusArgs),
}

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// The pod.
    pub pod: String,
    /// Only this container's instances, kills and warnings.
    pub container: Option<String>,
    /// `text` (as `kubectl describe`), `json` or `yaml` (the report).
    #[arg(short = 'o', long = "output", default_value = "text", value_parser = ["text", "json", "yaml"])]
    pub output: String,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Every namespace.
    #[arg(short = 'A', long = "all-namespaces", conflicts_with = "namespace")]
    pub all_namespaces: bool,
    /// Only pods matching this label selector (as `kubectl get pods -l`).
    #[arg(short = 'l', long = "selector")]
    pub selector: Option<String>,
    /// `wide` (adds the node), `json` or `yaml` (a List of the PodReports).
    #[arg(short = 'o', long = "output", value_parser = ["wide", "json", "yaml"])]
    pub output: Option<String>,
    /// Print no header line.
    #[arg(long)]
    pub no_headers: bool,
}

pub(super) async fn run(args: KubectlArgs) -> anyhow::Result<ExitCode> {
    // Without kube's retries of 429, 503 and 504 (up to 15, backing off for minutes): what the
    // API server refuses is told at once.
    let config = crate::kube::config_in_context(
        args.kube.kubeconfig.as_deref(),
        args.kube.context.as_deref(),
        false,
    )
    .await?;
    let url = config.cluster_url.to_string();
    let namespace = args
        .kube
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = ::kube::Client::try_from(config).context("the kubeconfig")?;
    match args.command {
        KubectlCommand::Explain(a) => explain(&client, &namespace, a)
            .await
            .with_context(|| format!("API server {url}")),
        KubectlCommand::Status(a) => status(&client, &namespace, a)
            .await
            .with_context(|| format!("API server {url}")),
    }
}

async fn explain(
    client: &kube::Client,
    namespace: &str,
    a: ExplainArgs,
) -> anyhow::Result<ExitCode> {
    let mut report = remote::report(client, namespace, &a.pod).await?;
    if let Some(c) = &a.container {
        report = report.only_container(c);
    }
    let body = match a.output.as_str() {
        "json" => serde_json::to_string_pretty(&report)? + "\n",
        "yaml" => serde_saphyr::to_string(&report)?,
        _ => {
            let mut text = render_text(&report.explanation);
            text.push_str(&format!(
                "Reported by: the observer agent of node {}\n",
                report.node_name
            ));
            text
        }
    };
    // Whatever wrote the report (an agent, or anyone allowed to write PodReports) chose its
    // words: every line is escaped before it reaches the terminal.
    for line in body.lines() {
        println!("{}", crate::model::Printable(line));
    }
    Ok(ExitCode::SUCCESS)
}

async fn status(client: &kube::Client, namespace: &str, a: StatusArgs) -> anyhow::Result<ExitCode> {
    let (reports, pods): (Api<PodReport>, Api<Pod>) = if a.all_namespaces {
        (Api::all(client.clone()), Api::all(client.clone()))
    } else {
        (
            Api::namespaced(client.clone(), namespace),
            Api::namespaced(client.clone(), namespace),
        )
    };
    let mut list = reports
        .list(&ListParams::default())
        .await
        .map_err(|e| forbidden_or(e, "list podreports", namespace, a.all_namespaces))?
        .items;
    if let Some(selector) = &a.selector {
        // The selector is the pods': reports of the pods it selects (the same uid).
        let selected: HashMap<(String, String), String> = pods
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(|e| forbidden_or(e, "list pods", namespace, a.all_namespaces))?
            .items
            .into_iter()
            .filter_map(|p| {
                let m = p.metadata;
                Some(((m.namespace?, m.name?), m.uid?))
            })
            .collect();
        list.retain(|r| {
            let key = (
                r.metadata.namespace.clone().unwrap_or_default(),
                r.metadata.name.clone().unwrap_or_default(),
            );
            selected.get(&key) == Some(&r.pod_uid)
        });
    }
    list.sort_by(|x, y| {
        (&x.metadata.namespace, &x.metadata.name).cmp(&(&y.metadata.namespace, &y.metadata.name))
    });
    let out = match a.output.as_deref() {
        Some("json") | Some("yaml") => {
            let doc = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": list});
            if a.output.as_deref() == Some("json") {
                serde_json::to_string_pretty(&doc)? + "\n"
            } else {
                serde_saphyr::to_string(&doc)?
            }
        }
        wide => table(
            &list,
            a.all_namespaces,
            wide == Some("wide"),
            !a.no_headers,
            std::time::SystemTime::now(),
        ),
    };
    if out.is_empty() && !a.no_headers {
        eprintln!(
            "No PodReports found{}.",
            if a.all_namespaces {
                String::new()
            } else {
                format!(" in {namespace} namespace")
            }
        );
    }
    for line in out.lines() {
        println!("{}", crate::model::Printable(line));
    }
    Ok(ExitCode::SUCCESS)
}

fn forbidden_or(e: kube::Error, need: &str, namespace: &str, all: bool) -> anyhow::Error {
    let scope = if all {
        "at the cluster scope (-A)".to_string()
    } else {
        format!("in namespace {namespace}")
    };
    match e {
        kube::Error::Api(s) if s.code == 403 => anyhow::anyhow!(
            "not allowed to {need} {scope} ({}); the ClusterRole observer-reports-reader \
             (deploy/plugin-rbac.yaml, aggregated into view) grants it",
            s.message
        ),
        kube::Error::Api(s) if s.code == 404 => anyhow::anyhow!(
            "the CRD podreports.observer.dev is not installed in this cluster (deploy/crd.yaml, \
             or the chart): {}",
            s.message
        ),
        e => anyhow::Error::new(e).context(format!("{need} {scope}")),
    }
}

/// kubectl's columns: `NAMESPACE` (with -A), `NAME`, `DEATHS`, `OOM-KILLS`, `WARNINGS`, the last
/// death and the last OOM kill with their age; `wide` adds the node.
fn table(
    list: &[PodReport],
    all_namespaces: bool,
    wide: bool,
    headers: bool,
    now: std::time::SystemTime,
) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    if headers && !list.is_empty() {
        let mut h = vec![];
        if all_namespaces {
            h.push("NAMESPACE");
        }
        h.extend([
            "NAME",
            "DEATHS",
            "OOM-KILLS",
            "WARNINGS",
            "LAST DEATH",
            "LAST OOM KILL",
        ]);
        if wide {
            h.push("NODE");
        }
        rows.push(h.into_iter().map(String::from).collect());
    }
    for r in list {
        let s: &Summary = &r.summary;
        let mut row = vec![];
        if all_namespaces {
            row.push(r.metadata.namespace.clone().unwrap_or_default());
        }
        row.push(r.metadata.name.clone().unwrap_or_default());
        row.push(s.deaths.to_string());
        row.push(s.oom_kills.to_string());
        row.push(s.warnings.to_string());
        for d in [&s.last_death, &s.last_oom_kill] {
            row.push(match d {
                Some(d) => match d.time.as_deref().and_then(|t| age(t, now)) {
                    Some(a) => format!("{} ({a} ago)", d.description),
                    None => d.description.clone(),
                },
                None => "<none>".into(),
            });
        }
        if wide {
            row.push(r.node_name.clone());
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows.first().map_or(0, Vec::len))
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let last = r.len() - 1;
        for (i, cell) in r.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                out.push_str(&" ".repeat(widths[i] - cell.chars().count() + 3));
            }
        }
        out.push('\n');
    }
    out
}

/// kubectl's short age (`5m`, `3h`, `2d`) of an RFC 3339 time.
fn age(rfc3339: &str, now: std::time::SystemTime) -> Option<String> {
    let t: k8s_openapi::jiff::Timestamp = rfc3339.parse().ok()?;
    let then = std::time::SystemTime::from(t);
    let secs = now.duration_since(then).ok()?.as_secs();
    Some(match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    })
}

/// The arguments as `observer` parses them: run as `kubectl-observer` (kubectl's plugin name),
/// the plugin's arguments follow `observer kubectl`.
pub fn plugin_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut args: Vec<OsString> = args.into_iter().collect();
    let invoked = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|n| n == "kubectl-observer");
    if invoked {
        args.insert(1, "kubectl".into());
    }
    args
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> KubectlArgs {
        let cli = Cli::try_parse_from(plugin_args(args.iter().map(OsString::from))).unwrap();
        let Command::Kubectl(k) = cli.command else {
            panic!("{:?}", cli.command)
        };
        k
    }

    #[test]
    fn kubectl_observer_is_observer_kubectl_with_kubectls_flags() {
        let k = parse(&[
            "/usr/local/bin/kubectl-observer",
            "explain",
            "web",
            "-n",
            "shop",
            "--context",
            "prod",
        ]);
        let KubectlCommand::Explain(e) = k.command else {
            panic!()
        };
        assert_eq!(e.pod, "web");
        assert_eq!(k.kube.namespace.as_deref(), Some("shop"));
        assert_eq!(k.kube.context.as_deref(), Some("prod"));
        // The namespace is the context's unless given.
        let k = parse(&[
            "kubectl-observer",
            "status",
            "-A",
            "-l",
            "app=web",
            "-o",
            "wide",
        ]);
        assert_eq!(k.kube.namespace, None);
        let KubectlCommand::Status(s) = k.command else {
            panic!()
        };
        assert!(s.all_namespaces && s.selector.as_deref() == Some("app=web"));
        // As `observer` the arguments are left alone.
        let same = plugin_args(["observer", "status"].map(OsString::from));
        assert_eq!(same, ["observer", "status"].map(OsString::from));
    }

    #[test]
    fn the_table_reads_like_kubectls() {
        let now = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        let report: PodReport = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "nodeName": "node-7", "podUID": "u-1",
            "summary": {"deaths": 2, "oomKills": 1, "warnings": 0,
                        "lastDeath": {"container": "main", "time": "2027-01-15T07:55:00Z",
                                      "description": "main: OOMKilled (137)"}},
            "explanation": {"namespace": "shop", "name": "web", "uid": "u-1",
                            "instances": [], "warnings": [], "kills": [],
                            "kubelet": {"unavailable": null, "containers": []}}
        }))
        .unwrap();
        let t = table(std::slice::from_ref(&report), true, true, true, now);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("NAMESPACE   NAME   DEATHS"), "{t}");
        assert!(
            lines[1].starts_with("shop        web    2 ")
                && lines[1].contains("main: OOMKilled (137) (5m ago)")
                && lines[1].contains("<none>")
                && lines[1].ends_with("node-7"),
            "{t}"
        );
        assert_eq!(
            table(&[report], false, false, false, now).lines().count(),
            1
        );
        assert_eq!(table(&[], false, false, true, now), "");
    }
}
