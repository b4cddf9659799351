//! The kubectl plugin: `kubectl observer explain POD [CONTAINER]` (the binary installed as
//! `kubectl-observer` on the PATH; `observer kubectl ...` is the same). It finds the pod's node
//! and asks that node's agent, through the API server's pod proxy.
use std::{ffi::OsString, process::ExitCode};

use anyhow::Context;

use crate::present::remote::{self, Agents};

#[derive(Debug, clap::Args)]
pub struct KubectlArgs {
    #[command(subcommand)]
    pub command: KubectlCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum KubectlCommand {
    /// A pod's lifecycle and OOM kills in full, from the agent on its node.
    Explain(ExplainArgs),
}

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    pub pod: String,
    pub container: Option<String>,
    #[arg(short, long, default_value = "default")]
    pub namespace: String,
    /// `text` or `json`.
    #[arg(short = 'o', long = "output", default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
    /// kubeconfig files (else KUBECONFIG, ~/.kube/config, the in-cluster account).
    #[arg(long, value_name = "FILES")]
    pub kubeconfig: Option<OsString>,
    /// The agents' namespace, label selector and port (deploy/'s by default).
    #[arg(long, default_value = "observer-system")]
    pub agent_namespace: String,
    #[arg(long, default_value = "app.kubernetes.io/name=observer")]
    pub agent_selector: String,
    #[arg(long, default_value_t = 9891)]
    pub agent_port: u16,
}

pub(super) async fn run(args: KubectlArgs) -> anyhow::Result<ExitCode> {
    let KubectlCommand::Explain(a) = args.command;
    // Without kube's retries of 429, 503 and 504 (up to 15, backing off for minutes): the pod
    // proxy's 503 for an agent it cannot reach must be told at once.
    let config = crate::kube::config(a.kubeconfig.as_deref(), false).await?;
    let url = config.cluster_url.to_string();
    // Resolved before anything is asked: a user without a token is told so at once.
    let token = remote::caller_token(&config)
        .await
        .context("the agent's access check")?;
    let client = ::kube::Client::try_from(config).context("the kubeconfig")?;
    let agents = Agents {
        namespace: a.agent_namespace,
        selector: a.agent_selector,
        port: a.agent_port,
    };
    let body = remote::explain(
        &client,
        &token,
        &agents,
        &a.namespace,
        &a.pod,
        a.container.as_deref(),
        a.output == "text",
    )
    .await
    .with_context(|| format!("API server {url}"))?;
    // The agent escapes what it prints; the plugin does not rely on it (whatever answered on the
    // agent's port wrote this body): every line is escaped again before it reaches the terminal.
    for line in body.lines() {
        println!("{}", crate::model::Printable(line));
    }
    Ok(ExitCode::SUCCESS)
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

    #[test]
    fn kubectl_observer_is_observer_kubectl() {
        let args = plugin_args(
            [
                "/usr/local/bin/kubectl-observer",
                "explain",
                "web",
                "-n",
                "shop",
            ]
            .map(OsString::from),
        );
        let cli = Cli::try_parse_from(args).unwrap();
        let Command::Kubectl(k) = cli.command else {
            panic!("{:?}", cli.command)
        };
        let KubectlCommand::Explain(e) = k.command;
        assert_eq!(
            (e.pod.as_str(), e.namespace.as_str(), e.agent_port),
            ("web", "shop", 9891)
        );
        // As `observer` the arguments are left alone.
        let same = plugin_args(["observer", "status"].map(OsString::from));
        assert_eq!(same, ["observer", "status"].map(OsString::from));
    }
}
