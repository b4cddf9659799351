//! Reads the ring buffer as a stream of [`KernelEvent`]s, woken by the kernel for the records
//! something waits on, and polling for the ones nothing waits on (observer-ebpf/src/wake.rs):
//! every [`QUIET_RECORD_DELAY`] while polls find records, backing off to [`QUIET_IDLE_DELAY`]
//! while they find none. Two ways to wait, one reader: [`EventReader::next`] on a tokio
//! runtime (epoll through `AsyncFd`), [`EventReader::next_blocking`] on a thread of its own
//! (poll(2)).
use std::{
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant, SystemTime},
};

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

use crate::model::BootClock;

use super::{
    decode::decode, event::KernelEvent, loader::Stats, KernelError, QUIET_IDLE_DELAY,
    QUIET_RECORD_DELAY,
};

pub struct EventReader {
    ring: RingBuf<MapData>,
    /// A duplicate of the ring's fd registered with the tokio runtime, made at the first
    /// [`Self::next`] and dropped (deregistered) at the first [`Self::next_blocking`], so that a
    /// reader on its own thread does not also wake the runtime's reactor.
    registered: Option<AsyncFd<OwnedFd>>,
    stats: Arc<Stats>,
    clock: BootClock,
    drops_seen: u64,
    malformed: Arc<AtomicU64>,
    /// How long the next wait for quiet records lasts: see [`QuietPoll`].
    quiet: QuietPoll,
    /// A record read ahead of its turn by [`kill_before_death`].
    ahead: Option<KernelEvent>,
}

/// The poll period for records that wake nobody. Each wake-up of an idle reader costs a poll and
/// a read of the drop counters, about 170 µs of CPU on a VM whose system calls are VM exits: at
/// 10 ms that was 1.7 % of a core on an idle node. So the period doubles after each poll that
/// found nothing, up to [`QUIET_IDLE_DELAY`], and is back at [`QUIET_RECORD_DELAY`] as soon as
/// a record is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QuietPoll(Duration);

impl Default for QuietPoll {
    fn default() -> Self {
        Self(QUIET_RECORD_DELAY)
    }
}

impl QuietPoll {
    pub(super) fn period(self) -> Duration {
        self.0
    }

    /// A record was read.
    pub(super) fn found(&mut self) {
        self.0 = QUIET_RECORD_DELAY;
    }

    /// A poll found nothing.
    pub(super) fn empty(&mut self) {
        self.0 = (self.0 * 2).min(QUIET_IDLE_DELAY);
    }
}

/// What [`EventReader::next_blocking`] returns.
#[derive(Debug)]
pub enum Wait {
    Event(KernelEvent),
    /// Nothing arrived within the timeout.
    Idle,
    /// One of the extra descriptors has what it waits for.
    Io,
    /// The stop descriptor became readable (or hung up).
    Stopped,
}

impl EventReader {
    pub(super) fn new(ring: RingBuf<MapData>, stats: Arc<Stats>) -> Result<Self, KernelError> {
        let drops_seen = stats.read()?.ringbuf_drops;
        Ok(Self {
            ring,
            registered: None,
            stats,
            clock: BootClock::new(),
            drops_seen,
            malformed: Arc::default(),
            quiet: QuietPoll::default(),
            ahead: None,
        })
    }

    /// The next event, on a tokio runtime. When the kernel dropped records since the last call, a
    /// [`KernelEvent::Lost`] comes first. Malformed records are counted, logged once, and skipped.
    /// Cancel-safe: records not returned stay in the ring buffer.
    pub async fn next(&mut self) -> Result<KernelEvent, KernelError> {
        let mut waited = false;
        loop {
            if let Some(ev) = self.ready()? {
                self.quiet.found();
                return Ok(ev);
            }
            if waited {
                self.quiet.empty();
            }
            waited = true;
            if self.registered.is_none() {
                let fd = self
                    .ring
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(KernelError::Io)?;
                // SAFETY: the OwnedFd is a valid descriptor owned by the AsyncFd, open until the
                // AsyncFd drops it, and always returns that same descriptor.
                let registered =
                    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
                        .map_err(|e| KernelError::Io(e.into()))?;
                self.registered = Some(registered);
            }
            let registered = self.registered.as_ref().expect("registered above");
            // Woken for the records something waits on; the others are read at the latest one
            // poll period after they were written.
            if let Ok(guard) =
                tokio::time::timeout(self.quiet.period(), registered.readable()).await
            {
                guard.map_err(KernelError::Io)?.clear_ready();
            }
        }
    }

