//! A bounded queue of lifecycle events between the PLEG and its consumer. A consumer that lags
//! never makes the PLEG block or grow without bound, and never silently loses a pod's state: once
//! the queue is full, a pod's further events are coalesced into one PodSync for that pod, which
//! the consumer receives after the pod's events that did fit (so per-container order holds).
//! Each event carries the wall time the PLEG sent it ([`Stamped`]): what the detection bench and
//! the agent's queueing figures start from.
//!
//! A [`FastPath`] set on the stream sees every event on the PLEG's own thread (real-time with
//! `--realtime-priority`) as it is sent, before any consumer task could: `watch --pods` writes
//! its lines there and `observer run` sends its fast status patches from there, so that neither
//! waits behind the node's workloads for a normal-priority task's turn.
use std::{
    collections::{HashSet, VecDeque},
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::SystemTime,
};

use tokio::sync::Notify;

use super::event::PodLifecycleEvent;
use crate::{model::BootNs, model::PodUid};

/// An event and the wall time the PLEG sent it.
#[derive(Clone, Debug)]
pub struct Stamped {
    pub event: PodLifecycleEvent,
    pub sent: SystemTime,
}

struct Inner {
    queue: VecDeque<Stamped>,
    /// Pods with coalesced events, in the order they overflowed, the newest time of each, and
    /// when the first was coalesced.
    coalesced: VecDeque<(PodUid, BootNs, SystemTime)>,
    coalesced_set: HashSet<PodUid>,
    closed: bool,
}

/// Work done on the PLEG's thread for every event it sends: it must never block (a write to a
/// pipe, a hand-over to another thread).
pub trait FastPath: Send {
    /// `sent`: the wall time the PLEG sent it (as [`Stamped::sent`]).
    fn event(&mut self, ev: &PodLifecycleEvent, sent: SystemTime);
    /// The end of a batch of kernel records (a flush point).
    fn batch_end(&mut self) {}
    /// Descriptors of the hook's own (its connections) that the loop's poll(2) is to wait on
    /// beside the ring buffer, and the latest time the loop is to call [`Self::ready`] back.
    /// On a loop with its own thread only.
    fn interest(&mut self, _fds: &mut Vec<libc::pollfd>) -> Option<std::time::Instant> {
        None
    }
    /// After each of the loop's turns: the descriptors [`Self::interest`] gave, with what
    /// poll(2) found on them (none when the turn ended otherwise).
    fn ready(&mut self, _fds: &[libc::pollfd]) {}
}

struct Shared {
    inner: Mutex<Inner>,
    /// Only the PLEG's thread takes it (and whoever sets it, once).
    fast: Mutex<Option<Box<dyn FastPath>>>,
    notify: Notify,
    capacity: usize,
    /// Events folded into a PodSync because the consumer lagged.
    lagged: AtomicU64,
    senders: AtomicUsize,
}

pub struct PlegSender(Arc<Shared>);

impl Clone for PlegSender {
    fn clone(&self) -> Self {
        self.0.senders.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(&self.0))
    }
}

pub struct PlegReceiver(Arc<Shared>);

pub fn channel(capacity: usize) -> (PlegSender, PlegReceiver) {
    let shared = Arc::new(Shared {
        inner: Mutex::new(Inner {
            queue: VecDeque::with_capacity(capacity.min(4096)),
            coalesced: VecDeque::new(),
            coalesced_set: HashSet::new(),
            closed: false,
        }),
        fast: Mutex::new(None),
        notify: Notify::new(),
        capacity: capacity.max(1),
        lagged: AtomicU64::new(0),
        senders: AtomicUsize::new(1),
    });
    (PlegSender(Arc::clone(&shared)), PlegReceiver(shared))
}

impl PlegSender {
    /// Never blocks.
    pub fn send(&self, ev: PodLifecycleEvent) {
        let sent = SystemTime::now();
        // First, and whether or not the consumer lags: the fast path never waits for it.
        if let Some(f) = crate::sync::lock(&self.0.fast).as_mut() {
            f.event(&ev, sent);
        }
        let mut inner = crate::sync::lock(&self.0.inner);
        if inner.coalesced_set.contains(&ev.pod_uid) {
            // Already behind for this pod: later events must not overtake the pending sync.
            self.0.lagged.fetch_add(1, Ordering::Relaxed);
            if let Some(slot) = inner
                .coalesced
                .iter_mut()
                .find(|(uid, _, _)| *uid == ev.pod_uid)
            {
                slot.1 = slot.1.max(ev.at);
            }
        } else if inner.queue.len() >= self.0.capacity {
            self.0.lagged.fetch_add(1, Ordering::Relaxed);
            inner.coalesced_set.insert(ev.pod_uid);
            inner.coalesced.push_back((ev.pod_uid, ev.at, sent));
        } else {
            inner.queue.push_back(Stamped { event: ev, sent });
        }
        drop(inner);
        self.0.notify.notify_one();
    }

