//! From a container's death to the Kubernetes API, side by side in one run for the same deaths:
//!   (a) `observer run` (the release binary, as deployed, in `conditions` mode): the status patch
//!       that flips `observer.dev/ContainersAlive` to False, taken when it went on the wire (the
//!       kernel's receive timestamp of its first bytes, set inside the agent's send(2) on
//!       loopback: `observer_tests::wire`) and when the API stand-in's handler received it;
//!   (b) kubelet's path starts with its generic PLEG: a 1 s CRI ListContainers relist, taken when
//!       the first list that shows the container EXITED is received. kubelet's pod worker and
//!       status manager then sync the pod and patch its status; that part cannot run here, so
//!       (b) is a lower bound of kubelet's path.
//!
//! Every delay runs from the kernel's exit of the container's init (this process loads the probes
//! too and reads the exit's kernel timestamp, mapped to the wall clock), and, as before, from the
//! moment this process sends the init SIGKILL. The pods restart their container like kubelet (a
//! new attempt in the same sandbox), so each death flips the condition False and the restart True
//! again.
//!
//! Four phases, each with an agent of its own (`--realtime-priority 10`, as the DaemonSet runs
//! it): the machine as it is, then every core busy with a CPU hog at normal priority; in each, the
//! fast path on (the ContainersAlive=False patch sent from the PLEG's event by a real-time thread)
//! and off (`--fast-path false`: the status manager on the async runtime, the path before it).
//!
//!     sudo cargo bench -p observer-tests --bench api_path        (or: cargo xtask bench api_path)
//!
//! `OBSERVER_BENCH_DEATHS` sets the number of deaths per phase (default 60);
//! `OBSERVER_BENCH_LOADS` (`idle,busy`) and `OBSERVER_BENCH_FAST` (`off,on`) choose the phases.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, Result};
use nix::{sys::signal::Signal, unistd::Pid};
use observer_tests::bench::pct;
use observer_tests::kernel::Hogs;
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
    /// The init's pid and its exit in the kernel (wall clock).
    pid: Option<u32>,
    exited: Option<SystemTime>,
    relist: Option<SystemTime>,
    /// The patch as it left the agent (the kernel's receive timestamp on loopback) and as the
    /// stand-in received it.
    wire: Option<SystemTime>,
    patch: Option<SystemTime>,
}

#[derive(Default)]
struct Shared {
    deaths: Mutex<HashMap<String, Death>>,
    /// Kernel exits under /kubepods by pid, wall clock.
    exits: Mutex<HashMap<u32, SystemTime>>,
}

/// This process's own probes on /kubepods: the kernel's exit time of every process there.
fn kernel_exits(shared: &Arc<Shared>) -> Result<observer::pipeline::PipelineTask> {
    use observer::{kernel::KernelEvent, pipeline};
    let unified = pipeline::unified_mount(None)?;
    let roots = pipeline::watch_roots(&unified, ["/kubepods"])?;
    anyhow::ensure!(roots.len() == 1, "/kubepods does not exist");
    let (p, _rx) = pipeline::KernelPipeline::start(pipeline::PipelineConfig {
        unified,
        // An onlooker: no pod of its own, no walk.
        roots: observer::cgroup::KubeRoots::new(std::iter::empty::<&str>())?,
        probes: observer::kernel::ProbeOptions {
            watch: observer::kernel::Watch::Roots(roots),
            // Read at this reader's polls: a wake-up costs the dying task an irq_work, and our
            // probes, attached first, run before the agent's on the same tracepoint: the agent
            // would be measured late by it.
            wake: observer::kernel::Wake::Never,
            ..Default::default()
        },
        queue: 1024,
    })?;
    let clock = p.clock();
    let shared = Arc::clone(shared);
    let tap = move |e: &KernelEvent| {
        if let KernelEvent::Exit(x) = e {
            if x.group_dead {
                shared
                    .exits
                    .lock()
                    .unwrap()
                    .insert(x.task.tgid, clock.to_system_time(x.at));
            }
        }
    };
    Ok(p.spawn_with_tap(pipeline::ReaderThread::Realtime(10), tap, || {})?)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Load {
    Idle,
    Busy,
}

fn main() -> Result<()> {
    if !require_containerd() || !require_kernel() {
        return Ok(());
    }
    observer_tests::bench::init_tracing();
    let deaths = observer_tests::bench::env_count("OBSERVER_BENCH_DEATHS", DEFAULT_DEATHS)?;
    let list = |var: &str, default: &str| -> Vec<String> {
        std::env::var(var)
            .unwrap_or_else(|_| default.into())
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    };
    let mut phases = Vec::new();
    for load in list("OBSERVER_BENCH_LOADS", "idle,busy") {
        let load = match load.as_str() {
            "idle" => Load::Idle,
            "busy" => Load::Busy,
            other => anyhow::bail!("OBSERVER_BENCH_LOADS: {other}? (idle, busy)"),
        };
        for fast in list("OBSERVER_BENCH_FAST", "off,on") {
            let fast = match fast.as_str() {
                "on" => true,
                "off" => false,
                other => anyhow::bail!("OBSERVER_BENCH_FAST: {other}? (on, off)"),
            };
            phases.push((load, fast));
        }
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(deaths, phases))
}

/// One phase's figures (µs, sorted), for the comparison.
struct Summary {
    load: Load,
    fast: bool,
    wire: Vec<f64>,
    patch: Vec<f64>,
    relist: Vec<f64>,
}

async fn run(deaths: usize, phases: Vec<(Load, bool)>) -> Result<()> {
    let ctrd = Arc::new(Containerd::start().await?);
    let mut summaries = Vec::new();
    for (n, (load, fast)) in phases.into_iter().enumerate() {
        summaries.push(run_phase(&ctrd, n, load, fast, deaths).await?);
    }
    println!("\n### The phases side by side (delays from the kernel's exit of the init)\n");
    println!("| load | path | PATCH on the wire p50 | p99 | PATCH received p50 | p90 | p99 | max | seen | 1 s relist p50 | relist / PATCH p50 |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in &summaries {
        if s.patch.is_empty() {
            continue;
        }
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0}× |",
            match s.load {
                Load::Idle => "idle",
                Load::Busy => "every core busy (CPU hogs)",
            },
            if s.fast {
                "fast path (on the real-time reader thread)"
            } else {
                "status manager only (before)"
            },
            fmt_pct(&s.wire, 50.0),
            fmt_pct(&s.wire, 99.0),
            fmt_us(pct(&s.patch, 50.0)),
            fmt_us(pct(&s.patch, 90.0)),
            fmt_us(pct(&s.patch, 99.0)),
            fmt_us(*s.patch.last().unwrap()),
            s.patch.len(),
            if s.relist.is_empty() {
                "-".into()
            } else {
                fmt_us(pct(&s.relist, 50.0))
            },
            if s.relist.is_empty() {
                f64::NAN
            } else {
                pct(&s.relist, 50.0) / pct(&s.patch, 50.0)
            },
        );
    }
    Ok(())
}

