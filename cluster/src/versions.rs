//! Which Kubernetes and containerd each part of the test cluster runs.
//!
//! The default is the upgrade users live through: the control plane and the guest node on the
//! newest supported release (1.37), the host node on the oldest (1.35: the last kubelet that runs
//! on containerd 1.x, and on this hybrid host's cgroup v1 only with `failCgroupV1: false`), so the
//! suites prove the agent under the widest version skew kubelet allows (three minors) and on
//! three runtimes: containerd 1.7 here, 2.4 in the guest, Debian's 1.6 in the host suites.
//!
//! `OBSERVER_KUBERNETES=1.36` (or `cargo xtask cluster … --kubernetes 1.36`) runs every part on
//! one release; `OBSERVER_HOST_KUBELET` / `--host-kubelet` and `OBSERVER_GUEST_KUBELET` /
//! `--guest-kubelet` set one node's kubelet. `up` writes the choice into the cluster's state, so
//! every later command and test of that cluster uses the same binaries whatever its environment.
use std::fmt;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The Kubernetes releases the cluster can run, one patch per minor: each has its Go module in
/// `cluster/go/kubernetes/v1.<minor>` (written by `scripts/kubernetes-module.sh`).
pub const KUBERNETES_RELEASES: &[&str] = &["v1.35.4", "v1.36.3", "v1.37.2"];
/// The newest of them: the control plane's and the guest node's by default.
pub const KUBERNETES_NEWEST: &str = "v1.37.2";
/// The oldest: the host node's kubelet by default.
pub const KUBERNETES_OLDEST: &str = "v1.35.4";

/// containerd 1.7, the last 1.x line: what a kubelet up to 1.35 runs on here
/// (`cluster/go/containerd/v1.7`).
pub const CONTAINERD_1: &str = "v1.7.35";
/// containerd 2.4: the guest node's, and the host node's under kubelet 1.36 and newer, which
/// no longer support containerd 1.x (`cluster/go/containerd/v2.4`).
pub const CONTAINERD_2: &str = "v2.4.2";

/// A release of [`KUBERNETES_RELEASES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Release(&'static str);

impl Release {
    /// `1.36`, `v1.36` or `v1.36.3`: the served patch of that minor.
    pub fn parse(s: &str) -> Result<Self> {
        let s = s.trim();
        let want = s.strip_prefix('v').unwrap_or(s);
        KUBERNETES_RELEASES
            .iter()
            .find(|r| {
                let full = &r[1..];
                full == want
                    || full
                        .rsplit_once('.')
                        .is_some_and(|(minor, _)| minor == want)
            })
            .map(|r| Release(r))
            .ok_or_else(|| {
                Error::Missing(format!(
                    "Kubernetes {s} is not one the test cluster builds: choose one of {}",
                    KUBERNETES_RELEASES.join(", ")
                ))
            })
    }

    /// `v1.37.2`.
    pub fn version(self) -> &'static str {
        self.0
    }

    /// 37 for v1.37.2.
    pub fn minor(self) -> u32 {
        self.0
            .split('.')
            .nth(1)
            .and_then(|m| m.parse().ok())
            .expect("KUBERNETES_RELEASES holds vMAJOR.MINOR.PATCH")
    }

    /// Its Go module, under `cluster/go`.
    pub fn module(self) -> String {
        format!("kubernetes/v1.{}", self.minor())
    }

    /// The containerd a node with this kubelet runs: 1.7 up to kubelet 1.35, 2.4 after.
    pub fn containerd(self) -> Containerd {
        if self.minor() <= 35 {
            Containerd::V1
        } else {
            Containerd::V2
        }
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// One of the two containerd lines the cluster builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Containerd {
    V1,
    V2,
}

impl Containerd {
    pub fn version(self) -> &'static str {
        match self {
            Containerd::V1 => CONTAINERD_1,
            Containerd::V2 => CONTAINERD_2,
        }
    }

    /// Its Go module, under `cluster/go`.
    pub fn module(self) -> &'static str {
        match self {
            Containerd::V1 => "containerd/v1.7",
            Containerd::V2 => "containerd/v2.4",
        }
    }

    /// The Go package path its commands live under.
    pub fn package(self) -> &'static str {
        match self {
            Containerd::V1 => "github.com/containerd/containerd",
            Containerd::V2 => "github.com/containerd/containerd/v2",
        }
    }
}

/// Which release each part of the cluster runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Versions {
    /// kube-apiserver, kube-controller-manager, kube-scheduler and kubectl.
    pub control_plane: Release,
    /// The host node's kubelet (and so its containerd: [`Release::containerd`]).
    pub host_kubelet: Release,
    /// Every guest node's kubelet (containerd 2.4 there whatever the release).
    pub guest_kubelet: Release,
}

impl Default for Versions {
    fn default() -> Self {
        Self {
            control_plane: Release(KUBERNETES_NEWEST),
            host_kubelet: Release(KUBERNETES_OLDEST),
            guest_kubelet: Release(KUBERNETES_NEWEST),
        }
    }
}

/// The file `up` records the running cluster's choice in.
const FILE: &str = "versions";

impl Versions {
    /// The default, then `OBSERVER_KUBERNETES` for every part, then each node's own variable.
    pub fn from_env() -> Result<Self> {
        let var = |n: &str| std::env::var(n).ok().filter(|v| !v.trim().is_empty());
        Self::choose(
            var("OBSERVER_KUBERNETES").as_deref(),
            var("OBSERVER_HOST_KUBELET").as_deref(),
            var("OBSERVER_GUEST_KUBELET").as_deref(),
        )
    }

