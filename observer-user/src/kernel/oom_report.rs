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
//! Only the kernel's own records are believed. A record's priority is `(facility << 3) | level`
//! on both ways the log is read: /dev/kmsg's header (kernel/printk/printk.c
//! `info_print_ext_header`) and syslog(2)'s `<N>` prefix (`info_print_prefix`). The kernel's
//! printk uses facility 0 (LOG_KERN), and `devkmsg_write` gives every record a process writes to
//! /dev/kmsg LOG_USER (1) unless the writer names a facility other than 0: facility 0 proves
//! the kernel wrote it. Every other record is skipped, counted when it is shaped like a line of
//! a report ([`Ignored::not_kernel`]).
//!
//! The `oom-kill:` line carries names the node's users choose: the victim's comm (any 15 bytes),
//! the cgroup paths (any byte but `/` and newline in a name), the cpuset cgroup's name. Its
//! fields are split by the kernel's own format ([`KillLine::parse`]), never on every `,`: what
//! cannot be split one way only is refused and counted ([`Ignored::refused`]), and the kill is
//! then known as if the line were gone (by its `Killed process` line, and by the probes).
//!
//! [`Parser`] is a state machine over those records. It holds at most [`MAX_PENDING`] reports
//! under way, keyed by the printk caller where the kernel records it (`caller=T<pid>`,
//! CONFIG_PRINTK_CALLER), else the newest one; each report keeps at most [`MAX_TASKS`] tasks
//! (the largest), [`MAX_MEMBERS`] group members and strings of at most [`MAX_STR`] bytes. A
//! report cut short (the ring overwrote its start, the log ended, a second kill's report began)
//! is still given out, saying what it lacks.
use std::sync::Arc;

use serde::{Deserialize, Serialize};

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
/// The longest `oom-kill:` line taken: the kernel's records are at most 1 KiB of text (four
/// times that with /dev/kmsg's `\xNN` escapes); longer is no line of the kernel's.
const MAX_KILL_LINE: usize = 8 << 10;
/// `TASK_COMM_LEN - 1`: the longest comm the kernel prints.
const MAX_COMM: usize = 15;

/// What the OOM killer was constrained by (`oom-kill:constraint=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
// Read back by the kubectl plugin from a PodReport: a field written only when set is absent.
#[serde(default)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counter {
    pub name: String,
    pub usage_kb: u64,
    pub limit_kb: u64,
    pub failcnt: u64,
}

/// What filled the OOM-ing cgroup, in bytes (`Memory cgroup stats for`): cgroup v2's
/// `memory.stat` keys, and v1's mapped onto them (`rss` → anon, `cache` → file).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
// Read back by the kubectl plugin from a PodReport: a field written only when set is absent.
#[serde(default)]
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
    /// The anon LRU lists: every anon and shmem page charged, mapped or not.
    pub inactive_anon: Option<u64>,
    pub active_anon: Option<u64>,
    pub swapcached: Option<u64>,
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
            "inactive_anon" | "total_inactive_anon" => &mut self.inactive_anon,
            "active_anon" | "total_active_anon" => &mut self.active_anon,
            "swapcached" | "total_swapcached" => &mut self.swapcached,
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

    /// Anon pages still charged to the cgroup that no process maps: the memory of a process
    /// that exited or was killed, not yet freed (the anon LRU holds them; `anon`, v1's `rss`,
    /// counts mapped pages only). The memcg OOM killer can take a second victim in that window,
    /// its report then showing a cgroup at its limit with no process holding the memory.
    pub fn unmapped_anon(&self) -> Option<u64> {
        let lru = self.inactive_anon? + self.active_anon?;
        let held = self.anon? + self.shmem.unwrap_or(0) + self.swapcached.unwrap_or(0);
        Some(lru.saturating_sub(held))
    }
}

