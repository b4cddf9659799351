//! A bounded queue of lifecycle events between the PLEG's loop and its consumer. A consumer that
//! lags never makes the loop block or grow without bound, and never silently loses a pod's state:
//! once the queue is full, a pod's further events are coalesced into one PodSync for that pod,
//! which the consumer receives after the pod's events that did fit (so per-container order holds).
//! Each event carries the wall time the PLEG sent it ([`Stamped`]): what the detection bench and
//! the agent's queueing figures start from.
//!
//! The loop's thread may be real-time: it never waits here. It hands a batch over with
//! [`PlegSender::send_batch`], which takes the queue's lock only if it is free (else the batch
//! waits for the loop's next turn), and wakes the consumer with a [`Bell`] (no lock).
use std::{
    collections::{HashSet, VecDeque},
    io,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::SystemTime,
};

use super::event::PodLifecycleEvent;
use crate::{
    model::{BootNs, PodUid},
    sync::{Bell, BellWaiter},
};

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
}

struct Shared {
    inner: Mutex<Inner>,
    bell: Bell,
    closed: AtomicBool,
    capacity: usize,
    /// Events folded into a PodSync because the consumer lagged.
    lagged: AtomicU64,
    senders: AtomicUsize,
}

impl Shared {
    fn push(&self, inner: &mut Inner, s: Stamped) {
        let ev = &s.event;
        if inner.coalesced_set.contains(&ev.pod_uid) {
            // Already behind for this pod: later events must not overtake the pending sync.
            self.lagged.fetch_add(1, Ordering::Relaxed);
            if let Some(slot) = inner
                .coalesced
                .iter_mut()
                .find(|(uid, _, _)| *uid == ev.pod_uid)
            {
                slot.1 = slot.1.max(ev.at);
            }
        } else if inner.queue.len() >= self.capacity {
            self.lagged.fetch_add(1, Ordering::Relaxed);
            inner.coalesced_set.insert(ev.pod_uid);
            inner.coalesced.push_back((ev.pod_uid, ev.at, s.sent));
        } else {
            inner.queue.push_back(s);
        }
    }
}

pub struct PlegSender(Arc<Shared>);

impl Clone for PlegSender {
    fn clone(&self) -> Self {
        self.0.senders.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(&self.0))
    }
}

pub struct PlegReceiver {
    shared: Arc<Shared>,
    waiter: BellWaiter,
}

/// A queue of `capacity` events before a lagging consumer's are coalesced per pod. Fails only
/// when the process is out of file descriptors (the wake-up is a socket pair).
pub fn channel(capacity: usize) -> io::Result<(PlegSender, PlegReceiver)> {
    let (bell, waiter) = crate::sync::bell()?;
    let shared = Arc::new(Shared {
        inner: Mutex::new(Inner {
            queue: VecDeque::with_capacity(capacity.min(4096)),
            coalesced: VecDeque::new(),
            coalesced_set: HashSet::new(),
        }),
        bell,
        closed: AtomicBool::new(false),
        capacity: capacity.max(1),
        lagged: AtomicU64::new(0),
        senders: AtomicUsize::new(1),
    });
    Ok((
        PlegSender(Arc::clone(&shared)),
        PlegReceiver { shared, waiter },
    ))
}

impl PlegSender {
    /// One event, stamped now; waits for the queue's lock (not from the kernel reader's loop:
    /// it hands its batches over with [`Self::send_batch`]).
    pub fn send(&self, ev: PodLifecycleEvent) {
        let mut one = vec![Stamped {
            event: ev,
            sent: SystemTime::now(),
        }];
        self.send_batch(&mut one, true);
    }

    /// Hands `batch` over, in order, and wakes the consumer. With `wait` false the queue's lock
    /// is taken only if it is free: when it is not, nothing is sent, `batch` is left as it was,
    /// and `false` says to try again later.
    pub fn send_batch(&self, batch: &mut Vec<Stamped>, wait: bool) -> bool {
        if batch.is_empty() {
            return true;
        }
        let inner: Option<MutexGuard<'_, Inner>> = if wait {
            Some(crate::sync::lock(&self.0.inner))
        } else {
            crate::sync::try_lock(&self.0.inner)
        };
        let Some(mut inner) = inner else {
            return false;
        };
        for s in batch.drain(..) {
            self.0.push(&mut inner, s);
        }
        drop(inner);
        self.0.bell.ring();
        true
    }

    pub fn lagged(&self) -> u64 {
        self.0.lagged.load(Ordering::Relaxed)
    }

    /// A handle on the lag count that neither sends nor keeps the stream open.
    pub(crate) fn lag_counter(&self) -> LagCounter {
        LagCounter(Arc::clone(&self.0))
    }
}

/// Reads how many events were folded into PodSyncs because the consumer lagged.
#[derive(Clone)]
pub(crate) struct LagCounter(Arc<Shared>);

impl LagCounter {
    pub(crate) fn get(&self) -> u64 {
        self.0.lagged.load(Ordering::Relaxed)
    }
}

impl Drop for PlegSender {
    fn drop(&mut self) {
        // The last sender closes the stream.
        if self.0.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.closed.store(true, Ordering::Release);
            self.0.bell.ring();
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
            if self.shared.closed.load(Ordering::Acquire) {
                return self.try_recv_stamped();
            }
            // Armed, then looked at again: a batch handed over in between rang the bell.
            self.waiter.arm();
            if let Some(ev) = self.try_recv_stamped() {
                return Some(ev);
            }
            if self.shared.closed.load(Ordering::Acquire) {
                return self.try_recv_stamped();
            }
            self.waiter.wait().await;
        }
    }

    /// [`Self::try_recv`] with the time the PLEG sent the event.
    pub(crate) fn try_recv_stamped(&mut self) -> Option<Stamped> {
        let mut inner = crate::sync::lock(&self.shared.inner);
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
        self.shared.lagged.load(Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        crate::sync::lock(&self.shared.inner).queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Holds the queue's lock until the guard drops: tests show that the kernel reader's
    /// thread never waits for it.
    pub fn hold_lock(&self) -> impl Drop + '_ {
        crate::sync::lock(&self.shared.inner)
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
        let (tx, mut rx) = channel(8).unwrap();
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
        let (tx, mut rx) = channel(2).unwrap();
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

    /// A batch that finds the lock held is kept whole for the next turn, never waited for.
    #[test]
    fn a_batch_is_kept_while_the_consumer_holds_the_lock() {
        let (tx, mut rx) = channel(8).unwrap();
        let mut batch = vec![Stamped {
            event: ev(1, PlegEventType::ContainerStarted, 1),
            sent: SystemTime::now(),
        }];
        let held = rx.hold_lock();
        let sent = std::thread::scope(|s| s.spawn(|| tx.send_batch(&mut batch, false)).join());
        assert!(!sent.unwrap(), "not sent while the lock is held");
        drop(held);
        assert_eq!(batch.len(), 1, "kept for the next turn");
        assert!(tx.send_batch(&mut batch, false));
        assert!(batch.is_empty());
        assert_eq!(
            rx.try_recv().unwrap().kind(),
            PlegEventType::ContainerStarted
        );
    }

    #[tokio::test]
    async fn recv_wakes_and_ends_when_senders_drop() {
        let (tx, mut rx) = channel(4).unwrap();
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
