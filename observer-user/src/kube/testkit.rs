//! Builders of API pods for the tests, and an API server stand-in for a kube `Client`; the
//! reconciler's views come from [`crate::reconcile::testkit`], re-exported here.

use k8s_openapi::api::core::v1::{
    Container, Pod, PodReadinessGate, PodSpec, PodStatus, Probe, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub(crate) use crate::reconcile::testkit::*;

pub(crate) fn container(name: &str) -> Container {
    Container {
        name: name.to_string(),
        image: Some(format!("registry.local/{name}:1")),
        ..Default::default()
    }
}

pub(crate) fn with_memory_limit(mut c: Container, limit: &str) -> Container {
    c.resources = Some(ResourceRequirements {
        limits: Some([("memory".to_string(), Quantity(limit.to_string()))].into()),
        ..Default::default()
    });
    c
}

pub(crate) fn with_readiness_probe(mut c: Container) -> Container {
    c.readiness_probe = Some(Probe::default());
    c
}

/// A native sidecar: an init container with `restartPolicy: Always`.
pub(crate) fn sidecar(name: &str) -> Container {
    Container {
        restart_policy: Some("Always".into()),
        ..container(name)
    }
}

pub(crate) fn spec(
    restart_policy: &str,
    init: Vec<Container>,
    containers: Vec<Container>,
) -> PodSpec {
    PodSpec {
        node_name: Some("node-1".into()),
        restart_policy: Some(restart_policy.to_string()),
        init_containers: (!init.is_empty()).then_some(init),
        containers,
        ..Default::default()
    }
}

pub(crate) fn with_gate(mut s: PodSpec, condition_type: &str) -> PodSpec {
    s.readiness_gates = Some(vec![PodReadinessGate {
        condition_type: condition_type.to_string(),
    }]);
    s
}

pub(crate) fn pod(spec: PodSpec, status: Option<PodStatus>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: Some(NS.into()),
            name: Some(NAME.into()),
            uid: Some(UID.into()),
            resource_version: Some("100".into()),
            ..Default::default()
        },
        spec: Some(spec),
        status,
    }
}

/// The API server side of kube's mock service (tower-test), in the ApiServerVerifier pattern:
/// a test's scenario answers each request the client sends, and records it.
pub(crate) mod api {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use ::kube::client::Body;
    use ::kube::Client;
    use http::{Request, Response, StatusCode};
    use http_body_util::BodyExt;
    use serde_json::{json, Value};
    use tokio::time::Instant;

    pub(crate) type ApiHandle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    /// A request as the server received it.
    #[derive(Clone, Debug)]
    pub(crate) struct Seen {
        pub method: http::Method,
        pub path: String,
        pub query: String,
        pub content_type: String,
        pub body: Value,
        pub at: Instant,
    }

    pub(crate) fn client() -> (Client, ApiHandle) {
        let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        (Client::new(svc, "default"), handle)
    }

