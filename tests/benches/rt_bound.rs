//! The real-time bound of the fast path, measured as a CPU-bound workload sees it: a hog per core
//! (`observer-workload hog`, normal priority), and the CPU time the hogs got in a window.
//!
//!   1. The bound itself. A thread given the fast path's policy that never sleeps, the worst a
//!      runaway fast path could do, for a 3 s window: no such thread (the baseline), the thread
//!      at the fast path's SCHED_DEADLINE reservation (`observer::sched::RESERVATION`), and at
//!      plain SCHED_FIFO 10 (what the reservation replaces: bounded only by the kernel's global
//!      real-time throttle).
//!   2. A burst of deaths. N containers (default 1000: 100 pods × 10 container cgroups under a
//!      `kubepods` test root, each init pid 1 of its own pid namespace: `unshare -pf sleep`) are
//!      all SIGKILLed at once, without the agent, then with the agent's loop (reader → PLEG →
//!      the `watch --pods` line writer, on the real-time thread), then with `observer run`'s fast
//!      status path instead of the line writer (the N containers then in N pods, so that every
//!      death turns its pod's ContainersAlive False: a PATCH per death, sent from the same thread
//!      on its own connections to the API stand-in, which runs in this process). The hogs' CPU over a 3 s window that starts with the kills, the agent thread's
//!      CPU time, and when the last death's line was written / PATCH went on the wire.
//!      A fourth round is the fast status path again with its log's reader stalled: the
//!      agent's log queue (`observer::sync::logs`, as `observer run` installs it) drains into a
//!      sink whose writes do not return, a normal-priority thread logs without pause so that the
//!      queue stays full, and every filter is at debug. The PATCHes' times beside the third
//!      round's are the proof that a stalled log costs lines, never the real-time thread's writes.
//!   3. A fork storm in one container (`observer-workload spin` / `spin-ns`, a process per core),
//!      without and with the agent's loop: the storm's rate, the hogs' share, the agent thread's
//!      CPU.
//!
//!     sudo cargo bench -p observer-tests --bench rt_bound
//!
//! `OBSERVER_BENCH_DEATHS` sets N; `OBSERVER_BENCH_FORKS` the children per storm process.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{
    io::Write,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::Result;
use observer::fastpath as fast;
use observer::{
    pipeline::{Hook, HookFactory, KernelPipeline, PipelineConfig, ReaderThread},
    pleg::{PlegEventType, PodLifecycleEvent},
    sched,
};
use observer_tests::{
    apiserver::{pod_object, ApiStandIn, Recorded},
    kernel::{read_procs, require_kernel, Hogs, TestCgroup},
};

const WINDOW: Duration = Duration::from_secs(3);
const ALIVE: &str = "observer.dev/ContainersAlive";
const PODS: usize = 100;
const DEFAULT_DEATHS: usize = 1000;
/// Children per storm process.
const DEFAULT_FORKS: usize = 20_000;

fn main() -> Result<()> {
    if !require_kernel() {
        return Ok(());
    }
    let logs = Logs::init()?;
    let deaths = observer_tests::bench::env_count("OBSERVER_BENCH_DEATHS", DEFAULT_DEATHS)?;
    let cores = std::thread::available_parallelism()?.get();
    println!(
        "Real-time bound: {cores} cores, a hog per core, kernel {}, sched_rt_runtime_us {}\n",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")?.trim(),
        std::fs::read_to_string("/proc/sys/kernel/sched_rt_runtime_us")?.trim()
    );
    let forks = observer_tests::bench::env_count("OBSERVER_BENCH_FORKS", DEFAULT_FORKS)?;
    bound(cores)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(burst(cores, deaths, &logs))?;
    rt.block_on(storm(cores, forks))
}

/// The hogs' CPU time so far, in clock ticks.
fn ticks(hogs: &Hogs) -> u64 {
    hogs.pids()
        .iter()
        .map(|pid| proc_ticks(&format!("/proc/{pid}/stat")))
        .sum()
}

/// utime + stime of a /proc stat file, in clock ticks.
fn proc_ticks(path: &str) -> u64 {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let after = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // Fields 14 and 15 of the file; 3.. after the comm.
    f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)
}

fn ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// The hogs' share of all cores over `window` from `t0` ticks.
fn share(hogs: &Hogs, t0: u64, window: Duration, cores: usize) -> f64 {
    (ticks(hogs) - t0) as f64 / ticks_per_sec() / (window.as_secs_f64() * cores as f64)
}

