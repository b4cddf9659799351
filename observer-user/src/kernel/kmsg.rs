//! OOM kills from the kernel log (`/dev/kmsg`): the ones from before the agent started
//! ([`read_history`]), and, live ([`Follower`]), what the probes' tracepoint does not carry: the
//! memory cgroup whose limit was hit (a pod-level limit shows here) and, before Linux 6.8, the
//! victim's memory figures.
//!
//! The OOM killer logs two lines per kill: `oom-kill:...,task_memcg=<cgroup>,task=<comm>,pid=<pid>,...`
//! and `... Killed process <pid> (<comm>) total-vm:..kB, anon-rss:..kB, ...`. Together they name
//! the victim, its memory cgroup (so its container) and its memory. The log is a ring: old kills
//! may be gone, which is why it is evidence beside the probes, never their replacement.
//!
//! Only the kernel's records count, on both ways in ([`oom_report`] says how they are told
//! apart), and what is not believed is counted ([`LogStats`]). One difference remains between
//! them: /dev/kmsg escapes a newline in a record (kernel/printk/printk.c `msg_add_ext_text`), but
//! syslog(2) prints each line of a record with the record's own prefix (`record_print_text`), so
//! there a newline in a process name (at most 15 bytes, in a line the kernel wrote) starts a line
//! that looks like the kernel's. Such a line is held to the same format checks as every other.
use std::{
    collections::VecDeque,
    fs::File,
    io::{ErrorKind, Read},
    os::unix::fs::OpenOptionsExt,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, SystemTime},
};

use prometheus_client::encoding::DescriptorEncoder;

use super::oom_report::{self, Ignored, OomReport, Parser, SharedReport};

/// One OOM kill from the kernel log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedOomKill {
    /// Microseconds since boot (the log's clock, which does not count suspend).
    pub at_us: u64,
    /// `at_us` on the wall clock, mapped when the log was read.
    pub time: SystemTime,
    pub pid: u32,
    pub comm: String,
    /// The victim's memory cgroup and the cgroup whose limit was hit, relative to the memory
    /// hierarchy's root (the same path as on cgroup2 for kubelet's layouts).
    pub task_memcg: String,
    pub oom_memcg: String,
    pub total_vm_kb: Option<u64>,
    pub anon_rss_kb: Option<u64>,
    pub file_rss_kb: Option<u64>,
    pub shmem_rss_kb: Option<u64>,
    pub oom_score_adj: Option<i16>,
    /// The limit of `oom_memcg` in bytes, read right after the kill (live kills only).
    pub limit_bytes: Option<u64>,
    /// Killed with the rest of its cgroup (`memory.oom.group`, which kubelet sets on cgroup v2):
    /// every process of `task_memcg`, the container's init included, was killed.
    pub group: bool,
    /// The kill's whole report as the log held it ([`oom_report`]), shared by every process
    /// one group kill took. Dropped from older kills to bound memory (see `reconcile::history`).
    pub report: Option<SharedReport>,
}

impl Default for LoggedOomKill {
    fn default() -> Self {
        Self {
            at_us: 0,
            time: SystemTime::UNIX_EPOCH,
            pid: 0,
            comm: String::new(),
            task_memcg: String::new(),
            oom_memcg: String::new(),
            total_vm_kb: None,
            anon_rss_kb: None,
            file_rss_kb: None,
            shmem_rss_kb: None,
            oom_score_adj: None,
            limit_bytes: None,
            group: false,
            report: None,
        }
    }
}

/// What the kernel log still holds.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub kills: Vec<LoggedOomKill>,
    /// Wall time of the oldest record left: the log is a ring, so kills before this are gone.
    pub since: Option<SystemTime>,
    /// What was not believed (in the records after the time asked for).
    pub ignored: Ignored,
    /// The log's time of its newest record (microseconds since boot).
    pub until_us: Option<u64>,
}

/// What the agent's readers of the kernel log did not believe, for `/metrics`: shared by the
/// start-up read, the follower and the re-reads through syslog(2).
#[derive(Debug, Default)]
pub struct LogStats {
    not_kernel: AtomicU64,
    refused: AtomicU64,
}

impl LogStats {
    pub(crate) fn add(&self, i: &Ignored) {
        self.not_kernel.fetch_add(i.not_kernel, Ordering::Relaxed);
        self.refused.fetch_add(i.refused, Ordering::Relaxed);
    }