/// One line of the task dump (figures in pages, as the kernel prints them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
// Read back by the kubectl plugin from a PodReport: a field written only when set is absent.
#[serde(default)]
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
// Read back by the kubectl plugin from a PodReport: a field written only when set is absent.
#[serde(default)]
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
// Read back by the kubectl plugin from a PodReport: a field written only when set is absent.
#[serde(default)]
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
    /// The `oom-kill:` line could not be split one way only (names holding its separators) or
    /// did not agree with the rest of the report: refused, as if it were gone (no constraint, no
    /// cgroups).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
    /// The kernel printed only the victim's `Killed process` line: the log was read without a
    /// gap before it and no report of this kill started. `oom_kill_process` prints at most 10
    /// reports in 5 s (its own ratelimit, not tunable): in an OOM storm most kills have none.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub not_printed: bool,
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
    /// `prio >> 3`: 0 is the kernel's own (see the module's documentation).
    facility: u32,
    seq: u64,
    at_us: u64,
    caller: Option<&'a str>,
    msg: &'a str,
}

fn record(rec: &str) -> Option<Record<'_>> {
    let (head, msg) = rec.split_once(';')?;
    let mut f = head.split(',');
    let prio: u32 = f.next()?.parse().ok()?;
    let seq = f.next()?.parse().ok()?;
    let at_us = f.next()?.parse().ok()?;
    let caller = f.find_map(|x| x.strip_prefix("caller="));
    // Continuation lines (` KEY=value` dictionary entries) follow the first newline.
    let msg = msg.split('\n').next().unwrap_or("");
    Some(Record {
        facility: prio >> 3,
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
    /// The report's `oom-kill:` line was read (taken, refused or waiting).
    kill_line_seen: bool,
    /// An `oom-kill:` line (its fields) that more than one split fits: it waits for the
    /// victim's `Killed process` line, whose comm may tell them apart.
    kill_line_waiting: Option<String>,
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
            kill_line_seen: false,
            kill_line_waiting: None,
        }
    }
}

/// Records the parser did not believe, by why.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ignored {
    /// Records not from the kernel (facility other than 0) shaped like a line of a report:
    /// written to /dev/kmsg by a process.
    pub not_kernel: u64,
    /// `oom-kill:` lines refused: more than one split fits, or none agrees with the report.
    pub refused: u64,
}

impl Ignored {
    pub fn add(&mut self, o: &Ignored) {
        self.not_kernel += o.not_kernel;
        self.refused += o.refused;
    }
}

/// The streaming parser: records in, finished reports out.
#[derive(Default)]
pub struct Parser {
    pending: Vec<Pending>,
    /// Reports given out, for [`Parser::pop`].
    done: Vec<OomReport>,
    ignored: Ignored,
    /// Only records after this time (the log's microseconds) are counted in `ignored`: a log
    /// read again from its start counts each record once.
    count_after_us: Option<u64>,
    /// The last record's sequence number, and the time of the first record read since the
    /// last gap (a record lost to the ring, or the first read): a kill's report printed after
    /// it would have been seen whole.
    last_seq: Option<u64>,
    gapless_since_us: u64,
    /// The last report closed: its victim's pid, when it was killed, whether it was a group's.
    /// A victim's or a member's line after its report was given out (the reader drained the
    /// log between two lines of one kill) is that kill's, not a kill of its own.
    closed: Option<(u32, u64, bool)>,
}

impl Parser {
    pub fn new() -> Self {
        Self::default()
    }

    /// A parser that counts what it ignores only in records after `us` (the log's clock).
    pub fn counting_after(us: u64) -> Self {
        Self {
            count_after_us: Some(us),
            ..Self::default()
        }
    }

    /// What was not believed so far.
    pub fn ignored(&self) -> Ignored {
        self.ignored
    }

    fn counts(&self, at_us: u64) -> bool {
        self.count_after_us.is_none_or(|after| at_us > after)
    }

