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
//!      all SIGKILLed at once, without the agent and then with the agent's loop (reader → PLEG →
//!      the `watch --pods` line writer, on the real-time thread). The hogs' CPU over a 3 s window
//!      that starts with the kills, the agent thread's CPU time, and when the last death's line
//!      was written.
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
use observer::{
    pipeline::{FastPathFactory, KernelPipeline, PipelineConfig, ReaderThread},
    pleg::{FastPath, PlegEventType, PodLifecycleEvent},
    sched,
};
use observer_tests::kernel::{read_procs, require_kernel, Hogs, TestCgroup};

const WINDOW: Duration = Duration::from_secs(3);
const PODS: usize = 100;
const DEFAULT_DEATHS: usize = 1000;
/// Children per storm process.
const DEFAULT_FORKS: usize = 20_000;

fn main() -> Result<()> {
    if !require_kernel() {
        return Ok(());
    }
    observer_tests::bench::init_tracing();
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
    rt.block_on(burst(cores, deaths))?;
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
    clock: observer::kernel::BootClock,
    died: Arc<AtomicUsize>,
    pending: usize,
}

impl FastPath for Lines {
    fn event(&mut self, ev: &PodLifecycleEvent, _: std::time::SystemTime) {
        let line = observer::cli::render::pleg_line(ev, self.clock.to_system_time(ev.at));
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

/// N container cgroups, each with an init that is pid 1 of its own pid namespace.
fn containers(cg: &mut TestCgroup, n: usize, round: usize) -> Result<Vec<String>> {
    let mut rels = Vec::new();
    for i in 0..n {
        let pod = format!("kubepods/pod{:08x}-0000-4000-8000-{:012x}", round, i % PODS);
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
fn hogs_at_speed(cores: usize) -> Result<(Hogs, u64, u64, Instant)> {
    let hogs = Hogs::start(cores)?;
    // Let them reach full speed before anything is measured against them.
    std::thread::sleep(Duration::from_millis(300));
    let agent0 = thread_ticks("observer-kernel").unwrap_or(0);
    let t0 = ticks(&hogs);
    Ok((hogs, agent0, t0, Instant::now()))
}

/// The CPU ticks of this process's thread named `name`.
fn thread_ticks(name: &str) -> Option<u64> {
    for e in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            return Some(proc_ticks(&e.path().join("stat").display().to_string()));
        }
    }
    None
}

/// The agent's loop on `cg`'s kubepods subtree (reader → PLEG → the line writer), real-time, with
/// its queue drained as the reconciler would; and how many containers its walk found.
fn agent(
    cg: &TestCgroup,
    died: Arc<AtomicUsize>,
) -> Result<(observer::pipeline::PipelineTask, usize)> {
    let pipe = drained_pipe()?;
    let make: FastPathFactory = Box::new(move |clock| {
        Box::new(Lines {
            out: std::io::BufWriter::with_capacity(1 << 16, pipe),
            clock: clock.clone(),
            died,
            pending: 0,
        })
    });
    let (pipeline, mut rx) = KernelPipeline::start_with(
        PipelineConfig {
            unified: cg.mount.clone(),
            scan_roots: vec![cg.rel("kubepods")],
            probes: observer::kernel::ProbeOptions {
                watch: observer::kernel::Watch::Roots(vec![cg.watch_root()]),
                ..Default::default()
            },
            queue: 1 << 16,
        },
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
                Some(agent(&cg, Arc::new(AtomicUsize::new(0)))?.0)
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
            let agent =
                thread_ticks("observer-kernel").map(|t| (t - agent0) as f64 / ticks_per_sec());
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
async fn burst(cores: usize, n: usize) -> Result<()> {
    println!(
        "\n### A burst of {n} container deaths ({PODS} pods, all SIGKILLed at once) beside a hog per core, {} s window from the kills\n",
        WINDOW.as_secs()
    );
    println!("| the agent | hogs' share of all cores | the agent's real-time thread: CPU in the window | deaths written | last death's line written after the kills |");
    println!("|---|---:|---:|---:|---:|");
    for (round, with_agent) in [(1usize, false), (2, true)] {
        let mut cg = TestCgroup::new("rt-burst")?;
        let rels = containers(&mut cg, n, round)?;
        let died = Arc::new(AtomicUsize::new(0));
        let task = if with_agent {
            let task = agent(&cg, Arc::clone(&died))?;
            let started = task.1;
            anyhow::ensure!(started >= n, "the walk found {started} of {n} containers");
            Some(task.0)
        } else {
            None
        };
        let (hogs, agent0, t0, start) = hogs_at_speed(cores)?;
        kill_all(&cg, &rels);
        let mut last = None;
        while start.elapsed() < WINDOW {
            if last.is_none() && died.load(Ordering::Relaxed) >= n {
                last = Some(start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let hogs_share = share(&hogs, t0, start.elapsed(), cores);
        let agent = thread_ticks("observer-kernel").map(|t| (t - agent0) as f64 / ticks_per_sec());
        drop(hogs);
        let realtime = task.as_ref().is_some_and(|t| t.health().realtime());
        drop(task);
        println!(
            "| {} | {:.1} % | {} | {} | {} |",
            if with_agent {
                if realtime {
                    "reader → PLEG → line writer, real-time"
                } else {
                    "reader → PLEG → line writer (real-time REFUSED)"
                }
            } else {
                "none"
            },
            hogs_share * 100.0,
            agent.map_or("-".into(), |s| format!(
                "{:.0} ms ({:.1} % of one core)",
                s * 1e3,
                s / WINDOW.as_secs_f64() * 100.0
            )),
            if with_agent {
                died.load(Ordering::Relaxed).to_string()
            } else {
                "-".into()
            },
            last.map_or("-".into(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3)),
        );
        drop(cg);
    }
    Ok(())
}
