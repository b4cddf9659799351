//! The kernel side against the real kernel: real processes in real cgroups, real tracepoints.
//! Each test watches only its own cgroup, so tests can run in parallel.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{os::unix::process::ExitStatusExt, time::Duration};

use observer::kernel::{
    kmsg, oom_report::Constraint, Exit, GroupDeadSource, KernelEvent, OomKill, ProbeOptions, Wake,
    Watch,
};
use observer_tests::{
    kernel::{require_kernel, workload, KernelWatch, TestCgroup},
    poll_until_async,
};

const WAIT: Duration = Duration::from_secs(10);

fn exits_of(events: &[KernelEvent], tgid: u32) -> Vec<&Exit> {
    events
        .iter()
        .filter_map(|e| match e {
            KernelEvent::Exit(x) if x.task.tgid == tgid => Some(x),
            _ => None,
        })
        .collect()
}

fn group_exit(events: &[KernelEvent], tgid: u32) -> Option<&Exit> {
    exits_of(events, tgid).into_iter().find(|x| x.group_dead)
}

/// OOM kills are reported wherever they happen: only this test's, not a concurrent test's.
fn ooms_in<'a>(events: &'a [KernelEvent], cg: &TestCgroup) -> Vec<&'a OomKill> {
    events
        .iter()
        .filter_map(|e| match e {
            KernelEvent::OomKill(o) if o.victim.cgroup_id == cg.id() => Some(o),
            _ => None,
        })
        .collect()
}

async fn run_to_exit(cg: &TestCgroup, args: &[&str]) -> (u32, Exit, Vec<KernelEvent>) {
    let mut w = KernelWatch::roots(&[cg.watch_root()]).expect("load probes");
    let mut child = cg.spawn(&workload(), args).expect("spawn");
    let pid = child.id();
    let events = w
        .until(WAIT, |ev| group_exit(ev, pid).is_some())
        .await
        .expect("exit event")
        .to_vec();
    let _ = child.wait();
    let exit = group_exit(&events, pid).unwrap().clone();
    (pid, exit, events)
}

#[tokio::test]
async fn exit_code_is_exact() {
    if !require_kernel() {
        return;
    }
    let cg = TestCgroup::new("exit42").unwrap();
    let (pid, exit, events) = run_to_exit(&cg, &["exit", "42"]).await;
    assert_eq!(exit.status.code(), Some(42), "{exit:?}");
    assert_eq!(exit.status.signal(), None);
    assert_eq!(exit.status.exit_code(), 42);
    assert_eq!(exit.task.pid, pid);
    assert_eq!(exit.task.cgroup_id, cg.id());
    assert_eq!(
        exit.task.ppid,
        std::process::id(),
        "parent is the test process"
    );
    assert_eq!(exit.task.comm.as_str(), "observer-worklo");
    // The program's exec inside the cgroup came first, with the same identity.
    let exec = events
        .iter()
        .find_map(|e| match e {
            KernelEvent::Exec(x) if x.task.tgid == pid => Some(x),
            _ => None,
        })
        .expect("exec seen");
    assert!(
        exec.filename.ends_with("observer-workload"),
        "{}",
        exec.filename
    );
    assert!(exec.at <= exit.at);
    assert_eq!(exec.task.cgroup_id, cg.id());
}

#[tokio::test]
async fn sigkill_is_signal_9() {
    if !require_kernel() {
        return;
    }
    let cg = TestCgroup::new("kill9").unwrap();
    let mut w = KernelWatch::roots(&[cg.watch_root()]).unwrap();
    let mut child = cg.spawn(&workload(), &["sleep", "60"]).unwrap();
    let pid = child.id();
    // Kill only once it runs the workload, so the death is the workload's, not the shell's.
    w.until(WAIT, |ev| {
        ev.iter()
            .any(|e| matches!(e, KernelEvent::Exec(x) if x.task.tgid == pid))
    })
    .await
    .unwrap();
    child.kill().unwrap();
    let events = w
        .until(WAIT, |ev| group_exit(ev, pid).is_some())
        .await
        .unwrap();
    let exit = group_exit(events, pid).unwrap();
    assert_eq!(exit.status.signal(), Some(9), "{exit:?}");
    assert_eq!(exit.status.exit_code(), 137);
    assert!(!exit.status.core_dumped());
    let _ = child.wait();
}

#[tokio::test]
async fn sigsegv_without_core_is_signal_11() {
    if !require_kernel() {
        return;
    }
    let cg = TestCgroup::new("segv").unwrap();
    let (_, exit, _) = run_to_exit(&cg, &["segv"]).await;
    assert_eq!(exit.status.signal(), Some(11), "{exit:?}");
    assert!(!exit.status.core_dumped(), "core dumps were off");
    assert_eq!(exit.status.exit_code(), 139);
}

