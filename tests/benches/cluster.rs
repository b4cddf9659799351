//! The readinessGate on the real cluster, beside kubelet's own PLEG in both its forms: from a
//! container's death to what a Service's clients see, for pods gated on the agent's condition
//! and, in the same run, pods without the gate (kubelet alone), idle and with every core busy;
//! each of those under kubelet's generic PLEG and again under its Evented PLEG (kubelet restarted
//! with `EventedPLEG=true` between the two: in 1.37 the CRI event stream asks the generic PLEG for
//! an at-once relist of a pod whose container stopped, kubernetes#139262).
//!
//! For each death, from the moment this process sends the container's init SIGKILL (the kernel's
//! exit follows within microseconds):
//!   (a) the agent's `observer.dev/ContainersAlive=False` in the API;
//!   (t) kubelet's container status `terminated` in the API;
//!   (b) the pod's `Ready=False` (for gated pods, kubelet recomputes it from the gate as soon as
//!       it sees the agent's condition; without the gate, after its PLEG relist and pod sync);
//!   (c) the pod's endpoint in its Service's EndpointSlice no longer ready (the EndpointSlice
//!       controller follows Ready).
//! Each is taken when a `kubectl get -w` of pods or EndpointSlices receives it: what any client of
//! the API sees, and the same watch path for both kinds of pods. Then OOM kills (a 64 MiB buffer
//! in a 32 MiB container): the time to kubelet's `OOMKilled` and to the agent's `OOMKilled`
//! condition, and whether each said it. Per PLEG, the CPU time kubelet and the agent spent and
//! the API requests each made over the same deaths (the API server's audit log).
//!
//!     sudo cargo bench -p observer-tests --bench cluster        (or: cargo xtask bench cluster)
//!
//! The Evented PLEG needs a runtime with CRI GetContainerEvents (containerd 1.7+) and a kubelet
//! that has the 1.37 design: start the cluster with the host node on 1.37 (containerd 2.4 then):
//!
//!     cargo xtask cluster down && OBSERVER_HOST_KUBELET=1.37 cargo xtask cluster up
//!
//! `OBSERVER_BENCH_PLEG` (`generic,evented`) chooses the PLEGs (on the host node only: a guest's
//! kubelet keeps its defaults), `OBSERVER_BENCH_OOMS` the OOM kills per PLEG (default 5).
//!     sudo OBSERVER_CLUSTER_NODE=observer-node-2 cargo bench -p observer-tests --bench cluster
//!
//! The cluster is started (and the agent deployed from the release binary) as the real-cluster
//! suite does; `cargo xtask cluster down` stops it. `OBSERVER_BENCH_DEATHS` sets the deaths per
//! kind of pod and load (default 20; 10 on a guest node).
//!
//! With `OBSERVER_CLUSTER_NODE` naming a guest node (a Debian guest under qemu's software
//! emulation: docs/second-node.md) the pods run there, the SIGKILL is sent by a shell in the
//! guest that its guest agent starts (the delays count from the moment the guest agent is asked,
//! so they include that shell's start), and "busy" is one CPU hog per vCPU of the guest. Those
//! figures are of an emulated node: every step in the guest runs many times slower than on real
//! hardware, kubelet's above all.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use observer_tests::bench::pct;
use observer_tests::cluster::{
    agent_exclusive, apply, condition, container_init, emulated, get_json, require_cluster,
    set_agent_mode, test_guest, test_node, Cluster, Namespace, TestPod, Watch, AGENT_USER, POLL,
};
use observer_tests::kernel::Hogs;
use observer_tests::large_node;
use observer_tests::wait::poll_every;
use serde_json::Value;

const ALIVE: &str = "observer.dev/ContainersAlive";
const DEFAULT_DEATHS: usize = 20;
/// Under emulation each death waits for kubelet's slow account (20-26 s seen) one after another.
const DEFAULT_DEATHS_EMULATED: usize = 10;

/// How long one death may take to show (a), (b) and (c): longer under emulation, where kubelet
/// reports a death tens of seconds late.
fn wait() -> Duration {
    Duration::from_secs(if emulated() { 180 } else { 30 })
}

/// How long the pods may take to be Ready and in their endpoints.
fn start_deadline() -> Duration {
    Duration::from_secs(if emulated() { 1200 } else { 300 })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Load {
    Idle,
    Busy,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Gated,
    Plain,
}

impl Kind {
    fn service(self) -> &'static str {
        match self {
            Kind::Gated => "gated",
            Kind::Plain => "plain",
        }
    }
}

