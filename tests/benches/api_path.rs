//! From a container's death to the Kubernetes API, side by side in one run for the same deaths:
//!   (a) `observer run` (the release binary, as deployed, in `conditions` mode): the status patch
//!       that flips `observer.dev/ContainersAlive` to False, taken when it arrives at the API
//!       stand-in;
//!   (b) kubelet's path starts with its generic PLEG: a 1 s CRI ListContainers relist, taken when
//!       the first list that shows the container EXITED is received. kubelet's pod worker and
//!       status manager then sync the pod and patch its status; that part cannot run here, so
//!       (b) is a lower bound of kubelet's path.
//!
//! Every delay runs from the moment this process sends the container's init SIGKILL. The pods
//! restart their container like kubelet (a new attempt in the same sandbox), so each death flips
//! the condition False and the restart True again.
//!
//!     sudo cargo bench -p observer-tests --bench api_path        (or: cargo xtask bench api_path)
//!
//! `OBSERVER_BENCH_DEATHS` sets the number of deaths (default 60).
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, Result};
use nix::{sys::signal::Signal, unistd::Pid};
use observer_tests::{
    apiserver::{ApiStandIn, Recorded},
    endpoint::{free_listen, histogram, metric, ok, quantile_bound},
    eventually_async,
    kernel::require_kernel,
    process::ObserverProcess,
    relist::{relist_exited, RELIST_PERIOD},
    require_containerd, ContainerSpec, Containerd, Pod, PodSpec,
};
use tokio::sync::watch;

const NODE: &str = "bench-node";
const ALIVE: &str = "observer.dev/ContainersAlive";
/// Pods cycling at once.
const PODS: usize = 3;
const DEFAULT_DEATHS: usize = 60;
const WAIT: Duration = Duration::from_secs(20);

/// What was seen of one death.
#[derive(Default, Clone)]
struct Death {
    killed: Option<SystemTime>,
    relist: Option<SystemTime>,
    patch: Option<SystemTime>,
}

#[derive(Default)]
struct Shared {
    deaths: Mutex<HashMap<String, Death>>,
}

fn main() -> Result<()> {
    if !require_containerd() || !require_kernel() {
        return Ok(());
    }
    observer_tests::bench::init_tracing();
    let deaths = observer_tests::bench::env_count("OBSERVER_BENCH_DEATHS", DEFAULT_DEATHS)?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(deaths))
}

async fn run(deaths: usize) -> Result<()> {
    let t0 = Instant::now();
    let ctrd = Arc::new(Containerd::start().await?);
    let api = Arc::new(ApiStandIn::start().await?);
    let specs: Vec<PodSpec> = (0..PODS)
        .map(|i| {
            let spec = PodSpec::new(format!("path-{i}"));
            api.declare(&spec, NODE, &[("app", None)], Some(ALIVE));
            spec
        })
        .collect();
    let listen = free_listen();
    let state = tempfile::tempdir()?;
    let kubeconfig = api.kubeconfig()?;
    let agent = ObserverProcess::spawn(&[
        "run",
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--node-name",
        NODE,
        "--cri-endpoint",
        &ctrd.socket().display().to_string(),
        "--listen",
        &listen.to_string(),
        "--state-dir",
        &state.path().display().to_string(),
        "--log",
        "warn",
    ])?;
    anyhow::ensure!(
        eventually_async(WAIT, || ok(listen, "/readyz")).await,
        "the agent never became ready:\n{}",
        agent.stderr()
    );

    let shared = Arc::new(Shared::default());
    let (stop_tx, stop) = watch::channel(false);
    let relister = {
        let shared = Arc::clone(&shared);
        tokio::spawn(relist_exited(ctrd.cri()?, stop, move |id, at| {
            shared.record(id, |d| {
                d.relist.get_or_insert(at);
            })
        }))
    };
    let per_pod = deaths.div_ceil(PODS);
    let mut drivers = Vec::new();
    for spec in specs {
        drivers.push(tokio::spawn(drive_pod(
            Arc::clone(&ctrd),
            Arc::clone(&api),
            Arc::clone(&shared),
            spec,
            per_pod,
        )));
    }
    for d in drivers {
        d.await??;
    }
    stop_tx.send(true)?;
    let relists = relister.await??;
    let writes = metric(listen, "observer_status_writes_total").unwrap_or(f64::NAN);
    let errors = metric(listen, "observer_status_write_errors_total").unwrap_or(f64::NAN);
    report(&shared, &relists, writes, errors, t0.elapsed());
    // The agent's own account of the two halves of (a).
    for (name, what) in [
        (
            "observer_detection_latency_seconds",
            "kernel exit → the agent's view",
        ),
        (
            "observer_status_write_latency_seconds",
            "view change → status patch leaving the process",
        ),
    ] {
        let Some(h) = histogram(listen, name) else {
            println!("- {name}: not exported");
            continue;
        };
        let total = h.last().map_or(0, |b| b.1);
        let under = h
            .iter()
            .find(|(le, _)| (*le - 0.00512).abs() < 1e-9)
            .map_or(0, |b| b.1);
        let bound = |q| quantile_bound(&h, q).map_or("-".into(), |s| fmt_us(s * 1e6));
        println!(
            "- {what} (`{name}`, {total} samples): p50 ≤ {}, p99 ≤ {}, {:.1}% within 5.12 ms",
            bound(0.5),
            bound(0.99),
            100.0 * under as f64 / total.max(1) as f64
        );
    }
    drop(agent);
    Ok(())
}

