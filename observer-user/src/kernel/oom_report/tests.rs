//! The parser on real kernel output (testdata/: `<kernel>-<where>-<cgroup mode>-<kill>.kmsg`,
//! raw /dev/kmsg records captured by scripts/oom-capture.sh and on the build host), and on that
//! output cut, interleaved and mangled.
use super::*;
use proptest::prelude::*;

fn fixture(name: &str) -> Vec<String> {
    let path = format!("{}/src/kernel/testdata/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .lines()
        .map(str::to_string)
        .collect()
}

fn reports(name: &str) -> Vec<OomReport> {
    let recs = fixture(name);
    parse_all(recs.iter().map(String::as_str))
}

#[test]
fn host_6_18_v1_container_limit() {
    let r = reports("6.18-host-v1-container.kmsg");
    assert_eq!(r.len(), 1, "{r:#?}");
    let r = &r[0];
    let t = r.trigger.as_ref().unwrap();
    assert_eq!((t.comm.as_str(), t.pid), ("python3", Some(12591)));
    assert_eq!((t.order, t.oom_score_adj), (Some(0), Some(0)));
    assert_eq!(t.gfp_mask, "0xcc0(GFP_KERNEL)");
    assert_eq!(r.constraint, Some(Constraint::Memcg));
    assert_eq!(r.oom_memcg, "/obs20cap/podA/ctr1");
    assert_eq!(r.task_memcg, r.oom_memcg);
    assert_eq!(r.limit_kb(), Some(32768));
    let m = r.counter("memory").unwrap();
    assert_eq!((m.usage_kb, m.failcnt), (32768, 140));
    assert_eq!(r.counter("kmem").unwrap().usage_kb, 164);
    assert_eq!(r.counters.len(), 3, "memory, memory+swap, kmem");
    assert_eq!(r.stats_cgroup, "/obs20cap/podA/ctr1");
    let b = r.breakdown.as_ref().unwrap();
    assert!(b.anon.unwrap() > 30 << 20, "{b:?}");
    assert_eq!((b.file, b.shmem), (Some(0), Some(0)));
    assert!(r.tasks_listed);
    assert_eq!(r.task_count, 1);
    let task = &r.tasks[0];
    assert_eq!(
        (
            task.pid,
            task.rss_pages,
            task.rss_anon_pages,
            task.name.as_str()
        ),
        (12591, 9799, Some(8128), "python3")
    );
    let v = r.victim.as_ref().unwrap();
    assert_eq!((v.pid, v.comm.as_str()), (12591, "python3"));
    assert_eq!((v.anon_rss_kb, v.file_rss_kb), (Some(32512), Some(6684)));
    assert!(r.group_cgroup.is_none() && r.members.is_empty());
    assert!(r.has_start);
}

/// A pod-level limit: the first kill's trigger (12796, in ctrB) is not its victim (12754, ctrA).
#[test]
fn host_6_18_v1_pod_limit_and_a_trigger_in_a_sibling() {
    let r = reports("6.18-host-v1-pod.kmsg");
    assert_eq!(r.len(), 2, "{r:#?}");
    let first = &r[0];
    assert_eq!(first.trigger.as_ref().unwrap().pid, Some(12796));
    assert_eq!(first.oom_memcg, "/obs20cap/podB");
    assert_eq!(first.task_memcg, "/obs20cap/podB/ctrA");
    assert_eq!(first.limit_kb(), Some(65536));
    assert_eq!(first.task_count, 2);
    assert_eq!(
        first.tasks.iter().map(|t| t.pid).collect::<Vec<_>>(),
        [12754, 12796],
        "largest first"
    );
    assert_eq!(first.victim.as_ref().unwrap().pid, 12754);
    assert_eq!(first.victim.as_ref().unwrap().oom_score_adj, Some(1000));
    let second = &r[1];
    assert_eq!(second.victim.as_ref().unwrap().pid, 12796);
    assert_eq!(second.task_memcg, "/obs20cap/podB/ctrB");
}

/// Every prefix and every suffix of a real log: no panic, and the victim is known exactly when
/// its lines are there.
#[test]
fn truncated_reports_say_what_they_lack() {
    let recs = fixture("6.18-host-v1-pod.kmsg");
    for cut in 0..=recs.len() {
        let head = parse_all(recs[..cut].iter().map(String::as_str));
        assert!(head.len() <= 2);
        let tail = parse_all(recs[cut..].iter().map(String::as_str));
        assert!(tail.len() <= 2);
        for r in head.iter().chain(&tail) {
            assert!(r.tasks.len() <= MAX_TASKS);
            if let Some(v) = &r.victim {
                assert!([12754, 12796].contains(&v.pid), "{cut}: {v:?}");
            }
        }
        // The ring overwrote the start: no trigger is made up.
        if let Some(r) = tail.first() {
            if !r.has_start {
                assert!(r.trigger.is_none(), "{cut}");
            }
        }
    }
    // Without the header, the report still has its victim and cgroups.
    let from = recs.iter().position(|r| r.contains(";oom-kill:")).unwrap();
    let r = parse_all(recs[from..].iter().map(String::as_str));
    assert_eq!(r[0].victim.as_ref().unwrap().pid, 12754);
    assert_eq!(r[0].oom_memcg, "/obs20cap/podB");
    assert!(!r[0].has_start && r[0].trigger.is_none());
}

/// Tags each record with a printk caller (CONFIG_PRINTK_CALLER).
fn with_caller(recs: &[String], caller: &str) -> Vec<String> {
    recs.iter()
        .map(|r| {
            let (head, msg) = r.split_once(';').unwrap();
            format!("{head},caller={caller};{msg}")
        })
        .collect()
}

/// Two kills' records interleaved, told apart by their caller.
#[test]
fn interleaved_reports_are_kept_apart_by_caller() {
    let a = with_caller(&fixture("6.18-host-v1-container.kmsg"), "T12591");
    let b = with_caller(&fixture("6.18-host-v1-pod.kmsg"), "T12796");
    let mut mixed = Vec::new();
    for i in 0..a.len().max(b.len()) {
        mixed.extend(a.get(i).cloned());
        mixed.extend(b.get(i).cloned());
    }
    let r = parse_all(mixed.iter().map(String::as_str));
    let mut got: Vec<_> = r
        .iter()
        .map(|r| {
            (
                r.victim.as_ref().map(|v| v.pid),
                r.oom_memcg.as_str(),
                r.trigger.as_ref().and_then(|t| t.pid),
                r.task_count,
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (Some(12591), "/obs20cap/podA/ctr1", Some(12591), 1),
            (Some(12754), "/obs20cap/podB", Some(12796), 2),
            (Some(12796), "/obs20cap/podB", Some(12796), 1),
        ]
    );
}

/// Without callers, interleaving cannot be told apart: bounded, no panic, nothing invented.
#[test]
fn garbage_and_uncallered_interleaving_stay_bounded() {
    let a = fixture("6.18-host-v1-container.kmsg");
    let b = fixture("6.18-host-v1-pod.kmsg");
    let mut mixed = Vec::new();
    for i in 0..a.len().max(b.len()) {
        mixed.extend(a.get(i).cloned());
        mixed.extend(b.get(i).cloned());
    }
    let r = parse_all(mixed.iter().map(String::as_str));
    assert!(!r.is_empty() && r.len() <= 6, "{}", r.len());
    let junk = [
        "",
        ";",
        "6,1,2,-;",
        "6,x,2,-;oom-kill:",
        "6,1,2,-;x invoked oom-killer: ",
        "6,1,2,-;[ 1] 2",
        "6,1,2,-;[  pid  ]",
        "6,2,3,-;[ 4294967296] 0 1 2 3 4 5 6 7 8 9 10 11 12 13",
        "6,3,4,-;memory: usage kB, limit kB, failcnt",
        "6,4,5,-;memory: usage 1kB, limit 18446744073709551616kB, failcnt 0",
        "6,5,6,-;Killed process 1 (",
        "6,5,6,-;Killed process 1 (a) b",
        "6,6,7,-;Tasks in  are going to be killed due to memory.oom.group set",
        "6,7,8,-;Memory cgroup stats for ",
        "6,8,9,-;anon 1\\x0afile 2\\x0a\\x0a",
        "\u{0}\u{ffff};\u{1}",
    ];
    let mut p = Parser::new();
    for _ in 0..1000 {
        for j in junk {
            p.push(j);
        }
        assert!(p.pending.len() <= MAX_PENDING);
        let out = p.pop();
        assert!(out.len() <= junk.len() * 2);
    }
    // A huge comm is cut to MAX_STR.
    let long = format!("6,1,2,-;{} invoked oom-killer: order=0", "é".repeat(4000));
    let r = parse_all([long.as_str()]);
    assert!(r[0].trigger.as_ref().unwrap().comm.len() <= MAX_STR);
}

/// The task dump keeps the largest MAX_TASKS, counting them all.
#[test]
fn a_long_task_dump_keeps_the_largest() {
    let mut recs = vec![
        "4,1,10,-;hog invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0"
            .to_string(),
        "6,2,11,-;Tasks state (memory values in pages):".into(),
        "6,3,12,-;[  pid  ]   uid  tgid total_vm      rss pgtables_bytes swapents oom_score_adj name".into(),
    ];
    for pid in 1..=100u32 {
        recs.push(format!(
            "6,{},{},-;[ {pid}]     0 {pid}  1000  {} 4096 0 0 my task {pid}",
            pid + 3,
            pid + 12,
            (pid * 37) % 101
        ));
    }
    let r = parse_all(recs.iter().map(String::as_str));
    assert_eq!(r[0].task_count, 100);
    assert_eq!(r[0].tasks.len(), MAX_TASKS);
    assert_eq!(r[0].tasks[0].rss_pages, 100);
    assert!(r[0]
        .tasks
        .windows(2)
        .all(|w| w[0].rss_pages >= w[1].rss_pages));
    assert_eq!(
        r[0].tasks[0].rss_anon_pages, None,
        "no split on this format"
    );
    assert!(r[0].tasks[0].name.starts_with("my task "));
}

/// The pids of the five kills scripts/oom-capture.sh makes, per capture: (trigger, victim).
struct Guest {
    file: &'static str,
    kills: [(u32, u32); 5],
    group_members: [u32; 2],
    /// Debian's 6.1 prints no rss split in the task dump; 6.12 does.
    split: bool,
}

const GUESTS: [Guest; 2] = [
    Guest {
        file: "6.1-debian-v2.kmsg",
        kills: [(100, 100), (254, 104), (366, 366), (374, 374), (376, 376)],
        group_members: [373, 372],
        split: false,
    },
    Guest {
        file: "6.12-debian-v2.kmsg",
        kills: [(147, 147), (286, 151), (446, 446), (454, 454), (456, 456)],
        group_members: [452, 453],
        split: true,
    },
];

fn id(short: &str) -> String {
    format!("{short:0<64}")
}

/// Debian's 6.1 and 6.12 on cgroup v2: container limit, a trigger that is not the victim, a
/// pod-level limit, a group kill, a global OOM.
#[test]
fn debian_guests_v2_every_kind_of_kill() {
    for g in GUESTS {
        let r = reports(g.file);
        let f = g.file;
        assert_eq!(r.len(), 5, "{f}: {r:#?}");
        for (rep, (trigger, victim)) in r.iter().zip(g.kills) {
            assert!(rep.has_start, "{f}");
            assert_eq!(rep.trigger.as_ref().unwrap().pid, Some(trigger), "{f}");
            assert_eq!(rep.victim.as_ref().unwrap().pid, victim, "{f}");
            assert!(rep.tasks_listed, "{f}");
            assert!(
                rep.tasks
                    .iter()
                    .all(|t| t.rss_anon_pages.is_some() == g.split),
                "{f}"
            );
        }
        let pod = |n: u32| {
            format!("/kubepods/burstable/pod{n}{n}{n}{n}{n}{n}{n}{n}-{n}{n}{n}{n}-4{n}{n}{n}-8{n}{n}{n}-{n}{n}{n}{n}{n}{n}{n}{n}{n}{n}{n}{n}")
        };

        // A container's own 32 MiB limit.
        let c = &r[0];
        assert_eq!(c.constraint, Some(Constraint::Memcg), "{f}");
        assert_eq!(c.oom_memcg, format!("{}/{}", pod(1), id("c0ffee01")), "{f}");
        assert_eq!(c.task_memcg, c.oom_memcg, "{f}");
        assert_eq!(c.limit_kb(), Some(32768), "{f}");
        assert_eq!(c.stats_cgroup, c.oom_memcg, "{f}");
        let b = c.breakdown.as_ref().unwrap();
        assert!(
            b.anon.unwrap() > 30 << 20 && b.file == Some(0),
            "{f}: {b:?}"
        );
        assert!(b.kernel.is_some() && b.pagetables.is_some(), "{f}: {b:?}");
        assert_eq!(c.trigger.as_ref().unwrap().cpuset, id("c0ffee01"), "{f}");

        // The allocator (oom_score_adj -900) killed the holder (1000).
        let t = &r[1];
        assert_eq!(t.trigger.as_ref().unwrap().oom_score_adj, Some(-900), "{f}");
        assert_eq!(t.victim.as_ref().unwrap().oom_score_adj, Some(1000), "{f}");
        assert_eq!(t.tasks[0].name, "hold.sh", "{f}: largest first");

        // The pod's 48 MiB limit, hit from its second container; the first holds tmpfs.
        let p = &r[2];
        assert_eq!(p.oom_memcg, pod(3), "{f}");
        assert_eq!(
            p.task_memcg,
            format!("{}/{}", pod(3), id("c0ffee03b")),
            "{f}"
        );
        assert_eq!(p.limit_kb(), Some(49152), "{f}");
        assert_eq!(p.stats_cgroup, pod(3), "{f}");
        let b = p.breakdown.as_ref().unwrap();
        assert!(b.shmem.unwrap() >= 15 << 20, "{f}: {b:?}");
        assert_eq!(p.trigger.as_ref().unwrap().cpuset, id("c0ffee03b"), "{f}");

        // memory.oom.group: every process of the container, the victim named once.
        let gk = &r[3];
        let cg = format!("{}/{}", pod(4), id("c0ffee04"));
        assert_eq!(gk.group_cgroup.as_deref(), Some(cg.as_str()), "{f}");
        assert_eq!(
            gk.members.iter().map(|m| m.pid).collect::<Vec<_>>(),
            g.group_members,
            "{f}"
        );

        // The node's memory: no cgroup, no counters, no breakdown.
        let n = &r[4];
        assert_eq!(n.constraint, Some(Constraint::None), "{f}");
        assert_eq!(
            (n.oom_memcg.as_str(), n.task_memcg.as_str()),
            ("", "/global"),
            "{f}"
        );
        assert!(n.counters.is_empty() && n.breakdown.is_none(), "{f}");
        assert!(
            n.victim.as_ref().unwrap().anon_rss_kb.unwrap() > 100 << 10,
            "{f}"
        );
    }
}

/// The live path: records one by one, reports given out when the log is drained.
#[test]
fn streaming_gives_each_report_once_when_the_log_is_drained() {
    for g in GUESTS {
        let recs = fixture(g.file);
        let mut p = Parser::new();
        let mut got = Vec::new();
        for r in &recs {
            p.push(r);
            got.extend(p.pop());
            // The reader drains after every record here: a group's members come in the same
            // burst in reality, so a drained log after the victim ends only a lone kill.
            if !r.contains("Killed process") {
                got.extend(p.flush_killed());
            }
        }
        got.extend(p.finish());
        assert_eq!(
            got.iter()
                .map(|r| r.victim.as_ref().unwrap().pid)
                .collect::<Vec<_>>(),
            g.kills.map(|k| k.1),
            "{}",
            g.file
        );
    }
}

/// Debian's 6.1 on cgroup v1: the pod-level kill's trigger (head, writing tmpfs in one container)
/// killed dd in the other. 6.1 logs v1's counters (memory+swap, kmem) but v2's stat names.
#[test]
fn debian_guest_6_1_v1() {
    let r = reports("6.1-debian-v1.kmsg");
    let victims: Vec<_> = r.iter().map(|r| r.victim.as_ref().unwrap().pid).collect();
    assert_eq!(victims, [102, 106, 111, 323, 327]);
    let p = &r[3];
    assert_eq!(p.trigger.as_ref().unwrap().comm, "head");
    assert_eq!(p.trigger.as_ref().unwrap().pid, Some(263));
    assert_ne!(p.oom_memcg, p.task_memcg);
    assert!(p
        .oom_memcg
        .ends_with("pod33333333-3333-4333-8333-333333333333"));
    assert_eq!(p.limit_kb(), Some(49152));
    assert!(p.counter("memory+swap").is_some() && p.counter("kmem").is_some());
    let b = p.breakdown.as_ref().unwrap();
    assert!(!b.v1, "{b:?}");
    let parts = b.parts();
    let shmem = parts.iter().find(|(k, _)| *k == "shmem").unwrap().1;
    assert!(shmem >= 15 << 20, "{parts:?}");
    // The cache figure without its shmem: no page counted twice.
    let file = parts.iter().find(|(k, _)| *k == "file").map_or(0, |p| p.1);
    assert!(file < 2 << 20, "{parts:?}");
    assert_eq!(r[4].constraint, Some(Constraint::None));
    // 6.18 on v1 logs v1's names, the hierarchy's `total_` figures winning.
    let host = reports("6.18-host-v1-pod.kmsg");
    let b = host[0].breakdown.as_ref().unwrap();
    assert!(b.v1 && b.anon == Some(66707456), "{b:?}");
}

/// A memcg kill's report as the kernel logs it, the `oom-kill:` line's fields given: `prio` on
/// every record (6 and 3: the kernel's; 14 and 11: a process's, LOG_USER).
fn memcg_report(fields: &str, comm: &str, pid: u32, stats: &str, user: bool) -> Vec<String> {
    let f = if user { 8 } else { 0 };
    vec![
        format!("{},1,100,-;hog invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0", 4 + f),
        format!("{},2,101,-;memory: usage 32768kB, limit 32768kB, failcnt 9", 6 + f),
        format!("{},3,102,-;Memory cgroup stats for {stats}:", 6 + f),
        format!("{},4,103,-;oom-kill:{fields}", 6 + f),
        format!("{},5,104,-;Memory cgroup out of memory: Killed process {pid} ({comm}) total-vm:9kB, anon-rss:8kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1kB oom_score_adj:0", 3 + f),
    ]
}

const CTR: &str = "/kubepods/burstable/pod11111111-1111-4111-8111-111111111111/c0ffee01";

fn cpuset(name: &str) -> CpusetPart {
    CpusetPart {
        name: name.into(),
        key: "mems_allowed".into(),
        nodes: "0".into(),
    }
}

fn memcg_line(oom: &str, task: &str, comm: &str, pid: u32) -> KillLine {
    KillLine {
        constraint: "CONSTRAINT_MEMCG".into(),
        nodemask: "(null)".into(),
        cpuset: Some(cpuset("c0ffee01")),
        oom_memcg: Some(oom.into()),
        task_memcg: task.into(),
        comm: comm.into(),
        pid,
        uid: 0,
    }
}

/// Records a process wrote (facility LOG_USER: /dev/kmsg gives a writer's record facility 1
/// unless it names another, never 0) are no part of any report, on /dev/kmsg and on
/// syslog(2)'s text alike, and each one shaped like a report's line is counted.
#[test]
fn records_not_from_the_kernel_are_ignored_and_counted() {
    let fields = memcg_line(CTR, CTR, "FORGED", 4242).kernel_text();
    let forged = memcg_report(&fields, "FORGED", 4242, CTR, true);
    let (r, ignored) = parse_counted(forged.iter().map(String::as_str), Parser::new());
    assert!(r.is_empty(), "{r:#?}");
    assert_eq!(ignored.not_kernel, forged.len() as u64);
    // The same lines from the kernel are a report.
    let real = memcg_report(&fields, "FORGED", 4242, CTR, false);
    let r = parse_all(real.iter().map(String::as_str));
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].task_memcg, CTR);
    // A process's lines among the kernel's change nothing of the kernel's report.
    let mut mixed = Vec::new();
    for (k, u) in real.iter().zip(&forged) {
        mixed.push(k.clone());
        mixed.push(u.replace("FORGED", "OTHER").replace("c0ffee01", "c0ffee02"));
    }
    let (m, ignored) = parse_counted(mixed.iter().map(String::as_str), Parser::new());
    assert_eq!(m, r);
    assert_eq!(ignored.not_kernel, forged.len() as u64);
    // Other processes' records (journald's, say) are not counted: they look like no report.
    let (_, ignored) = parse_counted(
        ["30,9,200,-;systemd[1]: Started foo.service."],
        Parser::new(),
    );
    assert_eq!(ignored, Ignored::default());
    // Counting from a time on (a log read again) counts only what came after.
    let (_, later) = parse_counted(
        forged.iter().map(String::as_str),
        Parser::counting_after(102),
    );
    assert_eq!(later.not_kernel, 2);
}

