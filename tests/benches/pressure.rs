//! Memory warnings before the kill, measured: the agent (in-process, real probes, reconciler and
//! status manager, a runtime stand-in and the API stand-in) beside what users build today, a 1 s
//! poll of each container's usage with a 90 % threshold, in the same run on the same containers.
//!
//! - leaks: containers leaking anonymous memory at 1, 8 and 64 MiB/s into a 64 MiB limit (their
//!   own, then a pod-level one), 20 at once, started at even offsets over a second so the poll's
//!   phase is spread; and at 1 and 8 MiB/s beside 32 MiB of page cache they wrote first (as a
//!   container's logs and libraries are): lead time from the warning to the OOM kill, p50 and
//!   the minimum. The
//!   agent's warning is timed where users see it, its `MemoryNearLimit` Event arriving at the API
//!   stand-in; the kill at the kernel's OOM kill.
//! - workloads for 60 s: a loop reading a 160 MiB file through a 64 MiB limit (page cache at
//!   the limit all the time), bursts of 40 MiB held 200 ms, and a heap that grows quickly and
//!   stays at 84 % of the limit: warnings (the aim: none); a heap that stays at 95 %: one warning
//!   each; and the poll's alarms (its usage crossing 90 % upward).
//!
//! Root, the kernel's probes. `cargo bench -p observer-tests --bench pressure`
//! (`OBSERVER_PRESSURE_RUNS`, default 20: containers per leak row; `OBSERVER_PRESSURE_LEAKS=0`:
//! the workloads alone). Where its scratch directory is on tmpfs or ramfs (a guest booted from
//! its initramfs) the rows with page cache are left out.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use anyhow::{Context, Result};
use observer::{
    cgroup::{container_cgroup_path, pod_cgroup_path, CgroupDriver, CgroupMounts, Qos, Runtime},
    model::{ContainerId, PodUid},
};
use observer_tests::{
    apiserver::{pod_object, ApiStandIn},
    kernel::{require_kernel, workload, TestCgroup},
    stack::{AgentStack, RuntimeStandIn},
};

const NODE: &str = "bench-node";
const LIMIT: u64 = 64 << 20;
const POLL: Duration = Duration::from_secs(1);
const POLL_THRESHOLD: f64 = 0.90;

struct Pods {
    cg: TestCgroup,
    api: ApiStandIn,
    runtime: RuntimeStandIn,
    /// (name, uid, container id, container cgroup)
    pods: Vec<(String, PodUid, ContainerId, String)>,
    /// The cgroup each pod's limit is on (hierarchy-relative, in the memory hierarchy).
    limited: Vec<String>,
    memory_root: PathBuf,
    v2: bool,
}

impl Pods {
    async fn new(tag: &str, n: usize, pod_level: bool) -> Result<Self> {
        let mut cg = TestCgroup::new(tag)?;
        let api = ApiStandIn::start().await?;
        let runtime = RuntimeStandIn::default();
        let mut pods = Vec::new();
        let mut limited = Vec::new();
        for i in 0..n {
            let uid =
                PodUid::parse(&format!("{i:08x}-0000-4000-8000-00000000be7c")).context("uid")?;
            let cid = ContainerId::parse(&format!("{:064x}", 0xbe7c_0000u64 + i as u64))
                .context("cid")?;
            let sandbox = ContainerId::parse(&format!("{:064x}", 0x5a4d_be7c_0000u64 + i as u64))
                .context("sandbox")?;
            let (driver, qos) = (CgroupDriver::Cgroupfs, Qos::Burstable);
            let pod_cg = cg.mkdir(&pod_cgroup_path(driver, qos, &uid))?;
            let container = cg.mkdir(&container_cgroup_path(
                driver,
                qos,
                &uid,
                Runtime::Containerd,
                &cid,
            ))?;
            let name = format!("{tag}-{i}");
            api.add_pod(pod_object(
                &name,
                "default",
                &uid.to_string(),
                NODE,
                &[("app", (!pod_level).then_some("64Mi"))],
                None,
            ));
            runtime.pod(uid, "default", &name, sandbox);
            runtime.container(uid, "default", &name, cid, "app");
            let target = if pod_level { pod_cg } else { container.clone() };
            cg.limit_memory_of(&target, LIMIT)?;
            limited.push(target);
            pods.push((name, uid, cid, container));
        }
        let mounts = CgroupMounts::detect(None)?;
        let reader =
            observer::pressure::MemoryReader::new(&mounts).context("no memory controller")?;
        let v2 = reader.is_v2();
        let memory_root = if v2 {
            mounts.unified().context("cgroup2")?.mount_point.clone()
        } else {
            mounts
                .v1("memory")
                .context("v1 memory")?
                .mount_point
                .clone()
        };
        Ok(Self {
            cg,
            api,
            runtime,
            pods,
            limited,
            memory_root,
            v2,
        })
    }