/// kubelet's PLEG.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pleg {
    /// Its relist every second (and, in 1.37, on demand).
    Generic,
    /// `EventedPLEG=true`: a container's stop in the CRI event stream asks for a relist at once.
    Evented,
}

impl Pleg {
    fn gates(self) -> Vec<(&'static str, bool)> {
        match self {
            Pleg::Generic => vec![],
            Pleg::Evented => vec![("EventedPLEG", true)],
        }
    }

    fn label(self) -> &'static str {
        match self {
            Pleg::Generic => "generic PLEG",
            Pleg::Evented => "Evented PLEG",
        }
    }
}

/// Delays of one death, in milliseconds from the SIGKILL.
struct Death {
    pleg: Pleg,
    load: Load,
    kind: Kind,
    alive: f64,
    terminated: f64,
    ready: f64,
    endpoint: f64,
}

/// One OOM kill: when each account of it reached the API, and what each said.
struct Oom {
    pleg: Pleg,
    /// kubelet's container status terminated (ms), and its reason.
    kubelet: Option<(f64, String)>,
    /// The agent's `observer.dev/OOMKilled=True` (ms).
    agent: Option<f64>,
}

/// What kubelet and the agent spent over one PLEG's deaths.
struct Spent {
    pleg: Pleg,
    secs: f64,
    kubelet_cpu: Option<f64>,
    agent_cpu: Option<f64>,
    kubelet_requests: u64,
    agent_requests: u64,
    deaths: usize,
}

fn main() -> Result<()> {
    let Some(c) = require_cluster() else {
        return Ok(());
    };
    let deaths: usize = env_number("OBSERVER_BENCH_DEATHS").unwrap_or(if emulated() {
        DEFAULT_DEATHS_EMULATED
    } else {
        DEFAULT_DEATHS
    });
    let ooms = env_number("OBSERVER_BENCH_OOMS").unwrap_or(5);
    let plegs = plegs(c)?;
    let _agent = agent_exclusive();
    set_agent_mode(c, None)?;
    let ns = Namespace::new(c, "bench-gate")?;
    for kind in [Kind::Gated, Kind::Plain] {
        let svc = serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": kind.service(), "namespace": ns.name},
            "spec": {"selector": {"bench": kind.service()}, "ports": [{"port": 80, "targetPort": 8080}]},
        });
        apply(c, &svc.to_string())?;
    }
    let pods = Watch::start(c, &["pods", "-n", &ns.name])?;
    let slices = Watch::start(c, &["endpointslices", "-n", &ns.name])?;

    let mut results = Vec::new();
    let mut missed = Vec::new();
    let mut killed = Vec::new();
    let mut spent = Vec::new();
    for &pleg in &plegs {
        if test_guest(c).is_none() {
            eprintln!(
                "kubelet restarted with {} ({:?})",
                pleg.label(),
                pleg.gates()
            );
            c.restart_kubelet_with_gates(&pleg.gates())?;
            wait_agent_ready(c)?;
        }
        let before = Usage::now(c);
        for load in [Load::Idle, Load::Busy] {
            let names = start_pods(c, &ns.name, pleg, load, deaths)?;
            let hogs = match load {
                Load::Busy => Some(Busy::start(c)?),
                Load::Idle => None,
            };
            for (name, kind) in names {
                // A death whose (a), (b) or (c) never shows is counted and reported, not fatal:
                // under emulation with every vCPU busy kubelet alone can take minutes.
                match one_death(c, &ns.name, &pods, &slices, &name, kind, pleg, load) {
                    Ok(d) => results.push(d),
                    Err(e) => {
                        eprintln!("\n{e:#}");
                        missed.push((pleg, load, kind));
                    }
                }
                eprint!(".");
            }
            drop(hogs);
            eprintln!();
        }
        let after = Usage::now(c);
        spent.push(after.since(&before, c, pleg, 4 * deaths));
        for i in 0..ooms {
            killed.push(one_oom(c, &ns.name, &pods, pleg, i)?);
            eprint!("o");
        }
        eprintln!();
    }
    if test_guest(c).is_none() && plegs.iter().any(|p| *p != Pleg::Generic) {
        c.restart_kubelet_with_gates(&[])?;
    }
    report(c, &results, &missed, deaths);
    report_plegs(&results, &killed, &spent);
    Ok(())
}

