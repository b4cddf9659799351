//! How long after a container's init exits each way of detecting it knows, side by side in one
//! run, for the same deaths against the same private containerd:
//!   (a) observer's kernel-driven PLEG: ContainerDied sent by the PLEG, on the reader's thread
//!       (and, beside it, (w) the line `observer watch --pods` writes for it, written to a pipe by
//!       the fast path on that same thread as `watch` does, and (a') when a consumer task on the
//!       async runtime received it: the old way to the user);
//!   (b) containerd's own `/tasks/exit` event (what CRI GetContainerEvents, kubelet's Evented PLEG,
//!       forwards in containerd 1.7+; 1.6 answers it Unimplemented, so this is its lower bound);
//!   (c) a 1 s CRI ListContainers relist, as kubelet's generic PLEG does.
//!
//! Every delay is measured from the kernel's exit timestamp of the init (the `at` of its exit
//! event, boot time mapped to the wall clock) to the wall time the consumer received the news.
//!
//! One command runs it in phases: the machine idle, then with every core busy with a CPU hog at
//! normal priority; in each, the agent's read → PLEG loop where each lever puts it (a task on the
//! async runtime as before, a thread of its own, that thread real-time), and a table per phase
//! and one comparing them.
//!
//!     sudo cargo bench -p observer-tests --bench detection        (or: cargo xtask bench detection)
//!
//! `OBSERVER_BENCH_DEATHS` sets the number of deaths per phase (default 150);
//! `OBSERVER_BENCH_LOADS` (`idle,busy`) and `OBSERVER_BENCH_READERS` (`task,thread,realtime`)
//! choose the phases; `OBSERVER_BENCH_CSV=<file>` writes every death's delays, to check the
//! summaries against.
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
    kernel::{BootNs, KernelEvent, ProbeOptions, Watch},
    pipeline::{
        unified_mount, watch_roots, KernelPipeline, PipelineConfig, ReaderThread, DEFAULT_QUEUE,
    },
    pleg::{self, PlegEventType, PlegStats},
};
use observer_tests::bench::pct;
use observer_tests::kernel::Hogs;
use observer_tests::{
    kernel::require_kernel, relist::relist_exited, require_containerd, ContainerSpec, Containerd,
    Pod, PodSpec, Qos, TaskExit,
};
use tokio::sync::{watch, Notify};

/// Pods with a container in flight at once: enough overlap to be realistic, little enough that
/// two cores stay mostly idle and no consumer is slowed by the load we make.
const PODS: usize = 3;
const DEFAULT_DEATHS: usize = 150;
/// The real-time priority of the `realtime` phases: the DaemonSet's.
const REALTIME_PRIORITY: u8 = 10;
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
    /// When the PLEG sent the event (on the loop's thread).
    sent: SystemTime,
    /// When the consumer task on the runtime received it.
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
    /// (w): when the fast path's line for a death was written to the pipe, by container id.
    written: Mutex<HashMap<String, SystemTime>>,
    changed: Notify,
}

/// (w): `watch --pods`' printer as it runs in the agent's loop (a JSON line per event, flushed at
/// the end of each batch), writing to a pipe that a normal-priority thread drains, as `| jq`
/// would. The time is taken when the flush returned.
struct LineWriter {
    out: std::io::BufWriter<std::fs::File>,
    clock: observer::model::BootClock,
    shared: Arc<Shared>,
    deaths: Vec<String>,
}

impl observer::pipeline::Hook for LineWriter {
    fn event(&mut self, ev: &pleg::PodLifecycleEvent, _sent: SystemTime) {
        use std::io::Write;
        let line = observer::present::render::pleg_line(ev, self.clock.to_system_time(ev.at));
        let _ = serde_json::to_writer(&mut self.out, &line);
        let _ = self.out.write_all(b"\n");
        if ev.kind() == PlegEventType::ContainerDied {
            if let Some(id) = ev.container_id() {
                self.deaths.push(id.as_str().to_string());
            }
        }
    }

    fn batch_end(&mut self) {
        use std::io::Write;
        let _ = self.out.flush();
        let now = SystemTime::now();
        let mut written = self.shared.written.lock().unwrap();
        for id in self.deaths.drain(..) {
            written.entry(id).or_insert(now);
        }
    }
}

