//! `observer run`: the agent with the status manager and the HTTP endpoint, until a shutdown or a
//! failure.
//!
//! The path of a death: the kernel → the PLEG → the reconciler's view, which marks the pod
//! changed → the status manager takes it from there (one queue) → the writer's PATCH. In
//! `conditions` mode the ContainersAlive=False transition also takes the fast path: from the
//! PLEG's thread to a writer thread of its own, real-time with `--realtime-priority`
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
    kube::{self, fast, StatusConfig, StatusManager},
    pipeline::ReaderThread,
    reconcile::inits::StateAccess,
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
    // The fast path's hook is on the PLEG's thread from the start; its writer starts with the
    // status manager (deaths before then wait in its queue).
    let fast_stats = Arc::new(fast::FastStats::default());
    let conditions = cfg.fast_path
        && cfg
            .status
            .as_ref()
            .is_some_and(|s| s.status.mode == kube::StatusMode::Conditions);
    let realtime = match cfg.agent.reader {
        ReaderThread::Realtime(p) => Some(p),
        _ => None,
    };
    let (hook, fast_deaths) = if conditions {
        let (hook, rx) = fast::FastDeaths::new(Arc::clone(&fast_stats));
        let make: crate::pipeline::FastPathFactory =
            Box::new(move |_| Box::new(hook) as Box<dyn crate::pleg::FastPath>);
        (Some(make), Some(rx))
    } else {
        (None, None)
    };
    let fast_latency = metrics.fast_write_latency.clone();
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
        .map_or(kube::StatusMode::Off, |s| s.status.mode);
    tracing::info!(%listen, %mode, %endpoint, "agent running");

    if let (Some(setup), Some(api)) = (cfg.status, api) {
        let mut scfg = setup.status;
        scfg.api_url = api.url;
        scfg.write_latency = Some(write_latency);
        // Only the full status names the runtime (container ids are `<runtime>://<id>`): only
        // then is its answer waited for, which holds the API's first list back meanwhile.
        let wait = match scfg.mode {
            kube::StatusMode::Full => Duration::from_secs(10),
            _ => Duration::ZERO,
        };
        scfg.runtime_name = agent.runtime_name(wait).await;
        let fast_types = scfg.condition_types();
        let (field_manager, request_timeout) = (scfg.reporter.clone(), scfg.request_timeout);
        let (mut manager, handle) = StatusManager::new(api.client, scfg, agent.reconcile.clone());
        if let Some(deaths) = fast_deaths {
            let ledger = Arc::new(fast::AliveLedger::default());
            manager.set_alive_ledger(Arc::clone(&ledger));
            let fast_cfg = fast::FastConfig {
                kubeconfig: setup.kubeconfig.clone(),
                types: fast_types,
                field_manager,
                request_timeout,
                reconcile: agent.reconcile.clone(),
                pods: handle.pods().clone(),
                ledger,
                clock: agent.clock(),
                stats: fast_stats,
                realtime,
                latency: Some(fast_latency),
            };
            // Its thread ends with the PLEG's stream; a panic there is the agent's failure, said
            // by name and on /healthz like any task's.
            match fast::spawn(fast_cfg, deaths) {
                Ok(ended) => agent.tasks.spawn("fast status writer", async move {
                    if let Ok(Err(why)) = ended.await {
                        panic!("{why}");
                    }
                    std::future::pending::<()>().await
                }),
                Err(e) => tracing::warn!("the fast status writer did not start ({e}): deaths reach the API through the status manager only"),
            }
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
