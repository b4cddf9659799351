//! `observer explain POD [CONTAINER]`: one pod's lifecycle and OOM kills in full, from the agent's
//! own record (the runtime over CRI corrected by the kernel and the kernel log), like `kubectl
//! describe` would print them if it knew. Read-only: the state directory is read, never written;
//! with `--kubeconfig` the pod is read from the API (one GET) for kubelet's account beside it.
use std::{io::Write, path::PathBuf, process::ExitCode};

use anyhow::bail;
use k8s_openapi::api::core::v1::Pod;

use crate::{
    agent::AgentConfig,
    cri::CriEndpoint,
    kube::pods::is_pod_of,
    present::explain::{explain, render_text},
};

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// The pod's name.
    pub pod: String,
    /// Only this container.
    pub container: Option<String>,
    /// The pod's namespace. Default: any (a name in two namespaces is refused).
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// `text` or `json` (the document a pod's PodReport holds as `explanation`).
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// CRI socket (a path or unix:///path). Default: containerd's, else CRI-O's.
    #[arg(long, value_name = "ENDPOINT")]
    pub cri_endpoint: Option<CriEndpoint>,
    /// Where the host's cgroup filesystems are mounted, when observer runs in a container.
    #[arg(long, value_name = "DIR")]
    pub cgroupfs: Option<PathBuf>,
    #[command(flatten)]
    pub cgroup_root: super::CgroupRootArg,
    /// Read the pod from the Kubernetes API (one GET; kubeconfig path, or `-` for KUBECONFIG,
    /// ~/.kube/config, then the in-cluster account), to show what kubelet reported for each
    /// container beside the agent's record, and the spec's memory limits.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    pub state: super::StateDirArg,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

pub(super) async fn run(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    let endpoint = args
        .cri_endpoint
        .clone()
        .unwrap_or_else(CriEndpoint::detect);
    let mut cfg = AgentConfig::new(endpoint.clone());
    cfg.cgroupfs = args.cgroupfs.clone();
    cfg.cgroup_roots = args.cgroup_root.cgroup_roots.clone();
    cfg.reconcile.state_dir = Some(args.state.state_dir.clone());
    let agent = super::start_reader(cfg, "the pod may be missing").await?;
    let pods = agent.reconcile.pods();
    let found: Vec<_> = pods
        .iter()
        .filter(|p| p.name == args.pod)
        .filter(|p| args.namespace.as_ref().is_none_or(|n| *n == p.namespace))
        .collect();
    let view = match found.as_slice() {
        [one] => *one,
        [] => bail!("no pod {} on this node", args.pod),
        many => bail!(
            "pod {} is in several namespaces ({}): say which with -n",
            args.pod,
            many.iter()
                .map(|p| p.namespace.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    if let Some(c) = &args.container {
        if !view.containers.iter().any(|v| v.name == *c) {
            bail!("pod {}/{} has no container {c}", view.namespace, view.name);
        }
    }
    let api = match &args.kubeconfig {
        Some(path) => api_pod(path, view).await?,
        None => Err("not read: the API's pod is read with --kubeconfig PATH".to_string()),
    };
    let e = explain(
        view,
        args.container.as_deref(),
        api.as_ref().map_err(String::as_str),
    );
    let mut out = std::io::stdout().lock();
    match args.output {
        Output::Text => out.write_all(render_text(&e).as_bytes())?,
        Output::Json => {
            serde_json::to_writer_pretty(&mut out, &e)?;
            out.write_all(b"\n")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The API's pod of `view` (`Err`: why there is none); an API that cannot be asked is an error.
async fn api_pod(
    path: &std::path::Path,
    view: &crate::reconcile::PodView,
) -> anyhow::Result<Result<Pod, String>> {
    let path = (path.as_os_str() != "-").then_some(path.as_os_str());
    let api = crate::kube::client(path).await?;
    let pods: ::kube::Api<Pod> = ::kube::Api::namespaced(api.client.clone(), &view.namespace);
    let pod = pods.get_opt(&view.name).await.map_err(|e| {
        anyhow::anyhow!(
            "reading pod {}/{}: {}",
            view.namespace,
            view.name,
            crate::kube::describe_api_error(&e, &api.url)
        )
    })?;
    Ok(match pod {
        Some(p) if is_pod_of(&p, view.uid.as_str()) => Ok(p),
        Some(p) => Err(format!(
            "the API's pod {}/{} is another pod (UID {}), not this node's {}",
            view.namespace,
            view.name,
            p.metadata.uid.as_deref().unwrap_or("?"),
            view.uid
        )),
        None => Err(format!(
            "the API has no pod {}/{}",
            view.namespace, view.name
        )),
    })
}
