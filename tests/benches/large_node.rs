//! A large node under faults, on the real cluster's host node: 250 running pods of four shapes
//! (one container, init + main, a native sidecar, two containers under a pod-level limit), half
//! gated on the agent's `ContainersAlive`, a steady churn (containers SIGKILLed at a fixed rate
//! and restarted by their policy, a pod replaced every 10 s), and every fault a node sees in the
//! middle of it. Measured side by side in one run:
//!
//! 1. death → the agent's condition False and → `Ready=False` as a pod watch receives them,
//!    gated pods against pods without the gate (kubelet alone), idle and with every core busy;
//! 2. what the agent and kubelet ask of the API server (requests by verb, status writes, Events,
//!    bytes of patches and of pod lists), per minute idle and during the churn, from the API
//!    server's audit log; and in the first minute after the API server comes back;
//! 3. the agent's, kubelet's and containerd's CPU and resident memory at 250 pods, and the
//!    agent's start-up to `/readyz` on a node that already holds them;
//! 4. the faults (agent SIGKILLed and rolled out, containerd and kubelet killed and restarted,
//!    the API server stopped for 20 s, etcd paused for 20 s, the API server throttling the agent
//!    with real 429s, a memory hog outside the pods), each repeated: every death the churn caused
//!    (its own SIGKILLs, the ground truth) against the agent's status writes (audit log) and
//!    Events: lost, stale, duplicated, and how late after the fault;
//! 5. a burst: one container of every pod killed within a second, and how the agent's writes
//!    follow (rate, the gated pods' first).
//!
//!     sudo cargo bench -p observer-tests --bench large_node      (or: cargo xtask bench large_node)
//!
//! `OBSERVER_BENCH_PODS` (250), `OBSERVER_BENCH_RATE` (deaths per second, 2),
//! `OBSERVER_BENCH_DEATHS` (latency deaths per kind and load, 20), `OBSERVER_BENCH_REPEATS`
//! (each fault, 3); `OBSERVER_BENCH_ONLY=burst` (or `startup`) brings the pods up and measures that alone.
//! The host's node only: a guest under software emulation does not start 250
//! pods in useful time.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, Result};
use observer_cluster::Component;
use observer_tests::bench::env_count;
use observer_tests::cluster::{
    agent_exclusive, agent_metric, condition, container_pid, emulated, require_cluster,
    set_agent_mode, Cluster, Namespace, Watch, AGENT_USER,
};
use observer_tests::kernel::Hogs;
use observer_tests::large_node::*;
use observer_tests::wait::poll_every;
use serde_json::Value;

/// Lets the churn run: a span of load, not a wait for a state.
fn churn_for(d: Duration) {
    std::thread::sleep(d);
}

