//! `observer run`: the agent with the status manager and the HTTP endpoint, until a shutdown or a
//! failure.
//!
//! The path of a death: the kernel → the PLEG → the reconciler's view, which marks the pod
//! changed → the status manager takes it from there (one queue) → the writer's PATCH. In
//! `conditions` mode the ContainersAlive=False transition also takes the fast path: decided and
//! sent on the kernel reader's own thread, real-time with `--realtime-priority`
//! ([`crate::fastpath`]), which neither the CRI nor the status manager can hold up.
use std::{ffi::OsString, future::Future, net::SocketAddr, sync::Arc, time::Duration};

use super::{
    access::{Gate, MetricsAccess},
    http,
    metrics::{Metrics, Sources},
    Agent, AgentConfig, AgentParts, FastSetup, Writers,
};
use crate::{
    kube,
    reconcile::inits::StateAccess,
    status::{StatusConfig, StatusMode},
    Error,
};

/// What `observer run` starts.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub agent: AgentConfig,
    /// `/metrics`, `/healthz`, `/readyz`.
    pub listen: SocketAddr,
    /// Who may read `/metrics` ([`super::access`]).
    pub metrics_access: MetricsAccess,
    /// `None`: nothing reaches the API (`--status-mode off`).
    pub status: Option<StatusSetup>,
    /// `/healthz` fails when a loop has not turned for this long.
    pub health_stale_after: Duration,
    /// How long a shutdown waits for pending writes.
    pub shutdown_timeout: Duration,
    /// `conditions` mode: the fast path writes ContainersAlive=False ([`crate::fastpath`]).
    pub fast_path: bool,
}

/// The status manager's settings and where the API is.
#[derive(Clone, Debug)]
pub struct StatusSetup {
    pub status: StatusConfig,
    /// `--kubeconfig` (else `KUBECONFIG`): one file or a list.
    pub kubeconfig: Option<OsString>,
}

/// Runs the agent until `shutdown` resolves (then flushes pending writes) or a part of it fails.
pub async fn run(cfg: RunConfig, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    let mut agent_cfg = cfg.agent;
    agent_cfg.reconcile.state_access = StateAccess::ReadWrite;
    let endpoint = agent_cfg.cri.clone();
    let mut parts = AgentParts::for_node(agent_cfg)?;
    let mut reviews = None;
    // A kubeconfig that cannot be read is refused before anything is loaded.
    if let Some(setup) = cfg.status {
        let api = kube::client(setup.kubeconfig.as_deref()).await?;
        let mut status = setup.status;
        status.api_url = api.url;
        // The fast path runs on the kernel reader's thread from the start; it decides deaths
        // from what the status manager last computed, so it writes nothing before the
        // manager's first turn on a pod.
        let fast = cfg.fast_path.then(|| FastSetup {
            kubeconfig: setup.kubeconfig.clone(),
        });
        reviews = Some(api.client.clone());
        parts.writers = Some(Writers {
            client: api.client,
            status,
            fast,
        });
    }
    let mut agent = Agent::build(parts).await?;
    let listener = http::bind(cfg.listen).await.map_err(Error::Listen)?;
    let listen = listener.local_addr().map_err(Error::Listen)?;
    let gate = Arc::new(Gate::new(cfg.metrics_access, reviews));
    gate.warn_if_unusable();
    let metrics = Metrics::new(Some(Sources {
        cri: Some(agent.runtime.clone()),
        access: Some(Arc::clone(&gate)),
        ..agent.metric_sources()
    }));
    let health = http::Health {
        pipeline: agent.pipeline(),
        reconcile: agent.reconcile.clone(),
        cri: agent.runtime.clone(),
        tasks: agent.task_health(),
        api: agent.status.clone(),
        stale_after: cfg.health_stale_after,
    };
    agent.spawn(
        "HTTP endpoint",
        http::serve(listener, Arc::new(metrics), health, gate),
    );
    let mode = agent.status.as_ref().map_or(StatusMode::Off, |s| s.mode());
    tracing::info!(%listen, %mode, %endpoint, fast_path = agent.fast.is_some(), metrics_access = ?cfg.metrics_access, "agent running");

    tokio::select! {
        _ = shutdown => {}
        e = agent.failed() => return Err(e),
    }
    tracing::info!("stopping: flushing pending status writes");
    if let Some(h) = &agent.status {
        let left = h.flush(cfg.shutdown_timeout).await;
        if left.unwritten > 0 || left.events_pending > 0 {
            tracing::warn!(
                unwritten = left.unwritten,
                events = left.events_pending,
                "stopped with writes still pending (the next agent writes the current state)"
            );
        }
    }
    Ok(())
}