#[tokio::test]
async fn exit_group_from_a_thread_is_one_group_exit() {
    if !require_kernel() {
        return;
    }
    let cg = TestCgroup::new("threads").unwrap();
    let (pid, exit, events) = run_to_exit(&cg, &["thread-exit", "3"]).await;
    assert_eq!(exit.status.code(), Some(3), "{exit:?}");
    assert_eq!(exit.task.tgid, pid);
    // Per-thread exits are not sent by default: exactly one record for the process.
    assert_eq!(exits_of(&events, pid).len(), 1, "{events:#?}");
}

#[tokio::test]
async fn thread_exits_when_asked() {
    if !require_kernel() {
        return;
    }
    let cg = TestCgroup::new("threads-all").unwrap();
    let mut w = KernelWatch::with(ProbeOptions {
        watch: Watch::Roots(vec![cg.watch_root()]),
        thread_exits: true,
        ..Default::default()
    })
    .unwrap();
    let mut child = cg.spawn(&workload(), &["thread-exit", "5"]).unwrap();
    let pid = child.id();
    let events = w
        .until(WAIT, |ev| {
            group_exit(ev, pid).is_some() && exits_of(ev, pid).len() >= 2
        })
        .await
        .unwrap();
    let exits = exits_of(events, pid);
    assert_eq!(exits.len(), 2, "leader and worker thread: {exits:#?}");
    assert_eq!(exits.iter().filter(|x| x.group_dead).count(), 1);
    assert!(
        exits.iter().all(|x| x.status.code() == Some(5)),
        "every thread carries the group's code"
    );
    let _ = child.wait();
}

#[tokio::test]
async fn oom_kill_names_the_child_and_the_parent_survives() {
    if !require_kernel() {
        return;
    }
    let mut cg = TestCgroup::new("oom").unwrap();
    cg.limit_memory(32 << 20).unwrap();
    let mut w = KernelWatch::roots(&[cg.watch_root()]).unwrap();
    let child = cg.spawn(&workload(), &["oom-child", "64"]).unwrap();
    let parent = child.id();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let victim: u32 = stdout
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("workload said {stdout:?}"));
    assert!(
        out.status.success(),
        "the parent survives and exits 0: {:?}",
        out.status
    );

    let events = w
        .until(WAIT, |ev| {
            group_exit(ev, parent).is_some() && !ooms_in(ev, &cg).is_empty()
        })
        .await
        .unwrap();
    let ooms = ooms_in(events, &cg);
    assert_eq!(ooms.len(), 1, "{ooms:#?}");
    let oom = ooms[0];
    assert_eq!(oom.victim.pid, victim);
    assert_eq!(oom.victim.tgid, victim);
    assert_eq!(oom.victim.ppid, parent);
    assert_eq!(oom.victim_comm.as_str(), "oom-victim");
    assert_eq!(oom.victim.comm.as_str(), "oom-victim");
    assert_eq!(
        oom.victim.cgroup_id,
        cg.id(),
        "the victim's own cgroup, not the allocating task's"
    );
    assert_eq!(oom.oom_score_adj, Some(1000));
    assert!(oom.marked_at <= oom.at);
    if let Some(anon) = oom.memory.anon_rss_kb {
        assert!(
            (16 << 10..=40 << 10).contains(&anon),
            "anon rss {anon} kB under a 32 MiB limit"
        );
    }
    // The victim died of SIGKILL; the parent exited normally afterwards.
    let victim_exit = group_exit(events, victim).expect("victim exit");
    assert_eq!(victim_exit.status.signal(), Some(9));
    let parent_exit = group_exit(events, parent).unwrap();
    assert_eq!(parent_exit.status.code(), Some(0));
    assert!(parent_exit.at > oom.at);
}

