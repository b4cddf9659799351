//! The pipeline on a thread of its own, with a heartbeat, so that its failure
//! surfaces: whoever holds the [`PipelineTask`] can await [`PipelineTask::stopped`], and the
//! agent's health check fails when the reader died or stopped turning, as kubelet's PLEG health
//! fails after 3 minutes without a relist.
//!
//! Where the loop runs is [`ReaderThread`]: a thread of its own by default, so that the read and
//! the PLEG step never wait behind the async runtime's other work, real-time when asked
//! (`--realtime-priority`), so that they do not wait behind the node's workloads either
//! (BENCHMARKS.md, the detection benchmark, measures each).
use std::{
    os::{fd::AsFd, unix::net::UnixStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use tokio::sync::oneshot;

use super::{counters, KernelPipeline, PipelineError, PipelineStats, Turn};
use crate::kernel::{BootClock, KernelCounters, KernelError, KernelEvent, Probes};

/// How often the loop turns when the kernel has nothing to say: refreshes the clock and proves
/// the loop alive. Cheap enough for a near-zero idle CPU.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(5);

/// How soon the loop tries again to queue events the consumer's lock kept back.
const HAND_OVER_RETRY: Duration = Duration::from_millis(1);

/// Where the read → PLEG loop runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReaderThread {
    /// A thread of its own at normal priority.
    #[default]
    Dedicated,
    /// A thread of its own, SCHED_FIFO at this priority (1..=99) with SCHED_RESET_ON_FORK; at
    /// normal priority where the kernel refuses (said once: see [`crate::sched`]).
    Realtime(u8),
}

/// What the running pipeline publishes for health checks and metrics.
pub struct PipelineHealth {
    born: Instant,
    /// The loop runs on a real-time thread.
    realtime: AtomicBool,
    /// Milliseconds after `born` of the loop's last turn (a batch or a heartbeat).
    last_turn_ms: AtomicU64,
    ended: AtomicBool,
    stats: Mutex<PipelineStats>,
}

impl PipelineHealth {
    pub(crate) fn new(stats: PipelineStats) -> Self {
        Self {
            born: Instant::now(),
            realtime: AtomicBool::new(false),
            last_turn_ms: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            stats: Mutex::new(stats),
        }
    }

    fn turn(&self, stats: PipelineStats) {
        self.last_turn_ms
            .store(self.born.elapsed().as_millis() as u64, Ordering::Relaxed);
        // A scrape reading the stats never holds the loop: they are a turn older then.
        if let Some(mut s) = crate::sync::try_lock(&self.stats) {
            *s = stats;
        }
    }

    /// Time since the loop last turned.
    pub(crate) fn since_last_turn(&self) -> Duration {
        self.born.elapsed().saturating_sub(Duration::from_millis(
            self.last_turn_ms.load(Ordering::Relaxed),
        ))
    }

    /// The task ended (the reader failed, or the task panicked or was dropped).
    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> PipelineStats {
        *crate::sync::lock(&self.stats)
    }

    /// Holds the stats' lock (what a scrape or a health check takes) until the guard drops:
    /// tests show that the loop never waits for it.
    pub fn hold_stats(&self) -> impl Drop + '_ {
        crate::sync::lock(&self.stats)
    }

    /// The loop runs on a real-time (SCHED_FIFO) thread.
    pub fn realtime(&self) -> bool {
        self.realtime.load(Ordering::Relaxed)
    }
}

/// Marks the health as ended however the task stops, panics included.
struct EndOnDrop(Arc<PipelineHealth>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.ended.store(true, Ordering::Relaxed);
    }
}

/// A pipeline running on its own thread or task. Dropping it stops the loop (and detaches the
/// probes once nothing else holds them).
pub struct PipelineTask {
    run: Run,
    health: Arc<PipelineHealth>,
    probes: Arc<Mutex<Probes>>,
    clock: BootClock,
}

enum Run {
    Thread {
        /// Why the thread ended: its error, or its panic's message.
        ended: oneshot::Receiver<Result<KernelError, String>>,
        /// Dropped to stop the thread (its end of the pair then reads as hung up).
        stop: Option<UnixStream>,
        join: Option<std::thread::JoinHandle<()>>,
    },
    /// [`PipelineTask::stopped`] returned.
    Done,
}

impl KernelPipeline {
    /// Runs the pipeline until the reader fails, where `reader` says. `on_resync` is called after
    /// every walk that followed lost kernel records (the runtime should be relisted then).
    pub fn spawn(
        self,
        reader: ReaderThread,
        on_resync: impl Fn() + Send + 'static,
    ) -> Result<PipelineTask, PipelineError> {
        self.spawn_with_tap(reader, |_| {}, on_resync)
    }

