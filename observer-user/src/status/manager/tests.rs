//! The manager end to end at the HTTP level: reflector, writer and events against the stand-in
//! API server, on paused time.
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodStatus,
};
use k8s_openapi::api::events::v1::Event as K8sEvent;

use super::{listing::UNLISTED_GRACE, testkit::*, *};
use crate::kube::testkit::{
    api::{self, status, Reply, Seen},
    server::{self, Log},
    *,
};
use crate::reconcile::{ContainerPhase::Running, ContainerView, SCOPE_GRACE};
use crate::status::conditions::observer_conditions;

async fn start(mode: StatusMode, pods: Vec<Pod>, patches: Vec<Reply>) -> (Handles, Log) {
    start_on(mode, pods, patches, crate::model::system_clock()).await
}

async fn start_on(
    mode: StatusMode,
    pods: Vec<Pod>,
    patches: Vec<Reply>,
    clock: crate::model::SharedClock,
) -> (Handles, Log) {
    start_holding(mode, pods, patches, clock, Vec::new()).await
}

/// A manager on an API that holds `events` already (an earlier agent's).
async fn start_holding(
    mode: StatusMode,
    pods: Vec<Pod>,
    patches: Vec<Reply>,
    clock: crate::model::SharedClock,
    events: Vec<Value>,
) -> (Handles, Log) {
    let (client, handle) = api::client();
    let log = server::serve_holding(handle, pods, patches, events);
    let mut cfg = StatusConfig::new("node-1", mode);
    cfg.backoff_seed = Some(1);
    let reconcile = ReconcileHandle::detached();
    let (m, h) = StatusManager::new(client, cfg, reconcile.clone());
    tokio::spawn(m.with_clock(clock).run());
    tokio::time::timeout(Duration::from_secs(5), h.pods().ready())
        .await
        .expect("the reflector listed");
    (
        Handles {
            status: h,
            reconcile,
        },
        log,
    )
}

fn killed_now(mut c: ContainerView, pid: u32, comm: &str, init: bool) -> ContainerView {
    let mut o = oom(&c, pid, comm, init);
    o.time = SystemTime::now();
    c.last_oom = Some(o);
    c.oom_kills += 1;
    c
}

fn parsed(s: &Seen) -> Pod {
    serde_json::from_value(s.body.clone()).expect("the body parses as a Pod")
}

#[tokio::test(start_paused = true)]
async fn conditions_mode_patches_the_alive_condition_and_nothing_of_kubelets() {
    let (h, log) = start(StatusMode::Conditions, vec![app_pod()], vec![]).await;
    h.observe(&view(vec![cv("app", 0, Running)]));
    settle().await;
    h.observe(&view(vec![died_now("app", 0, 137, "OOMKilled")]));
    settle().await;
    let p = server::patches(&log);
    assert_eq!(p.len(), 2, "{p:#?}");
    for s in &p {
        assert_eq!(s.path, "/api/v1/namespaces/default/pods/web/status");
        assert_eq!(s.content_type, "application/strategic-merge-patch+json");
        let pod = parsed(s);
        assert_eq!(pod.metadata.uid.as_deref(), Some(UID));
        let types: Vec<String> = pod
            .status
            .unwrap()
            .conditions
            .unwrap()
            .into_iter()
            .map(|c| c.type_)
            .collect();
        assert_eq!(
            types,
            ["observer.dev/ContainersAlive"],
            "only the observer's type"
        );
    }
    let alive = |i: usize| {
        condition(&p[i].body, "observer.dev/ContainersAlive")
            .unwrap()
            .clone()
    };
    assert_eq!(alive(0)["status"], "True");
    assert_eq!(alive(1)["status"], "False");
    assert_eq!(alive(1)["reason"], "ContainerDied");
    assert_eq!(StatusStats::get(&h.stats().writes), 2);
    // The death is an Event too.
    let e = server::events(&log);
    assert_eq!(e.len(), 1);
    let ev: K8sEvent = serde_json::from_value(e[0].body.clone()).unwrap();
    assert_eq!(ev.reason.as_deref(), Some("ContainerDiedOOMKilled"));
    assert_eq!(
        ev.regarding.unwrap().field_path.as_deref(),
        Some("spec.containers{app}")
    );
}

#[tokio::test(start_paused = true)]
async fn no_write_when_nothing_changed() {
    let (h, log) = start(StatusMode::Conditions, vec![app_pod()], vec![]).await;
    let v = view(vec![cv("app", 0, Running)]);
    h.observe(&v);
    settle().await;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(3)).await;
        h.observe(&v);
    }
    settle().await;
    assert_eq!(server::patches(&log).len(), 1);
    assert_eq!(StatusStats::get(&h.stats().unchanged), 5);
}