    /// Takes one record. Finished reports wait in [`Parser::pop`].
    pub fn push(&mut self, rec: &str) {
        let Some(r) = record(rec) else { return };
        if self
            .last_seq
            .is_none_or(|s| s.checked_add(1) != Some(r.seq))
        {
            self.gapless_since_us = r.at_us;
        }
        self.last_seq = Some(r.seq);
        if r.facility != 0 {
            // A process wrote it (see the module's documentation): never part of a report.
            let shaped = r.msg.contains(" invoked oom-killer: ") || is_report_line(r.msg);
            if shaped && self.counts(r.at_us) {
                self.ignored.not_kernel += 1;
            }
            return;
        }
        // Reports whose victim was logged a while ago are finished.
        let mut i = 0;
        while i < self.pending.len() {
            let p = &self.pending[i];
            if p.killed_at
                .is_some_and(|t| r.at_us.saturating_sub(t) > GROUP_WINDOW_US)
            {
                let p = self.pending.remove(i);
                self.close(p);
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
                self.close(p);
            }
            if self.pending.len() == MAX_PENDING {
                let p = self.pending.remove(0);
                self.close(p);
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
                || msg.starts_with("Tasks state")
                || killed(msg).is_some_and(|k| !self.closed_kills(&k, r.at_us)) =>
            {
                if self.pending.len() == MAX_PENDING {
                    let p = self.pending.remove(0);
                    self.close(p);
                }
                self.pending.push(Pending::new(r.seq, r.at_us, r.caller));
                self.pending.len() - 1
            }
            // The group line of the kill given out last: its members' lines follow.
            None if msg.starts_with("Tasks in ") => {
                if let Some((_, t, group)) = self.closed.as_mut() {
                    *group |= r.at_us.saturating_sub(*t) <= GROUP_WINDOW_US;
                }
                return;
            }
            None => return,
        };
        let counts = self.counts(r.at_us);
        let p = &mut self.pending[idx];
        let mut refused = 0;
        if !take(p, msg, r.at_us, &mut refused) {
            // A line of a kill after the one under way (its start was lost, or never printed):
            // a report of its own.
            let p = self.pending.remove(idx);
            self.close(p);
            let lone = killed(msg).is_some_and(|k| !self.closed_kills(&k, r.at_us));
            if msg.starts_with("oom-kill:") || lone {
                let mut n = Pending::new(r.seq, r.at_us, r.caller);
                take(&mut n, msg, r.at_us, &mut refused);
                self.pending.push(n);
            }
        }
        // A victim's line that opened its own report, read with no gap for longer than a
        // report takes to print: the kernel printed none.
        if let Some(p) = self.pending.last_mut() {
            let lone = p.report.seq == r.seq && !p.kill_line_seen && p.report.victim.is_some();
            if lone && r.at_us.saturating_sub(self.gapless_since_us) > GROUP_WINDOW_US {
                p.report.not_printed = true;
            }
        }
        if counts {
            self.ignored.refused += refused;
        }
    }

    /// Whether `k`'s line belongs to the report closed last (see [`Parser::closed`]).
    fn closed_kills(&self, k: &Killed, at_us: u64) -> bool {
        self.closed.is_some_and(|(pid, t, group)| {
            at_us.saturating_sub(t) <= GROUP_WINDOW_US && (pid == k.pid || group)
        })
    }

    /// A report is finished: an `oom-kill:` line still waiting for its victim's comm is
    /// refused.
    fn close(&mut self, mut p: Pending) {
        if let Some(v) = &p.report.victim {
            let at = p.killed_at.unwrap_or(p.report.kill_at_us);
            self.closed = Some((v.pid, at, p.report.group_cgroup.is_some()));
        }
        if p.kill_line_waiting.take().is_some() {
            refuse(&mut p.report);
            if self.counts(p.report.kill_at_us) {
                self.ignored.refused += 1;
            }
        }
        self.done.push(p.report);
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
        let (killed, rest): (Vec<Pending>, Vec<Pending>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| p.report.complete());
        self.pending = rest;
        for p in killed {
            self.close(p);
        }
        self.pop()
    }

    /// Ends the log: every report, finished or not.
    pub fn finish(self) -> Vec<OomReport> {
        self.finish_counted().0
    }

    /// [`Self::finish`], and what was not believed.
    pub fn finish_counted(mut self) -> (Vec<OomReport>, Ignored) {
        for p in std::mem::take(&mut self.pending) {
            self.close(p);
        }
        (self.done, self.ignored)
    }
}

/// Parses a whole log at once.
pub(crate) fn parse_all<'a>(records: impl IntoIterator<Item = &'a str>) -> Vec<OomReport> {
    parse_counted(records, Parser::new()).0
}

