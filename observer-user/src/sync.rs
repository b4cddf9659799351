//! Shared-state helpers: [`AbortOnDrop`], the [`Bell`] a thread that must never wait rings to
//! wake a task, [`try_lock`] for such a thread, the log queue such a thread logs through
//! ([`logs`]), and locks recovered the same way everywhere. A panic
//! while a lock was held leaves the data as the panicking code left it; every user here keeps
//! data that stays meaningful (a map, counters), so the lock is taken back, the poison cleared,
//! and the event logged once per poisoning.
use std::{
    io,
    os::unix::net::UnixDatagram,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
        TryLockError,
    },
};

pub mod logs;

fn recovered<G>(e: PoisonError<G>, clear: impl FnOnce()) -> G {
    tracing::error!(
        "a task panicked while holding a lock; its data is used as that task left it (see the panic above)"
    );
    clear();
    e.into_inner()
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock()
        .unwrap_or_else(|e| recovered(e, || m.clear_poison()))
}

/// The lock if it is free now, else `None`: for the kernel reader's thread, which may be
/// real-time and must never wait for a thread of normal priority (that thread could be
/// preempted while holding it). The caller keeps its work and tries again at its next turn.
pub(crate) fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(e)) => Some(recovered(e, || m.clear_poison())),
        Err(TryLockError::WouldBlock) => None,
    }
}

pub fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read()
        .unwrap_or_else(|e| recovered(e, || l.clear_poison()))
}

pub fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write()
        .unwrap_or_else(|e| recovered(e, || l.clear_poison()))
}

/// A task that ends with its owner.
pub(crate) struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A wake-up rung from a thread that must never wait, heard by one tokio task: ringing takes no
/// lock (a tokio `Notify` takes its waiters' mutex, and waking a task from outside the runtime
/// takes the scheduler's); it is an atomic swap, and one `send(2)` on a socket only when the
/// task is waiting. Make it with [`bell`].
#[derive(Clone, Debug)]
pub(crate) struct Bell(Arc<BellShared>);

#[derive(Debug)]
struct BellShared {
    /// The waiter is (about to be) waiting: the next ring sends.
    armed: AtomicBool,
    tx: UnixDatagram,
}

/// The one task that waits for a [`Bell`].
#[derive(Debug)]
pub(crate) struct BellWaiter {
    shared: Arc<BellShared>,
    rx: Option<UnixDatagram>,
    io: Option<tokio::net::UnixDatagram>,
}

/// A bell and its waiter.
pub(crate) fn bell() -> io::Result<(Bell, BellWaiter)> {
    let (tx, rx) = UnixDatagram::pair()?;
    tx.set_nonblocking(true)?;
    rx.set_nonblocking(true)?;
    let shared = Arc::new(BellShared {
        armed: AtomicBool::new(false),
        tx,
    });
    Ok((
        Bell(Arc::clone(&shared)),
        BellWaiter {
            shared,
            rx: Some(rx),
            io: None,
        },
    ))
}

impl Bell {
    /// Wakes the waiter if it is armed; never blocks (a full socket means it is woken already).
    pub(crate) fn ring(&self) {
        if self.0.armed.swap(false, Ordering::AcqRel) {
            let _ = self.0.tx.send(&[1]);
        }
    }
}

impl BellWaiter {
    /// Arms the bell: a ring from now on wakes [`Self::wait`]. Arm, look again at what the
    /// ringer shares, and only then wait, so that no ring falls between the look and the wait.
    pub(crate) fn arm(&self) {
        self.shared.armed.store(true, Ordering::SeqCst);
    }

    /// Until a ring after [`Self::arm`] (or a spurious wake-up: look again). On a tokio runtime.
    pub(crate) async fn wait(&mut self) {
        if self.io.is_none() {
            match self.rx.take().map(tokio::net::UnixDatagram::from_std) {
                Some(Ok(io)) => self.io = Some(io),
                Some(Err(e)) => {
                    // Outside a runtime's reactor: nothing could wake us; never seen in the agent.
                    tracing::error!("a wake-up socket could not join the runtime: {e}");
                    return std::future::pending().await;
                }
                None => return std::future::pending().await,
            }
        }
        let Some(io) = &self.io else { return };
        if io.readable().await.is_err() {
            return;
        }
        let mut buf = [0u8; 64];
        while io.try_recv(&mut buf).is_ok() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_ring_wakes_an_armed_waiter_and_only_then_sends() {
        let (bell, mut waiter) = super::bell().unwrap();
        // Not armed: nothing is sent.
        bell.ring();
        waiter.arm();
        bell.ring();
        // A second ring before the wait sends nothing more (the first disarmed it).
        bell.ring();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter.wait())
            .await
            .expect("the ring woke the waiter");
        // Drained: an unarmed bell does not wake it again.
        bell.ring();
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), waiter.wait())
                .await
                .is_err(),
            "no ring while not armed"
        );
    }

    #[test]
    fn try_lock_gives_up_while_another_thread_holds_the_lock() {
        let m = Arc::new(Mutex::new(0));
        let held = lock(&m);
        let m2 = Arc::clone(&m);
        let got = std::thread::spawn(move || try_lock(&m2).is_some())
            .join()
            .unwrap();
        assert!(!got);
        drop(held);
        assert!(try_lock(&m).is_some());
    }

    #[test]
    fn a_poisoned_lock_is_recovered_and_said_once() {
        let (log, _g) = crate::testlog::capture(tracing::Level::WARN);
        let m = std::sync::Arc::new(Mutex::new(vec![1]));
        let m2 = std::sync::Arc::clone(&m);
        let _ = std::thread::spawn(move || {
            let mut g = m2.lock().unwrap();
            g.push(2);
            panic!("poisoning on purpose");
        })
        .join();
        assert!(m.is_poisoned());
        lock(&m).push(3);
        lock(&m).push(4);
        assert_eq!(*lock(&m), vec![1, 2, 3, 4]);
        assert_eq!(
            log.lines(),
            vec!["ERROR a task panicked while holding a lock; its data is used as that task left it (see the panic above)"]
        );
    }
}