fn main() -> Result<()> {
    let Some(c) = require_cluster() else {
        return Ok(());
    };
    if emulated() {
        println!("large_node: the host's node only (OBSERVER_CLUSTER_NODE names a guest)");
        return Ok(());
    }
    let pods = env_count("OBSERVER_BENCH_PODS", 250)?;
    let rate = match std::env::var("OBSERVER_BENCH_RATE") {
        Ok(v) => v
            .parse::<f64>()
            .map_err(|e| anyhow!("OBSERVER_BENCH_RATE={v}: {e}"))?,
        Err(_) => 2.0,
    };
    let deaths = env_count("OBSERVER_BENCH_DEATHS", 20)?;
    let repeats = env_count("OBSERVER_BENCH_REPEATS", 3)?;
    let _agent = agent_exclusive();
    set_agent_mode(c, None)?;
    let ns = Namespace::new(c, "bench-large")?;
    let since = SystemTime::now();
    let t = Instant::now();
    let fleet = Fleet::start(c, &ns.name, pods, 25, Duration::from_secs(1800))?;
    println!(
        "\n{pods} pods Ready in {:.0?} (25 applied at a time)",
        t.elapsed()
    );
    match std::env::var("OBSERVER_BENCH_ONLY").as_deref() {
        Err(_) => {}
        Ok("burst") => {
            settle(c, &ns.name, &fleet.pods, Duration::from_secs(300))?;
            report_burst(&burst(c, &ns.name)?);
            return Ok(());
        }
        Ok("startup") => {
            let mut took = Vec::new();
            for _ in 0..repeats {
                took.push(kill_agent(c, Duration::from_secs(300))?.1);
            }
            println!("\nstart-up to /readyz on the full node: {took:.1?}");
            return Ok(());
        }
        Ok(other) => {
            return Err(anyhow!(
                "OBSERVER_BENCH_ONLY={other}: only `burst` and `startup` are known"
            ))
        }
    }

    // Start-up on the full node: the agent killed, restarted by its DaemonSet.
    let (agent, startup) = kill_agent(c, Duration::from_secs(300))?;
    let pids = Pids {
        agent,
        kubelet: c.component_pid(Component::Kubelet),
        containerd: c.component_pid(Component::Containerd),
    };

    // Idle: a minute of nothing.
    let idle = Window::start(&pids);
    churn_for(Duration::from_secs(60));
    let idle = idle.end(&pids);

    // Latencies, one death at a time.
    let watch = Watch::start(c, &["pods", "-n", &ns.name])?;
    let mut lat = Vec::new();
    for load in ["idle", "busy"] {
        let hogs = (load == "busy").then(Hogs::per_core).transpose()?;
        lat.extend(latencies(c, &ns.name, &fleet, &watch, deaths, load)?);
        drop(hogs);
    }
    drop(watch);
    settle(c, &ns.name, &fleet.pods, Duration::from_secs(300))?;

    // Churn with no fault. The Events so far (the latencies' deaths) are not the churn's.
    let (seen, late) = agent_death_events(c, &ns.name)?;
    EVENTS_SEEN.with(|e| *e.borrow_mut() = seen);
    LATE_SEEN.with(|l| l.set(late));
    let churn = Churn::start(
        c,
        &fleet,
        ChurnConfig {
            deaths_per_sec: rate,
            replace_every: Some(Duration::from_secs(10)),
        },
    );
    let steady = Window::start(&pids);
    let steady_from = SystemTime::now();
    churn_for(Duration::from_secs(180));
    let steady = steady.end(&pids);
    let mut rows = Vec::new();
    rows.push(stock(
        c,
        &ns.name,
        &churn,
        "none (churn only)",
        1,
        steady_from,
        &[],
        None,
    )?);

    // Faults.
    let mut first_minutes = Vec::new();
    let mut startups = vec![startup];
    for fault in Fault::ALL {
        let from = SystemTime::now();
        let mut spans = Vec::new();
        let throttled_before = throttled_by_server(c).unwrap_or(0);
        let agent_throttled = agent_metric(c, "observer_status_throttled_total").unwrap_or(0.0);
        let fast_refused = agent_metric(c, "observer_fast_path_write_errors_total").unwrap_or(0.0);
        for _ in 0..repeats {
            churn_for(Duration::from_secs(15));
            let start = SystemTime::now();
            if let Some(s) = fault.inject(c, &churn)? {
                startups.push(s);
            }
            let end = SystemTime::now();
            spans.push(Span { start, end });
            if fault == Fault::ApiServerStop {
                first_minutes.push(end);
            }
            churn_for(Duration::from_secs(15));
        }
        let extra = (fault == Fault::Throttle).then(|| {
            format!(
                "{} requests rejected by the API server (429); the status manager retried {} writes after a 429; {} fast-path writes not accepted (handed to the status manager)",
                throttled_by_server(c).unwrap_or(0).saturating_sub(throttled_before),
                agent_metric(c, "observer_status_throttled_total").unwrap_or(0.0) - agent_throttled,
                agent_metric(c, "observer_fast_path_write_errors_total").unwrap_or(0.0) - fast_refused
            )
        });
        rows.push(stock(
            c,
            &ns.name,
            &churn,
            fault.name(),
            repeats,
            from,
            &spans,
            extra,
        )?);
        eprintln!("fault done: {}", fault.name());
    }
    let log = churn.stop();

    // The burst.
    let burst = burst(c, &ns.name)?;
    settle(c, &ns.name, &log.pods, Duration::from_secs(600))?;

    let audit = audit_events(c, since)?;
    report(&Report {
        pods,
        rate,
        deaths,
        repeats,
        lat: &lat,
        idle: &idle,
        steady: &steady,
        steady_from,
        rows: &rows,
        audit: &audit,
        first_minutes: &first_minutes,
        startups: &startups,
        burst: &burst,
        log: &log,
    });
    Ok(())
}

/// The processes measured: the agent (as started after the start-up measurement), kubelet,
/// containerd (its shims not counted).
struct Pids {
    agent: u32,
    kubelet: Option<u32>,
    containerd: Option<u32>,
}

