//! The cgroup layer: which pod and container a cgroup belongs to.
//!
//! Kernel events carry a cgroup id (and cgroup events a path); this module turns those into
//! Kubernetes terms:
//! - [`path`]: the shapes of kubelet's and the runtimes' cgroup paths (pure, allocation-free),
//!   and the builders of those paths;
//! - [`roots`]: kubelet's own roots, below which alone a path is a pod's or a container's;
//! - [`mounts`]: find the cgroup hierarchies (unified, hybrid, legacy) and convert paths;
//! - [`id`]: a cgroup's id, as `bpf_get_current_cgroup_id()` reports it;
//! - [`index`]: id → path, from the start-up walk, mkdir events and a bounded walk of kubelet's
//!   roots on a miss;
//! - [`scan`]: the one walk at start-up that finds containers started before the agent.
use std::path::PathBuf;

pub mod id;
pub(crate) mod index;
pub mod mounts;
pub mod path;
pub mod roots;
pub mod scan;

pub use id::{cgroup_id, cgroup_id_and_version};
pub use index::CgroupEntry;
pub use index::CgroupIndex;
pub use index::IndexStats;
pub use mounts::CgroupMode;
pub use mounts::{CgroupMounts, CgroupVersion, HierarchyMount};
pub(crate) use path::container_of_name;
pub use path::ConmonRef;
pub use path::ContainerRef;
pub use path::PodCgroup;

/// The shape of a path alone, wherever its kubepods component is: what a path names relative
/// to a container already attributed (by [`KubeRoots::classify`], or the probes), never what a
/// path from the kernel is.
pub(crate) fn shape(path: &str) -> CgroupKind {
    path::classify(path)
}
pub use path::{
    conmon_cgroup_path, container_cgroup_path, pod_cgroup_path, CgroupDriver, CgroupKind,
    ContainerId, PodUid, Qos, Runtime,
};
pub use roots::KubeRoots;
pub use scan::ScanStats;
pub use scan::{scan, Scan, ScanOptions, ScannedCgroup};

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no cgroup filesystem mounted{}", under.as_ref().map(|u| format!(" under {}", u.display())).unwrap_or_default())]
    NoCgroupMounts { under: Option<PathBuf> },
    #[error("{} is not a cgroup directory", path.display())]
    NotCgroup { path: PathBuf },
    #[error("cgroup {path} is outside the hierarchy part mounted at {}", mount_point.display())]
    OutsideMount { path: String, mount_point: PathBuf },
    #[error("no kubepods cgroup found below {}", mount_point.display())]
    NoKubepodsRoot { mount_point: PathBuf },
    #[error("{path:?} names no kubepods cgroup: give kubelet's --cgroup-root (its cgroupRoot, e.g. / or /kubelet) or the kubepods cgroup itself (e.g. /kubepods, /kubepods.slice, /kubelet.slice/kubelet-kubepods.slice), without '..'")]
    NotKubepods { path: String },
    #[error(transparent)]
    Id(#[from] crate::model::IdError),
}