#[tokio::test(start_paused = true)]
async fn no_write_when_the_api_already_says_so() {
    // Written by an earlier run of the agent: same status, same second.
    let mut p = app_pod();
    p.status = Some(PodStatus {
        conditions: Some(vec![observer_conditions(
            Some(&app_pod()),
            &view(vec![cv("app", 0, Running)]),
            &[],
            &ConditionTypes::default(),
            SystemTime::now(),
        )
        .remove(0)]),
        ..Default::default()
    });
    let (h, log) = start(StatusMode::Conditions, vec![p], vec![]).await;
    h.observe(&view(vec![cv("app", 0, Running)]));
    settle().await;
    assert_eq!(server::patches(&log).len(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_100_changes_is_one_write_of_the_last() {
    let (h, log) = start(StatusMode::Conditions, vec![app_pod()], vec![]).await;
    for i in 0..100u32 {
        let v = if i % 2 == 0 {
            view(vec![cv("app", i, Running)])
        } else {
            view(vec![died_now("app", i, 1, "Error")])
        };
        h.observe(&v);
    }
    settle().await;
    let p = server::patches(&log);
    assert_eq!(p.len(), 1, "{p:#?}");
    let alive = condition(&p[0].body, "observer.dev/ContainersAlive").unwrap();
    assert_eq!(alive["status"], "False", "the last change (a death) wins");
    assert!(alive["message"].as_str().unwrap().contains("(restart 99)"));
    assert_eq!(
        StatusStats::get(&h.stats().observed),
        1,
        "the burst was taken as one change"
    );
}

#[tokio::test(start_paused = true)]
async fn a_recreated_pod_answers_409_and_gets_nothing_more() {
    let (h, log) = start(
        StatusMode::Conditions,
        vec![app_pod()],
        vec![status(409, "Conflict")],
    )
    .await;
    h.observe(&view(vec![cv("app", 0, Running)]));
    settle().await;
    h.observe(&view(vec![died_now("app", 0, 1, "Error")]));
    settle().await;
    let p = server::patches(&log);
    assert_eq!(p.len(), 1, "nothing after the conflict");
    assert_eq!(parsed(&p[0]).metadata.uid.as_deref(), Some(UID));
    assert_eq!(StatusStats::get(&h.stats().conflicts), 1);
}

#[tokio::test(start_paused = true)]
async fn a_pod_gone_from_the_api_is_dropped() {
    let (h, log) = start(
        StatusMode::Conditions,
        vec![app_pod()],
        vec![status(404, "NotFound")],
    )
    .await;
    h.observe(&view(vec![cv("app", 0, Running)]));
    settle().await;
    h.observe(&view(vec![died_now("app", 0, 1, "Error")]));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(server::patches(&log).len(), 1);
    assert_eq!(StatusStats::get(&h.stats().gone), 1);
}

#[tokio::test(start_paused = true)]
async fn a_view_of_a_pod_the_reflector_does_not_have_writes_nothing() {
    // The name now belongs to a pod with another UID.
    let mut other = app_pod();
    other.metadata.uid = Some("ffffffff-0000-4000-8000-000000000002".into());
    let (h, log) = start(StatusMode::Conditions, vec![other], vec![]).await;
    h.observe(&view(vec![cv("app", 0, Running)]));
    settle().await;
    assert!(server::patches(&log).is_empty());
    assert_eq!(StatusStats::get(&h.stats().waiting_for_pod), 1);
}

#[tokio::test(start_paused = true)]
async fn server_errors_are_retried_until_written() {
    let (h, log) = start(
        StatusMode::Conditions,
        vec![app_pod()],
        vec![status(500, "InternalError"), Reply::TooMany(2)],
    )
    .await;
    h.observe(&view(vec![cv("app", 0, Running)]));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let p = server::patches(&log);
    assert_eq!(p.len(), 3);
    assert!(
        p[2].at - p[1].at >= Duration::from_secs(2),
        "Retry-After honoured"
    );
    assert_eq!(p[0].body, p[2].body);
    let s = h.stats();
    assert_eq!(
        (
            StatusStats::get(&s.writes),
            StatusStats::get(&s.write_errors),
            StatusStats::get(&s.throttled)
        ),
        (1, 1, 1),
        "a 429 is throttled, not an error"
    );
}

#[tokio::test(start_paused = true)]
async fn oom_kill_of_a_child_sets_the_condition_and_names_the_victim_in_an_event() {
    let (h, log) = start(StatusMode::Conditions, vec![app_pod()], vec![]).await;
    h.observe(&view(vec![killed_now(
        cv("app", 0, Running),
        4100,
        "hog",
        false,
    )]));
    // The kill's Event waits for the kernel log's report (see the tests below); none comes.
    tokio::time::sleep(SCOPE_GRACE).await;
    settle().await;
    let p = server::patches(&log);
    let oom = condition(&p[0].body, "observer.dev/OOMKilled").expect("OOMKilled condition");
    assert_eq!(oom["status"], "True");
    assert_eq!(oom["reason"], "ProcessOOMKilled");
    let msg = oom["message"].as_str().unwrap();
    assert!(
        msg.contains("hog (pid 4100)") && msg.contains("limit 64Mi"),
        "{msg}"
    );
    // A kill does not make the container dead.
    let alive = condition(&p[0].body, "observer.dev/ContainersAlive").unwrap();
    assert_eq!(alive["status"], "True");
    let e = server::events(&log);
    assert_eq!(e.len(), 1);
    let ev: K8sEvent = serde_json::from_value(e[0].body.clone()).unwrap();
    assert_eq!(ev.reason.as_deref(), Some("ProcessOOMKilled"));
    assert!(ev.note.unwrap().contains("the container survived"));

    // A second victim: its own event, not a series of the first.
    h.observe(&view(vec![killed_now(
        cv("app", 0, Running),
        4200,
        "hog2",
        false,
    )]));
    tokio::time::sleep(SCOPE_GRACE).await;
    settle().await;
    let e = server::events(&log);
    assert_eq!(e.len(), 2);
    assert_eq!(e[1].method, http::Method::POST);
}

fn notes(log: &Log) -> Vec<String> {
    server::events(log)
        .iter()
        .map(|s| {
            let ev: K8sEvent = serde_json::from_value(s.body.clone()).expect("an Event");
            ev.note.unwrap_or_default()
        })
        .collect()
}

/// The kernel log's report of `c`'s last kill was read: the container's own 64 MiB limit.
fn reported(mut c: ContainerView) -> ContainerView {
    let o = c.last_oom.as_mut().expect("a kill");
    o.scope = crate::reconcile::OomScope::Container;
    o.limit_bytes = Some(64 << 20);
    o.source = crate::reconcile::Source::Kernel;
    c
}

#[tokio::test(start_paused = true)]
async fn a_kills_event_waits_for_its_report_and_names_the_scope() {
    let (h, log) = start(StatusMode::Conditions, vec![app_pod()], vec![]).await;
    let seen = killed_now(cv("app", 0, Running), 4100, "hog", false);
    h.observe(&view(vec![seen.clone()]));
    // Another pod's death meanwhile: its Event is not held behind the kill's.
    let mut other = view(vec![died_now("db", 0, 1, "Error")]);
    other.uid = PodUid::parse("0b0b0b0b-0b0b-4b0b-8b0b-0b0b0b0b0b0b").expect("a uid");
    other.name = "other".into();
    h.observe(&other);
    settle().await;
    let held = notes(&log);
    assert_eq!(held.len(), 1, "{held:#?}");
    assert!(
        held[0].contains("container db exited with code 1"),
        "{held:#?}"
    );
    // Nor is the status: the condition is written at once (unknown scope, for now).
    let p = server::patches(&log);
    let oom = condition(&p[0].body, "observer.dev/OOMKilled").expect("OOMKilled condition");
    assert_eq!(oom["status"], "True");

    // The report comes within the grace: the one Event names the container's limit.
    h.observe(&view(vec![reported(seen)]));
    settle().await;
    let n = notes(&log);
    assert_eq!(n.len(), 2, "{n:#?}");
    assert!(
        n[1].starts_with("container app hit its 64.0 MiB limit") && n[1].contains("hog (pid 4100)"),
        "{n:#?}"
    );
    // Past the grace nothing more is said of it.
    tokio::time::sleep(SCOPE_GRACE * 2).await;
    assert_eq!(notes(&log).len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_kill_whose_report_never_comes_is_published_unknown_after_the_grace() {
    let (h, log) = start(StatusMode::Conditions, vec![app_pod()], vec![]).await;
    let seen = killed_now(cv("app", 0, Running), 4100, "hog", false);
    h.observe(&view(vec![seen.clone()]));
    tokio::time::sleep(SCOPE_GRACE - Duration::from_millis(100)).await;
    assert!(notes(&log).is_empty(), "published before the grace ended");
    // Seen again meanwhile (another change of the pod): still one held kill.
    h.observe(&view(vec![seen.clone()]));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let n = notes(&log);
    assert_eq!(n.len(), 1, "{n:#?}");
    assert!(
        n[0].starts_with(
            "which limit was hit is unknown (the kernel log's report of this kill has not been read"
        ),
        "{n:#?}"
    );
    // A report that comes late changes the condition, not the Event already published.
    h.observe(&view(vec![reported(seen)]));
    settle().await;
    assert_eq!(notes(&log).len(), 1);
    let p = server::patches(&log);
    let last = p.last().expect("a patch");
    let msg = condition(&last.body, "observer.dev/OOMKilled").expect("OOMKilled")["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        msg.starts_with("container app hit its 64.0 MiB limit"),
        "{msg}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_held_kill_superseded_by_the_next_of_a_group_is_one_event() {
    let (h, log) = start(StatusMode::Conditions, vec![app_pod()], vec![]).await;
    // A group kill: the probes report the child, then the init, before the log's report.
    h.observe(&view(vec![killed_now(
        cv("app", 0, Running),
        4100,
        "hog",
        false,
    )]));
    settle().await;
    let init = killed_now(cv("app", 0, Running), 4000, "sh", true);
    h.observe(&view(vec![init.clone()]));
    settle().await;
    assert!(notes(&log).is_empty());
    h.observe(&view(vec![reported(init)]));
    settle().await;
    // The deadline of the superseded kill passes without a second Event (nor a busy loop:
    // paused time would never advance).
    tokio::time::sleep(SCOPE_GRACE * 2).await;
    let n = notes(&log);
    assert_eq!(n.len(), 1, "{n:#?}");
    assert!(
        n[0].contains("sh (pid 4000)") && n[0].starts_with("container app hit"),
        "{n:#?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_group_kill_is_one_event_whichever_member_the_view_shows() {
    use crate::kernel::oom_report::{Killed, OomReport};
    let (h, log) = start(StatusMode::Conditions, vec![app_pod()], vec![]).await;
    let killed = |pid: u32, comm: &str| Killed {
        pid,
        comm: comm.into(),
        ..Default::default()
    };
    let report = std::sync::Arc::new(OomReport {
        victim: Some(killed(4100, "hog")),
        group_cgroup: Some("/kubepods/burstable/pod/app".into()),
        members: vec![killed(4000, "sh")],
        ..Default::default()
    });
    let member = |pid: u32, comm: &str, init: bool| {
        let mut c = reported(killed_now(cv("app", 0, Running), pid, comm, init));
        let o = c.last_oom.as_mut().expect("a kill");
        o.group = true;
        o.report = Some(report.clone());
        c
    };
    h.observe(&view(vec![member(4100, "hog", false)]));
    settle().await;
    h.observe(&view(vec![member(4000, "sh", true)]));
    settle().await;
    let n = notes(&log);
    assert_eq!(n.len(), 1, "{n:#?}");
    assert!(n[0].contains("memory.oom.group): sh (pid 4000)"), "{n:#?}");
}

#[tokio::test(start_paused = true)]
async fn a_flush_waits_for_a_held_kill() {
    let (h, log) = start(StatusMode::Conditions, vec![app_pod()], vec![]).await;
    h.observe(&view(vec![killed_now(
        cv("app", 0, Running),
        4100,
        "hog",
        false,
    )]));
    settle().await;
    let report = h.flush(SCOPE_GRACE * 2).await;
    assert_eq!(report.events_pending, 0);
    assert_eq!(
        notes(&log).len(),
        1,
        "the held kill was published before the flush ended"
    );
}

#[tokio::test(start_paused = true)]
async fn history_from_before_the_start_is_not_published_again() {
    let (h, log) = start(StatusMode::Conditions, vec![app_pod()], vec![]).await;
    // testkit's times are in 2023: before the manager started.
    let mut old = exited("app", 0, 137, "OOMKilled");
    old.last_oom = Some(oom(&old, 4000, "app", true));
    h.observe(&view(vec![old, cv("app", 1, Running)]));
    settle().await;
    assert!(server::events(&log).is_empty());
    assert_eq!(
        server::patches(&log).len(),
        1,
        "the conditions are still written"
    );
}

/// The app pod as an earlier agent left it: its ContainersAlive True since `since`.
fn alive_since(since: SystemTime) -> Pod {
    alive_as("True", since)
}

/// The app pod as an earlier agent left it: its ContainersAlive `status` since `since`.
fn alive_as(status: &str, since: SystemTime) -> Pod {
    let mut p = app_pod();
    p.status = Some(PodStatus {
        conditions: Some(vec![k8s_openapi::api::core::v1::PodCondition {
            type_: "observer.dev/ContainersAlive".into(),
            status: status.into(),
            last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                since.try_into().unwrap(),
            )),
            ..Default::default()
        }]),
        ..Default::default()
    });
    p
}

#[tokio::test(start_paused = true)]
async fn a_death_while_no_agent_ran_is_told_late_once_and_says_so() {
    // The container died (2023, before this manager's start) after the condition went True: no
    // agent was running to write False. Its record is still in the runtime.
    let dead = exited("app", 0, 137, "Error");
    let since = dead.finished_at.unwrap() - Duration::from_secs(60);
    let finished = dead
        .finished_at
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (h, log) = start(StatusMode::Conditions, vec![alive_since(since)], vec![]).await;
    h.observe(&view(vec![dead.clone(), cv("app", 1, Running)]));
    settle().await;
    h.observe(&view(vec![dead, cv("app", 1, Running)]));
    settle().await;
    let events = server::events(&log);
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0].body["reason"], "ContainerDiedError");
    assert_eq!(
        events[0].body["action"],
        format!("Late/Signal/9@{finished}")
    );
    let note = events[0].body["note"].as_str().unwrap();
    assert!(
        note.contains("told late") && note.contains("not running when it died"),
        "{note}"
    );

    // That agent is killed again before anything else changes, and the next one finds the same
    // record and the same True: the Event it finds says the death was told.
    let told = events[0].body.clone();
    let dead = exited("app", 0, 137, "Error");
    let (h, log) = start_holding(
        StatusMode::Conditions,
        vec![alive_since(since)],
        vec![],
        crate::model::system_clock(),
        vec![told.clone()],
    )
    .await;
    h.observe(&view(vec![dead.clone(), cv("app", 1, Running)]));
    settle().await;
    assert!(
        server::events(&log).is_empty(),
        "told again: {:#?}",
        server::events(&log)
    );
    assert_eq!(
        h.event_stats()
            .already_told
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );

    // An Event of another container, of another death told late, or a live tell of a later
    // death of this container (published before the late check ran) does not count.
    for other in [
        {
            let mut e = told.clone();
            e["regarding"]["fieldPath"] = "spec.containers{sidecar}".into();
            e
        },
        {
            let mut e = told.clone();
            e["action"] = format!("Late/Signal/9@{}", finished - 5).into();
            e
        },
        {
            let mut e = told.clone();
            e["action"] = "Signal/9".into();
            // Published since this agent started.
            e["eventTime"] = micro(SystemTime::now() + Duration::from_secs(2));
            e
        },
    ] {
        let (h, log) = start_holding(
            StatusMode::Conditions,
            vec![alive_since(since)],
            vec![],
            crate::model::system_clock(),
            vec![other],
        )
        .await;
        h.observe(&view(vec![dead.clone(), cv("app", 1, Running)]));
        settle().await;
        assert_eq!(server::events(&log).len(), 1, "not told");
    }
}

#[tokio::test(start_paused = true)]
async fn a_death_an_earlier_agent_told_is_not_told_again() {
    // The condition moved after the death (False at it, True again at the restart): told. The
    // API's whole seconds: a restart within the death's second has the death's second.
    let died = exited("app", 0, 137, "Error").finished_at.unwrap();
    for (finished, since) in [
        (died, died + Duration::from_secs(2)),
        (died + Duration::from_millis(400), died),
    ] {
        let mut dead = exited("app", 0, 137, "Error");
        dead.finished_at = Some(finished);
        let (h, log) = start(StatusMode::Conditions, vec![alive_since(since)], vec![]).await;
        h.observe(&view(vec![dead, cv("app", 1, Running)]));
        settle().await;
        assert!(server::events(&log).is_empty(), "{finished:?} {since:?}");
    }
}

/// A time as the API keeps an Event's (microseconds).
fn micro(at: SystemTime) -> Value {
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        at.try_into().unwrap(),
    ))
    .unwrap()
}

/// An earlier agent's death Event for the app container, as the API keeps it.
fn live_event(action: &str, at: SystemTime) -> Value {
    serde_json::json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "earlier", "namespace": "default"},
        "eventTime": micro(at),
        "action": action,
        "reason": "ContainerDiedError",
        "reportingController": "observer",
        "reportingInstance": "node-1",
        "regarding": {"apiVersion": "v1", "kind": "Pod", "name": "web", "namespace": "default",
                      "fieldPath": "spec.containers{app}"},
    })
}

