//! A pod's deaths, OOM kills and memory warnings as a namespaced API object of its own: a
//! `PodReport` (observer.dev/v1alpha1), named as its pod, in its pod's namespace, owned by the
//! pod (the garbage collector deletes it with the pod), holding `observer explain`'s document.
//!
//! Why an object and not the agent's port: whoever reads it is authorized by the API server, with
//! the reader's own RBAC in the pod's namespace (`kubectl get podreports`, watch, the kubectl
//! plugin), and no user's credential ever reaches a node: the agent answers nobody about any
//! pod. The history also outlives the node and the agent. The API server's own admission policy
//! (deploy/admission-policy.yaml) holds each agent's token to reports naming its node.
//!
//! Cost: a pod gets a report only once there is something to tell (an instance that ended, an OOM
//! kill, a memory warning), and a write only when what it tells changes (a digest of the
//! document), one request per change after a short settle (the runtime's account of a death
//! follows the kernel's by milliseconds: one write for both); server-side apply, so a create and
//! an update are the same single request.
use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{
    api::{Patch, PatchParams},
    Api, Client,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::explain::{explain, Explanation};
use crate::{
    kube::pods::NodePods,
    model::PodUid,
    reconcile::{PodView, ReconcileHandle},
    runner::{Finished, Runner, RunnerConfig, Step, Then},
};

pub const GROUP: &str = "observer.dev";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "PodReport";
/// The reports' resource, as RBAC and the admission policy name it.
pub const PLURAL: &str = "podreports";

/// One pod's report. Top-level fields, as an Event's (it has no desired state to reconcile).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodReport {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The node whose agent wrote it.
    pub node_name: String,
    #[serde(rename = "podUID")]
    pub pod_uid: String,
    pub summary: Summary,
    /// `observer explain`'s document of the pod.
    pub explanation: Explanation,
}

impl k8s_openapi::Resource for PodReport {
    const API_VERSION: &'static str = "observer.dev/v1alpha1";
    const GROUP: &'static str = GROUP;
    const KIND: &'static str = KIND;
    const VERSION: &'static str = VERSION;
    const URL_PATH_SEGMENT: &'static str = PLURAL;
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::ListableResource for PodReport {
    const LIST_KIND: &'static str = "PodReportList";
}

impl k8s_openapi::Metadata for PodReport {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What `kubectl get podreports` shows (the CRD's printer columns).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Container instances that ended.
    pub deaths: u32,
    /// OOM kills in the pod's containers (a child's included).
    pub oom_kills: u32,
    /// Memory warnings raised before a kill.
    pub warnings: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_death: Option<Death>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_oom_kill: Option<Death>,
}

/// One death or kill, in a line.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Death {
    pub container: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// `main: OOMKilled (137)`, `app: Error (1)`, `main: OOM kill of tail (pid 4242)`.
    pub description: String,
}

impl Summary {
    pub fn of(e: &Explanation) -> Self {
        let ended: Vec<_> = e
            .instances
            .iter()
            .filter(|i| i.finished_at.is_some())
            .collect();
        let last_death = ended
            .iter()
            .max_by(|a, b| a.finished_at.cmp(&b.finished_at))
            .map(|i| Death {
                container: i.container.clone(),
                time: i.finished_at.clone(),
                description: format!(
                    "{}: {} ({})",
                    i.container,
                    i.reason.as_deref().unwrap_or("exited"),
                    i.exit_code.map_or_else(|| "?".into(), |c| c.to_string())
                ),
            });
        let last_oom_kill = e.kills.last().map(|k| Death {
            container: k.container.clone(),
            time: Some(k.time.clone()),
            description: format!(
                "{}: OOM kill of {} (pid {})",
                k.container, k.victim.comm, k.victim.pid
            ),
        });
        Self {
            deaths: ended.len() as u32,
            oom_kills: e.instances.iter().map(|i| i.oom_kills).sum(),
            warnings: e.warnings.len() as u32,
            last_death,
            last_oom_kill,
        }
    }

