//! The kernel pipeline's metrics: the kernel side's counters, the PLEG's, the reader's heartbeat.
use std::sync::Mutex;

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    registry::Unit,
};

use super::PipelineHealth;
use crate::{
    exposition::{counter, counters, gauge},
    kernel::{KernelEvent, Probes},
    pleg::PlegEventType,
};

impl PipelineHealth {
    /// The pipeline's metrics, and the probes' counters and run time.
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
        if let Ok(k) = crate::sync::lock(probes).counters() {
            counter(
                e,
                "kernel_ring_buffer_drops",
                "Records the kernel could not put in the ring buffer (each forces a resync)",
                k.ringbuf_drops,
            )?;
            counter(
                e,
                "kernel_oom_pending_full",
                "OOM victims not followed because the kernel side's table was full",
                k.oom_pending_full,
            )?;
            counter(
                e,
                "kernel_oom_victim_exited_first",
                "OOM kills whose victim exited before the OOM killer marked it (sent at the mark)",
                k.oom_victim_exited_first,
            )?;
            counter(
                e,
                "kernel_oom_stale_meetings",
                "Entries of the kernel side's OOM table left by an earlier thread of the same id (a SIGKILLed exit or a mark more than 1 s old), replaced",
                k.oom_stale_meetings,
            )?;
            counter(
                e,
                "kernel_read_errors",
                "Kernel memory reads that failed (fields sent as zero)",
                k.read_errors,
            )?;
            counter(
                e,
                "kernel_limit_hits_summed",
                "Memory cgroup reclaims summed into a later limit-hit record instead of sent on their own (at most one record per cgroup per 100 ms)",
                k.limit_hits_summed,
            )?;
            counter(
                e,
                "kernel_charge_checks",
                "Charges after which a watched memory cgroup's page counters were read against its limit and its pod's (the charge probe: once per charge batch, a quarter MiB a CPU)",
                k.charge_checks,
            )?;
            counters(
                e,
                "kernel_records_submitted",
                "Records the kernel side submitted, by whether they woke the reader (waking: a \
                 container init's exec or exit, an OOM kill, a cgroup event; quiet: read at the \
                 next wake-up or poll)",
                "wakeup",
                [("waking", k.waking_records), ("quiet", k.quiet_records)],
            )?;
        }
        {
            // Which hook each memory probe got on this kernel: 1, or 0 with hook "none" where none
            // could be attached (the cause is in the log at start and in `observer check`).
            let p = crate::sync::lock(probes);
            let hooks = [
                ("limit_hits", p.limit_hit_source().hook()),
                ("limit_crossings", p.charge_source().hook()),
            ];
            drop(p);
            let mut fam = e.encode_descriptor(
                "kernel_memory_hook",
                "The kernel hook each memory probe is attached to (limit_hits: reclaim at a limit; limit_crossings: usage past thresholds of a limit), 0 with hook=\"none\" where neither of its hooks could be",
                None,
                MetricType::Gauge,
            )?;
            for (probe, hook) in hooks {
                let labels = [("probe", probe), ("hook", hook)];
                ConstGauge::new(i64::from(hook != "none")).encode(fam.encode_family(&labels)?)?;
            }
        }
        // Per-program run time, where the kernel accounts it (sysctl kernel.bpf_stats_enabled=1).
        if std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
            .is_ok_and(|v| v.trim() == "1")
        {
            if let Ok(stats) = crate::sync::lock(probes).program_stats() {
                counters(
                    e,
                    "kernel_program_runs",
                    "Runs of each kernel program",
                    "program",
                    stats.iter().map(|s| (s.name.as_str(), s.run_count)),
                )?;
                let mut fam = e.encode_descriptor(
                    "kernel_program_run",
                    "Kernel time spent in each program",
                    Some(&Unit::Seconds),
                    MetricType::Counter,
                )?;
                for s in &stats {
                    let labels = [("program", s.name.as_str())];
                    ConstCounter::new(s.run_time.as_secs_f64())
                        .encode(fam.encode_family(&labels)?)?;
                }
            }
        }
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
