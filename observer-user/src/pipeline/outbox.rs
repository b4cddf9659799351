//! Where the PLEG's events leave the loop: each shown to the hook first (on the loop's thread,
//! at once), then kept and handed to the consumer's queue at the end of the batch. On the
//! loop's own thread the queue's lock is only tried: when the consumer holds it, the events
//! wait for the next turn, in order, and the hook has already seen them.
use std::time::SystemTime;

use super::Hook;
use crate::pleg::{PlegSender, PodLifecycleEvent, Stamped};

pub(super) struct Outbox {
    pub(super) hook: Option<Box<dyn Hook>>,
    tx: PlegSender,
    /// Events made and not yet queued.
    pending: Vec<Stamped>,
}

impl Outbox {
    pub(super) fn new(tx: PlegSender, hook: Option<Box<dyn Hook>>) -> Self {
        Self {
            hook,
            tx,
            pending: Vec::new(),
        }
    }

    /// The PLEG's new events: each shown to the hook as it is made, then kept for the queue.
    pub(super) fn deliver(&mut self, events: impl IntoIterator<Item = PodLifecycleEvent>) {
        for event in events {
            let sent = SystemTime::now();
            if let Some(h) = self.hook.as_mut() {
                h.event(&event, sent);
            }
            self.pending.push(Stamped { event, sent });
        }
    }

    /// The end of a batch of kernel records: the hook's flush point.
    pub(super) fn batch_end(&mut self) {
        if let Some(h) = self.hook.as_mut() {
            h.batch_end();
        }
    }

    /// Queues what [`Self::deliver`] kept; `false` when the lock was busy (`wait` false) and
    /// the events stay for the next call.
    pub(super) fn hand_over(&mut self, wait: bool) -> bool {
        self.tx.send_batch(&mut self.pending, wait)
    }

    pub(super) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::{
        model::{BootNs, PodUid},
        pleg::{channel, PlegEvent},
    };

    /// Records what it saw, and whether the consumer had it yet.
    struct Seen(Arc<Mutex<Vec<(BootNs, &'static str)>>>);

    impl Hook for Seen {
        fn event(&mut self, ev: &PodLifecycleEvent, _sent: SystemTime) {
            self.0.lock().unwrap().push((ev.at, "event"));
        }
        fn batch_end(&mut self) {
            self.0.lock().unwrap().push((BootNs(0), "batch end"));
        }
    }

    fn sync(n: u64) -> PodLifecycleEvent {
        let uid = PodUid::parse("0f2c3a4b-1111-2222-3333-444455556666").expect("a uid");
        PodLifecycleEvent::pod_sync(uid, BootNs(n))
    }

    #[tokio::test]
    async fn the_hook_sees_each_event_before_the_consumer_and_in_order() {
        let (tx, mut rx) = channel(16).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut out = Outbox::new(tx, Some(Box::new(Seen(Arc::clone(&seen)))));
        out.deliver([sync(1), sync(2)]);
        assert_eq!(
            *seen.lock().unwrap(),
            [(BootNs(1), "event"), (BootNs(2), "event")]
        );
        assert!(rx.try_recv().is_none(), "kept until the batch ends");
        out.batch_end();
        assert!(out.hand_over(false));
        let got: Vec<BootNs> = std::iter::from_fn(|| rx.try_recv()).map(|e| e.at).collect();
        assert_eq!(got, [BootNs(1), BootNs(2)]);
        assert_eq!(seen.lock().unwrap().last().unwrap().1, "batch end");
    }

    #[tokio::test]
    async fn a_busy_queue_keeps_the_events_for_the_next_turn_without_waiting() {
        let (tx, mut rx) = channel(16).unwrap();
        let mut out = Outbox::new(tx, None);
        out.deliver([sync(1)]);
        {
            let _held = rx.hold_lock();
            // The loop's thread only tries the lock: it returns at once, the event kept.
            assert!(!out.hand_over(false));
        }
        out.deliver([sync(2)]);
        assert!(out.hand_over(false));
        let got: Vec<BootNs> = std::iter::from_fn(|| rx.try_recv()).map(|e| e.at).collect();
        assert_eq!(got, [BootNs(1), BootNs(2)], "none lost, none reordered");
        // What a resync makes is a plain event too.
        out.deliver([PodLifecycleEvent {
            event: PlegEvent::PodSync,
            ..sync(3)
        }]);
        assert!(out.hand_over(true));
        assert_eq!(rx.try_recv().map(|e| e.at), Some(BootNs(3)));
    }
}