/// A pipe whose read end a thread drains; the write end for the [`LineWriter`].
fn drained_pipe() -> Result<std::fs::File> {
    use std::io::Read;
    let (r, w) = nix::unistd::pipe()?;
    let mut r = std::fs::File::from(r);
    std::thread::Builder::new()
        .name("bench-drain".into())
        .spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            while matches!(r.read(&mut buf), Ok(n) if n > 0) {}
        })?;
    Ok(std::fs::File::from(w))
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
    observer_tests::bench::init_tracing();
    let deaths = observer_tests::bench::env_count("OBSERVER_BENCH_DEATHS", DEFAULT_DEATHS)?;
    let loads = list("OBSERVER_BENCH_LOADS", "idle,busy")?
        .into_iter()
        .map(|l| match l.as_str() {
            "idle" => Ok(Load::Idle),
            "busy" => Ok(Load::Busy),
            _ => bail!("OBSERVER_BENCH_LOADS: {l}? (idle, busy)"),
        })
        .collect::<Result<Vec<_>>>()?;
    let readers = list("OBSERVER_BENCH_READERS", "task,thread,realtime")?
        .into_iter()
        .map(|r| match r.as_str() {
            "task" => Ok(Reader::OnRuntime),
            "thread" => Ok(Reader::Agent(ReaderThread::Dedicated)),
            "realtime" => Ok(Reader::Agent(ReaderThread::Realtime(REALTIME_PRIORITY))),
            _ => bail!("OBSERVER_BENCH_READERS: {r}? (task, thread, realtime)"),
        })
        .collect::<Result<Vec<_>>>()?;
    let phases: Vec<Phase> = loads
        .iter()
        .flat_map(|&load| readers.iter().map(move |&reader| Phase { load, reader }))
        .collect();
    // Two workers for two cores, as the agent runs (observer::cli::MAX_WORKERS).
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(deaths, phases))
}

/// A comma-separated list from the environment, or `default`.
fn list(var: &str, default: &str) -> Result<Vec<String>> {
    let v = std::env::var(var).unwrap_or_else(|_| default.into());
    let items: Vec<String> = v
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    anyhow::ensure!(!items.is_empty(), "{var} is empty");
    Ok(items)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Load {
    Idle,
    /// A CPU hog per core, at normal priority.
    Busy,
}

#[derive(Clone, Copy, Debug)]
struct Phase {
    load: Load,
    reader: Reader,
}

/// Where the loop runs: as the agent runs it, or (the "before" row) a task on the async
/// runtime, built here from the pipeline's own turn ([`KernelPipeline::next_batch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reader {
    OnRuntime,
    Agent(ReaderThread),
}

/// The running loop.
enum Loop {
    Agent(observer::pipeline::PipelineTask),
    /// Stopped through the watch; hands the pipeline back.
    OnRuntime(
        tokio::task::JoinHandle<Result<KernelPipeline>>,
        tokio::sync::watch::Sender<bool>,
    ),
}

impl Loop {
    fn start(
        reader: Reader,
        mut pipeline: KernelPipeline,
        mut tap: impl FnMut(&observer::kernel::KernelEvent) + Send + 'static,
    ) -> Result<Self> {
        Ok(match reader {
            Reader::Agent(r) => Loop::Agent(pipeline.spawn_with_tap(r, tap, || {})?),
            Reader::OnRuntime => {
                let (stop, mut stopped) = tokio::sync::watch::channel(false);
                Loop::OnRuntime(
                    tokio::spawn(async move {
                        loop {
                            tokio::select! {
                                b = pipeline.next_batch(&mut tap) => { b?; }
                                _ = stopped.changed() => return Ok(pipeline),
                            }
                        }
                    }),
                    stop,
                )
            }
        })
    }

    /// The PLEG's counters, whether the loop ran real-time, and the kernel's counters.
    async fn finish(
        self,
    ) -> Result<(
        observer::pleg::PlegStats,
        bool,
        observer::kernel::KernelCounters,
    )> {
        match self {
            Loop::Agent(task) => {
                let health = task.health();
                anyhow::ensure!(!health.ended(), "the kernel pipeline stopped");
                let r = (
                    health.stats().pleg,
                    health.realtime(),
                    task.kernel_counters()?,
                );
                drop(task);
                Ok(r)
            }
            Loop::OnRuntime(join, stop) => {
                stop.send(true)?;
                let pipeline = join.await??;
                Ok((pipeline.stats().pleg, false, pipeline.kernel_counters()?))
            }
        }
    }
}

