//! Real-time scheduling for the fast path's thread (`--realtime-priority`): the one that reads
//! the kernel and runs the PLEG, and writes `watch --pods`'s lines or sends `observer run`'s
//! fast status patches.
//!
//! **The bound.** It asks for SCHED_DEADLINE first: a reservation of [`RESERVATION`] (2 ms of
//! CPU in every 10 ms, 20 % of one core), which the kernel enforces (a thread that used its
//! runtime is throttled until its next period) and admits only while the node's deadline
//! bandwidth has room. A fork storm or a burst of deaths then slows the agent, never the node. Where the kernel
//! refuses the reservation (an affinity narrower than the CPUs of the root domain, a full
//! admission), the thread falls back to SCHED_FIFO at `--realtime-priority` and says so once;
//! it then polices itself with the same bound ([`police`]): a thread that used more than the
//! reservation's runtime in a period drops to normal priority for the rest of it (counted,
//! said once), the kernel's global real-time throttle (`sched_rt_runtime_us`) standing behind
//! for a batch that never ends. Where SCHED_FIFO is refused too, normal priority, as before.
//!
//! Only those threads are real-time, and with `SCHED_RESET_ON_FORK`: nothing they start inherits
//! the policy. That matters beyond fairness: with RT group scheduling (`CONFIG_RT_GROUP_SCHED`) a
//! SCHED_FIFO task cannot enter a child cpu cgroup that has no real-time budget, so a runtime
//! started by a real-time process fails to put its container into its cgroup (runc: EINVAL
//! writing cgroup.procs). The same rule makes the kernel refuse the policy to a thread whose own
//! cpu cgroup has no budget, which is where an agent in a pod usually is on such kernels: then
//! the thread runs at normal priority, and says so once.
use std::{
    cell::RefCell,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{Duration, Instant},
};

/// Linux's range of SCHED_FIFO priorities.
pub(crate) const PRIORITIES: std::ops::RangeInclusive<u8> = 1..=99;

/// `CAP_SYS_NICE`'s bit in the capability sets of /proc/self/status.
const CAP_SYS_NICE: u64 = 1 << 23;

#[derive(Debug, thiserror::Error)]
pub enum RealtimeError {
    #[error("real-time priority {0} is outside 1..=99")]
    OutOfRange(u8),
    #[error(
        "SCHED_FIFO {priority} refused: this process lacks CAP_SYS_NICE (and RLIMIT_RTPRIO \
         allows {rlimit})"
    )]
    NotPermitted { priority: u8, rlimit: u64 },
    #[error(
        "SCHED_FIFO {priority} refused despite CAP_SYS_NICE: the kernel's RT group scheduling \
         gives this process's cpu cgroup no real-time budget (cpu.rt_runtime_us is 0)"
    )]
    NoBudget { priority: u8 },
    #[error(
        "SCHED_DEADLINE refused: {source} (its affinity must span the CPUs of its root domain, \
         and the node's deadline bandwidth must have room)"
    )]
    Deadline { source: std::io::Error },
    #[error("SCHED_FIFO {priority}: {source}")]
    Other {
        priority: u8,
        source: std::io::Error,
    },
}

/// A SCHED_DEADLINE reservation: `runtime` of CPU in every `period` (the relative deadline is the
/// period).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub runtime: std::time::Duration,
    pub period: std::time::Duration,
}

impl Reservation {
    /// The share of one core the reservation allows at most.
    pub fn share(&self) -> f64 {
        self.runtime.as_secs_f64() / self.period.as_secs_f64()
    }
}

/// The reservation of the fast-path thread: 2 ms every 10 ms. A death costs the PLEG a few µs and
/// its fast patch tens of µs of CPU, so a burst of 1000 deaths is well under a second of the
/// thread's wall time, while the node keeps at least 80 % of a core from it.
pub const RESERVATION: Reservation = Reservation {
    runtime: std::time::Duration::from_millis(2),
    period: std::time::Duration::from_millis(10),
};

/// The policy a thread got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Granted {
    /// SCHED_DEADLINE: kernel-enforced at most `runtime` per `period`.
    Deadline(Reservation),
    /// SCHED_FIFO at this priority: bounded only by the kernel's global real-time throttle.
    Fifo(u8),
    /// Normal priority (refused, or not asked).
    Normal,
}

