//! Any bytes as kernel log records (one a line, as /dev/kmsg gives them): no panic, and what the
//! parser holds stays within its bounds (reports under way, tasks and members per report, string
//! lengths), whatever the input: truncated reports, two interleaved, garbage.
#![no_main]

#[path = "../../observer-user/src/kernel/oom_report.rs"]
#[allow(dead_code)]
mod oom_report;

use oom_report::{OomReport, Parser, MAX_MEMBERS, MAX_PENDING, MAX_STR, MAX_TASKS};

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
});