/// The OOM killer signals its victim before it marks it: a sleeping victim woken on another CPU
/// can exit before the mark. Whichever comes first, every kill is told once, as the sleeper's,
/// with the sleeper's own cgroup and name (the exit-first ones are counted apart).
#[tokio::test]
async fn every_kill_of_a_sleeping_sibling_is_told_once() {
    if !require_kernel() {
        return;
    }
    // Few: the kernel prints at most 10 OOM reports per 5 s (`oom_kill_process` ratelimit), and
    // the_kernel_log_reports_the_whole_kill, beside it, needs its own report printed.
    const ROUNDS: usize = 2;
    let mut cg = TestCgroup::new("oom-sibling").unwrap();
    cg.limit_memory(48 << 20).unwrap();
    let mut w = KernelWatch::roots(&[cg.watch_root()]).unwrap();
    let out = cg
        .spawn(&workload(), &["oom-sibling", "32", &ROUNDS.to_string()])
        .unwrap()
        .wait_with_output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?}: {stdout}", out.status);
    // "victim PID status S grower PID S": every sleeper killed; a grower only where the kernel
    // chose it too before the sleeper's memory was freed (a second kill, told as such).
    let mut killed: Vec<(u32, String)> = Vec::new();
    for l in stdout.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert!(
            f.len() == 7 && f[3] == "0x9" && (f[6] == "0x0" || f[6] == "0x9"),
            "a sleeper not killed, or a grower that failed otherwise: {stdout}"
        );
        killed.push((f[1].parse().unwrap(), "oom-held".into()));
        if f[6] == "0x9" {
            killed.push((f[5].parse().unwrap(), "oom-grower".into()));
        }
    }
    assert_eq!(
        killed.iter().filter(|(_, c)| *c == "oom-held").count(),
        ROUNDS,
        "{stdout}"
    );
    let events = w
        .until(WAIT, |ev| {
            killed.iter().all(|(v, _)| group_exit(ev, *v).is_some())
                && ooms_in(ev, &cg).len() >= killed.len()
        })
        .await
        .unwrap();
    let ooms = ooms_in(events, &cg);
    let mut told: Vec<(u32, String)> = ooms
        .iter()
        .map(|o| (o.victim.tgid, o.victim_comm.as_str().to_string()))
        .collect();
    told.sort_unstable();
    killed.sort_unstable();
    assert_eq!(
        told, killed,
        "one kill told per victim, by its name: {ooms:#?}"
    );
    assert!(ooms.iter().all(|o| o.victim.cgroup_id == cg.id()));
    let first = w.probes.counters().unwrap().oom_victim_exited_first;
    eprintln!(
        "{} kills, {first} of them read from a victim that exited before its mark",
        killed.len()
    );
}

/// The kernel log's whole report of a kill in this test's cgroup, read back as the agent reads it:
/// the limit hit and its counters, the trigger, the task dump, the victim; where the memory
/// controller is on cgroup2 (`memory.oom.group` exists), a group kill: every process of the
/// cgroup, the surviving parent of the other test included, killed with the victim.
#[tokio::test]
async fn the_kernel_log_reports_the_whole_kill() {
    if !require_kernel() {
        return;
    }
    let mut cg = TestCgroup::new("oomreport").unwrap();
    cg.limit_memory(32 << 20).unwrap();
    let group_file = cg.dir.join("memory.oom.group");
    let group = group_file.exists();
    if group {
        std::fs::write(&group_file, "1").unwrap();
    }
    let child = cg.spawn(&workload(), &["oom-child", "64"]).unwrap();
    let parent = child.id();
    let out = child.wait_with_output().unwrap();
    let report = poll_until_async(WAIT, || {
        let h = kmsg::read_history().expect("read the kernel log");
        h.kills
            .iter()
            .filter_map(|k| k.report.clone())
            .find(|r| r.oom_memcg == cg.rel)
    })
    .await
    .unwrap_or_else(|| panic!("no report of a kill in {} in the kernel log", cg.rel));
    assert_eq!(report.constraint, Some(Constraint::Memcg));
    assert_eq!(report.task_memcg, cg.rel);
    assert_eq!(report.limit_kb(), Some(32 << 10), "{report:#?}");
    let memory = report.counter("memory").unwrap();
    assert!(memory.usage_kb > 30 << 10, "{memory:?}");
    let victim = report.victim.as_ref().unwrap();
    assert_eq!(victim.comm, "oom-victim");
    // The victim allocated itself: it is the trigger.
    let trigger = report.trigger.as_ref().unwrap();
    assert_eq!(
        (trigger.pid, trigger.comm.as_str()),
        (Some(victim.pid), "oom-victim")
    );
    assert!(report.tasks_listed);
    assert!(
        report.tasks.iter().any(|t| t.pid == victim.pid),
        "{report:#?}"
    );
    assert!(report.tasks.iter().any(|t| t.pid == parent), "{report:#?}");
    assert_eq!(report.stats_cgroup, cg.rel);
    let anon = report.breakdown.as_ref().and_then(|b| b.anon).unwrap();
    assert!(anon > 24 << 20, "anon {anon} under a 32 MiB limit");
    if group {
        assert_eq!(report.group_cgroup.as_deref(), Some(cg.rel.as_str()));
        assert_eq!(
            report.members.iter().map(|m| m.pid).collect::<Vec<_>>(),
            [parent],
            "the parent was killed with its child"
        );
        assert_eq!(out.status.signal(), Some(9), "{:?}", out.status);
    } else {
        assert!(report.group_cgroup.is_none() && report.members.is_empty());
        assert!(
            out.status.success(),
            "the parent survives: {:?}",
            out.status
        );
    }
}