impl Granted {
    pub(crate) fn is_realtime(self) -> bool {
        self != Granted::Normal
    }
}

/// `SCHED_DEADLINE` and `SCHED_FLAG_RESET_ON_FORK` (linux/sched.h; not in every libc).
const SCHED_DEADLINE: u32 = 6;
const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

/// `struct sched_attr` (linux/sched/types.h), its first version (48 bytes).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
}

/// Makes the calling thread (only it) SCHED_DEADLINE with `r`, with reset-on-fork. SCHED_DEADLINE
/// threads may not fork (never done on these threads) and need an affinity spanning the root
/// domain (the kernel refuses otherwise: the caller falls back).
pub fn set_deadline(r: Reservation) -> Result<(), RealtimeError> {
    let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        sched_policy: SCHED_DEADLINE,
        sched_flags: SCHED_FLAG_RESET_ON_FORK,
        sched_runtime: ns(r.runtime),
        sched_deadline: ns(r.period),
        sched_period: ns(r.period),
        ..Default::default()
    };
    // SAFETY: sched_setattr(2) has no libc wrapper; pid 0 is the calling thread, `attr` is a
    // valid, initialised sched_attr whose `size` field is its size, and flags 0 is the only value.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0u32) };
    if rc == 0 {
        return Ok(());
    }
    let source = std::io::Error::last_os_error();
    Err(match source.raw_os_error() {
        Some(libc::EPERM) if !has_cap_sys_nice() => RealtimeError::NotPermitted {
            priority: 0,
            rlimit: rtprio_limit(),
        },
        _ => RealtimeError::Deadline { source },
    })
}

/// Makes the calling thread (only it) SCHED_FIFO at `priority`, with `SCHED_RESET_ON_FORK`.
pub fn set_realtime(priority: u8) -> Result<(), RealtimeError> {
    if !PRIORITIES.contains(&priority) {
        return Err(RealtimeError::OutOfRange(priority));
    }
    let param = libc::sched_param {
        sched_priority: i32::from(priority),
    };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for the call.
    let rc = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if rc == 0 {
        return Ok(());
    }
    let source = std::io::Error::last_os_error();
    Err(match source.raw_os_error() {
        Some(libc::EPERM) if has_cap_sys_nice() => RealtimeError::NoBudget { priority },
        Some(libc::EPERM) => RealtimeError::NotPermitted {
            priority,
            rlimit: rtprio_limit(),
        },
        _ => RealtimeError::Other { priority, source },
    })
}

/// The calling thread back to SCHED_OTHER (for a trial, `observer check`).
pub(crate) fn set_normal() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: as in set_realtime; SCHED_OTHER needs no privilege.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
}

/// Whether the calling thread runs SCHED_FIFO or SCHED_DEADLINE now.
#[cfg(test)]
pub(crate) fn is_realtime() -> bool {
    // SAFETY: pid 0 is the calling thread; no pointer is involved.
    let policy = unsafe { libc::sched_getscheduler(0) };
    policy >= 0 && {
        let p = policy & !libc::SCHED_RESET_ON_FORK;
        p == libc::SCHED_FIFO || p as u32 == SCHED_DEADLINE
    }
}

