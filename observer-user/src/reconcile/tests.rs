//! The reconciler alone, against a fake runtime on paused time (kubelet's generic PLEG is tested
//! the same way): a runtime that lags behind the kernel, one whose call hangs, one that fails.
use std::{
    collections::{HashMap, HashSet},
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_cri::v1 as api;
use tokio::sync::watch;

use super::*;
use crate::{
    cri::{keys, ConnectionState, ContainerEventStream},
    kernel::{BootClock, BootNs, WaitStatus},
    pleg::{ContainerExit, ExitReason, PlegEvent, PlegSender},
};

fn uid(n: u8) -> PodUid {
    PodUid::parse(&format!("{n:08x}-0000-4000-8000-000000000000")).unwrap()
}

fn cid(n: u8) -> ContainerId {
    ContainerId::parse(&format!("{n:064x}")).unwrap()
}

fn labels(pod: u8) -> HashMap<String, String> {
    [
        (keys::POD_UID.to_string(), uid(pod).to_string()),
        (keys::POD_NAME.to_string(), format!("p{pod}")),
        (keys::POD_NAMESPACE.to_string(), "default".into()),
    ]
    .into()
}

#[derive(Default)]
struct State {
    sandboxes: Vec<api::PodSandbox>,
    statuses: Vec<api::ContainerStatus>,
    /// Calls that never answer.
    hang: HashSet<&'static str>,
    /// Calls that fail (Unavailable) this many more times.
    fail: HashMap<&'static str, u32>,
    calls: Vec<&'static str>,
    /// What the verbose status says of every container's init.
    init_pid: Option<u32>,
}

/// A runtime whose answers the test sets.
#[derive(Clone)]
struct FakeRuntime {
    state: Arc<Mutex<State>>,
    conn: Arc<watch::Sender<ConnectionState>>,
}

impl FakeRuntime {
    /// One ready pod `pod` with running container `n`.
    fn with_running(pod: u8, n: u8) -> Self {
        let me = Self {
            state: Arc::default(),
            conn: Arc::new(watch::Sender::new(ConnectionState {
                connected: true,
                generation: 1,
                last_error: None,
            })),
        };
        let mut st = me.state.lock().unwrap();
        st.sandboxes.push(api::PodSandbox {
            id: cid(100 + pod).to_string(),
            labels: labels(pod),
            state: api::PodSandboxState::SandboxReady as i32,
            ..Default::default()
        });
        st.statuses.push(api::ContainerStatus {
            id: cid(n).to_string(),
            metadata: Some(api::ContainerMetadata {
                name: format!("c{n}"),
                attempt: 0,
            }),
            state: api::ContainerState::ContainerRunning as i32,
            labels: labels(pod),
            ..Default::default()
        });
        drop(st);
        me
    }

    fn set(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state.lock().unwrap());
    }

    fn calls(&self, call: &str) -> usize {
        let st = self.state.lock().unwrap();
        st.calls.iter().filter(|c| **c == call).count()
    }

    /// The runtime has caught up: container `n` exited with `code`.
    fn exited(&self, n: u8, code: i32) {
        self.set(|st| {
            let s = st
                .statuses
                .iter_mut()
                .find(|s| s.id == cid(n).to_string())
                .unwrap();
            s.state = api::ContainerState::ContainerExited as i32;
            s.exit_code = code;
            s.reason = "Error".into();
        });
    }

    /// Records the call; hangs or fails it when the test says so.
    fn answer<T: Send>(
        &self,
        call: &'static str,
        ok: impl FnOnce(&State) -> T + Send,
    ) -> impl Future<Output = Result<T, CriError>> + Send {
        let state = Arc::clone(&self.state);
        async move {
            let (hang, fail) = {
                let mut st = state.lock().unwrap();
                st.calls.push(call);
                let fail = st.fail.get_mut(call).filter(|n| **n > 0).map(|n| *n -= 1);
                (st.hang.contains(call), fail.is_some())
            };
            if hang {
                std::future::pending::<()>().await;
            }
            if fail {
                return Err(CriError::from_status(
                    call,
                    tonic::Status::unavailable("fake outage"),
                ));
            }
            Ok(ok(&state.lock().unwrap()))
        }
    }
}