fn env_number(var: &str) -> Option<usize> {
    std::env::var(var).ok().and_then(|v| v.parse().ok())
}

/// The PLEGs to run: `OBSERVER_BENCH_PLEG`, else both where kubelet can be restarted with the
/// Evented PLEG (the host node with kubelet 1.36+ on containerd 2.x), else the generic one.
fn plegs(c: &Cluster) -> Result<Vec<Pleg>> {
    let host = c.versions().host_kubelet;
    let evented_ok = test_guest(c).is_none() && host.minor() >= 36;
    let wanted = std::env::var("OBSERVER_BENCH_PLEG").unwrap_or_default();
    if wanted.trim().is_empty() {
        if !evented_ok {
            eprintln!(
                "kubelet's Evented PLEG is left out: it is compared on the host node with kubelet \
                 1.37 (cargo xtask cluster down && OBSERVER_HOST_KUBELET=1.37 cargo xtask cluster \
                 up); this cluster's host kubelet is {host}"
            );
            return Ok(vec![Pleg::Generic]);
        }
        return Ok(vec![Pleg::Generic, Pleg::Evented]);
    }
    wanted
        .split(',')
        .map(|p| match p.trim() {
            "generic" => Ok(Pleg::Generic),
            "evented" if evented_ok => Ok(Pleg::Evented),
            "evented" => Err(anyhow!(
                "OBSERVER_BENCH_PLEG=evented needs the host node with kubelet 1.36+ (this cluster's is {host})"
            )),
            other => Err(anyhow!("OBSERVER_BENCH_PLEG: {other:?} is not generic or evented")),
        })
        .collect()
}

/// The agent Ready after kubelet's restart (its probes are kubelet's).
fn wait_agent_ready(c: &Cluster) -> Result<()> {
    poll_every(POLL, Duration::from_secs(120), || {
        let p = observer_tests::cluster::agent_pod(c).ok()?;
        condition(&p, "Ready")
            .is_some_and(|r| r["status"] == "True")
            .then_some(())
    })
    .ok_or_else(|| anyhow!("the agent is not Ready after kubelet's restart"))
}

/// kubelet's and the agent's CPU time and the API's audit log, at one moment (host node only: a
/// guest's processes are not this machine's).
struct Usage {
    at: std::time::SystemTime,
    kubelet: Option<f64>,
    agent: Option<f64>,
}

impl Usage {
    fn now(c: &Cluster) -> Self {
        let host = test_guest(c).is_none();
        let cpu = |pid: Option<u32>| pid.and_then(|p| large_node::usage(p).map(|u| u.0));
        Self {
            at: std::time::SystemTime::now(),
            kubelet: host
                .then(|| cpu(c.component_pid(observer_cluster::Component::Kubelet)))
                .flatten(),
            agent: host.then(|| cpu(large_node::agent_pid(c).ok())).flatten(),
        }
    }

    fn since(&self, before: &Usage, c: &Cluster, pleg: Pleg, deaths: usize) -> Spent {
        let audit = observer_tests::cluster::audit_events(c, before.at).unwrap_or_default();
        let node = format!("system:node:{}", test_node());
        let delta = |a: Option<f64>, b: Option<f64>| Some(a? - b?);
        Spent {
            pleg,
            secs: self
                .at
                .duration_since(before.at)
                .unwrap_or_default()
                .as_secs_f64(),
            kubelet_cpu: delta(self.kubelet, before.kubelet),
            agent_cpu: delta(self.agent, before.agent),
            kubelet_requests: large_node::cost(&audit, &node, before.at, self.at).requests(),
            agent_requests: large_node::cost(&audit, AGENT_USER, before.at, self.at).requests(),
            deaths,
        }
    }
}

