//! kubelet's cgroup roots: where a cgroup can be a pod's or a container's at all.
//!
//! Whoever can write a cgroup subtree (a systemd user's delegated tree, a container with its own
//! cgroup namespace and a writable cgroupfs, a service with `Delegate=yes`) can make directories
//! named like kubelet's pods and a runtime's containers below it, with the ids of real ones. Only
//! the holder of the hierarchy's root makes cgroups where kubelet's roots are, so a path is a
//! pod's or a container's only below one of them ([`KubeRoots::classify`]); the same shape
//! elsewhere is [`CgroupKind::Foreign`]: never a pod or a container, counted where it is seen.
//!
//! The roots are kubelet's `--cgroup-root` (`cgroupRoot`, default `/`) named by each driver's
//! rules, as kubelet's container manager does (`NewCgroupName(cgroupRoot, "kubepods")`):
//! cgroupfs puts `kubepods` below the root; systemd joins the root's components and `kubepods`
//! with `-` (a component's own `-` written `_`) into a slice and expands it into its parents
//! (`/` → `/kubepods.slice`, `/kubelet` → `/kubelet.slice/kubelet-kubepods.slice`). Both drivers'
//! names are accepted: both sit below the same root, which only the node's root can write.
use std::fmt;

use super::{
    mounts::HierarchyMount,
    path::{classify_below, classify_bytes, components, kubepods_root},
    CgroupDriver, CgroupEntry, CgroupError, CgroupKind,
};

/// kubelet's `--cgroup-root` values [`KubeRoots::detect`] looks for when none is given: its
/// default, and kind's (`--cgroup-root=/kubelet`).
const KNOWN_KUBELET_ROOTS: [&str; 2] = ["/", "/kubelet"];

/// One kubepods cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Root {
    /// Hierarchy-relative, normalized (`/a/b`).
    path: String,
    driver: CgroupDriver,
}

impl Root {
    fn comps(&self) -> impl Iterator<Item = &[u8]> + '_ {
        components(self.path.as_bytes())
    }
}

/// The kubepods cgroups of this node's kubelet: what a cgroup path is, anchored at them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeRoots {
    /// Outermost first: a kubelet nested in one of this kubelet's containers is that container's.
    roots: Vec<Root>,
}

impl KubeRoots {
    /// The kubepods cgroups themselves, as hierarchy paths: `/kubepods`, `/kubepods.slice`,
    /// `/kubelet.slice/kubelet-kubepods.slice`, a test's `/observer-test-1/kubepods`.
    pub fn new<S: AsRef<str>>(paths: impl IntoIterator<Item = S>) -> Result<Self, CgroupError> {
        let mut roots = Vec::new();
        for p in paths {
            let p = p.as_ref();
            let path = normalized(p)?;
            let driver = components(path.as_bytes())
                .last()
                .and_then(kubepods_root)
                .map(|(driver, _)| driver)
                .ok_or_else(|| CgroupError::NotKubepods { path: p.into() })?;
            roots.push(Root { path, driver });
        }
        roots.sort_by(|a, b| {
            let depth = |r: &Root| r.comps().count();
            depth(a).cmp(&depth(b)).then_with(|| a.path.cmp(&b.path))
        });
        roots.dedup();
        Ok(Self { roots })
    }

    /// The kubepods cgroups kubelet makes with `--cgroup-root=<root>`, by both drivers' names.
    pub fn of_kubelet_root(root: &str) -> Result<Self, CgroupError> {
        Self::new(kubelet_kubepods(root)?)
    }

    /// From the command line, below the root of `mount` (where kubelet's cgroup namespace
    /// starts): each value is kubelet's `--cgroup-root`, or a kubepods cgroup itself where its
    /// last component is one (`kubepods`, `kubepods.slice`, `<parent>-kubepods.slice`).
    pub fn given<S: AsRef<str>>(mount: &HierarchyMount, values: &[S]) -> Result<Self, CgroupError> {
        let mut paths = Vec::new();
        for v in values.iter().map(AsRef::as_ref) {
            let p = normalized(v)?;
            if components(p.as_bytes())
                .last()
                .and_then(kubepods_root)
                .is_some()
            {
                paths.push(below(&mount.root, &p));
            } else {
                paths.extend(kubelet_kubepods(&p)?.iter().map(|k| below(&mount.root, k)));
            }
        }
        Self::new(paths)
    }

