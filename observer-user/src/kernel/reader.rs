//! Reads the ring buffer as an async stream of [`KernelEvent`]s: woken by epoll through tokio's
//! `AsyncFd`, never by a timer.
use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::SystemTime,
};

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

use super::{clock::BootClock, decode::decode, event::KernelEvent, loader::Stats, KernelError};

pub struct EventReader {
    ring: AsyncFd<RingBuf<MapData>>,
    stats: Arc<Stats>,
    clock: BootClock,
    drops_seen: u64,
    malformed: Arc<AtomicU64>,
}

impl EventReader {
    pub(super) fn new(ring: RingBuf<MapData>, stats: Arc<Stats>) -> Result<Self, KernelError> {
        let drops_seen = stats.read()?.ringbuf_drops;
        Ok(Self {
            // SAFETY: RingBuf owns the map fd and keeps it open until it is dropped with the AsyncFd.
            ring: unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
                .map_err(|e| KernelError::Io(e.into()))?,
            stats,
            clock: BootClock::new(),
            drops_seen,
            malformed: Arc::default(),
        })
    }

    /// The next event. When the kernel dropped records since the last call, a
    /// [`KernelEvent::Lost`] comes first. Malformed records are counted, logged once, and skipped.
    pub async fn next(&mut self) -> Result<KernelEvent, KernelError> {
        loop {
            if let Some(ev) = self.try_next() {
                return Ok(ev);
            }
            // Empty: check for drops before sleeping, so a loss is reported as soon as the
            // consumer has caught up with what did arrive.
            if let Some(lost) = self.check_drops()? {
                return Ok(lost);
            }
            let mut guard = self.ring.readable_mut().await.map_err(KernelError::Io)?;
            guard.clear_ready();
        }
    }

    /// The next event already in the ring buffer, without waiting.
    pub fn try_next(&mut self) -> Option<KernelEvent> {
        loop {
            let item = self.ring.get_mut().next()?;
            match decode(&item) {
                Ok(ev) => return Some(ev),
                Err(e) => {
                    if self.malformed.fetch_add(1, Ordering::Relaxed) == 0 {
                        tracing::error!("malformed ring-buffer record (logged once, counted): {e}");
                    }
                }
            }
        }
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
    pub fn wall_time(&self, ev: &KernelEvent) -> SystemTime {
        self.clock.to_system_time(ev.at())
    }

    /// The clock this reader maps kernel times with; clones share its refreshes.
    pub fn clock(&self) -> BootClock {
        self.clock.clone()
    }

    pub fn refresh_clock(&self) {
        self.clock.refresh();
    }

    /// Malformed records skipped so far.
    pub fn malformed(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }
}
