//! The kernel side's own metrics: its counters, the hook each memory probe got on this kernel, and
//! each program's run time where the kernel accounts it. Read under the probes' lock in one go
//! ([`Probes::readings`]), encoded after it is released.
use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    registry::Unit,
};

use super::{KernelCounters, Probes, ProgramStats};
use crate::exposition::{counter, counters};

/// What the probes tell at one scrape.
pub(crate) struct ProbeReadings {
    counters: Option<KernelCounters>,
    /// (probe, hook) of each memory probe.
    hooks: [(&'static str, &'static str); 2],
    /// Per-program run time, where `kernel.bpf_stats_enabled` is 1.
    programs: Option<Vec<ProgramStats>>,
}

/// Whether the kernel accounts each program's run time (sysctl kernel.bpf_stats_enabled=1):
/// read before the probes' lock is taken.
pub(crate) fn run_time_accounted() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").is_ok_and(|v| v.trim() == "1")
}

impl Probes {
    /// The counters and hooks, and the programs' run time when `run_time` (see
    /// [`run_time_accounted`]).
    pub(crate) fn readings(&self, run_time: bool) -> ProbeReadings {
        ProbeReadings {
            counters: self.counters().ok(),
            hooks: [
                ("limit_hits", self.limit_hit_source().hook()),
                ("limit_crossings", self.charge_source().hook()),
            ],
            programs: run_time.then(|| self.program_stats().ok()).flatten(),
        }
    }
}

impl ProbeReadings {
    pub(crate) fn encode(&self, e: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        if let Some(k) = &self.counters {
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
        // 1, or 0 with hook "none" where none could be attached (the cause is in the log at
        // start and in `observer check`).
        {
            let mut fam = e.encode_descriptor(
            "kernel_memory_hook",
            "The kernel hook each memory probe is attached to (limit_hits: reclaim at a limit; limit_crossings: usage past thresholds of a limit), 0 with hook=\"none\" where neither of its hooks could be",
            None,
            MetricType::Gauge,
        )?;
            for (probe, hook) in self.hooks {
                let labels = [("probe", probe), ("hook", hook)];
                ConstGauge::new(i64::from(hook != "none")).encode(fam.encode_family(&labels)?)?;
            }
        }
        if let Some(stats) = &self.programs {
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
            for s in stats {
                let labels = [("program", s.name.as_str())];
                ConstCounter::new(s.run_time.as_secs_f64()).encode(fam.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