/// Parses a whole log with `p`, and says what it did not believe.
pub(crate) fn parse_counted<'a>(
    records: impl IntoIterator<Item = &'a str>,
    mut p: Parser,
) -> (Vec<OomReport>, Ignored) {
    for r in records {
        p.push(r);
    }
    p.finish_counted()
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

/// `Killed process 12591 (python3) total-vm:42264kB, anon-rss:32512kB, ...`
/// (mm/oom_kill.c `__oom_kill_process`). The comm may hold anything: it ends at the last
/// `) total-vm:`, which only the kernel's figures follow.
fn killed(msg: &str) -> Option<Killed> {
    let rest = msg.split_once("Killed process ")?.1;
    let (pid, rest) = rest.split_once(' ')?;
    let pid = pid.parse().ok()?;
    let rest = rest.strip_prefix('(')?;
    let (comm, figures) = match rest.rsplit_once(") total-vm:") {
        Some((comm, figures)) => (comm, figures),
        None => (
            rest.rsplit_once(") ")
                .map_or(rest.trim_end_matches(')'), |(c, _)| c),
            "",
        ),
    };
    let figures = format!("total-vm:{figures}");
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

/// The fields of an `oom-kill:` line, as mm/oom_kill.c `dump_oom_victim` writes them:
///
/// ```text
/// oom-kill:constraint=%s,nodemask=%*pbl            the constraint's name; a node list or (null)
///   ,cpuset=%s,mems_allowed=%*pbl                  cpuset_print_current_mems_allowed (with
///                                                  CONFIG_CPUSETS): the trigger's cpuset
///                                                  cgroup's name, "/" for the root
///   ,oom_memcg=<path> | ,global_oom                mem_cgroup_print_oom_context
///   ,task_memcg=<path>                             the victim's memory cgroup
///   ,task=%s,pid=%d,uid=%d                         the victim's comm, pid, uid
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillLine {
    pub constraint: String,
    pub nodemask: String,
    /// The cpuset part (with CONFIG_CPUSETS).
    pub cpuset: Option<CpusetPart>,
    /// `None`: `global_oom`.
    pub oom_memcg: Option<String>,
    pub task_memcg: String,
    pub comm: String,
    pub pid: u32,
    pub uid: i64,
}

/// `,cpuset=<name>,<key>=<node list>` of an `oom-kill:` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpusetPart {
    /// The trigger's cpuset cgroup's name (`/` for the root).
    pub name: String,
    /// `mems_allowed`.
    pub key: String,
    pub nodes: String,
}

/// Why an `oom-kill:` line was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not the kernel's format, or no split agrees with the rest of the report.
    Malformed,
    /// More than one split fits (names holding the line's separators): so many.
    Ambiguous(usize),
}

/// What the rest of a report says about its `oom-kill:` line.
#[derive(Clone, Copy, Debug, Default)]
pub struct CrossCheck<'a> {
    /// `Memory cgroup stats for <path>:`, logged for the cgroup that ran out (a memcg OOM).
    pub stats_cgroup: Option<&'a str>,
    /// The victim's comm from its `Killed process` line.
    pub comm: Option<&'a str>,
}