    /// Nothing a reader would look for: no death, no kill, no warning.
    pub fn is_empty(&self) -> bool {
        self.deaths == 0 && self.oom_kills == 0 && self.warnings == 0
    }
}

impl PodReport {
    /// The report of `view` (the API's pod: kubelet's account beside the agent's, and the
    /// spec's limits), written by the agent of `node`.
    pub fn of(
        view: &PodView,
        api: Result<&k8s_openapi::api::core::v1::Pod, &str>,
        node: &str,
    ) -> Self {
        let explanation = explain(view, None, api);
        Self {
            api_version: "observer.dev/v1alpha1".into(),
            kind: KIND.into(),
            metadata: ObjectMeta {
                name: Some(view.name.clone()),
                namespace: Some(view.namespace.clone()),
                // Deleted with its pod by the garbage collector; never blocks the pod's deletion
                // (which would need the right to delete pods).
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    name: view.name.clone(),
                    uid: view.uid.to_string(),
                    controller: None,
                    block_owner_deletion: None,
                }]),
                ..Default::default()
            },
            node_name: node.into(),
            pod_uid: view.uid.to_string(),
            summary: Summary::of(&explanation),
            explanation,
        }
    }

    /// What the report says, as a digest: a write only when it changes.
    fn digest(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.node_name.as_bytes());
        h.update(serde_json::to_vec(&self.explanation).unwrap_or_default());
        h.finalize().into()
    }

    /// Only `container`'s instances, warnings, kills and kubelet's account of it.
    pub fn only_container(mut self, container: &str) -> Self {
        let e = &mut self.explanation;
        e.instances.retain(|i| i.container == container);
        e.warnings.retain(|w| w.container == container);
        e.kills.retain(|k| k.container == container);
        e.kubelet.containers.retain(|c| c.container == container);
        self
    }
}

/// The reports' counters, encoded by this module.
#[derive(Debug, Default)]
pub struct ReportStats {
    written: AtomicU64,
    failed: AtomicU64,
    /// Changes to a pod whose report already said the same: no request.
    unchanged: AtomicU64,
}

impl ReportStats {
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    pub(crate) fn encode_metrics(
        &self,
        e: &mut prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> std::fmt::Result {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        crate::exposition::counters(
            e,
            "report_writes",
            "PodReport writes (server-side apply), by result",
            "result",
            [("ok", g(&self.written)), ("error", g(&self.failed))],
        )?;
        crate::exposition::counter(
            e,
            "report_unchanged",
            "Pod changes whose PodReport already said the same (no request)",
            g(&self.unchanged),
        )
    }
}

/// How long a changed pod waits before its report is written: the runtime's account of a death
/// (its exit code, its reason) arrives within milliseconds of the kernel's, a restart within a
/// second; one write tells all of it.
const SETTLE: Duration = Duration::from_secs(1);
/// A refusal the agent cannot mend (the CRD not installed, RBAC or the admission policy): asked
/// again this much later, said once.
const REFUSED_RETRY: Duration = Duration::from_secs(60);

/// Writes each pod's report when what it tells changes.
pub struct ReportWriter {
    reconcile: ReconcileHandle,
    pods: NodePods,
    node: String,
    /// The digest of each pod's last report the API accepted.
    written: HashMap<PodUid, [u8; 32]>,
    runner: Runner<PodUid, Arc<PodReport>, Result<[u8; 32], kube::Error>>,
    stats: Arc<ReportStats>,
}

/// What was said once at warn.
#[derive(Debug, Default)]
struct Said {
    missing_crd: AtomicBool,
    forbidden: AtomicBool,
    /// Any other refusal (an invalid report: a CRD of another version than the agent's).
    refused: AtomicBool,
}

impl ReportWriter {
    /// `field_manager`: the agent's name for server-side apply (its Events' reporter).
    pub fn new(
        client: Client,
        reconcile: ReconcileHandle,
        pods: NodePods,
        node: &str,
        field_manager: &str,
    ) -> Self {
        let said = Arc::new(Said::default());
        let params = PatchParams::apply(field_manager).force();
        let runner = Runner::new(
            RunnerConfig {
                max_concurrent: 4,
                ..Default::default()
            },
            move |_uid: PodUid, report: Arc<PodReport>| {
                let client = client.clone();
                let params = params.clone();
                let said = Arc::clone(&said);
                async move { write(client, &params, &report, &said).await }
            },
        );
        Self {
            reconcile,
            pods,
            node: node.into(),
            written: HashMap::new(),
            runner,
            stats: Arc::default(),
        }
    }

    pub fn stats(&self) -> Arc<ReportStats> {
        Arc::clone(&self.stats)
    }

    /// Runs until the task is dropped.
    pub async fn run(mut self) {
        let reconcile = self.reconcile.clone();
        let mut pending: HashSet<PodUid> = HashSet::new();
        let settle = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(settle);
        let mut settling = false;
        loop {
            tokio::select! {
                changed = reconcile.changed_for_reports() => {
                    pending.extend(changed);
                    if !settling {
                        settle.as_mut().reset(tokio::time::Instant::now() + SETTLE);
                        settling = true;
                    }
                }
                () = &mut settle, if settling => {
                    settling = false;
                    for uid in pending.drain().collect::<Vec<_>>() {
                        self.consider(uid);
                    }
                }
                done = self.runner.next() => self.finished(done),
            }
        }
    }

