//! How long after a container's init exits each way of detecting it knows, side by side in one
//! run, for the same deaths against the same private containerd:
//!   (a) observer's kernel-driven PLEG: ContainerDied out of the PLEG stream;
//!   (b) containerd's own `/tasks/exit` event (what CRI GetContainerEvents, kubelet's Evented PLEG,
//!       forwards in containerd 1.7+; 1.6 answers it Unimplemented, so this is its lower bound);
//!   (c) a 1 s CRI ListContainers relist, as kubelet's generic PLEG does.
//!
//! Every delay is measured from the kernel's exit timestamp of the init (the `at` of its exit
//! event, boot time mapped to the wall clock) to the wall time the consumer received the news.
//!
//!     sudo cargo bench -p observer-tests --bench detection        (or: cargo xtask bench detection)
//!
//! `OBSERVER_BENCH_DEATHS` sets the number of deaths (default 300); `OBSERVER_BENCH_CSV=<file>`
//! writes every death's three delays, to check the summary against.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant, SystemTime},
};

use anyhow::{bail, Context, Result};
use observer::{
    cri::{api, CriClient},
    kernel::{BootNs, KernelEvent, ProbeOptions, Watch},
    pipeline::{unified_mount, watch_roots, KernelPipeline, PipelineConfig, DEFAULT_QUEUE},
    pleg::{self, PlegEventType, PlegStats},
};
use observer_tests::{
    kernel::require_kernel, require_containerd, ContainerSpec, Containerd, Pod, PodSpec, Qos,
    TaskExit,
};
use tokio::sync::{watch, Notify};

/// Pods with a container in flight at once: enough overlap to be realistic, little enough that
/// two cores stay mostly idle and no consumer is slowed by the load we make.
const PODS: usize = 3;
const DEFAULT_DEATHS: usize = 300;
/// kubelet's generic PLEG relist period.
const RELIST_PERIOD: Duration = Duration::from_secs(1);
/// How long a pod's driver waits for all three consumers before moving on; a consumer that has not
/// seen the death by the end of the run counts it as missed.
const GATE: Duration = Duration::from_secs(10);
/// After the last death, time for stragglers to arrive before the consumers stop.
const DRAIN: Duration = Duration::from_secs(3);
/// kubelet's cgroupfs root, where the harness puts its pods.
const KUBEPODS: &str = "/kubepods";

#[derive(Clone, Copy, Debug)]
enum Death {
    /// `sh -c 'sleep 0.2; exit N'`.
    Exit(u8),
    /// SIGKILL from outside 0.2 s after start (a container's init ignores SIGKILL from inside its
    /// own pid namespace, so it cannot kill itself).
    Kill,
}

impl Death {
    fn expected_code(self) -> i32 {
        match self {
            Death::Exit(c) => i32::from(c),
            Death::Kill => 137,
        }
    }
}

struct RawExit {
    at: BootNs,
    /// `at` on the wall clock.
    wall: SystemTime,
    /// When this process read the record from the ring buffer.
    read: SystemTime,
}

struct PlegSeen {
    at: BootNs,
    /// The init's pid.
    pid: Option<u32>,
    /// `at` on the wall clock.
    kernel_exit: SystemTime,
    received: SystemTime,
    /// `None`: died without an exit record (ContainerStatusUnknown), `at` is not the exit's.
    exit_code: Option<i32>,
}

#[derive(Default)]
struct Seen {
    pleg: Option<PlegSeen>,
    task_exit: Option<TaskExit>,
    relist: Option<SystemTime>,
}

impl Seen {
    fn complete(&self) -> bool {
        self.pleg.is_some() && self.task_exit.is_some() && self.relist.is_some()
    }
}

/// What the consumers saw, by container id (any container, ours or not: a consumer may see a death
/// before the driver learns the id from StartContainer).
#[derive(Default)]
struct Shared {
    seen: Mutex<HashMap<String, Seen>>,
    /// Every whole-process exit under kubepods the kernel reported, by pid: the kernel's exit time
    /// for a death the PLEG missed, and a cross-check of the PLEG's `at` when it did not.
    raw_exits: Mutex<HashMap<u32, RawExit>>,
    changed: Notify,
}

