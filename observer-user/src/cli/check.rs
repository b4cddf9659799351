//! `observer check`: preflight. Each requirement is printed as ok / missing with what was found,
//! then the probes are really loaded and attached, which is the only test that cannot lie.
use std::{path::PathBuf, process::ExitCode, time::Instant};

use crate::{
    cgroup::{cgroup_id, CgroupIndex, CgroupMode, CgroupMounts, HierarchyMount, KubeRoots},
    kernel::{
        btf::KernelBtf, kmsg, tracefs, ChargeSource, GroupDeadSource, LimitHitSource, ProbeOptions,
        Probes,
    },
};

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Skip the final load-and-attach of the probes.
    #[arg(long)]
    pub no_load: bool,
    /// Where the host's cgroup filesystems are mounted, when observer runs in a container that
    /// mounts them elsewhere (e.g. /host/sys/fs/cgroup); the same variable as `observer run`'s.
    #[arg(long, value_name = "DIR", env = "OBSERVER_CGROUPFS")]
    pub cgroupfs: Option<PathBuf>,
    #[command(flatten)]
    pub cgroup_root: super::CgroupRootArg,
    #[command(flatten)]
    pub realtime: super::RealtimeArg,
}

struct Report {
    missing: usize,
}

impl Report {
    fn row(&mut self, name: &str, ok: bool, detail: impl std::fmt::Display) {
        if !ok {
            self.missing += 1;
        }
        println!(
            "{:<8} {name:<34} {detail}",
            if ok { "ok" } else { "MISSING" }
        );
    }

    fn note(&self, name: &str, detail: impl std::fmt::Display) {
        println!("{:<8} {name:<34} {detail}", "note");
    }
}

/// Finds cgroups by id the way the agent finds a kernel id it has not indexed: a walk of
/// kubelet's roots matching inode numbers, which needs no capability. This process's own cgroup,
/// when it is below them (the DaemonSet's container), must be found at its path.
fn id_to_path(unified: &HierarchyMount, given: &[String]) -> (bool, String) {
    let roots = match KubeRoots::detect(unified, given) {
        Ok(r) => r,
        Err(e) => return (false, e.to_string()),
    };
    for root in roots.paths() {
        let Some(abs) = unified.to_absolute(root).filter(|a| a.exists()) else {
            continue;
        };
        if let Err(e) = std::fs::read_dir(&abs) {
            return (false, format!("cannot list {}: {e}", abs.display()));
        }
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let Some(rel) = own.lines().find_map(|l| l.strip_prefix("0::")) else {
        return (false, "no cgroup2 line in /proc/self/cgroup".into());
    };
    let Some(abs) = unified.to_absolute(rel) else {
        return (
            false,
            format!(
                "own cgroup {rel} is outside {}",
                unified.mount_point.display()
            ),
        );
    };
    let id = match cgroup_id(&abs) {
        Ok(id) => id,
        Err(e) => return (false, e.to_string()),
    };
    let mut index = CgroupIndex::new(unified.clone(), roots.clone());
    let start = Instant::now();
    let found = index.resolve(id).map(|e| e.path.clone());
    let how = format!(
        "by inode number below kubelet's cgroups ({roots}): {} found in {:.1} ms",
        index.len(),
        start.elapsed().as_secs_f64() * 1e3
    );
    match found {
        Some(p) if *p == *rel => (true, format!("{how}; own id {id} -> {p}")),
        Some(p) => (false, format!("{how}; own id {id} -> {p}, expected {rel}")),
        None if roots.contains(rel) => (false, format!("{how}; own id {id} ({rel}) not found")),
        None => (true, format!("{how} (own cgroup {rel} is outside them)")),
    }
}

/// Said under a cgroup v1 only node's MISSING row: why, and what to do.
const CGROUP_V1_HELP: [(&str, &str); 3] = [
    (
        "  why",
        "Kubernetes put cgroup v1 in maintenance mode (1.31); nodes run the unified hierarchy",
    ),
    (
        "  what to do",
        "boot with systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all on the kernel command line",
    ),
    (
        "",
        "(Debian/Ubuntu: GRUB_CMDLINE_LINUX in /etc/default/grub, update-grub, reboot)",
    ),
];

pub(super) fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let mut r = Report { missing: 0 };

    match crate::kernel::privileges() {
        Ok(how) => r.row("privileges", true, how),
        Err(_) => r.row(
            "privileges",
            false,
            format!(
                "euid {}: run as root, or with CAP_BPF + CAP_PERFMON",
                nix::unistd::geteuid()
            ),
        ),
    }

    kernel_version(&mut r);

    let btf = KernelBtf::load();
    match &btf {
        Ok(b) => match b.task_offsets() {
            Ok(o) => r.row(
                "kernel BTF",
                true,
                format!(
                    "{} (task_struct.exit_code at byte {})",
                    crate::kernel::btf_path().display(),
                    o.exit_code
                ),
            ),
            Err(e) => r.row("kernel BTF", false, e),
        },
        Err(e) => r.row("kernel BTF", false, e),
    }

    let tracefs = match tracefs::find() {
        Some(p) => {
            r.row("tracefs", true, p.display());
            Some(p)
        }
        None => match tracefs::find_or_mount() {
            Ok(p) => {
                r.row(
                    "tracefs",
                    true,
                    format!("{} (was not mounted; mounted it)", p.display()),
                );
                Some(p)
            }
            Err(e) => {
                r.row("tracefs", false, e);
                None
            }
        },
    };

    if let Ok(b) = &btf {
        for tp in ["sched_process_exec", "sched_process_exit"] {
            match b.tracepoint_arity(tp) {
                Ok(n) => r.row(&format!("tp_btf/{tp}"), true, format!("{n} arguments")),
                Err(e) => r.row(&format!("tp_btf/{tp}"), false, e),
            }
        }
    }
    // Several MB: gone before the probes below read the BTF again, so that the two never add up.
    drop(btf);
    if let Some(t) = &tracefs {
        tracepoints(&mut r, t);
    }

    cgroups(&mut r, &args);

    match kmsg::read_history_from(None) {
        Ok((history, source)) => r.row(
            "kernel log",
            true,
            format!(
                "read through {source}, {} OOM kill(s) in it",
                history.kills.len()
            ),
        ),
        Err(e) => r.row(
            "kernel log",
            false,
            format!("{e}: OOM kills from before start-up are not reported"),
        ),
    }

    match aya::sys::is_map_supported(aya::maps::MapType::RingBuf) {
        Ok(ok) => r.row(
            "ring buffer maps",
            ok,
            if ok {
                "supported"
            } else {
                "not supported (needs 5.8+)"
            },
        ),
        Err(e) => r.row("ring buffer maps", false, e),
    }

    if !args.no_load && r.missing == 0 {
        match Probes::load(&ProbeOptions::default()) {
            Ok(p) => attached(&mut r, &p),
            Err(e) => r.row("load and attach probes", false, e),
        }
    }

    realtime(&mut r, args.realtime.realtime_priority);

    if r.missing == 0 {
        println!("\nall requirements met");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("\n{} requirement(s) missing", r.missing);
        Ok(ExitCode::FAILURE)
    }
}