#[tokio::test]
async fn tasks_outside_the_watched_subtree_are_not_reported() {
    if !require_kernel() {
        return;
    }
    let watched = TestCgroup::new("watched").unwrap();
    let other = TestCgroup::new("unwatched").unwrap();
    let mut w = KernelWatch::roots(&[watched.watch_root()]).unwrap();
    let mut outside = other.spawn(&workload(), &["exit", "7"]).unwrap();
    let outside_pid = outside.id();
    outside.wait().unwrap();
    // Positive control: the watched one is seen, so the probes were working all along.
    let mut inside = watched.spawn(&workload(), &["exit", "8"]).unwrap();
    let inside_pid = inside.id();
    inside.wait().unwrap();
    w.until(WAIT, |ev| group_exit(ev, inside_pid).is_some())
        .await
        .unwrap();
    let events = w.settle(Duration::from_millis(300)).await.unwrap();
    let leaked: Vec<_> = events
        .iter()
        .filter(|e| match e {
            KernelEvent::Exec(x) => x.task.tgid == outside_pid || x.task.cgroup_id == other.id(),
            KernelEvent::Exit(x) => x.task.tgid == outside_pid || x.task.cgroup_id == other.id(),
            _ => false,
        })
        .collect();
    assert!(leaked.is_empty(), "{leaked:#?}");
    // And everything exec/exit that did come is inside the watched subtree.
    for e in events {
        if let KernelEvent::Exec(x) = e {
            assert_eq!(x.task.cgroup_id, watched.id(), "{e:?}");
        }
    }
}

#[tokio::test]
async fn nested_cgroups_are_inside_the_watched_subtree() {
    if !require_kernel() {
        return;
    }
    let mut cg = TestCgroup::new("nested").unwrap();
    let deep = cg.mkdir("a/b/c").unwrap();
    let mut w = KernelWatch::roots(&[cg.watch_root()]).unwrap();
    let mut child = cg.spawn_in(&deep, &workload(), &["exit", "4"]).unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let events = w
        .until(WAIT, |ev| group_exit(ev, pid).is_some())
        .await
        .unwrap();
    let exit = group_exit(events, pid).unwrap();
    assert_eq!(exit.status.code(), Some(4));
    assert_eq!(
        exit.task.cgroup_id,
        observer::cgroup::cgroup_id(&cg.abs(&deep)).unwrap()
    );
}

#[tokio::test]
async fn cgroup_mkdir_rmdir_and_empty_carry_paths() {
    if !require_kernel() {
        return;
    }
    let mut cg = TestCgroup::new("mkdir").unwrap();
    let mut w = KernelWatch::roots(&[cg.watch_root()]).unwrap();
    let pod = cg.mkdir("kubepods/burstable/pod1").unwrap();
    let pod_id = observer::cgroup::cgroup_id(&cg.abs(&pod)).unwrap();
    let mut child = cg.spawn_in(&pod, &workload(), &["exit", "0"]).unwrap();
    child.wait().unwrap();
    std::fs::remove_dir(cg.abs(&pod)).unwrap();
    let is = |e: &KernelEvent, kind: &str| {
        e.type_name() == kind
            && matches!(e, KernelEvent::CgroupMkdir(c) | KernelEvent::CgroupRmdir(c) | KernelEvent::CgroupEmpty(c) if c.path == pod)
    };
    let events = w
        .until(WAIT, |ev| ev.iter().any(|e| is(e, "cgroup_rmdir")))
        .await
        .unwrap();
    let kinds: Vec<&str> = events
        .iter()
        .filter(|e| is(e, "cgroup_mkdir") || is(e, "cgroup_rmdir") || is(e, "cgroup_empty"))
        .map(KernelEvent::type_name)
        .collect();
    assert_eq!(
        kinds,
        ["cgroup_mkdir", "cgroup_empty", "cgroup_rmdir"],
        "{events:#?}"
    );
    for e in events {
        if let KernelEvent::CgroupMkdir(c) | KernelEvent::CgroupRmdir(c) = e {
            if c.path == pod {
                assert_eq!(c.id, pod_id);
                assert_eq!(c.level, cg.level() + 3);
                assert_eq!(c.hierarchy, 0, "cgroup2");
            }
        }
    }
    // The parents made on the way are reported too, top down.
    let made: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            KernelEvent::CgroupMkdir(c) => Some(c.path.as_str()),
            _ => None,
        })
        .filter(|p| p.starts_with(&cg.rel))
        .collect();
    assert_eq!(
        made,
        [
            format!("{}/kubepods", cg.rel),
            format!("{}/kubepods/burstable", cg.rel),
            pod.clone()
        ]
    );
}

#[tokio::test]
async fn program_run_time_is_accounted() {
    if !require_kernel() {
        return;
    }
    let cg = TestCgroup::new("stats").unwrap();
    let mut w = KernelWatch::roots(&[cg.watch_root()]).unwrap();
    w.probes.enable_run_time_stats().unwrap();
    let mut child = cg.spawn(&workload(), &["exit", "1"]).unwrap();
    let pid = child.id();
    child.wait().unwrap();
    w.until(WAIT, |ev| group_exit(ev, pid).is_some())
        .await
        .unwrap();
    let stats = w.probes.program_stats().unwrap();
    let exit = stats
        .iter()
        .find(|s| s.name == "sched_process_exit")
        .unwrap();
    assert!(exit.run_count >= 1, "{stats:#?}");
    assert!(!exit.run_time.is_zero());
    assert_eq!(w.probes.counters().unwrap().ringbuf_drops, 0);
}