/// CPU and memory over a span of time.
struct Window {
    at: Instant,
    wall: SystemTime,
    cpu: [f64; 3],
}

struct Usage {
    from: SystemTime,
    to: SystemTime,
    /// % of one core, and (RSS, peak RSS) in MiB: agent, kubelet, containerd.
    cpu: [f64; 3],
    rss: [(f64, f64); 3],
}

impl Window {
    fn start(p: &Pids) -> Self {
        Self {
            at: Instant::now(),
            wall: SystemTime::now(),
            cpu: sample(p).map(|u| u.map_or(0.0, |u| u.0)),
        }
    }

    fn end(self, p: &Pids) -> Usage {
        let secs = self.at.elapsed().as_secs_f64();
        let now = sample(p);
        let mut cpu = [0.0; 3];
        let mut rss = [(0.0, 0.0); 3];
        for i in 0..3 {
            if let Some((c, r, h)) = now[i] {
                cpu[i] = (c - self.cpu[i]) / secs * 100.0;
                rss[i] = (r as f64 / 1024.0, h as f64 / 1024.0);
            }
        }
        Usage {
            from: self.wall,
            to: SystemTime::now(),
            cpu,
            rss,
        }
    }
}

fn sample(p: &Pids) -> [Option<(f64, u64, u64)>; 3] {
    [
        usage(p.agent),
        p.kubelet.and_then(usage),
        p.containerd.and_then(usage),
    ]
}

/// One death's delays (ms from the SIGKILL) as a pod watch received them.
struct Lat {
    load: &'static str,
    gated: bool,
    alive: Option<f64>,
    ready: f64,
}

/// `n` deaths of gated and of plain pods, one at a time: the main container SIGKILLed, then the
/// watch's first `ContainersAlive=False` (gated pods: the agent writes it for every pod, gated
/// or not) and `Ready=False`.
fn latencies(
    c: &Cluster,
    ns: &str,
    fleet: &Fleet,
    watch: &Watch,
    n: usize,
    load: &'static str,
) -> Result<Vec<Lat>> {
    let mut out = Vec::new();
    let mut rng = fastrand::Rng::with_seed(250);
    for i in 0..2 * n {
        let gated = i % 2 == 0;
        let list = list_pods(c, ns)?;
        let candidates: Vec<&Value> = list
            .iter()
            .filter(|p| {
                let name = p["metadata"]["name"].as_str().unwrap_or_default();
                fleet
                    .pods
                    .iter()
                    .any(|f| f.name == name && f.gated == gated)
                    && condition(p, "Ready").is_some_and(|r| r["status"] == "True")
                    && condition(p, ALIVE).is_some_and(|r| r["status"] == "True")
            })
            .collect();
        if candidates.is_empty() {
            continue;
        }
        let p = candidates[rng.usize(..candidates.len())];
        let name = p["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let Some(id) = p["status"]["containerStatuses"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == "main"))
            .and_then(|s| s["containerID"].as_str())
        else {
            continue;
        };
        let pid = container_pid(id)?;
        let killed = Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )?;
        let this = |p: &Value| p["metadata"]["name"] == name.as_str();
        let ms = |t: Instant| t.duration_since(killed).as_secs_f64() * 1e3;
        let seen = poll_every(Duration::from_millis(5), Duration::from_secs(60), || {
            let (ready, _) = watch.first_since(killed, |p| {
                this(p) && condition(p, "Ready").is_some_and(|r| r["status"] == "False")
            })?;
            let alive = watch
                .first_since(killed, |p| {
                    this(p) && condition(p, ALIVE).is_some_and(|a| a["status"] == "False")
                })
                .map(|(t, _)| ms(t));
            Some(Lat {
                load,
                gated,
                alive,
                ready: ms(ready),
            })
        });
        match seen {
            Some(l) => out.push(l),
            None => eprintln!("{name}: Ready=False not seen within 60 s"),
        }
        // The pod back to Ready before the next death of its kind could pick it.
        let _ = poll_every(Duration::from_millis(200), Duration::from_secs(60), || {
            let p: Value = serde_json::from_str(
                &c.kubectl_ok(&["get", "pod", &name, "-n", ns, "-o", "json"])
                    .ok()?,
            )
            .ok()?;
            condition(&p, "Ready")
                .is_some_and(|r| r["status"] == "True")
                .then_some(())
        });
    }
    Ok(out)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    AgentKill,
    AgentRollout,
    Containerd,
    Kubelet,
    ApiServerStop,
    EtcdPause,
    Throttle,
    MemoryHog,
}

