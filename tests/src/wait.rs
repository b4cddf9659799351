//! Waiting on a condition with a deadline: the one way tests wait for the world to change (never
//! a bare sleep). The poll interval is short enough not to slow a test and long enough not to
//! load two cores.
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(10);

/// Checks `cond` until it holds (true) or `timeout` passes (false). Blocks the thread.
pub fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    poll_until(timeout, || cond().then_some(())).is_some()
}

/// Calls `f` until it returns `Some` (that value) or `timeout` passes (`None`). Blocks the thread.
pub fn poll_until<T>(timeout: Duration, f: impl FnMut() -> Option<T>) -> Option<T> {
    poll_every(POLL, timeout, f)
}

/// [`poll_until`] at a chosen interval: for checks that cost a process or a request each (a
/// kubectl call against the test cluster).
pub fn poll_every<T>(
    interval: Duration,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(interval);
    }
}

/// [`eventually`] on the async runtime: `cond` is checked between timer ticks, so other tasks run.
pub async fn eventually_async(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    poll_until_async(timeout, || cond().then_some(()))
        .await
        .is_some()
}

/// [`poll_until`] on the async runtime.
pub async fn poll_until_async<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn true_at_once_and_false_after_the_deadline() {
        assert!(eventually(Duration::ZERO, || true));
        let t = Instant::now();
        assert!(!eventually(Duration::from_millis(50), || false));
        assert!(t.elapsed() >= Duration::from_millis(50));
        let mut n = 0;
        assert_eq!(
            poll_until(Duration::from_secs(5), || {
                n += 1;
                (n == 3).then_some(n)
            }),
            Some(3)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn async_waits_on_the_runtimes_clock() {
        let t = tokio::time::Instant::now();
        assert!(!eventually_async(Duration::from_secs(30), || false).await);
        assert!(t.elapsed() >= Duration::from_secs(30));
    }
}
