//! Time: the kernel's boot-time stamps mapped to the wall clock ([`BootClock`]), and the wall
//! clock itself behind [`Clock`], so that what decides by time (a transition's time, an epoch,
//! a back-off) can run on a fake clock in tests.
use std::{
    sync::{
        atomic::{AtomicI64, Ordering},
        Arc,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use std::sync::{Mutex, PoisonError};

use nix::time::{clock_gettime, ClockId};

/// Nanoseconds since boot (`CLOCK_BOOTTIME`), the kernel side's clock (`bpf_ktime_get_boot_ns`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BootNs(pub u64);

/// The wall clock, injected: what decides by wall time (a condition's transition time, the
/// manager's epoch, a kill's grace) reads it from here, so a test can set it.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> SystemTime;
}

/// The clock the parts of one agent share.
pub(crate) type SharedClock = Arc<dyn Clock>;

/// The real wall clock, shared.
pub fn system_clock() -> SharedClock {
    Arc::new(SystemClock)
}

/// The real wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A wall clock that moves only when told; clones share it. For tests, this crate's and the
/// suites' (an agent built with it stamps what it writes from it).
#[derive(Clone, Debug)]
pub struct FakeClock(Arc<Mutex<SystemTime>>);

impl FakeClock {
    pub fn at(t: SystemTime) -> Self {
        Self(Arc::new(Mutex::new(t)))
    }

    pub fn advance(&self, by: Duration) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) += by;
    }
}

impl Clock for FakeClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Maps boot-time stamps to wall-clock time. The offset is re-read on [`BootClock::refresh`] so a
/// long-running agent follows NTP steps; clones share the offset, so the pipeline's refreshes
/// reach every consumer (reconciler, status manager) that holds a clone.
#[derive(Clone, Debug)]
pub struct BootClock {
    /// Wall-clock nanoseconds since the epoch at boot (fits an i64 until 2262).
    boot_epoch_ns: Arc<AtomicI64>,
}

impl BootClock {
    pub fn new() -> Self {
        let c = Self {
            boot_epoch_ns: Arc::default(),
        };
        c.refresh();
        c
    }

    /// Re-reads the offset; cheap (three vDSO clock reads).
    pub(crate) fn refresh(&self) {
        let ns = |id| {
            clock_gettime(id)
                .map(|t| t.tv_sec() as i128 * 1_000_000_000 + t.tv_nsec() as i128)
                .unwrap_or(0)
        };
        // Bracket the boot-time read with two wall-clock reads and take the midpoint.
        let r1 = ns(ClockId::CLOCK_REALTIME);
        let b = ns(ClockId::CLOCK_BOOTTIME);
        let r2 = ns(ClockId::CLOCK_REALTIME);
        let offset = ((r1 + r2) / 2 - b).clamp(0, i64::MAX as i128) as i64;
        self.boot_epoch_ns.store(offset, Ordering::Relaxed);
    }

    pub fn now() -> BootNs {
        let t = clock_gettime(ClockId::CLOCK_BOOTTIME).expect("CLOCK_BOOTTIME is always available");
        BootNs(t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
    }

    pub fn to_system_time(&self, t: BootNs) -> SystemTime {
        let ns = self.boot_epoch_ns.load(Ordering::Relaxed) as i128 + t.0 as i128;
        UNIX_EPOCH + Duration::from_nanos(ns.max(0) as u64)
    }
}

impl Default for BootClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fake_clock_moves_only_when_told_and_clones_share_it() {
        let c = FakeClock::at(UNIX_EPOCH);
        let d = c.clone();
        assert_eq!(d.now(), UNIX_EPOCH);
        c.advance(Duration::from_secs(3));
        assert_eq!(d.now(), UNIX_EPOCH + Duration::from_secs(3));
    }

    #[test]
    fn now_maps_to_now() {
        let c = BootClock::new();
        let wall = c.to_system_time(BootClock::now());
        let diff = SystemTime::now()
            .duration_since(wall)
            .unwrap_or_else(|e| e.duration());
        assert!(diff < Duration::from_millis(50), "{diff:?}");
    }

    #[test]
    fn clones_share_refreshes() {
        let a = BootClock::new();
        let b = a.clone();
        a.boot_epoch_ns.store(0, Ordering::Relaxed);
        assert_eq!(
            b.to_system_time(BootNs(5)),
            UNIX_EPOCH + Duration::from_nanos(5)
        );
        a.refresh();
        let wall = b.to_system_time(BootClock::now());
        assert!(
            SystemTime::now()
                .duration_since(wall)
                .unwrap_or_else(|e| e.duration())
                < Duration::from_millis(50),
            "b sees a's refresh"
        );
    }
}