/// The parts of a report that would move a kill: each split the kernel's format allows is
/// weighed, and what cannot be told apart is refused, never guessed.
#[test]
fn separators_in_names_never_move_a_kill() {
    fn check<'a>(stats: Option<&'a str>, comm: Option<&'a str>) -> CrossCheck<'a> {
        CrossCheck {
            stats_cgroup: stats,
            comm,
        }
    }
    // A path holding `,task_memcg=/`: only the split where the cgroup that ran out holds the
    // victim's fits.
    let evil = format!(
        "{CTR},task_memcg=/kubepods/burstable/pod22222222-2222-4222-8222-222222222222/c0ffee02"
    );
    let l = memcg_line(&evil, &format!("{evil}/x"), "sh", 7);
    assert_eq!(
        KillLine::parse(&l.kernel_text(), check(None, None)),
        Ok(l.clone())
    );
    // Two splits that both fit: the stats line's cgroup (the one that ran out) decides.
    let l = memcg_line("/a", "/a/m,task_memcg=/a,task_memcg=/a/m/z", "sh", 7);
    let text = l.kernel_text();
    assert_eq!(
        KillLine::parse(&text, check(None, None)),
        Err(Refusal::Ambiguous(2))
    );
    assert_eq!(
        KillLine::parse(&text, check(Some("/a"), None)),
        Ok(l.clone())
    );
    // A comm holding `,task=`: the `Killed process` line's comm decides.
    let l = memcg_line(CTR, &format!("{CTR}/x,task=y"), "z", 7);
    let text = l.kernel_text();
    assert_eq!(
        KillLine::parse(&text, check(Some(CTR), None)),
        Err(Refusal::Ambiguous(2))
    );
    assert_eq!(
        KillLine::parse(&text, check(Some(CTR), Some("z"))),
        Ok(l.clone())
    );
    let other = KillLine {
        task_memcg: format!("{CTR}/x"),
        comm: "y,task=z".into(),
        ..l.clone()
    };
    assert_eq!(
        KillLine::parse(&text, check(Some(CTR), Some("y,task=z"))),
        Ok(other)
    );
    // A comm longer than the kernel's 15 bytes is no comm.
    let l = memcg_line(CTR, CTR, "0123456789abcde", 7);
    assert_eq!(KillLine::parse(&l.kernel_text(), check(None, None)), Ok(l));
    // A cpuset name holding the node list's key, a global OOM, no cpuset part.
    let global = KillLine {
        constraint: "CONSTRAINT_NONE".into(),
        nodemask: "0-1,3".into(),
        cpuset: Some(CpusetPart {
            nodes: "0-1,3".into(),
            ..cpuset("x,mems_allowed=0,global_oom")
        }),
        oom_memcg: None,
        task_memcg: "/system.slice/x.service".into(),
        comm: "java".into(),
        pid: 9,
        uid: -1,
    };
    assert_eq!(
        KillLine::parse(&global.kernel_text(), check(None, None)),
        Ok(global.clone())
    );
    let bare = KillLine {
        cpuset: None,
        ..global
    };
    assert_eq!(
        KillLine::parse(&bare.kernel_text(), check(None, None)),
        Ok(bare)
    );
    for bad in [
        "",
        "constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/a,task=x,pid=1,uid=0",
        "constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/a,task_memcg=/a,task=x,pid=1,uid=0",
        "constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=a/b,mems_allowed=0,oom_memcg=/a,task_memcg=/a,task=x,pid=1,uid=0",
        "constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/a,task_memcg=/b,task=x,pid=1,uid=0",
        "constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/a,task_memcg=/a,task=x,pid=-1,uid=0",
        "constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/a,task_memcg=/a,task=0123456789abcdef,pid=1,uid=0",
    ] {
        assert_eq!(KillLine::parse(bad, check(None, None)), Err(Refusal::Malformed), "{bad}");
    }
}