#[derive(Clone, Copy, Debug)]
enum Spin {
    None,
    Deadline,
    Fifo,
}

/// Part 1: a never-sleeping thread at each policy beside the hogs.
fn bound(cores: usize) -> Result<()> {
    println!(
        "### A runaway fast-path thread (never sleeps) beside a hog per core, {} s each\n",
        WINDOW.as_secs()
    );
    println!("| the thread | policy granted | hogs' share of all cores | the thread's share of one core |");
    println!("|---|---|---:|---:|");
    for spin in [Spin::None, Spin::Deadline, Spin::Fifo] {
        let hogs = Hogs::start(cores)?;
        // Let them reach full speed before anything is measured against them.
        std::thread::sleep(Duration::from_millis(300));
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = ticks(&hogs);
        let start = Instant::now();
        let thread = match spin {
            Spin::None => None,
            _ => {
                let stop = Arc::clone(&stop);
                Some(std::thread::spawn(move || {
                    let granted = match spin {
                        Spin::Deadline => match sched::set_deadline(sched::RESERVATION) {
                            Ok(()) => format!(
                                "SCHED_DEADLINE {:?}/{:?}",
                                sched::RESERVATION.runtime,
                                sched::RESERVATION.period
                            ),
                            Err(e) => format!("refused: {e}"),
                        },
                        _ => match sched::set_realtime(10) {
                            Ok(()) => "SCHED_FIFO 10".to_string(),
                            Err(e) => format!("refused: {e}"),
                        },
                    };
                    let t = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::black_box(0u64);
                    }
                    let cpu = thread_cpu();
                    (granted, cpu.as_secs_f64() / t.elapsed().as_secs_f64())
                }))
            }
        };
        std::thread::sleep(WINDOW);
        let hogs_share = share(&hogs, t0, start.elapsed(), cores);
        stop.store(true, Ordering::Relaxed);
        let (granted, own) = match thread {
            Some(t) => {
                let (g, s) = t.join().map_err(|_| anyhow::anyhow!("spinner panicked"))?;
                (g, format!("{:.1} %", s * 100.0))
            }
            None => ("-".into(), "-".into()),
        };
        println!(
            "| {} | {granted} | {:.1} % | {own} |",
            match spin {
                Spin::None => "none (baseline)",
                Spin::Deadline => "the fast path's policy (SCHED_DEADLINE reservation)",
                Spin::Fifo => "plain SCHED_FIFO 10 (for comparison)",
            },
            hogs_share * 100.0
        );
    }
    Ok(())
}

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The agent's line writer, counting the deaths' lines (to a drained pipe, as `watch --pods`).
struct Lines {
    out: std::io::BufWriter<std::fs::File>,
    clock: observer::model::BootClock,
    died: Arc<AtomicUsize>,
    pending: usize,
}

impl Hook for Lines {
    fn event(&mut self, ev: &PodLifecycleEvent, _: std::time::SystemTime) {
        let line = observer::present::render::pleg_line(ev, self.clock.to_system_time(ev.at));
        let _ = serde_json::to_writer(&mut self.out, &line);
        let _ = self.out.write_all(b"\n");
        if ev.kind() == PlegEventType::ContainerDied {
            self.pending += 1;
        }
    }

    fn batch_end(&mut self) {
        let _ = self.out.flush();
        self.died
            .fetch_add(std::mem::take(&mut self.pending), Ordering::Relaxed);
    }
}

fn drained_pipe() -> Result<std::fs::File> {
    use std::io::Read;
    let (r, w) = nix::unistd::pipe()?;
    let mut r = std::fs::File::from(r);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        while matches!(r.read(&mut buf), Ok(n) if n > 0) {}
    });
    Ok(std::fs::File::from(w))
}

/// N container cgroups in `pods` pods (container `i` in pod `i % pods`), each with an init that
/// is pid 1 of its own pid namespace.
fn containers(cg: &mut TestCgroup, n: usize, pods: usize, round: usize) -> Result<Vec<String>> {
    let mut rels = Vec::new();
    for i in 0..n {
        let pod = format!("kubepods/pod{:08x}-0000-4000-8000-{:012x}", round, i % pods);
        let rel = cg.mkdir(&format!("{pod}/{:064x}", round * 1_000_000 + i))?;
        let mut child = cg.spawn_in(
            &rel,
            std::path::Path::new("/usr/bin/unshare"),
            &["-pf", "sleep", "1000"],
        )?;
        // Reaped by the kernel once killed: the Child is not kept.
        std::thread::spawn(move || child.wait());
        rels.push(rel);
    }
    // Every init exec'd `sleep` in its namespace.
    let ready = observer_tests::wait::eventually(Duration::from_secs(60), || {
        rels.iter()
            .all(|r| read_procs(&cg.abs(r).join("cgroup.procs")).len() >= 2)
    });
    anyhow::ensure!(ready, "the containers' inits did not all start");
    Ok(rels)
}

