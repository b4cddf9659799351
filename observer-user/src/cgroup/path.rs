//! What a cgroup path means to Kubernetes: kubepods root, QoS level, pod, container, conmon.
//!
//! Pure and allocation-free: the classification runs for every cgroup mkdir on the node, so ids are
//! kept inline ([`PodUid`], [`ContainerId`] are `Copy`) and the path is only sliced, never copied.
//! The layouts are those of ARCHITECTURE.md "Cgroup layouts"; the builders ([`pod_cgroup_path`],
//! [`container_cgroup_path`], ...) write the same layouts, so tests can lay out cgroup trees
//! exactly as kubelet and the runtimes do.
use std::fmt;

pub use crate::model::{ContainerId, PodUid};

/// Pod QoS class, as kubelet names it in `status.qosClass`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl Qos {
    pub const ALL: [Qos; 3] = [Qos::Guaranteed, Qos::Burstable, Qos::BestEffort];

    pub fn as_str(self) -> &'static str {
        match self {
            Qos::Guaranteed => "Guaranteed",
            Qos::Burstable => "Burstable",
            Qos::BestEffort => "BestEffort",
        }
    }

    /// Name of the QoS-level cgroup; Guaranteed pods sit directly under the kubepods root.
    fn cgroup_name(self) -> Option<&'static str> {
        match self {
            Qos::Guaranteed => None,
            Qos::Burstable => Some("burstable"),
            Qos::BestEffort => Some("besteffort"),
        }
    }

    fn from_cgroup_name(name: &[u8]) -> Option<Qos> {
        match name {
            b"burstable" => Some(Qos::Burstable),
            b"besteffort" => Some(Qos::BestEffort),
            _ => None,
        }
    }
}

impl fmt::Display for Qos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// kubelet's `cgroupDriver`: how the pod cgroups are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CgroupDriver {
    Cgroupfs,
    Systemd,
}

impl CgroupDriver {
    pub const ALL: [CgroupDriver; 2] = [CgroupDriver::Cgroupfs, CgroupDriver::Systemd];

    pub fn as_str(self) -> &'static str {
        match self {
            CgroupDriver::Cgroupfs => "cgroupfs",
            CgroupDriver::Systemd => "systemd",
        }
    }
}

impl fmt::Display for CgroupDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Container runtime that created a container cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Runtime {
    Containerd,
    Crio,
    Docker,
}

impl Runtime {
    pub const ALL: [Runtime; 3] = [Runtime::Containerd, Runtime::Crio, Runtime::Docker];

    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Containerd => "containerd",
            Runtime::Crio => "cri-o",
            Runtime::Docker => "docker",
        }
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The uid as the driver writes it in a cgroup name: the systemd driver puts '_' for '-',
/// which separates slice levels.
fn push_uid(uid: &PodUid, driver: CgroupDriver, out: &mut String) {
    match driver {
        CgroupDriver::Cgroupfs => out.push_str(uid.as_str()),
        CgroupDriver::Systemd => {
            out.extend(uid.as_str().chars().map(|c| if c == '-' { '_' } else { c }))
        }
    }
}

/// A pod cgroup, as kubelet named it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PodCgroup {
    pub uid: PodUid,
    pub qos: Qos,
    pub driver: CgroupDriver,
}

impl PodCgroup {
    /// The pod's cgroup path, relative to the hierarchy root, with the kubepods root at the top.
    pub fn cgroup_path(&self) -> String {
        pod_cgroup_path(self.driver, self.qos, &self.uid)
    }
}

/// A container's cgroup, or a cgroup below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ContainerRef {
    pub pod: PodCgroup,
    /// `None` for the bare `<pod>/<id>` layout, which containerd and docker (cgroupfs driver)
    /// share: only the CRI can tell them apart.
    pub runtime: Option<Runtime>,
    pub id: ContainerId,
    /// The path is a cgroup below the container's own (made by the runtime or inside the
    /// container); its processes still belong to the container.
    pub nested: bool,
}

impl ContainerRef {
    /// The container's own cgroup path (never the nested one), kubepods root at the top.
    pub fn cgroup_path(&self) -> String {
        let mut s = self.pod.cgroup_path();
        s.push('/');
        push_container_component(&mut s, self.pod.driver, self.runtime, &self.id);
        s
    }
}

/// CRI-O's conmon cgroup for a container (`crio-conmon-<id>[.scope]`): the monitor process,
/// not part of the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConmonRef {
    pub pod: PodCgroup,
    pub id: ContainerId,
}