    /// The next event, blocking the calling thread for at most `timeout` ([`Wait::Idle`] then),
    /// until `stop` is readable ([`Wait::Stopped`]), or until one of `extra` has what it waits
    /// for ([`Wait::Io`], its `revents` set). For a reader on a thread of its own.
    pub fn next_blocking(
        &mut self,
        timeout: Duration,
        stop: Option<BorrowedFd<'_>>,
        extra: &mut [libc::pollfd],
    ) -> Result<Wait, KernelError> {
        // From now on the tokio reactor need not hear of this ring.
        self.registered = None;
        let deadline = Instant::now() + timeout;
        let mut waited = false;
        loop {
            if let Some(ev) = self.ready()? {
                self.quiet.found();
                return Ok(Wait::Event(ev));
            }
            if waited {
                self.quiet.empty();
            }
            waited = true;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Wait::Idle);
            }
            // poll(2) is level-triggered: records written without a wake-up are seen at once
            // when the poll starts, and at the latest one poll period later otherwise.
            match poll(
                self.ring.as_fd(),
                stop,
                extra,
                left.min(self.quiet.period()),
            )
            .map_err(KernelError::Io)?
            {
                Polled::Stop => return Ok(Wait::Stopped),
                Polled::Extra => return Ok(Wait::Io),
                Polled::Ring => {}
            }
        }
    }

    /// The next record already in the ring buffer, or the news of lost ones, without waiting.
    fn ready(&mut self) -> Result<Option<KernelEvent>, KernelError> {
        if let Some(ev) = self.try_next() {
            return Ok(Some(ev));
        }
        // Empty: check for drops before sleeping, so a loss is reported as soon as the consumer
        // has caught up with what did arrive.
        self.check_drops()
    }

    /// The next event already in the ring buffer, without waiting.
    pub fn try_next(&mut self) -> Option<KernelEvent> {
        let (ring, malformed) = (&mut self.ring, &self.malformed);
        kill_before_death(&mut self.ahead, || loop {
            let item = ring.next()?;
            match decode(&item) {
                Ok(ev) => return Some(ev),
                Err(e) => {
                    if malformed.fetch_add(1, Ordering::Relaxed) == 0 {
                        tracing::error!("malformed ring-buffer record (logged once, counted): {e}");
                    }
                }
            }
        })
    }

    fn check_drops(&mut self) -> Result<Option<KernelEvent>, KernelError> {
        let drops = self.stats.read()?.ringbuf_drops;
        if drops <= self.drops_seen {
            return Ok(None);
        }
        let records = drops - self.drops_seen;
        self.drops_seen = drops;
        tracing::warn!(
            records,
            "ring buffer overflowed: kernel events lost, resync needed"
        );
        Ok(Some(KernelEvent::Lost {
            at: BootClock::now(),
            records,
        }))
    }

    /// Wall-clock time of a kernel timestamp. The clock offset is refreshed by [`Self::refresh_clock`].
    pub(crate) fn wall_time(&self, ev: &KernelEvent) -> SystemTime {
        self.clock.to_system_time(ev.at())
    }

    /// Maps kernel times with `clock` (a clone shared with the agent's other parts, which see
    /// this reader's refreshes).
    pub(crate) fn with_clock(mut self, clock: BootClock) -> Self {
        self.clock = clock;
        self.clock.refresh();
        self
    }

    /// The clock this reader maps kernel times with; clones share its refreshes.
    pub fn clock(&self) -> BootClock {
        self.clock.clone()
    }

    pub(crate) fn refresh_clock(&self) {
        self.clock.refresh();
    }

    /// Malformed records skipped so far.
    pub fn malformed(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }
}

/// The ring buffer's descriptor: readable when records wait, and notified when the kernel wakes
/// the reader (for tests that tell a wake-up from a record written without one).
impl AsFd for EventReader {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ring.as_fd()
    }
}

/// Waits until `ring` is readable, `stop` is readable or hung up (true), or `timeout`.
/// What [`poll`] found.
enum Polled {
    /// The ring buffer is readable, or the wait ended.
    Ring,
    Stop,
    Extra,
}

fn poll(
    ring: BorrowedFd<'_>,
    stop: Option<BorrowedFd<'_>>,
    extra: &mut [libc::pollfd],
    timeout: Duration,
) -> io::Result<Polled> {
    let mut fds = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; 2 + MAX_EXTRA];
    fds[0] = libc::pollfd {
        fd: ring.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    fds[1] = libc::pollfd {
        // poll(2) skips a negative fd.
        fd: stop.map_or(-1, |s| s.as_raw_fd()),
        events: libc::POLLIN,
        revents: 0,
    };
    let n_extra = extra.len().min(MAX_EXTRA);
    fds[2..2 + n_extra].copy_from_slice(&extra[..n_extra]);
    let fds = &mut fds[..2 + n_extra];
    // Whole milliseconds, rounded up so that a short wait is not a busy loop.
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: `fds` is a valid array of pollfd for the duration of the call, and its length is
    // the count passed; the caller keeps every descriptor open for at least that long.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(Polled::Ring)
        } else {
            Err(e)
        };
    }
    for (to, from) in extra.iter_mut().zip(&fds[2..]) {
        to.revents = from.revents;
    }
    // Records first: a death waits for no answer's reading.
    Ok(if fds[1].revents != 0 {
        Polled::Stop
    } else if fds[0].revents == 0 && fds[2..].iter().any(|f| f.revents != 0) {
        Polled::Extra
    } else {
        Polled::Ring
    })
}

