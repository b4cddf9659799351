//! This node's pods, from a kube reflector on pods with `spec.nodeName=<node>`.
//!
//! The watcher retries with kube's default back-off while the API is unreachable; the store keeps
//! the last pods it had meanwhile, so the agent goes on working locally, and a relist when the
//! API returns brings it up to date (the store swaps in the new list at once, dropping pods
//! deleted while it was away). Managed fields are dropped on the way in: half a pod's metadata,
//! and nothing the agent reads.
use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc, Mutex,
};

use ::kube::{
    runtime::{
        reflector::{self, ObjectRef, Store},
        watcher::{self, watcher, Event},
        WatchStreamExt,
    },
    Api, Client, ResourceExt,
};
use futures::{stream::BoxStream, StreamExt};
use k8s_openapi::api::core::v1::Pod;

/// What changed in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodChange {
    /// Added or modified (during a relist: before the store has swapped the list in; a
    /// [`PodChange::Resynced`] follows).
    Applied {
        uid: String,
    },
    Deleted {
        uid: String,
    },
    /// A (re)list completed: the store holds exactly the API's pods of this node.
    Resynced,
    /// The API is not reachable or refused the watch; the watcher retries.
    Error(String),
}

/// Read side of the reflector's store.
#[derive(Clone)]
pub struct NodePods {
    store: Store<Pod>,
    sync: Arc<ListState>,
}

/// Whether the API listed this node's pods yet, and why not.
#[derive(Default)]
struct ListState {
    listed: AtomicBool,
    last_error: Mutex<Option<String>>,
}

impl NodePods {
    /// `Ok` once a list of this node's pods succeeded; else why not (for `/readyz`).
    pub fn listed(&self) -> Result<(), String> {
        if self.sync.listed.load(Ordering::Relaxed) {
            return Ok(());
        }
        Err(match crate::sync::lock(&self.sync.last_error).as_deref() {
            Some(e) => format!("the API's first list of this node's pods has not succeeded: {e}"),
            None => "the API's first list of this node's pods is not done".into(),
        })
    }

    pub(crate) fn by_uid(&self, uid: &str) -> Option<Arc<Pod>> {
        self.store.find(|p| p.metadata.uid.as_deref() == Some(uid))
    }

    /// The API's pod for a reconciled view: by UID, else a static pod's mirror (same name, its
    /// `kubernetes.io/config.mirror` annotation naming the static pod's UID).
    pub fn of_view(&self, view: &crate::reconcile::PodView) -> Option<Arc<Pod>> {
        let uid = view.uid.as_str();
        self.by_uid(uid).or_else(|| {
            self.get(&view.namespace, &view.name)
                .filter(|p| is_pod_of(p, uid))
        })
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.store.get(&ObjectRef::new(name).within(namespace))
    }

    pub fn all(&self) -> Vec<Arc<Pod>> {
        self.store.state()
    }

    pub fn len(&self) -> usize {
        self.store.len()
    }

    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }

    /// Resolves once the first list has been stored.
    pub async fn ready(&self) {
        let _ = self.store.wait_until_ready().await;
    }
}

/// Whether the API's `pod` is the one whose sandbox has `uid`: the same UID, or the mirror of
/// that static pod.
pub(crate) fn is_pod_of(pod: &Pod, uid: &str) -> bool {
    pod.metadata.uid.as_deref() == Some(uid)
        || pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kubernetes.io/config.mirror"))
            .is_some_and(|m| m == uid)
}

/// The reflector's back-off between failed lists or watches: 500 ms doubling to 8 s, jittered,
/// reset by any success. kube's default grows to 30 s: after an API server restart the agent's
/// copy of its pods stayed up to half a minute behind the API (one node's pods are one small
/// list, and the API server's flow control guards it against many nodes at once).
struct WatchBackoff(crate::runner::Backoff);

impl Default for WatchBackoff {
    fn default() -> Self {
        Self(crate::runner::Backoff::new(
            std::time::Duration::from_millis(500),
            std::time::Duration::from_secs(8),
        ))
    }
}

impl Iterator for WatchBackoff {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<Self::Item> {
        Some(self.0.next_delay())
    }
}

impl ::kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.0.reset();
    }
}

