//! The readinessGate on the real one-node cluster: from a container's death to what a Service's
//! clients see, for pods gated on the agent's condition and, in the same run, pods without the
//! gate (kubelet alone), idle and with every core busy.
//!
//! For each death, from the moment this process sends the container's init SIGKILL (the kernel's
//! exit follows within microseconds):
//!   (a) the agent's `observer.dev/ContainersAlive=False` in the API;
//!   (b) the pod's `Ready=False` (for gated pods, kubelet recomputes it from the gate as soon as
//!       it sees the agent's condition; without the gate, after its PLEG relist and pod sync);
//!   (c) the pod's endpoint in its Service's EndpointSlice no longer ready (the EndpointSlice
//!       controller follows Ready).
//! Each is taken when a `kubectl get -w` of pods or EndpointSlices receives it: what any client of
//! the API sees, and the same watch path for both kinds of pods.
//!
//!     sudo cargo bench -p observer-tests --bench cluster        (or: cargo xtask bench cluster)
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
    set_agent_mode, test_guest, test_node, Cluster, Namespace, TestPod, Watch, POLL,
};
use observer_tests::kernel::Hogs;
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

/// Delays of one death, in milliseconds from the SIGKILL.
struct Death {
    load: Load,
    kind: Kind,
    alive: f64,
    ready: f64,
    endpoint: f64,
}

fn main() -> Result<()> {
    let Some(c) = require_cluster() else {
        return Ok(());
    };
    let deaths: usize = std::env::var("OBSERVER_BENCH_DEATHS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if emulated() {
            DEFAULT_DEATHS_EMULATED
        } else {
            DEFAULT_DEATHS
        });
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
    for load in [Load::Idle, Load::Busy] {
        let names = start_pods(c, &ns.name, load, deaths)?;
        let hogs = match load {
            Load::Busy => Some(Busy::start(c)?),
            Load::Idle => None,
        };
        for (name, kind) in names {
            // A death whose (a), (b) or (c) never shows is counted and reported, not fatal: under
            // emulation with every vCPU busy kubelet alone can take minutes.
            match one_death(c, &ns.name, &pods, &slices, &name, kind, load) {
                Ok(d) => results.push(d),
                Err(e) => {
                    eprintln!("\n{e:#}");
                    missed.push((load, kind));
                }
            }
            eprint!(".");
        }
        drop(hogs);
        eprintln!();
    }
    report(c, &results, &missed, deaths);
    Ok(())
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
fn start_pods(c: &Cluster, ns: &str, load: Load, deaths: usize) -> Result<Vec<(String, Kind)>> {
    let mut names = Vec::new();
    for i in 0..deaths {
        for kind in [Kind::Gated, Kind::Plain] {
            let name = format!("{}-{:?}-{i:02}", kind.service(), load).to_lowercase();
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

fn one_death(
    c: &Cluster,
    ns: &str,
    pods: &Watch,
    slices: &Watch,
    name: &str,
    kind: Kind,
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
        let (endpoint, _) = slices.first_since(killed, |s| {
            s["metadata"]["labels"]["kubernetes.io/service-name"] == kind.service()
                && !s["endpoints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|e| e["targetRef"]["name"] == name && e["conditions"]["ready"] == true)
        })?;
        Some(Death {
            load,
            kind,
            alive: ms(alive),
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

fn report(c: &Cluster, results: &[Death], missed: &[(Load, Kind)], deaths: usize) {
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
                        .map(f),
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
