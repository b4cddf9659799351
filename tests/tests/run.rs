//! `observer run` end to end: the real kernel, the real containerd, and a recording stand-in for
//! the API server serving this node's pods. A container whose init is OOM-killed yields the
//! condition patches (the readinessGate's condition flips False, the OOM condition names the
//! victim) and the Event, in the exact shape the API takes them; `/metrics`, `/healthz` and
//! `/readyz` answer; `kubectl` reads the stand-in's answers as the API's; SIGTERM is a clean exit.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list

use anyhow::{Context, Result};
use nix::sys::signal::Signal;
use observer_tests::{
    agent::WAIT,
    apiserver::{pod_object, ApiStandIn, Recorded},
    endpoint::{free_listen, http_get},
    eventually_async,
    kernel::require_kernel,
    process::ObserverProcess,
    require_containerd, ContainerSpec, Containerd, PodSpec, Qos,
};
use serde_json::Value;

const NODE: &str = "node-1";
const ALIVE: &str = "observer.dev/ContainersAlive";
const OOM: &str = "observer.dev/OOMKilled";

/// The status of condition `type_` in a recorded status patch.
fn condition<'a>(r: &'a Recorded, type_: &str) -> Option<&'a Value> {
    r.body["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn status_patch(r: &Recorded, pod: &str) -> bool {
    r.method == "PATCH" && r.uri.contains(&format!("/pods/{pod}/status"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_init_oom_kill_reaches_the_api_as_conditions_and_an_event() -> Result<()> {
    if !require_containerd() || !require_kernel() {
        return Ok(());
    }
    observer_tests::init_tracing();
    let ctrd = Containerd::start().await?;
    let api = ApiStandIn::start().await?;
    let spec = PodSpec::new("oomer").qos(Qos::Burstable);
    api.add_pod(pod_object(
        &spec.name,
        &spec.namespace,
        &spec.uid,
        NODE,
        &[("app", Some("32Mi"))],
        Some(ALIVE),
    ));
    let kubeconfig = api.kubeconfig()?;
    let listen = free_listen();
    let sock = ctrd.socket().display().to_string();
    // Its own state directory: the agent locks it, and the host's may be a real agent's.
    let state = tempfile::tempdir()?;
    let mut agent = ObserverProcess::spawn(&[
        "run",
        "--state-dir",
        state.path().to_str().context("path")?,
        "--kubeconfig",
        kubeconfig.to_str().context("path")?,
        "--node-name",
        NODE,
        "--cri-endpoint",
        &sock,
        // A stand-in API reviews no tokens: the scrapes here are on loopback.
        "--metrics-access",
        "open",
        "--listen",
        &listen.to_string(),
    ])?;
    assert!(
        eventually_async(WAIT, || http_get(listen, "/readyz")
            .is_some_and(|(c, _)| c == 200))
        .await,
        "never ready: {:?}\n{}",
        http_get(listen, "/readyz"),
        agent.stderr()
    );
    assert_eq!(http_get(listen, "/healthz").map(|(c, _)| c), Some(200));

    // The init allocates past its limit once told to.
    let pod = ctrd
        .run_pod(spec.container(
            ContainerSpec::sh(
                "app",
                "while [ ! -e /tmp/go ]; do sleep 0.05; done; x=$(head -c 64m /dev/zero | tr '\\0' a); echo ${#x}",
            )
            .memory_limit_mib(32),
        ))
        .await?;
    let alive = api
        .wait_for(WAIT, |r| {
            status_patch(r, &pod.name) && condition(r, ALIVE).is_some_and(|c| c["status"] == "True")
        })
        .await
        .with_context(|| {
            format!(
                "no ContainersAlive True patch: {:#?}\n{}",
                api.recorded(),
                agent.stderr()
            )
        })?;
    // Exactly kubelet's shape: a strategic merge patch with the pod's UID as the precondition.
    assert_eq!(alive.content_type, "application/strategic-merge-patch+json");
    assert_eq!(alive.body["metadata"]["uid"], pod.uid.as_str());
    let pid = ctrd.container_pid(pod.container_id("app")).await?;
    std::fs::write(format!("/proc/{pid}/root/tmp/go"), "")?;

    // ContainersAlive=False comes in the fast path's own patch (or with the manager's, if the
    // fast path had not the pod's basis yet); OOMKilled is the manager's.
    api.wait_for(WAIT, |r| {
        status_patch(r, &pod.name) && condition(r, ALIVE).is_some_and(|c| c["status"] == "False")
    })
    .await
    .with_context(|| format!("no ContainersAlive False patch: {:#?}", api.recorded()))?;
    let died = api
        .wait_for(WAIT, |r| {
            status_patch(r, &pod.name) && condition(r, OOM).is_some_and(|c| c["status"] == "True")
        })
        .await
        .with_context(|| format!("no OOMKilled patch: {:#?}", api.recorded()))?;
    let oom = condition(&died, OOM).unwrap();
    let message = oom["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("pid {pid}")) && message.contains("app"),
        "{oom:#}"
    );
    // No kubelet-owned condition is ever written.
    for r in api.recorded().iter().filter(|r| status_patch(r, &pod.name)) {
        for c in r.body["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert!(
                c["type"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("observer.dev/")),
                "{c:#}"
            );
        }
    }

    let event = api
        .wait_for(WAIT, |r| {
            r.method == "POST"
                && r.uri
                    .contains("/apis/events.k8s.io/v1/namespaces/default/events")
                && r.body["reason"] == "OOMKilled"
        })
        .await
        .with_context(|| format!("no OOMKilled event: {:#?}", api.recorded()))?;
    let ev: k8s_openapi::api::events::v1::Event = serde_json::from_value(event.body.clone())?;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(ev.reporting_controller.as_deref(), Some("observer"));
    assert_eq!(ev.reporting_instance.as_deref(), Some(NODE));
    let regarding = ev.regarding.as_ref().context("regarding")?;
    assert_eq!(
        (regarding.name.as_deref(), regarding.uid.as_deref()),
        (Some("oomer"), Some(pod.uid.as_str()))
    );
    // Published once the kernel log's report was read: it names the limit that was hit.
    assert!(
        ev.note
            .as_deref()
            .is_some_and(|n| n.starts_with("container app hit its 32.0 MiB limit: ")
                && n.contains(&format!("pid {pid}"))),
        "{:?}",
        ev.note
    );

    // Metrics of what happened. The reconciler's own account of the death (the detection
    // histogram) may come after the fast path's patch and the Event: waited for, with a deadline.
    let value = |metrics: &str, name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(-1.0)
    };
    let settled = |m: &str| {
        value(m, "observer_detection_latency_seconds_count") >= 1.0
            && value(m, "observer_status_write_latency_seconds_count") >= 2.0
    };
    eventually_async(WAIT, || {
        http_get(listen, "/metrics").is_some_and(|(c, m)| c == 200 && settled(&m))
    })
    .await;
    let (code, metrics) = http_get(listen, "/metrics").context("metrics")?;
    assert_eq!(code, 200);
    let value = |name: &str| value(&metrics, name);
    assert!(
        metrics.contains(
            r#"observer_oom_kills_total{namespace="default",pod="oomer",container="app",scope="container"} 1"#
        ),
        "{metrics}"
    );
    assert!(value("observer_status_writes_total") >= 2.0, "{metrics}");
    assert!(
        value("observer_detection_latency_seconds_count") >= 1.0,
        "{metrics}"
    );
    // Each accepted patch is timed (the histogram was once left unwired).
    assert!(
        value("observer_status_write_latency_seconds_count") >= 2.0,
        "{metrics}"
    );
    assert_eq!(value("observer_kernel_ring_buffer_drops_total"), 0.0);
    // Dashboards and alerts name these: every metric keeps its name and type, whichever part
    // of the agent registers it. The list is the exposition's `# TYPE` lines, sorted.
    let mut names: Vec<&str> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .collect();
    names.sort_unstable();
    let expected: Vec<&str> = include_str!("run/metric_names.txt").lines().collect();
    assert_eq!(
        names,
        expected,
        "the metric names changed (tests/tests/run/metric_names.txt):\n{}",
        names.join("\n")
    );

    // kubectl, a real client, reads the stand-in's answers as the API's.
    let kubectl = |args: &[&str]| -> Result<Value> {
        let out = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .args(["-o", "json"])
            .output()
            .context("kubectl")?;
        anyhow::ensure!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    let pods = kubectl(&["get", "pods", "-A"])?;
    assert_eq!(pods["items"][0]["metadata"]["uid"], pod.uid.as_str());
    let events = kubectl(&["get", "events.events.k8s.io", "-A"])?;
    assert!(
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["reason"] == "OOMKilled"),
        "{events:#}"
    );

    let exit = agent.stop(Signal::SIGTERM)?;
    assert!(
        exit.success(),
        "SIGTERM is a clean exit: {exit:?}\n{}",
        agent.stderr()
    );
    Ok(())
}