/// One pod: start attempt n, wait until the API calls it alive, wait a random phase against the
/// relist tick, SIGKILL its init, wait until both paths saw the death, remove it; n + 1.
async fn drive_pod(
    ctrd: Arc<Containerd>,
    api: Arc<ApiStandIn>,
    shared: Arc<Shared>,
    spec: PodSpec,
    deaths: usize,
) -> Result<()> {
    let mut pod: Pod = ctrd.run_sandbox(&spec).await?;
    for attempt in 0..deaths {
        let since = api.recorded().len();
        let id = ctrd
            .add_container(
                &mut pod,
                ContainerSpec::new("app").restart_count(attempt as u32),
            )
            .await?;
        api.wait_for(WAIT, |r| {
            r.seq >= since && alive(r, &spec.name) == Some("True")
        })
        .await
        .with_context(|| format!("{}: attempt {attempt} never alive", spec.name))?;
        let pid = ctrd.container_pid(&id).await?;
        let phase = fastrand::u64(0..RELIST_PERIOD.as_millis() as u64);
        tokio::time::sleep(Duration::from_millis(phase)).await;
        let since = api.recorded().len();
        let killed = SystemTime::now();
        nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL)?;
        shared.record(&id, |d| d.killed = Some(killed));
        let patch = api
            .wait_for(WAIT, |r| {
                r.seq >= since && r.code == 200 && alive(r, &spec.name) == Some("False")
            })
            .await;
        shared.record(&id, |d| d.patch = patch.map(|p| p.at));
        let seen =
            eventually_async(WAIT, || shared.get(&id).is_some_and(|d| d.relist.is_some())).await;
        anyhow::ensure!(seen, "{id}: the relist never saw the death");
        // Keeps the relist as short as on a node that garbage-collects dead containers.
        ctrd.remove_container(&id).await?;
    }
    Ok(())
}

fn alive<'a>(r: &'a Recorded, pod: &str) -> Option<&'a str> {
    if r.method != "PATCH" || !r.path().ends_with(&format!("/pods/{pod}/status")) {
        return None;
    }
    r.body["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ALIVE)?["status"]
        .as_str()
}

impl Shared {
    fn record(&self, id: &str, f: impl FnOnce(&mut Death)) {
        f(self
            .deaths
            .lock()
            .unwrap()
            .entry(id.to_string())
            .or_default());
    }

    fn get(&self, id: &str) -> Option<Death> {
        self.deaths.lock().unwrap().get(id).cloned()
    }
}

fn delay_us(from: SystemTime, to: SystemTime) -> f64 {
    to.duration_since(from)
        .map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn fmt_us(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.1} ms", us / 1000.0)
    }
}

fn report(shared: &Shared, relists: &[Duration], writes: f64, errors: f64, took: Duration) {
    let deaths: Vec<Death> = shared
        .deaths
        .lock()
        .unwrap()
        .values()
        .filter(|d| d.killed.is_some())
        .cloned()
        .collect();
    let n = deaths.len();
    let series = |f: fn(&Death) -> Option<SystemTime>| {
        let mut v: Vec<f64> = deaths
            .iter()
            .filter_map(|d| Some(delay_us(d.killed?, f(d)?)))
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let a = series(|d| d.patch);
    let b = series(|d| d.relist);
    println!("\nA container's death to the API: {n} deaths (SIGKILL of the init), {PODS} pods, in {:.0} s.\n", took.as_secs_f64());
    println!("| delay from SIGKILL sent to | seen | missed | p50 | p90 | p99 | max |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, v) in [
        (
            "(a) observer run: ContainersAlive False patch received by the API",
            &a,
        ),
        (
            "(b) 1 s CRI relist shows EXITED (kubelet's path starts here; its sync and patch follow)",
            &b,
        ),
    ] {
        if v.is_empty() {
            println!("| {name} | 0 | {n} | - | - | - | - |");
            continue;
        }
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} |",
            v.len(),
            n - v.len(),
            fmt_us(pct(v, 50.0)),
            fmt_us(pct(v, 90.0)),
            fmt_us(pct(v, 99.0)),
            fmt_us(*v.last().unwrap()),
        );
    }
    if !a.is_empty() && !b.is_empty() {
        println!(
            "\n(b) / (a): p50 {:.0}×, p99 {:.0}×",
            pct(&b, 50.0) / pct(&a, 50.0),
            pct(&b, 99.0) / pct(&a, 99.0)
        );
    }
    let mut rt: Vec<f64> = relists.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    rt.sort_by(f64::total_cmp);
    if !rt.is_empty() {
        println!(
            "- {} relists, ListContainers round trip p50 {} / max {}",
            rt.len(),
            fmt_us(pct(&rt, 50.0)),
            fmt_us(*rt.last().unwrap())
        );
    }
    println!("- the agent's status writes: {writes} accepted, {errors} failed");
}