impl Fault {
    const ALL: [Fault; 8] = [
        Fault::AgentKill,
        Fault::AgentRollout,
        Fault::Containerd,
        Fault::Kubelet,
        Fault::ApiServerStop,
        Fault::EtcdPause,
        Fault::Throttle,
        Fault::MemoryHog,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::AgentKill => "agent SIGKILLed (DaemonSet restarts it)",
            Fault::AgentRollout => "agent rolled out",
            Fault::Containerd => "containerd SIGKILLed, restarted after 10 s",
            Fault::Kubelet => "kubelet SIGKILLed, restarted after 10 s",
            Fault::ApiServerStop => "kube-apiserver stopped 20 s",
            Fault::EtcdPause => "etcd paused (SIGSTOP) 20 s",
            Fault::Throttle => {
                "APF: the agent's share 1, rejects (429) for 30 s, 20 deaths at once"
            }
            Fault::MemoryHog => "memory hog outside the pods, 20 s",
        }
    }

    /// Injects the fault and returns once it is over; for the agent's kill, its start-up.
    fn inject(self, c: &Cluster, churn: &Churn) -> Result<Option<Duration>> {
        match self {
            Fault::AgentKill => return Ok(Some(kill_agent(c, Duration::from_secs(300))?.1)),
            Fault::AgentRollout => roll_out_agent(c)?,
            Fault::Containerd | Fault::Kubelet => {
                let comp = if self == Fault::Containerd {
                    Component::Containerd
                } else {
                    Component::Kubelet
                };
                c.kill_component(comp)?;
                churn_for(Duration::from_secs(10));
                c.start_component(comp)?;
            }
            Fault::ApiServerStop => {
                c.stop_component(Component::ApiServer);
                churn_for(Duration::from_secs(20));
                c.start_component(Component::ApiServer)?;
            }
            Fault::EtcdPause => {
                c.pause_component(Component::Etcd, true)?;
                churn_for(Duration::from_secs(20));
                c.pause_component(Component::Etcd, false)?;
            }
            Fault::Throttle => {
                throttle_agent(c, true)?;
                churn_for(Duration::from_secs(10));
                // Deaths of the ground truth too: the account expects their Events.
                churn.record(kill_many(c, "bench-large", 20)?);
                churn_for(Duration::from_secs(20));
                throttle_agent(c, false)?;
            }
            Fault::MemoryHog => MemoryHog::start(20)?.wait()?,
        }
        Ok(None)
    }
}

/// One fault's row: its window's deaths accounted, once the churn paused and both accounts
/// settled.
struct Row {
    fault: &'static str,
    repeats: usize,
    account: Account,
    extra: Option<String>,
    /// The pairs with more Events than deaths, described.
    duplicates: Vec<String>,
    /// The pairs with fewer Events than deaths, described.
    missing: Vec<String>,
}