    pub fn get(&self) -> Ignored {
        Ignored {
            not_kernel: self.not_kernel.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn encode_metrics(&self, e: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let i = self.get();
        crate::exposition::counters(
            e,
            "kernel_log_records_ignored",
            "Kernel-log records not believed, by why: not_kernel (written by a process, not the \
             kernel, shaped like a line of an OOM report), refused (an oom-kill: line that \
             cannot be split one way only, or disagrees with its report)",
            "reason",
            [("not_kernel", i.not_kernel), ("refused", i.refused)],
        )
    }
}

/// The log's clock (CLOCK_MONOTONIC microseconds) on the wall clock.
fn mono_to_wall(at_us: u64) -> SystemTime {
    let mono = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32))
        .unwrap_or_default();
    SystemTime::now() - mono.saturating_sub(Duration::from_micros(at_us))
}

/// Where [`read_history_from`] found the kernel log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LogSource {
    DevKmsg,
    Syslog,
}

impl std::fmt::Display for LogSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogSource::DevKmsg => "/dev/kmsg",
            LogSource::Syslog => "syslog(2)",
        })
    }
}

/// Reads every OOM kill still in the kernel log, without blocking.
pub fn read_history() -> std::io::Result<History> {
    read_history_from(None).map(|(history, _)| history)
}

/// [`read_history`], and where it read. /dev/kmsg first; where it cannot be opened, syslog(2)
/// (the same ring, as text). A container that is not privileged cannot open /dev/kmsg even when
/// it is bind-mounted: the runtime's device cgroup allows only its default devices. syslog(2)
/// needs CAP_SYSLOG alone (with kernel.dmesg_restrict=1; runtime-default seccomp profiles allow
/// the call exactly when that capability is granted). What was not believed is counted in the
/// records after `count_after_us` (the log's clock; `None`: all), so that a log read again
/// counts each record once.
pub(crate) fn read_history_from(
    count_after_us: Option<u64>,
) -> std::io::Result<(History, LogSource)> {
    let (records, source) = match read_dev_kmsg() {
        Ok(records) => (records, LogSource::DevKmsg),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EPERM | libc::EACCES | libc::ENOENT)
            ) =>
        {
            let records = read_syslog().map_err(|s| {
                std::io::Error::new(s.kind(), format!("/dev/kmsg: {e}; syslog(2): {s}"))
            })?;
            (records, LogSource::Syslog)
        }
        Err(e) => return Err(e),
    };
    let usec = |r: &String| r.split(';').next()?.split(',').nth(2)?.parse::<u64>().ok();
    let since = records.first().and_then(usec).map(mono_to_wall);
    let until_us = records.last().and_then(usec);
    let parser = match count_after_us {
        Some(us) => Parser::counting_after(us),
        None => Parser::new(),
    };
    let (reports, ignored) = oom_report::parse_counted(records.iter().map(String::as_str), parser);
    let history = History {
        kills: reports.into_iter().flat_map(kills).collect(),
        since,
        ignored,
        until_us,
    };
    Ok((history, source))
}