async fn run_phase(
    ctrd: &Arc<Containerd>,
    n: usize,
    load: Load,
    fast: bool,
    deaths: usize,
) -> Result<Summary> {
    let t0 = Instant::now();
    let api = Arc::new(ApiStandIn::start().await?);
    let specs: Vec<PodSpec> = (0..PODS)
        .map(|i| {
            let spec = PodSpec::new(format!("path-{n}-{i}"));
            api.declare(&spec, NODE, &[("app", None)], Some(ALIVE));
            spec
        })
        .collect();
    let mut sandboxes = Vec::new();
    for spec in &specs {
        sandboxes.push(ctrd.run_sandbox(spec).await?);
    }
    let shared = Arc::new(Shared::default());
    let exits = kernel_exits(&shared)?;
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
        // A stand-in API reviews no tokens: the scrapes here are on loopback.
        "--metrics-access",
        "open",
        "--listen",
        &listen.to_string(),
        "--state-dir",
        &state.path().display().to_string(),
        "--realtime-priority",
        "10",
        "--fast-path",
        if fast { "true" } else { "false" },
        "--log",
        "warn",
    ])?;
    anyhow::ensure!(
        eventually_async(WAIT, || ok(listen, "/readyz")).await,
        "the agent never became ready:\n{}",
        agent.stderr()
    );
    let hogs = match load {
        Load::Busy => Some(Hogs::per_core()?),
        Load::Idle => None,
    };

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
    for (spec, pod) in specs.into_iter().zip(sandboxes) {
        drivers.push(tokio::spawn(drive_pod(
            Arc::clone(ctrd),
            Arc::clone(&api),
            Arc::clone(&shared),
            spec,
            pod,
            per_pod,
        )));
    }
    for d in drivers {
        d.await??;
    }
    drop(hogs);
    stop_tx.send(true)?;
    let relists = relister.await??;
    drop(exits);
    let writes = metric(listen, "observer_status_writes_total").unwrap_or(f64::NAN);
    let errors = metric(listen, "observer_status_write_errors_total").unwrap_or(f64::NAN);
    let fast_writes = metric(listen, "observer_fast_path_writes_total").unwrap_or(0.0);
    println!(
        "\n## Phase: {}, {}\n",
        match load {
            Load::Idle => "idle",
            Load::Busy => "every core busy (a CPU hog per core)",
        },
        if fast {
            "fast path on"
        } else {
            "fast path off (status manager only)"
        }
    );
    let (wire, patch, relist) = report(&shared, &relists, writes, errors, t0.elapsed());
    println!("- fast path patches accepted: {fast_writes}");
    // The agent's own account.
    for (name, what) in [
        (
            "observer_detection_latency_seconds",
            "kernel exit → the agent's view",
        ),
        (
            "observer_status_write_latency_seconds",
            "view change → status patch leaving the process",
        ),
        (
            "observer_fast_write_latency_seconds",
            "kernel exit → the fast path's patch leaving for the API",
        ),
    ] {
        let Some(h) = histogram(listen, name) else {
            println!("- {name}: not exported");
            continue;
        };
        let total = h.last().map_or(0, |b| b.1);
        if total == 0 {
            continue;
        }
        let bound = |q| quantile_bound(&h, q).map_or("-".into(), |s| fmt_us(s * 1e6));
        println!(
            "- {what} (`{name}`, {total} samples): p50 ≤ {}, p99 ≤ {}",
            bound(0.5),
            bound(0.99),
        );
    }
    drop(agent);
    Ok(Summary {
        load,
        fast,
        wire,
        patch,
        relist,
    })
}

