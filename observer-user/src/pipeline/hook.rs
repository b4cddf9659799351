//! What the kernel reader's loop runs itself, on its own thread, for every lifecycle event the
//! PLEG makes: the contract of that thread. `watch --pods` writes its lines there and `observer
//! run`'s fast path sends its ContainersAlive=False patches from there
//! ([`crate::fastpath::FastDeaths`]), so that neither waits behind the node's workloads for a
//! normal-priority task's turn.
//!
//! The thread may be real-time (`--realtime-priority`). What runs on it must never block, and
//! must never wait for a lock a normal-priority thread can hold: such a thread, preempted while
//! holding it, would hold the next death up behind the workloads (no priority inheritance for
//! std's locks). Hand work to normal priority through [`crate::sync::Bell`] and locks taken with
//! [`crate::sync::try_lock`] (kept for the next turn when busy). ARCHITECTURE.md, "The fast path
//! and its bound", lists what the thread does on a death before and after its `send(2)`.
use std::time::{Instant, SystemTime};

use crate::{model::BootClock, pleg::PodLifecycleEvent};

/// Work done on the kernel reader's loop for every event the PLEG makes, before the event is
/// queued for the consumer (the reconciler).
pub trait Hook: Send {
    /// `sent`: the wall time the PLEG made it (as [`crate::pleg::Stamped::sent`]).
    fn event(&mut self, ev: &PodLifecycleEvent, sent: SystemTime);
    /// The end of a batch of kernel records (a flush point).
    fn batch_end(&mut self) {}
    /// Descriptors of the hook's own (its connections) that the loop's poll(2) is to wait on
    /// beside the ring buffer, and the latest time the loop is to call [`Self::ready`] back.
    fn interest(&mut self, _fds: &mut Vec<libc::pollfd>) -> Option<Instant> {
        None
    }
    /// After each of the loop's turns: the descriptors [`Self::interest`] gave, with what
    /// poll(2) found on them (none when the turn ended otherwise).
    fn ready(&mut self, _fds: &[libc::pollfd]) {}
}

/// Makes the [`Hook`] with the pipeline's clock, before the start-up walk (whose events it sees
/// too).
pub type HookFactory = Box<dyn FnOnce(&BootClock) -> Box<dyn Hook> + Send>;
