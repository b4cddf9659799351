//! deploy/grafana/observer.json against a real Prometheus (Debian's `prometheus`) scraping
//! `observer run` on loopback, with the real kernel, the real containerd and the API stand-in:
//! after a leak warned before its OOM kill and a container death, every query of the dashboard
//! must parse, name only metrics the agent exports, and return data; the latency panels a number,
//! the OOM panel the kill with its scope.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use observer_tests::{
    agent::WAIT,
    apiserver::{pod_object, ApiStandIn},
    endpoint::{free_listen, http_get},
    eventually_async,
    kernel::require_kernel,
    manifests::deploy_dir,
    poll_until_async,
    process::ObserverProcess,
    prometheus::{require_prometheus, sample_value, Prometheus},
    require_containerd, ContainerSpec, Containerd, PodSpec, Qos,
};
use serde_json::Value;

const NODE: &str = "node-1";
const ALIVE: &str = "observer.dev/ContainersAlive";
/// Prometheus's scrape interval: short, so the test waits seconds, not minutes.
const SCRAPE: Duration = Duration::from_secs(1);
/// How long Prometheus may take to show what the agent exported.
const SCRAPED: Duration = Duration::from_secs(60);

/// What Grafana puts in place of its variables when it sends a query: the time-range ones as
/// a 1-second scrape interval makes them, the dashboard's own as "All".
const VARIABLES: &[(&str, &str)] = &[
    ("$__rate_interval", "1m"),
    ("$__interval", "15s"),
    ("$__range", "5m"),
    ("${instance}", ".*"),
    ("$instance", ".*"),
];

/// A panel's query, as Grafana would send it.
struct Query {
    panel: String,
    expr: String,
}

fn substitute(expr: &str) -> String {
    VARIABLES
        .iter()
        .fold(expr.to_string(), |e, (var, value)| e.replace(var, value))
}

/// Every target's `expr` of every panel (rows' nested panels too), and the template variables'
/// `label_values(METRIC, LABEL)` as the PromQL that lists the same values.
fn queries(dashboard: &Value) -> Result<Vec<Query>> {
    fn walk(panels: &Value, out: &mut Vec<Query>) {
        for p in panels.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = t["expr"].as_str() {
                    out.push(Query {
                        panel: p["title"].as_str().unwrap_or("?").into(),
                        expr: substitute(expr),
                    });
                }
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if v["type"] != "query" {
            continue;
        }
        let def = v["definition"]
            .as_str()
            .context("a query variable's definition")?;
        let args = def
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .with_context(|| {
                format!(
                    "variable {}: not label_values(METRIC, LABEL): {def}",
                    v["name"]
                )
            })?;
        let (metric, label) = args
            .split_once(',')
            .context("label_values(METRIC, LABEL)")?;
        out.push(Query {
            panel: format!("variable {}", v["name"]),
            expr: format!("count by ({}) ({})", label.trim(), metric.trim()),
        });
    }
    Ok(out)
}

/// The metric names a query refers to (the agent's all start with `observer_`).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("observer_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// The sample names of a text exposition (`_bucket`, `_sum`, `_count`, `_total` as exported).
fn exported(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(String::from)
        .collect()
}