/// The fast path's policy for the calling thread, `what` naming it: SCHED_DEADLINE with
/// [`RESERVATION`], else SCHED_FIFO at `priority`, else normal priority. Each fallback is logged
/// once per process (a warning, with why), later ones only at debug.
pub(crate) fn realtime_or_say_once(priority: u8, what: &str) -> Granted {
    static SAID_DEADLINE: AtomicBool = AtomicBool::new(false);
    static SAID_FIFO: AtomicBool = AtomicBool::new(false);
    let say = |said: &AtomicBool, msg: String| {
        if !said.swap(true, Ordering::Relaxed) {
            tracing::warn!("{msg}");
        } else {
            tracing::debug!("{msg}");
        }
    };
    let r = RESERVATION;
    match set_deadline(r) {
        Ok(()) => {
            tracing::info!(
                runtime = ?r.runtime,
                period = ?r.period,
                "{what}: real-time (SCHED_DEADLINE, at most {:.0} % of a core)",
                r.share() * 100.0
            );
            return Granted::Deadline(r);
        }
        Err(e) => say(
            &SAID_DEADLINE,
            format!("{what}: no SCHED_DEADLINE reservation ({e}); trying SCHED_FIFO, bounded only by the kernel's real-time throttle"),
        ),
    }
    match set_realtime(priority) {
        Ok(()) => {
            tracing::info!(
                priority,
                "{what}: real-time (SCHED_FIFO, held to {:.0} % of a core by the thread itself)",
                r.share() * 100.0
            );
            POLICE.with(|p| *p.borrow_mut() = Police::start(priority, what));
            Granted::Fifo(priority)
        }
        Err(e) => {
            say(&SAID_FIFO, format!("{what} runs at normal priority: {e}"));
            Granted::Normal
        }
    }
}

/// Times a SCHED_FIFO thread dropped itself to normal priority for overrunning [`RESERVATION`].
static DEMOTIONS: AtomicU64 = AtomicU64::new(0);

/// How many times a SCHED_FIFO fast-path thread held itself to the bound ([`police`]).
pub(crate) fn demotions() -> u64 {
    DEMOTIONS.load(Ordering::Relaxed)
}

thread_local! {
    static POLICE: RefCell<Option<Police>> = const { RefCell::new(None) };
}

/// The user-space bound of a SCHED_FIFO thread: [`RESERVATION`]'s runtime per period, measured
/// on the thread's own CPU clock.
struct Police {
    priority: u8,
    what: String,
    period_start: Instant,
    cpu_at_start: Duration,
    demoted: bool,
}

/// What a check decides.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Within the period's runtime.
    Keep,
    /// The runtime is used up: normal priority for the rest of the period.
    Demote,
    /// A new period: real-time again (if it was demoted) with a fresh runtime.
    NewPeriod,
}

fn verdict(used: Duration, elapsed: Duration, r: Reservation, demoted: bool) -> Verdict {
    if elapsed >= r.period {
        Verdict::NewPeriod
    } else if !demoted && used > r.runtime {
        Verdict::Demote
    } else {
        Verdict::Keep
    }
}

fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

impl Police {
    fn start(priority: u8, what: &str) -> Option<Self> {
        Some(Self {
            priority,
            what: what.to_string(),
            period_start: Instant::now(),
            cpu_at_start: thread_cpu(),
            demoted: false,
        })
    }

    fn check(&mut self) {
        let (now, cpu) = (Instant::now(), thread_cpu());
        let used = cpu.saturating_sub(self.cpu_at_start);
        match verdict(used, now - self.period_start, RESERVATION, self.demoted) {
            Verdict::Keep => {}
            Verdict::Demote => {
                self.demoted = true;
                set_normal();
                DEMOTIONS.fetch_add(1, Ordering::Relaxed);
                static SAID: AtomicBool = AtomicBool::new(false);
                if !SAID.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "{}: used {used:?} of CPU in {:?} at SCHED_FIFO: at normal priority for the rest of each such period (the bound SCHED_DEADLINE would enforce; counted in observer_realtime_demotions_total)",
                        self.what,
                        RESERVATION.period
                    );
                }
            }
            Verdict::NewPeriod => {
                if self.demoted && set_realtime(self.priority).is_ok() {
                    self.demoted = false;
                }
                self.period_start = now;
                self.cpu_at_start = cpu;
            }
        }
    }
}

/// Called by a fast-path thread at each turn and every few events of a batch: a SCHED_FIFO
/// thread holds itself to [`RESERVATION`] (a no-op on any other thread).
pub(crate) fn police() {
    POLICE.with(|p| {
        if let Some(p) = p.borrow_mut().as_mut() {
            p.check();
        }
    });
}

/// CAP_SYS_NICE in this process's effective set.
pub(crate) fn has_cap_sys_nice() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("CapEff:")
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            })
        })
        .is_some_and(|caps| caps & CAP_SYS_NICE != 0)
}

/// RLIMIT_RTPRIO's soft limit: the highest priority an unprivileged thread may take.
fn rtprio_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_RTPRIO)
        .map(|(soft, _)| soft)
        .unwrap_or(0)
}