#[allow(clippy::too_many_arguments)]
fn stock(
    c: &Cluster,
    ns: &str,
    churn: &Churn,
    fault: &'static str,
    repeats: usize,
    from: SystemTime,
    spans: &[Span],
    extra: Option<String>,
) -> Result<Row> {
    churn.pause();
    let log = churn.log();
    let stale = settle(c, ns, &log.pods, Duration::from_secs(300))?;
    let excluded: HashSet<String> = log.replaced.iter().cloned().collect();
    let deaths: Vec<Death> = log.deaths.into_iter().filter(|d| d.at >= from).collect();
    let counted = deaths.iter().filter(|d| !excluded.contains(&d.pod)).count() as u64;
    let before = EVENTS_SEEN.with(|e| e.borrow().clone());
    // The Events of this window published, or no change for 15 s.
    let mut last = (u64::MAX, Instant::now());
    let (after, late) = poll_every(Duration::from_secs(2), Duration::from_secs(180), || {
        let (told, late) = agent_death_events(c, ns).ok()?;
        let n: u64 = told
            .iter()
            .filter(|((p, _), _)| !excluded.contains(p))
            .map(|(k, n)| n - before.get(k).copied().unwrap_or(0).min(*n))
            .sum();
        if n != last.0 {
            last = (n, Instant::now());
        }
        (n >= counted || last.1.elapsed() > Duration::from_secs(15)).then_some((told, late))
    })
    .ok_or_else(|| anyhow!("the Events could not be listed"))?;
    let late_before = LATE_SEEN.with(|l| l.replace(late));
    EVENTS_SEEN.with(|e| *e.borrow_mut() = after.clone());
    let audit = audit_events(c, from)?;
    let writes = agent_writes(&audit, ns);
    let mut account = account(
        &deaths,
        &excluded,
        &writes,
        &before,
        &after,
        late - late_before.min(late),
        spans,
    );
    account.stale = stale;
    // Each pair with more, or fewer, Events than deaths, with its deaths and Events, while they
    // exist.
    let describe = |pairs: &[(String, String, u64, u64)]| -> Vec<String> {
        pairs
            .iter()
            .take(5)
            .map(|(pod, container, n, told)| {
                let at: Vec<String> = deaths
                    .iter()
                    .filter(|d| &d.pod == pod && &d.container == container)
                    .map(|d| format!("{:?}", time::OffsetDateTime::from(d.at).time()))
                    .collect();
                let events = agent_death_events_of(c, ns, pod, container).unwrap_or_default();
                format!(
                    "{pod}/{container}: {n} deaths (at {at:?}), {told} told; Events: {events:#?}"
                )
            })
            .collect()
    };
    let duplicates = describe(&account.duplicated);
    let missing = describe(&account.missing);
    churn.resume();
    Ok(Row {
        fault,
        repeats,
        account,
        extra,
        duplicates,
        missing,
    })
}

thread_local! {
    static EVENTS_SEEN: std::cell::RefCell<EventCounts> = Default::default();
    static LATE_SEEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The hosts pids of running containers, by container id, in one pass over /proc.
fn pids_by_id(ids: &HashSet<String>) -> HashMap<String, u32> {
    let mut out = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cg) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        let Some(id) = cg
            .lines()
            .filter_map(|l| l.rsplit('/').next())
            .find(|last| ids.contains(*last))
        else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !cmdline.starts_with(b"runc") {
            // The lowest pid of the container is its init.
            let e = out.entry(id.to_string()).or_insert(pid);
            *e = (*e).min(pid);
        }
    }
    out
}

/// SIGKILLs the main container of up to `n` running pods at once (`n` = 0: every pod); returns
/// each death.
fn kill_many(c: &Cluster, ns: &str, n: usize) -> Result<Vec<Death>> {
    let list = list_pods(c, ns)?;
    let mut targets: HashMap<String, (String, bool)> = HashMap::new();
    for p in &list {
        if !p["metadata"]["deletionTimestamp"].is_null() {
            continue;
        }
        let gated = p["spec"]["readinessGates"].is_array();
        let id = p["status"]["containerStatuses"]
            .as_array()
            .and_then(|s| {
                s.iter()
                    .find(|s| s["name"] == "main" && !s["state"]["running"].is_null())
            })
            .and_then(|s| s["containerID"].as_str())
            .and_then(|id| id.rsplit_once("://").map(|(_, id)| id.to_string()));
        if let Some(id) = id {
            let name = p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            targets.insert(id, (name, gated));
        }
        if n > 0 && targets.len() >= n {
            break;
        }
    }
    let ids: HashSet<String> = targets.keys().cloned().collect();
    let pids = pids_by_id(&ids);
    let mut out = Vec::new();
    for (id, pid) in pids {
        let at = SystemTime::now();
        if nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .is_ok()
        {
            let (pod, gated) = targets[&id].clone();
            out.push(Death {
                pod,
                container: "main".into(),
                container_id: id,
                at,
                gated,
            });
        }
    }
    Ok(out)
}