    pub fn lagged(&self) -> u64 {
        self.0.lagged.load(Ordering::Relaxed)
    }

    /// The fast-path slot, which neither sends nor keeps the stream open.
    pub fn fast_path_slot(&self) -> FastPathSlot {
        FastPathSlot(Arc::clone(&self.0))
    }

    /// A handle on the lag count that neither sends nor keeps the stream open.
    pub fn lag_counter(&self) -> LagCounter {
        LagCounter(Arc::clone(&self.0))
    }
}

/// The stream's fast-path slot, for the PLEG's loop: sets the [`FastPath`] and marks batch ends.
#[derive(Clone)]
pub struct FastPathSlot(Arc<Shared>);

impl FastPathSlot {
    /// Sets (or replaces) the fast path; it sees the events sent from now on.
    pub fn set(&self, fast: Box<dyn FastPath>) {
        *crate::sync::lock(&self.0.fast) = Some(fast);
    }

    /// Called by the loop after each batch of kernel records.
    pub fn batch_end(&self) {
        if let Some(f) = crate::sync::lock(&self.0.fast).as_mut() {
            f.batch_end();
        }
    }

    /// See [`FastPath::interest`].
    pub fn interest(&self, fds: &mut Vec<libc::pollfd>) -> Option<std::time::Instant> {
        crate::sync::lock(&self.0.fast).as_mut()?.interest(fds)
    }

    /// See [`FastPath::ready`].
    pub fn ready(&self, fds: &[libc::pollfd]) {
        if let Some(f) = crate::sync::lock(&self.0.fast).as_mut() {
            f.ready(fds);
        }
    }
}

/// Reads how many events were folded into PodSyncs because the consumer lagged.
#[derive(Clone)]
pub struct LagCounter(Arc<Shared>);

impl LagCounter {
    pub fn get(&self) -> u64 {
        self.0.lagged.load(Ordering::Relaxed)
    }
}

impl Drop for PlegSender {
    fn drop(&mut self) {
        // The last sender closes the stream.
        if self.0.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            crate::sync::lock(&self.0.inner).closed = true;
            self.0.notify.notify_one();
        }
    }
}

impl PlegReceiver {
    /// The next event; `None` once every sender is gone and the queue is drained.
    pub async fn recv(&mut self) -> Option<PodLifecycleEvent> {
        self.recv_stamped().await.map(|s| s.event)
    }

    pub fn try_recv(&mut self) -> Option<PodLifecycleEvent> {
        self.try_recv_stamped().map(|s| s.event)
    }

    /// [`Self::recv`] with the time the PLEG sent the event.
    pub async fn recv_stamped(&mut self) -> Option<Stamped> {
        loop {
            if let Some(ev) = self.try_recv_stamped() {
                return Some(ev);
            }
            if crate::sync::lock(&self.0.inner).closed {
                return self.try_recv_stamped();
            }
            self.0.notify.notified().await;
        }
    }

    /// [`Self::try_recv`] with the time the PLEG sent the event.
    pub fn try_recv_stamped(&mut self) -> Option<Stamped> {
        let mut inner = crate::sync::lock(&self.0.inner);
        if let Some(ev) = inner.queue.pop_front() {
            return Some(ev);
        }
        let (uid, at, sent) = inner.coalesced.pop_front()?;
        inner.coalesced_set.remove(&uid);
        Some(Stamped {
            event: PodLifecycleEvent::pod_sync(uid, at),
            sent,
        })
    }