fn read_dev_kmsg() -> std::io::Result<Vec<String>> {
    let mut f = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")?;
    let mut buf = vec![0u8; 8192];
    let mut records = Vec::new();
    loop {
        // Each read returns exactly one record.
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => records.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            // The ring overwrote records we had not read yet: carry on from the oldest left.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(records)
}

/// The whole ring through syslog(2) (SYSLOG_ACTION_READ_ALL, which does not consume it), each
/// line turned into a /dev/kmsg record for [`parse`].
fn read_syslog() -> std::io::Result<Vec<String>> {
    const SYSLOG_ACTION_READ_ALL: libc::c_int = 3;
    const SYSLOG_ACTION_SIZE_BUFFER: libc::c_int = 10;
    // SAFETY: SIZE_BUFFER takes no buffer.
    let size = unsafe { libc::klogctl(SYSLOG_ACTION_SIZE_BUFFER, std::ptr::null_mut(), 0) };
    if size < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut buf = vec![0u8; size as usize];
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
    let n = unsafe {
        libc::klogctl(
            SYSLOG_ACTION_READ_ALL,
            buf.as_mut_ptr().cast(),
            buf.len() as libc::c_int,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(String::from_utf8_lossy(&buf)
        .lines()
        .filter_map(syslog_line_to_record)
        .collect())
}

/// `<6>[ 3433.177016] text` → `6,0,3433177016,-;text`. Without printk timestamps the time is 0.
/// The `<N>` is `(facility << 3) | level`, as /dev/kmsg's first field (`info_print_prefix`).
fn syslog_line_to_record(line: &str) -> Option<String> {
    let (prio, rest) = line.strip_prefix('<')?.split_once('>')?;
    let (usec, msg) = match rest.strip_prefix('[').and_then(|r| r.split_once("] ")) {
        Some((stamp, msg)) => {
            let (sec, frac) = stamp.trim().split_once('.')?;
            let sec: u64 = sec.parse().ok()?;
            let frac: u64 = format!("{frac:0<6}").get(..6)?.parse().ok()?;
            (sec * 1_000_000 + frac, msg)
        }
        None => (0, rest),
    };
    Some(format!("{prio},0,{usec},-;{msg}"))
}

/// How long the log must stay quiet after a kill's victim before its report is given out. The
/// kernel logs a group kill's `Tasks in ... memory.oom.group set` line and its members' lines
/// after the victim's, one record at a time (about 100 µs apart, more when the killing task is
/// preempted): a reader that catches up in between must not take the victim for the whole kill.
pub(crate) const SETTLE: Duration = Duration::from_millis(250);

/// New OOM kills as the kernel logs them, from the moment it is opened. Woken by epoll.
pub(crate) struct Follower {
    fd: tokio::io::unix::AsyncFd<File>,
    buf: Vec<u8>,
    /// The reports under way (bounded: see [`oom_report::Parser`]).
    parser: oom_report::Parser,
    /// Kills of finished reports not handed out yet.
    ready: VecDeque<LoggedOomKill>,
    /// What the parser did not believe, as counted so far and where it is counted.
    counted: Ignored,
    stats: std::sync::Arc<LogStats>,
}

impl Follower {
    /// Opens the log at its end (only kills from now on); what it does not believe is counted
    /// in `stats`.
    pub(crate) fn open(stats: std::sync::Arc<LogStats>) -> std::io::Result<Self> {
        use std::{io::Seek, io::SeekFrom};
        let mut f = File::options()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")?;
        f.seek(SeekFrom::End(0))?;
        Self::from_records(f, stats)
    }

    /// Follows a non-blocking file whose every read returns one whole record, as /dev/kmsg's do
    /// (a `SOCK_SEQPACKET` socket in tests).
    pub(crate) fn from_records(f: File, stats: std::sync::Arc<LogStats>) -> std::io::Result<Self> {
        // SAFETY: the File owns the fd and keeps it open until it is dropped with the AsyncFd.
        let fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(f, tokio::io::Interest::READABLE)
        }?;
        Ok(Self {
            fd,
            buf: vec![0u8; 8192],
            parser: oom_report::Parser::new(),
            ready: VecDeque::new(),
            counted: Ignored::default(),
            stats,
        })
    }

    /// Hands what the parser newly ignored to the shared counters (fields apart: the log's
    /// fd is borrowed meanwhile).
    fn count(parser: &Parser, counted: &mut Ignored, stats: &LogStats) {
        let now = parser.ignored();
        stats.add(&Ignored {
            not_kernel: now.not_kernel - counted.not_kernel,
            refused: now.refused - counted.refused,
        });
        *counted = now;
    }

    /// The next complete kill. A report is finished when a later kill began, or when the log
    /// stayed quiet for [`SETTLE`] after its victim (a group kill's members come right after).
    pub(crate) async fn next(&mut self) -> std::io::Result<LoggedOomKill> {
        loop {
            if let Some(k) = self.ready.pop_front() {
                return Ok(k);
            }
            let mut guard = if self.parser.victim_logged() {
                match tokio::time::timeout(SETTLE, self.fd.readable_mut()).await {
                    Ok(guard) => guard?,
                    Err(_) => {
                        let done = self.parser.flush_killed();
                        Self::count(&self.parser, &mut self.counted, &self.stats);
                        self.ready.extend(done.into_iter().flat_map(kills));
                        continue;
                    }
                }
            } else {
                self.fd.readable_mut().await?
            };
            loop {
                match guard.get_inner_mut().read(&mut self.buf) {
                    // /dev/kmsg never ends; a record source that does has nothing more to give.
                    Ok(0) => {
                        return Err(std::io::Error::new(
                            ErrorKind::UnexpectedEof,
                            "the kernel log ended",
                        ))
                    }
                    Ok(n) => {
                        let rec = String::from_utf8_lossy(&self.buf[..n]);
                        self.parser.push(&rec);
                        let done = self.parser.pop();
                        Self::count(&self.parser, &mut self.counted, &self.stats);
                        self.ready.extend(done.into_iter().flat_map(kills));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        guard.clear_ready();
                        break;
                    }
                    // Records were overwritten before we read them: go on with the oldest left.
                    Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

/// The kills one report names: its victim, and with `memory.oom.group` every other member.
pub fn kills(r: OomReport) -> Vec<LoggedOomKill> {
    let Some(victim) = r.victim.clone() else {
        return Vec::new();
    };
    let group = r.group_cgroup.is_some();
    let at_us = r.kill_at_us;
    let time = mono_to_wall(at_us);
    let r = std::sync::Arc::new(r);
    std::iter::once((victim, r.task_memcg.clone()))
        .chain(r.members.iter().map(|m| {
            (
                m.clone(),
                r.group_cgroup
                    .clone()
                    .unwrap_or_else(|| r.task_memcg.clone()),
            )
        }))
        .filter(|(k, _)| k.pid != 0)
        .map(|(k, task_memcg)| LoggedOomKill {
            at_us,
            time,
            pid: k.pid,
            comm: k.comm,
            task_memcg,
            oom_memcg: r.oom_memcg.clone(),
            total_vm_kb: k.total_vm_kb,
            anon_rss_kb: k.anon_rss_kb,
            file_rss_kb: k.file_rss_kb,
            shmem_rss_kb: k.shmem_rss_kb,
            oom_score_adj: k.oom_score_adj,
            limit_bytes: r.limit_kb().map(|kb| kb * 1024),
            group,
            report: Some(r.clone()),
        })
        .collect()
}

/// Parses `/dev/kmsg` records (`prio,seq,usec,flags;message`) into kills, each with its report.
///
/// With `memory.oom.group`, the kernel logs the first victim with its `oom-kill:` line, then
/// `Tasks in <cgroup> are going to be killed due to memory.oom.group set`, then one `Killed
/// process` line per other member, with no `oom-kill:` line of their own: those are kills of that
/// cgroup too.
pub fn parse<'a>(records: impl IntoIterator<Item = &'a str>) -> Vec<LoggedOomKill> {
    oom_report::parse_all(records)
        .into_iter()
        .flat_map(kills)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record source like /dev/kmsg (one record a read, non-blocking, epoll-able) and its
    /// writing end.
    fn records() -> (Follower, std::os::unix::net::UnixDatagram) {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        let (r, w) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        // A SOCK_SEQPACKET socket sends each record whole; UnixDatagram's send is just send(2).
        let w = std::os::unix::net::UnixDatagram::from(w);
        w.set_nonblocking(false).unwrap();
        (
            Follower::from_records(File::from(r), std::sync::Arc::default()).unwrap(),
            w,
        )
    }

    /// The 6.12 guest's group kill, cut where a reader can catch up with the kernel: after the
    /// victim's line, before the group's. The follower waits for the log to settle, so the
    /// victim comes out as one of a group kill of three, not as a kill of its own.
    #[tokio::test(start_paused = true)]
    async fn a_group_kill_read_midway_is_one_kill_of_three() {
        let log = include_str!("testdata/6.12-debian-v2.kmsg");
        let lines: Vec<&str> = log.lines().collect();
        let victim = lines
            .iter()
            .position(|l| l.contains("Killed process 454 (dd)"))
            .unwrap();
        let start = lines[..victim]
            .iter()
            .rposition(|l| l.contains("invoked oom-killer"))
            .unwrap();
        let end = victim + 5;
        assert!(
            lines[end - 1].contains("Killed process 453"),
            "{}",
            lines[end - 1]
        );
        let (mut follower, w) = records();
        for l in &lines[start..=victim] {
            w.send(l.as_bytes()).unwrap();
        }
        let rest: Vec<String> = lines[victim + 1..end]
            .iter()
            .map(|l| l.to_string())
            .collect();
        let late = tokio::spawn(async move {
            // The killing task preempted between its victim and its group for less than the
            // settle time.
            tokio::time::sleep(SETTLE / 2).await;
            for l in &rest {
                w.send(l.as_bytes()).unwrap();
            }
            w
        });
        let first = follower.next().await.unwrap();
        assert_eq!((first.pid, first.group), (454, true), "{first:?}");
        let mut pids = vec![first.pid];
        for _ in 0..2 {
            let k = follower.next().await.unwrap();
            assert!(k.group, "{k:?}");
            pids.push(k.pid);
        }
        pids.sort();
        assert_eq!(pids, vec![452, 453, 454]);
        // A kill alone is given out once the log stayed quiet for the settle time.
        let w = late.await.unwrap();
        for l in &lines[start..=victim] {
            w.send(l.as_bytes()).unwrap();
        }
        let alone = tokio::time::timeout(SETTLE * 2, follower.next())
            .await
            .expect("given out after the settle time")
            .unwrap();
        assert_eq!((alone.pid, alone.group), (454, false));
        // The source's end is an error, not a spin.
        drop(w);
        assert!(follower.next().await.is_err());
    }

    const LOG: &[&str] = &[
        "4,4800,3433176551,-;head invoked oom-killer: gfp_mask=0x500cc2(GFP_HIGHUSER|__GFP_ACCOUNT), order=0, oom_score_adj=500",
        "6,4801,3433177016,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=ed0f,mems_allowed=0,oom_memcg=/kubepods/burstable/poda441d046-fdb3-435f-8d3e-c227ee893318/ed0f,task_memcg=/kubepods/burstable/poda441d046-fdb3-435f-8d3e-c227ee893318/ed0f,task=sh,pid=28078,uid=0",
        "3,4802,3433177070,-;Memory cgroup out of memory: Killed process 28078 (sh) total-vm:39136kB, anon-rss:32000kB, file-rss:1424kB, shmem-rss:0kB, UID:0 pgtables:108kB oom_score_adj:500",
        "6,4803,3433177100,-;something else",
        "3,4804,3500000000,-;Out of memory: Killed process 999 (java) total-vm:1kB, anon-rss:2kB, file-rss:3kB, shmem-rss:4kB, UID:0 pgtables:5kB oom_score_adj:0",
    ];

    #[test]
    fn pairs_the_two_lines_of_a_kill() {
        let kills = parse(LOG.iter().copied());
        assert_eq!(kills.len(), 2, "{kills:#?}");
        // The second is a global kill the kernel printed no report of.
        let lone = &kills[1];
        assert_eq!((lone.pid, lone.comm.as_str()), (999, "java"));
        assert!(lone.task_memcg.is_empty() && lone.report.as_ref().unwrap().not_printed);
        let k = &kills[0];
        assert_eq!((k.pid, k.comm.as_str(), k.at_us), (28078, "sh", 3433177016));
        assert!(
            k.task_memcg.ends_with("/ed0f") && k.task_memcg.starts_with("/kubepods/burstable/pod")
        );
        assert_eq!(
            (k.total_vm_kb, k.anon_rss_kb, k.file_rss_kb, k.shmem_rss_kb),
            (Some(39136), Some(32000), Some(1424), Some(0))
        );
        assert_eq!(k.oom_score_adj, Some(500));
    }

    /// cgroup v2 with memory.oom.group=1: the header names the first victim, the members follow.
    #[test]
    fn a_group_kill_logs_every_member() {
        let cg = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a_b.slice/cri-containerd-ed0f.scope";
        let log = [
            format!("6,10,100,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=x,mems_allowed=0,oom_memcg={cg},task_memcg={cg},task=hog,pid=12,uid=0"),
            "3,11,101,-;Memory cgroup out of memory: Killed process 12 (hog) total-vm:9kB, anon-rss:8kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1kB oom_score_adj:0".into(),
            format!("6,12,102,-;Tasks in {cg} are going to be killed due to memory.oom.group set"),
            "3,13,103,-;Memory cgroup out of memory: Killed process 10 (sh) total-vm:2kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1kB oom_score_adj:0".into(),
            "3,14,104,-;Memory cgroup out of memory: Killed process 11 (sleep) total-vm:2kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1kB oom_score_adj:0".into(),
            // A line without a header seconds later is no member: a kill of its own, whose
            // report the kernel did not print.
            "3,15,5000000,-;Out of memory: Killed process 99 (x) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1kB oom_score_adj:0".into(),
        ];
        let kills = parse(log.iter().map(String::as_str));
        let got: Vec<_> = kills
            .iter()
            .map(|k| (k.pid, k.comm.as_str(), k.group, k.task_memcg == cg))
            .collect();
        assert_eq!(
            got,
            [
                (12, "hog", true, true),
                (10, "sh", true, true),
                (11, "sleep", true, true),
                (99, "x", false, false)
            ]
        );
        assert!(kills[3].report.as_ref().unwrap().not_printed);
        assert_eq!(kills[1].anon_rss_kb, Some(1));
    }

    #[test]
    fn syslog_lines_become_records() {
        let lines = [
            "<6>[3433.177016] oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/kubepods/x,task=sh,pid=28078,uid=0",
            "<3>[ 3433.177070] Memory cgroup out of memory: Killed process 28078 (sh) total-vm:39136kB, anon-rss:32000kB, file-rss:1424kB, shmem-rss:0kB, UID:0 pgtables:108kB oom_score_adj:500",
            "<6>no timestamp",
            "not a syslog line",
        ];
        let records: Vec<String> = lines
            .iter()
            .filter_map(|l| syslog_line_to_record(l))
            .collect();
        assert_eq!(records.len(), 3);
        assert_eq!(records[2], "6,0,0,-;no timestamp");
        let kills = parse(records.iter().map(String::as_str));
        assert_eq!(kills.len(), 1, "{kills:?}");
        assert_eq!((kills[0].pid, kills[0].at_us), (28078, 3433177016));
        assert_eq!(kills[0].anon_rss_kb, Some(32000));
    }

    /// syslog(2)'s `<N>` is `(facility << 3) | level` too: a process's lines (LOG_USER, 1 << 3)
    /// are no kill, however they read.
    #[test]
    fn syslog_lines_a_process_wrote_are_no_kill() {
        let lines = [
            "<14>[3433.177016] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/kubepods/x,task_memcg=/kubepods/x,task=sh,pid=28078,uid=0",
            "<11>[3433.177070] Memory cgroup out of memory: Killed process 28078 (sh) total-vm:39136kB, anon-rss:32000kB, file-rss:1424kB, shmem-rss:0kB, UID:0 pgtables:108kB oom_score_adj:500",
        ];
        let records: Vec<String> = lines
            .iter()
            .filter_map(|l| syslog_line_to_record(l))
            .collect();
        let (reports, ignored) =
            oom_report::parse_counted(records.iter().map(String::as_str), Parser::new());
        assert!(reports.is_empty(), "{reports:?}");
        assert_eq!(ignored.not_kernel, 2);
        // The kernel's own (facility 0) are.
        let kernel: Vec<String> = lines
            .iter()
            .map(|l| l.replacen("<14>", "<6>", 1).replacen("<11>", "<3>", 1))
            .filter_map(|l| syslog_line_to_record(&l))
            .collect();
        assert_eq!(parse(kernel.iter().map(String::as_str)).len(), 1);
    }

    /// The follower hands out no kill a process wrote to the log, and counts it.
    #[tokio::test(start_paused = true)]
    async fn the_follower_counts_what_a_process_wrote() {
        let (mut follower, w) = records();
        let stats = std::sync::Arc::clone(&follower.stats);
        for l in &LOG[..3] {
            // LOG_USER: what /dev/kmsg makes of a process's write.
            let (prio, rest) = l.split_once(',').unwrap();
            let user = format!("{},{rest}", prio.parse::<u32>().unwrap() | 8);
            w.send(user.as_bytes()).unwrap();
        }
        for l in &LOG[..3] {
            w.send(l.as_bytes()).unwrap();
        }
        let k = follower.next().await.unwrap();
        assert_eq!((k.pid, k.comm.as_str()), (28078, "sh"));
        assert_eq!(stats.get().not_kernel, 3);
        drop(w);
        assert!(follower.next().await.is_err());
    }

    #[test]
    fn garbage_is_ignored() {
        assert!(parse([
            "",
            "no semicolon",
            "1,2,3,-;oom-kill:",
            "x;Killed process abc"
        ])
        .is_empty());
    }
}