impl Shared {
    fn record(&self, id: &str, f: impl FnOnce(&mut Seen)) {
        f(self.seen.lock().unwrap().entry(id.to_string()).or_default());
        self.changed.notify_waiters();
    }

    fn complete(&self, id: &str) -> bool {
        self.seen
            .lock()
            .unwrap()
            .get(id)
            .is_some_and(Seen::complete)
    }

    /// Waits until all three consumers saw `id`'s death, or `timeout`.
    async fn wait_complete(&self, id: &str, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.complete(id) {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }
}

struct Planned {
    id: String,
    death: Death,
}

fn main() -> Result<()> {
    if !require_containerd() || !require_kernel() {
        // Both print `SKIPPED: <why>` (and panic under CI=true instead).
        return Ok(());
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let deaths = match std::env::var("OBSERVER_BENCH_DEATHS") {
        Ok(v) => v.parse().context("OBSERVER_BENCH_DEATHS")?,
        Err(_) => DEFAULT_DEATHS,
    };
    // Two workers for two cores, as an agent would run.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(deaths))
}

async fn run(deaths: usize) -> Result<()> {
    let t0 = Instant::now();
    let ctrd = Arc::new(Containerd::start().await?);
    let mut pods = Vec::new();
    for i in 0..PODS {
        pods.push(
            ctrd.run_sandbox(&PodSpec::new(format!("det-{i}")).qos(Qos::Burstable))
                .await?,
        );
    }

    // The sandboxes made /kubepods exist: watch exactly that subtree, as the agent does.
    let unified = unified_mount(None)?;
    let roots = watch_roots(&unified, &[KUBEPODS])?;
    anyhow::ensure!(
        roots.len() == 1,
        "{KUBEPODS} does not exist after the sandboxes started"
    );
    let (pipeline, rx) = KernelPipeline::start(PipelineConfig {
        unified,
        scan_roots: vec![KUBEPODS.into()],
        probes: ProbeOptions {
            watch: Watch::Roots(roots),
            ..Default::default()
        },
        queue: DEFAULT_QUEUE,
    })?;

    let shared = Arc::new(Shared::default());
    let (stop_tx, stop) = watch::channel(false);
    let exits = ctrd.subscribe_task_exits().await?;
    let clock = pipeline.clock();
    let pleg_task = tokio::spawn(drive_pleg(pipeline, Arc::clone(&shared), stop.clone()));
    let pleg_consumer = tokio::spawn(consume_pleg(rx, clock, Arc::clone(&shared), stop.clone()));
    let exit_consumer = tokio::spawn(consume_task_exits(exits, Arc::clone(&shared), stop.clone()));
    let relister = tokio::spawn(relist(ctrd.cri()?, Arc::clone(&shared), stop.clone()));

    let started = Instant::now();
    let cpu_before = cpu_times();
    let next = Arc::new(AtomicUsize::new(0));
    let mut drivers = tokio::task::JoinSet::new();
    for pod in pods.clone() {
        drivers.spawn(drive_pod(
            Arc::clone(&ctrd),
            pod,
            Arc::clone(&shared),
            Arc::clone(&next),
            deaths,
        ));
    }
    let mut planned = Vec::new();
    while let Some(r) = drivers.join_next().await {
        planned.extend(r??);
    }
    let deaths_took = started.elapsed();
    let cpu_busy = cpu_before
        .zip(cpu_times())
        .map(|((b0, t0), (b1, t1))| (b1 - b0) as f64 / (t1 - t0).max(1) as f64);
    tokio::time::sleep(DRAIN).await;
    stop_tx.send(true)?;
    let (pleg_stats, kernel) = pleg_task.await??;
    let lagged = pleg_consumer.await??;
    exit_consumer.await??;
    let relists = relister.await??;
    // Before teardown, so a teardown problem cannot cost the figures.
    report(&Report {
        planned: &planned,
        shared: &shared,
        pleg_stats,
        lagged,
        kernel_drops: kernel.ringbuf_drops,
        relists: &relists,
        deaths_took,
        cpu_busy,
        total: t0.elapsed(),
    });
    for pod in &pods {
        ctrd.remove_pod(pod).await?;
    }
    match Arc::try_unwrap(ctrd) {
        Ok(mut c) => c.teardown(),
        Err(_) => bail!("containerd still shared at teardown"),
    }
}

/// One pod's container attempts, one at a time: start, let it die, wait until every consumer saw
/// the death (or [`GATE`]), remove it, next.
async fn drive_pod(
    ctrd: Arc<Containerd>,
    mut pod: Pod,
    shared: Arc<Shared>,
    next: Arc<AtomicUsize>,
    total: usize,
) -> Result<Vec<Planned>> {
    let mut planned = Vec::new();
    let mut attempt = 0;
    loop {
        let n = next.fetch_add(1, Ordering::Relaxed);
        if n >= total {
            return Ok(planned);
        }
        // A random phase against the relist's 1 s tick; without it the cycle (which waits for
        // the relist) would lock deaths to one phase and bias (c).
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..1000))).await;
        let death = match n % 3 {
            0 => Death::Exit(0),
            1 => Death::Exit(1),
            _ => Death::Kill,
        };
        let spec = match death {
            Death::Exit(code) => ContainerSpec::sh("main", &format!("sleep 0.2; exit {code}")),
            Death::Kill => ContainerSpec::new("main"),
        }
        .restart_count(attempt);
        attempt += 1;
        let id = ctrd.add_container(&mut pod, spec).await?;
        if let Death::Kill = death {
            let pid = ctrd.container_pid(&id).await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid)?),
                nix::sys::signal::Signal::SIGKILL,
            )?;
        }
        shared.wait_complete(&id, GATE).await;
        // Keeps the relist as short as on a node that garbage-collects dead containers.
        ctrd.remove_container(&id).await?;
        pod.containers.clear();
        planned.push(Planned { id, death });
    }
}