fn kill_all(cg: &TestCgroup, rels: &[String]) {
    for r in rels {
        for pid in read_procs(&cg.abs(r).join("cgroup.procs")) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// A hog per core at full speed, then where the measurement starts: the agent thread's ticks,
/// the hogs' ticks, the instant.
fn hogs_at_speed(cores: usize) -> Result<(Hogs, Duration, u64, Instant)> {
    let hogs = Hogs::start(cores)?;
    // Let them reach full speed before anything is measured against them.
    std::thread::sleep(Duration::from_millis(300));
    let agent0 = thread_cpu_of("observer-kernel").unwrap_or_default();
    let t0 = ticks(&hogs);
    Ok((hogs, agent0, t0, Instant::now()))
}

/// The CPU time of this process's thread named `name`, off its CPU-time clock: exact, where
/// /proc's ticks are samples at the timer tick (10 ms here), too coarse for a burst's work.
fn thread_cpu_of(name: &str) -> Option<Duration> {
    for e in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let tid: i32 = e.file_name().to_str()?.parse().ok()?;
            // The kernel's clock id of a thread's CPU time (MAKE_THREAD_CPUCLOCK(tid, SCHED)).
            let id = ((!tid) << 3) | 6;
            return clock(nix::time::ClockId::from_raw(id));
        }
    }
    None
}

/// This process's CPU time, all threads.
fn process_cpu() -> Duration {
    clock(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID).unwrap_or_default()
}

fn clock(id: nix::time::ClockId) -> Option<Duration> {
    let t = nix::time::clock_gettime(id).ok()?;
    Some(Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32))
}

/// The `watch --pods` line writer into a drained pipe, counting deaths in `died`.
fn line_writer(died: Arc<AtomicUsize>) -> Result<HookFactory> {
    let pipe = drained_pipe()?;
    Ok(Box::new(move |clock| {
        Box::new(Lines {
            out: std::io::BufWriter::with_capacity(1 << 16, pipe),
            clock: clock.clone(),
            died,
            pending: 0,
        })
    }))
}