/// In a whole report: an ambiguous line waits for the victim's comm; one that stays ambiguous,
/// or disagrees with the stats line, is refused (no constraint, no cgroups: the kill is known
/// by its victim's line and the probes) and counted.
#[test]
fn a_report_refuses_what_it_cannot_tell_apart() {
    let l = memcg_line(CTR, &format!("{CTR}/x,task=y"), "z", 7);
    let recs = memcg_report(&l.kernel_text(), "z", 7, CTR, false);
    let (r, ignored) = parse_counted(recs.iter().map(String::as_str), Parser::new());
    assert_eq!(
        (r[0].task_memcg.as_str(), r[0].refused),
        (l.task_memcg.as_str(), false)
    );
    assert_eq!(ignored.refused, 0);
    // The victim's line lost: nothing tells the splits apart.
    let (r, ignored) = parse_counted(recs[..4].iter().map(String::as_str), Parser::new());
    assert!(r[0].refused && r[0].task_memcg.is_empty() && r[0].constraint.is_none());
    assert_eq!(r[0].victim.as_ref().map(|v| v.pid), Some(7));
    assert_eq!(ignored.refused, 1);
    // The stats line names another cgroup than the line's that ran out.
    let l = memcg_line(CTR, CTR, "sh", 7);
    let recs = memcg_report(&l.kernel_text(), "sh", 7, "/kubepods/other", false);
    let (r, ignored) = parse_counted(recs.iter().map(String::as_str), Parser::new());
    assert!(r[0].refused, "{r:#?}");
    assert_eq!(
        r[0].victim.as_ref().map(|v| (v.pid, v.comm.as_str())),
        Some((7, "sh"))
    );
    assert_eq!(ignored.refused, 1);
    // A group that does not hold the victim is no group of this kill.
    let mut recs = memcg_report(&l.kernel_text(), "sh", 7, CTR, false);
    recs.push(
        "6,6,105,-;Tasks in /elsewhere are going to be killed due to memory.oom.group set".into(),
    );
    recs.push("3,7,106,-;Memory cgroup out of memory: Killed process 8 (x) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1kB oom_score_adj:0".into());
    let r = parse_all(recs.iter().map(String::as_str));
    assert_eq!(r[0].group_cgroup, None);
    assert!(r[0].members.is_empty());
    // A comm that holds the figures' separator.
    let k = killed("Out of memory: Killed process 5 (a) total-vm:1kB) total-vm:9kB, anon-rss:8kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1kB oom_score_adj:0").unwrap();
    assert_eq!(
        (k.comm.as_str(), k.total_vm_kb, k.anon_rss_kb),
        ("a) total-vm:1kB", Some(9), Some(8))
    );
}

