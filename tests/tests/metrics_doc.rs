//! docs/metrics.md lists every metric the agent serves, with its type: the same list as
//! tests/tests/run/metric_names.txt, which tests/tests/run.rs checks against the `# TYPE` lines of
//! a running agent's /metrics. The metrics served only where the kernel accounts BPF run time
//! are listed apart, and must not be in that list.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::collections::BTreeSet;
use std::path::PathBuf;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// A metric as metric_names.txt has it: its name as queried (counters with `_total`,
/// histograms without their `_bucket`, `_sum`, `_count`) and its type.
type Metric = (String, String);

/// The tables' rows of docs/metrics.md: the always-served ones, and those under a heading that
/// starts "Only where".
fn documented() -> (BTreeSet<Metric>, BTreeSet<Metric>) {
    let text = std::fs::read_to_string(workspace().join("docs/metrics.md")).unwrap();
    let (mut always, mut conditional) = (BTreeSet::new(), BTreeSet::new());
    let mut only_where = false;
    for line in text.lines() {
        if line.starts_with('#') {
            only_where = line
                .trim_start_matches('#')
                .trim()
                .starts_with("Only where");
            continue;
        }
        let Some(row) = line.strip_prefix("| `observer_") else {
            continue;
        };
        // No cell has a `|` of its own: the row's five cells, and the empty rest after the last.
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 6, "a row of five cells: {line}");
        let name = format!("observer_{}", cells[0].trim_end_matches('`'));
        let kind = cells[1].to_string();
        assert!(
            ["counter", "gauge", "histogram"].contains(&kind.as_str()),
            "{name}: type {kind:?}"
        );
        assert!(!cells[3].is_empty(), "{name}: no meaning");
        assert!(!cells[4].is_empty(), "{name}: no cardinality");
        let set = if only_where {
            &mut conditional
        } else {
            &mut always
        };
        assert!(set.insert((name.clone(), kind)), "{name} twice");
    }
    (always, conditional)
}

#[test]
fn docs_metrics_lists_what_metrics_serves() {
    let served: BTreeSet<Metric> =
        std::fs::read_to_string(workspace().join("tests/tests/run/metric_names.txt"))
            .unwrap()
            .lines()
            .map(|l| {
                let (name, kind) = l.split_once(' ').expect("name type");
                (name.to_string(), kind.to_string())
            })
            .collect();
    let (always, conditional) = documented();
    let missing: Vec<&Metric> = served.difference(&always).collect();
    let extra: Vec<&Metric> = always.difference(&served).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/metrics.md against tests/tests/run/metric_names.txt (what /metrics serves):\n\
         served but not documented (or with another type): {missing:?}\n\
         documented but not served: {extra:?}"
    );
    // The conditional ones are not served without bpf_stats_enabled, and are the agent's:
    // their names are in the source that encodes them.
    assert!(!conditional.is_empty());
    let source =
        std::fs::read_to_string(workspace().join("observer-user/src/kernel/metrics.rs")).unwrap();
    for (name, _) in &conditional {
        assert!(
            !served.iter().any(|(n, _)| n == name),
            "{name} is always served"
        );
        let base = name
            .trim_start_matches("observer_")
            .trim_end_matches("_total")
            .trim_end_matches("_seconds");
        assert!(
            source.contains(&format!("\"{base}\"")),
            "{name}: no \"{base}\" in observer-user/src/kernel/metrics.rs"
        );
    }
}
