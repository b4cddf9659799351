//! kubelet's labels and annotations on CRI sandboxes and containers, read through typed accessors.
use std::collections::HashMap;

use k8s_cri::v1 as api;

/// The keys kubelet writes (pkg/kubelet/types/labels.go, pkg/kubelet/kuberuntime/labels.go).
pub mod keys {
    pub const POD_NAME: &str = "io.kubernetes.pod.name";
    pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
    pub const POD_UID: &str = "io.kubernetes.pod.uid";
    pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
    /// Annotation on containers: how many times kubelet restarted this container before this one.
    pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
    pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
    pub const CONTAINER_TERMINATION_MESSAGE_PATH: &str =
        "io.kubernetes.container.terminationMessagePath";
    pub const CONTAINER_TERMINATION_MESSAGE_POLICY: &str =
        "io.kubernetes.container.terminationMessagePolicy";
    pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
    /// Annotation on pods (and so on sandboxes): where kubelet got the pod from (api, file, http).
    pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
    pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";
}

/// A pod by namespace, name and UID: the one a sandbox or container belongs to, or an Event
/// regards (a static pod's mirror has a UID of its own).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// Typed access to kubelet's labels and annotations on any CRI object that carries them.
pub trait KubeletLabels {
    fn cri_labels(&self) -> &HashMap<String, String>;
    fn cri_annotations(&self) -> &HashMap<String, String>;

    fn label(&self, key: &str) -> Option<&str> {
        self.cri_labels()
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    fn pod_name(&self) -> Option<&str> {
        self.label(keys::POD_NAME)
    }

    fn pod_namespace(&self) -> Option<&str> {
        self.label(keys::POD_NAMESPACE)
    }

    fn pod_uid(&self) -> Option<&str> {
        self.label(keys::POD_UID)
    }

    /// The pod, when all three of kubelet's pod labels are present.
    fn pod_ref(&self) -> Option<PodRef> {
        Some(PodRef {
            namespace: self.pod_namespace()?.to_string(),
            name: self.pod_name()?.to_string(),
            uid: self.pod_uid()?.to_string(),
        })
    }

    /// The container's name in the pod spec (not the runtime's container name).
    fn container_name(&self) -> Option<&str> {
        self.label(keys::CONTAINER_NAME)
    }

    /// kubelet's restart count; `None` when absent or not a number.
    fn restart_count(&self) -> Option<u32> {
        self.cri_annotations()
            .get(keys::CONTAINER_RESTART_COUNT)?
            .trim()
            .parse()
            .ok()
    }

    /// Created by kubelet (as opposed to by hand through crictl or by another CRI client).
    fn is_kubelet_managed(&self) -> bool {
        self.pod_uid().is_some()
    }
}

macro_rules! impl_kubelet_labels {
    ($($t:ty),*) => {$(
        impl KubeletLabels for $t {
            fn cri_labels(&self) -> &HashMap<String, String> {
                &self.labels
            }
            fn cri_annotations(&self) -> &HashMap<String, String> {
                &self.annotations
            }
        }
    )*};
}

impl_kubelet_labels!(
    api::PodSandbox,
    api::PodSandboxStatus,
    api::PodSandboxConfig,
    api::Container,
    api::ContainerStatus,
    api::ContainerConfig
);

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn kubelet_container(restart: &str) -> api::Container {
        api::Container {
            id: "abc".into(),
            labels: map(&[
                (keys::POD_NAME, "web-0"),
                (keys::POD_NAMESPACE, "prod"),
                (keys::POD_UID, "1b4e28ba-2fa1-11d2-883f-0016d3cca427"),
                (keys::CONTAINER_NAME, "nginx"),
            ]),
            annotations: map(&[(keys::CONTAINER_RESTART_COUNT, restart)]),
            ..Default::default()
        }
    }

    #[test]
    fn reads_kubelet_container_labels() {
        let c = kubelet_container("4");
        assert_eq!(c.pod_name(), Some("web-0"));
        assert_eq!(c.pod_namespace(), Some("prod"));
        assert_eq!(c.container_name(), Some("nginx"));
        assert_eq!(c.restart_count(), Some(4));
        assert!(c.is_kubelet_managed());
        let pod = c.pod_ref().unwrap();
        assert_eq!(pod.uid, "1b4e28ba-2fa1-11d2-883f-0016d3cca427");
        assert_eq!(
            pod.to_string(),
            "prod/web-0 (1b4e28ba-2fa1-11d2-883f-0016d3cca427)"
        );
    }

    #[test]
    fn malformed_restart_count_is_none() {
        assert_eq!(kubelet_container("x").restart_count(), None);
        assert_eq!(kubelet_container("-1").restart_count(), None);
        assert_eq!(kubelet_container("").restart_count(), None);
    }

    #[test]
    fn non_kubelet_objects_have_no_pod() {
        let s = api::PodSandbox {
            labels: map(&[(keys::POD_NAME, "x"), (keys::POD_UID, "")]),
            ..Default::default()
        };
        assert_eq!(s.pod_name(), Some("x"));
        assert!(s.pod_ref().is_none(), "empty uid counts as absent");
        assert!(!s.is_kubelet_managed());
        assert_eq!(s.container_name(), None);
        assert_eq!(s.restart_count(), None);
    }
}
