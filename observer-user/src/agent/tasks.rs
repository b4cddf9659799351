//! The agent's tasks, supervised: each one is meant to run as long as the agent, so its end (or
//! its panic) is a failure, reported by name to [`Tasks::failed`] and to `/healthz`, unless the
//! agent is stopping ([`Tasks::stop`], and at drop): then an end is the normal one.
use std::{
    future::Future,
    panic::AssertUnwindSafe,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use futures::FutureExt;
use tokio::sync::watch;

use crate::sync::AbortOnDrop;

/// Every task the agent started; dropping it stops them.
pub(crate) struct Tasks {
    running: Vec<AbortOnDrop>,
    ended: watch::Sender<Option<String>>,
    stopping: Arc<AtomicBool>,
}

/// What `/healthz` reads: the first task that ended, and how.
#[derive(Clone)]
pub struct TaskHealth(watch::Receiver<Option<String>>);

impl TaskHealth {
    /// `Err(why)` once a task ended.
    pub fn check(&self) -> Result<(), String> {
        match &*self.0.borrow() {
            Some(why) => Err(why.clone()),
            None => Ok(()),
        }
    }
}

impl Default for Tasks {
    fn default() -> Self {
        Self {
            running: Vec::new(),
            ended: watch::Sender::new(None),
            stopping: Arc::default(),
        }
    }
}

impl Tasks {
    /// Runs `task` (named in reports: "the status manager") for the agent's life.
    pub(crate) fn spawn(
        &mut self,
        name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        let ended = self.ended.clone();
        let stopping = Arc::clone(&self.stopping);
        let join = tokio::spawn(async move {
            // The panic itself is printed by the panic hook; this says which part it stopped.
            let why = match AssertUnwindSafe(task).catch_unwind().await {
                Ok(()) if stopping.load(Ordering::Acquire) => {
                    tracing::debug!("the {name} ended: the agent is stopping");
                    return;
                }
                Ok(()) => format!("the {name} ended"),
                Err(p) => format!("the {name} panicked: {}", crate::runner::panic_message(p)),
            };
            tracing::error!("{why}: the agent cannot go on");
            ended.send_if_modified(|first| {
                let unset = first.is_none();
                if unset {
                    *first = Some(why);
                }
                unset
            });
        });
        self.running.push(AbortOnDrop(join));
    }

    /// The agent is stopping: a task that ends from now on ends normally (the kernel reader's
    /// stream closing under the reconciler, say).
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    pub(crate) fn health(&self) -> TaskHealth {
        TaskHealth(self.ended.subscribe())
    }

    /// Resolves with why, once a task ended.
    pub(crate) async fn failed(&self) -> String {
        let mut rx = self.ended.subscribe();
        let why = match rx.wait_for(Option::is_some).await {
            Ok(why) => why.clone(),
            // The sender lives in `self`.
            Err(_) => None,
        };
        match why {
            Some(why) => why,
            None => std::future::pending().await,
        }
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_panic_or_an_end_is_reported_by_name() {
        let (log, _g) = crate::testlog::capture(tracing::Level::ERROR);
        let mut tasks = Tasks::default();
        let health = tasks.health();
        tasks.spawn("status manager", std::future::pending());
        assert_eq!(health.check(), Ok(()));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn("Events worker", async move {
            let _ = rx.await;
            panic!("computing a status");
        });
        tasks.spawn("HTTP endpoint", async {
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        });
        tx.send(()).unwrap();
        let why = tasks.failed().await;
        assert_eq!(why, "the Events worker panicked: computing a status");
        assert_eq!(health.check(), Err(why.clone()));
        tokio::time::sleep(std::time::Duration::from_secs(61)).await;
        assert_eq!(
            health.check(),
            Err(why),
            "the first end is the one reported"
        );
        assert_eq!(
            log.lines(),
            vec![
                "ERROR the Events worker panicked: computing a status: the agent cannot go on",
                "ERROR the HTTP endpoint ended: the agent cannot go on",
            ]
        );
    }

    /// A one-shot reader's end: its tasks stop as the agent does, with no ERROR line (the
    /// reconciler sees the kernel's stream close under it).
    #[tokio::test(start_paused = true)]
    async fn an_end_while_stopping_is_no_failure() {
        let (log, _g) = crate::testlog::capture(tracing::Level::ERROR);
        let mut tasks = Tasks::default();
        let health = tasks.health();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn("reconciler", async move {
            let _ = rx.await;
            let _ = done_tx.send(());
        });
        tasks.stop();
        drop(tx);
        done.await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        assert_eq!(health.check(), Ok(()));
        assert!(log.lines().is_empty(), "{:?}", log.lines());
    }
}
