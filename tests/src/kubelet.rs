//! An imitation of kubelet, kept beside the real one (tests/tests/cluster.rs runs deploy/ under a
//! real kubelet) only for what the real one cannot do on demand: start the DaemonSet's pod template
//! with one capability or one mount taken away, or with `observer check` as its command, many
//! times in a few seconds, with no rollout in between (tests/tests/deploy.rs).
//!
//! A pod template (deploy/daemonset.yaml's) turned into the CRI requests kubelet would send for it
//! (pkg/kubelet/kuberuntime: generatePodSandboxConfig, generateContainerConfig,
//! determineEffectiveSecurityContext, makeMounts, makeEnvironmentVariables,
//! generateLinuxContainerResources; pkg/kubelet/qos), so that a test runs the agent with exactly
//! the privileges and mounts the manifest gives it. Labels, annotations, log paths and metadata
//! come from [`crate::pod`]'s kubelet-shaped builders.
//!
//! What kubelet does that this does not, and why it does not matter here: no CNI (the caller
//! may move the pod to the node's network with [`KubeletPod::use_node_network`]), no service
//! links beyond KUBERNETES_SERVICE_*, no /etc/hosts file (containerd then mounts the sandbox's),
//! no hugepage limits, no pod-level sandbox resources (used by VM runtimes only), no AppArmor
//! (this host has none), and volume kinds other than hostPath and emptyDir are refused.
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    Container, EnvVar, PodSecurityContext, PodTemplateSpec, SeccompProfile, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use observer::cri::api;

use crate::pod::{self, PidMode, Qos};

/// kubelet's defaults (pkg/securitycontext/util.go) for containers that are not privileged.
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
pub const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];
const CFS_PERIOD_US: i64 = 100_000;
const MIN_QUOTA_US: i64 = 1_000;
const MIN_SHARES: i64 = 2;
const MAX_SHARES: i64 = 262_144;

/// What kubelet knows about its node that a pod spec does not say.
#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub ip: String,
    /// For a burstable container's oom_score_adj and resourceFieldRef of unset limits.
    pub memory_capacity: i64,
    pub cpu_capacity_milli: i64,
    /// cgroup2 mounted at /sys/fs/cgroup (decides how "no swap" is expressed).
    pub cgroup2_unified: bool,
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
    /// Where kubelet keeps the pod's own files (termination-log, emptyDirs): its pod directory.
    pub pods_dir: PathBuf,
    /// hostPath sources as this machine provides them: `/run/containerd` → a test's private
    /// containerd dir. A path not listed is used as it is.
    pub host_paths: BTreeMap<PathBuf, PathBuf>,
    /// Mounted where kubelet mounts the service-account token, if given.
    pub service_account_dir: Option<PathBuf>,
    /// The API server as the in-cluster config finds it (KUBERNETES_SERVICE_HOST/PORT), if any.
    pub api_server: Option<(String, u16)>,
    /// The ConfigMaps of the pod's namespace that `configMapKeyRef` reads: name → data.
    pub config_maps: BTreeMap<String, BTreeMap<String, String>>,
}

impl Node {
    /// This machine, as a kubelet on it would describe itself.
    pub fn this_machine(name: impl Into<String>, pods_dir: impl Into<PathBuf>) -> Result<Self> {
        let meminfo = std::fs::read_to_string("/proc/meminfo")?;
        let mem_kb: i64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .context("MemTotal in /proc/meminfo")?;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as i64;
        let cgroup2_unified = nix::sys::statfs::statfs("/sys/fs/cgroup")
            .map(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
            .unwrap_or(false);
        Ok(Node {
            name: name.into(),
            ip: "127.0.0.1".into(),
            memory_capacity: mem_kb * 1024,
            cpu_capacity_milli: cpus * 1000,
            cgroup2_unified,
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
            pods_dir: pods_dir.into(),
            host_paths: BTreeMap::new(),
            service_account_dir: None,
            api_server: None,
            config_maps: BTreeMap::new(),
        })
    }

    fn host_path(&self, path: &str) -> PathBuf {
        let p = Path::new(path);
        self.host_paths
            .get(p)
            .cloned()
            .unwrap_or_else(|| p.to_path_buf())
    }
}

/// The requests for one pod of the template: RunPodSandbox's config, then each container's
/// CreateContainer config, in the order kubelet starts them.
#[derive(Debug, Clone)]
pub struct KubeletPod {
    /// Name, namespace, uid, QoS, labels, annotations (what [`crate::Containerd`] tracks).
    pub spec: pod::PodSpec,
    pub sandbox: api::PodSandboxConfig,
    pub containers: Vec<api::ContainerConfig>,
}

impl KubeletPod {
    /// Moves the pod to the node's network namespace: the test containerd has no CNI to give it
    /// its own. kubelet sets no hostname for host-network pods (runc could not set one).
    pub fn use_node_network(&mut self) {
        self.sandbox.hostname.clear();
        self.sandbox.dns_config = None;
        let sandbox_ns = self
            .sandbox
            .linux
            .as_mut()
            .and_then(|l| l.security_context.as_mut())
            .and_then(|s| s.namespace_options.as_mut());
        if let Some(ns) = sandbox_ns {
            ns.network = api::NamespaceMode::Node as i32;
        }
        for c in &mut self.containers {
            let ns = c
                .linux
                .as_mut()
                .and_then(|l| l.security_context.as_mut())
                .and_then(|s| s.namespace_options.as_mut());
            if let Some(ns) = ns {
                ns.network = api::NamespaceMode::Node as i32;
            }
        }
    }

