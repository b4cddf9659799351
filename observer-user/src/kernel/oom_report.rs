//! The OOM killer's whole report, parsed from the kernel log's records as they come.
//!
//! For each kill the kernel logs, from the allocating task and under the OOM lock (so one report
//! at a time, mm/oom_kill.c `dump_header`):
//!
//! ```text
//! <comm> invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0   (the trigger)
//! CPU: 0 UID: 0 PID: 12591 Comm: python3 Not tainted ...                           (its pid)
//! ... the stack, or Mem-Info and per-node figures for a global OOM ...
//! memory: usage 32768kB, limit 32768kB, failcnt 140                 (memcg: each counter)
//! Memory cgroup stats for /kubepods/burstable/pod<uid>/<id>:         (memcg: the breakdown)
//! anon 33087488 ...                                                  (v2; v1: cache, rss, ...)
//! Tasks state (memory values in pages):                              (vm.oom_dump_tasks=1)
//! [  pid  ]   uid  tgid total_vm      rss rss_anon rss_file rss_shmem pgtables_bytes ... name
//! [  12591]     0 12591    10566     9799     8128     1671         0   126976 ... python3
//! oom-kill:constraint=CONSTRAINT_MEMCG,...,oom_memcg=...,task_memcg=...,task=...,pid=...,uid=0
//! Memory cgroup out of memory: Killed process 12591 (python3) total-vm:42264kB, anon-rss:...
//! Tasks in <cgroup> are going to be killed due to memory.oom.group set          (group kill)
//! Memory cgroup out of memory: Killed process ... (one per other member)
//! ```
//!
//! [`Parser`] is a state machine over those records. It holds at most [`MAX_PENDING`] reports
//! under way, keyed by the printk caller where the kernel records it (`caller=T<pid>`,
//! CONFIG_PRINTK_CALLER), else the newest one; each report keeps at most [`MAX_TASKS`] tasks
//! (the largest), [`MAX_MEMBERS`] group members and strings of at most [`MAX_STR`] bytes. A
//! report cut short (the ring overwrote its start, the log ended, a second kill's report began)
//! is still given out, saying what it lacks.
use std::sync::Arc;

use serde::Serialize;

/// Reports under way at once (two kills whose records interleave).
pub const MAX_PENDING: usize = 2;
/// Tasks kept per report: the largest by rss (the report's task count says how many there were).
pub const MAX_TASKS: usize = 8;
/// Group kill members kept per report.
pub const MAX_MEMBERS: usize = 32;
/// Longest string kept from a record (a cgroup path, a comm).
pub const MAX_STR: usize = 512;
/// A report with its victim stays open this long (the log's microseconds) for group members.
const GROUP_WINDOW_US: u64 = 1_000_000;

/// What the OOM killer was constrained by (`oom-kill:constraint=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Constraint {
    /// A memory cgroup's limit (`CONSTRAINT_MEMCG`).
    Memcg,
    /// The node's memory: no cgroup limit (`CONSTRAINT_NONE`, a global OOM).
    None,
    /// A cpuset's or a mempolicy's nodes (`CONSTRAINT_CPUSET`, `CONSTRAINT_MEMORY_POLICY`).
    Nodes,
}

/// The task whose allocation invoked the OOM killer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Trigger {
    pub comm: String,
    /// From the `CPU: ... PID: <pid> Comm:` line after the header.
    pub pid: Option<u32>,
    pub gfp_mask: String,
    pub order: Option<u32>,
    pub oom_score_adj: Option<i16>,
    /// The basename of the trigger's cpuset cgroup (`cpuset=` of the `oom-kill:` line): its
    /// container's id where kubelet's layout puts cpuset on the container's cgroup.
    pub cpuset: String,
}

/// A page counter of the OOM-ing cgroup (`memory`, `memory+swap`, `swap`, `kmem`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Counter {
    pub name: String,
    pub usage_kb: u64,
    pub limit_kb: u64,
    pub failcnt: u64,
}

/// What filled the OOM-ing cgroup, in bytes (`Memory cgroup stats for`): cgroup v2's
/// `memory.stat` keys, and v1's mapped onto them (`rss` → anon, `cache` → file).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    pub anon: Option<u64>,
    pub file: Option<u64>,
    pub kernel: Option<u64>,
    pub kernel_stack: Option<u64>,
    pub pagetables: Option<u64>,
    pub sock: Option<u64>,
    pub shmem: Option<u64>,
    pub slab: Option<u64>,
    pub percpu: Option<u64>,
    /// The figures came in v1's names (Linux 6.1 logs v2's names even on a v1 hierarchy).
    pub v1: bool,
}