impl KillLine {
    /// Splits the fields after `oom-kill:` the one way the kernel's format allows, or refuses.
    ///
    /// How each ambiguity is resolved:
    /// - `pid` and `uid` are numbers at the line's end: read from the right.
    /// - Left of the cgroups, every field is fixed: the constraint's name (`[A-Z_]`), node lists
    ///   (`[0-9,-]` or `(null)`), and the cpuset cgroup's name, which is `/` or holds no `/`.
    ///   So the first `,oom_memcg=/` or `,task_memcg=/` is where the cgroups start, and the
    ///   cpuset's name ends where the last `,<key>=<node list>` before them begins.
    /// - Between the first cgroup and the pid, a path may hold `,task_memcg=/` and `,task=`,
    ///   and a comm may hold `,task=`: every split is tried. One is kept only if its comm is at
    ///   most 15 bytes (`TASK_COMM_LEN`), the cgroup that ran out holds the victim's (the victim
    ///   is chosen below it), the cgroup that ran out is the one `Memory cgroup stats for` named,
    ///   and the comm is the one the `Killed process` line names, where those lines were read.
    /// - Exactly one split left: taken. None: [`Refusal::Malformed`]. More:
    ///   [`Refusal::Ambiguous`]; the caller may try again once the `Killed process` line gives
    ///   the comm, and refuses the line if it still cannot tell.
    pub fn parse(fields: &str, check: CrossCheck<'_>) -> Result<Self, Refusal> {
        if fields.len() > MAX_KILL_LINE {
            return Err(Refusal::Malformed);
        }
        // pid and uid, from the right.
        let (rest, uid) = fields.rsplit_once(",uid=").ok_or(Refusal::Malformed)?;
        let uid: i64 = uid.parse().map_err(|_| Refusal::Malformed)?;
        let (rest, pid) = rest.rsplit_once(",pid=").ok_or(Refusal::Malformed)?;
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Refusal::Malformed);
        }
        let pid: u32 = pid.parse().map_err(|_| Refusal::Malformed)?;
        // Where the cgroups start.
        let first = |key: &'static str| rest.find(key).map(|i| (i, key));
        let (at, key) = match (first(",oom_memcg=/"), first(",task_memcg=/")) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).ok_or(Refusal::Malformed)?,
        };
        let (left, paths) = (&rest[..at], &rest[at + key.len() - 1..]);
        let (left, global) = match key {
            ",task_memcg=/" => (
                left.strip_suffix(",global_oom").ok_or(Refusal::Malformed)?,
                true,
            ),
            _ => (left, false),
        };
        let (constraint, nodemask, cpuset) = parse_left(left).ok_or(Refusal::Malformed)?;
        match (constraint.as_str(), global) {
            ("CONSTRAINT_MEMCG", true) => return Err(Refusal::Malformed),
            ("CONSTRAINT_NONE" | "CONSTRAINT_CPUSET" | "CONSTRAINT_MEMORY_POLICY", false) => {
                return Err(Refusal::Malformed)
            }
            _ => {}
        }
        let mut fits = Vec::new();
        for (head, comm) in splits(paths, ",task=") {
            // At most 4 bytes printed per byte of a comm (`\xNN`): longer is not one.
            let is_comm = comm.len() <= 4 * MAX_COMM && comm_len(comm) <= MAX_COMM;
            if !is_comm || check.comm.is_some_and(|c| c != comm) {
                continue;
            }
            if global {
                fits.push((None, head, comm));
                continue;
            }
            for (oom, task) in splits(head, ",task_memcg=") {
                let fits_stats = check.stats_cgroup.is_none_or(|s| cap(oom) == s);
                if task.starts_with('/') && holds(oom, task) && fits_stats {
                    fits.push((Some(oom), task, comm));
                }
            }
        }
        match fits.as_slice() {
            [(oom, task, comm)] => Ok(Self {
                constraint,
                nodemask,
                cpuset,
                oom_memcg: oom.map(str::to_string),
                task_memcg: task.to_string(),
                comm: comm.to_string(),
                pid,
                uid,
            }),
            [] => Err(Refusal::Malformed),
            more => Err(Refusal::Ambiguous(more.len())),
        }
    }

    /// The line as the kernel writes it (after `oom-kill:`).
    pub fn kernel_text(&self) -> String {
        let mut s = format!("constraint={},nodemask={}", self.constraint, self.nodemask);
        if let Some(c) = &self.cpuset {
            s.push_str(&format!(",cpuset={},{}={}", c.name, c.key, c.nodes));
        }
        match &self.oom_memcg {
            Some(p) => s.push_str(&format!(",oom_memcg={p}")),
            None => s.push_str(",global_oom"),
        }
        s.push_str(&format!(
            ",task_memcg={},task={},pid={},uid={}",
            self.task_memcg, self.comm, self.pid, self.uid
        ));
        s
    }

    fn constraint(&self) -> Option<Constraint> {
        match self.constraint.as_str() {
            "CONSTRAINT_MEMCG" => Some(Constraint::Memcg),
            "CONSTRAINT_NONE" => Some(Constraint::None),
            "CONSTRAINT_CPUSET" | "CONSTRAINT_MEMORY_POLICY" => Some(Constraint::Nodes),
            _ => None,
        }
    }
}

