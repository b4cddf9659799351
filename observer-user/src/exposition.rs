//! The helpers each layer encodes its own metrics with, beside its stats (the agent's collector
//! calls them at scrape time).
use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    registry::Unit,
};

pub(crate) fn counter(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    v: u64,
) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
}

pub(crate) fn gauge(
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
pub(crate) fn counters<'a>(
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

/// A metric that keeps its own value (a histogram, a family), encoded like a registered one.
pub(crate) fn metric(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    m: &impl EncodeMetric,
) -> std::fmt::Result {
    m.encode(e.encode_descriptor(name, help, unit, m.metric_type())?)
}

/// A latency histogram in seconds, 20 µs to ~10 s: the kernel path is sub-millisecond, a
/// relist's is a second. Every latency the agent records uses these buckets.
#[derive(Clone, Debug)]
pub struct Latency(prometheus_client::metrics::histogram::Histogram);

impl Default for Latency {
    fn default() -> Self {
        Self(prometheus_client::metrics::histogram::Histogram::new(
            prometheus_client::metrics::histogram::exponential_buckets(20e-6, 2.0, 20),
        ))
    }
}

impl Latency {
    pub(crate) fn observe(&self, d: std::time::Duration) {
        self.0.observe(d.as_secs_f64());
    }

    /// `<name>_seconds`.
    pub(crate) fn encode(
        &self,
        e: &mut DescriptorEncoder<'_>,
        name: &str,
        help: &str,
    ) -> std::fmt::Result {
        metric(e, name, help, Some(&Unit::Seconds), &self.0)
    }
}