impl Breakdown {
    /// Takes one `key value` stat line; false when it is not one.
    fn take(&mut self, line: &str) -> bool {
        let Some((k, v)) = line.trim().split_once(' ') else {
            return false;
        };
        let Ok(v) = v.trim().parse::<u64>() else {
            return false;
        };
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
            return false;
        }
        let slot = match k {
            "anon" => &mut self.anon,
            "file" => &mut self.file,
            "kernel" => &mut self.kernel,
            "kernel_stack" => &mut self.kernel_stack,
            "pagetables" => &mut self.pagetables,
            "sock" => &mut self.sock,
            "shmem" => &mut self.shmem,
            "slab" => &mut self.slab,
            "percpu" => &mut self.percpu,
            // v1's names for the cgroup's own pages (the `total_` ones include descendants).
            "rss" | "total_rss" => {
                self.v1 = true;
                &mut self.anon
            }
            "cache" | "total_cache" => {
                self.v1 = true;
                &mut self.file
            }
            "total_shmem" => &mut self.shmem,
            _ => return true,
        };
        // v1 logs the cgroup's own figure, then the hierarchy's `total_`: the latter wins.
        *slot = Some(v);
        true
    }

    /// The named parts, largest first, without the ones contained in another (`kernel` holds
    /// the stack, page tables, slab and percpu; `file` is given without shmem, which it holds).
    pub fn parts(&self) -> Vec<(&'static str, u64)> {
        // Both v2's `file` and v1's cache count shmem (tmpfs) pages: told apart here.
        let file = match (self.file, self.shmem) {
            (Some(f), Some(s)) => Some(f.saturating_sub(s)),
            (f, _) => f,
        };
        let mut p: Vec<(&'static str, u64)> = [
            ("anon", self.anon),
            ("file", file),
            ("kernel", self.kernel),
            ("shmem", self.shmem),
            ("sock", self.sock),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect();
        if self.kernel.is_none() {
            let k = [self.kernel_stack, self.pagetables, self.slab, self.percpu]
                .into_iter()
                .flatten()
                .sum::<u64>();
            if k > 0 {
                p.push(("kernel", k));
            }
        }
        p.sort_by_key(|b| std::cmp::Reverse(b.1));
        p
    }
}

/// One line of the task dump (figures in pages, as the kernel prints them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Task {
    pub pid: u32,
    pub tgid: u32,
    pub uid: u32,
    pub total_vm_pages: u64,
    pub rss_pages: u64,
    /// Linux 6.1's Debian build and later print the split; older kernels do not.
    pub rss_anon_pages: Option<u64>,
    pub rss_file_pages: Option<u64>,
    pub rss_shmem_pages: Option<u64>,
    pub oom_score_adj: i16,
    pub name: String,
}

/// A process killed: the victim, or another member of a group kill (`Killed process`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Killed {
    pub pid: u32,
    pub comm: String,
    pub total_vm_kb: Option<u64>,
    pub anon_rss_kb: Option<u64>,
    pub file_rss_kb: Option<u64>,
    pub shmem_rss_kb: Option<u64>,
    pub oom_score_adj: Option<i16>,
}

/// One kill's report, as much of it as the log held.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OomReport {
    /// The log's microseconds since boot of the report's first record.
    pub at_us: u64,
    /// The first record's sequence number (a report is its kill's key in the log).
    pub seq: u64,
    /// The log's time of the kill itself (the `oom-kill:` line, else the victim's line).
    pub kill_at_us: u64,
    pub trigger: Option<Trigger>,
    pub constraint: Option<Constraint>,
    /// The cgroup whose limit was hit (`oom_memcg`; empty on a global OOM) and the victim's.
    pub oom_memcg: String,
    pub task_memcg: String,
    pub counters: Vec<Counter>,
    /// The cgroup the breakdown is of (the OOM-ing one).
    pub stats_cgroup: String,
    pub breakdown: Option<Breakdown>,
    /// The task dump was logged (`vm.oom_dump_tasks=1`, the default).
    pub tasks_listed: bool,
    /// The largest tasks of the dump (at most [`MAX_TASKS`]), largest rss first.
    pub tasks: Vec<Task>,
    /// How many tasks the dump listed.
    pub task_count: u32,
    pub victim: Option<Killed>,
    /// `memory.oom.group`: the cgroup all of whose processes were killed, and the others killed.
    pub group_cgroup: Option<String>,
    pub members: Vec<Killed>,
    /// The report's start (the `invoked oom-killer` line) was read: without it, the trigger and
    /// everything before the `oom-kill:` line are gone (the ring overwrote them).
    pub has_start: bool,
}

