//! The writer: status patches through the per-key [`Runner`], one key per pod.
//!
//! - The latest status of a pod wins; one request in flight per pod; states that arrive while a
//!   request is in flight fold into one follow-up (a burst of changes is at most two writes, one
//!   when the agent hands them over together).
//! - 404 (the pod is gone) and 409 (its UID precondition failed: the name now belongs to a new
//!   pod) drop the pod's work. 400 and 422 (the server refuses the patch itself) are dropped and
//!   logged: sending it again cannot help.
//! - At most `max_concurrent_writes` requests at once (what the agent asks of the API server in a
//!   burst is bounded); past that, a gated pod's first death goes first, then other pods' first
//!   deaths, then the rest (restarts, details), each in the order they came.
//! - 429 waits at least its `Retry-After`; 5xx, transport errors and a server that does not
//!   answer within the per-request timeout are retried after the pod's jittered back-off.
use std::{sync::Arc, time::Duration};

use ::kube::{
    api::{Patch, PatchParams},
    core::Request,
    Client,
};
use http::StatusCode;
use serde_json::Value;
use tokio::time::Instant;

use super::{patch::CONTENT_TYPE, StatusConfig};
use crate::kube::{
    transport::{api_message, Answer, Transport},
    KubeError,
};
use crate::{
    model::PodUid,
    runner::{Finished, Priority, Runner, RunnerConfig, Step, Then},
};

/// One status patch for one pod.
#[derive(Clone, Debug)]
pub struct WriteJob {
    pub namespace: String,
    pub name: String,
    pub uid: PodUid,
    /// The strategic merge patch, UID precondition included.
    pub body: Arc<Value>,
    /// What the patch makes true, normalised: remembered as written once it succeeds.
    pub desired: Arc<Value>,
    /// When the agent observed the change that led to this write (latency from there).
    pub observed_at: Instant,
    /// Where it goes among the writes waiting for a slot: a gated pod's first death first.
    pub priority: Priority,
}

/// How a write ended.
#[derive(Debug)]
pub enum WriteOutcome {
    /// 2xx: the API has it. `sent_at`: when the request left.
    Written { sent_at: Instant },
    /// 404: the pod is gone.
    Gone,
    /// 409: the UID precondition failed (a new pod has the name).
    Conflict,
    /// 400 / 422: the server refuses this patch; not retried.
    Rejected(KubeError),
    /// 429: retried after the server's Retry-After.
    Throttled(Duration),
    /// 5xx, 401/403, transport, timeout: retried with back-off.
    Failed(KubeError),
}

impl WriteOutcome {
    pub fn then(&self) -> Then {
        match self {
            WriteOutcome::Written { .. } => Then::Done,
            WriteOutcome::Gone | WriteOutcome::Conflict | WriteOutcome::Rejected(_) => Then::Forget,
            WriteOutcome::Throttled(d) => Then::RetryAfter(*d),
            WriteOutcome::Failed(_) => Then::Retry,
        }
    }
}

/// Retry-After when a 429 names none (kube's client-go does the same: 1 s).
pub(crate) const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

pub(crate) type WriteDone = Finished<PodUid, (WriteJob, WriteOutcome)>;

/// The pod status writer; driven by its owner's loop like the [`Runner`] it wraps.
pub(crate) struct StatusWriter {
    runner: Runner<PodUid, WriteJob, (WriteJob, WriteOutcome)>,
}

impl StatusWriter {
    pub(crate) fn new(client: Client, cfg: &StatusConfig) -> Self {
        let timeout = cfg.request_timeout;
        let params = PatchParams {
            field_manager: Some(cfg.reporter.clone()),
            ..Default::default()
        };
        let runner_cfg = RunnerConfig {
            max_concurrent: cfg.max_concurrent_writes,
            backoff_initial: cfg.backoff_initial,
            backoff_max: cfg.backoff_max,
            seed: cfg.backoff_seed,
        };
        let transport = Transport(client);
        let runner = Runner::new(runner_cfg, move |_uid: PodUid, job: WriteJob| {
            let transport = transport.clone();
            let params = params.clone();
            async move {
                let outcome = send(&transport, &params, &job, timeout).await;
                let then = outcome.then();
                Step {
                    output: (job, outcome),
                    then,
                }
            }
        });
        Self { runner }
    }

    /// The pod's newest patch: it runs as soon as the pod has no request in flight, is not
    /// waiting out a back-off, and no write of a higher priority waits for a slot.
    pub(crate) fn submit(&mut self, job: WriteJob) {
        let priority = job.priority;
        self.runner.schedule_at(job.uid, job, priority);
    }