    /// The agent on these pods, once its status manager listed them.
    async fn agent(&self) -> Result<AgentStack> {
        let stack = AgentStack::start(
            &self.cg,
            self.runtime.clone(),
            &self.api,
            NODE,
            observer::model::SystemClock,
        )
        .await?;
        tokio::time::timeout(Duration::from_secs(30), stack.status.pods().ready())
            .await
            .context("pods never listed")?;
        Ok(stack)
    }

    fn usage_file(&self, i: usize) -> PathBuf {
        let f = if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        self.memory_root
            .join(self.limited[i].trim_start_matches('/'))
            .join(f)
    }
}

/// What users build today: every second, each container's usage against 90 % of its limit.
/// Returns per container the times its usage crossed the threshold upward.
fn poll(pods: &Pods, stop: Arc<Mutex<bool>>) -> std::thread::JoinHandle<Vec<Vec<SystemTime>>> {
    let files: Vec<PathBuf> = (0..pods.pods.len()).map(|i| pods.usage_file(i)).collect();
    std::thread::spawn(move || {
        let mut alarms = vec![Vec::new(); files.len()];
        let mut above = vec![false; files.len()];
        while !*stop.lock().unwrap() {
            for (i, f) in files.iter().enumerate() {
                let usage: u64 = std::fs::read_to_string(f)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0);
                let hot = usage as f64 >= POLL_THRESHOLD * LIMIT as f64;
                if hot && !above[i] {
                    alarms[i].push(SystemTime::now());
                }
                above[i] = hot;
            }
            std::thread::sleep(POLL);
        }
        alarms
    })
}

fn pct(v: &mut [f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[((v.len() - 1) as f64 * p).round() as usize])
}

fn ms(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.0} ms"))
}

struct LeakRow {
    label: String,
    runs: usize,
    /// Warned at all (the agent raised it), and with the Event at the API before the kill.
    raised: usize,
    warned: usize,
    lead: Vec<f64>,
    /// Warnings raised by a projected time to full (the charge path's crossings), and the time
    /// left they said, ms.
    projected: usize,
    said_left: Vec<f64>,
    polled: usize,
    poll_lead: Vec<f64>,
    killed: usize,
}

