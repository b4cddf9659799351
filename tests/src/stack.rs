//! The agent in-process, for machines with no container runtime and no API server (the VM
//! guests of `cargo xtask vm-test`): built by `Agent::build` as `observer run` builds it, the
//! kernel pipeline over one test cgroup, the status manager writing to the API stand-in
//! ([`crate::apiserver::ApiStandIn`]), and the container runtime replaced by
//! [`RuntimeStandIn`]: the test lays out a
//! pod's cgroups as kubelet and containerd do, starts its processes, and tells the stand-in what
//! containerd would say of them.
use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex},
    time::SystemTime,
};

use anyhow::Context;
use observer::{
    agent::{Agent, AgentParts, Writers},
    cgroup::CgroupMounts,
    cgroup::{container_cgroup_path, pod_cgroup_path, CgroupDriver, Qos, Runtime},
    cri::{api, keys, ConnectionState, ContainerEventStream, CriError},
    kernel::{ProbeOptions, Watch},
    model::{Clock, ContainerId, PodUid, SystemClock},
    pipeline::{PipelineConfig, ReaderThread},
    reconcile::{ReconcileConfig, ReconcileHandle, RuntimeService},
    status::{StatusConfig, StatusHandle, StatusMode},
};
use tokio::sync::watch;

use crate::{
    apiserver::{pod_object, ApiStandIn},
    kernel::TestCgroup,
};

#[derive(Default)]
struct Declared {
    sandboxes: Vec<api::PodSandbox>,
    containers: Vec<api::ContainerStatus>,
    pids: HashMap<String, u32>,
}

/// Answers the reconciler's CRI calls from what the test declared, as containerd would.
#[derive(Clone)]
pub struct RuntimeStandIn {
    state: Arc<Mutex<Declared>>,
    conn: Arc<watch::Sender<ConnectionState>>,
}

impl Default for RuntimeStandIn {
    fn default() -> Self {
        Self {
            state: Arc::default(),
            conn: Arc::new(watch::Sender::new(ConnectionState {
                connected: true,
                generation: 1,
                last_error: None,
            })),
        }
    }
}