/// What a cgroup path is. See [`super::KubeRoots::classify`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CgroupKind {
    /// `kubepods`, `kubepods.slice` (or a systemd parent's `<prefix>-kubepods.slice`).
    KubepodsRoot {
        driver: CgroupDriver,
    },
    /// `kubepods/burstable`, `kubepods-besteffort.slice`, ... (Guaranteed has none).
    QosRoot {
        driver: CgroupDriver,
        qos: Qos,
    },
    Pod(PodCgroup),
    Container(ContainerRef),
    Conmon(ConmonRef),
    /// Below a kubepods root but no known shape (a malformed uid or id, an unknown runtime's
    /// naming, a path the kernel truncated). Worth counting: it means a container we cannot see.
    Unrecognized,
    /// Shaped like kubelet's (a kubepods, pod or container cgroup) but outside kubelet's own
    /// roots: made by whoever can write that subtree, so never a pod or a container
    /// ([`super::KubeRoots::classify`]). Counted where it is seen.
    Foreign,
    /// No kubepods component at all: system services, user sessions. Normal, not an anomaly.
    Outside,
}

impl CgroupKind {
    /// The pod this cgroup belongs to (pod, container, nested or conmon cgroup).
    pub fn pod(&self) -> Option<&PodCgroup> {
        match self {
            CgroupKind::Pod(p) => Some(p),
            CgroupKind::Container(c) => Some(&c.pod),
            CgroupKind::Conmon(c) => Some(&c.pod),
            _ => None,
        }
    }

    pub fn container(&self) -> Option<&ContainerRef> {
        match self {
            CgroupKind::Container(c) => Some(c),
            _ => None,
        }
    }
}

/// The shape of a cgroup path relative to its hierarchy root (leading, trailing and doubled
/// slashes are ignored), taking the first `kubepods` component as the root wherever it is. Only
/// a shape: anyone with a writable cgroup subtree can make such a path, so what a kernel path is
/// is decided by [`super::KubeRoots::classify`], anchored at kubelet's own roots; this tells the
/// roots' tests and a path outside them ([`CgroupKind::Foreign`]) from one of no kubepods shape.
pub(super) fn classify(path: &str) -> CgroupKind {
    classify_bytes(path.as_bytes())
}

/// [`classify`] on raw bytes: cgroup names need not be UTF-8 (the kernel sends bytes).
pub(super) fn classify_bytes(path: &[u8]) -> CgroupKind {
    let mut comps = components(path);
    loop {
        let Some(c) = comps.next() else {
            return CgroupKind::Outside;
        };
        if let Some((driver, stem)) = kubepods_root(c) {
            return classify_below(driver, stem, comps);
        }
    }
}

/// The non-empty components of a path.
pub(super) fn components(path: &[u8]) -> impl Iterator<Item = &[u8]> + '_ {
    path.split(|&b| b == b'/').filter(|c| !c.is_empty())
}

/// A kubepods root's own name: `kubepods` (cgroupfs), `kubepods.slice` or a systemd parent's
/// `<prefix>-kubepods.slice`; the driver and the stem its children's slice names start with.
pub(super) fn kubepods_root(c: &[u8]) -> Option<(CgroupDriver, &[u8])> {
    if c == b"kubepods" {
        return Some((CgroupDriver::Cgroupfs, c));
    }
    let stem = c.strip_suffix(b".slice")?;
    (stem == b"kubepods" || stem.ends_with(b"-kubepods")).then_some((CgroupDriver::Systemd, stem))
}

/// What the components below a kubepods root (`stem`, named by `driver`) make of the path.
pub(super) fn classify_below<'a>(
    driver: CgroupDriver,
    stem: &[u8],
    mut comps: impl Iterator<Item = &'a [u8]>,
) -> CgroupKind {
    let pod = match classify_below_root(driver, stem, &mut comps) {
        Ok(pod) => pod,
        Err(kind) => return kind,
    };
    let Some(c) = comps.next() else {
        return CgroupKind::Pod(pod);
    };
    let nested = comps.next().is_some();
    match parse_container_component(c) {
        Some(Child::Container(runtime, id)) => CgroupKind::Container(ContainerRef {
            pod,
            runtime,
            id,
            nested,
        }),
        // conmon makes no sub-cgroups; anything below it is still conmon's.
        Some(Child::Conmon(id)) => CgroupKind::Conmon(ConmonRef { pod, id }),
        None => CgroupKind::Unrecognized,
    }
}