#[tokio::test]
async fn ring_buffer_overflow_is_counted_and_reported_as_lost() {
    if !require_kernel() {
        return;
    }
    let cg = TestCgroup::new("overflow").unwrap();
    // One page of ring buffer holds a few dozen records.
    let opts = ProbeOptions {
        watch: Watch::Roots(vec![cg.watch_root()]),
        ring_buffer_bytes: Some(4096),
        ..Default::default()
    };
    let mut w = KernelWatch::with(opts).unwrap();
    // Nobody reads while 2000 processes fork and exit inside the cgroup.
    assert!(cg
        .spawn(&workload(), &["spin", "2000"])
        .unwrap()
        .wait()
        .unwrap()
        .success());
    let drops = w.probes.counters().unwrap().ringbuf_drops;
    assert!(drops > 1000, "only {drops} drops");
    // The reader hands out what fit, then says how much was lost: exactly the kernel's count.
    let events = w
        .until(WAIT, |ev| {
            ev.iter().any(|e| matches!(e, KernelEvent::Lost { .. }))
        })
        .await
        .unwrap();
    let lost: u64 = events
        .iter()
        .map(|e| {
            if let KernelEvent::Lost { records, .. } = e {
                *records
            } else {
                0
            }
        })
        .sum();
    assert_eq!(lost, drops);
    let kept = events
        .iter()
        .filter(|e| matches!(e, KernelEvent::Exit(_)))
        .count() as u64;
    assert!(kept > 0 && kept + lost >= 2000, "{kept} kept + {lost} lost");
    // The stream goes on.
    let mut child = cg.spawn(&workload(), &["exit", "9"]).unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let events = w
        .until(WAIT, |ev| group_exit(ev, pid).is_some())
        .await
        .unwrap();
    assert_eq!(group_exit(events, pid).unwrap().status.code(), Some(9));
}

/// The paths of older kernels, forced on this one: `sched_process_exit` without `group_dead`
/// (`signal->live` tells the last thread) and a pid-only `oom/mark_victim` (Linux < 6.8; the
/// victim's name and oom_score_adj then come from the victim task at its exit). The answers must
/// be the same as on the kernel's own paths, the rss figures absent.
#[tokio::test]
async fn older_kernel_paths_give_the_same_answers() {
    if !require_kernel() {
        return;
    }
    let mut cg = TestCgroup::new("older-paths").unwrap();
    cg.limit_memory(32 << 20).unwrap();
    let mut w = KernelWatch::with(ProbeOptions {
        watch: Watch::Roots(vec![cg.watch_root()]),
        older_kernel_paths: true,
        ..Default::default()
    })
    .unwrap();
    // Without the exit tracepoint's argument, group_dead comes from fentry/taskstats_exit, or
    // where the kernel refuses that (function tracing locked down), from signal->live.
    match w.probes.group_dead_source() {
        GroupDeadSource::Fentry => {}
        GroupDeadSource::SignalLive(why) => {
            eprintln!("fentry/taskstats_exit refused here ({why}): signal->live fallback")
        }
        GroupDeadSource::Tracepoint => panic!("older_kernel_paths still used the argument"),
    }
    let mut exits = cg.spawn(&workload(), &["exit", "42"]).unwrap();
    let exits_pid = exits.id();
    exits.wait().unwrap();
    let mut threads = cg.spawn(&workload(), &["thread-exit", "3"]).unwrap();
    let threads_pid = threads.id();
    threads.wait().unwrap();
    let oom = cg.spawn(&workload(), &["oom-child", "64"]).unwrap();
    let parent = oom.id();
    let out = oom.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let victim: u32 = stdout
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("workload said {stdout:?}"));
    let events = w
        .until(WAIT, |ev| {
            [exits_pid, threads_pid, parent, victim]
                .iter()
                .all(|p| group_exit(ev, *p).is_some())
                && !ooms_in(ev, &cg).is_empty()
        })
        .await
        .unwrap();

    assert_eq!(
        group_exit(events, exits_pid).unwrap().status.code(),
        Some(42)
    );
    assert_eq!(
        exits_of(events, threads_pid)
            .iter()
            .map(|x| (x.status.code(), x.group_dead))
            .collect::<Vec<_>>(),
        [(Some(3), true)],
        "exactly one record for the process, from its last thread"
    );
    let victim_exit = group_exit(events, victim).unwrap();
    assert_eq!(victim_exit.status.signal(), Some(9));
    assert_eq!(victim_exit.status.exit_code(), 137);
    let ooms = ooms_in(events, &cg);
    assert_eq!(ooms.len(), 1, "{ooms:#?}");
    let o = ooms[0];
    assert_eq!(
        (o.victim.pid, o.victim.ppid, o.victim.cgroup_id),
        (victim, parent, cg.id())
    );
    assert_eq!(o.victim_comm.as_str(), "oom-victim");
    assert_eq!(o.oom_score_adj, Some(1000));
    assert_eq!(
        o.memory,
        observer::kernel::OomMemory::default(),
        "no rss figures"
    );
    assert_eq!(w.probes.counters().unwrap().read_errors, 0);
}

