//! `observer run`: the agent as the DaemonSet runs it. Kernel → PLEG → reconciler (CRI) →
//! status manager (Kubernetes API), with `/metrics`, `/healthz` and `/readyz` on `--listen`.
//!
//! This file parses the flags; [`agent::run`] runs it all. SIGTERM flushes pending status writes
//! (up to `--shutdown-timeout`) and detaches the probes. A part that dies (the kernel reader, the
//! reconciler, the status manager, the Events worker, the HTTP endpoint) ends the process with an
//! error: kubelet restarts it, and a restarted agent converges from the cgroup walk, the runtime's relist and
//! the API's current statuses (it never writes a status older than the API's: each write is
//! computed from the newest view and compared with what the API has).
use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context;

use crate::{
    agent::{self, AgentConfig, RunConfig, StatusSetup},
    cri::CriEndpoint,
    kube,
    status::{StatusConfig, StatusMode},
};

/// The agent's port: metrics, health and readiness.
pub(crate) const DEFAULT_LISTEN: &str = "0.0.0.0:9891";

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// This node's name (the DaemonSet sets NODE_NAME from spec.nodeName). Required unless
    /// --status-mode off.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,
    /// kubeconfig to reach the API server: a file or a list (`a:b`, merged as kubectl does).
    /// Default: KUBECONFIG, else ~/.kube/config, else the in-cluster service account.
    // Not clap's `env`: it reads `KUBECONFIG=` as a missing value, where kubectl ignores it.
    #[arg(long, value_name = "PATHS")]
    pub kubeconfig: Option<std::ffi::OsString>,
    /// CRI socket (a path or unix:///path). Default: containerd's, else CRI-O's.
    #[arg(long, env = "OBSERVER_CRI_ENDPOINT", value_name = "ENDPOINT")]
    pub cri_endpoint: Option<CriEndpoint>,
    /// Where the host's cgroup filesystems are mounted in the agent's container.
    #[arg(long, env = "OBSERVER_CGROUPFS", value_name = "DIR")]
    pub cgroupfs: Option<PathBuf>,
    #[command(flatten)]
    pub cgroup_root: super::CgroupRootArg,
    /// Address of /metrics, /healthz and /readyz (nothing about any pod is served: a pod's
    /// deaths and OOM kills are its PodReport, read through the API server).
    #[arg(long, env = "OBSERVER_LISTEN", value_name = "ADDR", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Who may read /metrics, whose OOM-kill and limit-hit series name pods: token-review (a
    /// caller who may get the non-resource URL /metrics, as kubelet and kube-rbac-proxy check),
    /// or open (anyone who reaches --listen: only where no tenant can).
    #[arg(
        long,
        env = "OBSERVER_METRICS_ACCESS",
        value_name = "ACCESS",
        value_enum,
        default_value = "token-review"
    )]
    pub metrics_access: agent::access::MetricsAccess,
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
        default_value = "observer.dev",
        value_parser = condition_prefix
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
    /// `conditions` mode: write ContainersAlive=False straight from the kernel's event on a
    /// thread of its own (real-time with --realtime-priority), beside the status manager.
    /// `false` leaves every write to the status manager (the path before the fast path).
    #[arg(
        long,
        env = "OBSERVER_FAST_PATH",
        value_name = "BOOL",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub fast_path: bool,
    #[command(flatten)]
    pub realtime: super::RealtimeArg,
}

pub(super) async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    // Checked before anything is loaded: a misconfigured agent says so at once.
    let status = match args.status_mode {
        StatusMode::Off => None,
        mode => {
            let mut status = StatusConfig::new(kube::node_name(args.node_name.as_deref())?, mode);
            status.condition_prefix = args.condition_prefix;
            Some(StatusSetup {
                status,
                kubeconfig: args.kubeconfig,
            })
        }
    };
    let mut agent = AgentConfig::new(args.cri_endpoint.unwrap_or_else(CriEndpoint::detect));
    agent.cgroupfs = args.cgroupfs;
    agent.cgroup_roots = args.cgroup_root.cgroup_roots;
    agent.reconcile.relist_period = Duration::from_secs(args.relist_period.max(1));
    agent.reconcile.state_dir = Some(args.state_dir);
    agent.reader = super::reader_thread(args.realtime.realtime_priority);
    let cfg = RunConfig {
        agent,
        listen: args.listen,
        metrics_access: args.metrics_access,
        status,
        health_stale_after: Duration::from_secs(args.health_stale_after.max(10)),
        shutdown_timeout: Duration::from_secs(args.shutdown_timeout),
        fast_path: args.fast_path,
    };
    agent::run(cfg, super::shutdown_signal())
        .await
        .context("the agent cannot go on")?;
    Ok(ExitCode::SUCCESS)
}

/// `--condition-prefix`: refused at start unless the API would accept the condition types.
fn condition_prefix(s: &str) -> Result<String, kube::KubeError> {
    crate::status::check_prefix(s)?;
    Ok(s.to_string())
}
