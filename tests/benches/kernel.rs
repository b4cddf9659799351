//! The kernel side under a fork/exit storm, side by side in one run:
//!   - the storm alone (no probes): the baseline fork/exit rate;
//!   - probes loaded but the storm outside the watched subtree (the in-kernel filter's cost);
//!   - probes watching everything, drained in process (the ring buffer's ceiling);
//!   - `observer watch --all --format json > /dev/null` (the whole user-facing path).
//!
//! With per-program kernel cost from the kernel's own accounting (bpf_stats: run_time / run_cnt),
//! and the cost per exit of each record class (a container's other processes, a container's
//! init), before (every record wakes the reader) and after (`Wake::Selective`: only the records
//! something waits on do).
//!
//! And the limit-hit probe under a reclaim storm: a loop reading a 160 MiB file through a 64 MiB
//! limit (the cgroup at its limit, reclaiming all the time) with and without the probes: the
//! loop's throughput, the probe's runs and cost, and the records it sent (bounded: one per cgroup
//! per 100 ms).
//!
//! And the charge probe under an allocation storm: a process faulting in 1 GiB of anonymous
//! memory as fast as the kernel gives it, and unmapping it, 5 times, in a cgroup whose 2 GiB
//! limit it crosses half of each time, with and without the probes: the storm's time, the
//! charge program's runs and cost, the usage checks it made and the records it sent.
//!
//!     sudo cargo bench -p observer-tests --bench kernel        (or: cargo xtask bench)
//!     OBSERVER_KERNEL_BENCH=charges ...                         (the allocation storm alone)
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{
    path::PathBuf,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use observer::kernel::{ProbeOptions, Probes, ProgramStats, Wait, Wake, Watch};
use observer_tests::kernel::{workload, TestCgroup};

/// Storm processes (one per core) and forks each.
const STORMERS: usize = 2;
const FORKS: u64 = 40_000;
/// Forks per storm process in the per-class rows.
const CLASS_FORKS: u64 = 20_000;

struct Row {
    name: &'static str,
    elapsed: Duration,
    seen: Option<u64>,
    drops: Option<u64>,
}

/// Runs the storm in `cg` (or the agent's own cgroup when `None`) and times it.
fn storm(cg: Option<&TestCgroup>) -> Duration {
    let start = Instant::now();
    let children: Vec<_> = (0..STORMERS)
        .map(|_| match cg {
            Some(cg) => cg
                .spawn(&workload(), &["spin", &FORKS.to_string()])
                .expect("spawn"),
            None => Command::new(workload())
                .args(["spin", &FORKS.to_string()])
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn"),
        })
        .collect();
    for mut c in children {
        assert!(c.wait().expect("wait").success());
    }
    start.elapsed()
}

fn observer_bin() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("observer");
    p.exists().then_some(p)
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: the kernel benchmark loads eBPF programs and needs root");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    // OBSERVER_KERNEL_BENCH=charges: the allocation storm alone (a guest under emulation).
    if std::env::var("OBSERVER_KERNEL_BENCH").as_deref() == Ok("charges") {
        print_charges(&charge_storm());
        return;
    }
    let total = STORMERS as u64 * FORKS;
    let mut rows = Vec::new();

    // Warm the page cache and the fork path.
    storm(None);
    rows.push(Row {
        name: "no probes (baseline)",
        elapsed: storm(None),
        seen: None,
        drops: None,
    });

    // Probes watching one empty cgroup: every exec/exit runs the programs and is filtered out.
    {
        let watched = TestCgroup::new("bench-filter").unwrap();
        let mut probes = Probes::load(&ProbeOptions {
            watch: Watch::Roots(vec![watched.watch_root()]),
            ..Default::default()
        })
        .unwrap();
        let mut reader = probes.events().unwrap();
        let elapsed = storm(None);
        let mut seen = 0;
        while reader.try_next().is_some() {
            seen += 1;
        }
        rows.push(Row {
            name: "probes, storm outside the watched subtree",
            elapsed,
            seen: Some(seen),
            drops: Some(probes.counters().unwrap().ringbuf_drops),
        });
    }

    // Probes watching everything, drained by an in-process reader; kernel cost per program.
    let program_stats: Vec<ProgramStats>;
    {
        let mut probes = Probes::load(&ProbeOptions {
            watch: Watch::All,
            // As `observer watch --all`: every record wakes the reader.
            wake: Wake::Every,
            ..Default::default()
        })
        .unwrap();
        probes.enable_run_time_stats().unwrap();
        let mut reader = probes.events().unwrap();
        let seen = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, st2) = (Arc::clone(&seen), Arc::clone(&stop));
        let drain = rt.spawn(async move {
            while !st2.load(Ordering::Relaxed) {
                if let Ok(Ok(_)) =
                    tokio::time::timeout(Duration::from_millis(50), reader.next()).await
                {
                    s2.fetch_add(1, Ordering::Relaxed);
                    while reader.try_next().is_some() {
                        s2.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        let before: Vec<ProgramStats> = probes.program_stats().unwrap();
        let elapsed = storm(None);
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
        rt.block_on(drain).unwrap();
        let after = probes.program_stats().unwrap();
        program_stats = after
            .iter()
            .zip(&before)
            .map(|(a, b)| ProgramStats {
                name: a.name.clone(),
                run_time: a.run_time - b.run_time,
                run_count: a.run_count - b.run_count,
            })
            .collect();
        rows.push(Row {
            name: "probes --all, in-process reader",
            elapsed,
            seen: Some(seen.load(Ordering::Relaxed)),
            drops: Some(probes.counters().unwrap().ringbuf_drops),
        });
    }

    // The user-facing path: `observer watch --all --format json > /dev/null`.
    let mut watch_note = String::new();
    match observer_bin() {
        Some(bin) => {
            let child = Command::new(bin).args(["watch", "--all", "--format", "json"]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
            std::thread::sleep(Duration::from_millis(1500)); // load and attach
            let elapsed = storm(None);
            std::thread::sleep(Duration::from_millis(500));
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
            let out = child.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stderr);
            let num = |before: &str| text.split(before).next().and_then(|s| s.split_whitespace().last()).and_then(|n| n.parse().ok());
            rows.push(Row { name: "observer watch --all --format json > /dev/null", elapsed, seen: num(" events written"), drops: num(" records dropped") });
        }
        None => watch_note = "(observer binary not built: `cargo build --release -p observer` first, or use `cargo xtask bench`)".into(),
    }

    // The cost per exit of each record class, before and after.
    let classes: Vec<ClassRow> = [
        (Class::Other, Wake::Every),
        (Class::Other, Wake::Selective),
        (Class::Init, Wake::Every),
        (Class::Init, Wake::Selective),
    ]
    .into_iter()
    .map(|(class, wake)| class_cost(class, wake))
    .collect();

    let base = rows[0].elapsed;
    println!("Fork/exit storm: {STORMERS} processes × {FORKS} fork+exit each ({total} process exits), kernel {}\n", std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim());
    println!("| configuration | storm time | forks/s | vs baseline | events received | events/s received | drops |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let rate = total as f64 / r.elapsed.as_secs_f64();
        let seen = r.seen.map_or("-".into(), |s| s.to_string());
        let eps = r.seen.map_or("-".into(), |s| {
            format!("{:.0}", s as f64 / r.elapsed.as_secs_f64())
        });
        let drops = r.drops.map_or("-".into(), |d| d.to_string());
        println!(
            "| {} | {:.3} s | {:.0} | {:+.1}% | {seen} | {eps} | {drops} |",
            r.name,
            r.elapsed.as_secs_f64(),
            rate,
            (r.elapsed.as_secs_f64() / base.as_secs_f64() - 1.0) * 100.0
        );
    }
    if !watch_note.is_empty() {
        println!("\n{watch_note}");
    }
    print_classes(&classes);
    print_limit_hits(&limit_hit_storm());
    print_charges(&charge_storm());
    println!(
        "\nPer-program kernel cost during the --all storm (bpf_stats: run_time_ns / run_cnt)\n"
    );
    println!("| program | runs | total | ns per run |");
    println!("|---|---:|---:|---:|");
    for s in &program_stats {
        let per = if s.run_count == 0 {
            "-".to_string()
        } else {
            format!("{}", s.run_time.as_nanos() / u128::from(s.run_count))
        };
        println!(
            "| {} | {} | {:.2} ms | {per} |",
            s.name,
            s.run_count,
            s.run_time.as_secs_f64() * 1e3
        );
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    /// A container's processes other than its init: `spin`, plain fork and exit.
    Other,
    /// Container inits: `spin-ns`, each child pid 1 of a new pid namespace.
    Init,
}

struct ClassRow {
    class: Class,
    wake: Wake,
    elapsed: Duration,
    exits: u64,
    exit_ns: Option<u128>,
    waking: u64,
    quiet: u64,
    seen: u64,
    drops: u64,
}

/// A storm of one record class inside a watched cgroup, with a reader on a thread of its own as
/// the agent has it; the exit program's cost per run from bpf_stats.
fn class_cost(class: Class, wake: Wake) -> ClassRow {
    let cg = TestCgroup::new("bench-class").unwrap();
    let mut probes = Probes::load(&ProbeOptions {
        watch: Watch::Roots(vec![cg.watch_root()]),
        wake,
        ..Default::default()
    })
    .unwrap();
    probes.enable_run_time_stats().unwrap();
    let mut reader = probes.events().unwrap();
    let (stop, stop_rx) = std::os::unix::net::UnixStream::pair().unwrap();
    let drain = std::thread::spawn(move || {
        use std::os::fd::AsFd;
        let mut seen = 0u64;
        while let Ok(w) =
            reader.next_blocking(Duration::from_secs(1), Some(stop_rx.as_fd()), &mut [])
        {
            match w {
                Wait::Event(_) => seen += 1,
                Wait::Idle | Wait::Io => {}
                Wait::Stopped => break,
            }
        }
        seen
    });
    let before = probes.program_stats().unwrap();
    let counters_before = probes.counters().unwrap();
    let cmd = match class {
        Class::Other => "spin",
        Class::Init => "spin-ns",
    };
    let start = Instant::now();
    let children: Vec<_> = (0..STORMERS)
        .map(|_| {
            cg.spawn(&workload(), &[cmd, &CLASS_FORKS.to_string()])
                .expect("spawn")
        })
        .collect();
    for mut c in children {
        assert!(c.wait().expect("wait").success());
    }
    let elapsed = start.elapsed();
    // Quiet records are read at the reader's next poll (backed off while polls find nothing).
    std::thread::sleep(observer::kernel::QUIET_IDLE_DELAY * 2);
    drop(stop);
    let seen = drain.join().unwrap();
    let after = probes.program_stats().unwrap();
    let counters = probes.counters().unwrap();
    let exit = after
        .iter()
        .zip(&before)
        .find(|(a, _)| a.name == "sched_process_exit")
        .map(|(a, b)| (a.run_time - b.run_time, a.run_count - b.run_count));
    ClassRow {
        class,
        wake,
        elapsed,
        exits: exit.map_or(0, |e| e.1),
        exit_ns: exit
            .filter(|e| e.1 > 0)
            .map(|(t, n)| t.as_nanos() / u128::from(n)),
        waking: counters.waking_records - counters_before.waking_records,
        quiet: counters.quiet_records - counters_before.quiet_records,
        seen,
        drops: counters.ringbuf_drops - counters_before.ringbuf_drops,
    }
}

fn print_classes(rows: &[ClassRow]) {
    println!(
        "\nCost per exit by record class: {STORMERS} processes × {CLASS_FORKS} fork+exit each in a watched cgroup, read by a thread of its own (sched_process_exit's bpf_stats: run_time_ns / run_cnt)\n"
    );
    println!("| record class | wake-ups | storm time | exits run | ns per exit | records waking / quiet | events read | drops |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let class = match r.class {
            Class::Other => "a container's other processes (fork + exit)",
            Class::Init => "container inits (pid 1 of a new pid namespace)",
        };
        let wake = match r.wake {
            Wake::Every => "every record (before)",
            Wake::Selective => "selective (after)",
            Wake::Never => "none (an onlooker's probes)",
        };
        println!(
            "| {class} | {wake} | {:.3} s | {} | {} | {} / {} | {} | {} |",
            r.elapsed.as_secs_f64(),
            r.exits,
            r.exit_ns.map_or("-".into(), |n| n.to_string()),
            r.waking,
            r.quiet,
            r.seen,
            r.drops
        );
    }
}

struct StormRow {
    name: &'static str,
    passes: u64,
    runs: Option<(String, u64, Duration)>,
    records: u64,
    summed: u64,
}

/// A fresh cgroup under a memory limit.
fn limited(name: &str, bytes: u64) -> TestCgroup {
    let mut cg = TestCgroup::new(name).unwrap();
    cg.limit_memory(bytes).unwrap();
    cg
}

/// The agent's probes on `cg` alone, with the kernel's run-time statistics on.
fn watching(cg: &TestCgroup) -> Probes {
    let mut probes = Probes::load(&ProbeOptions {
        watch: Watch::Roots(vec![cg.watch_root()]),
        ..Default::default()
    })
    .unwrap();
    probes.enable_run_time_stats().unwrap();
    probes
}

/// Runs the workload in `cg` to its end; the figure it prints (`cache: 77 passes`, `fault:
/// 2046 ms`).
fn second_word(cg: &TestCgroup, args: &[&str]) -> u64 {
    let out = cg
        .spawn(&workload(), args)
        .expect("spawn")
        .wait_with_output()
        .expect("wait");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no figure in {out:?}"))
}

/// The cache loop in a 64 MiB cgroup for [`STORM_SECS`]: without probes, then with them.
const STORM_SECS: u64 = 5;

fn limit_hit_storm() -> Vec<StormRow> {
    let dir = std::env::current_exe()
        .unwrap()
        .ancestors()
        .nth(3)
        .unwrap()
        .join("tmp")
        .join(format!("kernel-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pages");
    let secs = STORM_SECS.to_string();
    let run = |cg: &TestCgroup| -> u64 {
        second_word(cg, &["cache", file.to_str().unwrap(), "160", &secs])
    };
    let mut rows = Vec::new();
    {
        let cg = limited("bench-reclaim-base", 64 << 20);
        // Once to warm the disk and the page cache's paths, then the baseline.
        run(&cg);
        rows.push(StormRow {
            name: "no probes (baseline)",
            passes: run(&cg),
            runs: None,
            records: 0,
            summed: 0,
        });
    }
    {
        let cg = limited("bench-reclaim", 64 << 20);
        let mut probes = watching(&cg);
        let mut reader = probes.events().unwrap();
        let passes = run(&cg);
        let mut records = 0;
        while let Some(ev) = reader.try_next() {
            if matches!(ev, observer::kernel::KernelEvent::LimitHit(_)) {
                records += 1;
            }
        }
        let runs = probes
            .program_stats()
            .unwrap()
            .into_iter()
            .find(|s| s.name.starts_with("memcg_reclaim"));
        rows.push(StormRow {
            name: "probes (the agent's)",
            passes,
            runs: runs.map(|s| (s.name, s.run_count, s.run_time)),
            records,
            summed: probes.counters().unwrap().limit_hits_summed,
        });
    }
    let _ = std::fs::remove_dir_all(&dir);
    rows
}

/// The allocation storm: [`FAULT_ROUNDS`] × 1 GiB in a cgroup limited to 2 GiB.
const FAULT_ROUNDS: u64 = 5;

struct ChargeRow {
    name: &'static str,
    elapsed_ms: u64,
    runs: Option<(String, u64, Duration)>,
    checks: u64,
    records: u64,
}

fn charge_storm() -> Vec<ChargeRow> {
    let rounds = FAULT_ROUNDS.to_string();
    let run = |cg: &TestCgroup| -> u64 { second_word(cg, &["fault", "1024", &rounds]) };
    let mut rows = Vec::new();
    {
        let cg = limited("bench-fault-base", 2 << 30);
        run(&cg);
        rows.push(ChargeRow {
            name: "no probes (baseline)",
            elapsed_ms: run(&cg),
            runs: None,
            checks: 0,
            records: 0,
        });
    }
    {
        let cg = limited("bench-fault", 2 << 30);
        let mut probes = watching(&cg);
        let mut reader = probes.events().unwrap();
        let before = probes.counters().unwrap().charge_checks;
        let elapsed_ms = run(&cg);
        let mut records = 0;
        while let Some(ev) = reader.try_next() {
            if matches!(&ev, observer::kernel::KernelEvent::LimitHit(h) if h.crossing.is_some()) {
                records += 1;
            }
        }
        let source = probes.charge_source().clone();
        let runs = probes
            .program_stats()
            .unwrap()
            .into_iter()
            .find(|s| s.name.starts_with("charge_memcg") || s.name.starts_with("memcg_stat"));
        rows.push(ChargeRow {
            name: match source {
                observer::kernel::ChargeSource::Fexit => "probes (fexit/try_charge_memcg)",
                observer::kernel::ChargeSource::RawTracepoint(_) => {
                    "probes (raw_tp/mod_memcg_lruvec_state)"
                }
                observer::kernel::ChargeSource::Off(_) => "probes (no charge hook on this kernel)",
            },
            elapsed_ms,
            runs: runs.map(|s| (s.name, s.run_count, s.run_time)),
            checks: probes.counters().unwrap().charge_checks - before,
            records,
        });
    }
    rows
}

fn print_charges(rows: &[ChargeRow]) {
    println!(
        "\nCharge probe under an allocation storm: 1 GiB of anonymous memory faulted in and unmapped, {FAULT_ROUNDS} times, in a cgroup limited to 2 GiB\n"
    );
    println!("| configuration | storm time | vs baseline | program | runs | ns per run | probe time per GiB | usage checks | crossing records |");
    println!("|---|---:|---:|---|---:|---:|---:|---:|---:|");
    let base = rows[0].elapsed_ms.max(1) as f64;
    for r in rows {
        let (prog, runs, per, per_gib) = match &r.runs {
            Some((n, c, t)) if *c > 0 => (
                n.clone(),
                c.to_string(),
                (t.as_nanos() / u128::from(*c)).to_string(),
                format!("{:.1} ms", t.as_secs_f64() * 1000.0 / FAULT_ROUNDS as f64),
            ),
            _ => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        println!(
            "| {} | {} ms | {:+.1}% | {prog} | {runs} | {per} | {per_gib} | {} | {} |",
            r.name,
            r.elapsed_ms,
            (r.elapsed_ms as f64 / base - 1.0) * 100.0,
            r.checks,
            r.records,
        );
    }
}

fn print_limit_hits(rows: &[StormRow]) {
    println!(
        "\nLimit-hit probe under a reclaim storm: a loop reading a 160 MiB file through a 64 MiB limit for {STORM_SECS} s\n"
    );
    println!("| configuration | file passes | vs baseline | program | reclaims (runs) | ns per run | records sent | records/s | reclaims summed |");
    println!("|---|---:|---:|---|---:|---:|---:|---:|---:|");
    let base = rows[0].passes.max(1) as f64;
    for r in rows {
        let (prog, runs, per) = match &r.runs {
            Some((n, c, t)) => (
                n.clone(),
                c.to_string(),
                if *c == 0 {
                    "-".into()
                } else {
                    (t.as_nanos() / u128::from(*c)).to_string()
                },
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "| {} | {} | {:+.1}% | {prog} | {runs} | {per} | {} | {:.1} | {} |",
            r.name,
            r.passes,
            (r.passes as f64 / base - 1.0) * 100.0,
            r.records,
            r.records as f64 / STORM_SECS as f64,
            r.summed
        );
    }
}