impl OomReport {
    /// The limit that was hit: the `memory` counter's (v1 and v2 alike).
    pub fn limit_kb(&self) -> Option<u64> {
        self.counters
            .iter()
            .find(|c| c.name == "memory")
            .map(|c| c.limit_kb)
    }

    pub fn counter(&self, name: &str) -> Option<&Counter> {
        self.counters.iter().find(|c| c.name == name)
    }

    /// Every pid the report says was killed.
    pub fn killed(&self) -> impl Iterator<Item = &Killed> {
        self.victim.iter().chain(&self.members)
    }

    fn complete(&self) -> bool {
        self.victim.is_some()
    }
}

fn cap(s: &str) -> String {
    let mut end = s.len().min(MAX_STR);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// One `/dev/kmsg` record: `prio,seq,usec,flags[,caller=T12];message`.
struct Record<'a> {
    seq: u64,
    at_us: u64,
    caller: Option<&'a str>,
    msg: &'a str,
}

fn record(rec: &str) -> Option<Record<'_>> {
    let (head, msg) = rec.split_once(';')?;
    let mut f = head.split(',');
    let _prio = f.next()?;
    let seq = f.next()?.parse().ok()?;
    let at_us = f.next()?.parse().ok()?;
    let caller = f.find_map(|x| x.strip_prefix("caller="));
    // Continuation lines (` KEY=value` dictionary entries) follow the first newline.
    let msg = msg.split('\n').next().unwrap_or("");
    Some(Record {
        seq,
        at_us,
        caller,
        msg,
    })
}

/// Where a report under way is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    Header,
    Stats,
    Tasks,
    Killing,
}

struct Pending {
    report: OomReport,
    caller: Option<String>,
    section: Section,
    /// Column names of the task dump's header line.
    columns: Vec<String>,
    /// The log's time of the victim's `Killed process` line.
    killed_at: Option<u64>,
}

impl Pending {
    fn new(seq: u64, at_us: u64, caller: Option<&str>) -> Self {
        Self {
            report: OomReport {
                at_us,
                seq,
                ..Default::default()
            },
            caller: caller.map(cap),
            section: Section::Header,
            columns: Vec::new(),
            killed_at: None,
        }
    }
}

/// The streaming parser: records in, finished reports out.
#[derive(Default)]
pub struct Parser {
    pending: Vec<Pending>,
    /// Reports given out, for [`Parser::pop`].
    done: Vec<OomReport>,
}

