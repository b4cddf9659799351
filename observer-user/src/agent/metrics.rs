//! `/metrics`, in the Prometheus text format, through prometheus-client.
//!
//! Each part of the agent keeps and encodes its own metrics, histograms included (kernel side
//! and pipeline, reconciler, runtime connection, scheduling, status manager, fast path); this
//! module only gathers them: one collector calls each part at scrape time, so nothing is counted
//! twice and an idle agent does no work for its metrics. The names are pinned by
//! tests/tests/run/metric_names.txt.
use std::sync::{Arc, Mutex};

use prometheus_client::{
    collector::Collector,
    encoding::DescriptorEncoder,
    registry::{Registry, Unit},
};

use crate::{
    cri::ReconnectingCri, exposition::gauge, kernel::Probes, pipeline::PipelineHealth,
    reconcile::ReconcileHandle, status::StatusHandle,
};

/// The agent's registry: `observer_` and what each part encodes.
pub struct Metrics {
    registry: Registry,
}

/// What the collector reads at scrape time.
#[derive(Clone)]
pub struct Sources {
    pub pipeline: Arc<PipelineHealth>,
    pub probes: Arc<Mutex<Probes>>,
    pub reconcile: ReconcileHandle,
    /// The runtime connection, where the runtime is the CRI.
    pub cri: Option<ReconnectingCri>,
    /// The status manager, when the agent writes.
    pub status: Option<StatusHandle>,
    /// The fast path's counters (`conditions` mode).
    pub fast: Option<Arc<crate::fastpath::FastStats>>,
    /// The PodReports' counters (any mode but off).
    pub reports: Option<Arc<crate::present::report::ReportStats>>,
    /// What the kernel log's readers did not believe.
    pub kernel_log: Arc<crate::kernel::kmsg::LogStats>,
    /// The HTTP endpoint's access checks (`observer run`).
    pub access: Option<Arc<super::access::Gate>>,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sources")
    }
}

impl Metrics {
    /// The registry of `sources`' metrics.
    pub fn new(sources: Option<Sources>) -> Self {
        let mut registry = Registry::with_prefix("observer");
        if let Some(s) = sources {
            registry.register_collector(Box::new(s));
        }
        Self { registry }
    }

    /// The text exposition (`text/plain; version=0.0.4`).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::with_capacity(16 << 10);
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)?;
        Ok(out)
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
        self.kernel_log.encode_metrics(&mut e)?;
        self.reconcile.encode_metrics(&mut e)?;
        if let Some(cri) = &self.cri {
            cri.encode_metrics(&mut e)?;
        }
        crate::sched::encode_metrics(&mut e)?;
        if let Some(h) = &self.status {
            h.encode_metrics(&mut e)?;
        }
        if let Some(f) = &self.fast {
            f.encode_metrics(&mut e)?;
        }
        if let Some(r) = &self.reports {
            r.encode_metrics(&mut e)?;
        }
        if let Some(a) = &self.access {
            a.encode_metrics(&mut e)?;
        }
        Ok(())
    }
}