/// Walks the QoS and pod levels; `Err` carries the final answer when the path stops above a pod
/// or does not fit.
fn classify_below_root<'a>(
    driver: CgroupDriver,
    stem: &[u8],
    comps: &mut impl Iterator<Item = &'a [u8]>,
) -> Result<PodCgroup, CgroupKind> {
    let Some(c1) = comps.next() else {
        return Err(CgroupKind::KubepodsRoot { driver });
    };
    let pod = |uid, qos| PodCgroup { uid, qos, driver };
    match driver {
        CgroupDriver::Cgroupfs => {
            if let Some(qos) = Qos::from_cgroup_name(c1) {
                let Some(c2) = comps.next() else {
                    return Err(CgroupKind::QosRoot { driver, qos });
                };
                c2.strip_prefix(b"pod")
                    .and_then(|u| PodUid::parse_with_sep(u, b'-'))
                    .map(|uid| pod(uid, qos))
                    .ok_or(CgroupKind::Unrecognized)
            } else {
                c1.strip_prefix(b"pod")
                    .and_then(|u| PodUid::parse_with_sep(u, b'-'))
                    .map(|uid| pod(uid, Qos::Guaranteed))
                    .ok_or(CgroupKind::Unrecognized)
            }
        }
        CgroupDriver::Systemd => {
            // systemd spells a slice's ancestry in its name: `<stem>-<name>.slice`.
            let rest = slice_child(c1, stem).ok_or(CgroupKind::Unrecognized)?;
            if let Some(qos) = Qos::from_cgroup_name(rest) {
                let Some(c2) = comps.next() else {
                    return Err(CgroupKind::QosRoot { driver, qos });
                };
                slice_child(c2, stem)
                    .and_then(|r| r.strip_prefix(rest))
                    .and_then(|r| r.strip_prefix(b"-pod"))
                    .and_then(|u| PodUid::parse_with_sep(u, b'_'))
                    .map(|uid| pod(uid, qos))
                    .ok_or(CgroupKind::Unrecognized)
            } else {
                rest.strip_prefix(b"pod")
                    .and_then(|u| PodUid::parse_with_sep(u, b'_'))
                    .map(|uid| pod(uid, Qos::Guaranteed))
                    .ok_or(CgroupKind::Unrecognized)
            }
        }
    }
}

/// `<stem>-<rest>.slice` → `rest`.
fn slice_child<'a>(comp: &'a [u8], stem: &[u8]) -> Option<&'a [u8]> {
    comp.strip_suffix(b".slice")?
        .strip_prefix(stem)?
        .strip_prefix(b"-")
}

enum Child {
    Container(Option<Runtime>, ContainerId),
    Conmon(ContainerId),
}

/// Every runtime shape is accepted under either kubelet driver: the pod level already fixed the
/// driver, and a runtime whose driver disagrees with kubelet's is still that runtime.
fn parse_container_component(c: &[u8]) -> Option<Child> {
    if let Some(id) = ContainerId::parse_bytes(c) {
        return Some(Child::Container(None, id));
    }
    let (unit, scope) = match c.strip_suffix(b".scope") {
        Some(u) => (u, true),
        None => (c, false),
    };
    if let Some(id) = unit.strip_prefix(b"crio-conmon-") {
        return ContainerId::parse_bytes(id).map(Child::Conmon);
    }
    let (runtime, id) = if let Some(id) = unit.strip_prefix(b"crio-") {
        (Runtime::Crio, id)
    } else if let Some(id) = unit.strip_prefix(b"cri-containerd-").filter(|_| scope) {
        (Runtime::Containerd, id)
    } else if let Some(id) = unit.strip_prefix(b"docker-").filter(|_| scope) {
        (Runtime::Docker, id)
    } else {
        return None;
    };
    ContainerId::parse_bytes(id).map(|id| Child::Container(Some(runtime), id))
}

/// The container a cgroup's name alone names (`<id>`, `cri-containerd-<id>.scope`, `crio-<id>`,
/// ...): what the kernel log gives where it prints a cgroup's name rather than its path (the
/// `cpuset=` of an OOM kill).
pub(crate) fn container_of_name(name: &str) -> Option<ContainerId> {
    match parse_container_component(name.as_bytes())? {
        Child::Container(_, id) => Some(id),
        Child::Conmon(_) => None,
    }
}