/// A container init: pid 1 of a pid namespace deeper than the node's (the tests run on the host).
fn is_ns_init(task: &observer::kernel::Task) -> bool {
    task.ns_pid == 1 && task.ns_level > observer::kernel::own_pid_ns_level()
}

/// Records that wake the reader (a container init's exec and exit) and records that do not (a
/// plain process's), interleaved: every one arrives, in the order the kernel wrote them, each
/// task's exec before its exit, and the kernel counted each class as the class it is. The plain
/// child is reaped before the init child starts, so the two alternate strictly.
#[tokio::test]
async fn waking_and_quiet_records_interleave_without_loss_or_reordering() {
    if !require_kernel() {
        return;
    }
    const ROUNDS: usize = 100;
    let cg = TestCgroup::new("wake-mix").unwrap();
    let opts = ProbeOptions {
        watch: Watch::Roots(vec![cg.watch_root()]),
        // Roomy enough that no quiet record reaches a wake-up batch (an eighth of the ring): each
        // quiet record stays quiet.
        ring_buffer_bytes: Some(16 << 20),
        ..Default::default()
    };
    let mut w = KernelWatch::with(opts).unwrap();
    let before = w.probes.counters().unwrap();
    let mut child = cg
        .spawn(&workload(), &["mix", &ROUNDS.to_string()])
        .unwrap();
    let parent = child.id();
    // 200 forks and execs take about 14 s in a guest under software emulation (TCG): the
    // deadline is for a hang, not a pace.
    let events = w
        .until(Duration::from_secs(120), |ev| {
            group_exit(ev, parent).is_some()
        })
        .await
        .unwrap()
        .to_vec();
    assert!(child.wait().unwrap().success());
    let after = w.probes.counters().unwrap();
    assert_eq!(after.ringbuf_drops, 0);

    // The children's records, in ring order: (is a container init, is an exit, tgid).
    let mut seq = Vec::new();
    for e in &events {
        match e {
            KernelEvent::Exec(x) if x.task.ppid == parent => {
                seq.push((is_ns_init(&x.task), false, x.task.tgid));
            }
            KernelEvent::Exit(x) if x.task.ppid == parent && x.group_dead => {
                seq.push((is_ns_init(&x.task), true, x.task.tgid));
            }
            KernelEvent::Lost { .. } => panic!("records lost: {e:?}"),
            _ => {}
        }
    }
    assert_eq!(seq.len(), 4 * ROUNDS, "{seq:?}");
    for (round, recs) in seq.chunks(4).enumerate() {
        let [(false, false, a), (false, true, b), (true, false, c), (true, true, d)] = recs else {
            panic!("round {round}: {recs:?}");
        };
        assert_eq!(a, b, "round {round}: the plain child's exec, then its exit");
        assert_eq!(c, d, "round {round}: the init child's exec, then its exit");
    }
    // Ring order is the order of the kernel's timestamps.
    let times: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            KernelEvent::Exec(x) => Some(x.at.0),
            KernelEvent::Exit(x) => Some(x.at.0),
            _ => None,
        })
        .collect();
    assert!(times.windows(2).all(|t| t[0] <= t[1]), "{times:?}");
    // Every exec and exit in the cgroup but the inits' was quiet: the children's, and the
    // parent's own exec and exit. (Waking records are counted node-wide: other tests' cgroup
    // events wake too.)
    let quiet_expected = events
        .iter()
        .filter(|e| match e {
            KernelEvent::Exec(x) => !is_ns_init(&x.task),
            KernelEvent::Exit(x) => !is_ns_init(&x.task),
            _ => false,
        })
        .count() as u64;
    assert_eq!(after.quiet_records - before.quiet_records, quiet_expected);
    assert!(after.waking_records - before.waking_records >= 2 * ROUNDS as u64);
}

/// A record that wakes nobody is still read, at the reader's next poll, with nothing after it to
/// bring it along.
#[tokio::test]
async fn a_quiet_record_alone_is_read_at_the_next_poll() {
    if !require_kernel() {
        return;
    }
    let cg = TestCgroup::new("quiet-alone").unwrap();
    let mut w = KernelWatch::roots(&[cg.watch_root()]).unwrap();
    let before = w.probes.counters().unwrap().quiet_records;
    let mut child = cg.spawn(&workload(), &["exit", "3"]).unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let events = w
        .until(WAIT, |ev| group_exit(ev, pid).is_some())
        .await
        .unwrap();
    assert_eq!(group_exit(events, pid).unwrap().status.code(), Some(3));
    assert!(w.probes.counters().unwrap().quiet_records > before);
}