/// The tracepoints whose record layouts the probes read from tracefs.
fn tracepoints(r: &mut Report, t: &std::path::Path) {
    match tracefs::oom_offsets(t) {
        Ok(o) => {
            r.row("tracepoint oom/mark_victim", true, "present");
            let absent: Vec<&str> = [
                ("total_vm", o.total_vm),
                ("anon_rss", o.anon_rss),
                ("file_rss", o.file_rss),
                ("shmem_rss", o.shmem_rss),
            ]
            .into_iter()
            .filter(|(_, off)| *off == observer_common::config::FIELD_ABSENT)
            .map(|(name, _)| name)
            .collect();
            if !absent.is_empty() {
                r.note(
                    "  victim memory fields",
                    format!(
                        "absent: {} (this kernel's mark_victim predates Linux 6.8); OOM kills \
                         are reported without them, victim name and oom_score_adj come from \
                         the victim task",
                        absent.join(", ")
                    ),
                );
            }
        }
        Err(e) => r.row("tracepoint oom/mark_victim", false, e),
    }
    match tracefs::cgroup_offsets(t) {
        Ok(_) => r.row(
            "tracepoints cgroup/*",
            true,
            "cgroup_mkdir, cgroup_rmdir, cgroup_notify_populated",
        ),
        Err(e) => r.row("tracepoints cgroup/*", false, e),
    }
}

/// The running kernel's release against the oldest the probes are built for.
fn kernel_version(r: &mut Report) {
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let version: Vec<u32> = release
        .split(|c: char| !c.is_ascii_digit())
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    let new_enough = version.as_slice() >= [5, 15].as_slice();
    r.row("kernel version >= 5.15", new_enough, &release);
}

/// The cgroup mode, and whether a cgroup id finds its path below kubelet's cgroups.
fn cgroups(r: &mut Report, args: &CheckArgs) {
    match CgroupMounts::detect(args.cgroupfs.as_deref()) {
        Ok(m) => {
            let mode = m.mode();
            let whole = m.unified().is_some_and(|u| u.root == "/");
            let detail = match (mode, m.unified()) {
                // A container's own /sys/fs/cgroup shows only its own cgroup.
                (_, Some(u)) if !whole => format!(
                    "cgroup2 at {} shows only {}: mount the host's /sys/fs/cgroup and pass --cgroupfs",
                    u.mount_point.display(),
                    u.root
                ),
                (CgroupMode::Unified, Some(u)) => {
                    format!("v2 (unified) at {}", u.mount_point.display())
                }
                (CgroupMode::Hybrid, Some(u)) => format!(
                    "hybrid: v1 controllers, cgroup2 at {}",
                    u.mount_point.display()
                ),
                _ => "v1 only: cgroup v2 is required (containers are keyed by cgroup2 ids)"
                    .to_string(),
            };
            r.row("cgroup mode", whole, detail);
            if m.unified().is_none() {
                for (what, line) in CGROUP_V1_HELP {
                    r.note(what, line);
                }
            }
            if let Some(u) = m.unified().filter(|_| whole) {
                let (ok, detail) = id_to_path(u, &args.cgroup_root.cgroup_roots);
                r.row("cgroup id -> path", ok, detail);
            }
        }
        Err(e) => r.row("cgroup mode", false, e),
    }
}