    /// Schedules `uid`'s report if it has something new to tell.
    fn consider(&mut self, uid: PodUid) {
        let Some(view) = self.reconcile.pod(&uid) else {
            // Gone from the node: its report goes with the pod (owner reference).
            self.written.remove(&uid);
            return;
        };
        let api = self.pods.of_view(&view);
        let report = PodReport::of(
            &view,
            api.as_deref()
                .ok_or("the API's pod is not known to this agent yet"),
            &self.node,
        );
        if report.summary.is_empty() && !self.written.contains_key(&uid) {
            return;
        }
        if self.written.get(&uid) == Some(&report.digest()) {
            self.stats.unchanged.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.runner.schedule(uid, Arc::new(report));
    }

    fn finished(&mut self, done: Finished<PodUid, Result<[u8; 32], kube::Error>>) {
        match done.output {
            Ok(Ok(digest)) => {
                self.stats.written.fetch_add(1, Ordering::Relaxed);
                self.written.insert(done.key, digest);
            }
            Ok(Err(e)) => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(pod = %done.key, "PodReport not written: {e}");
            }
            Err(panicked) => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(pod = %done.key, "writing a PodReport panicked: {}", panicked.0);
            }
        }
    }
}

/// One server-side apply of `report`.
async fn write(
    client: Client,
    params: &PatchParams,
    report: &PodReport,
    said: &Said,
) -> Step<Result<[u8; 32], kube::Error>> {
    let ns = report.metadata.namespace.as_deref().unwrap_or_default();
    let name = report.metadata.name.as_deref().unwrap_or_default();
    // The answer is not read back (an agent older or newer than the CRD's stored shape must not
    // fail on it): the dynamic object takes whatever the API server answers.
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client, ns, &kube::api::ApiResource::erase::<PodReport>(&()));
    match api.patch(name, params, &Patch::Apply(report)).await {
        Ok(_) => Step::done(Ok(report.digest())),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            if !said.missing_crd.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "PodReports cannot be written: the API server does not serve {PLURAL}.{GROUP} \
                     ({}); install the CRD (deploy/crd.yaml, or the chart) so that `kubectl \
                     observer explain` and `kubectl get podreports` can read what this agent \
                     saw; retried every {}s",
                    s.message,
                    REFUSED_RETRY.as_secs()
                );
            }
            Step {
                output: Err(kube::Error::Api(s)),
                then: Then::RetryAfter(REFUSED_RETRY),
            }
        }
        // Its namespace is being deleted, and the pod with it: nothing to keep.
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("being terminated") => {
            Step {
                output: Err(kube::Error::Api(s)),
                then: Then::Forget,
            }
        }
        Err(kube::Error::Api(s)) if s.code == 403 => {
            if !said.forbidden.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "PodReports refused ({}): the agent's ClusterRole needs get, create and patch \
                     on {PLURAL}.{GROUP} (deploy/rbac.yaml), and the admission policy \
                     observer-own-node lets it write only reports naming its own node; retried \
                     every {}s",
                    s.message,
                    REFUSED_RETRY.as_secs()
                );
            }
            Step {
                output: Err(kube::Error::Api(s)),
                then: Then::RetryAfter(REFUSED_RETRY),
            }
        }
        Err(kube::Error::Api(s)) if (400..500).contains(&s.code) && s.code != 429 => {
            if !said.refused.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "a PodReport was refused ({} {}: {}): the CRD podreports.{GROUP} installed may \
                     be of another version than this agent (apply the agent's own deploy/crd.yaml \
                     or chart); retried every {}s",
                    s.code,
                    s.reason,
                    s.message,
                    REFUSED_RETRY.as_secs()
                );
            }
            Step {
                output: Err(kube::Error::Api(s)),
                then: Then::RetryAfter(REFUSED_RETRY),
            }
        }
        Err(e) => Step::retry(Err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        kube::testkit::api::{self, status, Reply},
        reconcile::{testkit, ContainerPhase},
    };

    fn writer(client: Client, reconcile: &ReconcileHandle) -> ReportWriter {
        // The reflector is never driven here: the API's pod is unknown, as on a slow first list.
        let (pods, _changes) = crate::kube::pods::watch(client.clone(), "node-a", "");
        ReportWriter::new(client, reconcile.clone(), pods, "node-a", "observer")
    }

    #[test]
    fn the_report_is_its_pods_own_and_sums_up_what_it_tells() {
        let mut dead = testkit::exited("app", 0, 137, "OOMKilled");
        dead.oom_kills = 1;
        let mut kill = testkit::oom(&dead, 4242, "hog", true);
        // The kernel's report, whose flags are written only when set: read back all the same.
        kill.report = Some(Default::default());
        dead.last_oom = Some(kill);
        let v = testkit::view(vec![dead, testkit::cv("app", 1, ContainerPhase::Running)]);
        let r = PodReport::of(&v, Err("no API"), "node-a");
        assert_eq!(
            (r.metadata.name.as_deref(), r.metadata.namespace.as_deref()),
            (Some(testkit::NAME), Some(testkit::NS))
        );
        let owner = &r.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Pod", testkit::UID)
        );
        assert_eq!(owner.block_owner_deletion, None);
        assert_eq!(
            (r.node_name.as_str(), r.pod_uid.as_str()),
            ("node-a", testkit::UID)
        );
        assert_eq!((r.summary.deaths, r.summary.oom_kills), (1, 1));
        assert_eq!(
            r.summary.last_death.as_ref().unwrap().description,
            "app: OOMKilled (137)"
        );
        assert_eq!(
            r.summary.last_oom_kill.as_ref().unwrap().description,
            "app: OOM kill of hog (pid 4242)"
        );
        // What the API server stores is what the plugin reads back.
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["apiVersion"], "observer.dev/v1alpha1");
        // No null where the CRD's schema wants an object: absent instead.
        let none = PodReport::of(&testkit::view(vec![]), Err("no API"), "node-a");
        let summary = serde_json::to_value(&none.summary).unwrap();
        assert_eq!(
            summary,
            serde_json::json!({"deaths": 0, "oomKills": 0, "warnings": 0})
        );
        assert_eq!(json["podUID"], testkit::UID);
        assert_eq!(json["summary"]["oomKills"], 1);
        assert!(json["explanation"]["kills"][0]["report"].is_object());
        assert!(json["explanation"]["kills"][0]["report"]["refused"].is_null());
        let back: PodReport = serde_json::from_value(json).unwrap();
        assert_eq!(back.explanation.kills[0].victim.comm, "hog");
        assert_eq!(back.digest(), r.digest());
        // One container's part only.
        let only = back.only_container("other");
        assert!(only.explanation.instances.is_empty() && only.explanation.kills.is_empty());
    }

    /// A pod with nothing to tell costs nothing; a death is one server-side apply; the same
    /// story again is not sent; a new death is.
    #[tokio::test]
    async fn written_once_per_change_by_server_side_apply() {
        let (client, mock) = api::client();
        let log = api::serve(mock, vec![Reply::Echo, Reply::Echo]);
        let reconcile = ReconcileHandle::detached();
        let mut w = writer(client, &reconcile);
        let uid = PodUid::parse(testkit::UID).unwrap();

        reconcile.publish(testkit::view(vec![testkit::cv(
            "app",
            0,
            ContainerPhase::Running,
        )]));
        w.consider(uid);
        assert_eq!(w.runner.keys(), 0, "nothing to tell: nothing scheduled");

        reconcile.publish(testkit::view(vec![testkit::exited("app", 0, 1, "Error")]));
        w.consider(uid);
        let done = w.runner.next().await;
        w.finished(done);
        let seen = log.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].method, http::Method::PATCH);
        assert_eq!(
            seen[0].path,
            "/apis/observer.dev/v1alpha1/namespaces/default/podreports/web"
        );
        assert!(
            seen[0].query.contains("fieldManager=observer") && seen[0].query.contains("force=true")
        );
        assert_eq!(seen[0].content_type, "application/apply-patch+yaml");
        assert_eq!(seen[0].body["summary"]["deaths"], 1);
        assert_eq!(w.stats.written(), 1);

        // The same story: no request.
        w.consider(uid);
        assert_eq!(w.runner.keys(), 0);
        assert_eq!(w.stats.unchanged.load(Ordering::Relaxed), 1);

        // It restarted and died again: written.
        reconcile.publish(testkit::view(vec![
            testkit::exited("app", 0, 1, "Error"),
            testkit::exited("app", 1, 2, "Error"),
        ]));
        w.consider(uid);
        let done = w.runner.next().await;
        w.finished(done);
        let seen = log.lock().unwrap().clone();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[1].body["summary"]["deaths"], 2);

        // Gone from the node: forgotten, nothing sent (the report goes with its pod).
        reconcile.remove(uid);
        w.consider(uid);
        assert!(w.written.is_empty());
        assert_eq!(log.lock().unwrap().len(), 2);
    }

    /// A cluster without the CRD, or an agent without the right: said, retried later, counted.
    #[tokio::test]
    async fn a_missing_crd_or_right_is_retried_later() {
        let (client, mock) = api::client();
        let _log = api::serve(
            mock,
            vec![status(404, "NotFound"), status(403, "Forbidden")],
        );
        let reconcile = ReconcileHandle::detached();
        let mut w = writer(client, &reconcile);
        reconcile.publish(testkit::view(vec![testkit::exited("app", 0, 1, "Error")]));
        w.consider(PodUid::parse(testkit::UID).unwrap());
        let done = w.runner.next().await;
        assert!(matches!(done.output, Ok(Err(kube::Error::Api(ref s))) if s.code == 404));
        w.finished(done);
        assert_eq!(w.stats.failed.load(Ordering::Relaxed), 1);
        assert!(w.written.is_empty());
    }
}