/// The agent's pipeline, woken by the ring buffer (epoll), never by a timer; its tap records
/// every whole-process exit with the time this process read it.
async fn drive_pleg(
    mut pipeline: KernelPipeline,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> Result<(PlegStats, observer::kernel::KernelCounters)> {
    let clock = pipeline.clock();
    loop {
        let tap = |e: &KernelEvent| {
            if let KernelEvent::Exit(x) = e {
                if x.group_dead {
                    let raw = RawExit {
                        at: x.at,
                        wall: clock.to_system_time(x.at),
                        read: SystemTime::now(),
                    };
                    shared.raw_exits.lock().unwrap().insert(x.task.tgid, raw);
                }
            }
        };
        tokio::select! {
            _ = stop.changed() => return Ok((pipeline.stats().pleg, pipeline.kernel_counters()?)),
            batch = pipeline.next_batch(tap) => { batch?; }
        }
    }
}

/// (a): stamps each ContainerDied as it comes out of the PLEG stream.
async fn consume_pleg(
    mut rx: pleg::PlegReceiver,
    clock: observer::kernel::BootClock,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> Result<u64> {
    loop {
        let ev = tokio::select! {
            biased;
            _ = stop.changed() => return Ok(rx.lagged()),
            ev = rx.recv() => match ev {
                Some(ev) => ev,
                // The PLEG task stops first at shutdown.
                None if *stop.borrow() => return Ok(rx.lagged()),
                None => bail!("PLEG stream ended"),
            },
        };
        let received = SystemTime::now();
        if ev.kind() != PlegEventType::ContainerDied {
            continue;
        }
        let (Some(id), Some(exit)) = (ev.container_id(), ev.exit()) else {
            continue;
        };
        let seen = PlegSeen {
            at: ev.at,
            pid: exit.pid,
            kernel_exit: clock.to_system_time(ev.at),
            received,
            exit_code: exit.status.map(|s| s.exit_code()),
        };
        shared.record(id.as_str(), |s| {
            s.pleg.get_or_insert(seen);
        });
    }
}

/// (b): containerd's `/tasks/exit`, stamped by the harness's stream as each message is decoded.
async fn consume_task_exits(
    mut exits: observer_tests::TaskExitStream,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> Result<()> {
    loop {
        let ev = tokio::select! {
            biased;
            _ = stop.changed() => return Ok(()),
            ev = exits.next() => ev?.context("containerd ended the event stream")?,
        };
        if ev.is_init() {
            let id = ev.container_id.clone();
            shared.record(&id, |s| {
                s.task_exit.get_or_insert(ev);
            });
        }
    }
}

/// (c): kubelet's generic PLEG: relist, then wait the period (its wait.Until slides the period
/// after each relist). Returns each relist's round-trip time.
async fn relist(
    cri: CriClient,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> Result<Vec<Duration>> {
    let mut rtts = Vec::new();
    loop {
        let t = Instant::now();
        let containers = cri.list_containers(None).await?;
        let received = SystemTime::now();
        rtts.push(t.elapsed());
        for c in containers {
            if c.state == api::ContainerState::ContainerExited as i32 {
                shared.record(&c.id, |s| {
                    s.relist.get_or_insert(received);
                });
            }
        }
        tokio::select! {
            _ = stop.changed() => return Ok(rtts),
            _ = tokio::time::sleep(RELIST_PERIOD) => {}
        }
    }
}

struct Report<'a> {
    planned: &'a [Planned],
    shared: &'a Shared,
    pleg_stats: PlegStats,
    lagged: u64,
    kernel_drops: u64,
    relists: &'a [Duration],
    deaths_took: Duration,
    /// Share of all CPUs busy (any process) while the deaths ran.
    cpu_busy: Option<f64>,
    total: Duration,
}

/// (busy, total) jiffies over all CPUs from /proc/stat.
fn cpu_times() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...: idle and iowait are not busy.
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3)? + fields.get(4)?;
    Some((total - idle, total))
}

/// Microseconds from `from` to `to` (negative if `to` is earlier).
fn delay_us(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(d) => d.as_secs_f64() * 1e6,
        Err(e) => -e.duration().as_secs_f64() * 1e6,
    }
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn fmt_us(us: f64) -> String {
    if us.abs() < 1000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.1} ms", us / 1000.0)
    }
}

