//! The writer against kube's mock service, on paused time: exact requests, and what each
//! answer does.
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::*;
use crate::kube::testkit::{api::*, NAME, NS, UID};

fn cfg() -> StatusConfig {
    StatusConfig {
        backoff_seed: Some(7),
        ..StatusConfig::new("node-1", super::super::StatusMode::Conditions)
    }
}

fn job(n: u32) -> WriteJob {
    let body = json!({
        "metadata": {"uid": UID},
        "status": {"conditions": [{"type": "observer.dev/ContainersAlive", "status": "False",
                                   "message": format!("change {n}")}]}
    });
    WriteJob {
        namespace: NS.into(),
        name: NAME.into(),
        uid: crate::model::PodUid::parse(UID).unwrap(),
        body: Arc::new(body.clone()),
        desired: Arc::new(body),
        observed_at: Instant::now(),
        priority: crate::runner::Priority::Normal,
    }
}

async fn finish(w: &mut StatusWriter) -> WriteDone {
    tokio::time::timeout(Duration::from_secs(600), w.next())
        .await
        .expect("a write finished")
}

#[tokio::test(start_paused = true)]
async fn the_patch_is_a_strategic_merge_on_the_status_subresource() {
    let (client, handle) = client();
    let seen = serve(handle, vec![ok_pod()]);
    let mut w = StatusWriter::new(client, &cfg());
    w.submit(job(1));
    let done = finish(&mut w).await;
    assert!(matches!(
        done.output.unwrap().1,
        WriteOutcome::Written { .. }
    ));
    let s = seen.lock().unwrap()[0].clone();
    assert_eq!(s.method, http::Method::PATCH);
    assert_eq!(s.path, "/api/v1/namespaces/default/pods/web/status");
    assert_eq!(s.query, "&fieldManager=observer");
    assert_eq!(s.content_type, "application/strategic-merge-patch+json");
    // The body parses as a Pod: the UID precondition and the condition, nothing else.
    let pod: Pod = serde_json::from_value(s.body.clone()).unwrap();
    assert_eq!(pod.metadata.uid.as_deref(), Some(UID));
    assert_eq!(
        pod.metadata.resource_version, None,
        "no resourceVersion precondition"
    );
    let conds = pod.status.unwrap().conditions.unwrap();
    assert_eq!(conds[0].type_, "observer.dev/ContainersAlive");
    assert!(w.is_idle());
}

async fn one_answer_then_quiet(reply: Reply) -> (WriteOutcome, usize, bool) {
    let (client, handle) = client();
    let seen = serve(handle, vec![reply]);
    let mut w = StatusWriter::new(client, &cfg());
    w.submit(job(1));
    let done = finish(&mut w).await;
    let idle = w.is_idle();
    // Nothing more is sent for the pod, however long we wait.
    let n = wait_for(&seen, 2, Duration::from_secs(300)).await.len();
    (done.output.unwrap().1, n, idle)
}

#[tokio::test(start_paused = true)]
async fn not_found_drops_the_pods_work() {
    let (outcome, requests, idle) = one_answer_then_quiet(status(404, "NotFound")).await;
    assert!(matches!(outcome, WriteOutcome::Gone), "{outcome:?}");
    assert_eq!((requests, idle), (1, true));
}

#[tokio::test(start_paused = true)]
async fn a_uid_conflict_drops_the_pods_work() {
    let (outcome, requests, idle) = one_answer_then_quiet(status(409, "Conflict")).await;
    assert!(matches!(outcome, WriteOutcome::Conflict), "{outcome:?}");
    assert_eq!((requests, idle), (1, true));
}

#[tokio::test(start_paused = true)]
async fn an_invalid_patch_is_not_sent_again() {
    let (outcome, requests, idle) = one_answer_then_quiet(status(422, "Invalid")).await;
    assert!(
        matches!(&outcome, WriteOutcome::Rejected(KubeError::Api { code: 422, message, .. }) if message.contains("Invalid")),
        "{outcome:?}"
    );
    assert_eq!((requests, idle), (1, true));
}