/// The kubepods root kubelet creates (with the default `--cgroup-root=/`).
pub(crate) fn kubepods_root_path(driver: CgroupDriver) -> &'static str {
    match driver {
        CgroupDriver::Cgroupfs => "/kubepods",
        CgroupDriver::Systemd => "/kubepods.slice",
    }
}

/// The QoS-level cgroup; for Guaranteed that is the kubepods root itself.
pub(crate) fn qos_cgroup_path(driver: CgroupDriver, qos: Qos) -> String {
    let mut s = String::from(kubepods_root_path(driver));
    if let Some(name) = qos.cgroup_name() {
        match driver {
            CgroupDriver::Cgroupfs => {
                s.push('/');
                s.push_str(name);
            }
            CgroupDriver::Systemd => {
                s.push_str("/kubepods-");
                s.push_str(name);
                s.push_str(".slice");
            }
        }
    }
    s
}

/// The pod cgroup kubelet creates, relative to the hierarchy root (prefix it with a test root
/// or kubelet's `--cgroup-root` as needed).
pub fn pod_cgroup_path(driver: CgroupDriver, qos: Qos, uid: &PodUid) -> String {
    let mut s = qos_cgroup_path(driver, qos);
    match driver {
        CgroupDriver::Cgroupfs => s.push_str("/pod"),
        CgroupDriver::Systemd => {
            s.push_str("/kubepods-");
            if let Some(name) = qos.cgroup_name() {
                s.push_str(name);
                s.push('-');
            }
            s.push_str("pod");
        }
    }
    push_uid(uid, driver, &mut s);
    if driver == CgroupDriver::Systemd {
        s.push_str(".slice");
    }
    s
}

/// The container cgroup the runtime creates below the pod's, as in ARCHITECTURE.md's table.
pub fn container_cgroup_path(
    driver: CgroupDriver,
    qos: Qos,
    uid: &PodUid,
    runtime: Runtime,
    id: &ContainerId,
) -> String {
    let mut s = pod_cgroup_path(driver, qos, uid);
    s.push('/');
    push_container_component(&mut s, driver, Some(runtime), id);
    s
}

/// CRI-O's conmon cgroup for container `id` (with `conmon_cgroup = "pod"`).
pub fn conmon_cgroup_path(
    driver: CgroupDriver,
    qos: Qos,
    uid: &PodUid,
    id: &ContainerId,
) -> String {
    let mut s = pod_cgroup_path(driver, qos, uid);
    s.push_str("/crio-conmon-");
    s.push_str(id.as_str());
    if driver == CgroupDriver::Systemd {
        s.push_str(".scope");
    }
    s
}

