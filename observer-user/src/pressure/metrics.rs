//! The memory-pressure metrics: limit hits, crossings and warnings per container and scope, each
//! container's unreclaimable share of its limit at its latest reading and the time to full its
//! latest crossings project. Series of a pod go with it. And the processes a warning left out
//! (`read.rs`: no longer in their cgroup once read).
use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeLabelSet},
    metrics::{counter::Counter, family::Family, gauge::Gauge},
};

use super::{Change, Reading};
use crate::exposition::metric;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ScopedLabels {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub scope: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ContainerLabels {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// Who a reading is about.
pub struct Named<'a> {
    pub namespace: &'a str,
    pub pod: &'a str,
    pub container: &'a str,
}

#[derive(Default)]
pub struct PressureMetrics {
    hits: Family<ScopedLabels, Counter>,
    warnings: Family<ScopedLabels, Counter>,
    crossings: Family<ScopedLabels, Counter>,
    ratio: Family<ContainerLabels, Gauge<f64, AtomicU64>>,
    time_left: Family<ContainerLabels, Gauge<f64, AtomicU64>>,
    /// Shared with the reader ([`super::MemoryReader::counting_in`]).
    pub(crate) processes_dropped: Counter,
}

impl PressureMetrics {
    /// Counts a reading and what it changed.
    pub fn record(&self, who: &Named<'_>, r: &Reading, change: Change) {
        let scoped = ScopedLabels {
            namespace: who.namespace.to_string(),
            pod: who.pod.to_string(),
            container: who.container.to_string(),
            scope: r.scope.label(),
        };
        if r.hits > 0 {
            self.hits.get_or_create(&scoped).inc_by(r.hits);
        }
        if change == Change::Raised {
            self.warnings.get_or_create(&scoped).inc();
        }
        if r.crossing.is_some() {
            self.crossings.get_or_create(&scoped).inc();
        }
        let c = ContainerLabels {
            namespace: scoped.namespace,
            pod: scoped.pod,
            container: scoped.container,
        };
        // A crossing says how long is left; a series stands only while one said it is growing.
        if let Some(c_) = &r.crossing {
            match c_.estimate.as_ref().and_then(|e| e.time_left) {
                Some(t) => {
                    self.time_left.get_or_create(&c).set(t);
                }
                None => {
                    self.time_left.remove(&c);
                }
            }
        }
        self.ratio.get_or_create(&c).set(r.ratio());
    }

    /// The pod left the node: its series go.
    pub fn forget_pod(&self, namespace: &str, pod: &str, containers: &[String]) {
        for container in containers {
            let c = ContainerLabels {
                namespace: namespace.to_string(),
                pod: pod.to_string(),
                container: container.clone(),
            };
            for scope in ["container", "pod", "cgroup"] {
                let s = ScopedLabels {
                    namespace: c.namespace.clone(),
                    pod: c.pod.clone(),
                    container: c.container.clone(),
                    scope,
                };
                self.hits.remove(&s);
                self.warnings.remove(&s);
                self.crossings.remove(&s);
            }
            self.ratio.remove(&c);
            self.time_left.remove(&c);
        }
    }

    pub(crate) fn encode(&self, e: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        metric(
            e,
            "memory_limit_hits",
            "Charges that met a memory limit and made the kernel reclaim, by the container that charged and the limit's scope (container, pod, cgroup)",
            None,
            &self.hits,
        )?;
        metric(
            e,
            "memory_warnings",
            "Warnings that a container is about to be OOM-killed (MemoryNearLimit Events), by the limit's scope",
            None,
            &self.warnings,
        )?;
        metric(
            e,
            "memory_limit_crossings",
            "Charges that took a container's memory cgroup (or its pod's) past a threshold of its limit (50, 75, 86, 90, 95 %, each once per rise), by the limit's scope",
            None,
            &self.crossings,
        )?;
        metric(
            e,
            "memory_time_left",
            "Seconds until the memory the kernel cannot reclaim fills the limit, at its growth between the container's latest two crossings of that limit (absent when it was not growing)",
            Some(&prometheus_client::registry::Unit::Seconds),
            &self.time_left,
        )?;
        metric(
            e,
            "memory_unreclaimable_ratio",
            "Memory the kernel cannot reclaim without swap (anon, shmem, unreclaimable kernel) over the limit that was hit, at the container's latest limit hit",
            None,
            &self.ratio,
        )?;
        crate::exposition::counter(
            e,
            "memory_processes_dropped",
            "Processes a memory warning did not name: no longer in the cgroup that listed them once their name and memory were read (exited or moved, their pid possibly reused by another cgroup's process)",
            self.processes_dropped.get(),
        )
    }
}