/// The burst: one container of every pod killed at once.
struct Burst {
    killed: usize,
    spread_ms: f64,
    /// ms from each pod's kill to the agent's `ContainersAlive=False` and to kubelet's
    /// `ContainersReady=False` as the API server completed them (audit log), gated and plain.
    agent: [Vec<f64>; 2],
    kubelet: [Vec<f64>; 2],
    /// The agent's status writes per second, at the busiest second.
    peak_writes_per_sec: usize,
    /// From the first kill to the last pod's False.
    all_written_ms: f64,
    /// Of the first N Falses the agent wrote (N: the gated pods killed), how many were gated
    /// pods': N when a gated pod's first death never waits behind another's.
    gated_first: usize,
    /// The agent's counters over the burst: how its deaths were written.
    counters: Vec<(&'static str, f64)>,
}

/// The agent's counters the burst reports, as differences over it.
const BURST_COUNTERS: [&str; 7] = [
    "observer_fast_path_deaths_total",
    "observer_fast_path_skipped_total",
    "observer_fast_path_dropped_total",
    "observer_fast_path_writes_total",
    "observer_fast_path_write_errors_total",
    "observer_status_writes_total",
    "observer_status_throttled_total",
];

/// A killed pod: gated?, when the agent's False and kubelet's were completed.
type Told = (bool, Option<SystemTime>, Option<SystemTime>);

fn burst(c: &Cluster, ns: &str) -> Result<Burst> {
    let before: Vec<f64> = BURST_COUNTERS
        .iter()
        .map(|n| agent_metric(c, n).unwrap_or(0.0))
        .collect();
    let from = SystemTime::now();
    let kills = kill_many(c, ns, 0)?;
    let first = kills.iter().map(|k| k.at).min().unwrap_or(from);
    let last = kills.iter().map(|k| k.at).max().unwrap_or(from);
    // Each killed pod's False from the agent and from kubelet (its own condition), or 120 s.
    let first_false = |writes: &BTreeMap<String, Vec<Write>>, pod: &str, at: SystemTime| {
        writes
            .get(pod)?
            .iter()
            .find(|w| w.received >= at && w.alive.as_deref() == Some("False"))
            .map(|w| w.completed)
    };
    let mut got: Vec<Told> = Vec::new();
    poll_every(Duration::from_secs(2), Duration::from_secs(120), || {
        let audit = audit_events(c, from).ok()?;
        let agent = agent_writes(&audit, ns);
        let kubelet = status_writes_by(&audit, ns, KUBELET_USER, "ContainersReady");
        got = kills
            .iter()
            .map(|k| {
                (
                    k.gated,
                    first_false(&agent, &k.pod, k.at),
                    first_false(&kubelet, &k.pod, k.at),
                )
            })
            .collect();
        got.iter()
            .all(|g| g.1.is_some() && g.2.is_some())
            .then_some(())
    });
    let audit = audit_events(c, from)?;
    let mut per_sec: HashMap<u64, usize> = HashMap::new();
    for w in agent_writes(&audit, ns).values().flatten() {
        let s = w
            .completed
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        *per_sec.entry(s).or_default() += 1;
    }
    let ms = |gated: bool, which: fn(&Told) -> Option<SystemTime>| {
        sorted(
            got.iter()
                .zip(&kills)
                .filter(|(g, _)| g.0 == gated)
                .filter_map(|(g, k)| which(g)?.duration_since(k.at).ok())
                .map(|d| d.as_secs_f64() * 1e3),
        )
    };
    let all = got.iter().filter_map(|g| g.1).max().unwrap_or(first);
    let mut order: Vec<(SystemTime, bool)> = got.iter().filter_map(|g| Some((g.1?, g.0))).collect();
    order.sort();
    let gated_killed = kills.iter().filter(|k| k.gated).count();
    let gated_first = order.iter().take(gated_killed).filter(|o| o.1).count();
    let counters = BURST_COUNTERS
        .iter()
        .zip(before)
        .map(|(n, b)| (*n, agent_metric(c, n).unwrap_or(0.0) - b))
        .collect();
    Ok(Burst {
        killed: kills.len(),
        spread_ms: last.duration_since(first).unwrap_or_default().as_secs_f64() * 1e3,
        agent: [ms(true, |g| g.1), ms(false, |g| g.1)],
        kubelet: [ms(true, |g| g.2), ms(false, |g| g.2)],
        peak_writes_per_sec: per_sec.values().copied().max().unwrap_or(0),
        all_written_ms: all.duration_since(first).unwrap_or_default().as_secs_f64() * 1e3,
        gated_first,
        counters,
    })
}

fn report_burst(b: &Burst) {
    println!(
        "\n5. Burst: {} main containers SIGKILLed within {:.0} ms; ms from each kill to the condition's False in the API (audit log: the request completed)\n",
        b.killed, b.spread_ms
    );
    println!("| pods | the agent's {ALIVE}=False: written | p50 | p99 | max | kubelet's ContainersReady=False: p50 | p99 | max |");
    println!("|---|---|---|---|---|---|---|---|");
    for (i, label) in ["gated", "plain"].iter().enumerate() {
        let (a, k) = (&b.agent[i], &b.kubelet[i]);
        println!(
            "| {label} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            a.len(),
            pct(a, 50.0),
            pct(a, 99.0),
            pct(a, 100.0),
            pct(k, 50.0),
            pct(k, 99.0),
            pct(k, 100.0)
        );
    }
    println!(
        "\nall written {:.0} ms after the first kill; the agent's busiest second: {} status writes; of the first {} Falses written, {} were gated pods'",
        b.all_written_ms,
        b.peak_writes_per_sec,
        b.agent[0].len(),
        b.gated_first
    );
    let counters: Vec<String> = b
        .counters
        .iter()
        .map(|(n, v)| {
            format!(
                "{} {v:.0}",
                n.trim_start_matches("observer_").trim_end_matches("_total")
            )
        })
        .collect();
    println!(
        "the agent's counters over the burst: {}",
        counters.join(", ")
    );
}

struct Report<'a> {
    pods: usize,
    rate: f64,
    deaths: usize,
    repeats: usize,
    lat: &'a [Lat],
    idle: &'a Usage,
    steady: &'a Usage,
    steady_from: SystemTime,
    rows: &'a [Row],
    audit: &'a [Value],
    first_minutes: &'a [SystemTime],
    startups: &'a [Duration],
    burst: &'a Burst,
    log: &'a ChurnLog,
}

