//! Shared-state helpers: [`AbortOnDrop`], and locks recovered the same way everywhere. A panic
//! while a lock was held leaves the data as the panicking code left it; every user here keeps
//! data that stays meaningful (a map, counters), so the lock is taken back, the poison cleared,
//! and the event logged once per poisoning.
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

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

pub fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read()
        .unwrap_or_else(|e| recovered(e, || l.clear_poison()))
}

pub fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write()
        .unwrap_or_else(|e| recovered(e, || l.clear_poison()))
}

/// A task that ends with its owner.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
