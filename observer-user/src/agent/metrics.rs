//! `/metrics`, in the Prometheus text format, through prometheus-client.
//!
//! The parts of the agent keep their own counters (kernel side, pipeline, reconciler, runtime
//! connection, status manager); one collector reads them at scrape time, so nothing is counted
//! twice and an idle agent does no work for its metrics. Two metrics are recorded as things
//! happen: the detection latency (kernel exit → reconciler) and the OOM kills per container.
use std::sync::{Arc, Mutex, OnceLock};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::ConstGauge,
        histogram::{exponential_buckets, Histogram},
        MetricType,
    },
    registry::{Registry, Unit},
};

use crate::{
    cri::ReconnectingCri,
    kernel::{KernelEvent, Probes},
    kube::{FindingKind, StatusHandle, StatusStats},
    pipeline::PipelineHealth,
    pleg::PlegEventType,
    reconcile::{ReconcileHandle, ReconcileStats},
};

pub use crate::reconcile::ContainerLabels;

/// The agent's registry and the metrics recorded as things happen.
pub struct Metrics {
    registry: Registry,
    /// Seconds from a container init's exit in the kernel to the reconciler's view of it.
    pub detection_latency: Histogram,
    /// Seconds from the reconciled view's change to its status patch leaving the process.
    pub status_write_latency: Histogram,
    pub oom_kills: Family<ContainerLabels, Counter>,
}

/// What the collector reads at scrape time.
#[derive(Clone)]
pub struct Sources {
    pub pipeline: Arc<PipelineHealth>,
    pub probes: Arc<Mutex<Probes>>,
    pub reconcile: ReconcileHandle,
    pub cri: ReconnectingCri,
    /// The status manager once it runs.
    pub status: Arc<OnceLock<StatusHandle>>,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sources")
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("observer");
        // 20 µs to ~10 s: the kernel path is sub-millisecond, a relist's is a second.
        let detection_latency = Histogram::new(exponential_buckets(20e-6, 2.0, 20));
        registry.register_with_unit(
            "detection_latency",
            "Time from a container init's exit in the kernel to the agent's view of it",
            Unit::Seconds,
            detection_latency.clone(),
        );
        let status_write_latency = Histogram::new(exponential_buckets(20e-6, 2.0, 20));
        registry.register_with_unit(
            "status_write_latency",
            "Time from a change of the agent's view of a pod to its status patch leaving the process",
            Unit::Seconds,
            status_write_latency.clone(),
        );
        let oom_kills = Family::<ContainerLabels, Counter>::default();
        registry.register(
            "oom_kills",
            "Processes killed by the kernel's OOM killer, by the container they ran in",
            oom_kills.clone(),
        );
        Self {
            registry,
            detection_latency,
            status_write_latency,
            oom_kills,
        }
    }

    /// Adds the collector of the parts' own counters.
    pub fn collect(&mut self, sources: Sources) {
        self.registry.register_collector(Box::new(sources));
    }

    /// The text exposition (`text/plain; version=0.0.4`).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::with_capacity(16 << 10);
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn counter(e: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: f64,
) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, unit, g.metric_type())?)
}