    /// [`Self::spawn`], showing every kernel event to `tap` on the loop's thread before the PLEG
    /// handles it (the benchmarks time the read there).
    pub fn spawn_with_tap(
        mut self,
        reader: ReaderThread,
        mut tap: impl FnMut(&KernelEvent) + Send + 'static,
        on_resync: impl Fn() + Send + 'static,
    ) -> Result<PipelineTask, PipelineError> {
        let health = Arc::new(PipelineHealth::new(self.stats()));
        let probes = self.probes();
        let clock = self.clock();
        let guard = EndOnDrop(Arc::clone(&health));
        let run = match reader {
            ReaderThread::Dedicated | ReaderThread::Realtime(_) => {
                let (stop, stop_rx) = UnixStream::pair().map_err(KernelError::Io)?;
                let (tx, ended) = oneshot::channel();
                let join = std::thread::Builder::new()
                    .name("observer-kernel".into())
                    .spawn(move || {
                        let guard = guard;
                        if let ReaderThread::Realtime(priority) = reader {
                            let rt = crate::sched::realtime_or_say_once(
                                priority,
                                "the kernel reader thread",
                            );
                            guard.0.realtime.store(rt.is_realtime(), Ordering::Relaxed);
                        }
                        let run = std::panic::AssertUnwindSafe(|| {
                            self.run_thread(&stop_rx, &mut tap, &on_resync, &guard.0)
                        });
                        let why = match std::panic::catch_unwind(run) {
                            Ok(None) => return,
                            Ok(Some(e)) => Ok(e),
                            Err(panic) => Err(crate::runner::panic_message(panic)),
                        };
                        let _ = tx.send(why);
                    })
                    .map_err(KernelError::Io)?;
                Run::Thread {
                    ended,
                    stop: Some(stop),
                    join: Some(join),
                }
            }
        };
        Ok(PipelineTask {
            run,
            health,
            probes,
            clock,
        })
    }

    /// The loop on a thread of its own, waiting in poll(2): until `stop` reads as hung up
    /// (`None`), or the reader fails. The hook's descriptors are waited on in the same call
    /// ([`super::Hook::interest`]).
    fn run_thread(
        &mut self,
        stop: &UnixStream,
        tap: &mut impl FnMut(&KernelEvent),
        on_resync: &impl Fn(),
        health: &PipelineHealth,
    ) -> Option<KernelError> {
        let mut fds = Vec::new();
        loop {
            fds.clear();
            let mut timeout = match self.out.hook.as_mut().and_then(|h| h.interest(&mut fds)) {
                Some(due) => due
                    .saturating_duration_since(std::time::Instant::now())
                    .min(HEARTBEAT),
                None => HEARTBEAT,
            };
            if self.out.has_pending() {
                // The consumer held the queue's lock at the last turn.
                timeout = timeout.min(HAND_OVER_RETRY);
            }
            let turn = self.next_batch_blocking(timeout, Some(stop.as_fd()), &mut fds, &mut *tap);
            if let Some(h) = self.out.hook.as_mut() {
                h.ready(&fds);
            }
            if self.out.has_pending() {
                self.hand_over(false);
            }
            match turn {
                Ok(Turn::Batch(b)) if b.resynced => on_resync(),
                Ok(Turn::Batch(_) | Turn::Io) => {}
                Ok(Turn::Idle) => self.reader.refresh_clock(),
                Ok(Turn::Stopped) => return None,
                Err(e) => {
                    tracing::error!("kernel event stream failed: {e}");
                    return Some(e);
                }
            }
            health.turn(self.stats());
        }
    }
}

impl PipelineTask {
    pub fn health(&self) -> Arc<PipelineHealth> {
        Arc::clone(&self.health)
    }

    pub fn clock(&self) -> BootClock {
        self.clock.clone()
    }

    pub fn probes(&self) -> Arc<Mutex<Probes>> {
        Arc::clone(&self.probes)
    }

    /// The kernel's own counters. A failed read is an error, never 0.
    pub fn kernel_counters(&self) -> Result<KernelCounters, KernelError> {
        counters(&self.probes)
    }

    /// Resolves when the loop has stopped, with why. Pending forever once it has been returned.
    pub async fn stopped(&mut self) -> PipelineError {
        let why = match &mut self.run {
            Run::Done => return std::future::pending().await,
            Run::Thread { ended, .. } => match ended.await {
                Ok(Ok(e)) => PipelineError::Kernel(e),
                Ok(Err(panic)) => PipelineError::Panicked(panic),
                Err(_) => PipelineError::Panicked("the kernel reader thread ended".into()),
            },
        };
        self.run = Run::Done;
        why
    }
}

impl Drop for PipelineTask {
    fn drop(&mut self) {
        match &mut self.run {
            Run::Thread { stop, join, .. } => {
                // The thread sees its end of the pair hang up at once, whatever it waits for.
                drop(stop.take());
                if let Some(j) = join.take() {
                    let _ = j.join();
                }
            }
            Run::Done => {}
        }
    }
}