    /// Events folded into PodSyncs so far because this receiver lagged.
    pub fn lagged(&self) -> u64 {
        self.0.lagged.load(Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        crate::sync::lock(&self.0.inner).queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ContainerId;
    use crate::pleg::{PlegEvent, PlegEventType};

    fn uid(n: u8) -> PodUid {
        PodUid::parse(&format!("{:08x}-0000-0000-0000-000000000000", n)).unwrap()
    }

    fn ev(pod: u8, kind: PlegEventType, at: u64) -> PodLifecycleEvent {
        let id = ContainerId::parse(&format!("{:064x}", pod)).unwrap();
        let event = match kind {
            PlegEventType::ContainerStarted => PlegEvent::ContainerStarted {
                id,
                pid: 1,
                comm: Default::default(),
            },
            PlegEventType::ContainerRemoved => PlegEvent::ContainerRemoved { id },
            PlegEventType::ContainerDied => PlegEvent::ContainerDied {
                id,
                exit: crate::pleg::ContainerExit {
                    status: None,
                    reason: crate::pleg::ExitReason::Unknown,
                    pid: None,
                    comm: None,
                },
            },
            _ => PlegEvent::ContainerChanged { id },
        };
        PodLifecycleEvent {
            pod_uid: uid(pod),
            runtime: None,
            at: BootNs(at),
            event,
        }
    }

    #[test]
    fn in_order_under_capacity() {
        let (tx, mut rx) = channel(8);
        tx.send(ev(1, PlegEventType::ContainerStarted, 1));
        tx.send(ev(1, PlegEventType::ContainerDied, 2));
        assert_eq!(
            rx.try_recv().unwrap().kind(),
            PlegEventType::ContainerStarted
        );
        assert_eq!(rx.try_recv().unwrap().kind(), PlegEventType::ContainerDied);
        assert!(rx.try_recv().is_none());
        assert_eq!(rx.lagged(), 0);
    }

    #[test]
    fn overflow_coalesces_per_pod_and_keeps_order() {
        let (tx, mut rx) = channel(2);
        tx.send(ev(1, PlegEventType::ContainerStarted, 1));
        tx.send(ev(2, PlegEventType::ContainerStarted, 2));
        // Full: pod 1's death and pod 3's start are coalesced.
        tx.send(ev(1, PlegEventType::ContainerDied, 3));
        tx.send(ev(3, PlegEventType::ContainerStarted, 4));
        tx.send(ev(1, PlegEventType::ContainerRemoved, 5));
        assert_eq!(tx.lagged(), 3);
        let a = rx.try_recv().unwrap();
        assert_eq!(
            (a.pod_uid, a.kind()),
            (uid(1), PlegEventType::ContainerStarted)
        );
        // Room again, but pod 1 is behind: its new events wait behind its sync.
        tx.send(ev(1, PlegEventType::ContainerStarted, 6));
        tx.send(ev(2, PlegEventType::ContainerDied, 7));
        let got: Vec<_> = std::iter::from_fn(|| rx.try_recv())
            .map(|e| (e.pod_uid, e.kind(), e.at))
            .collect();
        assert_eq!(
            got,
            [
                (uid(2), PlegEventType::ContainerStarted, BootNs(2)),
                (uid(2), PlegEventType::ContainerDied, BootNs(7)),
                (uid(1), PlegEventType::PodSync, BootNs(6)),
                (uid(3), PlegEventType::PodSync, BootNs(4)),
            ]
        );
        assert_eq!(rx.lagged(), 4);
    }

    /// The fast path sees every event on the sender's side, those folded for a lagging consumer
    /// included, and the batch ends.
    #[test]
    fn the_fast_path_sees_every_event_even_when_the_consumer_lags() {
        struct Seen(Arc<Mutex<Vec<(PlegEventType, u64)>>>, Arc<AtomicU64>);
        impl FastPath for Seen {
            fn event(&mut self, ev: &PodLifecycleEvent, _: SystemTime) {
                self.0.lock().unwrap().push((ev.kind(), ev.at.0));
            }
            fn batch_end(&mut self) {
                self.1.fetch_add(1, Ordering::Relaxed);
            }
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let ends = Arc::new(AtomicU64::new(0));
        let (tx, mut rx) = channel(1);
        let slot = tx.fast_path_slot();
        slot.set(Box::new(Seen(Arc::clone(&seen), Arc::clone(&ends))));
        tx.send(ev(1, PlegEventType::ContainerStarted, 1));
        tx.send(ev(1, PlegEventType::ContainerDied, 2));
        slot.batch_end();
        assert_eq!(
            *seen.lock().unwrap(),
            [
                (PlegEventType::ContainerStarted, 1),
                (PlegEventType::ContainerDied, 2)
            ]
        );
        assert_eq!(ends.load(Ordering::Relaxed), 1);
        // The consumer got the first and a sync for the folded death.
        assert_eq!(
            rx.try_recv().unwrap().kind(),
            PlegEventType::ContainerStarted
        );
        assert_eq!(rx.try_recv().unwrap().kind(), PlegEventType::PodSync);
    }

    #[tokio::test]
    async fn recv_wakes_and_ends_when_senders_drop() {
        let (tx, mut rx) = channel(4);
        let tx2 = tx.clone();
        let task = tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx2.send(ev(1, PlegEventType::ContainerStarted, 1));
        });
        assert_eq!(
            rx.recv().await.unwrap().kind(),
            PlegEventType::ContainerStarted
        );
        task.await.unwrap();
        drop(tx);
        assert!(rx.recv().await.is_none());
    }
}