/// Every `(before, after)` split of `s` at an occurrence of `sep`.
fn splits<'a>(s: &'a str, sep: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
    s.match_indices(sep)
        .map(move |(i, _)| (&s[..i], &s[i + sep.len()..]))
}

/// `outer` is `inner` or one of its ancestors (both hierarchy paths).
fn holds(outer: &str, inner: &str) -> bool {
    let outer = outer.trim_end_matches('/');
    inner == outer
        || inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// A comm's length in the kernel's bytes: /dev/kmsg writes a byte it escapes as `\xNN` (a
/// backslash among them: the escape is unambiguous), and a byte that was not UTF-8 is read here
/// as U+FFFD.
fn comm_len(s: &str) -> usize {
    let b = s.as_bytes();
    let (mut i, mut n) = (0, 0);
    while i < b.len() {
        if b[i] == b'\\' && b.get(i + 1) == Some(&b'x') && b.len() >= i + 4 {
            i += 4;
        } else if s[i..].starts_with('\u{fffd}') {
            i += '\u{fffd}'.len_utf8();
        } else {
            i += s[i..].chars().next().map_or(1, char::len_utf8);
        }
        n += 1;
    }
    n
}

/// A node list as `%*pbl` prints it: `0`, `0-3,5`, or nothing.
fn is_node_list(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || b == b',' || b == b'-')
}

/// `constraint=C,nodemask=N[,cpuset=NAME,KEY=NODES]`: the constraint's name, the node mask and
/// the cpuset part. The name is `/` or holds no `/`; the node lists and the key are read from
/// the right, where nothing a user names can sit.
fn parse_left(left: &str) -> Option<(String, String, Option<CpusetPart>)> {
    let rest = left.strip_prefix("constraint=")?;
    let (constraint, rest) = rest.split_once(",nodemask=")?;
    if constraint.is_empty()
        || !constraint
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b == b'_')
    {
        return None;
    }
    let (nodemask, rest) = match rest.strip_prefix("(null)") {
        Some(r) => ("(null)", r),
        None => {
            let end = rest
                .find(",cpuset=")
                .filter(|&i| is_node_list(&rest[..i]))
                .unwrap_or(rest.len());
            (&rest[..end], &rest[end..])
        }
    };
    if !(nodemask == "(null)" || is_node_list(nodemask)) {
        return None;
    }
    if rest.is_empty() {
        return Some((constraint.into(), nodemask.into(), None));
    }
    let cs = rest.strip_prefix(",cpuset=")?;
    let (name_key, nodes) = cs.rsplit_once('=')?;
    let (name, key) = name_key.rsplit_once(',')?;
    let key_ok = !key.is_empty() && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    if !is_node_list(nodes) || !key_ok || (name != "/" && name.contains('/')) {
        return None;
    }
    let cpuset = CpusetPart {
        name: name.into(),
        key: key.into(),
        nodes: nodes.into(),
    };
    Some((constraint.into(), nodemask.into(), Some(cpuset)))
}

/// The `oom-kill:` line refused: as if the log had lost it.
fn refuse(r: &mut OomReport) {
    r.refused = true;
    r.constraint = None;
    r.oom_memcg.clear();
    r.task_memcg.clear();
    if let Some(t) = r.trigger.as_mut() {
        t.cpuset.clear();
    }
}

/// The victim's pid of an `oom-kill:` line, from the right (a number: never ambiguous).
fn kill_line_pid(fields: &str) -> Option<u32> {
    let (rest, _uid) = fields.rsplit_once(",uid=")?;
    let pid = rest.rsplit_once(",pid=")?.1;
    pid.bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| pid.parse().ok())
        .flatten()
}

