//! Pods and containers described the way a test thinks of them, and turned into CRI requests the
//! way kubelet builds them (pkg/kubelet/kuberuntime: generatePodSandboxConfig,
//! generateContainerConfig, newPodLabels, newContainerLabels, newContainerAnnotations).
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use observer::cri::{api, keys};

use crate::image::BUSYBOX_IMAGE;

/// A pod's QoS class: decides its cgroup parent and oom_score_adj, as kubelet does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl Qos {
    /// kubelet's cgroupfs layout.
    pub fn cgroup_parent(self, uid: &str) -> String {
        match self {
            Qos::Guaranteed => format!("/kubepods/pod{uid}"),
            Qos::Burstable => format!("/kubepods/burstable/pod{uid}"),
            Qos::BestEffort => format!("/kubepods/besteffort/pod{uid}"),
        }
    }

    /// kubelet's policy (pkg/kubelet/qos/policy.go); burstable depends on the memory request,
    /// which these pods do not state, so it takes the middle of kubelet's 2..999 range.
    pub fn oom_score_adj(self) -> i64 {
        match self {
            Qos::Guaranteed => -997,
            Qos::Burstable => 500,
            Qos::BestEffort => 1000,
        }
    }

    fn cpu_shares(self) -> i64 {
        match self {
            Qos::Guaranteed => 1024,
            Qos::Burstable => 102,
            // kubelet's MinShares.
            Qos::BestEffort => 2,
        }
    }
}

/// Whose pid namespace a pod's containers run in (CRI NamespaceMode for pid).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PidMode {
    /// Each container its own (kubelet's default).
    #[default]
    Container,
    /// One namespace for the pod, the pause process its pid 1 (`shareProcessNamespace: true`).
    Pod,
    /// The node's (`hostPID: true`).
    Node,
}

/// A container of a pod.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub memory_limit: Option<i64>,
    /// kubelet's restart count: metadata.attempt, the restartCount annotation and the log file name.
    pub restart_count: u32,
    /// An ephemeral debug container joining this container's pid namespace (CRI pid mode TARGET,
    /// `kubectl debug --target`).
    pub target: Option<String>,
}

impl ContainerSpec {
    /// A busybox container that sleeps for an hour.
    pub fn new(name: impl Into<String>) -> Self {
        ContainerSpec {
            name: name.into(),
            image: BUSYBOX_IMAGE.into(),
            command: vec!["sleep".into(), "3600".into()],
            args: vec![],
            env: vec![],
            memory_limit: None,
            restart_count: 0,
            target: None,
        }
    }

    /// A busybox container running `sh -c script`.
    pub fn sh(name: impl Into<String>, script: &str) -> Self {
        ContainerSpec::new(name).command(["/bin/sh", "-c", script])
    }

    pub fn command<S: Into<String>>(mut self, cmd: impl IntoIterator<Item = S>) -> Self {
        self.command = cmd.into_iter().map(Into::into).collect();
        self
    }

    pub fn args<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn image(mut self, image: impl Into<String>) -> Self {
        self.image = image.into();
        self
    }

    pub fn memory_limit(mut self, bytes: i64) -> Self {
        self.memory_limit = Some(bytes);
        self
    }

    pub fn memory_limit_mib(self, mib: i64) -> Self {
        self.memory_limit(mib << 20)
    }

    pub fn restart_count(mut self, n: u32) -> Self {
        self.restart_count = n;
        self
    }

    /// Runs in the pid namespace of container `id` (an ephemeral container's `--target`).
    pub fn target(mut self, id: impl Into<String>) -> Self {
        self.target = Some(id.into());
        self
    }
}

/// A pod: what kubelet would know from the API server, reduced to what CRI sees.
#[derive(Debug, Clone)]
pub struct PodSpec {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// Sandbox attempt: how many sandboxes kubelet created for this pod before.
    pub attempt: u32,
    pub qos: Qos,
    /// The pod's own labels (kubelet adds its three on top).
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub containers: Vec<ContainerSpec>,
    pub pid: PidMode,
}