/// A cgroup name, a comm or a cpuset name built from the format's own separators.
fn arb_name() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "a",
            "k",
            ",",
            "=",
            ":",
            " ",
            "0",
            "-",
            "\\x0a",
            ",task=",
            ",task_memcg=",
            ",oom_memcg=",
            ",pid=1",
            ",uid=0",
            ",global_oom",
            ",mems_allowed=0",
            "(null)",
        ]),
        1..5,
    )
    .prop_map(|v| v.concat())
}

fn arb_path() -> impl Strategy<Value = String> {
    prop::collection::vec(arb_name(), 0..4).prop_map(|v| {
        if v.is_empty() {
            "/".into()
        } else {
            v.iter().map(|c| format!("/{c}")).collect()
        }
    })
}

fn arb_kill_line() -> impl Strategy<Value = KillLine> {
    (
        prop::sample::select(vec![
            "CONSTRAINT_MEMCG",
            "CONSTRAINT_NONE",
            "CONSTRAINT_CPUSET",
        ]),
        prop::option::of(prop_oneof![Just("/".to_string()), arb_name()]),
        arb_path(),
        arb_path(),
        arb_name().prop_filter("a comm is at most 15 bytes", |c| comm_len(c) <= MAX_COMM),
        any::<u32>(),
    )
        .prop_map(|(constraint, cpuset, oom, below, comm, pid)| {
            let memcg = constraint == "CONSTRAINT_MEMCG";
            KillLine {
                constraint: constraint.into(),
                nodemask: "(null)".into(),
                cpuset: cpuset.map(|n| self::cpuset(&n)),
                task_memcg: if memcg && below != "/" {
                    format!("{}{below}", oom.trim_end_matches('/'))
                } else if memcg {
                    oom.clone()
                } else {
                    below
                },
                oom_memcg: memcg.then_some(oom),
                comm,
                pid,
                uid: 0,
            }
        })
}