/// Drives the writer until a write succeeds; returns every request the server saw.
async fn until_written(
    w: &mut StatusWriter,
    seen: &Arc<std::sync::Mutex<Vec<Seen>>>,
) -> (Vec<Seen>, Vec<u32>) {
    let mut failures = Vec::new();
    loop {
        let done = finish(w).await;
        failures.push(done.failures);
        if matches!(
            done.output.as_ref().unwrap().1,
            WriteOutcome::Written { .. }
        ) {
            return (seen.lock().unwrap().clone(), failures);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn too_many_requests_waits_for_retry_after() {
    let (client, handle) = client();
    let seen = serve(handle, vec![Reply::TooMany(7)]);
    let mut w = StatusWriter::new(client, &cfg());
    w.submit(job(1));
    let (s, failures) = until_written(&mut w, &seen).await;
    assert_eq!(s.len(), 2);
    assert_eq!(failures, [1, 0]);
    let gap = s[1].at - s[0].at;
    assert!(gap >= Duration::from_secs(7), "retried after {gap:?}");
    assert!(
        gap < Duration::from_secs(8),
        "not much later either: {gap:?}"
    );
    assert_eq!(s[1].body, s[0].body, "the same patch again");
}

#[tokio::test(start_paused = true)]
async fn server_errors_retry_with_bounded_jittered_back_off() {
    let (client, handle) = client();
    let errors = vec![
        status(500, "InternalError"),
        status(503, "ServiceUnavailable"),
        status(500, "InternalError"),
    ];
    let seen = serve(handle, errors);
    let mut c = cfg();
    c.backoff_initial = Duration::from_millis(200);
    c.backoff_max = Duration::from_millis(500);
    let mut w = StatusWriter::new(client, &c);
    w.submit(job(1));
    let (s, failures) = until_written(&mut w, &seen).await;
    assert_eq!(failures, [1, 2, 3, 0]);
    let gaps: Vec<Duration> = s.windows(2).map(|p| p[1].at - p[0].at).collect();
    // Ceilings 200, 400, then capped at 500 ms; each drawn from [c/2, c].
    for (gap, ceiling) in gaps.iter().zip([200u64, 400, 500]) {
        let c = Duration::from_millis(ceiling);
        assert!(
            *gap >= c / 2 && *gap <= c,
            "gap {gap:?} outside [{:?}, {c:?}]",
            c / 2
        );
    }
    assert_eq!(w.stats().retries, 3);
}

#[tokio::test(start_paused = true)]
async fn a_server_that_never_answers_is_timed_out_and_retried() {
    let (client, handle) = client();
    let seen = serve(handle, vec![Reply::Hang]);
    let c = cfg();
    let mut w = StatusWriter::new(client, &c);
    w.submit(job(1));
    let first = finish(&mut w).await;
    assert!(
        matches!(
            first.output.as_ref().unwrap().1,
            WriteOutcome::Failed(KubeError::Timeout(_))
        ),
        "{:?}",
        first.output
    );
    let (s, _) = until_written(&mut w, &seen).await;
    assert_eq!(s.len(), 2);
    let gap = s[1].at - s[0].at;
    assert!(
        gap >= c.request_timeout && gap <= c.request_timeout + c.backoff_initial,
        "{gap:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_burst_while_a_write_is_in_flight_folds_into_one_follow_up_with_the_newest() {
    let (client, handle) = client();
    let seen = serve(handle, vec![]);
    let mut w = StatusWriter::new(client, &cfg());
    w.submit(job(0));
    for n in 1..=100 {
        w.submit(job(n));
    }
    finish(&mut w).await;
    finish(&mut w).await;
    assert!(w.is_idle());
    let s = wait_for(&seen, 3, Duration::from_secs(60)).await;
    assert_eq!(s.len(), 2, "one in flight, one follow-up");
    let msg = |i: usize| s[i].body["status"]["conditions"][0]["message"].clone();
    assert_eq!((msg(0), msg(1)), (json!("change 0"), json!("change 100")));
    assert_eq!(w.stats().superseded, 99);
}

#[tokio::test(start_paused = true)]
async fn forget_drops_a_pending_retry() {
    let (client, handle) = client();
    let seen = serve(handle, vec![status(500, "InternalError")]);
    let mut w = StatusWriter::new(client, &cfg());
    w.submit(job(1));
    finish(&mut w).await;
    assert!(
        w.is_busy(&crate::model::PodUid::parse(UID).unwrap()),
        "waiting to retry"
    );
    w.forget(&crate::model::PodUid::parse(UID).unwrap());
    assert!(w.is_idle());
    assert_eq!(wait_for(&seen, 2, Duration::from_secs(60)).await.len(), 1);
}