/// A container init's exit wakes the reader even when the init is not pid 1 of its namespace
/// (a shared pid namespace, hostPID) once the PLEG registered it as one; nothing else does.
#[tokio::test]
async fn a_registered_init_wakes_the_reader() {
    if !require_kernel() {
        return;
    }
    let cg = TestCgroup::new("known-init").unwrap();
    let Registered {
        probes,
        mut inits,
        mut reader,
        mut child,
        pid,
    } = registered_child(&cg, Wake::Selective);
    assert!(inits.contains(pid));
    assert_eq!(inits.pids(), [pid]);
    let before = probes.counters().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let exit = observer_tests::wait::poll_until(WAIT, || loop {
        match reader.try_next()? {
            KernelEvent::Exit(x) if x.task.tgid == pid && x.group_dead => return Some(x),
            _ => {}
        }
    })
    .expect("the registered init's exit");
    assert_eq!(exit.status.signal(), Some(9));
    let after = probes.counters().unwrap();
    assert_eq!(after.quiet_records, before.quiet_records, "the exit woke");
    inits.remove(pid).unwrap();
    inits.remove(pid).unwrap();
    assert!(!inits.contains(pid));
}

/// Probes on `cg` that wake their reader as `wake` says, and a child there registered as a
/// container's init (not pid 1 of a namespace), its exec already read.
struct Registered {
    probes: observer::kernel::Probes,
    inits: observer::kernel::KnownInits,
    reader: observer::kernel::EventReader,
    child: std::process::Child,
    pid: u32,
}

fn registered_child(cg: &TestCgroup, wake: Wake) -> Registered {
    let mut probes = observer::kernel::Probes::load(&ProbeOptions {
        watch: Watch::Roots(vec![cg.watch_root()]),
        wake,
        ..Default::default()
    })
    .unwrap();
    let mut inits = probes.known_inits().unwrap();
    let mut reader = probes.events().unwrap();
    let child = cg.spawn(&workload(), &["sleep", "30"]).unwrap();
    let pid = child.id();
    // Its exec (quiet: not pid 1 of a namespace) first, so that the counters the tests read
    // after see only what follows.
    observer_tests::wait::poll_until(WAIT, || loop {
        match reader.try_next()? {
            KernelEvent::Exec(x) if x.task.tgid == pid => return Some(()),
            _ => {}
        }
    })
    .expect("the child's exec");
    inits.insert(pid).unwrap();
    Registered {
        probes,
        inits,
        reader,
        child,
        pid,
    }
}

/// An onlooker's probes (`Wake::Never`, the api_path bench's own) wake their reader for nothing,
/// not even what wakes the agent's: a registered init's exit and a cgroup's creation are read
/// at the reader's poll, and counted quiet.
#[tokio::test]
async fn an_onlookers_probes_never_wake_their_reader() {
    if !require_kernel() {
        return;
    }
    let mut cg = TestCgroup::new("onlooker").unwrap();
    let Registered {
        probes,
        mut inits,
        mut reader,
        mut child,
        pid,
    } = registered_child(&cg, Wake::Never);
    let before = probes.counters().unwrap();
    let sub = cg.mkdir("sub").unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let (mut made, mut exited) = (false, false);
    observer_tests::wait::poll_until(WAIT, || loop {
        match reader.try_next()? {
            KernelEvent::Exit(x) if x.task.tgid == pid && x.group_dead => exited = true,
            KernelEvent::CgroupMkdir(c) if c.path == sub => made = true,
            _ => {}
        }
        if made && exited {
            return Some(());
        }
    })
    .expect("the cgroup's creation and the registered init's exit");
    let after = probes.counters().unwrap();
    assert_eq!(after.waking_records, before.waking_records, "a record woke");
    assert!(
        after.quiet_records >= before.quiet_records + 2,
        "{} quiet records, from {}",
        after.quiet_records,
        before.quiet_records
    );
    inits.remove(pid).unwrap();
}

/// The memory cgroup a test cgroup's limit is on: the cgroup itself where the memory controller
/// is on cgroup2, else its twin on the v1 memory hierarchy (`TestCgroup::limit_memory`).
fn memcg_id_of(cg: &TestCgroup) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mounts = observer::cgroup::CgroupMounts::detect(None).unwrap();
    let v2 = std::fs::read_to_string(cg.mount.mount_point.join("cgroup.controllers"))
        .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"));
    if v2 {
        return cg.id();
    }
    let v1 = mounts.v1("memory").expect("a v1 memory hierarchy");
    let dir = v1.to_absolute(&cg.rel).expect("inside the v1 memory mount");
    std::fs::metadata(dir).unwrap().ino()
}

/// True where the charge probe has a hook; otherwise says why and skips (a failure under
/// CI=true): kernels before 6.14 without BPF trampolines have neither hook.
fn charge_hook(source: &observer::kernel::ChargeSource) -> bool {
    let missing = match source {
        observer::kernel::ChargeSource::Off(why) => vec![format!("a charge hook ({why})")],
        _ => Vec::new(),
    };
    observer_tests::prereq::require("the charge probe's test", &missing)
}