fn push_container_component(
    s: &mut String,
    driver: CgroupDriver,
    runtime: Option<Runtime>,
    id: &ContainerId,
) {
    let (prefix, suffix) = match (driver, runtime) {
        (_, None) => ("", ""),
        (CgroupDriver::Cgroupfs, Some(Runtime::Containerd | Runtime::Docker)) => ("", ""),
        (CgroupDriver::Cgroupfs, Some(Runtime::Crio)) => ("crio-", ""),
        (CgroupDriver::Systemd, Some(Runtime::Containerd)) => ("cri-containerd-", ".scope"),
        (CgroupDriver::Systemd, Some(Runtime::Crio)) => ("crio-", ".scope"),
        (CgroupDriver::Systemd, Some(Runtime::Docker)) => ("docker-", ".scope"),
    };
    s.push_str(prefix);
    s.push_str(id.as_str());
    s.push_str(suffix);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const UID: &str = "1234abcd-5678-90ef-abcd-0123456789ab";
    const STATIC_UID: &str = "0123456789abcdef0123456789abcdef";
    const ID: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

    fn uid() -> PodUid {
        PodUid::parse(UID).unwrap()
    }
    fn cid() -> ContainerId {
        ContainerId::parse(ID).unwrap()
    }

    /// The pod layouts of ARCHITECTURE.md's table, written out independently of the builders.
    fn table_pod_path(driver: CgroupDriver, qos: Qos, uid: &str) -> String {
        let u_ = uid.replace('-', "_");
        match (driver, qos) {
            (CgroupDriver::Cgroupfs, Qos::Guaranteed) => format!("/kubepods/pod{uid}"),
            (CgroupDriver::Cgroupfs, Qos::Burstable) => format!("/kubepods/burstable/pod{uid}"),
            (CgroupDriver::Cgroupfs, Qos::BestEffort) => format!("/kubepods/besteffort/pod{uid}"),
            (CgroupDriver::Systemd, Qos::Guaranteed) => {
                format!("/kubepods.slice/kubepods-pod{u_}.slice")
            }
            (CgroupDriver::Systemd, Qos::Burstable) => {
                format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u_}.slice")
            }
            (CgroupDriver::Systemd, Qos::BestEffort) => format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u_}.slice"
            ),
        }
    }

    fn table_container_leaf(driver: CgroupDriver, runtime: Runtime, id: &str) -> String {
        match (driver, runtime) {
            (CgroupDriver::Cgroupfs, Runtime::Containerd) => id.to_string(),
            (CgroupDriver::Systemd, Runtime::Containerd) => format!("cri-containerd-{id}.scope"),
            (CgroupDriver::Cgroupfs, Runtime::Crio) => format!("crio-{id}"),
            (CgroupDriver::Systemd, Runtime::Crio) => format!("crio-{id}.scope"),
            (CgroupDriver::Cgroupfs, Runtime::Docker) => id.to_string(),
            (CgroupDriver::Systemd, Runtime::Docker) => format!("docker-{id}.scope"),
        }
    }

    /// What the path can tell about the runtime: the bare id is shared by containerd and docker.
    fn visible_runtime(driver: CgroupDriver, runtime: Runtime) -> Option<Runtime> {
        match (driver, runtime) {
            (CgroupDriver::Cgroupfs, Runtime::Containerd | Runtime::Docker) => None,
            _ => Some(runtime),
        }
    }

    const PREFIXES: [&str; 4] = [
        "",
        "/observer-test-123",
        "/system.slice/kubelet.service/x",
        "/kubepods-not-a-root",
    ];

    #[test]
    fn every_driver_qos_runtime_layout() {
        let mut cases = 0;
        for driver in CgroupDriver::ALL {
            for qos in Qos::ALL {
                for uid_s in [UID, STATIC_UID] {
                    let uid = PodUid::parse(uid_s).unwrap();
                    let pod = PodCgroup { uid, qos, driver };
                    let pod_path = table_pod_path(driver, qos, uid_s);
                    assert_eq!(pod_cgroup_path(driver, qos, &uid), pod_path);
                    assert_eq!(pod.cgroup_path(), pod_path);
                    for prefix in PREFIXES {
                        let p = format!("{prefix}{pod_path}");
                        assert_eq!(classify(&p), CgroupKind::Pod(pod), "{p}");
                        assert_eq!(classify(&format!("{p}/")), CgroupKind::Pod(pod), "{p}/");
                        for runtime in Runtime::ALL {
                            let leaf = table_container_leaf(driver, runtime, ID);
                            let c_path = format!("{pod_path}/{leaf}");
                            assert_eq!(
                                container_cgroup_path(driver, qos, &uid, runtime, &cid()),
                                c_path
                            );
                            let want = ContainerRef {
                                pod,
                                runtime: visible_runtime(driver, runtime),
                                id: cid(),
                                nested: false,
                            };
                            assert_eq!(want.cgroup_path(), c_path);
                            let p = format!("{prefix}{c_path}");
                            assert_eq!(classify(&p), CgroupKind::Container(want), "{p}");
                            let nested = ContainerRef {
                                nested: true,
                                ..want
                            };
                            for below in ["/init.scope", "/container", "/foo/bar", "/foo/bar/"] {
                                let p = format!("{prefix}{c_path}{below}");
                                assert_eq!(classify(&p), CgroupKind::Container(nested), "{p}");
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(cases, 2 * 3 * 2 * PREFIXES.len() * 3);
    }

    #[test]
    fn kubepods_and_qos_roots() {
        use CgroupDriver::*;
        let cases = [
            ("/kubepods", CgroupKind::KubepodsRoot { driver: Cgroupfs }),
            ("kubepods/", CgroupKind::KubepodsRoot { driver: Cgroupfs }),
            (
                "/kubepods.slice",
                CgroupKind::KubepodsRoot { driver: Systemd },
            ),
            (
                "/kubelet.slice/kubelet-kubepods.slice",
                CgroupKind::KubepodsRoot { driver: Systemd },
            ),
            (
                "/kubepods/burstable",
                CgroupKind::QosRoot {
                    driver: Cgroupfs,
                    qos: Qos::Burstable,
                },
            ),
            (
                "//kubepods//besteffort//",
                CgroupKind::QosRoot {
                    driver: Cgroupfs,
                    qos: Qos::BestEffort,
                },
            ),
            (
                "/kubepods.slice/kubepods-besteffort.slice",
                CgroupKind::QosRoot {
                    driver: Systemd,
                    qos: Qos::BestEffort,
                },
            ),
            (
                "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice",
                CgroupKind::QosRoot {
                    driver: Systemd,
                    qos: Qos::Burstable,
                },
            ),
            (
                "/observer-test-1/kubepods",
                CgroupKind::KubepodsRoot { driver: Cgroupfs },
            ),
        ];
        for (p, want) in cases {
            assert_eq!(classify(p), want, "{p}");
        }
        for driver in CgroupDriver::ALL {
            assert_eq!(
                classify(kubepods_root_path(driver)),
                CgroupKind::KubepodsRoot { driver }
            );
            assert_eq!(
                classify(&qos_cgroup_path(driver, Qos::Guaranteed)),
                CgroupKind::KubepodsRoot { driver }
            );
            for qos in [Qos::Burstable, Qos::BestEffort] {
                assert_eq!(
                    classify(&qos_cgroup_path(driver, qos)),
                    CgroupKind::QosRoot { driver, qos }
                );
            }
        }
    }

    #[test]
    fn kind_style_systemd_prefix_round_trip() {
        // kind runs kubelet with --cgroup-root=/kubelet: every slice name carries "kubelet-".
        let p = format!(
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/\
             kubelet-kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope",
            UID.replace('-', "_")
        );
        let want = ContainerRef {
            pod: PodCgroup {
                uid: uid(),
                qos: Qos::Burstable,
                driver: CgroupDriver::Systemd,
            },
            runtime: Some(Runtime::Containerd),
            id: cid(),
            nested: false,
        };
        assert_eq!(classify(&p), CgroupKind::Container(want));
        let g = format!(
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{}.slice",
            UID.replace('-', "_")
        );
        assert_eq!(classify(&g).pod().map(|p| p.qos), Some(Qos::Guaranteed));
    }

    #[test]
    fn conmon_is_not_a_container() {
        for driver in CgroupDriver::ALL {
            for qos in Qos::ALL {
                let pod = PodCgroup {
                    uid: uid(),
                    qos,
                    driver,
                };
                let p = conmon_cgroup_path(driver, qos, &uid(), &cid());
                let leaf = match driver {
                    CgroupDriver::Cgroupfs => format!("crio-conmon-{ID}"),
                    CgroupDriver::Systemd => format!("crio-conmon-{ID}.scope"),
                };
                assert_eq!(p, format!("{}/{leaf}", table_pod_path(driver, qos, UID)));
                let want = CgroupKind::Conmon(ConmonRef { pod, id: cid() });
                assert_eq!(classify(&p), want, "{p}");
                assert_eq!(classify(&format!("{p}/x")), want);
                assert_eq!(classify(&p).container(), None);
                assert_eq!(classify(&p).pod(), Some(&pod));
            }
        }
    }

    #[test]
    fn malformed_uids_are_unrecognized() {
        let bad_uids = [
            "1234abcd-5678-90ef-abcd-0123456789a",   // 35
            "1234abcd-5678-90ef-abcd-0123456789abc", // 37
            "1234abcd-5678-90ef-abcd-0123456789ag",  // non-hex
            "1234ABCD-5678-90EF-ABCD-0123456789AB",  // uppercase
            "1234abcd5-678-90ef-abcd-0123456789ab",  // dash misplaced
            "1234abcd_5678-90ef-abcd-0123456789ab",  // mixed separators
            "0123456789abcdef0123456789abcde",       // 31 hex
            "0123456789ABCDEF0123456789ABCDEF",      // uppercase static
            "",
        ];
        for bad in bad_uids {
            assert_eq!(PodUid::parse(bad), None, "{bad}");
            // The systemd spelling, unless that would repair the mixed-separator case.
            let bad_ = if bad.contains('_') {
                bad.to_string()
            } else {
                bad.replace('-', "_")
            };
            assert!(bad.parse::<PodUid>().is_err());
            for p in [
                format!("/kubepods/pod{bad}"),
                format!("/kubepods/burstable/pod{bad}"),
                format!("/kubepods/besteffort/pod{bad}/{ID}"),
                format!("/kubepods.slice/kubepods-pod{}.slice", bad_),
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope",
                    bad_
                ),
            ] {
                assert_eq!(classify(&p), CgroupKind::Unrecognized, "{p}");
            }
        }
        // Dashes in a systemd pod name would be slice separators; underscores are not cgroupfs.
        let u_ = UID.replace('-', "_");
        for p in [
            format!("/kubepods.slice/kubepods-pod{UID}.slice"),
            format!("/kubepods/pod{u_}"),
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod{u_}.slice"),
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-pod{u_}.slice"),
            format!("/kubepods.slice/kubepods-burstable.slice/other-burstable-pod{u_}.slice"),
            format!("/kubepods.slice/kubepods-pod{u_}"),
            format!("/kubepods/burstable/{UID}"),
            "/kubepods/guaranteed".to_string(),
            "/kubepods.slice/kubepods-guaranteed.slice".to_string(),
            "/kubepods.slice/burstable".to_string(),
            "/kubepods/burstable/besteffort".to_string(),
        ] {
            assert_eq!(classify(&p), CgroupKind::Unrecognized, "{p}");
        }
        assert_eq!(
            classify(&format!("/kubepods/pod{STATIC_UID}"))
                .pod()
                .map(|p| p.uid.as_str()),
            Some(STATIC_UID)
        );
    }

    #[test]
    fn malformed_container_ids_are_unrecognized() {
        let pod = format!("/kubepods/burstable/pod{UID}");
        let spod = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            UID.replace('-', "_")
        );
        let bad_ids = [
            &ID[..63],
            &format!("{ID}0")[..],
            &ID.to_uppercase()[..],
            &format!("g{}", &ID[1..])[..],
            "",
        ];
        for bad in bad_ids {
            assert_eq!(ContainerId::parse(bad), None, "{bad}");
            assert!(bad.parse::<ContainerId>().is_err());
            // An empty bare id is no component at all: that path is the pod.
            let bare = if bad.is_empty() { "x" } else { bad };
            for leaf in [
                bare.to_string(),
                format!("crio-{bad}"),
                format!("crio-conmon-{bad}"),
                format!("cri-containerd-{bad}.scope"),
                format!("crio-{bad}.scope"),
                format!("docker-{bad}.scope"),
            ] {
                for parent in [&pod, &spod] {
                    let p = format!("{parent}/{leaf}");
                    assert_eq!(classify(&p), CgroupKind::Unrecognized, "{p}");
                    assert_eq!(classify(&format!("{p}/nested")), CgroupKind::Unrecognized);
                }
            }
        }
        // Unknown runtime prefixes, or a known one missing its .scope.
        for leaf in [
            format!("libpod-{ID}.scope"),
            format!("cri-containerd-{ID}"),
            format!("docker-{ID}"),
            format!("{ID}.scope"),
            format!("crio-{ID}.slice"),
            "sandbox".to_string(),
        ] {
            let p = format!("{spod}/{leaf}");
            assert_eq!(classify(&p), CgroupKind::Unrecognized, "{p}");
        }
        // A path the kernel cut short inside the id.
        let full = format!("{spod}/cri-containerd-{ID}.scope");
        assert_eq!(classify(&full[..full.len() - 10]), CgroupKind::Unrecognized);
    }

    #[test]
    fn outside_kubepods() {
        for p in [
            "",
            "/",
            "//",
            "/system.slice/containerd.service",
            "/user.slice/user-0.slice/session-1.scope",
            "/kubepodsx/burstable",
            "/kubepods.slicex",
            "/xkubepods.slice/pod",
            "/kubepods-burstable.slice",
            "/kubepods.scope",
        ] {
            assert_eq!(classify(p), CgroupKind::Outside, "{p}");
        }
    }

    #[test]
    fn first_kubepods_component_wins() {
        // A kubelet running inside one of this node's containers (kind-in-pod).
        let outer = format!("/kubepods/burstable/pod{UID}/{ID}");
        let p = format!("{outer}/kubepods/besteffort/pod{STATIC_UID}/{ID}");
        match classify(&p) {
            CgroupKind::Container(c) => {
                assert!(c.nested);
                assert_eq!(c.pod.uid, uid());
                assert_eq!(c.pod.qos, Qos::Burstable);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn non_utf8_below_a_container_is_nested() {
        let mut p = format!("/kubepods/pod{UID}/crio-{ID}/").into_bytes();
        p.extend_from_slice(&[0xff, 0xfe, b'x']);
        assert_eq!(
            classify_bytes(&p)
                .container()
                .map(|c| (c.nested, c.runtime)),
            Some((true, Some(Runtime::Crio)))
        );
    }

    fn hex_string(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn arb_uid() -> impl Strategy<Value = PodUid> {
        (prop::collection::vec(any::<u8>(), 16), any::<bool>()).prop_map(|(b, dashed)| {
            let h = hex_string(&b);
            let s = if dashed {
                format!(
                    "{}-{}-{}-{}-{}",
                    &h[..8],
                    &h[8..12],
                    &h[12..16],
                    &h[16..20],
                    &h[20..]
                )
            } else {
                h
            };
            PodUid::parse(&s).unwrap()
        })
    }

    fn arb_id() -> impl Strategy<Value = ContainerId> {
        prop::collection::vec(any::<u8>(), 32)
            .prop_map(|b| ContainerId::parse(&hex_string(&b)).unwrap())
    }

    /// Prefix components that cannot be mistaken for a kubepods root.
    fn arb_prefix() -> impl Strategy<Value = String> {
        prop::collection::vec("[a-z0-9_.@-]{1,12}", 0..4).prop_map(|v| {
            v.into_iter()
                .filter(|c| c != "kubepods" && !(c.ends_with(".slice") && c.contains("kubepods")))
                .map(|c| format!("/{c}"))
                .collect()
        })
    }

    fn arb_nested() -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec("[^/]{1,20}", 0..4)
    }

    fn arb_pod() -> impl Strategy<Value = PodCgroup> {
        (
            prop::sample::select(CgroupDriver::ALL.to_vec()),
            prop::sample::select(Qos::ALL.to_vec()),
            arb_uid(),
        )
            .prop_map(|(driver, qos, uid)| PodCgroup { uid, qos, driver })
    }

    /// Components from the vocabulary of real paths, to reach deep states quickly.
    fn arb_vocab_path() -> impl Strategy<Value = String> {
        let words = prop::sample::select(vec![
            "kubepods".to_string(),
            "kubepods.slice".to_string(),
            "kubepods-burstable.slice".to_string(),
            "burstable".to_string(),
            "besteffort".to_string(),
            format!("pod{UID}"),
            format!("kubepods-pod{}.slice", UID.replace('-', "_")),
            format!("kubepods-burstable-pod{}.slice", UID.replace('-', "_")),
            ID.to_string(),
            format!("crio-{ID}"),
            format!("crio-conmon-{ID}.scope"),
            format!("cri-containerd-{}.scope", &ID[1..]),
            "".to_string(),
            "-".to_string(),
            ".slice".to_string(),
            "pod".to_string(),
        ]);
        prop::collection::vec(words, 0..8).prop_map(|v| v.join("/"))
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..400)) {
            let _ = classify_bytes(&b);
        }

        #[test]
        fn arbitrary_strings_never_panic(s in "\\PC{0,300}") {
            let _ = classify(&s);
            let _ = PodUid::parse(&s);
            let _ = ContainerId::parse(&s);
        }

        #[test]
        fn vocabulary_paths_never_panic(s in arb_vocab_path()) {
            let k = classify(&s);
            // Whatever it is, a container's path rebuilds to something that classifies the same.
            if let CgroupKind::Container(c) = k {
                let again = classify(&c.cgroup_path());
                prop_assert_eq!(again, CgroupKind::Container(ContainerRef { nested: false, ..c }));
            }
        }

        #[test]
        fn container_paths_round_trip(
            pod in arb_pod(),
            runtime in prop::sample::select(Runtime::ALL.to_vec()),
            id in arb_id(),
            prefix in arb_prefix(),
            nested in arb_nested(),
            trailing in any::<bool>(),
        ) {
            let mut p = prefix + &container_cgroup_path(pod.driver, pod.qos, &pod.uid, runtime, &id);
            for c in &nested {
                p.push('/');
                p.push_str(c);
            }
            if trailing {
                p.push('/');
            }
            let want = ContainerRef {
                pod,
                runtime: visible_runtime(pod.driver, runtime),
                id,
                nested: !nested.is_empty(),
            };
            prop_assert_eq!(classify(&p), CgroupKind::Container(want));
        }

        #[test]
        fn pod_and_conmon_paths_round_trip(pod in arb_pod(), id in arb_id(), prefix in arb_prefix()) {
            let p = format!("{prefix}{}", pod_cgroup_path(pod.driver, pod.qos, &pod.uid));
            prop_assert_eq!(classify(&p), CgroupKind::Pod(pod));
            let c = format!("{prefix}{}", conmon_cgroup_path(pod.driver, pod.qos, &pod.uid, &id));
            prop_assert_eq!(classify(&c), CgroupKind::Conmon(ConmonRef { pod, id }));
        }
    }
}