impl PodSpec {
    /// Namespace `default`, a fresh uid, burstable, created from the API server.
    pub fn new(name: impl Into<String>) -> Self {
        let annotations = [
            (keys::CONFIG_SOURCE, "api".to_string()),
            (keys::CONFIG_SEEN, rfc3339_now()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        PodSpec {
            name: name.into(),
            namespace: "default".into(),
            uid: new_uid(),
            attempt: 0,
            qos: Qos::Burstable,
            labels: BTreeMap::new(),
            annotations,
            containers: vec![],
            pid: PidMode::Container,
        }
    }

    pub fn pid(mut self, mode: PidMode) -> Self {
        self.pid = mode;
        self
    }

    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = ns.into();
        self
    }

    pub fn uid(mut self, uid: impl Into<String>) -> Self {
        self.uid = uid.into();
        self
    }

    pub fn qos(mut self, qos: Qos) -> Self {
        self.qos = qos;
        self
    }

    pub fn attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    pub fn label(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }

    pub fn annotation(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.annotations.insert(k.into(), v.into());
        self
    }

    pub fn container(mut self, c: ContainerSpec) -> Self {
        self.containers.push(c);
        self
    }

    pub fn cgroup_parent(&self) -> String {
        self.qos.cgroup_parent(&self.uid)
    }

    /// kubelet's BuildPodLogsDirectory, under `logs_root` instead of /var/log/pods.
    pub fn log_directory(&self, logs_root: &Path) -> PathBuf {
        logs_root.join(format!("{}_{}_{}", self.namespace, self.name, self.uid))
    }
}

/// A started sandbox and the containers the harness created in it.
#[derive(Debug, Clone)]
pub struct Pod {
    pub sandbox_id: String,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub qos: Qos,
    pub cgroup_parent: String,
    pub pid: PidMode,
    pub log_directory: PathBuf,
    /// What RunPodSandbox got; CreateContainer repeats it, as kubelet does.
    pub sandbox_config: api::PodSandboxConfig,
    pub containers: Vec<Container>,
}

#[derive(Debug, Clone)]
pub struct Container {
    pub id: String,
    pub name: String,
    pub restart_count: u32,
}

impl Pod {
    /// The newest container named `name`. Panics if there is none: a test asked for a container
    /// it did not create.
    pub fn container(&self, name: &str) -> &Container {
        self.containers
            .iter()
            .rev()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("pod {} has no container {name:?}", self.name))
    }

    pub fn container_id(&self, name: &str) -> &str {
        &self.container(name).id
    }

    pub fn pod_labels(&self) -> HashMap<String, String> {
        kubelet_pod_labels(&self.name, &self.namespace, &self.uid)
    }
}