/// An agent started where the API's ContainersAlive stood False since `false_since` and the API
/// holds `held` Events, shown the app container's `dead` instance and its running successor:
/// the Events it sent.
async fn started_beside_false(
    false_since: SystemTime,
    held: Vec<Value>,
    dead: ContainerView,
) -> (Handles, Vec<Seen>) {
    let (h, log) = start_holding(
        StatusMode::Conditions,
        vec![alive_as("False", false_since)],
        vec![],
        crate::model::system_clock(),
        held,
    )
    .await;
    h.observe(&view(vec![dead, cv("app", 1, Running)]));
    settle().await;
    (h, server::events(&log))
}

/// An earlier agent wrote the death's False, then was stopped (SIGKILL) before its Event went
/// out: the next agent finds the False and no Event about the death, and tells it late. An
/// Event of the earlier agent about that death (live, between the death and this start) is
/// the death told.
#[tokio::test(start_paused = true)]
async fn a_death_whose_event_an_earlier_agent_never_sent_is_told_late() {
    let finished = SystemTime::now() - Duration::from_secs(30);
    let mut dead = exited("app", 0, 137, "Error");
    dead.finished_at = Some(finished);
    // The runtime's record: an exit code, no signal (the kernel's Event said `Signal/9`).
    dead.signal = None;
    let secs = finished
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let false_since = finished + Duration::from_millis(30);
    let run = |held: Vec<Value>, dead: ContainerView| started_beside_false(false_since, held, dead);

    let (_h, told) = run(vec![], dead.clone()).await;
    assert_eq!(told.len(), 1, "{told:#?}");
    assert_eq!(told[0].body["action"], format!("Late/Exit/137@{secs}"));
    let note = told[0].body["note"].as_str().unwrap();
    assert!(
        note.contains("told late") && note.contains("stopped before its Event went out"),
        "{note}"
    );

    // Told already: live (the Event's time in the death's second or after, before this start),
    // as a series whose last observation is the death, or late by an agent in between.
    let series = {
        let mut e = live_event("Signal/9", finished - Duration::from_secs(300));
        e["series"] = serde_json::json!({
            "count": 3,
            "lastObservedTime": micro(finished + Duration::from_millis(5)),
        });
        e
    };
    for held in [
        live_event("Signal/9", finished + Duration::from_millis(20)),
        live_event("Exit/137", finished + Duration::from_millis(20)),
        live_event("Signal/9", finished - Duration::from_millis(500)),
        series,
        told[0].body.clone(),
    ] {
        let (h, told) = run(vec![held.clone()], dead.clone()).await;
        assert!(told.is_empty(), "told again beside {held:#}: {told:#?}");
        assert_eq!(
            h.event_stats()
                .already_told
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
    }

    // Not this death's: an earlier death's Event, another exit, a tell since this start (a
    // later death), another container.
    let other_container = {
        let mut e = live_event("Signal/9", finished + Duration::from_millis(20));
        e["regarding"]["fieldPath"] = "spec.containers{sidecar}".into();
        e
    };
    for held in [
        live_event("Signal/9", finished - Duration::from_secs(40)),
        live_event("Exit/1", finished + Duration::from_millis(20)),
        live_event("Signal/15", finished + Duration::from_millis(20)),
        live_event("Signal/9", SystemTime::now() + Duration::from_secs(1)),
        other_container,
    ] {
        let (_h, told) = run(vec![held.clone()], dead.clone()).await;
        assert_eq!(told.len(), 1, "not told beside {held:#}");
    }

    // Whether it was told cannot be read (the list refused): not told on a guess, counted.
    let (h, told) = run(vec![serde_json::json!({"refuse": 403})], dead.clone()).await;
    assert!(told.is_empty(), "{told:#?}");
    assert_eq!(
        h.event_stats()
            .unknown_not_told
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );

    // Older than an Event is ever sent again: told then, or lost with its agent's queue long
    // ago. Not looked for.
    let mut old = dead.clone();
    old.finished_at = Some(SystemTime::now() - Duration::from_secs(3600));
    let (h, told) = run(vec![], old).await;
    assert!(told.is_empty(), "{told:#?}");
    assert_eq!(
        h.event_stats()
            .already_told
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

/// containerd restarted after a container's task was gone records exit 255 `Unknown`, finished
/// at its own restart. An earlier agent told the real death (`Signal/9`, a minute before that
/// "finish"): the agent started since finds that Event and does not tell the death again; an
/// Event before the instance started (its predecessor's death) does not count.
#[tokio::test(start_paused = true)]
async fn a_death_the_runtime_lost_the_exit_of_is_not_told_again() {
    let restarted = SystemTime::now() - Duration::from_secs(20);
    let died = restarted - Duration::from_secs(60);
    let mut dead = exited("app", 0, 255, "Unknown");
    dead.signal = None;
    dead.kernel_seen = false;
    // As the reconciler makes it from the runtime's record alone.
    dead.exit_source = Some(crate::reconcile::Source::Runtime);
    dead.started_at = Some(died - Duration::from_secs(30));
    dead.finished_at = Some(restarted);
    let run = |held: Vec<Value>| {
        started_beside_false(died + Duration::from_millis(30), held, dead.clone())
    };
    let (h, told) = run(vec![live_event(
        "Signal/9",
        died + Duration::from_millis(20),
    )])
    .await;
    assert!(told.is_empty(), "told again: {told:#?}");
    assert_eq!(
        h.event_stats()
            .already_told
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // The predecessor's death, before this instance started: this one's is untold.
    let (_h, told) = run(vec![live_event("Signal/9", died - Duration::from_secs(40))]).await;
    assert_eq!(told.len(), 1, "{told:#?}");
    let note = told[0].body["note"].as_str().unwrap();
    assert!(note.contains("exited with code 255"), "{note}");
}

/// A death since the start that the kernel did not report (before the probes were attached,
/// or lost with a full ring) is told from the runtime's record, and says so.
#[tokio::test(start_paused = true)]
async fn a_death_only_the_runtime_saw_is_told_and_says_so() {
    let (h, log) = start(StatusMode::Conditions, vec![app_pod()], vec![]).await;
    let mut dead = died_now("app", 0, 1, "Error");
    dead.kernel_seen = false;
    h.observe(&view(vec![dead.clone()]));
    settle().await;
    h.observe(&view(vec![dead.clone(), cv("app", 1, Running)]));
    settle().await;
    let events = server::events(&log);
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0].body["action"], "Exit/1");
    let note = events[0].body["note"].as_str().unwrap();
    assert!(note.contains("seen in the runtime's record"), "{note}");

    // Without a finish, the runtime's record is no news (it would be at every start); a start
    // that failed (its start the epoch) ran nothing, and kubelet's Event tells it.
    let mut no_finish = dead.clone();
    no_finish.finished_at = None;
    let mut start_error = dead;
    start_error.started_at = Some(std::time::UNIX_EPOCH);
    start_error.exit_code = Some(128);
    start_error.reason = Some("StartError".into());
    for c in [no_finish, start_error] {
        let (h, log) = start(StatusMode::Conditions, vec![app_pod()], vec![]).await;
        h.observe(&view(vec![c.clone()]));
        settle().await;
        assert!(server::events(&log).is_empty(), "told: {c:?}");
    }
}

/// The reflector's copy can lag behind what the agent wrote (here it never changes: the
/// stand-in's pods are fixed, as a watch that broke while the API server was away leaves them).
/// A death's False written since must not read as "the API already says True" when the
/// container runs again.
#[tokio::test(start_paused = true)]
async fn a_stale_reflector_copy_does_not_hide_the_way_back_to_true() {
    let since = SystemTime::now() - Duration::from_secs(600);
    let (h, log) = start(StatusMode::Conditions, vec![alive_since(since)], vec![]).await;
    h.observe(&view(vec![cv("app", 0, Running)]));
    settle().await;
    // The condition's reason and message as the agent words them, at most.
    let first = server::patches(&log).len();
    assert!(first <= 1);
    h.observe(&view(vec![died_now("app", 0, 137, "Error")]));
    settle().await;
    h.observe(&view(vec![
        died_now("app", 0, 137, "Error"),
        cv("app", 1, Running),
    ]));
    settle().await;
    let p = server::patches(&log);
    let alive: Vec<&Value> = p[first..]
        .iter()
        .filter_map(|s| condition(&s.body, "observer.dev/ContainersAlive"))
        .map(|c| &c["status"])
        .collect();
    assert_eq!(alive, ["False", "True"], "{p:#?}");
}

/// The manager's times come from the injected wall clock (read once) and tokio's monotonic
/// clock: a fake clock and paused time make them exact, and decide what is history.
#[tokio::test(start_paused = true)]
async fn transition_times_and_history_follow_the_injected_clock() {
    use crate::model::FakeClock;
    // 2020: testkit's deaths (2023) are after the start, so not history.
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_577_836_800);
    let wall = FakeClock::at(t0);
    let (h, log) = start_on(
        StatusMode::Conditions,
        vec![app_pod()],
        vec![],
        Arc::new(wall.clone()),
    )
    .await;
    h.observe(&view(vec![cv("app", 0, Running)]));
    settle().await;
    // The wall clock steps (NTP) and an hour passes: the transition is an hour after the first.
    wall.advance(Duration::from_secs(86_400));
    tokio::time::advance(Duration::from_secs(3600)).await;
    h.observe(&view(vec![exited("app", 0, 137, "OOMKilled")]));
    settle().await;
    let p = server::patches(&log);
    assert_eq!(p.len(), 2, "{p:#?}");
    let at = |i: usize| {
        condition(&p[i].body, "observer.dev/ContainersAlive").unwrap()["lastTransitionTime"].clone()
    };
    assert_eq!(at(0), "2020-01-01T00:00:00Z");
    assert_eq!(at(1), "2020-01-01T01:00:00Z", "{:#}", p[1].body);
    // A 2023 death is news to a manager started in 2020.
    let reasons: Vec<String> = server::events(&log)
        .iter()
        .filter_map(|e| e.body["reason"].as_str().map(String::from))
        .collect();
    assert_eq!(reasons, ["ContainerDiedOOMKilled"]);
}

#[tokio::test(start_paused = true)]
async fn full_mode_writes_the_whole_computed_status() {
    let (h, log) = start(StatusMode::Full, vec![app_pod()], vec![]).await;
    h.observe(&view(vec![cv("app", 0, Running)]));
    settle().await;
    let p = server::patches(&log);
    assert_eq!(p.len(), 1);
    let body = &p[0].body;
    // Only the computed keys; nothing the agent does not model is named.
    for k in body["status"].as_object().unwrap().keys() {
        assert!(
            crate::status::patch::COMPUTED_KEYS.contains(&k.as_str()),
            "{k}"
        );
    }
    let pod = parsed(&p[0]);
    let s = pod.status.unwrap();
    assert_eq!(s.phase.as_deref(), Some("Running"));
    let cs = s.container_statuses.unwrap();
    assert_eq!(
        cs[0].container_id.as_deref(),
        Some("containerd://0000000000000000000000000000000000000000000000000000006170700000")
    );
    assert!(cs[0].state.as_ref().unwrap().running.is_some());
    let types: Vec<String> = s.conditions.unwrap().into_iter().map(|c| c.type_).collect();
    for t in [
        "observer.dev/ContainersAlive",
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
    ] {
        assert!(types.iter().any(|x| x == t), "{t} in {types:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn audit_mode_writes_no_status_and_reports_each_disagreement_once() {
    let mut c = died_now("app", 0, 0, "Completed");
    c = killed_now(c, 4100, "hog", false);
    c.runtime_reason = Some("OOMKilled".into());
    let mut p = app_pod();
    // kubelet wrote the runtime's OOMKilled / 0 for the child kill (kubernetes#104454).
    p.status = Some(PodStatus {
        phase: Some("Running".into()),
        container_statuses: Some(vec![ContainerStatus {
            name: "app".into(),
            container_id: Some(format!("containerd://{}", c.id)),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    container_id: Some(format!("containerd://{}", c.id)),
                    exit_code: 0,
                    reason: Some("OOMKilled".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let (h, log) = start(StatusMode::Audit, vec![p], vec![]).await;
    let v = view(vec![c]);
    h.observe(&v);
    settle().await;
    h.observe(&v);
    settle().await;
    assert!(server::patches(&log).is_empty(), "audit writes no status");
    let findings: Vec<K8sEvent> = server::events(&log)
        .iter()
        .map(|s| serde_json::from_value(s.body.clone()).unwrap())
        .filter(|e: &K8sEvent| e.reason.as_deref() == Some("OOMKilledMisreported"))
        .collect();
    assert_eq!(findings.len(), 1, "reported once");
    assert_eq!(findings[0].type_.as_deref(), Some("Warning"));
    assert!(findings[0]
        .note
        .as_deref()
        .unwrap()
        .contains("the API says OOMKilled / 0"));
    assert_eq!(
        StatusStats::get(&h.stats().audit_findings[FindingKind::OomKilledMisreported.index()]),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn off_mode_sends_nothing_but_the_watch() {
    let (h, log) = start(StatusMode::Off, vec![app_pod()], vec![]).await;
    h.observe(&view(vec![died_now("app", 0, 1, "Error")]));
    settle().await;
    assert!(server::patches(&log).is_empty());
    assert!(server::events(&log).is_empty());
}

#[tokio::test(start_paused = true)]
async fn flush_ends_back_offs_and_waits_for_the_write() {
    let (h, log) = start(
        StatusMode::Conditions,
        vec![app_pod()],
        vec![status(503, "ServiceUnavailable")],
    )
    .await;
    h.observe(&view(vec![cv("app", 0, Running)]));
    settle().await;
    let t0 = Instant::now();
    let report = h.flush(Duration::from_secs(5)).await;
    assert_eq!(report.unwritten, 0);
    assert!(
        Instant::now() - t0 < Duration::from_secs(1),
        "the back-off was cut short"
    );
    assert_eq!(server::patches(&log).len(), 2);
}

#[tokio::test(start_paused = true)]
async fn flush_gives_up_at_its_deadline() {
    let errors = vec![status(500, "InternalError"); 100];
    let (h, _log) = start(StatusMode::Conditions, vec![app_pod()], errors).await;
    h.observe(&view(vec![cv("app", 0, Running)]));
    let t0 = Instant::now();
    let report = h.flush(Duration::from_secs(3)).await;
    let took = Instant::now() - t0;
    assert_eq!(report.unwritten, 1);
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(4),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn forget_drops_the_pods_state() {
    let (h, log) = start(
        StatusMode::Conditions,
        vec![app_pod()],
        vec![status(500, "InternalError")],
    )
    .await;
    h.observe(&view(vec![cv("app", 0, Running)]));
    // The 500 came back; the retry waits out a back-off of at least 100 ms.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(server::patches(&log).len(), 1);
    h.forget(UID);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        server::patches(&log).len(),
        1,
        "the retry was dropped with the pod"
    );
}

#[tokio::test(start_paused = true)]
async fn compute_gives_the_full_status_with_what_is_unknown() {
    let (h, _log) = start(StatusMode::Off, vec![app_pod()], vec![]).await;
    let c = h.compute(&view(vec![cv("app", 0, Running)]));
    assert_eq!(c.status.phase.as_deref(), Some("Running"));
    assert!(c.unknown.contains(&crate::status::Unknown::PodIps));
    let mut v = view(vec![cv("app", 0, Running)]);
    v.uid = crate::model::PodUid::parse("0b6a3f5e-0000-4000-8000-0000000000ff").unwrap();
    assert!(h
        .compute(&v)
        .unknown
        .contains(&crate::status::Unknown::PodSpec));
}

#[tokio::test(start_paused = true)]
async fn audit_reports_a_death_the_api_still_calls_running_after_the_grace() {
    let c = died_now("app", 0, 1, "Error");
    let mut p = app_pod();
    p.status = Some(PodStatus {
        phase: Some("Running".into()),
        container_statuses: Some(vec![ContainerStatus {
            name: "app".into(),
            container_id: Some(format!("containerd://{}", c.id)),
            state: Some(ContainerState {
                running: Some(Default::default()),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let (h, log) = start(StatusMode::Audit, vec![p], vec![]).await;
    h.observe(&view(vec![c]));
    settle().await;
    let late = |log: &Log| {
        server::events(log)
            .iter()
            .filter(|s| s.body["reason"] == "DeathNotReported")
            .count()
    };
    assert_eq!(late(&log), 0, "within the grace (10 s)");
    // No new view comes: the manager looks again by itself once the grace has passed.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(late(&log), 1);
    let kind = FindingKind::StillRunning.index();
    assert_eq!(StatusStats::get(&h.stats().audit_findings[kind]), 1);
}

#[tokio::test(start_paused = true)]
async fn a_static_pods_status_goes_to_its_mirror_under_the_mirrors_uid() {
    let mut mirror = app_pod();
    mirror.metadata.uid = Some("mirror-0000".into());
    mirror.metadata.annotations =
        Some([("kubernetes.io/config.mirror".to_string(), UID.to_string())].into());
    let (h, log) = start(StatusMode::Conditions, vec![mirror], vec![]).await;
    h.observe(&view(vec![cv("app", 0, Running)]));
    settle().await;
    let p = server::patches(&log);
    assert_eq!(p.len(), 1);
    assert_eq!(parsed(&p[0]).metadata.uid.as_deref(), Some("mirror-0000"));
}

#[tokio::test(start_paused = true)]
async fn a_crash_looping_pod_cannot_flood_the_log() {
    let (h, _log) = start(StatusMode::Conditions, vec![app_pod()], vec![]).await;
    // 60 deaths in quick succession, each its own container instance: each a log line.
    for restart in 0..60 {
        h.observe(&view(vec![died_now("app", restart, 1, "Error")]));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    settle().await;
    let lines = StatusStats::get(&h.stats().events);
    assert!(lines >= 50, "only {lines} deaths reached the manager");
    // The pod's burst was logged, the rest dropped (one line per 6 s after it; 0.8 s passed).
    let burst = u64::from(
        StatusConfig::new("n", StatusMode::Conditions)
            .pod_logs
            .burst,
    );
    assert_eq!(StatusStats::get(&h.stats().logs_suppressed), lines - burst);
    // The refill lets the next one through.
    tokio::time::sleep(Duration::from_secs(6)).await;
    h.observe(&view(vec![died_now("app", 60, 1, "Error")]));
    settle().await;
    assert_eq!(StatusStats::get(&h.stats().events), lines + 1);
    assert_eq!(
        StatusStats::get(&h.stats().logs_suppressed),
        lines - burst,
        "the line after the refill was dropped"
    );
}

#[tokio::test(start_paused = true)]
async fn pods_the_api_does_not_list_for_this_node_make_the_node_name_doubted() {
    let (log, _g) = crate::testlog::capture(tracing::Level::WARN);
    // The API lists another pod for "node-1": this one runs here all the same.
    let mut other = app_pod();
    other.metadata.uid = Some("0b6a3f5e-0000-4000-8000-0000000000ff".into());
    other.metadata.name = Some("elsewhere".into());
    let (h, log_api) = start(StatusMode::Conditions, vec![other], vec![]).await;
    h.observe(&view(vec![cv("app", 0, Running)]));
    tokio::time::sleep(UNLISTED_GRACE - Duration::from_millis(100)).await;
    assert_eq!(log.lines(), Vec::<String>::new(), "not before the grace");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        log.lines(),
        vec![format!(
            "WARN 1 pod(s) the runtime runs here are not among the API's pods of node \"node-1\" ({NS}/{NAME}): is --node-name (NODE_NAME) this node's name as the API knows it (kubectl get nodes)? Nothing is written for them"
        )]
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(log.lines().len(), 1, "said once");
    assert!(server::patches(&log_api).is_empty());
}

#[tokio::test(start_paused = true)]
async fn listed_pods_raise_no_doubt() {
    let (log, _g) = crate::testlog::capture(tracing::Level::WARN);
    let (h, log_api) = start(StatusMode::Conditions, vec![app_pod()], vec![]).await;
    h.observe(&view(vec![cv("app", 0, Running)]));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(log.lines(), Vec::<String>::new());
    assert_eq!(server::patches(&log_api).len(), 1);
}

/// A spec change (an in-place resize, a new activeDeadlineSeconds) bumps the pod's generation:
/// the next write carries it (the agent's conditions in `conditions` mode; the status's and
/// every condition's in `full` mode), and the same generation again writes nothing.
#[tokio::test(start_paused = true)]
async fn a_new_generation_is_written_once_in_either_mode() {
    for mode in [StatusMode::Conditions, StatusMode::Full] {
        let (client, handle) = api::client();
        let _log = server::serve(handle, vec![], vec![]);
        let (mut m, _h) = StatusManager::new(
            client,
            StatusConfig::new("node-1", mode),
            ReconcileHandle::detached(),
        );
        let v = view(vec![cv("app", 0, Running)]);
        m.state.insert(
            v.uid,
            PodState {
                view: Some(v.clone()),
                ..Default::default()
            },
        );
        let mut p = app_pod();
        let mut written = 0;
        for (generation, writes) in [(1, true), (1, false), (2, true), (2, false)] {
            p.metadata.generation = Some(generation);
            m.write(&v, &Arc::new(p.clone()), SystemTime::now());
            let st = m.state.get_mut(&v.uid).unwrap();
            let sent = st.submitted.clone().expect("submitted");
            written += usize::from(writes);
            assert_eq!(
                StatusStats::get(&m.stats.submitted),
                written as u64,
                "{mode}: generation {generation}"
            );
            // The API accepted it: the pod holds what was written.
            st.written = Some(Arc::clone(&sent));
            let status: PodStatus = match mode {
                StatusMode::Full => serde_json::from_value((*sent).clone()).unwrap(),
                _ => PodStatus {
                    conditions: serde_json::from_value((*sent).clone()).unwrap(),
                    ..Default::default()
                },
            };
            let conditions = status.conditions.clone().unwrap_or_default();
            assert!(!conditions.is_empty());
            for c in &conditions {
                let agents = c.type_.starts_with("observer.dev/");
                let kubelets =
                    crate::status::compute::KUBELET_CONDITIONS.contains(&c.type_.as_str());
                if agents || kubelets {
                    assert_eq!(c.observed_generation, Some(generation), "{mode}: {c:?}");
                }
            }
            if mode == StatusMode::Full {
                assert_eq!(status.observed_generation, Some(generation), "{mode}");
            }
            p.status = Some(status);
        }
    }
}