/// `observer_realtime_demotions_total`.
pub(crate) fn encode_metrics(
    e: &mut prometheus_client::encoding::DescriptorEncoder<'_>,
) -> std::fmt::Result {
    crate::exposition::counter(
        e,
        "realtime_demotions",
        "Times a SCHED_FIFO fast-path thread dropped itself to normal priority for using more than 2 ms of CPU in 10 ms (where SCHED_DEADLINE was refused)",
        demotions(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bound: demoted once the runtime is used within a period, real-time again at the next.
    #[test]
    fn a_fifo_thread_is_held_to_the_reservation() {
        let r = RESERVATION;
        let ms = Duration::from_millis;
        assert_eq!(verdict(ms(1), ms(5), r, false), Verdict::Keep);
        assert_eq!(verdict(ms(3), ms(5), r, false), Verdict::Demote);
        assert_eq!(verdict(ms(3), ms(6), r, true), Verdict::Keep);
        assert_eq!(verdict(ms(9), ms(10), r, true), Verdict::NewPeriod);
        assert_eq!(verdict(ms(0), ms(10), r, false), Verdict::NewPeriod);
    }

    /// A SCHED_FIFO thread that spins (where this process may take SCHED_FIFO) drops itself to
    /// normal priority within a period, and is real-time again in the next.
    #[test]
    fn a_spinning_fifo_thread_demotes_itself() {
        std::thread::spawn(|| {
            if let Err(e) = set_realtime(1) {
                assert!(
                    std::env::var("CI").as_deref() != Ok("true"),
                    "CI runs as root, where SCHED_FIFO is allowed: {e}"
                );
                eprintln!("SKIP: SCHED_FIFO refused here ({e}); the bound's logic is tested above");
                return;
            }
            POLICE.with(|p| *p.borrow_mut() = Police::start(1, "test"));
            let before = demotions();
            let spin_until = Instant::now() + Duration::from_millis(5);
            while Instant::now() < spin_until {
                police();
            }
            assert!(
                !is_realtime(),
                "demoted after 2 ms of CPU in a 10 ms period"
            );
            assert!(demotions() > before);
            let next = Instant::now() + RESERVATION.period;
            while Instant::now() < next {
                std::hint::spin_loop();
            }
            police();
            assert!(is_realtime(), "real-time again in the next period");
            set_normal();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn out_of_range_is_refused_before_the_kernel() {
        assert!(matches!(set_realtime(0), Err(RealtimeError::OutOfRange(0))));
        assert!(matches!(
            set_realtime(100),
            Err(RealtimeError::OutOfRange(100))
        ));
    }

    /// SCHED_DEADLINE on a thread of its own: granted (then real-time, and back to normal) or
    /// refused with a reason.
    #[test]
    fn a_deadline_trial_on_a_thread_of_its_own() {
        std::thread::spawn(|| match set_deadline(RESERVATION) {
            Ok(()) => {
                assert!(is_realtime());
                set_normal();
                assert!(!is_realtime());
            }
            Err(e) => {
                assert!(!is_realtime());
                assert!(
                    matches!(
                        e,
                        RealtimeError::Deadline { .. } | RealtimeError::NotPermitted { .. }
                    ),
                    "{e}"
                );
            }
        })
        .join()
        .unwrap();
        assert!(!is_realtime());
        assert!((RESERVATION.share() - 0.2).abs() < 1e-9);
    }

    /// On a thread of its own: granted or refused, the policy never leaks to the test runner's
    /// threads, and a refusal says why.
    #[test]
    fn a_trial_on_a_thread_of_its_own() {
        std::thread::spawn(|| match set_realtime(1) {
            Ok(()) => {
                assert!(is_realtime());
                set_normal();
                assert!(!is_realtime());
            }
            Err(e) => {
                assert!(!is_realtime());
                assert!(
                    matches!(
                        e,
                        RealtimeError::NoBudget { .. } | RealtimeError::NotPermitted { .. }
                    ),
                    "{e}"
                );
            }
        })
        .join()
        .unwrap();
        assert!(!is_realtime());
    }
}
