//! `observer run`: the agent with the status manager and the HTTP endpoint, until a shutdown or a
//! failure.
//!
//! The path of a death: the kernel → the PLEG → the reconciler's view, which marks the pod
//! changed → the status manager takes it from there (one queue) → the writer's PATCH. In
//! `conditions` mode the ContainersAlive=False transition also takes the fast path: decided and
//! sent on the kernel reader's own thread, real-time with `--realtime-priority`
//! ([`crate::kube::fast`]), which neither the CRI nor the status manager can hold up.
use std::{
    ffi::OsString,
    future::Future,
    net::SocketAddr,
    sync::{Arc, OnceLock},
    time::Duration,
};

use super::{http, metrics::Metrics, metrics::Sources, Agent, AgentConfig};
use crate::{
    fastpath as fast, kube,
    pipeline::ReaderThread,
    reconcile::inits::StateAccess,
    status::{self, StatusConfig, StatusManager},
    Error,
};

/// What `observer run` starts.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub agent: AgentConfig,
    /// `/metrics`, `/healthz`, `/readyz`.
    pub listen: SocketAddr,
    /// `None`: nothing reaches the API (`--status-mode off`).
    pub status: Option<StatusSetup>,
    /// `/healthz` fails when a loop has not turned for this long.
    pub health_stale_after: Duration,
    /// How long a shutdown waits for pending writes.
    pub shutdown_timeout: Duration,
    /// `conditions` mode: the fast path writes ContainersAlive=False ([`crate::kube::fast`]).
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
pub async fn run(mut cfg: RunConfig, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    let mut metrics = Metrics::new();
    cfg.agent.reconcile.detection_latency = Some(metrics.detection_latency.clone());
    cfg.agent.reconcile.oom_kills = Some(metrics.oom_kills.clone());
    cfg.agent.reconcile.state_access = StateAccess::ReadWrite;
    // A kubeconfig that cannot be read is refused before anything is loaded.
    let api = match &cfg.status {
        Some(s) => Some(kube::client(s.kubeconfig.as_deref()).await?),
        None => None,
    };
    let endpoint = cfg.agent.cri.clone();
    // The fast path runs on the kernel reader's thread from the start (its requests written
    // from that thread); it decides deaths from what the status manager last computed, so
    // it writes nothing before the manager's first turn on a pod.
    let fast_stats = Arc::new(fast::FastStats::default());
    let conditions = cfg.fast_path
        && cfg.agent.reader != ReaderThread::Task
        && cfg
            .status
            .as_ref()
            .is_some_and(|s| s.status.mode == status::StatusMode::Conditions);
    let ledger = Arc::new(status::AliveLedger::default());
    let fast_reconcile = Arc::new(OnceLock::new());
    let hook = match cfg.status.as_ref().filter(|_| conditions) {
        Some(s) => {
            let decider = fast::Decider {
                types: s.status.condition_types(),
                ledger: Arc::clone(&ledger),
                stats: Arc::clone(&fast_stats),
            };
            // Connections are opened at normal priority, on this runtime, and handed to the
            // reader's thread.
            let (dialer, dialed) = fast::dial::pair(s.kubeconfig.clone(), s.status.request_timeout);
            tokio::spawn(dialer.run());
            let writer = fast::WriterConfig {
                field_manager: s.status.reporter.clone(),
                request_timeout: s.status.request_timeout,
                reconcile: Arc::clone(&fast_reconcile),
                latency: Some(metrics.fast_write_latency.clone()),
            };
            let make: crate::pipeline::FastPathFactory = Box::new(move |clock| {
                Box::new(fast::FastDeaths::new(
                    decider,
                    clock.clone(),
                    writer,
                    dialed,
                )) as Box<dyn crate::pleg::FastPath>
            });
            Some(make)
        }
        None => None,
    };
    let write_latency = metrics.status_write_latency.clone();
    let mut agent = Agent::start_with(cfg.agent, hook).await?;
    let listener = http::bind(cfg.listen).await.map_err(Error::Listen)?;
    let listen = listener.local_addr().map_err(Error::Listen)?;

    // Set once the manager runs (in full mode, after the runtime's name, up to 10 s without a
    // runtime): the endpoint answers meanwhile.
    let status = Arc::new(OnceLock::new());
    metrics.collect(Sources {
        pipeline: agent.pipeline(),
        probes: agent.probes(),
        reconcile: agent.reconcile.clone(),
        cri: agent.cri.clone(),
        status: Arc::clone(&status),
        fast: conditions.then(|| Arc::clone(&fast_stats)),
    });
    let health = http::Health {
        pipeline: agent.pipeline(),
        reconcile: agent.reconcile.clone(),
        cri: agent.cri.clone(),
        tasks: agent.tasks.health(),
        api: cfg.status.is_some().then(|| Arc::clone(&status)),
        stale_after: cfg.health_stale_after,
    };
    agent.tasks.spawn(
        "HTTP endpoint",
        http::serve(listener, Arc::new(metrics), health),
    );
    let mode = cfg
        .status
        .as_ref()
        .map_or(status::StatusMode::Off, |s| s.status.mode);
    tracing::info!(%listen, %mode, %endpoint, "agent running");

    if let (Some(setup), Some(api)) = (cfg.status, api) {
        let mut scfg = setup.status;
        scfg.api_url = api.url;
        scfg.write_latency = Some(write_latency);
        // Only the full status names the runtime (container ids are `<runtime>://<id>`): only
        // then is its answer waited for, which holds the API's first list back meanwhile.
        let wait = match scfg.mode {
            status::StatusMode::Full => Duration::from_secs(10),
            _ => Duration::ZERO,
        };
        scfg.runtime_name = agent.runtime_name(wait).await;
        let (mut manager, handle) = StatusManager::new(api.client, scfg, agent.reconcile.clone());
        if conditions {
            // The fast path (on the kernel reader's thread) claims deaths once its client is up.
            manager.set_alive_ledger(Arc::clone(&ledger));
            let _ = fast_reconcile.set(agent.reconcile.clone());
        }
        if let Some(worker) = manager.take_events_worker() {
            agent.tasks.spawn("Events worker", worker);
        }
        agent.tasks.spawn("status manager", manager.run());
        let _ = status.set(handle);
    }

    tokio::select! {
        _ = shutdown => {}
        e = agent.failed() => return Err(e),
    }
    tracing::info!("stopping: flushing pending status writes");
    if let Some(h) = status.get() {
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