impl Parser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes one record. Finished reports wait in [`Parser::pop`].
    pub fn push(&mut self, rec: &str) {
        let Some(r) = record(rec) else { return };
        // Reports whose victim was logged a while ago are finished.
        let mut i = 0;
        while i < self.pending.len() {
            let p = &self.pending[i];
            if p.killed_at
                .is_some_and(|t| r.at_us.saturating_sub(t) > GROUP_WINDOW_US)
            {
                let p = self.pending.remove(i);
                self.done.push(p.report);
            } else {
                i += 1;
            }
        }
        let msg = r.msg;
        if let Some((comm, rest)) = msg.split_once(" invoked oom-killer: ") {
            // A new kill: a report of the same caller (or with no caller) is over.
            if let Some(i) = self
                .pending
                .iter()
                .position(|p| p.caller.as_deref() == r.caller)
            {
                let p = self.pending.remove(i);
                self.done.push(p.report);
            }
            if self.pending.len() == MAX_PENDING {
                let p = self.pending.remove(0);
                self.done.push(p.report);
            }
            let mut p = Pending::new(r.seq, r.at_us, r.caller);
            p.report.has_start = true;
            p.report.trigger = Some(trigger(comm, rest));
            self.pending.push(p);
            return;
        }
        if !is_report_line(msg) {
            return;
        }
        // The report this record belongs to: the caller's, else the newest.
        let idx = match r.caller {
            Some(c) => self
                .pending
                .iter()
                .rposition(|p| p.caller.as_deref() == Some(c)),
            None => self.pending.len().checked_sub(1),
        };
        let idx = match idx {
            Some(i) => i,
            // A report whose start the ring overwrote: kept from its `oom-kill:` line on.
            None if msg.starts_with("oom-kill:")
                || msg.starts_with("Memory cgroup stats for ")
                || msg.starts_with("Tasks state") =>
            {
                if self.pending.len() == MAX_PENDING {
                    let p = self.pending.remove(0);
                    self.done.push(p.report);
                }
                self.pending.push(Pending::new(r.seq, r.at_us, r.caller));
                self.pending.len() - 1
            }
            None => return,
        };
        let p = &mut self.pending[idx];
        if !take(p, msg, r.at_us) {
            // A line of a kill after the one under way (its start was lost): a report of its own.
            let p = self.pending.remove(idx);
            self.done.push(p.report);
            if msg.starts_with("oom-kill:") {
                let mut n = Pending::new(r.seq, r.at_us, r.caller);
                take(&mut n, msg, r.at_us);
                self.pending.push(n);
            }
        }
    }

    /// Reports under way (at most [`MAX_PENDING`]).
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Reports finished so far.
    pub fn pop(&mut self) -> Vec<OomReport> {
        std::mem::take(&mut self.done)
    }

    /// A report under way has its victim: it is finished once its group's members had time to
    /// be logged ([`Parser::flush_killed`]).
    pub(crate) fn victim_logged(&self) -> bool {
        self.pending.iter().any(|p| p.report.complete())
    }

    /// Gives out the reports whose victim is logged (the log stayed quiet after it: group
    /// members are logged right after the victim, in the same kill).
    pub fn flush_killed(&mut self) -> Vec<OomReport> {
        let (killed, rest) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| p.report.complete());
        self.pending = rest;
        let mut out = self.pop();
        out.extend(killed.into_iter().map(|p: Pending| p.report));
        out
    }

    /// Ends the log: every report, finished or not.
    pub fn finish(mut self) -> Vec<OomReport> {
        let mut out = self.pop();
        out.extend(self.pending.into_iter().map(|p| p.report));
        out
    }
}

/// Parses a whole log at once.
pub(crate) fn parse_all<'a>(records: impl IntoIterator<Item = &'a str>) -> Vec<OomReport> {
    let mut p = Parser::new();
    for r in records {
        p.push(r);
    }
    p.finish()
}

/// Lines that belong to some report (everything else, other subsystems' messages, is skipped).
fn is_report_line(msg: &str) -> bool {
    msg.starts_with("CPU: ")
        || counter(msg).is_some()
        || msg.starts_with("Memory cgroup stats for ")
        || msg.starts_with("Tasks state (memory values in pages)")
        || msg.starts_with("[  pid  ]")
        || task_fields(msg).is_some()
        || msg.starts_with("oom-kill:")
        || msg.contains("Killed process ")
        || msg.starts_with("Tasks in ")
        // One stat a record, or (v2 before 6.2) all of them in one, escaped newlines between.
        || stat_line(msg.split("\\x0a").next().unwrap_or(""))
}

fn stat_line(msg: &str) -> bool {
    let mut it = msg.trim().splitn(2, ' ');
    matches!(
        (it.next(), it.next()),
        (Some(k), Some(v)) if !k.is_empty()
            && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            && v.trim().parse::<u64>().is_ok()
    )
}

/// `gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0`.
fn trigger(comm: &str, rest: &str) -> Trigger {
    let field = |k: &str| {
        rest.split(", ")
            .find_map(|kv| kv.trim().strip_prefix(k)?.strip_prefix('='))
            .unwrap_or("")
    };
    Trigger {
        comm: cap(comm),
        pid: None,
        gfp_mask: cap(field("gfp_mask")),
        order: field("order").parse().ok(),
        oom_score_adj: field("oom_score_adj").parse().ok(),
        cpuset: String::new(),
    }
}