/// One pod: start attempt n, wait until the API calls it alive, wait a random phase against the
/// relist tick, SIGKILL its init, wait until both paths saw the death, remove it; n + 1.
async fn drive_pod(
    ctrd: Arc<Containerd>,
    api: Arc<ApiStandIn>,
    shared: Arc<Shared>,
    spec: PodSpec,
    mut pod: Pod,
    deaths: usize,
) -> Result<()> {
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
        shared.record(&id, |d| {
            d.killed = Some(killed);
            d.pid = Some(pid);
        });
        let patch = api
            .wait_for(WAIT, |r| {
                r.seq >= since && r.code == 200 && alive(r, &spec.name) == Some("False")
            })
            .await;
        shared.record(&id, |d| {
            d.wire = patch.as_ref().and_then(|p| p.wire);
            d.patch = patch.map(|p| p.at);
        });
        let seen =
            eventually_async(WAIT, || shared.get(&id).is_some_and(|d| d.relist.is_some())).await;
        anyhow::ensure!(seen, "{id}: the relist never saw the death");
        // Our probes do not wake their reader: the exit is read at its next poll.
        let read = || shared.exits.lock().unwrap().get(&pid).copied();
        eventually_async(WAIT, || read().is_some()).await;
        let exited = read();
        shared.record(&id, |d| d.exited = exited);
        // Keeps the relist as short as on a node that garbage-collects dead containers.
        ctrd.remove_container(&id).await?;
        pod.containers.clear();
    }
    // The next phase's agent sees only its own pods.
    ctrd.remove_pod(&pod).await?;
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

fn fmt_pct(sorted: &[f64], p: f64) -> String {
    if sorted.is_empty() {
        "-".into()
    } else {
        fmt_us(pct(sorted, p))
    }
}

fn fmt_us(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.1} ms", us / 1000.0)
    }
}

/// Prints a phase's table; returns (PATCH on the wire, PATCH received, relist) from the kernel's
/// exit, µs sorted.
fn report(
    shared: &Shared,
    relists: &[Duration],
    writes: f64,
    errors: f64,
    took: Duration,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let deaths: Vec<Death> = shared
        .deaths
        .lock()
        .unwrap()
        .values()
        .filter(|d| d.killed.is_some())
        .cloned()
        .collect();
    let n = deaths.len();
    let series = |from: fn(&Death) -> Option<SystemTime>, to: fn(&Death) -> Option<SystemTime>| {
        let mut v: Vec<f64> = deaths
            .iter()
            .filter_map(|d| Some(delay_us(from(d)?, to(d)?)))
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let wire = series(|d| d.exited, |d| d.wire);
    let a = series(|d| d.exited, |d| d.patch);
    let b = series(|d| d.exited, |d| d.relist);
    let a_kill = series(|d| d.killed, |d| d.patch);
    let b_kill = series(|d| d.killed, |d| d.relist);
    let no_exit = deaths.iter().filter(|d| d.exited.is_none()).count();
    println!("A container's death to the API: {n} deaths (SIGKILL of the init), {PODS} pods, in {:.0} s; {no_exit} without a kernel exit time.\n", took.as_secs_f64());
    println!("| delay to | seen | missed | p50 | p90 | p99 | max |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, v) in [
        (
            "(a) from the kernel's exit: ContainersAlive False patch on the wire (its first bytes, kernel timestamp)",
            &wire,
        ),
        (
            "(a) from the kernel's exit: ContainersAlive False patch received by the API",
            &a,
        ),
        (
            "(b) from the kernel's exit: 1 s CRI relist shows EXITED (kubelet's path starts here)",
            &b,
        ),
        ("(a) from SIGKILL sent", &a_kill),
        ("(b) from SIGKILL sent", &b_kill),
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
    (wire, a, b)
}