/// The next event, `ahead` first. The kernel sends an OOM victim its SIGKILL before it marks it,
/// so a victim that exits at once has its exit in the ring before its kill. A SIGKILLed exit whose
/// kill is already the next record is handed out after it, so the death is read knowing its
/// cause; one whose kill is not there yet is not waited for (the kill corrects it downstream).
fn kill_before_death(
    ahead: &mut Option<KernelEvent>,
    mut pull: impl FnMut() -> Option<KernelEvent>,
) -> Option<KernelEvent> {
    if let Some(ev) = ahead.take() {
        return Some(ev);
    }
    let ev = pull()?;
    let KernelEvent::Exit(exit) = &ev else {
        return Some(ev);
    };
    if !exit.status.sigkilled() {
        return Some(ev);
    }
    let Some(next) = pull() else {
        return Some(ev);
    };
    if matches!(&next, KernelEvent::OomKill(o) if o.victim.tgid == exit.task.tgid) {
        *ahead = Some(ev);
        return Some(next);
    }
    *ahead = Some(next);
    Some(ev)
}

/// Extra descriptors one wait takes at most (the fast path's connections).
const MAX_EXTRA: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::{BootNs, Comm, Exit, OomKill, OomMemory, Task, WaitStatus};

    fn task(pid: u32) -> Task {
        Task {
            pid,
            tgid: pid,
            ppid: 1,
            ns_pid: 1,
            ns_level: 1,
            comm: Comm::from("app"),
            cgroup_id: 7,
        }
    }

    fn exit(pid: u32, status: WaitStatus) -> KernelEvent {
        KernelEvent::Exit(Exit {
            at: BootNs(2),
            task: task(pid),
            status,
            group_dead: true,
        })
    }

    fn kill(pid: u32) -> KernelEvent {
        KernelEvent::OomKill(OomKill {
            at: BootNs(3),
            marked_at: BootNs(3),
            victim: task(pid),
            victim_comm: Comm::from("app"),
            memory: OomMemory::default(),
            oom_score_adj: None,
            trigger_pid: 9,
            trigger_tgid: 9,
            trigger_cgroup_id: 7,
        })
    }

    fn read_all(records: Vec<KernelEvent>) -> Vec<KernelEvent> {
        let mut ring = records.into_iter();
        let mut ahead = None;
        std::iter::from_fn(|| kill_before_death(&mut ahead, || ring.next())).collect()
    }

    #[test]
    fn a_victims_kill_already_behind_its_exit_is_read_first() {
        let killed = WaitStatus::signaled(9, false);
        assert_eq!(
            read_all(vec![exit(5, killed), kill(5), exit(6, killed)]),
            [kill(5), exit(5, killed), exit(6, killed)]
        );
        // Another process's kill, an exit that was no SIGKILL, or a kill not yet written: as read.
        for records in [
            vec![exit(5, killed), kill(6)],
            vec![exit(5, WaitStatus::exited(0)), kill(5)],
            vec![kill(6), exit(5, killed)],
            vec![exit(5, killed)],
        ] {
            assert_eq!(read_all(records.clone()), records);
        }
    }

    #[test]
    fn the_quiet_poll_backs_off_while_idle_and_returns_with_a_record() {
        let mut q = QuietPoll::default();
        assert_eq!(q.period(), QUIET_RECORD_DELAY);
        let mut periods = vec![q.period()];
        for _ in 0..10 {
            q.empty();
            periods.push(q.period());
        }
        assert_eq!(periods[1], QUIET_RECORD_DELAY * 2);
        assert!(periods.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(q.period(), QUIET_IDLE_DELAY, "{periods:?}");
        // An idle second costs a handful of wake-ups, not a hundred.
        let mut q = QuietPoll::default();
        let (mut spent, mut wakeups) = (Duration::ZERO, 0);
        while spent < Duration::from_secs(10) {
            spent += q.period();
            wakeups += 1;
            q.empty();
        }
        assert!(wakeups < 20, "{wakeups} wake-ups in 10 s");
        q.found();
        assert_eq!(q.period(), QUIET_RECORD_DELAY);
    }
}
