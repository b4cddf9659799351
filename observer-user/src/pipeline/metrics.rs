//! The kernel pipeline's metrics: the PLEG's, the reader's heartbeat; the kernel side's own are
//! its (kernel/metrics.rs).
use std::sync::Mutex;

use prometheus_client::{encoding::DescriptorEncoder, registry::Unit};

use super::PipelineHealth;
use crate::{
    exposition::{counter, counters, gauge},
    kernel::{KernelEvent, Probes},
    pleg::PlegEventType,
};

impl PipelineHealth {
    /// The pipeline's metrics, and the probes' own.
    pub(crate) fn encode_metrics(
        &self,
        probes: &Mutex<Probes>,
        e: &mut DescriptorEncoder<'_>,
    ) -> std::fmt::Result {
        let p = self.stats();
        counters(
            e,
            "kernel_records",
            "Records the kernel side sent, by type",
            "type",
            KernelEvent::TYPES
                .iter()
                .copied()
                .zip(p.pleg.kernel_by_type),
        )?;
        // The kernel side's own: read under the probes' lock, encoded after it.
        let run_time = crate::kernel::run_time_accounted();
        let readings = crate::sync::lock(probes).readings(run_time);
        readings.encode(e)?;
        counter(
            e,
            "kernel_malformed_records",
            "Ring-buffer records that did not decode",
            p.malformed,
        )?;
        counters(
            e,
            "pleg_events",
            "Pod lifecycle events, by type",
            "type",
            PlegEventType::ALL
                .iter()
                .map(|t| t.as_str())
                .zip(p.pleg.lifecycle_by_type),
        )?;
        counter(
            e,
            "pleg_unattributed_events",
            "Kernel events about a cgroup that never appeared",
            p.pleg.unattributed,
        )?;
        counter(
            e,
            "pleg_outside_roots_events",
            "Kernel events about cgroups named like a pod's or a container's outside kubelet's \
             cgroup roots (made by whoever can write that subtree): ignored",
            p.pleg.outside_roots,
        )?;
        counter(
            e,
            "cgroup_id_walks",
            "Walks of kubelet's cgroup roots for a cgroup id the index did not hold (at most one \
             per 250 ms; an id not found is not walked for again within 2 s)",
            p.pleg.index.walks,
        )?;
        counter(
            e,
            "cgroup_ids_unresolved",
            "Look-ups of a cgroup id that found no cgroup below kubelet's roots (outside them, \
             removed, or not walked for again yet): the event's cgroup stays unknown",
            p.pleg.index.unresolved,
        )?;
        counter(
            e,
            "cgroup_id_walks_cut",
            "Walks for a cgroup id stopped at their bound (16384 directories below kubelet's roots)",
            p.pleg.index.cut,
        )?;
        counter(
            e,
            "pleg_resyncs",
            "Walks of the cgroup tree (at start and after lost records)",
            p.pleg.resyncs,
        )?;
        counter(
            e,
            "pleg_stream_lagged",
            "Lifecycle events folded into a pod sync because the consumer lagged",
            p.stream_lagged,
        )?;
        gauge(
            e,
            "pipeline_heartbeat_age",
            "Time since the kernel pipeline's loop last turned",
            Some(&Unit::Seconds),
            self.since_last_turn().as_secs_f64(),
        )?;
        gauge(
            e,
            "pipeline_realtime",
            "1 when the kernel reader and the PLEG run on a real-time (SCHED_FIFO) thread",
            None,
            f64::from(u8::from(self.realtime())),
        )?;
        gauge(
            e,
            "pipeline_known_inits",
            "Container inits registered with the kernel (their exit wakes the reader)",
            None,
            p.known_inits as f64,
        )?;
        counter(
            e,
            "pipeline_known_init_failures",
            "Registrations of container inits with the kernel that failed (the map full: such an init's exit is read within the 10 ms poll instead of at once)",
            p.known_init_failures,
        )?;
        gauge(
            e,
            "kernel_pods",
            "Pods the kernel pipeline's node model holds (from the start-up walk and events)",
            None,
            p.pods as f64,
        )?;
        gauge(
            e,
            "kernel_containers",
            "Containers the kernel pipeline's node model holds",
            None,
            p.containers as f64,
        )?;
        Ok(())
    }
}
