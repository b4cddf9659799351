//! Status manager benchmark, without a kernel or a cluster: the manager against kube's mock
//! service (tower-test) standing in for the API server, on a 2-worker multi-thread runtime.
//!
//! - latency: from the reconciled view's change (`ReconcileHandle::publish`) to the status PATCH arriving at the mock
//!   service (the request has left the manager, the writer and kube's client stack), one change
//!   at a time, each a real change of the ContainersAlive condition;
//! - writes per pod for a burst of 100 changes to one pod: handed over together, and spread out
//!   (one change every 100 µs against a server that takes 2 ms per request).
//!
//! Prints a markdown table. `cargo bench -p observer-tests --bench status`.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use http::{Request, Response};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::client::Body;
use observer::{
    reconcile::{ContainerPhase, ContainerView, PodView, ReconcileHandle},
    status::{StatusConfig, StatusHandle, StatusManager, StatusMode, StatusStats},
};
use serde_json::{json, Value};
use tokio::sync::mpsc;

const UID: &str = "0b6a3f5e-0000-4000-8000-00000000beef";

fn container(restart: u32, phase: ContainerPhase) -> ContainerView {
    let now = SystemTime::now();
    ContainerView {
        id: observer::model::ContainerId::parse(&format!("{:0>64}", restart)).unwrap(),
        name: "app".into(),
        restart_count: restart,
        image: "registry.local/app:1".into(),
        phase,
        created_at: Some(now),
        started_at: Some(now),
        finished_at: (phase == ContainerPhase::Exited).then_some(now),
        exit_code: (phase == ContainerPhase::Exited).then_some(1),
        signal: None,
        reason: (phase == ContainerPhase::Exited).then(|| "Error".to_string()),
        exit_source: (phase == ContainerPhase::Exited)
            .then_some(observer::reconcile::Source::Kernel),
        runtime_reason: None,
        runtime_exit_code: None,
        message: None,
        message_complete: false,
        init_pid: Some(1000 + restart),
        oom_kills: 0,
        last_oom: None,
        kernel_seen: true,
        memory: None,
    }
}

fn view(c: ContainerView) -> PodView {
    PodView {
        uid: observer::model::PodUid::parse(UID).unwrap(),
        namespace: "default".into(),
        name: "web".into(),
        sandbox_id: observer::model::ContainerId::parse(&"5".repeat(64)).unwrap(),
        sandbox_ready: true,
        created_at: Some(UNIX_EPOCH),
        containers: vec![c],
        last_oom: None,
    }
}

fn pod() -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default", "uid": UID, "resourceVersion": "1"},
    }))
    .map(|mut p: Pod| {
        p.spec = Some(PodSpec {
            node_name: Some("node-1".into()),
            containers: vec![Container {
                name: "app".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        p
    })
    .expect("pod")
}

struct Server {
    patches: Arc<AtomicUsize>,
    arrivals: mpsc::UnboundedReceiver<Instant>,
}

/// The stand-in API server: lists the pod, holds the watch, answers patches after `delay`
/// (recording when each arrived) and echoes events.
fn serve(
    mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
    delay: Duration,
) -> Server {
    let patches = Arc::new(AtomicUsize::new(0));
    let (tx, arrivals) = mpsc::unbounded_channel();
    let count = Arc::clone(&patches);
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let arrived = Instant::now();
            let (parts, body) = req.into_parts();
            let path = parts.uri.path().to_string();
            let query = parts.uri.query().unwrap_or("").to_string();
            if parts.method == http::Method::PATCH && path.ends_with("/status") {
                count.fetch_add(1, Ordering::SeqCst);
                let _ = tx.send(arrived);
                tokio::spawn(async move {
                    let _ = body.collect().await;
                    tokio::time::sleep(delay).await;
                    send.send_response(json_response(
                        200,
                        &json!({"kind": "Pod", "apiVersion": "v1"}),
                    ));
                });
            } else if path.contains("/events") {
                let bytes = body
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                send.send_response(json_response(201, &v));
            } else if query.contains("watch=true") {
                held.push(send);
            } else {
                let list = json!({"apiVersion": "v1", "kind": "PodList",
                                  "metadata": {"resourceVersion": "1"}, "items": [pod()]});
                send.send_response(json_response(200, &list));
            }
        }
    });
    Server { patches, arrivals }
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(v).expect("json")))
        .expect("response")
}