impl Phase {
    fn load_name(&self) -> &'static str {
        match self.load {
            Load::Idle => "idle",
            Load::Busy => "every core busy (CPU hogs)",
        }
    }

    fn reader_name(&self) -> String {
        match self.reader {
            Reader::OnRuntime => "task on the async runtime (before)".into(),
            Reader::Agent(ReaderThread::Dedicated) => "thread of its own".into(),
            Reader::Agent(ReaderThread::Realtime(p)) => {
                format!(
                    "thread of its own, real-time (SCHED_DEADLINE 2 ms/10 ms, else SCHED_FIFO {p})"
                )
            }
        }
    }
}

async fn run(deaths: usize, phases: Vec<Phase>) -> Result<()> {
    let t0 = Instant::now();
    let ctrd = Arc::new(Containerd::start().await?);
    let mut pods = Vec::new();
    for i in 0..PODS {
        pods.push(
            ctrd.run_sandbox(&PodSpec::new(format!("det-{i}")).qos(Qos::Burstable))
                .await?,
        );
    }
    let mut summaries = Vec::new();
    let mut csv = vec!["phase,container_id,death,a_us,a_received_us,b_us,c_us".to_string()];
    for (i, phase) in phases.iter().enumerate() {
        println!(
            "\n### Phase {}: {}, the agent's loop on a {}\n",
            i + 1,
            phase.load_name(),
            phase.reader_name()
        );
        let s = run_phase(&ctrd, &pods, *phase, deaths, &mut csv).await?;
        summaries.push((*phase, s));
    }
    compare(&summaries);
    if let Some(path) = std::env::var_os("OBSERVER_BENCH_CSV") {
        if let Err(e) = std::fs::write(&path, csv.join("\n") + "\n") {
            eprintln!("writing {}: {e}", path.to_string_lossy());
        }
    }
    println!(
        "\ncontainerd start to this report {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    for pod in &pods {
        ctrd.remove_pod(pod).await?;
    }
    match Arc::try_unwrap(ctrd) {
        Ok(mut c) => c.teardown(),
        Err(_) => bail!("containerd still shared at teardown"),
    }
}