fn nanos(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

fn pod_labels(uid: PodUid, namespace: &str, name: &str) -> HashMap<String, String> {
    [
        (keys::POD_UID.to_string(), uid.to_string()),
        (keys::POD_NAME.to_string(), name.to_string()),
        (keys::POD_NAMESPACE.to_string(), namespace.to_string()),
    ]
    .into()
}

impl RuntimeStandIn {
    fn declared(&self) -> std::sync::MutexGuard<'_, Declared> {
        self.state.lock().expect("runtime stand-in state")
    }

    /// A ready pod sandbox `sandbox` with kubelet's labels.
    pub fn pod(&self, uid: PodUid, namespace: &str, name: &str, sandbox: ContainerId) {
        self.declared().sandboxes.push(api::PodSandbox {
            id: sandbox.to_string(),
            metadata: Some(api::PodSandboxMetadata {
                name: name.into(),
                uid: uid.to_string(),
                namespace: namespace.into(),
                attempt: 0,
            }),
            state: api::PodSandboxState::SandboxReady as i32,
            created_at: nanos(SystemTime::now()),
            labels: pod_labels(uid, namespace, name),
            ..Default::default()
        });
    }

    /// Container `name` (`id`) of pod `uid`, running, its first attempt.
    pub fn container(&self, uid: PodUid, namespace: &str, pod: &str, id: ContainerId, name: &str) {
        let mut labels = pod_labels(uid, namespace, pod);
        labels.insert(keys::CONTAINER_NAME.into(), name.into());
        let now = nanos(SystemTime::now());
        self.declared().containers.push(api::ContainerStatus {
            id: id.to_string(),
            metadata: Some(api::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            state: api::ContainerState::ContainerRunning as i32,
            created_at: now,
            started_at: now,
            image: Some(api::ImageSpec {
                image: "localhost/observer/busybox:latest".into(),
                ..Default::default()
            }),
            labels,
            annotations: [(keys::CONTAINER_RESTART_COUNT.to_string(), "0".to_string())].into(),
            ..Default::default()
        });
    }

    /// The container's init, as the runtime's verbose status gives it.
    pub fn started(&self, id: ContainerId, pid: u32) {
        self.declared().pids.insert(id.to_string(), pid);
    }

    /// The runtime's account of the container's end (containerd's, which the kernel's may
    /// correct).
    pub fn exited(&self, id: ContainerId, exit_code: i32, reason: &str) {
        let mut d = self.declared();
        if let Some(c) = d.containers.iter_mut().find(|c| c.id == id.to_string()) {
            c.state = api::ContainerState::ContainerExited as i32;
            c.exit_code = exit_code;
            c.reason = reason.into();
            c.finished_at = nanos(SystemTime::now());
        }
    }
}

fn selected(filter: Option<&HashMap<String, String>>, labels: &HashMap<String, String>) -> bool {
    filter.is_none_or(|f| f.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

impl RuntimeService for RuntimeStandIn {
    fn list_pod_sandboxes(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> impl Future<Output = Result<Vec<api::PodSandbox>, CriError>> + Send {
        let f = filter.map(|f| f.label_selector);
        let out = self
            .declared()
            .sandboxes
            .iter()
            .filter(|s| selected(f.as_ref(), &s.labels))
            .cloned()
            .collect();
        std::future::ready(Ok(out))
    }

    fn list_containers(
        &self,
        filter: Option<api::ContainerFilter>,
    ) -> impl Future<Output = Result<Vec<api::Container>, CriError>> + Send {
        let f = filter.map(|f| f.label_selector);
        let out = self
            .declared()
            .containers
            .iter()
            .filter(|s| selected(f.as_ref(), &s.labels))
            .map(|s| api::Container {
                id: s.id.clone(),
                metadata: s.metadata.clone(),
                state: s.state,
                created_at: s.created_at,
                labels: s.labels.clone(),
                annotations: s.annotations.clone(),
                ..Default::default()
            })
            .collect();
        std::future::ready(Ok(out))
    }

    fn container_status(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<api::ContainerStatus, CriError>> + Send {
        let found = self
            .declared()
            .containers
            .iter()
            .find(|c| c.id == id)
            .cloned();
        std::future::ready(found.ok_or_else(|| {
            CriError::from_status(
                "ContainerStatus",
                tonic::Status::not_found(format!("container {id} not declared")),
            )
        }))
    }

    fn container_pid(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<u32>, CriError>> + Send {
        std::future::ready(Ok(self.declared().pids.get(id).copied()))
    }

    fn connection(&self) -> watch::Receiver<ConnectionState> {
        self.conn.subscribe()
    }

    async fn container_events(&self) -> Result<ContainerEventStream, CriError> {
        // containerd 1.6's answer: the reconciler relies on the kernel and its relists.
        Err(CriError::Unimplemented {
            call: "GetContainerEvents",
        })
    }
}

/// The agent on a [`RuntimeStandIn`], writing to an [`ApiStandIn`] in `conditions` mode: built
/// by the agent's own constructor ([`Agent::build`]), from parts where the runtime is the
/// stand-in and the probes watch one test cgroup. Dropping it stops everything.
pub struct AgentStack {
    pub reconcile: ReconcileHandle,
    pub status: StatusHandle,
    agent: Agent<RuntimeStandIn>,
}

impl AgentStack {
    /// Probes filtered to `cg` and its start-up walk, as [`crate::kernel::PlegWatch`]; the
    /// kernel log followed from now on (the history before it read once).
    /// `clock` is the wall clock the agent decides by (`observer::model::SystemClock`, or a
    /// `FakeClock`).
    pub async fn start<C: Clock>(
        cg: &TestCgroup,
        runtime: RuntimeStandIn,
        api: &ApiStandIn,
        node: &str,
        clock: C,
    ) -> anyhow::Result<Self> {
        let client = observer::kube::client(Some(api.kubeconfig()?.as_os_str())).await?;
        let mut status = StatusConfig::new(node, StatusMode::Conditions);
        status.api_url = client.url.clone();
        let agent = Agent::build(AgentParts {
            runtime,
            clock,
            runtime_fallback: "containerd".into(),
            pipeline: PipelineConfig {
                unified: cg.mount.clone(),
                roots: cg.kube_roots("")?,
                probes: ProbeOptions {
                    watch: Watch::Roots(vec![cg.watch_root()]),
                    ..ProbeOptions::default()
                },
                queue: 1 << 16,
            },
            reader: ReaderThread::default(),
            reconcile: ReconcileConfig {
                state_dir: None,
                ..ReconcileConfig::default()
            },
            mounts: CgroupMounts::detect(None).ok(),
            hook: None,
            writers: Some(Writers {
                client: client.client,
                status,
                fast: None,
            }),
        })
        .await?;
        Ok(Self {
            reconcile: agent.reconcile.clone(),
            status: agent.status.clone().context("the agent has writers")?,
            agent,
        })
    }

    /// `/metrics` as `observer run` serves it (but the runtime connection's, a stand-in's here).
    pub fn metrics(&self) -> anyhow::Result<String> {
        Ok(observer::agent::metrics::Metrics::new(Some(self.agent.metric_sources())).encode()?)
    }

    /// A sample's value in [`Self::metrics`] (`name` with its labels, as exposed); 0 when absent.
    pub fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let text = self.metrics()?;
        Ok(text
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0.0))
    }
}

/// One pod with one container `app`, laid out in `cg` below its kubepods root as kubelet and
/// containerd lay it out (cgroupfs driver, Burstable), declared to a runtime stand-in and to a
/// new API stand-in: the fixture of the tests that run the agent's chain in-process on cgroups
/// they make. `tag` keeps one test's ids apart from another's, `n` one pod's from another's.
pub struct StandInPod {
    pub name: &'static str,
    pub uid: PodUid,
    pub cid: ContainerId,
    /// The container's cgroup, hierarchy-relative.
    pub container: String,
    pub api: ApiStandIn,
    pub runtime: RuntimeStandIn,
}

/// How a [`StandInPod`] is declared to the API stand-in.
#[derive(Clone, Copy, Debug, Default)]
pub struct InApi<'a> {
    /// The container's memory limit in its spec.
    pub limit: Option<&'a str>,
    /// A readiness gate on this condition type.
    pub gate: Option<&'a str>,
}

impl StandInPod {
    pub async fn new(
        cg: &mut TestCgroup,
        name: &'static str,
        tag: u8,
        n: u32,
        node: &str,
        declared: InApi<'_>,
    ) -> anyhow::Result<Self> {
        let uid = PodUid::parse(&format!("{n:08x}-0000-4000-8000-{tag:012x}")).context("uid")?;
        let cid = ContainerId::parse(&format!("{:064x}", (u64::from(tag) << 20) + u64::from(n)))
            .context("cid")?;
        let sandbox = ContainerId::parse(&format!(
            "{:064x}",
            0x5a4d_0000_0000u64 + (u64::from(tag) << 20) + u64::from(n)
        ))
        .context("sandbox id")?;
        let (driver, qos) = (CgroupDriver::Cgroupfs, Qos::Burstable);
        cg.mkdir(&pod_cgroup_path(driver, qos, &uid))?;
        let container = cg.mkdir(&container_cgroup_path(
            driver,
            qos,
            &uid,
            Runtime::Containerd,
            &cid,
        ))?;
        let api = ApiStandIn::start().await?;
        api.add_pod(pod_object(
            name,
            "default",
            &uid.to_string(),
            node,
            &[("app", declared.limit)],
            declared.gate,
        ));
        let runtime = RuntimeStandIn::default();
        runtime.pod(uid, "default", name, sandbox);
        runtime.container(uid, "default", name, cid, "app");
        Ok(Self {
            name,
            uid,
            cid,
            container,
            api,
            runtime,
        })
    }

    /// The agent's chain on this pod, once the status manager listed the API's pods.
    pub async fn agent(&self, cg: &TestCgroup, node: &str) -> anyhow::Result<AgentStack> {
        self.agent_on(cg, node, SystemClock).await
    }

    /// [`Self::agent`] deciding by the wall clock `clock`.
    pub async fn agent_on<C: Clock>(
        &self,
        cg: &TestCgroup,
        node: &str,
        clock: C,
    ) -> anyhow::Result<AgentStack> {
        let stack = AgentStack::start(cg, self.runtime.clone(), &self.api, node, clock).await?;
        tokio::time::timeout(
            std::time::Duration::from_secs(30),
            stack.status.pods().ready(),
        )
        .await
        .context("the status manager never listed the API stand-in's pods")?;
        Ok(stack)
    }
}