/// The probes loaded and attached: how many, and the hook each variable part got on this kernel.
fn attached(r: &mut Report, p: &Probes) {
    r.row(
        "load and attach probes",
        true,
        format!(
            "{} programs attached, then detached",
            p.program_stats().map(|s| s.len()).unwrap_or(0)
        ),
    );
    match p.group_dead_source() {
        GroupDeadSource::Tracepoint => {}
        GroupDeadSource::Fentry => r.note(
            "  exit group_dead",
            "not a tracepoint argument here: taken from fentry/taskstats_exit",
        ),
        GroupDeadSource::SignalLive(why) => r.note(
            "  exit group_dead",
            format!(
                "not a tracepoint argument here, and fentry/taskstats_exit refused \
                 ({why}): from signal->live, two threads exiting at once may both \
                 be reported as the last"
            ),
        ),
    }
    match p.limit_hit_source() {
        LimitHitSource::Fexit => r.note(
            "  memory limit hits",
            "fexit/try_to_free_mem_cgroup_pages: the cgroup at its limit from the kernel",
        ),
        LimitHitSource::Tracepoint(why) => r.note(
            "  memory limit hits",
            format!(
                "tracepoint/vmscan/mm_vmscan_memcg_reclaim_end ({why}): the cgroup at \
                 its limit is read from cgroupfs"
            ),
        ),
        LimitHitSource::Off(why) => r.note(
            "  memory limit hits",
            format!("none ({why}): no warnings before OOM kills"),
        ),
    }
    match p.charge_source() {
        ChargeSource::Fexit => r.note(
            "  memory limit crossings",
            "fexit/try_charge_memcg: usage against the limit at every charge batch \
             (a quarter MiB a CPU), 50/75/86/90/95 % each sent once",
        ),
        ChargeSource::RawTracepoint(why) => r.note(
            "  memory limit crossings",
            format!(
                "raw_tp/mod_memcg_lruvec_state ({why}): the page counters read once \
                 per 64 pages a CPU adds to a memory cgroup's statistics"
            ),
        ),
        ChargeSource::Off(why) => r.note(
            "  memory limit crossings",
            format!(
                "none ({why}): a leak with nothing to reclaim is warned of only at \
                 its limit"
            ),
        ),
    }
}

/// Real-time scheduling for the kernel reader's thread, tried on a scratch thread (SCHED_FIFO,
/// then back). A requirement only when a priority is configured. Permission is what the
/// deployment can give (CAP_SYS_NICE); a kernel with RT group scheduling may still refuse a
/// cgroup without real-time budget, which the agent survives at normal priority: said, not
/// counted as missing.
fn realtime(r: &mut Report, priority: Option<u8>) {
    use crate::sched::{self, RealtimeError};
    const ROW: &str = "real-time scheduling";
    let trial = priority.unwrap_or(1);
    let outcome = std::thread::spawn(move || {
        let r = sched::set_realtime(trial);
        if r.is_ok() {
            sched::set_normal();
        }
        r
    })
    .join()
    .unwrap_or_else(|_| {
        Err(RealtimeError::Other {
            priority: trial,
            source: std::io::Error::other("the trial thread panicked"),
        })
    });
    // The fast path asks for a SCHED_DEADLINE reservation first (the CPU bound): tried the same way.
    let deadline = std::thread::spawn(|| {
        let r = sched::set_deadline(sched::RESERVATION);
        if r.is_ok() {
            sched::set_normal();
        }
        r.map_err(|e| e.to_string())
    })
    .join()
    .unwrap_or_else(|_| Err("the trial thread panicked".into()));
    let res = sched::RESERVATION;
    let bound = match &deadline {
        Ok(()) => format!(
            "; SCHED_DEADLINE {:?} every {:?} granted: the fast path's threads use that (at most {:.0} % of a core each)",
            res.runtime,
            res.period,
            res.share() * 100.0
        ),
        Err(e) => format!("; {e}: the fast path uses SCHED_FIFO, bounded only by the kernel's real-time throttle"),
    };
    match (priority, outcome) {
        (Some(_), Err(_)) if deadline.is_ok() => {
            r.row(ROW, true, format!("SCHED_FIFO refused{bound}"))
        }
        (Some(p), Ok(())) => r.row(ROW, true, format!("SCHED_FIFO {p} granted{bound}")),
        (Some(_), Err(e @ RealtimeError::NoBudget { .. })) => r.row(
            ROW,
            true,
            format!("permitted, but {e}: the reader thread will run at normal priority"),
        ),
        (Some(_), Err(e)) => r.row(ROW, false, e),
        (None, Ok(())) => r.note(ROW, "available (observer run --realtime-priority)"),
        (None, Err(e)) => r.note(ROW, format!("not available: {e}")),
    }
}
