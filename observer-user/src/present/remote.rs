//! A node's agent asked from anywhere the API reaches (`kubectl observer explain POD`): the
//! pod's node from the API, the agent's pod on that node (its DaemonSet's label and a field
//! selector on the node), then the agent's `/explain/<namespace>/<pod>` through the API server's
//! pod proxy (`pods/proxy` on the agents' pods, which the caller's RBAC must allow). The agent
//! answers only a caller who may `get` the pod asked about; the pod proxy removes the caller's
//! `Authorization`, so the plugin sends the caller's own bearer token again in
//! [`crate::kube::FORWARDED`], and the agent has the API server review it.
use k8s_openapi::api::core::v1::Pod;
use kube::{api::ListParams, Api, Client};
use thiserror::Error;

/// Where the agents run: deploy/'s namespace, DaemonSet label and HTTP port.
#[derive(Clone, Debug)]
pub struct Agents {
    pub namespace: String,
    pub selector: String,
    pub port: u16,
}

impl Default for Agents {
    fn default() -> Self {
        Self {
            namespace: "observer-system".into(),
            selector: "app.kubernetes.io/name=observer".into(),
            port: 9891,
        }
    }
}

#[derive(Debug, Error)]
pub enum RemoteError {
    #[error("pod {0}/{1}: {2}")]
    Pod(String, String, #[source] kube::Error),
    #[error("pod {0}/{1} is not scheduled to a node yet")]
    NotScheduled(String, String),
    #[error("listing the agents in {0}: {1}")]
    Agents(String, #[source] kube::Error),
    #[error("no running observer agent on node {node} (pods labelled {selector} in {namespace})")]
    NoAgent {
        node: String,
        selector: String,
        namespace: String,
    },
    #[error("the agent {0} on node {1}, through the API server's pod proxy: {2}")]
    Agent(String, String, #[source] kube::Error),
    /// The agent refused the caller (401: the token, 403: the right to get the pod).
    #[error("the agent {agent} on node {node} refused: {message}")]
    AgentRefused {
        agent: String,
        node: String,
        message: String,
    },
    /// The kubeconfig's user has no bearer token the agent could check.
    #[error(
        "the agent answers only callers whose bearer token it can check, and this kubeconfig's \
         user {0}: use a kubeconfig whose user has a token (an OIDC or exec plugin's, or a \
         service account's from `kubectl create token`)"
    )]
    NoToken(&'static str),
    #[error("the kubeconfig's credentials: {0}")]
    Credentials(String),
    /// The API server refused a step for the caller's RBAC: says which right is missing.
    #[error(
        "not allowed to {need} in namespace {namespace} ({message}); the plugin needs get on the \
         pod, and list on pods and get on pods/proxy in the agents' namespace: bind the Role \
         observer-explain there (deploy/plugin-rbac.yaml) to this user"
    )]
    Forbidden {
        need: &'static str,
        namespace: String,
        message: String,
    },
}

impl RemoteError {
    /// `other` unless the API server answered 403, which becomes [`RemoteError::Forbidden`]
    /// naming the right the step needs (the server's message names the user).
    fn or_forbidden(
        e: kube::Error,
        need: &'static str,
        namespace: &str,
        other: impl FnOnce(kube::Error) -> Self,
    ) -> Self {
        match &e {
            kube::Error::Api(s) if s.code == 403 => Self::Forbidden {
                need,
                namespace: namespace.into(),
                message: s.message.clone(),
            },
            _ => other(e),
        }
    }
}

/// The bearer token `config`'s user sends (a token, a token file, an exec or OIDC plugin's), as
/// kube's own client resolves it: the auth layer is asked to sign an empty request.
pub async fn caller_token(config: &kube::Config) -> Result<String, RemoteError> {
    use kube::client::ConfigExt;
    use tower::{Layer, ServiceExt};
    let certificate = config.auth_info.client_certificate.is_some()
        || config.auth_info.client_certificate_data.is_some();
    if certificate && config.auth_info.token.is_none() && config.auth_info.token_file.is_none() {
        return Err(RemoteError::NoToken(
            "authenticates with a client certificate, which the API server's proxy cannot forward",
        ));
    }
    let layer = config
        .auth_layer()
        .map_err(|e| RemoteError::Credentials(crate::model::chain(&e)))?
        .ok_or(RemoteError::NoToken(
            "has no credentials the plugin can forward",
        ))?;
    let capture = tower::service_fn(|req: http::Request<String>| async move {
        // tower-http's layer wants a response; the header travels in it.
        let header = req.headers().get(http::header::AUTHORIZATION).cloned();
        Ok::<_, tower::BoxError>(http::Response::new(header))
    });
    let header = layer
        .layer(capture)
        .oneshot(http::Request::new(String::new()))
        .await
        .map_err(|e| RemoteError::Credentials(e.to_string()))?;
    header
        .body()
        .as_ref()
        .and_then(|h| h.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string)
        .ok_or(RemoteError::NoToken(
            "authenticates with a user name and password, not a token",
        ))
}