/// One OOM kill: dd's 64 MiB buffer in a 32 MiB container, and when each account of it reached
/// the API.
fn one_oom(c: &Cluster, ns: &str, pods: &Watch, pleg: Pleg, i: usize) -> Result<Oom> {
    let name = format!(
        "oom-{}-{i:02}",
        pleg.label().split(' ').next().unwrap_or("pleg")
    )
    .to_lowercase();
    apply(
        c,
        &TestPod::new(&name, ns, "Never")
            .limited(
                "main",
                "sleep 1; exec dd if=/dev/zero of=/dev/null bs=64M count=1",
                "32Mi",
            )
            .manifest(),
    )?;
    // From the moment the container runs (its start is kubelet's account: the same for both).
    let started = poll_every(Duration::from_millis(5), start_deadline(), || {
        pods.first_since(Instant::now() - Duration::from_secs(600), |p| {
            p["metadata"]["name"] == name.as_str()
                && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
        })
        .map(|(t, _)| t)
    })
    .ok_or_else(|| anyhow!("{name} never ran"))?;
    let ms = |t: Instant| t.saturating_duration_since(started).as_secs_f64() * 1e3 - 1000.0;
    let this = |p: &Value| p["metadata"]["name"] == name.as_str();
    let seen = poll_every(Duration::from_millis(5), wait(), || {
        let kubelet = pods.first_since(started, |p| {
            this(p) && p["status"]["containerStatuses"][0]["state"]["terminated"].is_object()
        });
        let agent = pods.first_since(started, |p| {
            this(p) && condition(p, "observer.dev/OOMKilled").is_some_and(|o| o["status"] == "True")
        });
        (kubelet.is_some() && agent.is_some()).then_some((kubelet, agent))
    });
    let (kubelet, agent) = seen.unwrap_or((None, None));
    Ok(Oom {
        pleg,
        kubelet: kubelet.map(|(t, p)| {
            let reason = p["status"]["containerStatuses"][0]["state"]["terminated"]["reason"]
                .as_str()
                .unwrap_or("")
                .to_string();
            (ms(t), reason)
        }),
        agent: agent.map(|(t, _)| ms(t)),
    })
}

fn report_plegs(results: &[Death], killed: &[Oom], spent: &[Spent]) {
    println!("\n## Beside kubelet's PLEGs: death to container terminated and Ready=False in a pod watch (ms)\n");
    println!("| kubelet PLEG | load | (t) kubelet's terminated p50 | p99 | (b) Ready=False, no gate p50 | p99 | (a) agent's condition p50 | p99 | (b) Ready=False, gated p50 | p99 |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for pleg in [Pleg::Generic, Pleg::Evented] {
        for load in [Load::Idle, Load::Busy] {
            let of = |kind: Kind, f: fn(&Death) -> f64| {
                sorted(
                    results
                        .iter()
                        .filter(|d| d.pleg == pleg && d.load == load && d.kind == kind)
                        .map(f),
                )
            };
            let t = of(Kind::Plain, |d| d.terminated);
            if t.is_empty() {
                continue;
            }
            let (bp, a, bg) = (
                of(Kind::Plain, |d| d.ready),
                of(Kind::Gated, |d| d.alive),
                of(Kind::Gated, |d| d.ready),
            );
            println!(
                "| {} | {load:?} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                pleg.label(),
                pct(&t, 50.0),
                pct(&t, 99.0),
                pct(&bp, 50.0),
                pct(&bp, 99.0),
                pct(&a, 50.0),
                pct(&a, 99.0),
                pct(&bg, 50.0),
                pct(&bg, 99.0)
            );
        }
    }
    println!("\n| kubelet PLEG | OOM kills | kubelet's terminated p50 (ms) | max | kubelet said OOMKilled | agent's OOMKilled condition p50 (ms) | max | agent said it |");
    println!("|---|---|---|---|---|---|---|---|");
    for pleg in [Pleg::Generic, Pleg::Evented] {
        let mine: Vec<&Oom> = killed.iter().filter(|o| o.pleg == pleg).collect();
        if mine.is_empty() {
            continue;
        }
        let k = sorted(mine.iter().filter_map(|o| o.kubelet.as_ref().map(|k| k.0)));
        let a = sorted(mine.iter().filter_map(|o| o.agent));
        let right = mine
            .iter()
            .filter(|o| o.kubelet.as_ref().is_some_and(|k| k.1 == "OOMKilled"))
            .count();
        println!(
            "| {} | {} | {:.1} | {:.1} | {right} of {} | {:.1} | {:.1} | {} of {} |",
            pleg.label(),
            mine.len(),
            pct(&k, 50.0),
            k.last().copied().unwrap_or(f64::NAN),
            mine.len(),
            pct(&a, 50.0),
            a.last().copied().unwrap_or(f64::NAN),
            a.len(),
            mine.len()
        );
    }
    println!("\n| kubelet PLEG | deaths | seconds | kubelet CPU (s) | agent CPU (s) | kubelet API requests | agent API requests |");
    println!("|---|---|---|---|---|---|---|");
    for s in spent {
        let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
        println!(
            "| {} | {} | {:.0} | {} | {} | {} | {} |",
            s.pleg.label(),
            s.deaths,
            s.secs,
            f(s.kubelet_cpu),
            f(s.agent_cpu),
            s.kubelet_requests,
            s.agent_requests
        );
    }
}

