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