/// The agent's explanation of `namespace/pod` (JSON; `text`: as `observer explain` prints it),
/// asked with the caller's `token` ([`caller_token`]).
pub async fn explain(
    client: &Client,
    token: &str,
    agents: &Agents,
    namespace: &str,
    pod: &str,
    container: Option<&str>,
    text: bool,
) -> Result<String, RemoteError> {
    let target = Api::<Pod>::namespaced(client.clone(), namespace)
        .get(pod)
        .await
        .map_err(|e| {
            RemoteError::or_forbidden(e, "get pods", namespace, |e| {
                RemoteError::Pod(namespace.into(), pod.into(), e)
            })
        })?;
    let node = target
        .spec
        .and_then(|s| s.node_name)
        .ok_or_else(|| RemoteError::NotScheduled(namespace.into(), pod.into()))?;
    let list = Api::<Pod>::namespaced(client.clone(), &agents.namespace)
        .list(
            &ListParams::default()
                .labels(&agents.selector)
                .fields(&format!("spec.nodeName={node}")),
        )
        .await
        .map_err(|e| {
            RemoteError::or_forbidden(e, "list pods", &agents.namespace, |e| {
                RemoteError::Agents(agents.namespace.clone(), e)
            })
        })?;
    let agent = list
        .items
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .find_map(|p| p.metadata.name)
        .ok_or_else(|| RemoteError::NoAgent {
            node: node.clone(),
            selector: agents.selector.clone(),
            namespace: agents.namespace.clone(),
        })?;
    let mut path = format!(
        "/api/v1/namespaces/{}/pods/{agent}:{}/proxy/explain/{namespace}/{pod}",
        agents.namespace, agents.port
    );
    if let Some(c) = container {
        path.push('/');
        path.push_str(c);
    }
    if text {
        path.push_str("?output=text");
    }
    let Ok(forwarded) = http::HeaderValue::from_str(&format!("Bearer {token}")) else {
        return Err(RemoteError::Credentials(
            "the token is not a valid HTTP header value".into(),
        ));
    };
    let mut req = http::Request::get(path)
        .body(Vec::new())
        .expect("a GET with a path is a valid request");
    req.headers_mut().insert(crate::kube::FORWARDED, forwarded);
    client.request_text(req).await.map_err(|e| match e {
        // The API server's own refusals are `Status` objects with their reason; the agent's
        // are its text (which kube wraps without one).
        kube::Error::Api(s) if matches!(s.code, 401 | 403) && s.reason != "Forbidden" => {
            RemoteError::AgentRefused {
                agent,
                node,
                message: s.message.trim().to_string(),
            }
        }
        e => RemoteError::or_forbidden(e, "get pods/proxy", &agents.namespace, |e| {
            RemoteError::Agent(agent, node, e)
        }),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::kube::testkit::api::{self, Reply};

    fn pod(name: &str, node: Option<&str>, phase: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
               "spec": {"nodeName": node, "containers": []}, "status": {"phase": phase}})
    }

    #[tokio::test]
    async fn asks_the_agent_on_the_pods_node_through_the_pod_proxy() {
        let (client, mock) = api::client();
        let log = api::serve(
            mock,
            vec![
                Reply::Json(200, pod("web", Some("node-7"), "Running")),
                Reply::Json(
                    200,
                    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {},
                           "items": [pod("observer-old", Some("node-7"), "Failed"),
                                     pod("observer-x1", Some("node-7"), "Running")]}),
                ),
                Reply::Json(200, json!({"name": "web", "kills": []})),
            ],
        );
        let body = explain(
            &client,
            "tok",
            &Agents::default(),
            "shop",
            "web",
            Some("app"),
            true,
        )
        .await
        .unwrap();
        assert!(body.contains("\"kills\""), "{body}");
        let seen = log.lock().unwrap().clone();
        assert_eq!(seen[0].path, "/api/v1/namespaces/shop/pods/web");
        assert_eq!(seen[1].path, "/api/v1/namespaces/observer-system/pods");
        assert!(
            seen[1]
                .query
                .contains("labelSelector=app.kubernetes.io%2Fname%3Dobserver")
                && seen[1]
                    .query
                    .contains("fieldSelector=spec.nodeName%3Dnode-7"),
            "{}",
            seen[1].query
        );
        assert_eq!(
            seen[2].path,
            "/api/v1/namespaces/observer-system/pods/observer-x1:9891/proxy/explain/shop/web/app"
        );
        assert_eq!(seen[2].query, "output=text");
        assert_eq!(seen[2].forwarded.as_deref(), Some("Bearer tok"));
    }

    #[tokio::test]
    async fn a_node_without_an_agent_is_said_so() {
        let (client, mock) = api::client();
        let _log = api::serve(
            mock,
            vec![
                Reply::Json(200, pod("web", Some("node-7"), "Running")),
                Reply::Json(
                    200,
                    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []}),
                ),
            ],
        );
        let e = explain(
            &client,
            "tok",
            &Agents::default(),
            "shop",
            "web",
            None,
            false,
        )
        .await
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "no running observer agent on node node-7 (pods labelled app.kubernetes.io/name=observer in observer-system)"
        );
        let (client, mock) = api::client();
        let _log = api::serve(mock, vec![Reply::Json(200, pod("web", None, "Pending"))]);
        let e = explain(
            &client,
            "tok",
            &Agents::default(),
            "shop",
            "web",
            None,
            false,
        )
        .await
        .unwrap_err();
        assert_eq!(e.to_string(), "pod shop/web is not scheduled to a node yet");
    }

    #[tokio::test]
    async fn a_refused_proxy_names_the_missing_right() {
        let (client, mock) = api::client();
        let message = "pods \"observer-x1:9891\" is forbidden: User \"alice\" cannot get resource \"pods/proxy\" in API group \"\" in the namespace \"observer-system\"";
        let _log = api::serve(
            mock,
            vec![
                Reply::Json(200, pod("web", Some("node-7"), "Running")),
                Reply::Json(
                    200,
                    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {},
                           "items": [pod("observer-x1", Some("node-7"), "Running")]}),
                ),
                Reply::Json(
                    403,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "message": message, "reason": "Forbidden", "code": 403}),
                ),
            ],
        );
        let e = explain(
            &client,
            "tok",
            &Agents::default(),
            "shop",
            "web",
            None,
            true,
        )
        .await
        .unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("not allowed to get pods/proxy in namespace observer-system (")
                && text.contains(message)
                && text.contains("Role observer-explain"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn the_callers_token_is_resolved_as_kube_would_send_it() {
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        config.auth_info.token = Some("tok-1".to_string().into());
        assert_eq!(caller_token(&config).await.unwrap(), "tok-1");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "tok-from-file").unwrap();
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        config.auth_info.token_file = Some(file.display().to_string());
        assert_eq!(caller_token(&config).await.unwrap(), "tok-from-file");

        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        config.auth_info.client_certificate_data = Some("cert".into());
        let e = caller_token(&config).await.unwrap_err();
        assert!(e.to_string().contains("client certificate"), "{e}");

        let config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        assert!(matches!(
            caller_token(&config).await,
            Err(RemoteError::NoToken(_))
        ));
    }

    /// The agent's own refusal (text, through the proxy) is told as the agent's, not as a
    /// missing pods/proxy right.
    #[tokio::test]
    async fn the_agents_refusal_is_told_as_the_agents() {
        let (client, mock) = api::client();
        let _log = api::serve(
            mock,
            vec![
                Reply::Json(200, pod("web", Some("node-7"), "Running")),
                Reply::Json(
                    200,
                    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {},
                           "items": [pod("observer-x1", Some("node-7"), "Running")]}),
                ),
                Reply::Text(403, "bob may not get pod shop/web\n".into()),
            ],
        );
        let e = explain(
            &client,
            "tok",
            &Agents::default(),
            "shop",
            "web",
            None,
            true,
        )
        .await
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "the agent observer-x1 on node node-7 refused: bob may not get pod shop/web"
        );
    }
}