    /// This node's roots: the `given` ones ([`Self::given`]), else those of kubelet's default
    /// `--cgroup-root` and kind's that exist below the root of `mount`, else (no pod ever ran
    /// here) kubelet's default ones. Says which at the default level.
    pub fn detect<S: AsRef<str>>(mount: &HierarchyMount, given: &[S]) -> Result<Self, CgroupError> {
        if !given.is_empty() {
            let roots = Self::given(mount, given)?;
            tracing::info!(roots = %roots, "kubelet's pod cgroups, as given (--cgroup-root)");
            return Ok(roots);
        }
        let mut known = Vec::new();
        for root in KNOWN_KUBELET_ROOTS {
            known.extend(
                kubelet_kubepods(root)?
                    .iter()
                    .map(|k| below(&mount.root, k)),
            );
        }
        let found: Vec<&String> = known
            .iter()
            .filter(|p| mount.to_absolute(p).is_some_and(|a| a.is_dir()))
            .collect();
        if found.is_empty() {
            let roots = Self::given(mount, &["/"])?;
            tracing::info!(roots = %roots, "no kubepods cgroup on this node yet: kubelet's pod cgroups will be its default ones (--cgroup-root to set them)");
            return Ok(roots);
        }
        let roots = Self::new(found)?;
        tracing::info!(roots = %roots, "kubelet's pod cgroups, found (--cgroup-root to set them)");
        Ok(roots)
    }

    /// What `path` (relative to the hierarchy root, as kernel events and the kernel log name
    /// it) is: a pod's, a container's, ... only below one of the roots; a kubepods shape
    /// anywhere else is [`CgroupKind::Foreign`].
    pub fn classify(&self, path: &str) -> CgroupKind {
        self.classify_bytes(path.as_bytes())
    }

    /// [`Self::classify`] on raw bytes: cgroup names need not be UTF-8 (the kernel sends bytes).
    pub fn classify_bytes(&self, path: &[u8]) -> CgroupKind {
        for root in &self.roots {
            let mut comps = components(path);
            if root.comps().all(|r| comps.next() == Some(r)) {
                let last = root.comps().last().unwrap_or_default();
                let stem = match root.driver {
                    CgroupDriver::Cgroupfs => last,
                    CgroupDriver::Systemd => last.strip_suffix(b".slice").unwrap_or(last),
                };
                return classify_below(root.driver, stem, comps);
            }
        }
        match classify_bytes(path) {
            CgroupKind::Outside => CgroupKind::Outside,
            _ => CgroupKind::Foreign,
        }
    }

    /// `path` is one of the roots or below one, compared component by component.
    pub fn contains(&self, path: &str) -> bool {
        self.roots.iter().any(|root| {
            let mut comps = components(path.as_bytes());
            root.comps().all(|r| comps.next() == Some(r))
        })
    }

    /// `path` with what it is.
    pub fn entry(&self, path: &str) -> CgroupEntry {
        CgroupEntry {
            kind: self.classify(path),
            path: path.into(),
        }
    }

    /// The roots' paths, outermost first.
    pub fn paths(&self) -> impl Iterator<Item = &str> + '_ {
        self.roots.iter().map(|r| r.path.as_str())
    }
}

impl fmt::Display for KubeRoots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.paths().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(p)?;
        }
        Ok(())
    }
}