/// `memory: usage 32768kB, limit 32768kB, failcnt 140`.
fn counter(msg: &str) -> Option<Counter> {
    let (name, rest) = msg.split_once(": usage ")?;
    if name.is_empty() || name.len() > 16 || name.contains(' ') {
        return None;
    }
    let (usage, rest) = rest.split_once("kB, limit ")?;
    let (limit, failcnt) = rest.split_once("kB, failcnt ")?;
    Some(Counter {
        name: name.to_string(),
        usage_kb: usage.trim().parse().ok()?,
        limit_kb: limit.trim().parse().ok()?,
        failcnt: failcnt.trim().parse().ok()?,
    })
}

/// `[  12591]     0 12591    10566 ...  python3`: the bracketed pid and the rest's fields.
fn task_fields(msg: &str) -> Option<(u32, &str)> {
    let rest = msg.strip_prefix('[')?;
    let (pid, rest) = rest.split_once(']')?;
    Some((pid.trim().parse().ok()?, rest))
}

/// `Killed process 12591 (python3) total-vm:42264kB, anon-rss:32512kB, ...`.
fn killed(msg: &str) -> Option<Killed> {
    let rest = msg.split_once("Killed process ")?.1;
    let (pid, rest) = rest.split_once(' ')?;
    let pid = pid.parse().ok()?;
    let rest = rest.strip_prefix('(')?;
    // The comm may hold ") ": the figures follow the last one.
    let (comm, figures) = rest
        .rsplit_once(") ")
        .unwrap_or((rest.trim_end_matches(')'), ""));
    let kb = |k: &str| {
        figures
            .split(k)
            .nth(1)
            .and_then(|v| v.split("kB").next())
            .and_then(|v| v.trim().parse().ok())
    };
    Some(Killed {
        pid,
        comm: cap(comm),
        total_vm_kb: kb("total-vm:"),
        anon_rss_kb: kb("anon-rss:"),
        file_rss_kb: kb("file-rss:"),
        shmem_rss_kb: kb("shmem-rss:"),
        oom_score_adj: figures
            .split("oom_score_adj:")
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok()),
    })
}

/// Takes a line into a report; false when it cannot be part of it (a second `oom-kill:` line).
fn take(p: &mut Pending, msg: &str, at_us: u64) -> bool {
    let r = &mut p.report;
    if let Some(rest) = msg.strip_prefix("CPU: ") {
        if let (Some(t), None) = (r.trigger.as_mut(), p.killed_at) {
            if t.pid.is_none() {
                t.pid = rest
                    .split_once("PID: ")
                    .and_then(|(_, v)| v.split_whitespace().next()?.parse().ok());
            }
        }
    } else if let Some(c) = counter(msg) {
        if r.counters.len() < 4 && r.counters.iter().all(|o| o.name != c.name) {
            r.counters.push(c);
        }
    } else if let Some(cg) = msg
        .strip_prefix("Memory cgroup stats for ")
        .map(|c| c.trim_end().trim_end_matches(':'))
    {
        r.stats_cgroup = cap(cg);
        r.breakdown = Some(Breakdown::default());
        p.section = Section::Stats;
        // v2 before 6.2 logs the whole memory.stat as one record, its lines escaped.
    } else if msg.starts_with("Tasks state (memory values in pages)") {
        r.tasks_listed = true;
        p.section = Section::Tasks;
    } else if let Some(cols) = msg.strip_prefix("[  pid  ]") {
        p.columns = std::iter::once("pid")
            .chain(cols.split_whitespace())
            .take(16)
            .map(str::to_string)
            .collect();
    } else if let Some((pid, rest)) = task_fields(msg) {
        if p.section == Section::Tasks {
            if let Some(t) = task(pid, rest, &p.columns) {
                r.task_count = r.task_count.saturating_add(1);
                keep_largest(&mut r.tasks, t);
            }
        }
    } else if let Some(fields) = msg.strip_prefix("oom-kill:") {
        if !r.task_memcg.is_empty() || r.constraint.is_some() {
            return false;
        }
        let get = |k: &str| {
            fields
                .split(',')
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                .unwrap_or("")
        };
        r.constraint = match get("constraint") {
            "CONSTRAINT_MEMCG" => Some(Constraint::Memcg),
            "CONSTRAINT_NONE" => Some(Constraint::None),
            "CONSTRAINT_CPUSET" | "CONSTRAINT_MEMORY_POLICY" => Some(Constraint::Nodes),
            _ => None,
        };
        r.oom_memcg = cap(get("oom_memcg"));
        r.task_memcg = cap(get("task_memcg"));
        if let Some(t) = r.trigger.as_mut() {
            t.cpuset = cap(get("cpuset"));
        }
        let pid = get("pid").parse().unwrap_or(0);
        r.kill_at_us = at_us;
        p.section = Section::Killing;
        // The victim's name and pid, completed by its `Killed process` line.
        r.victim = Some(Killed {
            pid,
            comm: cap(get("task")),
            ..Default::default()
        })
        .filter(|_| pid != 0);
    } else if let Some(k) = killed(msg) {
        match (&mut r.victim, p.killed_at) {
            (Some(v), None) if v.pid == k.pid => {
                *v = Killed {
                    comm: if k.comm.is_empty() {
                        std::mem::take(&mut v.comm)
                    } else {
                        k.comm
                    },
                    ..k
                };
                p.killed_at = Some(at_us);
            }
            (None, None) => {
                // The `oom-kill:` line is gone: the victim from its own line.
                r.victim = Some(k);
                r.kill_at_us = at_us;
                p.killed_at = Some(at_us);
            }
            // The group's list names the victim again.
            (Some(v), Some(_)) if v.pid == k.pid && r.group_cgroup.is_some() => {}
            _ if r.group_cgroup.is_some() => {
                if r.members.len() < MAX_MEMBERS {
                    r.members.push(k);
                }
            }
            _ => return false,
        }
    } else if let Some(cg) = msg
        .strip_prefix("Tasks in ")
        .and_then(|m| m.strip_suffix(" are going to be killed due to memory.oom.group set"))
    {
        r.group_cgroup = Some(cap(cg));
    } else if p.section == Section::Stats {
        if let Some(b) = r.breakdown.as_mut() {
            // One record per line, or (v2 before 6.2) one record holding them all, its
            // newlines escaped by /dev/kmsg as `\x0a`.
            for line in msg.split("\\x0a") {
                b.take(line);
            }
        }
    }
    true
}