async fn run_phase(
    ctrd: &Arc<Containerd>,
    pods: &[Pod],
    phase: Phase,
    deaths: usize,
    csv: &mut Vec<String>,
) -> Result<Summary> {
    let t0 = Instant::now();
    // The sandboxes made /kubepods exist: watch exactly that subtree, as the agent does.
    let unified = unified_mount(None)?;
    let roots = watch_roots(&unified, [KUBEPODS])?;
    anyhow::ensure!(
        roots.len() == 1,
        "{KUBEPODS} does not exist after the sandboxes started"
    );
    let shared = Arc::new(Shared::default());
    let pipe = drained_pipe()?;
    let lines: observer::pipeline::HookFactory = {
        let shared = Arc::clone(&shared);
        Box::new(move |clock| {
            Box::new(LineWriter {
                out: std::io::BufWriter::with_capacity(1 << 16, pipe),
                clock: clock.clone(),
                shared,
                deaths: Vec::new(),
            })
        })
    };
    let (pipeline, rx) = KernelPipeline::start_with(
        PipelineConfig {
            unified,
            roots: observer::cgroup::KubeRoots::new([KUBEPODS])?,
            probes: ProbeOptions {
                watch: Watch::Roots(roots),
                ..Default::default()
            },
            queue: DEFAULT_QUEUE,
        },
        observer::model::BootClock::new(),
        Some(lines),
    )?;

    let (stop_tx, stop) = watch::channel(false);
    let exits = ctrd.subscribe_task_exits().await?;
    let clock = pipeline.clock();
    // The agent's loop where the phase puts it; its tap records every whole-process exit with the
    // time the loop read it.
    let tap = {
        let shared = Arc::clone(&shared);
        let clock = clock.clone();
        move |e: &KernelEvent| {
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
        }
    };
    let task = Loop::start(phase.reader, pipeline, tap)?;
    let pleg_consumer = tokio::spawn(consume_pleg(rx, clock, Arc::clone(&shared), stop.clone()));
    let exit_consumer = tokio::spawn(consume_task_exits(exits, Arc::clone(&shared), stop.clone()));
    let relister = {
        let shared = Arc::clone(&shared);
        tokio::spawn(relist_exited(ctrd.cri()?, stop.clone(), move |id, at| {
            shared.record(id, |s| {
                s.relist.get_or_insert(at);
            })
        }))
    };

    let hogs = match phase.load {
        Load::Busy => Some(Hogs::per_core()?),
        Load::Idle => None,
    };
    let started = Instant::now();
    let cpu_before = cpu_times();
    let next = Arc::new(AtomicUsize::new(0));
    let mut drivers = tokio::task::JoinSet::new();
    for pod in pods.iter().cloned() {
        drivers.spawn(drive_pod(
            Arc::clone(ctrd),
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
    drop(hogs);
    tokio::time::sleep(DRAIN).await;
    stop_tx.send(true)?;
    let (pleg_stats, realtime, kernel) = task.finish().await?;
    let lagged = pleg_consumer.await??;
    exit_consumer.await??;
    let relists = relister.await??;
    Ok(report(
        &Report {
            planned: &planned,
            shared: &shared,
            pleg_stats,
            lagged,
            kernel_drops: kernel.ringbuf_drops,
            waking: kernel.waking_records,
            quiet: kernel.quiet_records,
            relists: &relists,
            deaths_took,
            cpu_busy,
            realtime,
            phase,
            total: t0.elapsed(),
        },
        csv,
    ))
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

/// (a): the time the PLEG sent each ContainerDied (stamped on the loop's thread), and the time
/// this consumer task on the runtime received it.
async fn consume_pleg(
    mut rx: pleg::PlegReceiver,
    clock: observer::model::BootClock,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> Result<u64> {
    loop {
        let stamped = tokio::select! {
            biased;
            _ = stop.changed() => return Ok(rx.lagged()),
            ev = rx.recv_stamped() => match ev {
                Some(ev) => ev,
                // The pipeline stops first at shutdown.
                None if *stop.borrow() => return Ok(rx.lagged()),
                None => bail!("PLEG stream ended"),
            },
        };
        let received = SystemTime::now();
        let ev = stamped.event;
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
            sent: stamped.sent,
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

struct Report<'a> {
    planned: &'a [Planned],
    shared: &'a Shared,
    pleg_stats: PlegStats,
    lagged: u64,
    kernel_drops: u64,
    /// Records the kernel submitted with a wake-up of the reader, and without.
    waking: u64,
    quiet: u64,
    relists: &'a [Duration],
    deaths_took: Duration,
    /// Share of all CPUs busy (any process) while the deaths ran.
    cpu_busy: Option<f64>,
    /// The loop's thread really ran real-time.
    realtime: bool,
    phase: Phase,
    total: Duration,
}

/// A phase's sorted delays (µs), for the comparison of phases.
struct Summary {
    a: Vec<f64>,
    w: Vec<f64>,
    a_received: Vec<f64>,
    b: Vec<f64>,
    c: Vec<f64>,
    missed: usize,
    realtime: bool,
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

/// Prints a phase's table and checks; returns its delays.
fn report(r: &Report<'_>, csv: &mut Vec<String>) -> Summary {
    let seen = r.shared.seen.lock().unwrap();
    let raw = r.shared.raw_exits.lock().unwrap();
    let written = r.shared.written.lock().unwrap();
    let mut w = Vec::new();
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    let (mut reaped, mut ring, mut a_received) = (Vec::new(), Vec::new(), Vec::new());
    let phase = format!("{:?}/{:?}", r.phase.load, r.phase.reader);
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
            "{phase},{},{:?},{},{},{},{}",
            p.id,
            p.death,
            cell(pleg.map(|x| x.sent)),
            cell(pleg.map(|x| x.received)),
            cell(s.task_exit.as_ref().map(|t| t.received_at)),
            cell(s.relist)
        ));
        if let Some(t) = written.get(&p.id).filter(|_| pleg.is_some()) {
            w.push(delay_us(kernel, *t));
        }
        match pleg {
            Some(x) => {
                a.push(delay_us(kernel, x.sent));
                a_received.push(delay_us(kernel, x.received));
                a_by_kind[kind].push(delay_us(kernel, x.sent));
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
    for v in [
        &mut a,
        &mut w,
        &mut a_received,
        &mut b,
        &mut c,
        &mut reaped,
        &mut ring,
    ]
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
            "(a) observer: ContainerDied sent by the PLEG (the agent's loop)",
            &a,
            miss_a,
        ),
        (
            "(w) the line `watch --pods` writes, flushed to a pipe by the fast path on the loop's thread",
            &w,
            miss_a + a.len() - w.len(),
        ),
        (
            "(a') the same, received by a consumer task on the async runtime (the old way to the user)",
            &a_received,
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
        "\nHow: one process, one tokio runtime (2 workers); the agent's read → PLEG loop on a {}{}; a consumer task awaits the PLEG stream; (b) and (c) run beside it against the same containerd. Each time is SystemTime::now() taken in this process (for (a), by the PLEG as it sends the event), minus the init's kernel exit timestamp (bpf_ktime_get_boot_ns, mapped to the wall clock with BootClock).",
        r.phase.reader_name(),
        match (r.phase.reader, r.realtime) {
            (Reader::Agent(ReaderThread::Realtime(_)), false) => " (REFUSED by the kernel: it ran at normal priority)",
            _ => "",
        }
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
        "- kernel records {} waking the reader, {} quiet (read with the next waking one or at the next poll)",
        r.waking, r.quiet
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
            "- of (a), the init's exit record read from the ring buffer by the loop: p50 {} / p99 {} after the exit",
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
        "- deaths took {:.1} s, with {} of the machine's CPU busy (every process, this one, containerd and any hogs included); the phase took {:.1} s",
        r.deaths_took.as_secs_f64(),
        r.cpu_busy
            .map_or("?".into(), |b| format!("{:.0}%", b * 100.0)),
        r.total.as_secs_f64(),
    );
    Summary {
        a,
        w,
        a_received,
        b,
        c,
        missed: miss_a,
        realtime: r.realtime,
    }
}

/// One table over the phases: what each lever bought, idle and busy.
fn compare(phases: &[(Phase, Summary)]) {
    println!("\n### The phases side by side\n");
    println!("| load | the agent's loop | (a) p50 | (a) p90 | (a) p99 | (a) max | missed | (w) line written p50 | (w) p99 | (w) max | (a') p50 | (a') p99 | (b) p50 | (b) p99 | (b)/(w) p50 | (b)/(w) p99 | (c)/(a) p50 |");
    println!(
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (p, s) in phases {
        if s.a.is_empty() || s.b.is_empty() || s.c.is_empty() {
            println!("| {} | {} | (no data) |", p.load_name(), p.reader_name());
            continue;
        }
        let refused = match (p.reader, s.realtime) {
            (Reader::Agent(ReaderThread::Realtime(_)), false) => " (refused: normal priority)",
            _ => "",
        };
        let w = |q: f64| {
            if s.w.is_empty() {
                "-".to_string()
            } else {
                fmt_us(pct(&s.w, q))
            }
        };
        let bw = |q: f64| {
            if s.w.is_empty() {
                "-".to_string()
            } else {
                fmt_ratio(pct(&s.b, q) / pct(&s.w, q))
            }
        };
        println!(
            "| {} | {}{refused} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p.load_name(),
            p.reader_name(),
            fmt_us(pct(&s.a, 50.0)),
            fmt_us(pct(&s.a, 90.0)),
            fmt_us(pct(&s.a, 99.0)),
            fmt_us(*s.a.last().unwrap()),
            s.missed,
            w(50.0),
            w(99.0),
            w(100.0),
            fmt_us(pct(&s.a_received, 50.0)),
            fmt_us(pct(&s.a_received, 99.0)),
            fmt_us(pct(&s.b, 50.0)),
            fmt_us(pct(&s.b, 99.0)),
            bw(50.0),
            bw(99.0),
            fmt_ratio(pct(&s.c, 50.0) / pct(&s.a, 50.0)),
        );
    }
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