/// The manager, the view it reads (set by hand), and the API's mock.
async fn manager(delay: Duration) -> (StatusHandle, ReconcileHandle, Server) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, "default");
    let server = serve(handle, delay);
    let reconcile = ReconcileHandle::detached();
    let (m, h) = StatusManager::new(
        client,
        StatusConfig::new("node-1", StatusMode::Conditions),
        reconcile.clone(),
    );
    tokio::spawn(m.run());
    h.pods().ready().await;
    (h, reconcile, server)
}

async fn wait_writes(h: &StatusHandle, n: u64) {
    while StatusStats::get(&h.stats().writes) < n {
        tokio::time::sleep(Duration::from_micros(50)).await;
    }
}

fn pct(v: &[Duration], q: f64) -> Duration {
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn us(d: Duration) -> String {
    if d >= Duration::from_millis(1) {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{} µs", d.as_micros())
    }
}

async fn latency(samples: u32) -> Vec<Duration> {
    let (h, r, mut server) = manager(Duration::ZERO).await;
    let mut out = Vec::new();
    // Warm-up, then samples: alternate a running and a dead instance so that every change
    // flips the condition and is written.
    for i in 0..samples + 50 {
        let phase = if i % 2 == 0 {
            ContainerPhase::Running
        } else {
            ContainerPhase::Exited
        };
        let v = view(container(i, phase));
        let t0 = Instant::now();
        r.publish(v);
        let arrived = server.arrivals.recv().await.expect("a patch");
        wait_writes(&h, u64::from(i) + 1).await;
        if i >= 50 {
            out.push(arrived - t0);
        }
    }
    out.sort_unstable();
    out
}

async fn burst(spread: Option<Duration>, server_delay: Duration) -> usize {
    let (h, r, server) = manager(server_delay).await;
    r.publish(view(container(0, ContainerPhase::Running)));
    wait_writes(&h, 1).await;
    let before = server.patches.load(Ordering::SeqCst);
    // Ends on a death, so that the last state differs from the one written before the burst.
    for i in 1..=100u32 {
        let phase = if i % 2 == 0 {
            ContainerPhase::Exited
        } else {
            ContainerPhase::Running
        };
        r.publish(view(container(i, phase)));
        if let Some(d) = spread {
            let until = Instant::now() + d;
            while Instant::now() < until {
                tokio::task::yield_now().await;
            }
        }
    }
    // Let every write finish.
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.flush(Duration::from_secs(5)).await;
    server.patches.load(Ordering::SeqCst) - before
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let samples = 2000;
        let lat = latency(samples).await;
        let together = burst(None, Duration::from_millis(2)).await;
        let spread = burst(Some(Duration::from_micros(100)), Duration::from_millis(2)).await;
        println!("Status manager (conditions mode), kube's mock service as the API server.\n");
        println!("| view changed → status PATCH at the API's service | samples | p50 | p90 | p99 | max |");
        println!("|---|---:|---:|---:|---:|---:|");
        println!(
            "| one change at a time | {} | {} | {} | {} | {} |",
            lat.len(),
            us(pct(&lat, 0.5)),
            us(pct(&lat, 0.9)),
            us(pct(&lat, 0.99)),
            us(*lat.last().expect("samples"))
        );
        println!();
        println!("| burst of 100 changes to one pod (server takes 2 ms per patch) | status writes |");
        println!("|---|---:|");
        println!("| handed over together | {together} |");
        println!("| one every 100 µs | {spread} |");
    });
}