/// `observer run`'s fast status path against `api`, which is given the burst's pods (round
/// `round`, as [`containers`] names them); its ledger holds each pod's basis as the status
/// manager would have left it, with every container running.
fn fast_status(
    api: &ApiStandIn,
    round: usize,
    n: usize,
    pods: usize,
) -> Result<(HookFactory, Arc<observer::status::AliveLedger>)> {
    use observer::{
        model::{ContainerId, PodUid},
        reconcile::{ContainerPhase, ContainerView, PodView},
        status::conditions::ConditionTypes,
    };
    let types = ConditionTypes::default();
    let ledger = Arc::new(observer::status::AliveLedger::default());
    for p in 0..pods.min(n) {
        let uid = format!("{round:08x}-0000-4000-8000-{p:012x}");
        let name = format!("burst-{p}");
        let ids: Vec<usize> = (p..n).step_by(pods).collect();
        let names: Vec<String> = (0..ids.len()).map(|k| format!("c{k}")).collect();
        let specs: Vec<(&str, Option<&str>)> = names.iter().map(|c| (c.as_str(), None)).collect();
        let object = pod_object(&name, "default", &uid, "node-1", &specs, Some(ALIVE));
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(object.clone())?;
        api.add_pod(object);
        let id = |i: usize| {
            ContainerId::parse(&format!("{:064x}", round * 1_000_000 + i))
                .ok_or_else(|| anyhow::anyhow!("container id {i}"))
        };
        let containers = ids
            .iter()
            .zip(&names)
            .map(|(&i, c)| {
                Ok(ContainerView {
                    image: "localhost/observer/busybox:latest".into(),
                    kernel_seen: true,
                    memory: None,
                    ..ContainerView::new(id(i)?, c.clone(), ContainerPhase::Running)
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let uid = PodUid::parse(&uid).ok_or_else(|| anyhow::anyhow!("pod uid {uid}"))?;
        let view = PodView {
            uid,
            namespace: "default".into(),
            name,
            sandbox_id: id(9_999_999)?,
            sandbox_ready: true,
            created_at: None,
            containers,
            last_oom: None,
        };
        ledger.prepare(uid, &view, &Arc::new(pod), &types);
    }
    // No status manager runs here: nothing reads what was answered.
    let path = fast::FastPath::build(fast::FastConfig {
        kubeconfig: Some(api.kubeconfig()?.into()),
        field_manager: "observer".into(),
        request_timeout: Duration::from_secs(5),
        types,
        ledger: Arc::clone(&ledger),
        clock: observer::model::system_clock(),
    })?;
    tokio::spawn(path.dialer.run());
    Ok((path.hook, ledger))
}

/// The fast path's PATCHes the stand-in received (its own connections say `observer/…`).
fn fast_patches(api: &ApiStandIn) -> Vec<Recorded> {
    api.recorded()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.user_agent.starts_with("observer/"))
        .collect()
}

/// The agent's loop on `cg`'s kubepods subtree (reader → PLEG → `fast`), real-time, with its
/// queue drained as the reconciler would; and how many containers its walk found.
fn agent(cg: &TestCgroup, make: HookFactory) -> Result<(observer::pipeline::PipelineTask, usize)> {
    let (pipeline, mut rx) = KernelPipeline::start_with(
        PipelineConfig {
            unified: cg.mount.clone(),
            roots: observer::cgroup::KubeRoots::new([cg.rel("kubepods")])?,
            probes: observer::kernel::ProbeOptions {
                watch: observer::kernel::Watch::Roots(vec![cg.watch_root()]),
                ..Default::default()
            },
            queue: 1 << 16,
        },
        observer::model::BootClock::new(),
        Some(make),
    )?;
    let started = pipeline.pleg().model().counts().1;
    let task = pipeline.spawn(ReaderThread::Realtime(10), || {})?;
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    Ok((task, started))
}

/// Part 3: a fork storm inside one container (a process per core forking children that exit
/// at once), without and with the agent: how long the storm takes, the hogs' share meanwhile,
/// and the agent's real-time thread's CPU. `spin-ns` children are each pid 1 of a new pid
/// namespace, whose exits wake the reader at once; `spin` children's exits ride along with the
/// next wake-up (the reader's batching).
async fn storm(cores: usize, forks: usize) -> Result<()> {
    println!(
        "\n### A fork storm in one container: {cores} processes × {forks} children that exit at once, beside a hog per core\n"
    );
    println!("| children | the agent | storm's wall time | forks per second | hogs' share of all cores | the agent's real-time thread: CPU during the storm |");
    println!("|---|---|---:|---:|---:|---:|");
    for mode in ["spin", "spin-ns"] {
        for with_agent in [false, true] {
            let mut cg = TestCgroup::new("rt-storm")?;
            let rel = cg.mkdir(&format!(
                "kubepods/pod00000000-0000-4000-8000-00000000000{}/{:064x}",
                u8::from(with_agent),
                1
            ))?;
            let task = if with_agent {
                Some(agent(&cg, line_writer(Arc::new(AtomicUsize::new(0)))?)?.0)
            } else {
                None
            };
            let (hogs, agent0, t0, start) = hogs_at_speed(cores)?;
            let workload = observer_tests::kernel::workload();
            let mut children = Vec::new();
            for _ in 0..cores {
                children.push(cg.spawn_in(&rel, &workload, &[mode, &forks.to_string()])?);
            }
            let statuses = tokio::task::spawn_blocking(move || {
                children
                    .into_iter()
                    .map(|mut c| c.wait())
                    .collect::<std::io::Result<Vec<_>>>()
            })
            .await??;
            let took = start.elapsed();
            anyhow::ensure!(
                statuses.iter().all(|s| s.success()),
                "the storm failed: {statuses:?}"
            );
            let hogs_share = share(&hogs, t0, took, cores);
            let agent = thread_cpu_of("observer-kernel").map(|t| (t - agent0).as_secs_f64());
            drop(hogs);
            let realtime = task.as_ref().is_some_and(|t| t.health().realtime());
            drop(task);
            let total = cores * forks;
            println!(
                "| `{mode}` | {} | {:.2} s | {:.0} | {:.1} % | {} |",
                match (with_agent, realtime) {
                    (false, _) => "none",
                    (true, true) => "reader → PLEG → line writer, real-time",
                    (true, false) => "reader → PLEG → line writer (real-time REFUSED)",
                },
                took.as_secs_f64(),
                total as f64 / took.as_secs_f64(),
                hogs_share * 100.0,
                agent.map_or("-".into(), |s| format!(
                    "{:.0} ms ({:.1} % of one core)",
                    s * 1e3,
                    s / took.as_secs_f64() * 100.0
                )),
            );
            drop(cg);
        }
    }
    Ok(())
}

/// Part 2: the burst, without and with the agent's loop.
/// Where a burst's deaths go.
#[derive(Clone, Copy, PartialEq)]
enum Sink {
    None,
    Lines,
    Api,
}

/// The bench's log, installed as `observer run` installs the agent's (`sync::logs`: one bounded
/// queue, drained on a thread of its own), into a sink that can be made to stall.
struct Logs {
    queue: observer::sync::logs::LogQueue,
    _flush: observer::sync::logs::LogFlush,
    gate: Arc<Gate>,
    filter: tracing_subscriber::reload::Handle<
        tracing_subscriber::EnvFilter,
        tracing_subscriber::Registry,
    >,
}

/// While closed, a write into it does not return (a log collector that stopped reading).
#[derive(Default)]
struct Gate {
    closed: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
}

struct GatedStderr(Arc<Gate>);

impl Write for GatedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut closed = self.0.closed.lock().unwrap_or_else(|p| p.into_inner());
        while *closed {
            closed = self
                .0
                .opened
                .wait(closed)
                .unwrap_or_else(|p| p.into_inner());
        }
        std::io::stderr().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl Logs {
    fn init() -> Result<Self> {
        use tracing_subscriber::{layer::SubscriberExt, util::SubscriberInitExt};
        let gate = Arc::new(Gate::default());
        let (queue, flush) = observer::sync::logs::queue(
            GatedStderr(Arc::clone(&gate)),
            observer::sync::logs::CAPACITY,
        )?;
        let env = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let (filter, handle) = tracing_subscriber::reload::Layer::new(env);
        tracing_subscriber::registry()
            .with(filter)
            .with(tracing_subscriber::fmt::layer().with_writer(queue.clone()))
            .try_init()?;
        Ok(Self {
            queue,
            _flush: flush,
            gate,
            filter: handle,
        })
    }

    /// Stalls the sink, sets every filter to debug and keeps the queue full from a thread of
    /// normal priority, until the returned guard is dropped.
    fn stall(&self) -> Result<Stalled<'_>> {
        self.filter
            .reload(tracing_subscriber::EnvFilter::new("debug"))?;
        *self.gate.closed.lock().unwrap_or_else(|p| p.into_inner()) = true;
        let stop = Arc::new(AtomicBool::new(false));
        let chatty = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("bench-chatty".into())
                .spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        tracing::info!(n, "a line for a log nobody reads");
                    }
                })?
        };
        Ok(Stalled {
            logs: self,
            stop,
            chatty: Some(chatty),
            dropped: self.queue.dropped(),
        })
    }
}