    /// Drops the pod's pending work and back-off (a request in flight still finishes).
    pub(crate) fn forget(&mut self, uid: &PodUid) {
        self.runner.forget(uid);
    }

    /// The next finished request. Cancel-safe; pending forever while idle.
    pub(crate) async fn next(&mut self) -> WriteDone {
        self.runner.next().await
    }

    /// Ends every back-off now (the flush at shutdown).
    pub(crate) fn expedite(&mut self) {
        self.runner.expedite();
    }

    pub(crate) fn is_idle(&self) -> bool {
        self.runner.is_idle()
    }

    #[cfg(test)]
    pub(crate) fn is_busy(&self, uid: &PodUid) -> bool {
        self.runner.is_busy(uid)
    }

    /// Pods with a write pending, in flight or waiting to retry.
    pub(crate) fn pending(&self) -> usize {
        self.runner.keys()
    }

    #[cfg(test)]
    pub(crate) fn stats(&self) -> crate::runner::RunnerStats {
        self.runner.stats()
    }
}

/// `PATCH /api/v1/namespaces/{ns}/pods/{name}/status`, strategic merge, within `timeout`
/// (connect, headers and body: a server that hangs anywhere is a timeout).
pub async fn send(
    transport: &Transport,
    params: &PatchParams,
    job: &WriteJob,
    timeout: Duration,
) -> WriteOutcome {
    let body = match serde_json::to_vec(&*job.body) {
        Ok(b) => b,
        Err(e) => return WriteOutcome::Rejected(e.into()),
    };
    send_patch(transport, params, &job.namespace, &job.name, body, timeout).await
}

/// [`send`] with the patch's body already encoded.
pub(crate) async fn send_patch(
    transport: &Transport,
    params: &PatchParams,
    namespace: &str,
    name: &str,
    body: Vec<u8>,
    timeout: Duration,
) -> WriteOutcome {
    let request = match build(params, namespace, name, body) {
        Ok(r) => r,
        Err(e) => return WriteOutcome::Rejected(e),
    };
    let sent_at = Instant::now();
    let Answer {
        status,
        retry_after,
        body: bytes,
    } = match tokio::time::timeout(timeout, transport.exchange(request)).await {
        Err(_) => return WriteOutcome::Failed(KubeError::Timeout(timeout)),
        Ok(Err(e)) => return WriteOutcome::Failed(e),
        Ok(Ok(r)) => r,
    };
    if status.is_success() {
        return WriteOutcome::Written { sent_at };
    }
    let message = api_message(&bytes);
    let err = KubeError::Api {
        code: status.as_u16(),
        message,
        retry_after,
    };
    match status {
        StatusCode::NOT_FOUND => WriteOutcome::Gone,
        StatusCode::CONFLICT => WriteOutcome::Conflict,
        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => WriteOutcome::Rejected(err),
        StatusCode::TOO_MANY_REQUESTS => {
            WriteOutcome::Throttled(retry_after.unwrap_or(DEFAULT_RETRY_AFTER))
        }
        // A 503 with Retry-After is the server asking too.
        s if s == StatusCode::SERVICE_UNAVAILABLE && retry_after.is_some() => {
            WriteOutcome::Throttled(retry_after.unwrap_or(DEFAULT_RETRY_AFTER))
        }
        _ => WriteOutcome::Failed(err),
    }
}

/// The path and query of a pod's status subresource, as kube builds them.
pub(crate) fn status_path(
    params: &PatchParams,
    namespace: &str,
    name: &str,
) -> Result<String, KubeError> {
    Ok(build(params, namespace, name, Vec::new())?
        .uri()
        .to_string())
}

fn build(
    params: &PatchParams,
    namespace: &str,
    name: &str,
    body: Vec<u8>,
) -> Result<http::Request<Vec<u8>>, KubeError> {
    let url = format!("/api/v1/namespaces/{namespace}/pods");
    // kube's URL, query and headers; the body as given.
    let mut req =
        Request::new(url).patch_subresource("status", name, params, &Patch::Strategic(()))?;
    *req.body_mut() = body;
    debug_assert_eq!(
        req.headers()
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.as_bytes()),
        Some(CONTENT_TYPE.as_bytes())
    );
    req.headers_mut().insert(
        http::header::USER_AGENT,
        http::HeaderValue::from_static("observer"),
    );
    Ok(req)
}

#[cfg(test)]
mod tests;