/// A task dump line, by the header's columns (`uid tgid total_vm rss [rss_anon rss_file
/// rss_shmem] pgtables_bytes swapents oom_score_adj name`).
fn task(pid: u32, rest: &str, columns: &[String]) -> Option<Task> {
    let default_cols = [
        "pid",
        "uid",
        "tgid",
        "total_vm",
        "rss",
        "pgtables_bytes",
        "swapents",
        "oom_score_adj",
        "name",
    ];
    let cols: Vec<&str> = if columns.len() > 2 {
        columns.iter().map(String::as_str).collect()
    } else {
        default_cols.to_vec()
    };
    // Every column but pid (in brackets) and name (the rest, which may hold spaces) is a number.
    let numbers = cols.len().checked_sub(2)?;
    let mut it = rest.trim_start();
    let mut vals = Vec::with_capacity(numbers);
    for _ in 0..numbers {
        let (v, r) = it.split_once(char::is_whitespace)?;
        vals.push(v);
        it = r.trim_start();
    }
    let get = |name: &str| -> Option<&str> {
        let i = cols.iter().skip(1).position(|c| *c == name)?;
        vals.get(i).copied()
    };
    let num = |name: &str| get(name).and_then(|v| v.parse::<u64>().ok());
    Some(Task {
        pid,
        tgid: num("tgid")? as u32,
        uid: num("uid").unwrap_or(0) as u32,
        total_vm_pages: num("total_vm")?,
        rss_pages: num("rss")?,
        rss_anon_pages: num("rss_anon"),
        rss_file_pages: num("rss_file"),
        rss_shmem_pages: num("rss_shmem"),
        oom_score_adj: get("oom_score_adj")?.parse().ok()?,
        name: cap(it.trim_end()),
    })
}

/// Keeps the [`MAX_TASKS`] largest tasks, largest first.
fn keep_largest(tasks: &mut Vec<Task>, t: Task) {
    let at = tasks.partition_point(|o| o.rss_pages >= t.rss_pages);
    if at < MAX_TASKS {
        tasks.insert(at, t);
        tasks.truncate(MAX_TASKS);
    }
}

/// A finished report, shared by every kill it names (a group kill's members).
pub(crate) type SharedReport = Arc<OomReport>;

// An explicit path: the fuzz target includes this file by its path, from another directory.
#[cfg(test)]
#[path = "oom_report/tests.rs"]
mod tests;