    pub fn container(&self, name: &str) -> Option<&api::ContainerConfig> {
        self.containers
            .iter()
            .find(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
    }

    pub fn container_mut(&mut self, name: &str) -> Option<&mut api::ContainerConfig> {
        self.containers
            .iter_mut()
            .find(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
    }
}

/// The pod template of a DaemonSet.
pub fn template(ds: &DaemonSet) -> Result<&PodTemplateSpec> {
    Ok(&ds.spec.template)
}

/// The DaemonSet controller's pod for `node`, then kubelet's CRI configs for it. Also checks the
/// hostPath volumes the way kubelet does before it starts anything (type Directory, CharDevice,
/// ...), and creates the pod's own files under `node.pods_dir`.
pub fn pod_for_node(
    ds: &DaemonSet,
    node: &Node,
    pod_name: &str,
    logs_root: &Path,
) -> Result<KubeletPod> {
    let namespace = ds
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    configs(template(ds)?, node, pod_name, &namespace, logs_root)
}

/// kubelet's CRI configs for a pod `pod_name` made from `template` and bound to `node`.
pub fn configs(
    template: &PodTemplateSpec,
    node: &Node,
    pod_name: &str,
    namespace: &str,
    logs_root: &Path,
) -> Result<KubeletPod> {
    let spec = template
        .spec
        .as_ref()
        .ok_or_else(|| anyhow!("pod template has no spec"))?;
    if spec.init_containers.as_ref().is_some_and(|c| !c.is_empty()) {
        bail!("init containers are not translated");
    }
    let meta = template.metadata.clone().unwrap_or_default();
    let qos = qos_class(&spec.containers);
    let pid = if spec.host_pid == Some(true) {
        PidMode::Node
    } else if spec.share_process_namespace == Some(true) {
        PidMode::Pod
    } else {
        PidMode::Container
    };
    let mut pspec = pod::PodSpec::new(pod_name)
        .namespace(namespace)
        .qos(qos)
        .pid(pid);
    for (k, v) in meta.labels.iter().flatten() {
        pspec = pspec.label(k, v);
    }
    for (k, v) in meta.annotations.iter().flatten() {
        pspec = pspec.annotation(k, v);
    }
    let log_directory = pspec.log_directory(logs_root);
    let pod_dir = node.pods_dir.join(&pspec.uid);

    let host_network = spec.host_network == Some(true);
    let ns = api::NamespaceOption {
        network: mode(host_network, api::NamespaceMode::Pod),
        pid: match pid {
            PidMode::Node => api::NamespaceMode::Node,
            PidMode::Pod => api::NamespaceMode::Pod,
            PidMode::Container => api::NamespaceMode::Container,
        } as i32,
        ipc: mode(spec.host_ipc == Some(true), api::NamespaceMode::Pod),
        ..Default::default()
    };
    let pod_sc = spec.security_context.clone().unwrap_or_default();

    let mut sandbox = pod::sandbox_config(&pspec, &log_directory);
    if !host_network {
        sandbox.hostname = spec
            .hostname
            .clone()
            .unwrap_or_else(|| pod_name.to_string());
    }
    sandbox.dns_config = dns_config(spec.dns_policy.as_deref(), host_network, namespace, node)?;
    sandbox.port_mappings = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .map(|p| api::PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => api::Protocol::Udp as i32,
                Some("SCTP") => api::Protocol::Sctp as i32,
                _ => api::Protocol::Tcp as i32,
            },
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect();
    let linux = sandbox.linux.get_or_insert_with(Default::default);
    linux.security_context = Some(api::LinuxSandboxSecurityContext {
        namespace_options: Some(ns.clone()),
        run_as_user: pod_sc.run_as_user.map(|value| api::Int64Value { value }),
        run_as_group: pod_sc.run_as_group.map(|value| api::Int64Value { value }),
        supplemental_groups: supplemental_groups(&pod_sc),
        // The sandbox is privileged when any container is (kubelet's HasPrivilegedContainer).
        privileged: spec.containers.iter().any(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        }),
        seccomp: Some(seccomp(pod_sc.seccomp_profile.as_ref())),
        ..Default::default()
    });
    linux.sysctls = pod_sc
        .sysctls
        .iter()
        .flatten()
        .map(|s| (s.name.clone(), s.value.clone()))
        .collect();

    let stand_in = pod::Pod {
        sandbox_id: String::new(),
        name: pspec.name.clone(),
        namespace: pspec.namespace.clone(),
        uid: pspec.uid.clone(),
        qos,
        pid,
        cgroup_parent: pspec.cgroup_parent(),
        log_directory: log_directory.clone(),
        sandbox_config: sandbox.clone(),
        containers: vec![],
    };
    let ctx = Ctx {
        template,
        spec,
        pod_name,
        namespace,
        uid: &pspec.uid,
        node,
        pod_dir: &pod_dir,
        qos,
        ns,
        pod_sc: &pod_sc,
    };
    let containers = spec
        .containers
        .iter()
        .map(|c| container_config(&ctx, &stand_in, c))
        .collect::<Result<Vec<_>>>()?;
    Ok(KubeletPod {
        spec: pspec,
        sandbox,
        containers,
    })
}

struct Ctx<'a> {
    template: &'a PodTemplateSpec,
    spec: &'a k8s_openapi::api::core::v1::PodSpec,
    pod_name: &'a str,
    namespace: &'a str,
    uid: &'a str,
    node: &'a Node,
    pod_dir: &'a Path,
    qos: Qos,
    ns: api::NamespaceOption,
    pod_sc: &'a PodSecurityContext,
}

fn mode(host: bool, otherwise: api::NamespaceMode) -> i32 {
    if host {
        api::NamespaceMode::Node as i32
    } else {
        otherwise as i32
    }
}

fn container_config(
    ctx: &Ctx<'_>,
    stand_in: &pod::Pod,
    c: &Container,
) -> Result<api::ContainerConfig> {
    let env = environment(ctx, c)?;
    let lookup: HashMap<&str, &str> = env
        .iter()
        .map(|kv| (kv.key.as_str(), kv.value.as_str()))
        .collect();
    let cspec = pod::ContainerSpec::new(c.name.clone())
        .image(c.image.clone().unwrap_or_default())
        .command(c.command.iter().flatten().map(|s| expand(s, &lookup)))
        .args(c.args.iter().flatten().map(|s| expand(s, &lookup)));
    let mut config = pod::container_config(stand_in, &cspec);
    config.envs = env;
    config.working_dir = c.working_dir.clone().unwrap_or_default();
    config.stdin = c.stdin == Some(true);
    config.stdin_once = c.stdin_once == Some(true);
    config.tty = c.tty == Some(true);
    config.mounts = mounts(ctx, c)?;
    let termination_path = c
        .termination_message_path
        .clone()
        .unwrap_or_else(|| "/dev/termination-log".into());
    config.annotations.insert(
        observer::cri::keys::CONTAINER_TERMINATION_MESSAGE_PATH.into(),
        termination_path,
    );
    let linux = config.linux.get_or_insert_with(Default::default);
    linux.resources = Some(resources(ctx, c)?);
    linux.security_context = Some(security_context(ctx, c)?);
    Ok(config)
}

/// kubelet's makeEnvironmentVariables: the API server's service variables, then the container's
/// env in order, each value expanded against the ones before it; fieldRef and resourceFieldRef
/// resolved as the downward API does.
fn environment(ctx: &Ctx<'_>, c: &Container) -> Result<Vec<api::KeyValue>> {
    if c.env_from.as_ref().is_some_and(|e| !e.is_empty()) {
        bail!("container {}: envFrom is not translated", c.name);
    }
    let mut env: Vec<(String, String)> = Vec::new();
    if let Some((host, port)) = &ctx.node.api_server {
        for (k, v) in [
            ("KUBERNETES_SERVICE_HOST", host.clone()),
            ("KUBERNETES_SERVICE_PORT", port.to_string()),
            ("KUBERNETES_SERVICE_PORT_HTTPS", port.to_string()),
        ] {
            env.push((k.into(), v));
        }
    }
    for var in c.env.iter().flatten() {
        let value = env_value(ctx, c, var, &env)?;
        env.retain(|(k, _)| k != &var.name);
        env.push((var.name.clone(), value));
    }
    Ok(env
        .into_iter()
        .map(|(key, value)| api::KeyValue { key, value })
        .collect())
}

fn env_value(
    ctx: &Ctx<'_>,
    c: &Container,
    var: &EnvVar,
    before: &[(String, String)],
) -> Result<String> {
    let Some(from) = &var.value_from else {
        let lookup: HashMap<&str, &str> = before
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        return Ok(expand(var.value.as_deref().unwrap_or(""), &lookup));
    };
    if let Some(f) = &from.field_ref {
        return field_ref(ctx, &f.field_path)
            .with_context(|| format!("env {} of container {}", var.name, c.name));
    }
    if let Some(r) = &from.resource_field_ref {
        return resource_field_ref(ctx, c, &r.resource, r.divisor.as_ref())
            .with_context(|| format!("env {} of container {}", var.name, c.name));
    }
    if let Some(r) = &from.config_map_key_ref {
        // kubelet refuses to start the container when the key is missing and not optional.
        let value = ctx
            .node
            .config_maps
            .get(&r.name)
            .and_then(|data| data.get(&r.key));
        return match (value, r.optional) {
            (Some(v), _) => Ok(v.clone()),
            (None, Some(true)) => Ok(String::new()),
            (None, _) => bail!(
                "env {} of container {}: configmap {} has no key {} (CreateContainerConfigError)",
                var.name,
                c.name,
                r.name,
                r.key
            ),
        };
    }
    bail!(
        "env {} of container {}: only fieldRef, resourceFieldRef and configMapKeyRef are translated",
        var.name,
        c.name
    )
}

/// The downward API's fields (pkg/fieldpath).
fn field_ref(ctx: &Ctx<'_>, path: &str) -> Result<String> {
    let meta = ctx.template.metadata.clone().unwrap_or_default();
    let keyed = |prefix: &str, map: Option<&BTreeMap<String, String>>| -> Option<String> {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?.to_string();
        Some(map.and_then(|m| m.get(&key)).cloned().unwrap_or_default())
    };
    Ok(match path {
        "metadata.name" => ctx.pod_name.to_string(),
        "metadata.namespace" => ctx.namespace.to_string(),
        "metadata.uid" => ctx.uid.to_string(),
        "spec.nodeName" => ctx.node.name.clone(),
        "spec.serviceAccountName" => ctx
            .spec
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".into()),
        "status.hostIP" | "status.hostIPs" => ctx.node.ip.clone(),
        _ => {
            if let Some(v) = keyed("metadata.labels['", meta.labels.as_ref()) {
                v
            } else if let Some(v) = keyed("metadata.annotations['", meta.annotations.as_ref()) {
                v
            } else {
                bail!("fieldRef {path} is not translated (no pod IP without CNI)")
            }
        }
    })
}

fn resource_field_ref(
    ctx: &Ctx<'_>,
    c: &Container,
    resource: &str,
    divisor: Option<&Quantity>,
) -> Result<String> {
    let (requests, limits) = requests_and_limits(c);
    let milli = match resource {
        "limits.cpu" => limits
            .get("cpu")
            .copied()
            .unwrap_or(ctx.node.cpu_capacity_milli as i128),
        "requests.cpu" => requests.get("cpu").copied().unwrap_or(0),
        "limits.memory" => limits
            .get("memory")
            .copied()
            .unwrap_or(ctx.node.memory_capacity as i128 * 1000),
        "requests.memory" => requests.get("memory").copied().unwrap_or(0),
        other => bail!("resourceFieldRef {other} is not translated"),
    };
    let divisor = match divisor {
        Some(q) => quantity_milli(&q.0)?,
        None => 1000,
    };
    // The downward API rounds up to a whole number of divisors.
    Ok(((milli + divisor - 1) / divisor).to_string())
}

/// kubelet's $(VAR) expansion (third_party/forked/golang/expansion): `$$` is a literal `$`, an
/// undefined `$(VAR)` stays as written.
pub fn expand(input: &str, vars: &HashMap<&str, &str>) -> String {
    let mut out = String::new();
    let mut rest = input;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(end) => {
                    let name = &body[..end];
                    match vars.get(name) {
                        Some(v) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &body[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = body;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// kubelet's makeMounts for the volume kinds a node agent uses, plus the termination-message
/// file and the service-account token it adds itself.
fn mounts(ctx: &Ctx<'_>, c: &Container) -> Result<Vec<api::Mount>> {
    let volumes = ctx.spec.volumes.as_deref().unwrap_or_default();
    let mut out = Vec::new();
    for vm in c.volume_mounts.iter().flatten() {
        if vm.sub_path.is_some() || vm.sub_path_expr.is_some() {
            bail!("volumeMount {}: subPath is not translated", vm.name);
        }
        // containerd 1.6 does not announce recursive read-only support, so kubelet refuses
        // Enabled and falls back to a plain read-only mount for IfPossible.
        if vm.recursive_read_only.as_deref() == Some("Enabled") {
            bail!(
                "volumeMount {}: recursiveReadOnly Enabled needs containerd 2.0+",
                vm.name
            );
        }
        let volume = volumes
            .iter()
            .find(|v| v.name == vm.name)
            .ok_or_else(|| anyhow!("volumeMount {} names no volume", vm.name))?;
        let host_path = if let Some(hp) = &volume.host_path {
            let path = ctx.node.host_path(&hp.path);
            check_host_path(&path, hp.type_.as_deref().unwrap_or(""))
                .with_context(|| format!("volume {} (hostPath {})", volume.name, hp.path))?;
            path
        } else if volume.empty_dir.is_some() {
            let dir = ctx
                .pod_dir
                .join("volumes/kubernetes.io~empty-dir")
                .join(&volume.name);
            std::fs::create_dir_all(&dir)?;
            dir
        } else {
            bail!(
                "volume {}: only hostPath and emptyDir are translated",
                volume.name
            );
        };
        out.push(api::Mount {
            container_path: vm.mount_path.clone(),
            host_path: host_path.to_string_lossy().into_owned(),
            readonly: vm.read_only == Some(true),
            propagation: match vm.mount_propagation.as_deref() {
                Some("HostToContainer") => api::MountPropagation::PropagationHostToContainer,
                Some("Bidirectional") => api::MountPropagation::PropagationBidirectional,
                _ => api::MountPropagation::PropagationPrivate,
            } as i32,
            ..Default::default()
        });
    }
    let automount = ctx.spec.automount_service_account_token != Some(false);
    if let (true, Some(dir)) = (automount, &ctx.node.service_account_dir) {
        out.push(api::Mount {
            container_path: "/var/run/secrets/kubernetes.io/serviceaccount".into(),
            host_path: dir.to_string_lossy().into_owned(),
            readonly: true,
            ..Default::default()
        });
    }
    // kubelet's per-container termination-message file, writable even on a read-only rootfs.
    let termination = ctx
        .pod_dir
        .join("containers")
        .join(&c.name)
        .join(pod::new_uid());
    if let Some(parent) = termination.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&termination, "")?;
    out.push(api::Mount {
        container_path: c
            .termination_message_path
            .clone()
            .unwrap_or_else(|| "/dev/termination-log".into()),
        host_path: termination.to_string_lossy().into_owned(),
        ..Default::default()
    });
    Ok(out)
}

/// kubelet's hostPath type checks (pkg/volume/hostpath), done before the pod starts.
fn check_host_path(path: &Path, kind: &str) -> Result<()> {
    let meta = std::fs::metadata(path);
    let ft = meta.as_ref().map(|m| m.file_type());
    let ok = match kind {
        "" => true,
        "DirectoryOrCreate" => {
            std::fs::create_dir_all(path)?;
            true
        }
        "Directory" => ft.is_ok_and(|t| t.is_dir()),
        "FileOrCreate" => {
            if meta.is_err() {
                std::fs::write(path, "")?;
            }
            true
        }
        "File" => ft.is_ok_and(|t| t.is_file()),
        "Socket" => ft.is_ok_and(|t| t.is_socket()),
        "CharDevice" => ft.is_ok_and(|t| t.is_char_device()),
        "BlockDevice" => ft.is_ok_and(|t| t.is_block_device()),
        other => bail!("unknown hostPath type {other}"),
    };
    if !ok {
        bail!("{} is not a {kind} on this host", path.display());
    }
    Ok(())
}

/// kubelet's DNS config for the pod (pkg/kubelet/network/dns).
fn dns_config(
    policy: Option<&str>,
    host_network: bool,
    namespace: &str,
    node: &Node,
) -> Result<Option<api::DnsConfig>> {
    let cluster = || api::DnsConfig {
        servers: node.cluster_dns.clone(),
        searches: vec![
            format!("{namespace}.svc.{}", node.cluster_domain),
            format!("svc.{}", node.cluster_domain),
            node.cluster_domain.clone(),
        ],
        options: vec!["ndots:5".into()],
    };
    Ok(match policy.unwrap_or("ClusterFirst") {
        // A host-network pod with ClusterFirst gets the node's resolver (kubelet's fallback).
        "ClusterFirst" if host_network => None,
        "ClusterFirst" | "ClusterFirstWithHostNet" => Some(cluster()),
        "Default" => None,
        "None" => Some(api::DnsConfig::default()),
        other => bail!("dnsPolicy {other} is not translated"),
    })
}

/// Requests and limits in milli-units (cpu: millicores; memory: milli-bytes), requests defaulted
/// to limits as the API server does.
fn requests_and_limits(c: &Container) -> (BTreeMap<String, i128>, BTreeMap<String, i128>) {
    let parse = |m: Option<&BTreeMap<String, Quantity>>| -> BTreeMap<String, i128> {
        m.into_iter()
            .flatten()
            .filter_map(|(k, q)| Some((k.clone(), quantity_milli(&q.0).ok()?)))
            .collect()
    };
    let r = c.resources.as_ref();
    let limits = parse(r.and_then(|r| r.limits.as_ref()));
    let mut requests = parse(r.and_then(|r| r.requests.as_ref()));
    for (k, v) in &limits {
        requests.entry(k.clone()).or_insert(*v);
    }
    (requests, limits)
}

/// The pod's QoS class (pkg/apis/core/v1/helper/qos), from cpu and memory.
pub fn qos_class(containers: &[Container]) -> Qos {
    let mut any = false;
    let mut guaranteed = true;
    for c in containers {
        let (requests, limits) = requests_and_limits(c);
        for res in ["cpu", "memory"] {
            let (r, l) = (requests.get(res), limits.get(res));
            any |= r.is_some_and(|v| *v != 0) || l.is_some_and(|v| *v != 0);
            if l.is_none() || r != l {
                guaranteed = false;
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => Qos::BestEffort,
        (true, true) => Qos::Guaranteed,
        (true, false) => Qos::Burstable,
    }
}

/// generateLinuxContainerResources: shares from the request, CFS quota from the limit, the
/// memory limit, oom_score_adj from the QoS class, and no swap.
fn resources(ctx: &Ctx<'_>, c: &Container) -> Result<api::LinuxContainerResources> {
    let (requests, limits) = requests_and_limits(c);
    let cpu_request = requests.get("cpu").copied().unwrap_or(0) as i64;
    let cpu_limit = limits.get("cpu").copied().unwrap_or(0) as i64;
    let memory_limit = limits
        .get("memory")
        .map(|m| ((m + 999) / 1000) as i64)
        .unwrap_or(0);
    let memory_request = requests
        .get("memory")
        .map(|m| ((m + 999) / 1000) as i64)
        .unwrap_or(0);
    let shares_of = if cpu_request == 0 && cpu_limit != 0 {
        cpu_limit
    } else {
        cpu_request
    };
    let mut r = api::LinuxContainerResources {
        cpu_shares: milli_cpu_to_shares(shares_of),
        memory_limit_in_bytes: memory_limit,
        oom_score_adj: oom_score_adj(ctx.qos, memory_request, ctx.node.memory_capacity),
        ..Default::default()
    };
    if cpu_limit != 0 {
        r.cpu_period = CFS_PERIOD_US;
        r.cpu_quota = (cpu_limit * CFS_PERIOD_US / 1000).max(MIN_QUOTA_US);
    }
    // Swap off (NodeSwap not enabled): cgroup v1 says it with memsw = the memory limit.
    if ctx.node.cgroup2_unified {
        r.unified.insert("memory.swap.max".into(), "0".into());
    } else {
        r.memory_swap_limit_in_bytes = memory_limit;
    }
    Ok(r)
}

fn milli_cpu_to_shares(milli: i64) -> i64 {
    if milli == 0 {
        return MIN_SHARES;
    }
    (milli * 1024 / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// pkg/kubelet/qos/policy.go GetContainerOOMScoreAdjust.
pub fn oom_score_adj(qos: Qos, memory_request: i64, memory_capacity: i64) -> i64 {
    match qos {
        Qos::Guaranteed => -997,
        Qos::BestEffort => 1000,
        Qos::Burstable => {
            let adj = 1000 - (1000 * memory_request) / memory_capacity.max(1);
            if adj < 1000 - 997 {
                1000 - 997
            } else if adj == 1000 {
                999
            } else {
                adj
            }
        }
    }
}

/// determineEffectiveSecurityContext + convertToRuntimeSecurityContext: the container's fields
/// over the pod's.
fn security_context(ctx: &Ctx<'_>, c: &Container) -> Result<api::LinuxContainerSecurityContext> {
    let sc: SecurityContext = c.security_context.clone().unwrap_or_default();
    let pod_sc = ctx.pod_sc;
    let privileged = sc.privileged == Some(true);
    let run_as_user = sc
        .run_as_user
        .or(pod_sc.run_as_user)
        // The image says no USER: kubelet takes the image's user, root.
        .unwrap_or(0);
    let run_as_non_root = sc.run_as_non_root.or(pod_sc.run_as_non_root) == Some(true);
    if run_as_non_root && run_as_user == 0 {
        bail!(
            "container {}: runAsNonRoot with uid 0 (kubelet refuses to start it)",
            c.name
        );
    }
    let caps = sc.capabilities.clone().unwrap_or_default();
    let no_new_privs = !privileged && sc.allow_privilege_escalation == Some(false);
    let (masked, readonly) = if privileged || sc.proc_mount.as_deref() == Some("Unmasked") {
        (vec![], vec![])
    } else {
        (
            DEFAULT_MASKED_PATHS.iter().map(|s| s.to_string()).collect(),
            DEFAULT_READONLY_PATHS
                .iter()
                .map(|s| s.to_string())
                .collect(),
        )
    };
    Ok(api::LinuxContainerSecurityContext {
        capabilities: Some(api::Capability {
            add_capabilities: caps.add.clone().unwrap_or_default(),
            drop_capabilities: caps.drop.clone().unwrap_or_default(),
            ..Default::default()
        }),
        privileged,
        namespace_options: Some(ctx.ns.clone()),
        run_as_user: Some(api::Int64Value { value: run_as_user }),
        run_as_group: sc
            .run_as_group
            .or(pod_sc.run_as_group)
            .map(|value| api::Int64Value { value }),
        readonly_rootfs: sc.read_only_root_filesystem == Some(true),
        supplemental_groups: supplemental_groups(pod_sc),
        no_new_privs,
        masked_paths: masked,
        readonly_paths: readonly,
        seccomp: Some(seccomp(
            sc.seccomp_profile
                .as_ref()
                .or(pod_sc.seccomp_profile.as_ref()),
        )),
        ..Default::default()
    })
}

fn supplemental_groups(sc: &PodSecurityContext) -> Vec<i64> {
    let mut g: Vec<i64> = sc.supplemental_groups.clone().unwrap_or_default();
    g.extend(sc.fs_group);
    g
}

/// Unset means Unconfined: kubelet's --seccomp-default is off unless the node says otherwise.
fn seccomp(profile: Option<&SeccompProfile>) -> api::SecurityProfile {
    use api::security_profile::ProfileType;
    match profile.map(|p| (p.type_.as_str(), p.localhost_profile.clone())) {
        Some(("RuntimeDefault", _)) => api::SecurityProfile {
            profile_type: ProfileType::RuntimeDefault as i32,
            ..Default::default()
        },
        Some(("Localhost", Some(path))) => api::SecurityProfile {
            profile_type: ProfileType::Localhost as i32,
            localhost_ref: format!("/var/lib/kubelet/seccomp/{path}"),
        },
        _ => api::SecurityProfile {
            profile_type: ProfileType::Unconfined as i32,
            ..Default::default()
        },
    }
}

/// A resource quantity in thousandths of its unit, rounded up ("250m" → 250, "128Mi" →
/// 134217728000, "1.5" → 1500, "1e3" → 1000000).
pub fn quantity_milli(q: &str) -> Result<i128> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let (mul_num, mul_den): (i128, i128) = match suffix {
        "" => (1000, 1),
        "m" => (1, 1),
        "k" => (1_000_000, 1),
        "M" => (1_000_000_000, 1),
        "G" => (1_000_000_000_000, 1),
        "T" => (1_000_000_000_000_000, 1),
        "Ki" => (1000 << 10, 1),
        "Mi" => (1000 << 20, 1),
        "Gi" => (1000 << 30, 1),
        "Ti" => (1000 << 40, 1),
        "Pi" => (1000 << 50, 1),
        s if s.starts_with(['e', 'E']) => {
            let exp: u32 = s[1..].parse().context("quantity exponent")?;
            (1000 * 10i128.pow(exp), 1)
        }
        other => bail!("quantity {q}: unknown suffix {other:?}"),
    };
    let negative = number.starts_with('-');
    let digits = number.trim_start_matches(['+', '-']);
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if int.is_empty() && frac.is_empty() {
        bail!("quantity {q}: no number");
    }
    let scale = 10i128.pow(frac.len() as u32);
    let whole: i128 = format!("{int}{frac}").parse().context("quantity digits")?;
    let num = whole * mul_num;
    let den = scale * mul_den;
    let v = (num + den - 1) / den;
    Ok(if negative { -v } else { v })
}

/// The capabilities the container gets, as CAP_ names (kubelet passes the manifest's strings;
/// containerd adds the prefix).
pub fn capability_names(config: &api::ContainerConfig) -> Vec<String> {
    config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.capabilities.as_ref())
        .map(|c| {
            c.add_capabilities
                .iter()
                .map(|n| {
                    if n.starts_with("CAP_") {
                        n.clone()
                    } else {
                        format!("CAP_{n}")
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;

    fn container(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        let q = |v: &[(&str, &str)]| {
            (!v.is_empty()).then(|| {
                v.iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect()
            })
        };
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                requests: q(requests),
                limits: q(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity_milli("250m").unwrap(), 250);
        assert_eq!(quantity_milli("1").unwrap(), 1000);
        assert_eq!(quantity_milli("1.5").unwrap(), 1500);
        assert_eq!(quantity_milli("128Mi").unwrap(), 128 * 1000 * (1 << 20));
        assert_eq!(quantity_milli("1G").unwrap(), 1_000_000_000_000);
        assert_eq!(quantity_milli("1e3").unwrap(), 1_000_000);
        assert_eq!(quantity_milli("0.0001").unwrap(), 1, "rounded up");
        assert!(quantity_milli("12Q").is_err());
        assert!(quantity_milli("Mi").is_err());
    }

    #[test]
    fn qos_classes() {
        assert_eq!(qos_class(&[container(&[], &[])]), Qos::BestEffort);
        assert_eq!(
            qos_class(&[container(&[], &[("cpu", "1"), ("memory", "1Gi")])]),
            Qos::Guaranteed,
            "requests default to limits"
        );
        assert_eq!(
            qos_class(&[container(
                &[("cpu", "500m"), ("memory", "1Gi")],
                &[("cpu", "1"), ("memory", "1Gi")]
            )]),
            Qos::Burstable
        );
        assert_eq!(
            qos_class(&[container(&[], &[("memory", "1Gi")])]),
            Qos::Burstable,
            "no cpu limit"
        );
    }

    #[test]
    fn oom_score_adj_follows_kubelet() {
        let gi = 1 << 30;
        assert_eq!(oom_score_adj(Qos::Guaranteed, 0, gi), -997);
        assert_eq!(oom_score_adj(Qos::BestEffort, 0, gi), 1000);
        assert_eq!(oom_score_adj(Qos::Burstable, gi / 2, gi), 500);
        assert_eq!(oom_score_adj(Qos::Burstable, 0, gi), 999);
        assert_eq!(oom_score_adj(Qos::Burstable, gi, gi), 3);
    }

    #[test]
    fn shares_and_quota() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(250), 256);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
    }

    #[test]
    fn expansion() {
        let vars: HashMap<&str, &str> = [("A", "x"), ("B", "y")].into_iter().collect();
        assert_eq!(expand("$(A)-$(B)", &vars), "x-y");
        assert_eq!(expand("$$(A)", &vars), "$(A)");
        assert_eq!(expand("$(C)", &vars), "$(C)");
        assert_eq!(expand("a$b", &vars), "a$b");
        assert_eq!(expand("$(A", &vars), "$(A");
    }
}