fn fmt_ratio(r: f64) -> String {
    if r < 10.0 {
        format!("{r:.1}×")
    } else {
        format!("{r:.0}×")
    }
}

fn report(r: &Report<'_>) {
    let seen = r.shared.seen.lock().unwrap();
    let raw = r.shared.raw_exits.lock().unwrap();
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    let (mut reaped, mut ring) = (Vec::new(), Vec::new());
    let mut csv = vec!["container_id,death,a_us,b_us,c_us".to_string()];
    let (mut miss_a, mut miss_b, mut miss_c) = (0, 0, 0);
    let (mut no_kernel_time, mut unknown_exit) = (0, 0);
    let (mut at_checked, mut at_agree, mut code_disagree) = (0, 0, 0);
    let mut kinds = [0usize; 3];
    let mut a_by_kind: [Vec<f64>; 3] = Default::default();
    for p in r.planned {
        let kind = match p.death {
            Death::Exit(0) => 0,
            Death::Exit(_) => 1,
            Death::Kill => 2,
        };
        kinds[kind] += 1;
        let empty = Seen::default();
        let s = seen.get(&p.id).unwrap_or(&empty);
        let pleg = s.pleg.as_ref().filter(|x| x.exit_code.is_some());
        if s.pleg.as_ref().is_some_and(|x| x.exit_code.is_none()) {
            unknown_exit += 1;
        }
        let raw_exit = s.task_exit.as_ref().and_then(|t| raw.get(&t.pid));
        if let (Some(x), Some(e)) = (pleg, raw_exit) {
            at_checked += 1;
            at_agree += usize::from(x.at == e.at);
        }
        if let Some(e) = pleg.and_then(|x| raw.get(&x.pid?)) {
            ring.push(delay_us(e.wall, e.read));
        }
        for code in [
            pleg.and_then(|x| x.exit_code),
            s.task_exit.as_ref().map(|t| t.exit_status as i32),
        ]
        .into_iter()
        .flatten()
        {
            if code != p.death.expected_code() {
                code_disagree += 1;
                eprintln!(
                    "{}: expected exit code {}, a consumer saw {code}",
                    p.id,
                    p.death.expected_code()
                );
            }
        }
        // The kernel's exit time: from the PLEG's ContainerDied, else the raw exit of the pid
        // containerd reported.
        let Some(kernel) = pleg.map(|x| x.kernel_exit).or(raw_exit.map(|e| e.wall)) else {
            no_kernel_time += 1;
            eprintln!(
                "{}: no kernel exit time (PLEG and kernel exit both missing)",
                p.id
            );
            continue;
        };
        let cell = |t: Option<SystemTime>| {
            t.map_or(String::new(), |t| format!("{:.1}", delay_us(kernel, t)))
        };
        csv.push(format!(
            "{},{:?},{},{},{}",
            p.id,
            p.death,
            cell(pleg.map(|x| x.received)),
            cell(s.task_exit.as_ref().map(|t| t.received_at)),
            cell(s.relist)
        ));
        match pleg {
            Some(x) => {
                a.push(delay_us(kernel, x.received));
                a_by_kind[kind].push(delay_us(kernel, x.received));
            }
            None => {
                miss_a += 1;
                eprintln!("{}: missed by the PLEG", p.id);
            }
        }
        match &s.task_exit {
            Some(t) => {
                b.push(delay_us(kernel, t.received_at));
                reaped.push(delay_us(kernel, t.exited_at));
            }
            None => {
                miss_b += 1;
                eprintln!("{}: no /tasks/exit", p.id);
            }
        }
        match s.relist {
            Some(t) => c.push(delay_us(kernel, t)),
            None => {
                miss_c += 1;
                eprintln!("{}: never listed as EXITED", p.id);
            }
        }
    }
    if let Some(path) = std::env::var_os("OBSERVER_BENCH_CSV") {
        if let Err(e) = std::fs::write(&path, csv.join("\n") + "\n") {
            eprintln!("writing {}: {e}", path.to_string_lossy());
        }
    }
    for v in [&mut a, &mut b, &mut c, &mut reaped, &mut ring]
        .into_iter()
        .chain(a_by_kind.iter_mut())
    {
        v.sort_by(f64::total_cmp);
    }
    let n = r.planned.len();
    println!(
        "Container death detection: {n} deaths ({} exit 0, {} exit 1, {} SIGKILL from outside), {PODS} pods with one container in flight each, containerd {} + runc, kernel {}\n",
        kinds[0],
        kinds[1],
        kinds[2],
        version("containerd"),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    println!("| delay from the kernel's exit of the container's init to | seen | missed | p50 | p90 | p99 | max |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, v, missed) in [
        (
            "(a) observer: ContainerDied out of the PLEG stream",
            &a,
            miss_a,
        ),
        (
            "(b) containerd `/tasks/exit` received (Evented PLEG's source; its lower bound)",
            &b,
            miss_b,
        ),
        (
            "(c) 1 s CRI ListContainers relist shows EXITED (generic PLEG)",
            &c,
            miss_c,
        ),
    ] {
        if v.is_empty() {
            println!("| {name} | 0 | {missed} | - | - | - | - |");
            continue;
        }
        println!(
            "| {name} | {} | {missed} | {} | {} | {} | {} |",
            v.len(),
            fmt_us(pct(v, 50.0)),
            fmt_us(pct(v, 90.0)),
            fmt_us(pct(v, 99.0)),
            fmt_us(*v.last().unwrap())
        );
    }
    if !a.is_empty() && !b.is_empty() && !c.is_empty() {
        println!("\n| ratio | p50 | p99 |");
        println!("|---|---:|---:|");
        for (name, v) in [("(b) / (a)", &b), ("(c) / (a)", &c)] {
            println!(
                "| {name} | {} | {} |",
                fmt_ratio(pct(v, 50.0) / pct(&a, 50.0)),
                fmt_ratio(pct(v, 99.0) / pct(&a, 99.0))
            );
        }
    }
    println!(
        "\nHow: one process, one tokio runtime (2 workers); the PLEG task awaits the ring buffer (epoll) and a consumer task awaits the PLEG stream; (b) and (c) run beside it against the same containerd. Each time is SystemTime::now() taken in this process when the consumer received the event, minus the init's kernel exit timestamp (bpf_ktime_get_boot_ns, mapped to the wall clock with BootClock)."
    );
    println!(
        "Deaths start at a random phase against the relist tick; each container is removed once all three saw it (or after {} s), so the relist lists at most {PODS} containers.",
        GATE.as_secs()
    );
    let rtt = {
        let mut v: Vec<f64> = r.relists.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    println!("\nChecks and context:");
    println!(
        "- missed: (a) {miss_a}, (b) {miss_b}, (c) {miss_c}; deaths without any kernel exit time {no_kernel_time}; PLEG deaths without an exit record (ContainerStatusUnknown) {unknown_exit}"
    );
    println!(
        "- PLEG's `at` equals the kernel's exit record of the pid containerd reported: {at_agree}/{at_checked}; exit codes disagreeing with the planned death: {code_disagree}"
    );
    println!(
        "- kernel ring-buffer drops {}, PLEG unattributed {}, lost {}, resyncs {}, stream lagged {}",
        r.kernel_drops,
        r.pleg_stats.unattributed,
        r.pleg_stats.lost_records,
        r.pleg_stats.resyncs,
        r.lagged
    );
    if !ring.is_empty() {
        println!(
            "- of (a), the init's exit record read from the ring buffer by this process: p50 {} / p99 {} after the exit",
            fmt_us(pct(&ring, 50.0)),
            fmt_us(pct(&ring, 99.0))
        );
    }
    if a_by_kind.iter().all(|v| !v.is_empty()) {
        println!(
            "- (a) p50 by death: exit 0 {}, exit 1 {}, SIGKILL {}",
            fmt_us(pct(&a_by_kind[0], 50.0)),
            fmt_us(pct(&a_by_kind[1], 50.0)),
            fmt_us(pct(&a_by_kind[2], 50.0))
        );
    }
    if !reaped.is_empty() {
        println!(
            "- containerd's own exited_at (the shim reaping the init) trails the kernel exit by p50 {} / p99 {}",
            fmt_us(pct(&reaped, 50.0)),
            fmt_us(pct(&reaped, 99.0))
        );
    }
    if !rtt.is_empty() {
        println!(
            "- {} relists, ListContainers round trip p50 {} / max {}",
            rtt.len(),
            fmt_us(pct(&rtt, 50.0)),
            fmt_us(*rtt.last().unwrap())
        );
    }
    println!(
        "- deaths took {:.1} s, with {} of the machine's CPU busy (every process, this one and containerd included); containerd start to this report {:.1} s",
        r.deaths_took.as_secs_f64(),
        r.cpu_busy
            .map_or("?".into(), |b| format!("{:.0}%", b * 100.0)),
        r.total.as_secs_f64(),
    );
}

/// `<binary> --version`'s version word, e.g. `1.6.20~ds1`.
fn version(bin: &str) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(2)
                .map(String::from)
        })
        .unwrap_or_else(|| "?".into())
}
