//! The status manager: what the kernel saw, written to the Kubernetes API.
//!
//! The agent reconciles its node view ([`crate::reconcile::PodView`]); a [`StatusManager`] takes
//! each changed pod straight from the reconciler's handle. The manager keeps this node's pods from
//! a reflector ([`pods`]), computes what to say by kubelet's rules ([`compute`], [`conditions`],
//! [`audit`]), and writes it with one request in flight per pod ([`writer`], [`patch`]) and Events
//! ([`events`]).
//!
//! Modes ([`StatusMode`]):
//! - `conditions` (default): beside kubelet, two observer-owned condition types,
//!   `<prefix>/ContainersAlive` (for a `readinessGate`) and `<prefix>/OOMKilled`. kubelet keeps
//!   condition types it does not own (its `mergePodStatus`), and never overwrites them.
//! - `audit`: writes no status; compares kubelet's status in the API with the kernel's account and
//!   reports each disagreement as a Warning Event and a counter.
//! - `full`: the whole computed PodStatus, for nodes where nothing else writes pod status.
//! - `off`: nothing reaches the API.
//!
//! Wiring, for the agent (`agent::run` does it):
//! ```ignore
//! let api = observer::kube::client(kubeconfig.as_deref()).await?;
//! let mut cfg = StatusConfig::new(node_name, StatusMode::Conditions);
//! cfg.api_url = api.url;
//! let (manager, handle) = StatusManager::new(api.client, cfg, agent.reconcile.clone());
//! tokio::spawn(manager.run());
//! // /readyz:
//! handle.listed()?;
//! // on SIGTERM:
//! handle.flush(Duration::from_secs(5)).await;
//! ```
pub mod audit;
pub(crate) mod compute;
pub mod conditions;
pub mod death;
pub mod events;
pub mod ledger;
pub mod manager;
pub mod patch;
mod prepared;
pub mod writer;

use std::{fmt, str::FromStr, time::Duration};

use crate::{kube::KubeError, ratelimit::Rate};

pub use audit::audit;
pub use audit::Finding;
pub use audit::FindingKind;
pub use compute::Unknown;
pub(crate) use conditions::check_prefix;
pub use conditions::ConditionTypes;
pub use events::EventConfig;
pub use ledger::AliveLedger;
pub use ledger::ManagerSnapshot;
pub use manager::FlushReport;
pub use manager::{StatusHandle, StatusManager, StatusStats};
pub use prepared::DeathDetails;
pub use prepared::Prepared;
pub use writer::WriteJob;
pub use writer::WriteOutcome;

/// What reaches the API. See the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StatusMode {
    Off,
    #[default]
    Conditions,
    Audit,
    Full,
}

impl StatusMode {
    pub fn as_str(self) -> &'static str {
        match self {
            StatusMode::Off => "off",
            StatusMode::Conditions => "conditions",
            StatusMode::Audit => "audit",
            StatusMode::Full => "full",
        }
    }
}

impl fmt::Display for StatusMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for StatusMode {
    type Err = KubeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "off" => Ok(StatusMode::Off),
            "conditions" => Ok(StatusMode::Conditions),
            "audit" => Ok(StatusMode::Audit),
            "full" => Ok(StatusMode::Full),
            _ => Err(KubeError::BadMode(s.to_string())),
        }
    }
}

/// The status manager's settings. [`StatusConfig::new`] gives the defaults.
#[derive(Clone, Debug)]
pub struct StatusConfig {
    /// This node: pods are watched with `spec.nodeName=<node_name>`.
    pub node_name: String,
    /// The API server's URL, for reports of failed calls ([`ApiClient::url`]).
    pub api_url: String,
    pub mode: StatusMode,
    /// Domain prefix of the observer-owned condition types (`<prefix>/ContainersAlive`,
    /// `<prefix>/OOMKilled`). Must not be empty: unprefixed types are kubelet's namespace.
    pub condition_prefix: String,
    /// Scheme of container ids in the API (`containerd://<id>`), as kubelet writes them.
    pub runtime_name: String,
    /// `reportingController` of Events, and the `fieldManager` of status patches.
    pub reporter: String,
    /// Audit: how long the API may still call a container Running after the kernel saw its init
    /// exit. kubelet's path is a 1 s relist then its status sync; the default leaves it 10 s.
    pub audit_running_grace: Duration,
    /// Per request: a server that does not answer in time is retried like a 5xx.
    pub request_timeout: Duration,
    /// Status patches in flight at once, over all pods (one per pod at most).
    pub max_concurrent_writes: usize,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Seed of the back-off jitter (tests); `None`: random.
    pub backoff_seed: Option<u64>,
    pub events: EventConfig,
    /// Log lines about one pod (its deaths, kills, failed writes): a burst, then one per refill.
    pub pod_logs: Rate,
}

impl StatusConfig {
    pub fn new(node_name: impl Into<String>, mode: StatusMode) -> Self {
        Self {
            node_name: node_name.into(),
            api_url: String::new(),
            mode,
            condition_prefix: "observer.dev".into(),
            runtime_name: "containerd".into(),
            reporter: "observer".into(),
            audit_running_grace: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            max_concurrent_writes: 8,
            backoff_initial: Duration::from_millis(200),
            // One node's pods: retries every few seconds cost the API server little, and an
            // outage's deaths are written seconds, not half a minute, after it ends.
            backoff_max: Duration::from_secs(5),
            backoff_seed: None,
            events: EventConfig::default(),
            pod_logs: Rate {
                burst: 20,
                refill: Duration::from_secs(6),
            },
        }
    }

    pub(crate) fn condition_types(&self) -> ConditionTypes {
        ConditionTypes::new(&self.condition_prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for m in [
            StatusMode::Off,
            StatusMode::Conditions,
            StatusMode::Audit,
            StatusMode::Full,
        ] {
            assert_eq!(m.as_str().parse::<StatusMode>().unwrap(), m);
        }
        assert!(matches!(
            "patch".parse::<StatusMode>(),
            Err(KubeError::BadMode(_))
        ));
        assert_eq!(StatusMode::default(), StatusMode::Conditions);
    }
}