/// The dashboard is an importable Grafana dashboard on a `${datasource}` Prometheus variable.
fn check_shape(d: &Value) -> Result<()> {
    ensure!(
        d["title"].is_string() && d["uid"].is_string(),
        "title and uid"
    );
    ensure!(d["schemaVersion"].as_u64().is_some(), "schemaVersion");
    let vars = d["templating"]["list"]
        .as_array()
        .context("templating.list")?;
    ensure!(
        vars.iter().any(|v| v["name"] == "datasource"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "a datasource variable of type prometheus"
    );
    let mut ids = BTreeSet::new();
    for p in d["panels"].as_array().context("panels")? {
        ensure!(
            ids.insert(p["id"].as_u64().context("panel id")?),
            "panel ids are unique: {p}"
        );
        ensure!(
            p["gridPos"]["w"].as_u64().is_some(),
            "gridPos: {}",
            p["title"]
        );
        if p["type"] == "row" {
            continue;
        }
        ensure!(
            p["datasource"]["uid"] == "${datasource}",
            "panel {} on ${{datasource}}",
            p["title"]
        );
        let targets = p["targets"].as_array().context("targets")?;
        ensure!(!targets.is_empty(), "panel {} has no query", p["title"]);
        for t in targets {
            ensure!(t["datasource"]["uid"] == "${datasource}", "{t}");
        }
    }
    Ok(())
}

#[test]
fn query_helpers() {
    assert_eq!(
        metric_names("sum(rate(observer_a_total{x=\"observer_no\"}[1m])) / observer_b_bucket"),
        ["observer_a_total", "observer_b_bucket", "observer_no"]
            .map(String::from)
            .into()
    );
    let text = "# HELP x y\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_count 1\nc_total 0\n";
    assert_eq!(
        exported(text),
        ["c_total", "h_bucket", "h_count"].map(String::from).into()
    );
    assert_eq!(
        substitute("rate(x{instance=~\"$instance\"}[$__rate_interval])"),
        "rate(x{instance=~\".*\"}[1m])"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_answers_from_a_real_prometheus_scrape() -> Result<()> {
    if !require_containerd() || !require_kernel() {
        return Ok(());
    }
    let Some(prometheus_bin) = require_prometheus() else {
        return Ok(());
    };
    observer_tests::init_tracing();
    let path = deploy_dir().join("grafana/observer.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)
        .with_context(|| format!("{} is not JSON", path.display()))?;
    check_shape(&dashboard)?;
    let queries = queries(&dashboard)?;
    for q in &queries {
        ensure!(
            !q.expr.contains('$'),
            "panel {:?}: a Grafana variable the test does not substitute: {}",
            q.panel,
            q.expr
        );
    }

    // The agent, as run.rs starts it: `observer run` against containerd and the API stand-in.
    let ctrd = Containerd::start().await?;
    let api = ApiStandIn::start().await?;
    let spec = PodSpec::new("oomer").qos(Qos::Burstable);
    api.add_pod(pod_object(
        &spec.name,
        &spec.namespace,
        &spec.uid,
        NODE,
        &[("app", Some("32Mi")), ("quitter", None)],
        Some(ALIVE),
    ));
    let kubeconfig = api.kubeconfig()?;
    let listen = free_listen();
    let state = tempfile::tempdir()?;
    let agent = ObserverProcess::spawn(&[
        "run",
        "--state-dir",
        state.path().to_str().context("path")?,
        "--kubeconfig",
        kubeconfig.to_str().context("path")?,
        "--node-name",
        NODE,
        "--cri-endpoint",
        &ctrd.socket().display().to_string(),
        // A stand-in API reviews no tokens: the scrapes here are on loopback.
        "--metrics-access",
        "open",
        "--listen",
        &listen.to_string(),
    ])?;
    ensure!(
        eventually_async(WAIT, || http_get(listen, "/readyz")
            .is_some_and(|(c, _)| c == 200))
        .await,
        "agent never ready: {}",
        agent.stderr()
    );

    let prom = Prometheus::start(&prometheus_bin, listen, SCRAPE)?;
    // A scrape before the deaths, so the rates over the histograms see them as increases.
    let up = poll_until_async(SCRAPED, || {
        prom.vector("up{job=\"observer\"} == 1")
            .ok()
            .filter(|r| !r.is_empty())
    })
    .await;
    ensure!(
        up.is_some(),
        "prometheus never scraped the agent: {}",
        prom.log()
    );

    // An OOM kill of one container's init, and a plain exit of the other, each once told to.
    let wait_go = "while [ ! -e /tmp/go ]; do sleep 0.05; done";
    let pod = ctrd
        .run_pod(
            spec.container(
                // 12 MiB of page cache, then a leak of 256 KiB every 20 ms: the limit is met while the
                // cache gives way, and the leak is warned (MemoryNearLimit) well before its kill.
                ContainerSpec::sh(
                    "app",
                    &format!(
                        "{wait_go}; dd if=/dev/zero of=/tmp/f bs=1M count=12 2>/dev/null; exec awk 'BEGIN {{ while (1) {{ a[n++] = sprintf(\"%262144s\", \"\"); system(\"usleep 20000\") }} }}'"
                    ),
                )
                .memory_limit_mib(32),
            )
            .container(ContainerSpec::sh("quitter", &format!("{wait_go}; exit 3"))),
        )
        .await?;
    // One death at a time after ContainersAlive=True is written: the first one is then a
    // transition the fast path writes (the second finds the condition False already).
    let alive = |r: &observer_tests::apiserver::Recorded, status: &str| {
        r.method == "PATCH"
            && r.uri.contains("/pods/oomer/status")
            && r.body["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == ALIVE && c["status"] == status)
    };
    api.wait_for(WAIT, |r| alive(r, "True"))
        .await
        .with_context(|| format!("no ContainersAlive=True patch: {}", agent.stderr()))?;
    for (c, status) in [("quitter", "False"), ("app", "False")] {
        let pid = ctrd.container_pid(pod.container_id(c)).await?;
        std::fs::write(format!("/proc/{pid}/root/tmp/go"), "")?;
        api.wait_for(WAIT, |r| alive(r, status))
            .await
            .with_context(|| format!("no ContainersAlive={status} patch: {}", agent.stderr()))?;
    }

    // Scraped: the kill with its scope, both deaths, the fast path's write.
    let seen = |expr: &str, at_least: f64| {
        prom.vector(expr)
            .ok()
            .and_then(|r| r.first().and_then(sample_value))
            .is_some_and(|v| v >= at_least)
    };
    let scraped = eventually_async(SCRAPED, || {
        seen(
            "sum(observer_oom_kills_total{scope=\"container\",pod=\"oomer\",container=\"app\"})",
            1.0,
        ) && seen("sum(observer_detection_latency_seconds_count)", 2.0)
            && seen("sum(observer_fast_write_latency_seconds_count)", 1.0)
            && seen("sum(observer_status_write_latency_seconds_count)", 1.0)
    })
    .await;
    let (_, metrics) = http_get(listen, "/metrics").context("agent /metrics")?;
    ensure!(
        scraped,
        "prometheus never showed the kill and the deaths\nagent /metrics:\n{metrics}\nagent log:\n{}",
        agent.stderr()
    );

    // Every metric the dashboard names is one the agent exports (a misspelled name would only
    // give an empty panel).
    let names = exported(&metrics);
    for q in &queries {
        let refs = metric_names(&q.expr);
        ensure!(
            !refs.is_empty(),
            "panel {:?} names no observer_ metric: {}",
            q.panel,
            q.expr
        );
        for m in refs {
            ensure!(
                names.contains(&m),
                "panel {:?}: {m} is not in the agent's /metrics:\n{metrics}",
                q.panel
            );
        }
    }

    // Every query parses and answers with data; the exercised histograms with a number.
    let mut failures = Vec::new();
    let mut report = Vec::new();
    for q in &queries {
        let answer = prom.query(&q.expr)?;
        if answer["status"] != "success" {
            failures.push(format!("{:?}: {} -> {answer}", q.panel, q.expr));
            continue;
        }
        let result = answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if result.is_empty() {
            failures.push(format!("{:?}: {} -> empty", q.panel, q.expr));
            continue;
        }
        let values: Vec<f64> = result.iter().filter_map(sample_value).collect();
        if q.expr.starts_with("histogram_quantile(")
            && !values.iter().all(|v| v.is_finite() && *v > 0.0)
        {
            failures.push(format!(
                "{:?}: {} -> {values:?}, not a latency",
                q.panel, q.expr
            ));
        }
        report.push(format!(
            "{:?} {} -> {} series {values:?}",
            q.panel,
            q.expr,
            result.len()
        ));
    }
    // The report of what answered, shown with --nocapture.
    eprintln!("{}", report.join("\n"));
    if !failures.is_empty() {
        bail!(
            "{} of {} queries failed:\n{}",
            failures.len(),
            queries.len(),
            failures.join("\n")
        );
    }

    // The OOM panel shows the kill, by scope and by pod.
    let by_scope = queries
        .iter()
        .find(|q| q.panel == "OOM kills by scope")
        .context("an \"OOM kills by scope\" panel")?;
    let result = prom.vector(&by_scope.expr)?;
    ensure!(
        result
            .iter()
            .any(|s| s["metric"]["scope"] == "container" && sample_value(s) >= Some(1.0)),
        "{}: {result:?}",
        by_scope.expr
    );
    let by_pod = queries
        .iter()
        .find(|q| q.panel == "OOM kills by pod")
        .context("an \"OOM kills by pod\" panel")?;
    let result = prom.vector(&by_pod.expr)?;
    ensure!(
        result.iter().any(|s| {
            s["metric"]["namespace"] == "default"
                && s["metric"]["pod"] == "oomer"
                && s["metric"]["container"] == "app"
                && s["metric"]["scope"] == "container"
                && sample_value(s) >= Some(1.0)
        }),
        "{}: {result:?}",
        by_pod.expr
    );
    drop(prom);
    drop(agent);
    Ok(())
}
