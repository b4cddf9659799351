//! Any bytes as kernel log records (one a line, as /dev/kmsg gives them): no panic, and what the
//! parser holds stays within its bounds (reports under way, tasks and members per report, string
//! lengths), whatever the input: truncated reports, two interleaved, garbage. Records a process
//! wrote (a facility other than the kernel's) change nothing: the reports are those of the
//! kernel's records alone. A report either refused its `oom-kill:` line (no constraint, no
//! cgroups) or took one whose cgroup that ran out holds the victim's.
//!
//! The same bytes also name an `oom-kill:` line's fields (split at NUL: the cgroup that ran out,
//! the victim's below it, the comm, the cpuset's name): the line the kernel would write from
//! them is read back as written, or refused, never as other fields.
#![no_main]

#[path = "../../observer-user/src/kernel/oom_report.rs"]
#[allow(dead_code)]
mod oom_report;

use oom_report::{
    Constraint, CpusetPart, CrossCheck, KillLine, OomReport, Parser, MAX_MEMBERS, MAX_PENDING, MAX_STR,
    MAX_TASKS,
};

fn check(r: &OomReport) {
    assert!(r.tasks.len() <= MAX_TASKS);
    assert!(r.members.len() <= MAX_MEMBERS);
    assert!(r.counters.len() <= 4);
    assert!(r.tasks.windows(2).all(|w| w[0].rss_pages >= w[1].rss_pages));
    let strings = [&r.oom_memcg, &r.task_memcg, &r.stats_cgroup]
        .into_iter()
        .chain(r.group_cgroup.as_ref())
        .chain(r.tasks.iter().map(|t| &t.name))
        .chain(r.killed().map(|k| &k.comm));
    for s in strings {
        assert!(s.len() <= MAX_STR);
    }
    if let Some(t) = &r.trigger {
        assert!(t.comm.len() <= MAX_STR && t.cpuset.len() <= MAX_STR);
    }
    let _ = r.limit_kb();
    if let Some(b) = &r.breakdown {
        let _ = b.parts();
    }
    if r.refused {
        assert!(r.constraint.is_none() && r.oom_memcg.is_empty() && r.task_memcg.is_empty());
    }
    // A memcg kill's victim is chosen below the cgroup that ran out (paths cut to MAX_STR
    // aside).
    if r.constraint == Some(Constraint::Memcg) && r.task_memcg.len() < MAX_STR {
        let outer = r.oom_memcg.trim_end_matches('/');
        assert!(
            r.task_memcg == r.oom_memcg
                || r.task_memcg
                    .strip_prefix(outer)
                    .is_some_and(|rest| rest.starts_with('/')),
            "{r:?}"
        );
    }
}

/// The kernel's records: a `prio,...;` head whose facility (`prio >> 3`) is 0.
fn from_kernel(rec: &str) -> bool {
    rec.split(',')
        .next()
        .and_then(|p| p.parse::<u32>().ok())
        .is_none_or(|p| p >> 3 == 0)
}

fn reports<'a>(records: impl Iterator<Item = &'a str>) -> Vec<OomReport> {
    let mut p = Parser::new();
    for r in records {
        p.push(r);
    }
    p.finish()
}

/// The kernel's `oom-kill:` line of fields named by `parts`, read back.
fn kill_line(parts: &[&str]) {
    let [oom, below, comm, cpuset, ..] = parts else {
        return;
    };
    // What the kernel can print: paths of names without `/` or a newline, a comm of at most
    // 15 bytes (ASCII, no backslash: its printed length is its length), a cpuset name without `/`.
    let name_ok = |s: &str| !s.contains('\n') && !s.contains('/');
    if comm.len() > 15 || !comm.is_ascii() || comm.contains(['\\', '\n']) {
        return;
    }
    if !oom.split('/').chain(below.split('/')).all(name_ok) || !name_ok(cpuset) {
        return;
    }
    let oom = format!("/{}", oom.trim_matches('/'));
    let below = below.trim_matches('/');
    let task = if below.is_empty() {
        oom.clone()
    } else {
        format!("{}/{below}", oom.trim_end_matches('/'))
    };
    let l = KillLine {
        constraint: "CONSTRAINT_MEMCG".into(),
        nodemask: "(null)".into(),
        cpuset: Some(CpusetPart {
            name: if cpuset.is_empty() { "/" } else { cpuset }.to_string(),
            key: "mems_allowed".into(),
            nodes: "0".into(),
        }),
        oom_memcg: Some(oom.clone()),
        task_memcg: task,
        comm: comm.to_string(),
        pid: 42,
        uid: 0,
    };
    let text = l.kernel_text();
    let full = CrossCheck {
        stats_cgroup: Some(&oom),
        comm: Some(comm),
    };
    for c in [CrossCheck::default(), full] {
        if let Ok(got) = KillLine::parse(&text, c) {
            assert_eq!(got, l, "{text}");
        }
    }
    // A global OOM's line too.
    let g = KillLine {
        constraint: "CONSTRAINT_NONE".into(),
        oom_memcg: None,
        ..l
    };
    let text = g.kernel_text();
    if let Ok(got) = KillLine::parse(&text, CrossCheck::default()) {
        assert_eq!(got, g, "{text}");
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut p = Parser::new();
    for (i, rec) in text.split('\n').enumerate() {
        p.push(rec);
        assert!(p.pending() <= MAX_PENDING);
        for r in p.pop() {
            check(&r);
        }
        // The live reader drains now and then: that path too.
        if i % 7 == 6 {
            for r in p.flush_killed() {
                check(&r);
            }
        }
    }
    for r in p.finish() {
        check(&r);
    }
    let all = reports(text.split('\n'));
    let kernel = reports(text.split('\n').filter(|r| from_kernel(r)));
    assert_eq!(all, kernel);
    kill_line(&text.split('\0').collect::<Vec<_>>());
});