/// `/a//b/` → `/a/b`; `..` refused (the roots are compared component by component).
fn normalized(p: &str) -> Result<String, CgroupError> {
    let mut out = String::new();
    for c in p.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if c == ".." {
            return Err(CgroupError::NotKubepods { path: p.into() });
        }
        out.push('/');
        out.push_str(c);
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// `rel` below `base` (both normalized).
fn below(base: &str, rel: &str) -> String {
    match (base.trim_end_matches('/'), rel) {
        ("", r) => r.to_string(),
        (b, "/") => b.to_string(),
        (b, r) => format!("{b}{r}"),
    }
}

/// The kubepods cgroup of kubelet's `--cgroup-root=<root>` by each driver: cgroupfs's, then
/// systemd's (kubelet's `CgroupName.ToSystemd`: the components escaped and joined with `-`, then
/// runc's `ExpandSlice`).
fn kubelet_kubepods(root: &str) -> Result<[String; 2], CgroupError> {
    let root = normalized(root)?;
    let comps: Vec<&str> = root.split('/').filter(|c| !c.is_empty()).collect();
    let cgroupfs = below(&root, "/kubepods");
    let mut parts: Vec<String> = comps.iter().map(|c| c.replace('-', "_")).collect();
    parts.push("kubepods".into());
    let mut systemd = String::new();
    for i in 1..=parts.len() {
        systemd.push('/');
        systemd.push_str(&parts[..i].join("-"));
        systemd.push_str(".slice");
    }
    Ok([cgroupfs, systemd])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::{
        container_cgroup_path, pod_cgroup_path, ContainerId, PodUid, Qos, Runtime,
    };

    const UID: &str = "1234abcd-5678-90ef-abcd-0123456789ab";
    const ID: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

    fn mount(root: &str) -> HierarchyMount {
        HierarchyMount {
            version: crate::cgroup::CgroupVersion::V2,
            mount_point: "/nonexistent/cgroup".into(),
            root: root.into(),
        }
    }

    #[test]
    fn kubelets_names_for_its_cgroup_root() {
        let cases = [
            ("/", ["/kubepods", "/kubepods.slice"]),
            ("", ["/kubepods", "/kubepods.slice"]),
            (
                "/kubelet",
                ["/kubelet/kubepods", "/kubelet.slice/kubelet-kubepods.slice"],
            ),
            (
                "/a-b/c/",
                [
                    "/a-b/c/kubepods",
                    "/a_b.slice/a_b-c.slice/a_b-c-kubepods.slice",
                ],
            ),
        ];
        for (root, want) in cases {
            assert_eq!(
                kubelet_kubepods(root).unwrap(),
                want.map(String::from),
                "{root}"
            );
            let roots = KubeRoots::of_kubelet_root(root).unwrap();
            let mut got: Vec<&str> = roots.paths().collect();
            got.sort();
            let mut want = want.to_vec();
            want.sort();
            assert_eq!(got, want);
        }
        assert!(kubelet_kubepods("/a/../b").is_err());
    }

    #[test]
    fn given_values_are_kubelets_root_or_a_kubepods_cgroup() {
        let m = mount("/");
        let g = |v: &[&str]| {
            KubeRoots::given(&m, v)
                .unwrap()
                .paths()
                .map(String::from)
                .collect::<Vec<_>>()
        };
        assert_eq!(g(&["/"]), ["/kubepods", "/kubepods.slice"]);
        assert_eq!(
            g(&["/kubelet"]),
            ["/kubelet.slice/kubelet-kubepods.slice", "/kubelet/kubepods"]
        );
        assert_eq!(g(&["/kubepods.slice"]), ["/kubepods.slice"]);
        assert_eq!(g(&["/t/kubepods", "/t/kubepods/"]), ["/t/kubepods"]);
        // Below the mount's root: kubelet's cgroup namespace is the one the mount shows.
        let nested = mount("/system.slice/node.scope");
        assert_eq!(
            KubeRoots::given(&nested, &["/kubelet.slice/kubelet-kubepods.slice"])
                .unwrap()
                .paths()
                .collect::<Vec<_>>(),
            ["/system.slice/node.scope/kubelet.slice/kubelet-kubepods.slice"]
        );
        assert!(KubeRoots::new(["/x/y"]).is_err());
        assert!(KubeRoots::new(["/x/../kubepods"]).is_err());
    }

    #[test]
    fn only_below_a_root_is_a_pod_or_a_container() {
        let uid = PodUid::parse(UID).unwrap();
        let id = ContainerId::parse(ID).unwrap();
        let roots = KubeRoots::new(["/kubepods", "/kubelet.slice/kubelet-kubepods.slice"]).unwrap();
        for (path, below) in [
            ("/kubepods", true),
            ("/kubepods/burstable/x", true),
            ("//kubelet.slice/kubelet-kubepods.slice/", true),
            ("/kubepods2", false),
            ("/evil/kubepods", false),
            ("/", false),
        ] {
            assert_eq!(roots.contains(path), below, "{path}");
        }
        for driver in CgroupDriver::ALL {
            let kind = |p: String| match driver {
                // kind's names: every slice below its root carries the parent's `kubelet-`.
                CgroupDriver::Systemd => {
                    format!(
                        "/kubelet.slice{}",
                        p.replace("kubepods", "kubelet-kubepods")
                    )
                }
                CgroupDriver::Cgroupfs => p,
            };
            let pod = kind(pod_cgroup_path(driver, Qos::Burstable, &uid));
            let c = kind(container_cgroup_path(
                driver,
                Qos::Burstable,
                &uid,
                Runtime::Crio,
                &id,
            ));
            assert_eq!(
                roots.classify(&pod).pod().map(|p| p.uid),
                Some(uid),
                "{pod}"
            );
            assert_eq!(
                roots.classify(&c).container().map(|c| c.id),
                Some(id),
                "{c}"
            );
            // The same shapes anywhere else: a delegated tree, a container's own cgroupfs.
            for elsewhere in [
                "/evil",
                "/user.slice/user-1000.slice/user@1000.service",
                "/kubepods-x",
            ] {
                for p in [&pod, &c] {
                    let spoof = format!("{elsewhere}{p}");
                    assert_eq!(roots.classify(&spoof), CgroupKind::Foreign, "{spoof}");
                }
            }
        }
        // A kubelet root's own ancestors are nothing; a kubepods shape is foreign off the roots.
        assert_eq!(roots.classify("/kubelet.slice"), CgroupKind::Outside);
        assert_eq!(
            roots.classify("/system.slice/x.service"),
            CgroupKind::Outside
        );
        assert_eq!(roots.classify("/evil/kubepods"), CgroupKind::Foreign);
        assert_eq!(
            roots.classify("/kubepods"),
            CgroupKind::KubepodsRoot {
                driver: CgroupDriver::Cgroupfs
            }
        );
        // Below a real container, a kubepods shape is that container's nested cgroup (a
        // kubelet inside it, or a spoof with its own cgroupfs: either way, the container's).
        let inner = format!(
            "/kubepods/burstable/pod{UID}/{ID}/kubepods/besteffort/pod0123456789abcdef0123456789abcdef/{}",
            "ab".repeat(32)
        );
        let k = roots.classify(&inner);
        assert_eq!(k.container().map(|c| (c.id, c.nested)), Some((id, true)));
    }

    #[test]
    fn detect_takes_kubelets_roots_that_exist_else_its_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let m = HierarchyMount {
            mount_point: dir.path().into(),
            ..mount("/")
        };
        let paths = |r: KubeRoots| r.paths().map(String::from).collect::<Vec<_>>();
        assert_eq!(
            paths(KubeRoots::detect::<&str>(&m, &[]).unwrap()),
            ["/kubepods", "/kubepods.slice"]
        );
        // Somewhere a search would find (depth 2), not where kubelet puts it: not a root.
        std::fs::create_dir_all(dir.path().join("evil/kubepods")).unwrap();
        std::fs::create_dir_all(dir.path().join("kubelet.slice/kubelet-kubepods.slice")).unwrap();
        assert_eq!(
            paths(KubeRoots::detect::<&str>(&m, &[]).unwrap()),
            ["/kubelet.slice/kubelet-kubepods.slice"]
        );
        assert_eq!(
            paths(KubeRoots::detect(&m, &["/evil/kubepods"]).unwrap()),
            ["/evil/kubepods"]
        );
    }
}
