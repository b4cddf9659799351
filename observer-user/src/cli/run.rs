//! `observer run`: the agent as the DaemonSet runs it. Kernel → PLEG → reconciler (CRI) →
//! status manager (Kubernetes API), with `/metrics`, `/healthz` and `/readyz` on `--listen`.
//!
//! SIGTERM flushes pending status writes (up to `--shutdown-timeout`) and detaches the probes.
//! A part that dies (the kernel reader, the reconciler) ends the process with an error: kubelet
//! restarts it, and a restarted agent converges from the cgroup walk, the runtime's relist and
//! the API's current statuses (it never writes a status older than the API's: each write is
//! computed from the newest view and compared with what the API has).
use std::{net::SocketAddr, path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context;

use crate::{
    agent::{feed, http, metrics::Metrics, metrics::Sources, Agent, AgentConfig},
    cri::CriEndpoint,
    kube::{self, StatusConfig, StatusManager, StatusMode},
};

/// The agent's port: metrics, health and readiness.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9891";

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// This node's name (the DaemonSet sets NODE_NAME from spec.nodeName). Required unless
    /// --status-mode off.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,
    /// kubeconfig to reach the API server; default: the in-cluster service account.
    #[arg(long, env = "KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// CRI socket (a path or unix:///path). Default: containerd's, else CRI-O's.
    #[arg(long, env = "OBSERVER_CRI_ENDPOINT", value_name = "ENDPOINT")]
    pub cri_endpoint: Option<CriEndpoint>,
    /// Where the host's cgroup filesystems are mounted in the agent's container.
    #[arg(long, env = "OBSERVER_CGROUPFS", value_name = "DIR")]
    pub cgroupfs: Option<PathBuf>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "OBSERVER_LISTEN", value_name = "ADDR", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// What reaches the API: conditions (two observer-owned pod conditions beside kubelet),
    /// audit (Events where kubelet's status disagrees with the kernel), full (the whole pod
    /// status, where nothing else writes it), off.
    #[arg(
        long,
        env = "OBSERVER_STATUS_MODE",
        value_name = "MODE",
        default_value = "conditions"
    )]
    pub status_mode: StatusMode,
    /// Domain of the observer-owned condition types (<prefix>/ContainersAlive, <prefix>/OOMKilled).
    #[arg(
        long,
        env = "OBSERVER_CONDITION_PREFIX",
        value_name = "DOMAIN",
        default_value = "observer.dev"
    )]
    pub condition_prefix: String,
    /// Seconds between safety relists of the runtime.
    #[arg(
        long,
        env = "OBSERVER_RELIST_PERIOD",
        value_name = "SECONDS",
        default_value_t = 60
    )]
    pub relist_period: u64,
    /// Where container inits are kept across restarts of the agent (this boot only).
    #[arg(
        long,
        env = "OBSERVER_STATE_DIR",
        value_name = "DIR",
        default_value = "/run/observer"
    )]
    pub state_dir: PathBuf,
    /// Seconds SIGTERM waits for pending status writes before the agent exits.
    #[arg(
        long,
        env = "OBSERVER_SHUTDOWN_TIMEOUT",
        value_name = "SECONDS",
        default_value_t = 10
    )]
    pub shutdown_timeout: u64,
    /// /healthz fails when the kernel reader or the reconciler has not turned for this many
    /// seconds (both turn every 5 s at the least).
    #[arg(
        long,
        env = "OBSERVER_HEALTH_STALE_AFTER",
        value_name = "SECONDS",
        default_value_t = 60
    )]
    pub health_stale_after: u64,
    #[command(flatten)]
    pub realtime: super::RealtimeArg,
}

pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let endpoint = args
        .cri_endpoint
        .clone()
        .unwrap_or_else(CriEndpoint::detect);
    // Checked before anything is loaded: a misconfigured agent says so at once.
    let node = match args.status_mode {
        StatusMode::Off => None,
        _ => Some(kube::node_name(args.node_name.as_deref())?),
    };
    let mut metrics = Metrics::new();
    let mut cfg = AgentConfig::new(endpoint.clone());
    cfg.cgroupfs = args.cgroupfs.clone();
    cfg.reconcile.relist_period = Duration::from_secs(args.relist_period.max(1));
    cfg.reconcile.state_dir = Some(args.state_dir.clone());
    cfg.reconcile.detection_latency = Some(metrics.detection_latency.clone());
    cfg.reader = super::reader_thread(args.realtime.realtime_priority);
    let mut agent = Agent::start(cfg).await?;
    let listener = http::bind(args.listen).await?;

    let status = match node {
        None => None,
        Some(node) => {
            let client = kube::client(args.kubeconfig.as_deref()).await?;
            let mut scfg = StatusConfig::new(node, args.status_mode);
            scfg.condition_prefix = args.condition_prefix.clone();
            scfg.runtime_name = super::runtime_name(&agent, &endpoint).await;
            scfg.write_latency = Some(metrics.status_write_latency.clone());
            let (manager, handle) = StatusManager::new(client, scfg);
            tokio::spawn(manager.run());
            Some(handle)
        }
    };
    metrics.collect(Sources {
        pipeline: agent.pipeline(),
        probes: agent.probes(),
        reconcile: agent.reconcile.clone(),
        cri: agent.cri.clone(),
        status: status.clone(),
    });
    let metrics = Arc::new(metrics);
    let health = http::Health {
        pipeline: agent.pipeline(),
        reconcile: agent.reconcile.clone(),
        stale_after: Duration::from_secs(args.health_stale_after.max(10)),
    };
    let server = AbortOnDrop(tokio::spawn(http::serve(
        listener,
        Arc::clone(&metrics),
        health,
    )));
    let feed = AbortOnDrop(tokio::spawn(feed::run(
        agent.reconcile.clone(),
        status.clone(),
        metrics.oom_kills.clone(),
    )));
    tracing::info!(listen = %args.listen, mode = %args.status_mode, %endpoint, "agent running");

    tokio::select! {
        _ = super::shutdown_signal() => {}
        e = agent.failed() => return Err(e).context("the agent cannot go on"),
    }
    tracing::info!("stopping: flushing pending status writes");
    if let Some(h) = &status {
        let left = h.flush(Duration::from_secs(args.shutdown_timeout)).await;
        if left.unwritten > 0 || left.events_pending > 0 {
            tracing::warn!(
                unwritten = left.unwritten,
                events = left.events_pending,
                "stopped with writes still pending (the next agent writes the current state)"
            );
        }
    }
    drop((feed, server));
    Ok(ExitCode::SUCCESS)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