fn sorted(v: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    v
}

fn report(r: &Report<'_>) {
    println!(
        "\nLarge node: {} pods (a quarter each: one container, init + main, native sidecar, pod-level limit; every other one gated on {ALIVE}) on the host's node, 2 cores",
        r.pods
    );
    println!(
        "\n1. Death → condition, {} deaths per kind and load, one at a time; ms from the SIGKILL to a pod watch receiving it\n",
        r.deaths
    );
    println!("| load | pods | {ALIVE}=False p50 | p99 | Ready=False p50 | p99 |");
    println!("|---|---|---|---|---|---|");
    let mut ready = HashMap::new();
    for load in ["idle", "busy"] {
        for gated in [true, false] {
            let of = |l: &&Lat| l.load == load && l.gated == gated;
            let a = sorted(r.lat.iter().filter(of).filter_map(|l| l.alive));
            let b = sorted(r.lat.iter().filter(of).map(|l| l.ready));
            if b.is_empty() {
                continue;
            }
            println!(
                "| {load} | {} | {:.1} | {:.1} | {:.1} | {:.1} |",
                if gated {
                    "gated on the agent's condition"
                } else {
                    "no gate (kubelet alone)"
                },
                pct(&a, 50.0),
                pct(&a, 99.0),
                pct(&b, 50.0),
                pct(&b, 99.0)
            );
            ready.insert((load, gated), b);
        }
    }
    for load in ["idle", "busy"] {
        if let (Some(g), Some(p)) = (ready.get(&(load, true)), ready.get(&(load, false))) {
            println!(
                "\n{load}: Ready=False, kubelet alone ÷ gated: p50 {:.1}×, p99 {:.1}×",
                pct(p, 50.0) / pct(g, 50.0).max(0.001),
                pct(p, 99.0) / pct(g, 99.0).max(0.001)
            );
        }
    }

    println!("\n2. What each asks of the API server, per minute (audit log; bytes: patch bodies sent, pod lists answered)\n");
    println!("| window | who | requests/min | by verb | status writes/min | Event writes/min | PodReport writes/min | patch KiB/min | pod-list KiB/min |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let steady_to = r.steady.to;
    for (label, from, to) in [
        ("idle", r.idle.from, r.idle.to),
        ("churn", r.steady_from, steady_to),
    ] {
        let mins = to.duration_since(from).unwrap_or_default().as_secs_f64() / 60.0;
        for (who, user) in [("agent", AGENT_USER), ("kubelet", KUBELET_USER)] {
            let k = cost(r.audit, user, from, to);
            println!(
                "| {label} | {who} | {:.0} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} |",
                k.requests() as f64 / mins,
                k.verbs(),
                k.status_writes as f64 / mins,
                k.event_writes as f64 / mins,
                k.report_writes as f64 / mins,
                k.write_bytes as f64 / 1024.0 / mins,
                k.list_bytes as f64 / 1024.0 / mins
            );
        }
    }
    println!("\nThe first minute after kube-apiserver came back (each restart):\n");
    println!("| restart | who | requests | by verb | pod-list KiB |");
    println!("|---|---|---|---|---|");
    for (i, back) in r.first_minutes.iter().enumerate() {
        for (who, user) in [("agent", AGENT_USER), ("kubelet", KUBELET_USER)] {
            let k = cost(r.audit, user, *back, *back + Duration::from_secs(60));
            println!(
                "| {} | {who} | {} | {} | {:.1} |",
                i + 1,
                k.requests(),
                k.verbs(),
                k.list_bytes as f64 / 1024.0
            );
        }
    }

    println!("\n3. Footprint at {} pods (CPU: % of one core; RSS and peak RSS in MiB; the agent's peak since its start on the full node)\n", r.pods);
    println!("| window | agent CPU | agent RSS / peak | kubelet CPU | kubelet RSS | containerd CPU | containerd RSS |");
    println!("|---|---|---|---|---|---|---|");
    for (label, u) in [("idle, 60 s", r.idle), ("churn, 180 s", r.steady)] {
        println!(
            "| {label} | {:.1} % | {:.1} / {:.1} | {:.1} % | {:.1} | {:.1} % | {:.1} |",
            u.cpu[0], u.rss[0].0, u.rss[0].1, u.cpu[1], u.rss[1].0, u.cpu[2], u.rss[2].0
        );
    }
    // The first start is on the quiet node; the others are the faults' (agent killed, rolled
    // out) in the middle of the churn, where the runtime answers the first sync's calls slower.
    let (quiet, churning) = r.startups.split_at(r.startups.len().min(1));
    for (label, v) in [("quiet", quiet), ("during the churn", churning)] {
        let s = sorted(v.iter().map(|d| d.as_secs_f64() * 1e3));
        println!(
            "\nThe agent's start-up to /readyz on the full node, {label} (process start → 200; the log says how long the API's first list and the runtime's first sync took), {} starts: p50 {:.0} ms, max {:.0} ms",
            s.len(),
            pct(&s, 50.0),
            pct(&s, 100.0)
        );
    }

    println!(
        "\n4. Faults during the churn ({} deaths/s, a pod replaced every 10 s), each repeated {}×; deaths counted outside replaced pods\n",
        r.rate, r.repeats
    );
    println!("| fault | deaths | during the fault | told in status | told by an Event (late) | lost | Events missing | duplicate Events | duplicate writes (resent unanswered) | death → False p50 / p99 ms | after the fault's end, max ms | stale True |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for row in r.rows {
        let a = &row.account;
        println!(
            "| {} | {} | {} | {} | {} ({}) | {} | {} | {} | {} ({}) | {:.0} / {:.0} | {:.0} | {} |",
            row.fault,
            a.deaths,
            a.during_fault,
            a.told_in_status,
            a.told_by_event,
            a.told_late,
            a.lost,
            a.events_missing,
            a.duplicate_events,
            a.duplicate_writes,
            a.resent_unanswered,
            pct(&a.delays_ms, 50.0),
            pct(&a.delays_ms, 99.0),
            a.after_fault_ms.last().copied().unwrap_or(0.0),
            a.stale.len()
        );
        let _ = row.repeats;
    }
    for row in r.rows {
        if let Some(e) = &row.extra {
            println!("\n{}: {e}", row.fault);
        }
        if !row.account.stale.is_empty() {
            println!("\n{}: stale pods {:?}", row.fault, row.account.stale);
        }
        for d in &row.duplicates {
            println!("\n{}: duplicate Events: {d}", row.fault);
        }
        for d in &row.missing {
            println!("\n{}: Events missing: {d}", row.fault);
        }
        for (pod, w, signature) in row.account.duplicate_writes_where.iter().take(5) {
            let t = |t: SystemTime| format!("{:?}", time::OffsetDateTime::from(t).time());
            println!(
                "\n{}: duplicate write: {pod}: received {} completed {}, then received {} completed {}: {signature}",
                row.fault,
                t(w[0].0),
                t(w[0].1),
                t(w[1].0),
                t(w[1].1)
            );
        }
    }
    println!(
        "\nThe churn: {} deaths in all, {} pods replaced, {} ticks with no container to kill",
        r.log.deaths.len(),
        r.log.replaced.len(),
        r.log.no_victim
    );

    report_burst(r.burst);
}