/// Every core of the test's node busy: a CPU hog per core of this machine, or per vCPU of the
/// guest (started and stopped through its guest agent).
enum Busy<'c> {
    Host(#[allow(dead_code)] Hogs),
    Guest(observer_cluster::Guest<'c>, Vec<i64>),
}

impl<'c> Busy<'c> {
    fn start(c: &'c Cluster) -> Result<Self> {
        let Some(guest) = test_guest(c) else {
            return Ok(Busy::Host(Hogs::per_core()?));
        };
        let pids = (0..guest_cpus(c)?)
            .map(|_| guest.spawn("/bin/sh", &["-c", "while :; do :; done"]))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Busy::Guest(guest, pids))
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if let Busy::Guest(guest, pids) = self {
            let pids: Vec<String> = pids.iter().map(i64::to_string).collect();
            let _ = guest.exec(
                "/bin/sh",
                &["-c", &format!("kill -9 {}", pids.join(" "))],
                Duration::from_secs(60),
            );
        }
    }
}

/// The test node's CPUs: this machine's, or the guest's (`nproc` there).
fn guest_cpus(c: &Cluster) -> Result<usize> {
    let Some(guest) = test_guest(c) else {
        return Ok(std::thread::available_parallelism().map_or(1, |n| n.get()));
    };
    let r = guest.exec("/usr/bin/nproc", &[], Duration::from_secs(60))?;
    r.stdout
        .trim()
        .parse()
        .map_err(|e| anyhow!("nproc in {}: {e}: {:?}", guest.name, r.stdout))
}

/// `deaths` pods of each kind, Ready and in their Service's endpoints; their names interleaved.
fn start_pods(
    c: &Cluster,
    ns: &str,
    pleg: Pleg,
    load: Load,
    deaths: usize,
) -> Result<Vec<(String, Kind)>> {
    let mut names = Vec::new();
    for i in 0..deaths {
        for kind in [Kind::Gated, Kind::Plain] {
            let name = format!("{}-{pleg:?}-{load:?}-{i:02}", kind.service()).to_lowercase();
            let mut pod = TestPod::new(&name, ns, "Never")
                .label("bench", kind.service())
                .container("main", "exec sleep 3600");
            if kind == Kind::Gated {
                pod = pod.readiness_gate(ALIVE);
            }
            apply(c, &pod.manifest())?;
            names.push((name, kind));
        }
    }
    poll_every(POLL, start_deadline(), || {
        let list = get_json(c, &["get", "pods", "-n", ns]).ok()?;
        let ready = list["items"]
            .as_array()?
            .iter()
            .filter(|p| {
                names
                    .iter()
                    .any(|(n, _)| p["metadata"]["name"] == n.as_str())
            })
            .filter(|p| condition(p, "Ready").is_some_and(|r| r["status"] == "True"))
            .count();
        let slices = get_json(c, &["get", "endpointslices", "-n", ns]).ok()?;
        let endpoints = slices["items"]
            .as_array()?
            .iter()
            .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
            .filter(|e| {
                names
                    .iter()
                    .any(|(n, _)| e["targetRef"]["name"] == n.as_str())
            })
            .filter(|e| e["conditions"]["ready"] == true)
            .count();
        (ready == names.len() && endpoints == names.len()).then_some(())
    })
    .ok_or_else(|| anyhow!("{} pods not all Ready and in their endpoints", names.len()))?;
    Ok(names)
}