/// The crossings of this test's cgroup, in the order sent: (threshold, usage, limit).
fn crossings_in(events: &[KernelEvent], cg: &TestCgroup) -> Vec<(u32, u64, Option<u64>)> {
    events
        .iter()
        .filter_map(|e| match e {
            KernelEvent::LimitHit(h) if h.task.cgroup_id == cg.id() => h
                .crossing
                .map(|c| (c.threshold_bp, h.usage_bytes, h.limit_bytes)),
            _ => None,
        })
        .collect()
}

/// A leak with nothing to reclaim is told on its way to the limit: every threshold once, in
/// order, each with the usage just past it and the limit, on the memory cgroup whose limit it is;
/// and nothing more once it sits above the last (here: until its kill). A neighbour bursting
/// past half its own limit on the same CPUs is told as its own, never as the leak's (the
/// statistics of one cgroup's pages are updated by whichever task drains a CPU's batch).
#[tokio::test]
async fn a_leak_crosses_each_threshold_of_its_limit_once() {
    if !require_kernel() {
        return;
    }
    let mut cg = TestCgroup::new("crossings").unwrap();
    let limit: u64 = 64 << 20;
    cg.limit_memory(limit).unwrap();
    let memcg = memcg_id_of(&cg);
    let mut neighbour = TestCgroup::new("neighbour").unwrap();
    neighbour.limit_memory(limit).unwrap();
    let neighbour_memcg = memcg_id_of(&neighbour);
    let mut w = KernelWatch::roots(&[cg.watch_root(), neighbour.watch_root()]).unwrap();
    let source = w.probes.charge_source().clone();
    eprintln!("charge hook: {source:?}");
    if !charge_hook(&source) {
        return;
    }
    let before = w.probes.counters().unwrap();
    let mut bursts = neighbour
        .spawn(&workload(), &["bursty", "40", "5"])
        .unwrap();
    // 16 MiB/s: four seconds to the kill.
    let mut child = cg.spawn(&workload(), &["leak", "16384"]).unwrap();
    let events = w
        .until(Duration::from_secs(60), |ev| !ooms_in(ev, &cg).is_empty())
        .await
        .unwrap()
        .to_vec();
    let _ = child.kill();
    let _ = child.wait();
    let _ = bursts.kill();
    let _ = bursts.wait();
    let crossings = crossings_in(&events, &cg);
    let thresholds: Vec<u32> = crossings.iter().map(|c| c.0).collect();
    assert_eq!(
        thresholds,
        observer::kernel::CROSSING_THRESHOLDS.map(u32::from),
        "{crossings:#?}"
    );
    for (t, usage, max) in &crossings {
        assert_eq!(*max, Some(limit));
        // Past the threshold, by at most a few charge batches (a quarter MiB each).
        let at = limit * u64::from(*t) / 10_000;
        assert!(
            (at..at + (4 << 20)).contains(usage),
            "{t}: usage {usage}, threshold at {at}"
        );
    }
    let mut neighbours = 0;
    for e in &events {
        let KernelEvent::LimitHit(h) = e else {
            continue;
        };
        if h.crossing.is_none() {
            continue;
        }
        assert_eq!(h.crossing.unwrap().depth, 0);
        if h.task.cgroup_id == cg.id() {
            assert_eq!(h.memcg_id, memcg, "{h:#?}");
        } else {
            assert_eq!(h.task.cgroup_id, neighbour.id(), "{h:#?}");
            assert_eq!(h.memcg_id, neighbour_memcg, "{h:#?}");
            assert_eq!(h.crossing.unwrap().threshold_bp, 5000, "{h:#?}");
            neighbours += 1;
        }
    }
    assert!(neighbours > 0, "the neighbour's bursts were not told");
    let after = w.probes.counters().unwrap();
    assert!(after.limit_crossings >= before.limit_crossings + 5);
    assert!(after.charge_checks > before.charge_checks);
}

/// A threshold is sent once per rise: bursts to 62 % of the limit, freed in between (500 ms a
/// round), cross 50 % once each and never 75 %.
#[tokio::test]
async fn each_rise_past_a_threshold_is_sent_once() {
    if !require_kernel() {
        return;
    }
    let mut cg = TestCgroup::new("rises").unwrap();
    cg.limit_memory(64 << 20).unwrap();
    let mut w = KernelWatch::roots(&[cg.watch_root()]).unwrap();
    if !charge_hook(w.probes.charge_source()) {
        return;
    }
    let child = cg.spawn(&workload(), &["bursty", "40", "2"]).unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let events = w
        .until(WAIT, |ev| group_exit(ev, pid).is_some())
        .await
        .unwrap()
        .to_vec();
    let crossings = crossings_in(&events, &cg);
    assert!(
        (2..=4).contains(&crossings.len()) && crossings.iter().all(|c| c.0 == 5000),
        "four bursts: {crossings:#?}"
    );
}
