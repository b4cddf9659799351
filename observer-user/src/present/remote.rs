//! What the agents know, read from anywhere the API reaches (`kubectl observer explain POD`):
//! each pod's PodReport ([`super::report`]), read with the caller's own credentials and rights,
//! in the pod's namespace. No agent is asked and no credential leaves the API server: who may
//! read a pod's report is the API server's RBAC (`get` on `podreports.observer.dev` there, which
//! the ClusterRole observer-reports-reader aggregates into `view`).
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use thiserror::Error;

use super::report::{PodReport, GROUP, PLURAL};

#[derive(Debug, Error)]
pub enum RemoteError {
    /// The pod has no report: no agent saw it end, be OOM-killed or warned about.
    #[error(
        "no PodReport for pod {0}/{1}: no observer agent has seen any of its containers end, be \
         OOM-killed or near its memory limit (a report is written at the first such event)"
    )]
    NoReport(String, String),
    #[error("no pod {0}/{1} and no PodReport of it")]
    NoPod(String, String),
    /// The report is of an earlier pod of the same name (not yet collected with it).
    #[error(
        "the PodReport {0}/{1} is of an earlier pod of that name (uid {2}), not of the pod now \
         there (uid {3}): no agent has reported on the new one yet"
    )]
    Stale(String, String, String, String),
    #[error(
        "the CRD {PLURAL}.{GROUP} is not installed in this cluster (deploy/crd.yaml, or the chart)"
    )]
    NoCrd,
    #[error("reading {what} {namespace}/{name}: {source}")]
    Api {
        what: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The API server refused the caller: says which right is missing.
    #[error(
        "not allowed to {need} in namespace {namespace} ({message}); reading a pod's report \
         needs get on podreports.observer.dev there: the ClusterRole observer-reports-reader \
         (deploy/plugin-rbac.yaml), which `view` includes once it is installed"
    )]
    Forbidden {
        need: &'static str,
        namespace: String,
        message: String,
    },
}

fn api_error(
    e: kube::Error,
    what: &'static str,
    need: &'static str,
    namespace: &str,
    name: &str,
) -> RemoteError {
    match e {
        kube::Error::Api(s) if s.code == 403 => RemoteError::Forbidden {
            need,
            namespace: namespace.into(),
            message: s.message,
        },
        source => RemoteError::Api {
            what,
            namespace: namespace.into(),
            name: name.into(),
            source,
        },
    }
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// `namespace/pod`'s report, checked against the pod now there where the caller may read it.
pub async fn report(client: &Client, namespace: &str, pod: &str) -> Result<PodReport, RemoteError> {
    let reports = Api::<PodReport>::namespaced(client.clone(), namespace);
    let found = match reports.get(pod).await {
        Ok(r) => Some(r),
        Err(e) if not_found(&e) => {
            // A 404 without a Status reason `NotFound` of a named object is the resource
            // itself missing.
            if let kube::Error::Api(s) = &e {
                if s.details.as_ref().is_none_or(|d| d.name.is_empty()) {
                    return Err(RemoteError::NoCrd);
                }
            }
            None
        }
        Err(e) => return Err(api_error(e, "PodReport", "get podreports", namespace, pod)),
    };
    // The pod itself, to tell a pod with nothing to report from none at all, and a report of an
    // earlier pod of the same name. Where the caller may not read pods, the report stands alone.
    let now = match Api::<Pod>::namespaced(client.clone(), namespace)
        .get(pod)
        .await
    {
        Ok(p) => Some(p),
        Err(e) if not_found(&e) => {
            if found.is_none() {
                return Err(RemoteError::NoPod(namespace.into(), pod.into()));
            }
            None
        }
        Err(_) => None,
    };
    let Some(report) = found else {
        return Err(RemoteError::NoReport(namespace.into(), pod.into()));
    };
    if let Some(uid) = now.and_then(|p| p.metadata.uid) {
        if uid != report.pod_uid {
            return Err(RemoteError::Stale(
                namespace.into(),
                pod.into(),
                report.pod_uid,
                uid,
            ));
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::kube::testkit::api::{self, Reply};

    fn report_json(uid: &str) -> serde_json::Value {
        json!({"apiVersion": "observer.dev/v1alpha1", "kind": "PodReport",
               "metadata": {"name": "web", "namespace": "shop"},
               "nodeName": "node-7", "podUID": uid,
               "summary": {"deaths": 1, "oomKills": 1, "warnings": 0},
               "explanation": {"namespace": "shop", "name": "web", "uid": uid,
                               "instances": [], "warnings": [], "kills": [],
                               "kubelet": {"unavailable": null, "containers": []}}})
    }

    fn pod(uid: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "web", "namespace": "shop", "uid": uid}})
    }

    fn status(code: u16, reason: &str, name: &str) -> Reply {
        Reply::Json(
            code,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                   "message": format!("{reason} (test)"), "reason": reason, "code": code,
                   "details": {"name": name}}),
        )
    }

    #[tokio::test]
    async fn reads_the_report_in_the_pods_namespace_and_checks_its_pod() {
        let (client, mock) = api::client();
        let log = api::serve(
            mock,
            vec![
                Reply::Json(200, report_json("u-1")),
                Reply::Json(200, pod("u-1")),
            ],
        );
        let r = report(&client, "shop", "web").await.unwrap();
        assert_eq!((r.node_name.as_str(), r.summary.oom_kills), ("node-7", 1));
        let seen = log.lock().unwrap().clone();
        assert_eq!(
            seen[0].path,
            "/apis/observer.dev/v1alpha1/namespaces/shop/podreports/web"
        );
        assert_eq!(seen[1].path, "/api/v1/namespaces/shop/pods/web");
    }

    #[tokio::test]
    async fn a_pod_without_a_report_a_missing_pod_and_a_stale_report_are_told_apart() {
        let (client, mock) = api::client();
        let _log = api::serve(
            mock,
            vec![status(404, "NotFound", "web"), Reply::Json(200, pod("u-1"))],
        );
        let e = report(&client, "shop", "web").await.unwrap_err();
        assert!(matches!(e, RemoteError::NoReport(..)), "{e}");

        let (client, mock) = api::client();
        let _log = api::serve(
            mock,
            vec![
                status(404, "NotFound", "web"),
                status(404, "NotFound", "web"),
            ],
        );
        let e = report(&client, "shop", "web").await.unwrap_err();
        assert_eq!(e.to_string(), "no pod shop/web and no PodReport of it");

        let (client, mock) = api::client();
        let _log = api::serve(
            mock,
            vec![
                Reply::Json(200, report_json("u-1")),
                Reply::Json(200, pod("u-2")),
            ],
        );
        let e = report(&client, "shop", "web").await.unwrap_err();
        assert!(matches!(e, RemoteError::Stale(..)), "{e}");
    }

    #[tokio::test]
    async fn a_refusal_names_the_right_and_a_missing_crd_is_said() {
        let (client, mock) = api::client();
        let _log = api::serve(mock, vec![status(403, "Forbidden", "web")]);
        let e = report(&client, "shop", "web").await.unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("not allowed to get podreports in namespace shop")
                && text.contains("observer-reports-reader"),
            "{text}"
        );
        let (client, mock) = api::client();
        let _log = api::serve(mock, vec![status(404, "NotFound", "")]);
        let e = report(&client, "shop", "web").await.unwrap_err();
        assert!(matches!(e, RemoteError::NoCrd), "{e}");
    }
}