    pub(crate) async fn read(req: Request<Body>) -> Seen {
        let (parts, body) = req.into_parts();
        let bytes = body.collect().await.expect("request body").to_bytes();
        Seen {
            method: parts.method,
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or("").to_string(),
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string(),
            body: if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes).expect("JSON body")
            },
            at: Instant::now(),
        }
    }

    /// What the scenario answers to one request.
    #[derive(Clone, Debug)]
    pub(crate) enum Reply {
        /// Status code, JSON body.
        Json(u16, Value),
        /// 429 with `Retry-After: <secs>`.
        TooMany(u64),
        /// Never answers (the request hangs until the client gives up).
        Hang,
        /// 200 (201 for a POST) with the request's own body, as create and patch answer.
        Echo,
    }

    /// Events are echoed back (the Recorder parses them); anything else gets a pod.
    fn default_reply(s: &Seen) -> Reply {
        if s.path.contains("/events") {
            Reply::Echo
        } else {
            ok_pod()
        }
    }

    pub(crate) fn ok_pod() -> Reply {
        Reply::Json(
            200,
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}}),
        )
    }

    pub(crate) fn status(code: u16, reason: &str) -> Reply {
        Reply::Json(
            code,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                   "message": format!("{reason} (test)"), "reason": reason, "code": code}),
        )
    }

    pub(crate) fn response(reply: &Reply) -> Option<Response<Body>> {
        match reply {
            Reply::Json(code, v) => Some(
                Response::builder()
                    .status(StatusCode::from_u16(*code).expect("status code"))
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(Body::from(serde_json::to_vec(v).expect("json")))
                    .expect("response"),
            ),
            Reply::TooMany(secs) => Some(
                Response::builder()
                    .status(StatusCode::TOO_MANY_REQUESTS)
                    .header(http::header::RETRY_AFTER, secs.to_string())
                    .body(Body::from(
                        serde_json::to_vec(&json!({"kind": "Status", "code": 429,
                            "message": "too many requests", "reason": "TooManyRequests"}))
                        .expect("json"),
                    ))
                    .expect("response"),
            ),
            Reply::Hang | Reply::Echo => None,
        }
    }

    fn echo(seen: &Seen) -> Response<Body> {
        let code = if seen.method == http::Method::POST {
            201
        } else {
            200
        };
        Response::builder()
            .status(code)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(serde_json::to_vec(&seen.body).expect("json")))
            .expect("response")
    }

    /// Answers requests in order with `replies` (then 200 with a pod), recording each. Hung
    /// requests are held until the scenario ends.
    pub(crate) fn serve(mut handle: ApiHandle, replies: Vec<Reply>) -> Arc<Mutex<Vec<Seen>>> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        tokio::spawn(async move {
            let mut replies = replies.into_iter();
            let mut held = Vec::new();
            while let Some((req, send)) = handle.next_request().await {
                let s = read(req).await;
                log.lock().expect("log").push(s.clone());
                let reply = replies.next().unwrap_or_else(|| default_reply(&s));
                match (&reply, response(&reply)) {
                    (Reply::Echo, _) => send.send_response(echo(&s)),
                    (_, Some(r)) => send.send_response(r),
                    (_, None) => held.push(send),
                }
            }
        });
        seen
    }

    /// Waits (on paused time: advances) until `n` requests were seen, at most `limit`.
    pub(crate) async fn wait_for(
        seen: &Arc<Mutex<Vec<Seen>>>,
        n: usize,
        limit: Duration,
    ) -> Vec<Seen> {
        let deadline = Instant::now() + limit;
        loop {
            let s = seen.lock().expect("log").clone();
            if s.len() >= n || Instant::now() >= deadline {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A stand-in API server for the manager: lists this node's pods and holds the watch open,
/// answers status patches in order from a script (then 200), echoes Events; records everything.
pub(crate) mod server {
    use std::sync::{Arc, Mutex};

    use k8s_openapi::api::core::v1::Pod;
    use serde_json::{json, Value};

    use super::api::{ok_pod, read, response, ApiHandle, Reply, Seen};

    pub(crate) type Log = Arc<Mutex<Vec<Seen>>>;

    pub(crate) fn serve(handle: ApiHandle, pods: Vec<Pod>, patches: Vec<Reply>) -> Log {
        serve_holding(handle, pods, patches, Vec::new())
    }

    /// [`serve`], holding `events` (as an earlier agent left them) beside those created: a list
    /// of Events answers them all (its field selector is not applied); an item
    /// `{"refuse": <code>}` makes every list answer that code instead (the RBAC of an older
    /// release, an overloaded server).
    pub(crate) fn serve_holding(
        mut handle: ApiHandle,
        pods: Vec<Pod>,
        patches: Vec<Reply>,
        mut events: Vec<Value>,
    ) -> Log {
        let seen: Log = Arc::default();
        let log = Arc::clone(&seen);
        tokio::spawn(async move {
            let mut patches = patches.into_iter();
            let mut held = Vec::new();
            while let Some((req, send)) = handle.next_request().await {
                let s = read(req).await;
                log.lock().expect("log").push(s.clone());
                let refused = events.iter().find_map(|e| e.get("refuse")?.as_u64());
                let reply = if s.path.contains("/events") && s.method == http::Method::GET {
                    match refused {
                        Some(code) => Reply::Json(
                            code as u16,
                            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                   "reason": "Forbidden", "code": code}),
                        ),
                        None => Reply::Json(
                            200,
                            json!({"apiVersion": "events.k8s.io/v1", "kind": "EventList",
                                   "metadata": {"resourceVersion": "1"}, "items": events}),
                        ),
                    }
                } else if s.path.contains("/events") {
                    let code = if s.method == http::Method::POST {
                        events.push(s.body.clone());
                        201
                    } else {
                        200
                    };
                    Reply::Json(code, s.body.clone())
                } else if s.method == http::Method::GET && s.query.contains("watch=true") {
                    Reply::Hang
                } else if s.method == http::Method::GET {
                    Reply::Json(
                        200,
                        json!({"apiVersion": "v1", "kind": "PodList",
                               "metadata": {"resourceVersion": "1"}, "items": pods}),
                    )
                } else {
                    patches.next().unwrap_or_else(ok_pod)
                };
                match response(&reply) {
                    Some(r) => send.send_response(r),
                    None => held.push(send),
                }
            }
        });
        seen
    }

    pub(crate) fn patches(log: &Log) -> Vec<Seen> {
        log.lock()
            .expect("log")
            .iter()
            .filter(|s| s.method == http::Method::PATCH && s.path.ends_with("/status"))
            .cloned()
            .collect()
    }

    /// The Events written (created or patched; not the lists).
    pub(crate) fn events(log: &Log) -> Vec<Seen> {
        log.lock()
            .expect("log")
            .iter()
            .filter(|s| s.path.contains("/events") && s.method != http::Method::GET)
            .cloned()
            .collect()
    }
}
