//! The reconciler's metrics, from its stats and its view.
use prometheus_client::{encoding::DescriptorEncoder, registry::Unit};

use super::{ReconcileHandle, ReconcileStats};
use crate::exposition::{counter, gauge};

impl ReconcileHandle {
    pub fn encode_metrics(&self, e: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let r = self.stats();
        let g = ReconcileStats::get;
        counter(e, "relists", "Full relists of the runtime", g(&r.relists))?;
        counter(
            e,
            "relist_repaired",
            "Differences a relist had to repair: lifecycle changes no event reported",
            g(&r.missed_events),
        )?;
        counter(
            e,
            "runtime_fetches",
            "Pod status requests to the runtime",
            g(&r.pod_fetches),
        )?;
        counter(
            e,
            "runtime_fetch_errors",
            "Failed requests to the runtime (each retried)",
            g(&r.fetch_errors),
        )?;
        counter(
            e,
            "runtime_adopted_pods",
            "Pods the runtime had that the kernel never reported",
            g(&r.adopted),
        )?;
        counter(
            e,
            "runtime_unknown_containers",
            "Containers the kernel reported that the runtime never came to know",
            g(&r.unknown_dropped),
        )?;
        counter(
            e,
            "corrected_accounts",
            "Containers whose runtime account the agent corrected",
            g(&r.corrected),
        )?;
        counter(
            e,
            "init_checks",
            "Kernel-found container inits checked against the runtime's",
            g(&r.init_checks),
        )?;
        counter(
            e,
            "init_disagreements",
            "Kernel-found container inits the runtime named differently",
            g(&r.init_disagreements),
        )?;
        gauge(
            e,
            "reconciler_heartbeat_age",
            "Time since the reconciler's loop last turned",
            Some(&Unit::Seconds),
            self.since_last_turn().as_secs_f64(),
        )?;
        let pods = self.pods();
        gauge(
            e,
            "tracked_pods",
            "Pods in the reconciled view",
            None,
            pods.len() as f64,
        )?;
        gauge(
            e,
            "tracked_containers",
            "Container instances in the reconciled view",
            None,
            pods.iter().map(|p| p.containers.len()).sum::<usize>() as f64,
        )?;

        Ok(())
    }
}