async fn leak_row(mib_per_s: u64, pod_level: bool, cache_mib: u64, n: usize) -> Result<LeakRow> {
    let tag = format!(
        "leak{mib_per_s}{}{cache_mib}",
        if pod_level { "p" } else { "c" }
    );
    let dir = scratch()?;
    let pods = Pods::new(&tag, n, pod_level).await?;
    let stack = pods.agent().await?;
    let stop = Arc::new(Mutex::new(false));
    let poller = poll(&pods, Arc::clone(&stop));
    let mut children = Vec::new();
    for (i, (_, _, cid, container)) in pods.pods.iter().enumerate() {
        // Even offsets over one poll period: the poll's phase against each leak is spread.
        tokio::time::sleep(POLL / n as u32).await;
        let rate = (mib_per_s * 1024).to_string();
        let file = dir
            .join(format!("{tag}-{i}"))
            .to_string_lossy()
            .into_owned();
        let cache = cache_mib.to_string();
        let args: Vec<&str> = if cache_mib > 0 {
            vec!["leak", &rate, &file, &cache]
        } else {
            vec!["leak", &rate]
        };
        let child = pods.cg.spawn_in(container, &workload(), &args)?;
        pods.runtime.started(*cid, child.id());
        children.push(child);
    }
    // Every leak ends in its OOM kill.
    let fill = Duration::from_secs_f64(64.0 / mib_per_s as f64);
    let deadline = tokio::time::Instant::now() + fill * 3 + Duration::from_secs(30);
    let kills: HashMap<ContainerId, SystemTime> = loop {
        let kills: HashMap<_, _> = pods
            .pods
            .iter()
            .filter_map(|(_, uid, cid, _)| {
                let v = stack.reconcile.pod(uid)?;
                let c = v.containers.iter().find(|c| c.id == *cid)?;
                Some((*cid, c.last_oom.as_ref()?.time))
            })
            .collect();
        if kills.len() == n || tokio::time::Instant::now() > deadline {
            break kills;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = stack.status.flush(Duration::from_secs(10)).await;
    *stop.lock().unwrap() = true;
    let alarms = poller.join().expect("poller");
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    let recorded = pods.api.recorded();
    let _ = std::fs::remove_dir_all(&dir);
    let mut row = LeakRow {
        label: format!(
            "{mib_per_s} MiB/s, {} limit{}",
            if pod_level { "pod" } else { "container" },
            if cache_mib > 0 {
                format!(", beside {cache_mib} MiB of page cache")
            } else {
                String::new()
            }
        ),
        runs: n,
        raised: 0,
        warned: 0,
        lead: Vec::new(),
        projected: 0,
        said_left: Vec::new(),
        polled: 0,
        poll_lead: Vec::new(),
        killed: kills.len(),
    };
    for (i, (name, uid, cid, _)) in pods.pods.iter().enumerate() {
        let Some(kill) = kills.get(cid) else { continue };
        let raised = stack.reconcile.pod(uid).is_some_and(|v| {
            v.containers
                .iter()
                .any(|c| c.id == *cid && c.memory.as_ref().is_some_and(|m| m.raises > 0))
        });
        row.raised += usize::from(raised);
        let warning = recorded.iter().find(|r| {
            r.method == "POST"
                && r.path().ends_with("/events")
                && r.body["reason"] == "MemoryNearLimit"
                && r.body["regarding"]["name"] == name.as_str()
        });
        if let Some(lead) = warning.and_then(|w| kill.duration_since(w.at).ok()) {
            row.warned += 1;
            row.lead.push(lead.as_secs_f64() * 1000.0);
        }
        let note = warning.and_then(|w| w.body["note"].as_str()).unwrap_or("");
        if note.contains("between its crossings") {
            row.projected += 1;
        }
        if let Some(left) = said_left(note) {
            row.said_left.push(left * 1000.0);
        }
        if let Some(lead) = alarms[i].first().and_then(|a| kill.duration_since(*a).ok()) {
            row.polled += 1;
            row.poll_lead.push(lead.as_secs_f64() * 1000.0);
        }
    }
    drop(stack);
    Ok(row)
}

/// "… growing 8.0 MiB/s (…): full in ~1.1 s" → 1.1.
fn said_left(note: &str) -> Option<f64> {
    let rest = &note[note.find("full in ~")? + "full in ~".len()..];
    rest.split(' ').next()?.parse().ok()
}

struct SafeRow {
    label: String,
    containers: usize,
    hits: f64,
    crossings: f64,
    warnings: usize,
    /// What the row should see: "none", or one warning per container.
    aim: &'static str,
    poll_alarms: usize,
}

/// The sum of a counter's series.
fn total(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .fold(0.0, |a, b| a + b)
}

async fn safe_row(label: &str, args: &[&str], n: usize, aim: &'static str) -> Result<SafeRow> {
    // The label names cgroups and pods too: letters and digits only there.
    let tag: String = label.chars().filter(char::is_ascii_alphanumeric).collect();
    let pods = Pods::new(&tag, n, false).await?;
    let stack = pods.agent().await?;
    let stop = Arc::new(Mutex::new(false));
    let poller = poll(&pods, Arc::clone(&stop));
    let dir = scratch()?;
    let mut children = Vec::new();
    for (i, (_, _, cid, container)) in pods.pods.iter().enumerate() {
        let file = dir.join(format!("{tag}-{i}"));
        let file = file.to_string_lossy().into_owned();
        let args: Vec<&str> = args
            .iter()
            .map(|a| if *a == "FILE" { file.as_str() } else { a })
            .collect();
        let child = pods.cg.spawn_in(container, &workload(), &args)?;
        pods.runtime.started(*cid, child.id());
        children.push(child);
    }
    for c in children {
        let out = tokio::task::spawn_blocking(move || c.wait_with_output()).await??;
        anyhow::ensure!(
            out.status.success(),
            "{label}: the workload failed: {out:?}"
        );
    }
    let _ = stack.status.flush(Duration::from_secs(10)).await;
    *stop.lock().unwrap() = true;
    let alarms = poller.join().expect("poller");
    let metrics = stack.metrics()?;
    let hits = total(&metrics, "observer_memory_limit_hits_total");
    let crossings = total(&metrics, "observer_memory_limit_crossings_total");
    let warnings = pods
        .api
        .recorded()
        .iter()
        .filter(|r| r.method == "POST" && r.body["reason"] == "MemoryNearLimit")
        .count();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(SafeRow {
        label: label.to_string(),
        containers: n,
        hits,
        crossings,
        warnings,
        aim,
        poll_alarms: alarms.iter().map(Vec::len).sum(),
    })
}

/// A directory on the disk (page cache, not tmpfs): target/tmp.
fn scratch() -> Result<PathBuf> {
    let dir = std::env::current_exe()?
        .ancestors()
        .nth(3)
        .context("target/")?
        .join("tmp")
        .join(format!("pressure-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    if !require_kernel() {
        return Ok(());
    }
    let n: usize = std::env::var("OBSERVER_PRESSURE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let mounts = CgroupMounts::detect(None)?;
    let v2 = observer::pressure::MemoryReader::new(&mounts).is_some_and(|r| r.is_v2());
    println!(
        "kernel {}, memory controller on {}",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")?.trim(),
        if v2 {
            "cgroup v2"
        } else {
            "cgroup v1 (hybrid)"
        }
    );
    // Page cache is what reclaim takes only on a disk filesystem: on tmpfs or ramfs (a guest
    // booted from its initramfs) it is shmem or locked, and the cache rows would measure nothing.
    let disk = {
        use nix::sys::statfs::{statfs, FsType, TMPFS_MAGIC};
        // linux/magic.h; nix names no constant for it.
        const RAMFS_MAGIC: FsType = FsType(0x8584_58f6);
        let dir = scratch()?;
        let kind = statfs(&dir)?.filesystem_type();
        let _ = std::fs::remove_dir_all(&dir);
        kind != TMPFS_MAGIC && kind != RAMFS_MAGIC
    };
    if !disk {
        println!("no disk filesystem here: the rows with page cache are left out");
    }
    let mut leaks = Vec::new();
    let rows = [
        (1, false, 0),
        (8, false, 0),
        (64, false, 0),
        (1, true, 0),
        (8, true, 0),
        (64, true, 0),
        (1, false, 32),
        (8, false, 32),
    ];
    // OBSERVER_PRESSURE_LEAKS=0: the workloads' table alone.
    let leaks_too = std::env::var("OBSERVER_PRESSURE_LEAKS").as_deref() != Ok("0");
    let rows = rows.into_iter().filter(|r| leaks_too && (disk || r.2 == 0));
    for (rate, pod_level, cache) in rows {
        let row = leak_row(rate, pod_level, cache, n).await?;
        eprintln!("{}: done", row.label);
        leaks.push(row);
    }
    // The plateaus: a heap that grows at 64 MiB/s and stays, at 53 MiB (with the process's own
    // pages about 84 % of the limit: under the kernel's 86 % threshold) and at 61 MiB (95 %).
    let mut safe = Vec::new();
    if disk {
        safe.push(safe_row("cache", &["cache", "FILE", "160", "60"], 4, "none").await?);
    }
    safe.extend([
        safe_row("bursty", &["bursty", "40", "60"], 4, "none").await?,
        safe_row(
            "plateau at 84 %",
            &["plateau", "53", "65536", "60"],
            4,
            "none",
        )
        .await?,
        safe_row(
            "plateau at 95 % (not safe)",
            &["plateau", "61", "65536", "60"],
            4,
            "one each",
        )
        .await?,
    ]);
    println!();
    println!("| leak into 64 MiB | killed | agent warned | its Event before the kill | agent lead p50 | agent lead min | warned by a projection | time left it said, p50 | 1 s poll ≥ 90 % alarmed before the kill | poll lead p50 | poll lead min |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &mut leaks {
        println!(
            "| {} | {}/{} | {}/{} | {}/{} | {} | {} | {}/{} | {} | {}/{} | {} | {} |",
            r.label,
            r.killed,
            r.runs,
            r.raised,
            r.killed,
            r.warned,
            r.killed,
            ms(pct(&mut r.lead, 0.5)),
            ms(pct(&mut r.lead, 0.0)),
            r.projected,
            r.raised,
            ms(pct(&mut r.said_left, 0.5)),
            r.polled,
            r.killed,
            ms(pct(&mut r.poll_lead, 0.5)),
            ms(pct(&mut r.poll_lead, 0.0)),
        );
    }
    println!();
    println!("| workload, 60 s, 64 MiB limit | containers | limit hits the kernel reported | threshold crossings | agent warnings | the aim | 1 s poll ≥ 90 % alarms |");
    println!("|---|---|---|---|---|---|---|");
    for r in &safe {
        println!(
            "| {} | {} | {:.0} | {:.0} | {} | {} | {} |",
            r.label, r.containers, r.hits, r.crossings, r.warnings, r.aim, r.poll_alarms
        );
    }
    Ok(())
}