/// Takes an `oom-kill:` line's fields into a report.
fn take_kill_line(r: &mut OomReport, l: KillLine) {
    r.constraint = l.constraint();
    r.oom_memcg = cap(l.oom_memcg.as_deref().unwrap_or(""));
    r.task_memcg = cap(&l.task_memcg);
    if let Some(t) = r.trigger.as_mut() {
        t.cpuset = cap(l.cpuset.as_ref().map_or("", |c| c.name.as_str()));
    }
    // The victim's name and pid, completed by its `Killed process` line.
    r.victim = Some(Killed {
        pid: l.pid,
        comm: cap(&l.comm),
        ..r.victim.take().unwrap_or_default()
    })
    .filter(|v| v.pid != 0);
}

/// Takes a line into a report; false when it cannot be part of it (a second `oom-kill:` line).
/// `refused` counts the `oom-kill:` lines refused.
fn take(p: &mut Pending, msg: &str, at_us: u64, refused: &mut u64) -> bool {
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
    } else if let Some(cg) = msg.strip_prefix("Memory cgroup stats for ") {
        // `pr_cont_cgroup_path` then `:`: exactly one colon is the kernel's (a name may end
        // in one too).
        let cg = cg.strip_suffix(':').unwrap_or(cg);
        // The first is the cgroup that ran out (older kernels went on with its descendants).
        if r.stats_cgroup.is_empty() {
            r.stats_cgroup = cap(cg);
        }
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
        if p.kill_line_seen {
            return false;
        }
        p.kill_line_seen = true;
        r.kill_at_us = at_us;
        p.section = Section::Killing;
        let stats = (!r.stats_cgroup.is_empty()).then_some(r.stats_cgroup.as_str());
        let check = CrossCheck {
            stats_cgroup: stats,
            comm: None,
        };
        match KillLine::parse(fields, check) {
            Ok(l) => take_kill_line(r, l),
            // The victim's `Killed process` line may tell the splits apart: it waits for it.
            Err(Refusal::Ambiguous(_)) => {
                p.kill_line_waiting = Some(fields.to_string());
                r.victim = kill_line_pid(fields)
                    .filter(|&pid| pid != 0)
                    .map(|pid| Killed {
                        pid,
                        ..Killed::default()
                    });
            }
            Err(Refusal::Malformed) => {
                refuse(r);
                *refused += 1;
                r.victim = kill_line_pid(fields)
                    .filter(|&pid| pid != 0)
                    .map(|pid| Killed {
                        pid,
                        ..Killed::default()
                    });
            }
        }
    } else if let Some(k) = killed(msg) {
        match (&mut r.victim, p.killed_at) {
            (Some(v), None) if v.pid == k.pid => {
                if let Some(fields) = p.kill_line_waiting.take() {
                    let stats = (!r.stats_cgroup.is_empty()).then_some(r.stats_cgroup.as_str());
                    let check = CrossCheck {
                        stats_cgroup: stats,
                        comm: Some(&k.comm),
                    };
                    match KillLine::parse(&fields, check) {
                        Ok(l) => take_kill_line(r, l),
                        Err(_) => {
                            refuse(r);
                            *refused += 1;
                        }
                    }
                }
                let Some(v) = r.victim.as_mut() else {
                    return true;
                };
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
                // The `oom-kill:` line is gone (or refused): the victim from its own line.
                r.victim = Some(k);
                if !p.kill_line_seen {
                    r.kill_at_us = at_us;
                }
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
        // mm/memcontrol.c `mem_cgroup_get_oom_group`: the victim's ancestor (or its own
        // cgroup) at or below the cgroup that ran out. A group that is not is no group of this
        // kill's.
        let fits = (r.task_memcg.is_empty() || holds(cg, &r.task_memcg))
            && (r.oom_memcg.is_empty() || holds(&r.oom_memcg, cg));
        if fits && !r.refused {
            r.group_cgroup = Some(cap(cg));
        }
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