fn kubelet_pod_labels(name: &str, namespace: &str, uid: &str) -> HashMap<String, String> {
    [
        (keys::POD_NAME, name),
        (keys::POD_NAMESPACE, namespace),
        (keys::POD_UID, uid),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The namespaces, as kubelet sets them: host network (no CNI here), pod-shared IPC, and the pid
/// namespace of `pid` mode (the sandbox's own when containers share one), or the target
/// container's.
fn namespace_options(pid: PidMode, target: Option<&str>) -> api::NamespaceOption {
    let mode = match (pid, target) {
        (_, Some(_)) => api::NamespaceMode::Target,
        (PidMode::Container, None) => api::NamespaceMode::Container,
        (PidMode::Pod, None) => api::NamespaceMode::Pod,
        (PidMode::Node, None) => api::NamespaceMode::Node,
    };
    api::NamespaceOption {
        network: api::NamespaceMode::Node as i32,
        pid: mode as i32,
        ipc: api::NamespaceMode::Pod as i32,
        target_id: target.unwrap_or_default().to_string(),
        ..Default::default()
    }
}

/// RunPodSandbox's config for `spec`, as kubelet writes it for a host-network pod.
pub fn sandbox_config(spec: &PodSpec, log_directory: &Path) -> api::PodSandboxConfig {
    let mut labels: HashMap<String, String> = spec.labels.clone().into_iter().collect();
    labels.extend(kubelet_pod_labels(&spec.name, &spec.namespace, &spec.uid));
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: spec.name.clone(),
            namespace: spec.namespace.clone(),
            uid: spec.uid.clone(),
            attempt: spec.attempt,
        }),
        // Host network: kubelet sets no hostname (the runtime would try to set the node's).
        hostname: String::new(),
        log_directory: log_directory.to_string_lossy().into_owned(),
        labels,
        annotations: spec.annotations.clone().into_iter().collect(),
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: spec.cgroup_parent(),
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(spec.pid, None)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// CreateContainer's config for `spec` in `pod`, as kubelet writes it.
pub fn container_config(pod: &Pod, spec: &ContainerSpec) -> api::ContainerConfig {
    let mut labels = pod.pod_labels();
    labels.insert(keys::CONTAINER_NAME.into(), spec.name.clone());
    let annotations: HashMap<String, String> = [
        (keys::CONTAINER_HASH, format!("{:x}", config_hash(spec))),
        (
            keys::CONTAINER_RESTART_COUNT,
            spec.restart_count.to_string(),
        ),
        (
            keys::CONTAINER_TERMINATION_MESSAGE_PATH,
            "/dev/termination-log".into(),
        ),
        (keys::CONTAINER_TERMINATION_MESSAGE_POLICY, "File".into()),
        (keys::POD_TERMINATION_GRACE_PERIOD, "30".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: spec.name.clone(),
            attempt: spec.restart_count,
        }),
        image: Some(api::ImageSpec {
            image: spec.image.clone(),
            user_specified_image: spec.image.clone(),
            ..Default::default()
        }),
        command: spec.command.clone(),
        args: spec.args.clone(),
        envs: spec
            .env
            .iter()
            .map(|(k, v)| api::KeyValue {
                key: k.clone(),
                value: v.clone(),
            })
            .collect(),
        labels,
        annotations,
        // Relative to the sandbox's log_directory, as kubelet's BuildContainerLogsPath.
        log_path: container_log_path(spec),
        linux: Some(api::LinuxContainerConfig {
            resources: Some(api::LinuxContainerResources {
                cpu_period: 100_000,
                cpu_shares: pod.qos.cpu_shares(),
                memory_limit_in_bytes: spec.memory_limit.unwrap_or(0),
                oom_score_adj: pod.qos.oom_score_adj(),
                ..Default::default()
            }),
            security_context: Some(api::LinuxContainerSecurityContext {
                namespace_options: Some(namespace_options(pod.pid, spec.target.as_deref())),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

pub fn container_log_path(spec: &ContainerSpec) -> String {
    format!("{}/{}.log", spec.name, spec.restart_count)
}

/// Stands in for kubelet's hash of the container spec: stable for the same spec.
fn config_hash(spec: &ContainerSpec) -> u32 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        &spec.name,
        &spec.image,
        &spec.command,
        &spec.args,
        &spec.memory_limit,
    )
        .hash(&mut h);
    h.finish() as u32
}

/// A random RFC 4122 version-4 UUID, the shape of a pod's metadata.uid.
pub fn new_uid() -> String {
    let mut b: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

fn rfc3339_now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use observer::cri::KubeletLabels;

    #[test]
    fn cgroup_parents_follow_kubelet_cgroupfs_layout() {
        assert_eq!(
            Qos::Burstable.cgroup_parent("u1"),
            "/kubepods/burstable/podu1"
        );
        assert_eq!(
            Qos::BestEffort.cgroup_parent("u1"),
            "/kubepods/besteffort/podu1"
        );
        assert_eq!(Qos::Guaranteed.cgroup_parent("u1"), "/kubepods/podu1");
    }

    #[test]
    fn sandbox_config_is_kubelet_shaped() {
        let spec = PodSpec::new("web")
            .namespace("prod")
            .uid("u-1")
            .qos(Qos::BestEffort)
            .label("app", "web");
        let c = sandbox_config(&spec, Path::new("/logs/prod_web_u-1"));
        let md = c.metadata.as_ref().unwrap();
        assert_eq!(
            (md.name.as_str(), md.namespace.as_str(), md.uid.as_str()),
            ("web", "prod", "u-1")
        );
        assert_eq!(c.labels[keys::POD_NAME], "web");
        assert_eq!(c.labels[keys::POD_NAMESPACE], "prod");
        assert_eq!(c.labels[keys::POD_UID], "u-1");
        assert_eq!(c.labels["app"], "web");
        assert_eq!(c.annotations[keys::CONFIG_SOURCE], "api");
        assert!(c.hostname.is_empty());
        let linux = c.linux.as_ref().unwrap();
        assert_eq!(linux.cgroup_parent, "/kubepods/besteffort/podu-1");
        let ns = linux
            .security_context
            .as_ref()
            .unwrap()
            .namespace_options
            .as_ref()
            .unwrap();
        assert_eq!(ns.network, api::NamespaceMode::Node as i32);
    }

    #[test]
    fn container_config_is_kubelet_shaped() {
        let pod = Pod {
            sandbox_id: "s".into(),
            name: "web".into(),
            namespace: "prod".into(),
            uid: "u-1".into(),
            qos: Qos::Burstable,
            cgroup_parent: "/kubepods/burstable/podu-1".into(),
            pid: PidMode::Container,
            log_directory: "/logs".into(),
            sandbox_config: Default::default(),
            containers: vec![],
        };
        let spec = ContainerSpec::sh("app", "exit 3")
            .memory_limit_mib(32)
            .restart_count(2);
        let c = container_config(&pod, &spec);
        assert_eq!(c.command, ["/bin/sh", "-c", "exit 3"]);
        assert_eq!(c.metadata.as_ref().unwrap().attempt, 2);
        assert_eq!(c.log_path, "app/2.log");
        assert_eq!(c.container_name(), Some("app"));
        assert_eq!(c.pod_ref().unwrap().uid, "u-1");
        assert_eq!(c.restart_count(), Some(2));
        let r = c.linux.as_ref().unwrap().resources.as_ref().unwrap();
        assert_eq!(r.memory_limit_in_bytes, 32 << 20);
        assert_eq!(c.image.as_ref().unwrap().image, BUSYBOX_IMAGE);
    }

    #[test]
    fn uids_are_v4_uuids() {
        let u = new_uid();
        assert_eq!(u.len(), 36);
        assert_eq!(u.as_bytes()[14], b'4');
        assert!(matches!(u.as_bytes()[19], b'8' | b'9' | b'a' | b'b'));
        assert_ne!(new_uid(), u);
    }

    #[test]
    fn config_seen_is_rfc3339() {
        let seen = &PodSpec::new("x").annotations[keys::CONFIG_SEEN];
        let b = seen.as_bytes();
        assert!(
            b.len() >= 20 && b[4] == b'-' && b[10] == b'T' && seen.ends_with('Z'),
            "{seen}"
        );
    }
}
