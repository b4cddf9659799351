//! The reconciler's metrics, from its stats and its view.
use prometheus_client::{encoding::DescriptorEncoder, registry::Unit};

use super::{ReconcileHandle, ReconcileStats};
use crate::exposition::{counter, gauge};

impl ReconcileHandle {
    pub(crate) fn encode_metrics(&self, e: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
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
        // Counted under the view's read lock: a scrape copies no pod.
        let (pods, containers) = {
            let view = self.0.view();
            let containers: usize = view.values().map(|p| p.containers.len()).sum();
            (view.len(), containers)
        };
        gauge(
            e,
            "tracked_pods",
            "Pods in the reconciled view",
            None,
            pods as f64,
        )?;
        gauge(
            e,
            "tracked_containers",
            "Container instances in the reconciled view",
            None,
            containers as f64,
        )?;
        self.0.detection_latency.encode(
            e,
            "detection_latency",
            "Time from a container init's exit in the kernel to the agent's view of it",
        )?;
        crate::exposition::metric(
            e,
            "oom_kills",
            "Processes killed by the kernel's OOM killer, by the container they ran in and the limit that was hit (scope: container, pod, cgroup, node, unknown)",
            None,
            &self.0.oom_kills,
        )?;
        counter(
            e,
            "memory_limit_hit_records",
            "Limit-hit records of the kernel read against their container's memory cgroups",
            g(&r.limit_hits_read),
        )?;
        counter(
            e,
            "memory_limit_hits_elsewhere",
            "Limit-hit records whose memory cgroup is none of the charging container's and its parents' (a limit lowered from outside)",
            g(&r.limit_hits_elsewhere),
        )?;
        counter(
            e,
            "memory_limit_hit_read_errors",
            "Limit-hit records whose memory cgroup could not be read (it went away, or is not visible to the agent)",
            g(&r.limit_hit_read_errors),
        )?;
        self.0.pressure.encode(e)
    }
}