/// One counter family with one label.
fn counters<'a>(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    label: &'static str,
    values: impl IntoIterator<Item = (&'a str, u64)>,
) -> std::fmt::Result {
    let mut family = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (v, n) in values {
        let labels = [(label, v)];
        ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for Sources {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> std::fmt::Result {
        let p = self.pipeline.stats();
        counters(
            &mut e,
            "kernel_records",
            "Records the kernel side sent, by type",
            "type",
            KernelEvent::TYPES
                .iter()
                .copied()
                .zip(p.pleg.kernel_by_type),
        )?;
        if let Ok(k) = crate::sync::lock(&self.probes).counters() {
            counter(
                &mut e,
                "kernel_ring_buffer_drops",
                "Records the kernel could not put in the ring buffer (each forces a resync)",
                k.ringbuf_drops,
            )?;
            counter(
                &mut e,
                "kernel_oom_pending_full",
                "OOM victims not followed because the kernel side's table was full",
                k.oom_pending_full,
            )?;
            counter(
                &mut e,
                "kernel_read_errors",
                "Kernel memory reads that failed (fields sent as zero)",
                k.read_errors,
            )?;
            counters(
                &mut e,
                "kernel_records_submitted",
                "Records the kernel side submitted, by whether they woke the reader (waking: a \
                 container init's exec or exit, an OOM kill, a cgroup event; quiet: read at the \
                 next wake-up or poll)",
                "wakeup",
                [("waking", k.waking_records), ("quiet", k.quiet_records)],
            )?;
        }
        // Per-program run time, where the kernel accounts it (sysctl kernel.bpf_stats_enabled=1).
        if std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
            .is_ok_and(|v| v.trim() == "1")
        {
            if let Ok(stats) = crate::sync::lock(&self.probes).program_stats() {
                counters(
                    &mut e,
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
            &mut e,
            "kernel_malformed_records",
            "Ring-buffer records that did not decode",
            p.malformed,
        )?;
        counters(
            &mut e,
            "pleg_events",
            "Pod lifecycle events, by type",
            "type",
            PlegEventType::ALL
                .iter()
                .map(|t| t.as_str())
                .zip(p.pleg.lifecycle_by_type),
        )?;
        counter(
            &mut e,
            "pleg_unattributed_events",
            "Kernel events about a cgroup that never appeared",
            p.pleg.unattributed,
        )?;
        counter(
            &mut e,
            "pleg_resyncs",
            "Walks of the cgroup tree (at start and after lost records)",
            p.pleg.resyncs,
        )?;
        counter(
            &mut e,
            "pleg_stream_lagged",
            "Lifecycle events folded into a pod sync because the consumer lagged",
            p.stream_lagged,
        )?;
        gauge(
            &mut e,
            "pipeline_heartbeat_age",
            "Time since the kernel pipeline's loop last turned",
            Some(&Unit::Seconds),
            self.pipeline.since_last_turn().as_secs_f64(),
        )?;
        gauge(
            &mut e,
            "pipeline_realtime",
            "1 when the kernel reader and the PLEG run on a real-time (SCHED_FIFO) thread",
            None,
            f64::from(u8::from(self.pipeline.realtime())),
        )?;
        gauge(
            &mut e,
            "pipeline_known_inits",
            "Container inits registered with the kernel (their exit wakes the reader)",
            None,
            p.known_inits as f64,
        )?;
        counter(
            &mut e,
            "pipeline_known_init_failures",
            "Registrations of container inits with the kernel that failed (the map full: such an init's exit is read within the 10 ms poll instead of at once)",
            p.known_init_failures,
        )?;
        gauge(
            &mut e,
            "kernel_pods",
            "Pods the kernel pipeline's node model holds (from the start-up walk and events)",
            None,
            p.pods as f64,
        )?;
        gauge(
            &mut e,
            "kernel_containers",
            "Containers the kernel pipeline's node model holds",
            None,
            p.containers as f64,
        )?;
        if let Some(mem) = crate::mem::Resident::of(None) {
            gauge(
                &mut e,
                "resident_memory",
                "The agent's resident memory (VmRSS)",
                Some(&Unit::Bytes),
                (mem.now_kib * 1024) as f64,
            )?;
            gauge(
                &mut e,
                "resident_memory_peak",
                "The agent's peak resident memory since it started, start-up included (VmHWM)",
                Some(&Unit::Bytes),
                (mem.peak_kib * 1024) as f64,
            )?;
        }

        let r = self.reconcile.stats();
        let g = ReconcileStats::get;
        counter(
            &mut e,
            "relists",
            "Full relists of the runtime",
            g(&r.relists),
        )?;
        counter(
            &mut e,
            "relist_repaired",
            "Differences a relist had to repair: lifecycle changes no event reported",
            g(&r.missed_events),
        )?;
        counter(
            &mut e,
            "runtime_fetches",
            "Pod status requests to the runtime",
            g(&r.pod_fetches),
        )?;
        counter(
            &mut e,
            "runtime_fetch_errors",
            "Failed requests to the runtime (each retried)",
            g(&r.fetch_errors),
        )?;
        counter(
            &mut e,
            "runtime_adopted_pods",
            "Pods the runtime had that the kernel never reported",
            g(&r.adopted),
        )?;
        counter(
            &mut e,
            "runtime_unknown_containers",
            "Containers the kernel reported that the runtime never came to know",
            g(&r.unknown_dropped),
        )?;
        counter(
            &mut e,
            "corrected_accounts",
            "Containers whose runtime account the agent corrected",
            g(&r.corrected),
        )?;
        counter(
            &mut e,
            "init_checks",
            "Kernel-found container inits checked against the runtime's",
            g(&r.init_checks),
        )?;
        counter(
            &mut e,
            "init_disagreements",
            "Kernel-found container inits the runtime named differently",
            g(&r.init_disagreements),
        )?;
        gauge(
            &mut e,
            "reconciler_heartbeat_age",
            "Time since the reconciler's loop last turned",
            Some(&Unit::Seconds),
            self.reconcile.since_last_turn().as_secs_f64(),
        )?;
        let pods = self.reconcile.pods();
        gauge(
            &mut e,
            "tracked_pods",
            "Pods in the reconciled view",
            None,
            pods.len() as f64,
        )?;
        gauge(
            &mut e,
            "tracked_containers",
            "Container instances in the reconciled view",
            None,
            pods.iter().map(|p| p.containers.len()).sum::<usize>() as f64,
        )?;

        gauge(
            &mut e,
            "cri_connected",
            "1 while the container runtime answers",
            None,
            f64::from(u8::from(self.cri.is_connected())),
        )?;
        counter(
            &mut e,
            "cri_reconnects",
            "Connections to the runtime after the first",
            self.cri.reconnects(),
        )?;

        if let Some(h) = self.status.get() {
            let s = h.stats();
            let g = StatusStats::get;
            counter(
                &mut e,
                "status_writes",
                "Pod status patches the API accepted",
                g(&s.writes),
            )?;
            counter(
                &mut e,
                "status_write_errors",
                "Failed status patches (5xx, timeouts, transport; each retried)",
                g(&s.write_errors),
            )?;
            counter(
                &mut e,
                "status_write_retries",
                "Status patches retried (errors and 429s)",
                g(&s.write_errors) + g(&s.throttled),
            )?;
            counter(
                &mut e,
                "status_throttled",
                "Status patches the API throttled (429)",
                g(&s.throttled),
            )?;
            counter(
                &mut e,
                "status_conflicts",
                "Status patches refused by the UID precondition (a re-created pod)",
                g(&s.conflicts),
            )?;
            counter(
                &mut e,
                "status_gone",
                "Status patches for pods the API no longer has",
                g(&s.gone),
            )?;
            counter(
                &mut e,
                "status_rejected",
                "Status patches the API refused as invalid",
                g(&s.rejected),
            )?;
            counter(
                &mut e,
                "status_unchanged",
                "Computed statuses that needed no write",
                g(&s.unchanged),
            )?;
            counter(
                &mut e,
                "api_watch_errors",
                "Errors of the watch on this node's pods",
                g(&s.watch_errors),
            )?;
            counter(
                &mut e,
                "pod_log_lines_dropped",
                "Log lines about a pod dropped over its per-pod rate limit",
                g(&s.logs_suppressed),
            )?;
            counters(
                &mut e,
                "audit_findings",
                "Disagreements between kubelet's status in the API and the kernel's account",
                "reason",
                FindingKind::ALL
                    .iter()
                    .map(|k| (k.reason(), g(&s.audit_findings[k.index()]))),
            )?;
            let ev = h.event_stats();
            let [queued, published, failed, limited, overflow, _pending] = ev.snapshot();
            counter(&mut e, "events_queued", "Kubernetes Events queued", queued)?;
            counter(
                &mut e,
                "events_published",
                "Kubernetes Events published",
                published,
            )?;
            counter(
                &mut e,
                "events_failed",
                "Kubernetes Events the API refused or never took",
                failed,
            )?;
            counter(
                &mut e,
                "events_rate_limited",
                "Kubernetes Events over a pod's rate limit",
                limited,
            )?;
            counter(
                &mut e,
                "events_overflow",
                "Kubernetes Events dropped because the queue was full",
                overflow,
            )?;
        }
        Ok(())
    }
}