struct Stalled<'a> {
    logs: &'a Logs,
    stop: Arc<AtomicBool>,
    chatty: Option<std::thread::JoinHandle<()>>,
    /// Lines dropped before the stall.
    dropped: u64,
}

impl Stalled<'_> {
    /// Lines dropped since the stall began.
    fn dropped(&self) -> u64 {
        self.logs.queue.dropped() - self.dropped
    }
}

impl Drop for Stalled<'_> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.chatty.take() {
            let _ = t.join();
        }
        let _ = self
            .logs
            .filter
            .reload(tracing_subscriber::EnvFilter::new("warn"));
        *self
            .logs
            .gate
            .closed
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = false;
        self.logs.gate.opened.notify_all();
    }
}

async fn burst(cores: usize, n: usize, logs: &Logs) -> Result<()> {
    println!(
        "\n### A burst of {n} container deaths ({PODS} pods, or one per container where said; all SIGKILLed at once) beside a hog per core, {} s window from the kills\n",
        WINDOW.as_secs()
    );
    println!("| the agent | hogs' share of all cores | the agent's real-time thread: CPU in the window | the bench process's other threads: CPU in the window | deaths written | the last death's line / PATCH written after the kills |");
    println!("|---|---:|---:|---:|---:|---:|");
    let rounds = [
        (1usize, Sink::None, false),
        (2, Sink::Lines, false),
        (3, Sink::Api, false),
        (4, Sink::Api, true),
    ];
    for (round, sink, stalled_log) in rounds {
        let mut cg = TestCgroup::new("rt-burst")?;
        // Only a pod's first death turns its ContainersAlive False: for a PATCH per death, the
        // fast status path's round has a pod per container.
        let pods = if sink == Sink::Api { n } else { PODS };
        let rels = containers(&mut cg, n, pods, round)?;
        let died = Arc::new(AtomicUsize::new(0));
        let api = match sink {
            Sink::Api => Some(ApiStandIn::start().await?),
            _ => None,
        };
        let task = match (sink, &api) {
            (Sink::None, _) => None,
            (Sink::Lines, _) => Some(agent(&cg, line_writer(Arc::clone(&died))?)?),
            (Sink::Api, Some(api)) => {
                let (make, ledger) = fast_status(api, round, n, pods)?;
                let task = agent(&cg, make)?;
                let writing =
                    observer_tests::wait::eventually_async(Duration::from_secs(30), || {
                        ledger.writing()
                    })
                    .await;
                anyhow::ensure!(writing, "the fast path never had its connection");
                Some(task)
            }
            (Sink::Api, None) => unreachable!("started above"),
        };
        if let Some((_, started)) = &task {
            anyhow::ensure!(*started >= n, "the walk found {started} of {n} containers");
        }
        let task = task.map(|t| t.0);
        let (hogs, agent0, t0, start) = hogs_at_speed(cores)?;
        let stall = if stalled_log {
            Some(logs.stall()?)
        } else {
            None
        };
        let own0 = process_cpu();
        let killed = std::time::SystemTime::now();
        kill_all(&cg, &rels);
        let sent = |api: &ApiStandIn| fast_patches(api).len();
        let mut last = None;
        while start.elapsed() < WINDOW {
            let done = match &api {
                Some(api) => sent(api) >= n,
                None => died.load(Ordering::Relaxed) >= n,
            };
            if last.is_none() && done {
                last = Some(start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let hogs_share = share(&hogs, t0, start.elapsed(), cores);
        let dropped = stall.as_ref().map(Stalled::dropped);
        drop(stall);
        let agent_cpu = thread_cpu_of("observer-kernel").map(|t| t - agent0);
        let agent = agent_cpu.map(|t| t.as_secs_f64());
        // This process less the agent's thread: the stand-in, the PLEG queue's consumer, this
        // loop.
        let others = (process_cpu() - own0)
            .saturating_sub(agent_cpu.unwrap_or_default())
            .as_secs_f64();
        drop(hogs);
        let realtime = task.as_ref().is_some_and(|t| t.health().realtime());
        drop(task);
        let rt = if realtime {
            "real-time"
        } else {
            "(real-time REFUSED)"
        };
        let (who, written, last) = match (sink, &api) {
            (Sink::None, _) => ("none".to_string(), "-".to_string(), None),
            (Sink::Lines, _) => (
                format!("reader → PLEG → line writer, {rt}"),
                died.load(Ordering::Relaxed).to_string(),
                last,
            ),
            (Sink::Api, Some(api)) => {
                // From the kills to the last PATCH's first bytes on the wire.
                let wire = fast_patches(api)
                    .iter()
                    .filter_map(|r| r.wire?.duration_since(killed).ok())
                    .max();
                (
                    format!(
                        "reader → PLEG → fast status path, {rt} ({pods} pods of one container: a PATCH per death){}",
                        dropped.map_or(String::new(), |d| format!(
                            "; the log's reader stalled, its queue kept full at debug ({d} lines dropped)"
                        ))
                    ),
                    format!("{} PATCHes", sent(api)),
                    wire.filter(|_| last.is_some()),
                )
            }
            (Sink::Api, None) => unreachable!("started above"),
        };
        println!(
            "| {who} | {:.1} % | {} | {:.0} ms | {written} | {} |",
            hogs_share * 100.0,
            agent.map_or("-".into(), |s| format!(
                "{:.0} ms ({:.1} % of one core)",
                s * 1e3,
                s / WINDOW.as_secs_f64() * 100.0
            )),
            others * 1e3,
            last.map_or("-".into(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3)),
        );
        drop(cg);
    }
    println!(
        "\nThe API stand-in answers in this process, at normal priority beside the hogs (the other \
         threads' column): with the \
         fast status path, the hogs' share also pays for its answers (on a node, that is the API \
         server's side). In the stalled log's round, the other threads include the one that keeps \
         the log's queue full, spinning at normal priority beside the hogs."
    );
    Ok(())
}
