//! `/metrics`, in the Prometheus text format, through prometheus-client.
//!
//! The parts of the agent keep their own counters (kernel side, pipeline, reconciler, runtime
//! connection, status manager); one collector reads them at scrape time, so nothing is counted
//! twice and an idle agent does no work for its metrics. Two metrics are recorded as things
//! happen: the detection latency (kernel exit → reconciler) and the OOM kills per container.
use std::sync::{Arc, Mutex};

use prometheus_client::{
    collector::Collector,
    encoding::DescriptorEncoder,
    metrics::{
        counter::Counter,
        family::Family,
        histogram::{exponential_buckets, Histogram},
    },
    registry::{Registry, Unit},
};

use crate::{
    cri::ReconnectingCri, exposition::gauge, kernel::Probes, pipeline::PipelineHealth,
    reconcile::ReconcileHandle, status::StatusHandle,
};

pub use crate::reconcile::{ContainerLabels, OomKillLabels};

/// The agent's registry and the metrics recorded as things happen.
pub struct Metrics {
    registry: Registry,
    /// Seconds from a container init's exit in the kernel to the reconciler's view of it.
    pub detection_latency: Histogram,
    /// Seconds from the reconciled view's change to its status patch leaving the process.
    pub status_write_latency: Histogram,
    /// Seconds from a container init's exit in the kernel to the fast path's ContainersAlive
    /// patch handed to its HTTP client.
    pub fast_write_latency: Histogram,
    pub oom_kills: Family<OomKillLabels, Counter>,
}

/// What the collector reads at scrape time.
#[derive(Clone)]
pub struct Sources {
    pub pipeline: Arc<PipelineHealth>,
    pub probes: Arc<Mutex<Probes>>,
    pub reconcile: ReconcileHandle,
    pub cri: ReconnectingCri,
    /// The status manager, when the agent writes.
    pub status: Option<StatusHandle>,
    /// The fast path's counters (`conditions` mode).
    pub fast: Option<Arc<crate::fastpath::FastStats>>,
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
        let fast_write_latency = Histogram::new(exponential_buckets(20e-6, 2.0, 20));
        registry.register_with_unit(
            "fast_write_latency",
            "Time from a container init's exit in the kernel to the fast path's ContainersAlive patch written to its connection to the API",
            Unit::Seconds,
            fast_write_latency.clone(),
        );
        let oom_kills = Family::<OomKillLabels, Counter>::default();
        registry.register(
            "oom_kills",
            "Processes killed by the kernel's OOM killer, by the container they ran in and the limit that was hit (scope: container, pod, cgroup, node, unknown)",
            oom_kills.clone(),
        );
        Self {
            registry,
            detection_latency,
            status_write_latency,
            fast_write_latency,
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

impl Collector for Sources {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> std::fmt::Result {
        self.pipeline.encode_metrics(&self.probes, &mut e)?;
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

        self.reconcile.encode_metrics(&mut e)?;
        self.cri.encode_metrics(&mut e)?;
        crate::sched::encode_metrics(&mut e)?;
        if let Some(h) = &self.status {
            h.encode_metrics(&mut e)?;
        }
        if let Some(f) = &self.fast {
            f.encode_metrics(&mut e)?;
        }
        Ok(())
    }
}