proptest! {
    /// Whatever the names hold, a line is read back as the kernel wrote it, or refused: never
    /// as another line (another container, another victim).
    #[test]
    fn a_kill_line_is_read_as_written_or_refused(l in arb_kill_line()) {
        let text = l.kernel_text();
        let full = CrossCheck {
            stats_cgroup: l.oom_memcg.as_deref(),
            comm: Some(&l.comm),
        };
        for check in [CrossCheck::default(), full] {
            if let Ok(got) = KillLine::parse(&text, check) {
                prop_assert_eq!(&got, &l);
            }
        }
        // Names without the separators are always read.
        let plain = !l.comm.contains(",task=")
            && !l.task_memcg.contains(",task")
            && l.oom_memcg.as_deref().is_none_or(|p| !p.contains(",task"));
        if plain {
            prop_assert_eq!(KillLine::parse(&text, full), Ok(l));
        }
    }
}

/// Fifteen kills in five seconds on the build host: the kernel printed three of them with only
/// the victim's line (`oom_kill_process`'s ratelimit, 10 reports in 5 s), then "3 callbacks
/// suppressed". Those are said not printed, only where the log was read without a gap before.
#[test]
fn host_6_18_rate_limited_kills_are_said_not_printed() {
    let recs = fixture("6.18-host-v1-ratelimited.kmsg");
    let r = parse_all(recs.iter().map(String::as_str));
    let victims = |r: &[OomReport], lone: bool| -> Vec<u32> {
        r.iter()
            .filter(|r| r.not_printed == lone)
            .map(|r| r.victim.as_ref().unwrap().pid)
            .collect()
    };
    assert_eq!(victims(&r, true), [12923, 12926, 12929], "{r:#?}");
    assert_eq!(
        victims(&r, false),
        [12914, 12917, 12916, 12920, 12932, 12935]
    );
    for p in r.iter().filter(|r| !r.not_printed) {
        assert!(
            p.has_start && p.constraint == Some(Constraint::Memcg),
            "{p:#?}"
        );
    }
    let lone = r.iter().find(|r| r.not_printed).unwrap();
    assert!(!lone.has_start && lone.constraint.is_none() && lone.task_memcg.is_empty());
    assert_eq!(lone.victim.as_ref().unwrap().anon_rss_kb, Some(15744));

    // A reader that starts at the first lone line, or lost the record before it, cannot tell
    // an unprinted report from one the ring overwrote.
    let from = recs
        .iter()
        .position(|l| l.contains("Killed process 12923"))
        .unwrap();
    let late = parse_all(recs[from..].iter().map(String::as_str));
    assert!(late.iter().all(|r| !r.not_printed), "{late:#?}");
    // The ring overwrote one record just before the first lone line: the sequence skips one.
    let gap: Vec<String> = recs
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let (prio, rest) = l.split_once(',').unwrap();
            let (seq, rest) = rest.split_once(',').unwrap();
            let seq: u64 = seq.parse().unwrap();
            format!("{prio},{},{rest}", seq + u64::from(i >= from))
        })
        .collect();
    let gap = parse_all(gap.iter().map(String::as_str));
    assert!(victims(&gap, true).is_empty(), "{gap:#?}");
    assert_eq!(gap.len(), r.len());
}