    /// The default, with `all` for every part, then `host` and `guest` for one node's kubelet.
    pub fn choose(all: Option<&str>, host: Option<&str>, guest: Option<&str>) -> Result<Self> {
        let mut v = match all {
            Some(a) => {
                let r = Release::parse(a)?;
                Self {
                    control_plane: r,
                    host_kubelet: r,
                    guest_kubelet: r,
                }
            }
            None => Self::default(),
        };
        if let Some(h) = host {
            v.host_kubelet = Release::parse(h)?;
        }
        if let Some(g) = guest {
            v.guest_kubelet = Release::parse(g)?;
        }
        v.check()?;
        Ok(v)
    }

    /// kubelet may be up to three minors older than the API server, never newer.
    fn check(&self) -> Result<()> {
        for (what, k) in [("host", self.host_kubelet), ("guest", self.guest_kubelet)] {
            let cp = self.control_plane.minor();
            if k.minor() > cp || cp - k.minor() > 3 {
                return Err(Error::Missing(format!(
                    "the {what} node's kubelet {k} is outside the skew kubelet supports against \
                     the control plane {} (at most three minors older, never newer)",
                    self.control_plane
                )));
            }
        }
        Ok(())
    }

    /// The releases to build, each with the commands it provides here.
    pub fn builds(&self) -> Vec<(Release, Vec<&'static str>)> {
        let mut out: Vec<(Release, Vec<&'static str>)> = Vec::new();
        let mut add = |r: Release, cmds: &[&'static str]| match out
            .iter_mut()
            .find(|(have, _)| *have == r)
        {
            Some((_, c)) => c.extend(cmds.iter().filter(|x| !c.contains(x)).collect::<Vec<_>>()),
            None => out.push((r, cmds.to_vec())),
        };
        add(
            self.control_plane,
            &[
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "kubectl",
            ],
        );
        add(self.host_kubelet, &["kubelet"]);
        add(self.guest_kubelet, &["kubelet"]);
        for (_, c) in &mut out {
            c.sort_unstable();
        }
        out
    }

    /// The running cluster's choice (`up` wrote it), else [`Versions::from_env`].
    pub fn of_cluster(dir: &Path) -> Result<Self> {
        match std::fs::read_to_string(dir.join("state").join(FILE)) {
            Ok(text) => Self::parse_file(&text),
            Err(_) => Self::from_env(),
        }
    }

    pub(crate) fn save(&self, dir: &Path) -> Result<()> {
        let p = dir.join("state").join(FILE);
        std::fs::write(
            &p,
            format!(
                "control-plane {}\nhost-kubelet {}\nguest-kubelet {}\n",
                self.control_plane, self.host_kubelet, self.guest_kubelet
            ),
        )
        .map_err(Error::io(&p))
    }

    fn parse_file(text: &str) -> Result<Self> {
        let mut v = Self::default();
        for line in text.lines() {
            let Some((k, r)) = line.split_once(' ') else {
                continue;
            };
            let r = Release::parse(r)?;
            match k {
                "control-plane" => v.control_plane = r,
                "host-kubelet" => v.host_kubelet = r,
                "guest-kubelet" => v.guest_kubelet = r,
                _ => {}
            }
        }
        Ok(v)
    }
}

impl fmt::Display for Versions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "control plane {}, host node kubelet {} on containerd {}, guest nodes' kubelet {} on containerd {}",
            self.control_plane,
            self.host_kubelet,
            self.host_kubelet.containerd().version(),
            self.guest_kubelet,
            CONTAINERD_2
        )
    }
}

/// Where one release's binaries are built: `<cluster>/kubernetes/<version>`.
pub fn kubernetes_bin(dir: &Path, r: Release) -> PathBuf {
    dir.join("kubernetes").join(r.version())
}

/// Where one containerd's binaries are built: `<cluster>/containerd/<version>`.
pub fn containerd_bin(dir: &Path, c: Containerd) -> PathBuf {
    dir.join("containerd").join(c.version())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse_by_minor_or_patch() {
        assert_eq!(Release::parse("1.36").unwrap().version(), "v1.36.3");
        assert_eq!(Release::parse("v1.37.2").unwrap().version(), "v1.37.2");
        assert!(Release::parse("1.34").is_err());
        assert!(Release::parse("1.3").is_err());
    }

    #[test]
    fn default_is_the_widest_supported_skew() {
        let v = Versions::choose(None, None, None).unwrap();
        assert_eq!(v.control_plane.version(), KUBERNETES_NEWEST);
        assert_eq!(v.host_kubelet.containerd(), Containerd::V1);
        assert_eq!(v.guest_kubelet.containerd(), Containerd::V2);
        let builds = v.builds();
        assert_eq!(builds.len(), 2);
        assert!(builds[0].1.contains(&"kubelet") && builds[0].1.contains(&"kubectl"));
        assert_eq!(builds[1].1, vec!["kubelet"]);
    }

    #[test]
    fn a_kubelet_newer_than_the_control_plane_is_refused() {
        assert!(Versions::choose(Some("1.35"), None, Some("1.37")).is_err());
        assert!(Versions::choose(Some("1.36"), Some("1.35"), None).is_ok());
    }

    #[test]
    fn the_recorded_choice_reads_back() {
        let v = Versions::choose(Some("1.36"), Some("1.35"), None).unwrap();
        let dir = std::env::temp_dir().join(format!("observer-versions-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("state")).unwrap();
        v.save(&dir).unwrap();
        assert_eq!(Versions::of_cluster(&dir).unwrap(), v);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