fn selected(filter: Option<&HashMap<String, String>>, labels: &HashMap<String, String>) -> bool {
    filter.is_none_or(|f| f.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

impl RuntimeService for FakeRuntime {
    fn list_pod_sandboxes(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> impl Future<Output = Result<Vec<api::PodSandbox>, CriError>> + Send {
        self.answer("ListPodSandbox", move |st| {
            let f = filter.map(|f| f.label_selector);
            st.sandboxes
                .iter()
                .filter(|s| selected(f.as_ref(), &s.labels))
                .cloned()
                .collect()
        })
    }

    fn list_containers(
        &self,
        filter: Option<api::ContainerFilter>,
    ) -> impl Future<Output = Result<Vec<api::Container>, CriError>> + Send {
        self.answer("ListContainers", move |st| {
            let f = filter.map(|f| f.label_selector);
            st.statuses
                .iter()
                .filter(|s| selected(f.as_ref(), &s.labels))
                .map(|s| api::Container {
                    id: s.id.clone(),
                    metadata: s.metadata.clone(),
                    state: s.state,
                    labels: s.labels.clone(),
                    ..Default::default()
                })
                .collect()
        })
    }

    fn container_status(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<api::ContainerStatus, CriError>> + Send {
        let id = id.to_string();
        self.answer("ContainerStatus", move |st| {
            st.statuses
                .iter()
                .find(|s| s.id == id)
                .cloned()
                .expect("listed")
        })
    }

    fn container_pid(
        &self,
        _id: &str,
    ) -> impl Future<Output = Result<Option<u32>, CriError>> + Send {
        self.answer("ContainerStatus(verbose)", |st| st.init_pid)
    }

    fn connection(&self) -> watch::Receiver<ConnectionState> {
        self.conn.subscribe()
    }

    async fn container_events(&self) -> Result<ContainerEventStream, CriError> {
        Err(CriError::Unimplemented {
            call: "GetContainerEvents",
        })
    }
}

/// The reconciler on `rt`, running; its PLEG input and handle.
fn start(rt: &FakeRuntime) -> (PlegSender, ReconcileHandle) {
    let (tx, h, _) = start_with_log(rt, None);
    (tx, h)
}

/// [`start`], the reconciler following `clock` and, with `log`, a kernel log: its sender.
fn start_with_log(
    rt: &FakeRuntime,
    log: Option<&BootClock>,
) -> (
    PlegSender,
    ReconcileHandle,
    Option<mpsc::Sender<crate::kernel::kmsg::LoggedOomKill>>,
) {
    let cfg = ReconcileConfig {
        state_dir: None,
        ..ReconcileConfig::default()
    };
    let (mut r, h) = Reconciler::new(
        rt.clone(),
        cfg,
        log.cloned().unwrap_or_default(),
        OomHistory::new(crate::cgroup::KubeRoots::of_kubelet_root("/").unwrap()),
        inits::InitStore::in_memory(),
    );
    let log_tx = log.map(|_| {
        let (log_tx, log_rx) = mpsc::channel(4);
        r.follow_kernel_log(log_rx);
        log_tx
    });
    let (tx, rx) = crate::pleg::channel(64).expect("a wake-up socket");
    tokio::spawn(r.run(rx));
    (tx, h, log_tx)
}

/// The kernel saw container `n`'s init (pid 4242) killed by SIGKILL.
fn died(pod: u8, n: u8) -> PodLifecycleEvent {
    PodLifecycleEvent {
        pod_uid: uid(pod),
        runtime: None,
        at: BootClock::now(),
        event: PlegEvent::ContainerDied {
            id: cid(n),
            exit: ContainerExit {
                status: Some(WaitStatus(9)),
                reason: ExitReason::Error,
                pid: Some(4242),
                comm: None,
            },
        },
    }
}

fn phase(h: &ReconcileHandle, pod: u8) -> Option<ContainerPhase> {
    Some(h.pod(&uid(pod))?.containers.first()?.phase)
}

/// The kernel saw container `n`'s init start as `pid`.
fn started(pod: u8, n: u8, pid: u32) -> PodLifecycleEvent {
    PodLifecycleEvent {
        pod_uid: uid(pod),
        runtime: None,
        at: BootClock::now(),
        event: PlegEvent::ContainerStarted {
            id: cid(n),
            pid,
            comm: Default::default(),
        },
    }
}

/// The runtime's init is checked against the kernel's whichever is known first, and once: the
/// runtime may answer before the kernel's start is read (a fetch the cgroup's creation set off).
#[tokio::test(start_paused = true)]
async fn the_init_is_checked_once_whichever_account_comes_first() {
    let rt = FakeRuntime::with_running(1, 1);
    rt.set(|st| st.init_pid = Some(4242));
    let (tx, h) = start(&rt);
    assert!(h.settled(Duration::from_secs(5)).await);
    assert!(
        h.wait_for(Duration::from_secs(5), |_| rt
            .calls("ContainerStatus(verbose)")
            == 1)
            .await
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        ReconcileStats::get(&h.stats().init_checks),
        0,
        "no kernel start yet"
    );
    tx.send(started(1, 1, 4242));
    assert!(
        h.wait_for(Duration::from_secs(5), |_| ReconcileStats::get(
            &h.stats().init_checks
        ) == 1)
            .await,
        "checked when the kernel's start came"
    );
    tx.send(started(1, 1, 4242));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ReconcileStats::get(&h.stats().init_checks), 1, "once");
    assert_eq!(ReconcileStats::get(&h.stats().init_disagreements), 0);

    // The kernel first, and a runtime that names another init: counted as a disagreement.
    let rt = FakeRuntime::with_running(2, 2);
    rt.set(|st| st.init_pid = Some(7));
    let (tx, h) = start(&rt);
    tx.send(started(2, 2, 4242));
    assert!(
        h.wait_for(Duration::from_secs(5), |_| ReconcileStats::get(
            &h.stats().init_checks
        ) == 1)
            .await
    );
    assert_eq!(ReconcileStats::get(&h.stats().init_disagreements), 1);
}

#[tokio::test(start_paused = true)]
async fn a_death_shows_at_once_and_a_lagging_runtime_is_asked_again_until_it_follows() {
    let rt = FakeRuntime::with_running(1, 1);
    let (tx, h) = start(&rt);
    assert!(h.settled(Duration::from_secs(5)).await);
    assert_eq!(phase(&h, 1), Some(ContainerPhase::Running));

    let asked = rt.calls("ContainerStatus");
    tx.send(died(1, 1));
    // The kernel's account, before the runtime has said anything.
    assert!(
        h.wait_for(Duration::from_millis(1), |_| phase(&h, 1)
            == Some(ContainerPhase::Exited))
            .await
    );
    let c = h.pod(&uid(1)).unwrap().containers[0].clone();
    assert_eq!((c.exit_code, c.signal), (Some(137), Some(9)));

    // The runtime still says Running: asked again every 100 ms, not left to the relist.
    tokio::time::sleep(Duration::from_millis(550)).await;
    let lagging = rt.calls("ContainerStatus") - asked;
    assert!((5..=7).contains(&lagging), "{lagging} asks in 550 ms");

    rt.exited(1, 137);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let after = rt.calls("ContainerStatus");
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        rt.calls("ContainerStatus"),
        after,
        "caught up: no more asks until the relist"
    );
    assert_eq!(phase(&h, 1), Some(ContainerPhase::Exited));
    assert_eq!(ReconcileStats::get(&h.stats().missed_events), 0);
}

#[tokio::test(start_paused = true)]
async fn a_hung_runtime_call_neither_hides_a_death_nor_stops_the_loop() {
    let rt = FakeRuntime::with_running(1, 1);
    let (tx, h) = start(&rt);
    assert!(h.settled(Duration::from_secs(5)).await);
    rt.set(|st| {
        st.hang.insert("ContainerStatus");
    });
    tx.send(died(1, 1));
    assert!(
        h.wait_for(Duration::from_millis(1), |_| phase(&h, 1)
            == Some(ContainerPhase::Exited))
            .await
    );
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(
        h.since_last_turn() <= handle::HEARTBEAT,
        "{:?}",
        h.since_last_turn()
    );
    assert!(h.is_settled(), "the first sync stays done");
    assert_eq!(phase(&h, 1), Some(ContainerPhase::Exited));
}

#[tokio::test(start_paused = true)]
async fn runtime_errors_are_said_once_and_retried_until_it_answers() {
    let (log, _g) = crate::testlog::capture(tracing::Level::WARN);
    let rt = FakeRuntime::with_running(1, 1);
    let (tx, h) = start(&rt);
    assert!(h.settled(Duration::from_secs(5)).await);
    rt.set(|st| {
        st.fail.insert("ContainerStatus", 3);
    });
    rt.exited(1, 2);
    let mut sync = PodLifecycleEvent::pod_sync(uid(1), BootNs(0));
    sync.at = BootClock::now();
    tx.send(sync);
    assert!(
        h.wait_for(Duration::from_secs(10), |_| phase(&h, 1)
            == Some(ContainerPhase::Exited))
            .await
    );
    assert_eq!(ReconcileStats::get(&h.stats().fetch_errors), 3);
    assert_eq!(h.pod(&uid(1)).unwrap().containers[0].exit_code, Some(2));
    assert_eq!(
        log.lines(),
        vec![format!(
            "WARN runtime status of pod failed (retrying): CRI ContainerStatus failed: code: 'The service is currently unavailable', message: \"fake outage\" pod={}",
            uid(1)
        )]
    );
}

/// On cgroup v2 the kernel's report names the victim's nearest memory cgroup with the
/// controller on, which can be above its container (no limit set below): the log's kill is the
/// container's by the probes' record of the same victim, and its scope is told, not lost.
#[tokio::test(start_paused = true)]
async fn a_logged_kill_above_the_container_is_placed_by_its_victim() {
    use crate::kernel::{
        event::{OomKill, OomMemory, Task},
        kmsg::LoggedOomKill,
        oom_report::{Constraint, OomReport},
        Comm,
    };
    let rt = FakeRuntime::with_running(1, 1);
    let clock = BootClock::new();
    let (tx, h, log_tx) = start_with_log(&rt, Some(&clock));
    let log_tx = log_tx.expect("following the log");
    assert!(h.settled(Duration::from_secs(5)).await);

    let probe_kill = |pid: u32, marked_at: BootNs| PodLifecycleEvent {
        pod_uid: uid(1),
        runtime: None,
        at: marked_at,
        event: PlegEvent::OomKill {
            id: cid(1),
            kill: Box::new(OomKill {
                at: marked_at,
                marked_at,
                victim: Task {
                    pid,
                    tgid: pid,
                    ppid: 4242,
                    ns_pid: 7,
                    ns_level: 1,
                    comm: Comm::from("greedy"),
                    cgroup_id: 9,
                },
                victim_comm: Comm::from("greedy"),
                memory: OomMemory::default(),
                oom_score_adj: Some(1000),
                trigger_pid: pid,
                trigger_tgid: pid,
                trigger_cgroup_id: 9,
            }),
            trigger: None,
        },
    };
    // A global OOM's report, with the victim's memory cgroup the test's own top one.
    let logged = |pid: u32, marked_at: BootNs| LoggedOomKill {
        at_us: u64::from(pid),
        time: clock.to_system_time(marked_at),
        pid,
        comm: "greedy".into(),
        task_memcg: "/observer-test-1-0-oom-node".into(),
        report: Some(Arc::new(OomReport {
            constraint: Some(Constraint::None),
            ..Default::default()
        })),
        ..Default::default()
    };
    let marked_at = BootClock::now();
    tx.send(probe_kill(4300, marked_at));
    let scope = |h: &ReconcileHandle| {
        h.pod(&uid(1))?
            .containers
            .first()?
            .last_oom
            .as_ref()
            .map(|o| o.scope.clone())
    };
    assert!(
        h.wait_for(Duration::from_secs(1), |_| scope(&h)
            == Some(OomScope::Unknown(ScopeUnknown::LogNotRead)))
            .await
    );
    log_tx.send(logged(4300, marked_at)).await.unwrap();
    assert!(
        h.wait_for(Duration::from_secs(1), |_| scope(&h)
            == Some(OomScope::Node))
            .await,
        "{:?}",
        scope(&h)
    );
    // Another process's kill in that cgroup is no container's.
    log_tx.send(logged(4301, marked_at)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let c = h.pod(&uid(1)).unwrap().containers[0].clone();
    assert_eq!(c.oom_kills, 1, "{c:?}");
    assert_eq!(scope(&h), Some(OomScope::Node));

    // The other order: the log's report first (a large victim exits, and so reaches the probes,
    // seconds after it was chosen), then the probes' kill.
    let later = BootClock::now();
    log_tx.send(logged(4302, later)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    tx.send(probe_kill(4302, later));
    let pid =
        |h: &ReconcileHandle| Some(h.pod(&uid(1))?.containers.first()?.last_oom.as_ref()?.pid);
    assert!(
        h.wait_for(Duration::from_secs(1), |_| pid(&h) == Some(4302)
            && scope(&h) == Some(OomScope::Node))
            .await,
        "{:?}",
        h.pod(&uid(1)).unwrap().containers[0].last_oom
    );
}

/// The probes saw a victim die in one container; a report of the same kill naming another
/// container (below kubelet's roots) is not believed: neither container gets it.
#[tokio::test(start_paused = true)]
async fn a_logged_kill_naming_another_container_than_the_probes_is_not_believed() {
    use crate::kernel::{
        event::{OomKill, OomMemory, Task},
        kmsg::LoggedOomKill,
        oom_report::{Constraint, OomReport},
        Comm,
    };
    let rt = FakeRuntime::with_running(1, 1);
    rt.set(|st| {
        let mut other = st.statuses[0].clone();
        other.id = cid(2).to_string();
        st.statuses.push(other);
    });
    let clock = BootClock::new();
    let (tx, h, log_tx) = start_with_log(&rt, Some(&clock));
    let log_tx = log_tx.expect("following the log");
    assert!(h.settled(Duration::from_secs(5)).await);
    let kills = |h: &ReconcileHandle, n: u8| {
        h.pod(&uid(1))
            .and_then(|p| p.containers.iter().find(|c| c.id == cid(n)).cloned())
            .map(|c| c.oom_kills)
    };
    assert_eq!((kills(&h, 1), kills(&h, 2)), (Some(0), Some(0)));

    let marked_at = BootClock::now();
    let victim = Task {
        pid: 4400,
        tgid: 4400,
        ppid: 1,
        ns_pid: 7,
        ns_level: 1,
        comm: Comm::from("hog"),
        cgroup_id: 9,
    };
    tx.send(PodLifecycleEvent {
        pod_uid: uid(1),
        runtime: None,
        at: marked_at,
        event: PlegEvent::OomKill {
            id: cid(1),
            kill: Box::new(OomKill {
                at: marked_at,
                marked_at,
                victim,
                victim_comm: Comm::from("hog"),
                memory: OomMemory::default(),
                oom_score_adj: None,
                trigger_pid: 4400,
                trigger_tgid: 4400,
                trigger_cgroup_id: 9,
            }),
            trigger: None,
        },
    });
    assert!(
        h.wait_for(Duration::from_secs(1), |_| kills(&h, 1) == Some(1))
            .await
    );
    let other = format!("/kubepods/burstable/pod{}/{}", uid(1), cid(2));
    log_tx
        .send(LoggedOomKill {
            at_us: 1,
            time: clock.to_system_time(marked_at),
            pid: 4400,
            comm: "hog".into(),
            task_memcg: other.clone(),
            oom_memcg: other,
            report: Some(Arc::new(OomReport {
                constraint: Some(Constraint::Memcg),
                ..Default::default()
            })),
            ..Default::default()
        })
        .await
        .unwrap();
    // A kill from the log the reconciler took would show in the next turn.
    h.request_relist();
    assert!(h.settled(Duration::from_secs(1)).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!((kills(&h, 1), kills(&h, 2)), (Some(1), Some(0)));
    let scope = h
        .pod(&uid(1))
        .unwrap()
        .containers
        .iter()
        .find(|c| c.id == cid(1))
        .unwrap()
        .last_oom
        .clone()
        .unwrap()
        .scope;
    assert_eq!(scope, OomScope::Unknown(ScopeUnknown::LogNotRead));
}