#[allow(clippy::too_many_arguments)]
fn one_death(
    c: &Cluster,
    ns: &str,
    pods: &Watch,
    slices: &Watch,
    name: &str,
    kind: Kind,
    pleg: Pleg,
    load: Load,
) -> Result<Death> {
    let pod = get_json(c, &["get", "pod", name, "-n", ns])?;
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .ok_or_else(|| anyhow!("{name}: no container id"))?;
    let killed = container_init(c, id)?.kill()?;
    let this = |p: &Value| p["metadata"]["name"] == name;
    let ms = |t: Instant| t.duration_since(killed).as_secs_f64() * 1e3;
    let seen = poll_every(Duration::from_millis(5), wait(), || {
        let (alive, _) = pods.first_since(killed, |p| {
            this(p) && condition(p, ALIVE).is_some_and(|a| a["status"] == "False")
        })?;
        let (ready, _) = pods.first_since(killed, |p| {
            this(p) && condition(p, "Ready").is_some_and(|r| r["status"] == "False")
        })?;
        let (terminated, _) = pods.first_since(killed, |p| {
            this(p) && p["status"]["containerStatuses"][0]["state"]["terminated"].is_object()
        })?;
        let (endpoint, _) = slices.first_since(killed, |s| {
            s["metadata"]["labels"]["kubernetes.io/service-name"] == kind.service()
                && !s["endpoints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|e| e["targetRef"]["name"] == name && e["conditions"]["ready"] == true)
        })?;
        Some(Death {
            pleg,
            load,
            kind,
            alive: ms(alive),
            terminated: ms(terminated),
            ready: ms(ready),
            endpoint: ms(endpoint),
        })
    });
    seen.ok_or_else(|| anyhow!("{name}: not all of (a), (b), (c) seen within {:?}", wait()))
}

fn sorted(v: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    v
}

fn report(c: &Cluster, results: &[Death], missed: &[(Pleg, Load, Kind)], deaths: usize) {
    // The gate's table is of the first PLEG (kubelet's default); the PLEGs side by side follow.
    let first = results.first().map_or(Pleg::Generic, |d| d.pleg);
    let results: Vec<&Death> = results.iter().filter(|d| d.pleg == first).collect();
    let missed: Vec<(Load, Kind)> = missed
        .iter()
        .filter(|m| m.0 == first)
        .map(|m| (m.1, m.2))
        .collect();
    let cores = guest_cpus(c).unwrap_or(0);
    let node = test_node();
    let emulation = if emulated() {
        ", a guest under qemu's software emulation (TCG): every step in it runs many times slower than on hardware; the SIGKILL sent by a shell the guest agent starts"
    } else {
        ""
    };
    println!(
        "\n{deaths} deaths per kind and load on node {node}{emulation}; delays in ms from the SIGKILL of the container's init; busy: one CPU hog per core of the node ({cores})\n"
    );
    println!("| load | pods | (a) agent's condition False p50 | (a) p99 | (b) Ready=False p50 | (b) p99 | (c) endpoint not ready p50 | (c) p99 |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut summary = Vec::new();
    for load in [Load::Idle, Load::Busy] {
        for kind in [Kind::Gated, Kind::Plain] {
            let of = |f: fn(&Death) -> f64| {
                sorted(
                    results
                        .iter()
                        .filter(|d| d.load == load && d.kind == kind)
                        .map(|d| f(d)),
                )
            };
            let (a, b, c) = (of(|d| d.alive), of(|d| d.ready), of(|d| d.endpoint));
            if a.is_empty() {
                continue;
            }
            println!(
                "| {load:?} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                match kind {
                    Kind::Gated => "gated on the agent's condition",
                    Kind::Plain => "no gate (kubelet alone)",
                },
                pct(&a, 50.0),
                pct(&a, 99.0),
                pct(&b, 50.0),
                pct(&b, 99.0),
                pct(&c, 50.0),
                pct(&c, 99.0),
            );
            summary.push((load, kind, b, c));
        }
    }
    for load in [Load::Idle, Load::Busy] {
        for kind in [Kind::Gated, Kind::Plain] {
            let n = missed.iter().filter(|m| **m == (load, kind)).count();
            if n > 0 {
                println!(
                    "\n{load:?}, {kind:?}: {n} of {deaths} deaths not seen in full within {:?} (left out above)",
                    wait()
                );
            }
        }
    }
    println!("\n| load | kubelet alone ÷ gated: (b) p50 | (b) p99 | (c) p50 | (c) p99 |");
    println!("|---|---|---|---|---|");
    for load in [Load::Idle, Load::Busy] {
        let find = |k| summary.iter().find(|s| s.0 == load && s.1 == k);
        if let (Some(g), Some(p)) = (find(Kind::Gated), find(Kind::Plain)) {
            println!(
                "| {load:?} | {:.1}× | {:.1}× | {:.1}× | {:.1}× |",
                pct(&p.2, 50.0) / pct(&g.2, 50.0),
                pct(&p.2, 99.0) / pct(&g.2, 99.0),
                pct(&p.3, 50.0) / pct(&g.3, 50.0),
                pct(&p.3, 99.0) / pct(&g.3, 99.0),
            );
        }
    }
}