/// The field selector of this node's pods.
pub(crate) fn node_selector(node: &str) -> String {
    format!("spec.nodeName={node}")
}

/// The reflector on this node's pods: the store to read, and the stream of changes that must be
/// polled to keep it up to date (it never ends). `url` names the server in reports.
pub fn watch(client: Client, node: &str, url: &str) -> (NodePods, BoxStream<'static, PodChange>) {
    let api: Api<Pod> = Api::all(client);
    let cfg = watcher::Config::default().fields(&node_selector(node));
    let (reader, writer) = reflector::store();
    let events = watcher(api, cfg)
        .modify(|p: &mut Pod| p.managed_fields_mut().clear())
        .backoff(WatchBackoff::default());
    let mut errors = 0u64;
    let sync = Arc::new(ListState::default());
    let state = Arc::clone(&sync);
    let url = url.to_string();
    // The first list's size and time, said once: a start-up's part in the agent's readiness.
    let (started, mut initial) = (std::time::Instant::now(), 0usize);
    let stream = reflector::reflector(writer, events)
        .filter_map(move |ev| {
            let change = match ev {
                Ok(Event::Apply(p) | Event::InitApply(p)) => {
                    errors = 0;
                    initial += 1;
                    p.metadata.uid.map(|uid| PodChange::Applied { uid })
                }
                Ok(Event::Delete(p)) => p.metadata.uid.map(|uid| PodChange::Deleted { uid }),
                Ok(Event::Init) => {
                    initial = 0;
                    None
                }
                Ok(Event::InitDone) => {
                    errors = 0;
                    if !state.listed.swap(true, Ordering::Relaxed) {
                        tracing::info!(
                            pods = initial,
                            elapsed = ?started.elapsed(),
                            "the API's first list of this node's pods is done"
                        );
                    }
                    Some(PodChange::Resynced)
                }
                Err(e) => {
                    errors += 1;
                    let why = super::describe_watch_error(&e, &url);
                    // The first failure and then every power of two: an outage is one line a
                    // while, not one per retry.
                    if errors.is_power_of_two() {
                        tracing::warn!(
                            failures = errors,
                            "listing this node's pods failed: {why}; retrying"
                        );
                    }
                    *crate::sync::lock(&state.last_error) = Some(why.clone());
                    Some(PodChange::Error(why))
                }
            };
            std::future::ready(change)
        })
        .boxed();
    (
        NodePods {
            store: reader,
            sync,
        },
        stream,
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::kube::testkit::{api::*, *};

    fn list(rv: &str, pods: Vec<Pod>) -> Reply {
        Reply::Json(
            200,
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": rv},
                   "items": pods}),
        )
    }

    fn node_pod() -> Pod {
        let mut p = pod(spec("Always", vec![], vec![container("app")]), None);
        p.metadata.managed_fields = Some(vec![Default::default()]);
        p
    }

    async fn next(s: &mut BoxStream<'static, PodChange>) -> PodChange {
        tokio::time::timeout(Duration::from_secs(120), s.next())
            .await
            .expect("a change")
            .expect("the stream never ends")
    }

    #[tokio::test(start_paused = true)]
    async fn lists_and_watches_this_nodes_pods_only() {
        let (client, handle) = client();
        let seen = serve(handle, vec![list("10", vec![node_pod()]), Reply::Hang]);
        let (pods, mut changes) = watch(client, "node-1", "");
        assert_eq!(
            next(&mut changes).await,
            PodChange::Applied { uid: UID.into() }
        );
        assert_eq!(next(&mut changes).await, PodChange::Resynced);
        let p = pods.by_uid(UID).expect("stored");
        assert!(
            p.metadata.managed_fields.as_ref().is_none_or(Vec::is_empty),
            "dropped"
        );
        assert!(pods.get(NS, NAME).is_some());
        // Polling the stream on is what sends the watch.
        tokio::spawn(async move { while changes.next().await.is_some() {} });
        let s = wait_for(&seen, 2, Duration::from_secs(5)).await;
        assert_eq!(s[0].method, http::Method::GET);
        assert_eq!(s[0].path, "/api/v1/pods");
        assert!(
            s[0].query.contains("fieldSelector=spec.nodeName%3Dnode-1"),
            "{}",
            s[0].query
        );
        assert!(s[1].query.contains("watch=true"), "{}", s[1].query);
        assert!(s[1].query.contains("fieldSelector=spec.nodeName%3Dnode-1"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_api_is_retried_and_the_store_catches_up() {
        let (client, handle) = client();
        let seen = serve(
            handle,
            vec![
                status(503, "ServiceUnavailable"),
                status(500, "InternalError"),
                list("11", vec![node_pod()]),
                Reply::Hang,
            ],
        );
        let (pods, mut changes) = watch(client, "node-1", "");
        assert!(matches!(next(&mut changes).await, PodChange::Error(_)));
        assert!(pods.is_empty(), "nothing known yet, nothing invented");
        assert!(matches!(next(&mut changes).await, PodChange::Error(_)));
        assert_eq!(
            next(&mut changes).await,
            PodChange::Applied { uid: UID.into() }
        );
        assert_eq!(next(&mut changes).await, PodChange::Resynced);
        assert_eq!(pods.len(), 1);
        let s = seen.lock().unwrap().clone();
        assert!(s[1].at > s[0].at, "backed off between attempts");
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_are_said_with_what_to_check_and_hold_readiness() {
        let (log, _g) = crate::testlog::capture(tracing::Level::WARN);
        let (client, handle) = client();
        serve(
            handle,
            vec![
                status(401, "Unauthorized"),
                status(403, "Forbidden"),
                list("12", vec![node_pod()]),
                Reply::Hang,
            ],
        );
        let (pods, mut changes) = watch(client, "node-1", "https://10.0.0.1:6443");
        assert_eq!(
            pods.listed(),
            Err("the API's first list of this node's pods is not done".into())
        );
        let unauthorized = "the API server at https://10.0.0.1:6443 refused the agent's credentials (401 Unauthorized: Unauthorized (test)): check the kubeconfig's user, or the service account's token";
        assert_eq!(
            next(&mut changes).await,
            PodChange::Error(unauthorized.into())
        );
        assert_eq!(
            pods.listed(),
            Err(format!(
                "the API's first list of this node's pods has not succeeded: {unauthorized}"
            ))
        );
        let forbidden = "the API server at https://10.0.0.1:6443 forbids it (403 Forbidden: Forbidden (test)): the agent's account needs get, list and watch on pods, patch on pods/status and create on events (deploy/'s ClusterRole)";
        assert_eq!(next(&mut changes).await, PodChange::Error(forbidden.into()));
        assert!(pods.listed().unwrap_err().ends_with(forbidden));
        assert!(matches!(
            next(&mut changes).await,
            PodChange::Applied { .. }
        ));
        assert_eq!(next(&mut changes).await, PodChange::Resynced);
        assert_eq!(pods.listed(), Ok(()));
        assert_eq!(
            log.lines(),
            vec![
                format!(
                    "WARN listing this node's pods failed: {unauthorized}; retrying failures=1"
                ),
                format!("WARN listing this node's pods failed: {forbidden}; retrying failures=2"),
            ]
        );
    }

    #[test]
    fn an_unreachable_server_is_named() {
        let e = ::kube::Error::Service("client error (Connect)".into());
        assert_eq!(
            crate::kube::describe_api_error(&e, "https://10.0.0.1:6443"),
            "the API server at https://10.0.0.1:6443 cannot be reached (ServiceError: client error (Connect)): check the kubeconfig's server, or the network to it"
        );
    }

    #[tokio::test]
    async fn a_closed_port_is_named_with_its_cause_once() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user: {{}}\ncurrent-context: c\n"),
        )
        .unwrap();
        let api = crate::kube::client(Some(kubeconfig.as_os_str()))
            .await
            .unwrap();
        let (pods, mut changes) = watch(api.client, "node-1", &api.url);
        let PodChange::Error(why) = next(&mut changes).await else {
            panic!("a closed port answered");
        };
        let server = format!("the API server at http://127.0.0.1:{port}/ cannot be reached (");
        assert!(why.starts_with(&server), "{why}");
        assert!(
            why.ends_with("): check the kubeconfig's server, or the network to it"),
            "{why}"
        );
        assert_eq!(why.matches("Connection refused").count(), 1, "{why}");
        assert!(pods.listed().unwrap_err().ends_with(&why));
    }
}
