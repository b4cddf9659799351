//! A recording stand-in for the Kubernetes API server, kept only for what the real one-node
//! cluster (tests/src/cluster.rs) cannot do on demand: answer 409, 429 or 500, refuse a
//! connection, hang mid-request, answer without end ([`Hostile`]), or count every byte the agent sends with no audit-log delay (the
//! fault suite, the api_path and footprint benches). Everything a real API server can show runs
//! against the real one (tests/tests/cluster.rs). It is a recorder, not an API server: it serves the pods
//! the test gives it (list, get, and a watch that stays open), the discovery documents a client
//! needs to find pods and events, and records every write it receives (method, path, content
//! type, body), answering each with what a server would (the pod, the created event). It applies
//! nothing: what the agent wrote is checked in the record. `kubectl` pointed at it (see
//! [`ApiStandIn::kubeconfig`]) proves its answers are the API's shapes.
use std::{
    convert::Infallible,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use http_body_util::{BodyExt, Full, StreamBody};
use hyper::{
    body::{Bytes, Frame, Incoming},
    server::conn::http1,
    service::service_fn,
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

/// One request the stand-in received.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// Its place in the order of arrival (0, 1, ...).
    pub seq: usize,
    /// What the stand-in answered (0: no answer that ends: held, or [`Hostile`]).
    pub code: u16,
    /// When its headers had arrived.
    pub at: std::time::SystemTime,
    /// When it went on the wire: the kernel's receive timestamp of its first bytes (see
    /// [`crate::wire`]), `None` if the kernel gave none.
    pub wire: Option<std::time::SystemTime>,
    pub method: String,
    /// Path and query.
    pub uri: String,
    pub content_type: String,
    /// `User-Agent`: the fast path's own connections say `observer/<version>`, kube's client
    /// (the status manager) `observer`.
    pub user_agent: String,
    /// `Authorization` as sent (the fast path's token after a refresh).
    pub authorization: String,
    pub body: Value,
}

impl Recorded {
    /// The path without the query (kube adds `?&fieldManager=...` and the like).
    pub fn path(&self) -> &str {
        self.uri.split('?').next().unwrap_or_default()
    }
}

#[derive(Default)]
struct State {
    pods: Vec<Value>,
    recorded: Vec<Recorded>,
    /// A status code to answer writes with, for fault tests (None: success).
    fail_writes: Option<u16>,
    /// A status code to answer every request with (401, 403: credentials refused or forbidden).
    refuse: Option<u16>,
    /// While true, writes are recorded (code 0) and held unanswered: a hung API server. Released,
    /// they are answered 504.
    hang: Option<tokio::sync::watch::Receiver<bool>>,
    /// How the fast path's own writes are answered, when not as a server would.
    hostile: Option<Hostile>,
    hostile_counts: Arc<HostileCounts>,
}

/// An answer to the fast path's writes (its own connections: `User-Agent: observer/…`) that a
/// client must not read without end: a broken server, or something on the way. The status
/// manager's writes are answered as the API would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hostile {
    /// 200, chunked, a body that never ends.
    EndlessChunked,
    /// 200 with a `Content-Length` of 1 TiB, and a body to match.
    HugeContentLength,
    /// A head of 4 MiB (one header), then a body that never ends.
    HugeHead,
}

/// What the hostile answers came to.
#[derive(Debug, Default)]
struct HostileCounts {
    /// Body bytes handed to the connection.
    sent: std::sync::atomic::AtomicU64,
    /// Hostile answers whose connection ended (the client hung up: nothing else ends them).
    ended: std::sync::atomic::AtomicU64,
}

/// Counts a hostile answer's end when the connection drops its body.
struct EndOf(Arc<HostileCounts>);

impl Drop for EndOf {
    fn drop(&mut self) {
        self.0
            .ended
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The hostile answer of `kind`: its body runs until the client hangs up.
fn hostile_answer(kind: Hostile, counts: Arc<HostileCounts>) -> Response<Body> {
    let piece = Bytes::from(vec![b' '; 16 << 10]);
    let end = EndOf(Arc::clone(&counts));
    let endless = futures::stream::repeat_with(move || {
        let _ = &end;
        counts
            .sent
            .fetch_add(piece.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok::<_, Infallible>(Frame::data(piece.clone()))
    });
    let mut r = Response::new(StreamBody::new(endless).boxed());
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    match kind {
        Hostile::EndlessChunked => {}
        Hostile::HugeContentLength => {
            h.insert(
                hyper::header::CONTENT_LENGTH,
                hyper::header::HeaderValue::from(1u64 << 40),
            );
        }
        Hostile::HugeHead => {
            let pad = Bytes::from(vec![b'a'; 4 << 20]);
            if let Ok(v) = hyper::header::HeaderValue::from_maybe_shared(pad) {
                h.insert("x-stand-in-padding", v);
            }
        }
    }
    r
}

impl State {
    /// Keeps `r` in the order of arrival (its `seq` set here).
    fn record(&mut self, mut r: Recorded) {
        r.seq = self.recorded.len();
        self.recorded.push(r);
    }
}

pub struct ApiStandIn {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
    dir: tempfile::TempDir,
    hang: tokio::sync::watch::Sender<bool>,
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn full(v: &Value) -> Body {
    Full::new(Bytes::from(v.to_string())).boxed()
}

fn respond(code: StatusCode, v: &Value) -> Response<Body> {
    let mut r = Response::new(full(v));
    *r.status_mut() = code;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
           "reason": reason, "message": message})
}

fn discovery(path: &str) -> Option<Value> {
    let resource = |name: &str, kind: &str, verbs: &[&str]| json!({"name": name, "singularName": "", "namespaced": true, "kind": kind, "verbs": verbs});
    Some(match path {
        "/api" => json!({"kind": "APIVersions", "versions": ["v1"],
                          "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
        "/apis" => json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [{
            "name": "events.k8s.io",
            "versions": [{"groupVersion": "events.k8s.io/v1", "version": "v1"}],
            "preferredVersion": {"groupVersion": "events.k8s.io/v1", "version": "v1"}}]}),
        "/api/v1" => json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            resource("pods", "Pod", &["get", "list", "watch"]),
            resource("pods/status", "Pod", &["get", "patch"])]}),
        "/apis/events.k8s.io/v1" => {
            json!({"kind": "APIResourceList", "groupVersion": "events.k8s.io/v1",
            "resources": [resource("events", "Event", &["create", "patch", "list"])]})
        }
        "/version" => {
            json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-observer-stand-in"})
        }
        _ => return None,
    })
}

fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

async fn handle(
    state: Arc<Mutex<State>>,
    wire: Option<std::time::SystemTime>,
    req: Request<Incoming>,
) -> Response<Body> {
    let at = std::time::SystemTime::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let uri = req.uri().to_string();
    let header = |name| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let content_type = header(hyper::header::CONTENT_TYPE);
    let user_agent = header(hyper::header::USER_AGENT);
    let authorization = header(hyper::header::AUTHORIZATION);
    let bytes = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    // What a write or a refusal leaves in the record (its `seq` is set when kept).
    let recorded = |code, body| Recorded {
        seq: 0,
        code,
        at,
        wire,
        method: method.to_string(),
        uri: uri.clone(),
        content_type: content_type.clone(),
        user_agent: user_agent.clone(),
        authorization: authorization.clone(),
        body,
    };
    let refuse = state.lock().expect("state").refuse;
    if let Some(code) = refuse {
        let reason = StatusCode::from_u16(code)
            .ok()
            .and_then(|c| c.canonical_reason())
            .unwrap_or("Refused");
        state
            .lock()
            .expect("state")
            .record(recorded(code, Value::Null));
        return respond(
            StatusCode::from_u16(code).unwrap_or(StatusCode::FORBIDDEN),
            &status(code, reason, "refused by the stand-in"),
        );
    }
    if method == Method::GET {
        if let Some(doc) = discovery(&path) {
            return respond(StatusCode::OK, &doc);
        }
    }
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.clone(), segs.as_slice()) {
        // The watch stays open and quiet: the test's pods do not change on their own.
        (Method::GET, ["api", "v1", "pods"] | ["api", "v1", "namespaces", _, "pods"])
            if query_param(&query, "watch").is_some_and(|w| w == "true" || w == "1") =>
        {
            let (_tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
            // Dropping `_tx` would end the stream; hold it for as long as the connection lives.
            let stream = futures_stream(rx, _tx);
            let mut r = Response::new(StreamBody::new(stream).boxed());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            r
        }
        (Method::GET, ["api", "v1", "pods"])
        | (Method::GET, ["api", "v1", "namespaces", _, "pods"]) => {
            let ns = segs.get(3).copied();
            let node = query_param(&query, "fieldSelector")
                .map(|f| f.replace("%3D", "=").replace("%3d", "="))
                .and_then(|f| f.strip_prefix("spec.nodeName=").map(str::to_string));
            let st = state.lock().expect("state");
            let items: Vec<Value> = st
                .pods
                .iter()
                .filter(|p| ns.is_none_or(|n| p["metadata"]["namespace"] == n))
                .filter(|p| {
                    node.as_ref()
                        .is_none_or(|n| p["spec"]["nodeName"] == n.as_str())
                })
                .cloned()
                .collect();
            respond(
                StatusCode::OK,
                &json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}),
            )
        }
        (
            Method::GET,
            ["api", "v1", "namespaces", ns, "pods", name]
            | ["api", "v1", "namespaces", ns, "pods", name, "status"],
        ) => {
            let st = state.lock().expect("state");
            match st
                .pods
                .iter()
                .find(|p| p["metadata"]["namespace"] == *ns && p["metadata"]["name"] == *name)
            {
                Some(p) => respond(StatusCode::OK, p),
                None => respond(
                    StatusCode::NOT_FOUND,
                    &status(404, "NotFound", "pod not found"),
                ),
            }
        }
        (
            Method::GET,
            ["apis", "events.k8s.io", "v1", "events"]
            | ["apis", "events.k8s.io", "v1", "namespaces", _, "events"],
        ) => {
            // The events it recorded, listed: what `kubectl get events` reads back.
            let st = state.lock().expect("state");
            let items: Vec<Value> = st
                .recorded
                .iter()
                .filter(|r| r.method == "POST" && r.uri.contains("/events"))
                .map(|r| r.body.clone())
                .collect();
            respond(
                StatusCode::OK,
                &json!({"kind": "EventList", "apiVersion": "events.k8s.io/v1", "metadata": {"resourceVersion": "1"}, "items": items}),
            )
        }
        (Method::PATCH | Method::POST | Method::PUT, _) => {
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let hostile = {
                let st = state.lock().expect("state");
                st.hostile
                    .filter(|_| user_agent.starts_with("observer/"))
                    .map(|h| (h, Arc::clone(&st.hostile_counts)))
            };
            if let Some((kind, counts)) = hostile {
                state.lock().expect("state").record(recorded(0, body));
                return hostile_answer(kind, counts);
            }
            let hang = state.lock().expect("state").hang.clone();
            if let Some(mut hang) = hang.filter(|h| *h.borrow()) {
                state.lock().expect("state").record(recorded(0, body));
                let _ = hang.wait_for(|held| !*held).await;
                return respond(
                    StatusCode::GATEWAY_TIMEOUT,
                    &status(504, "Timeout", "the stand-in held this write"),
                );
            }
            let mut st = state.lock().expect("state");
            let code = st.fail_writes.unwrap_or(200);
            st.record(recorded(code, body.clone()));
            if let Some(code) = st.fail_writes {
                return respond(
                    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                    &status(
                        code,
                        "InternalError",
                        "the stand-in was told to fail writes",
                    ),
                );
            }
            match segs.as_slice() {
                ["api", "v1", "namespaces", ns, "pods", name, "status"] => {
                    match st.pods.iter_mut().find(|p| {
                        p["metadata"]["namespace"] == *ns && p["metadata"]["name"] == *name
                    }) {
                        Some(p) => {
                            // Remembered, so that a restarted agent lists what it wrote before.
                            remember_conditions(p, &body);
                            respond(StatusCode::OK, p)
                        }
                        None => respond(
                            StatusCode::NOT_FOUND,
                            &status(404, "NotFound", "pod not found"),
                        ),
                    }
                }
                ["apis", "events.k8s.io", "v1", "namespaces", ..] => {
                    let mut ev = body;
                    let n = st.recorded.len();
                    if ev["metadata"]["name"].is_null() {
                        let prefix = ev["metadata"]["generateName"]
                            .as_str()
                            .unwrap_or("event.")
                            .to_string();
                        ev["metadata"]["name"] = json!(format!("{prefix}{n}"));
                    }
                    ev["metadata"]["uid"] = json!(format!("00000000-0000-4000-8000-{n:012}"));
                    ev["metadata"]["resourceVersion"] = json!(n.to_string());
                    respond(
                        if method == Method::POST {
                            StatusCode::CREATED
                        } else {
                            StatusCode::OK
                        },
                        &ev,
                    )
                }
                // A pod's report (server-side apply): taken as the API would store it.
                ["apis", "observer.dev", "v1alpha1", "namespaces", _, "podreports", _] => {
                    respond(StatusCode::OK, &body)
                }
                _ => respond(
                    StatusCode::NOT_FOUND,
                    &status(404, "NotFound", "the stand-in does not serve this"),
                ),
            }
        }
        _ => respond(
            StatusCode::NOT_FOUND,
            &status(404, "NotFound", "the stand-in does not serve this"),
        ),
    }
}

/// Keeps the conditions of a status patch in the served pod, merged by `type` as the strategic
/// merge patch of a map list does: fields of one element merged, `$patch: delete` removes one. Nothing else of the status is
/// kept: the stand-in records, it does not implement the API.
fn remember_conditions(pod: &mut Value, patch: &Value) {
    let Some(new) = patch["status"]["conditions"].as_array() else {
        return;
    };
    let mut kept: Vec<Value> = pod["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for c in new {
        let at = kept.iter().position(|k| k["type"] == c["type"]);
        match (at, c.as_object()) {
            (Some(i), _) if c["$patch"] == "delete" => {
                kept.remove(i);
            }
            // An element of the same type takes the patch's fields and keeps its others (a
            // patch leaves out a `lastTransitionTime` the API already has).
            (Some(i), Some(fields)) => {
                if let Some(k) = kept[i].as_object_mut() {
                    k.extend(fields.clone());
                }
            }
            (None, _) if c["$patch"] == "delete" => {}
            (None, _) => kept.push(c.clone()),
            (Some(i), None) => kept[i] = c.clone(),
        }
    }
    pod["status"]["conditions"] = Value::Array(kept);
    let rv: u64 = pod["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    pod["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
}

/// A body stream that ends only when the connection does (the sender is kept inside it).
fn futures_stream(
    rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
    tx: tokio::sync::mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
) -> impl futures::Stream<Item = Result<Frame<Bytes>, Infallible>> {
    futures::stream::unfold((rx, tx), |(mut rx, tx)| async move {
        rx.recv().await.map(|f| (f, (rx, tx)))
    })
}

impl ApiStandIn {
    /// Serves on a free port of 127.0.0.1.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (hang, held) = tokio::sync::watch::channel(false);
        let state = Arc::new(Mutex::new(State {
            hang: Some(held),
            ..State::default()
        }));
        let s = Arc::clone(&state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let s = Arc::clone(&s);
                let Ok((stream, clock)) = crate::wire::WireStamped::new(stream) else {
                    continue;
                };
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let s = Arc::clone(&s);
                        let wire = clock.take();
                        async move { Ok::<_, Infallible>(handle(s, wire, req).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(Self {
            addr,
            state,
            task,
            dir: tempfile::tempdir()?,
            hang,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig for this stand-in (plain HTTP, no credentials), for the agent and kubectl.
    pub fn kubeconfig(&self) -> anyhow::Result<PathBuf> {
        let path = self.dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: stand-in\n  cluster:\n    server: {}\ncontexts:\n- name: stand-in\n  context:\n    cluster: stand-in\n    user: agent\nusers:\n- name: agent\n  user: {{}}\ncurrent-context: stand-in\n",
                self.url()
            ),
        )?;
        Ok(path)
    }

    /// Rewrites [`Self::kubeconfig`]'s file in place with a bearer token read from `token_file`
    /// (a credential rotated on disk under a running agent).
    pub fn kubeconfig_with_token_file(&self, token_file: &Path) -> anyhow::Result<PathBuf> {
        let path = self.dir.path().join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: stand-in\n  cluster:\n    server: {}\ncontexts:\n- name: stand-in\n  context:\n    cluster: stand-in\n    user: agent\nusers:\n- name: agent\n  user:\n    tokenFile: {}\ncurrent-context: stand-in\n",
            self.url(),
            token_file.display()
        );
        // Replaced as a whole, as a rotation does: never seen half written.
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    /// Adds a pod (an API object: metadata, spec, status).
    pub fn add_pod(&self, pod: Value) {
        self.state.lock().expect("state").pods.push(pod);
    }

    /// Adds `spec` as the API has it: bound to `node`, with its containers `(name, memory
    /// limit)` and the readiness gate. The stand-in's watch sends nothing: declare a pod before
    /// the agent lists.
    pub fn declare(
        &self,
        spec: &crate::PodSpec,
        node: &str,
        containers: &[(&str, Option<&str>)],
        readiness_gate: Option<&str>,
    ) {
        self.add_pod(pod_object(
            &spec.name,
            &spec.namespace,
            &spec.uid,
            node,
            containers,
            readiness_gate,
        ));
    }

    /// Answer every write with `code` from now on (`None`: success again).
    pub fn fail_writes(&self, code: Option<u16>) {
        self.state.lock().expect("state").fail_writes = code;
    }

    /// Hold every write unanswered from now on, as a hung API server does (`false`: answer the
    /// held ones 504, and serve again).
    pub fn hang_writes(&self, on: bool) {
        self.hang.send_replace(on);
    }

    /// Answer every request with `code` from now on (401: bad credentials, 403: forbidden;
    /// `None`: serve again).
    pub fn refuse(&self, code: Option<u16>) {
        self.state.lock().expect("state").refuse = code;
    }

    /// Answer the fast path's own writes with `kind` from now on (`None`: as the API would).
    pub fn hostile_fast_writes(&self, kind: Option<Hostile>) {
        self.state.lock().expect("state").hostile = kind;
    }

    /// Hostile answers whose connection the client hung up, and the body bytes handed to
    /// their connections by then (the socket's buffers hold some of them).
    pub fn hostile_ended(&self) -> (u64, u64) {
        let st = self.state.lock().expect("state");
        let c = &st.hostile_counts;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        (load(&c.ended), load(&c.sent))
    }

    /// The pod as the stand-in serves it now (with the conditions written to it).
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        self.state
            .lock()
            .expect("state")
            .pods
            .iter()
            .find(|p| p["metadata"]["namespace"] == namespace && p["metadata"]["name"] == name)
            .cloned()
    }

    pub fn recorded(&self) -> Vec<Recorded> {
        self.state.lock().expect("state").recorded.clone()
    }

    /// Waits for a recorded request that satisfies `pred`.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(&Recorded) -> bool,
    ) -> Option<Recorded> {
        crate::poll_until_async(timeout, || self.recorded().into_iter().find(|r| pred(r))).await
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for ApiStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A test's pod as the API has it, bound to `node`.
pub fn pod_object(
    name: &str,
    namespace: &str,
    uid: &str,
    node: &str,
    containers: &[(&str, Option<&str>)],
    readiness_gate: Option<&str>,
) -> Value {
    let cs: Vec<Value> = containers
        .iter()
        .map(|(n, limit)| {
            let mut c = json!({"name": n, "image": "localhost/observer/busybox:latest"});
            if let Some(l) = limit {
                c["resources"] = json!({"limits": {"memory": l}});
            }
            c
        })
        .collect();
    let mut spec = json!({"nodeName": node, "containers": cs, "restartPolicy": "Always"});
    if let Some(g) = readiness_gate {
        spec["readinessGates"] = json!([{"conditionType": g}]);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "1",
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": spec,
        "status": {"phase": "Running"}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_patch_merges_into_the_served_element_as_the_api_does() {
        let mut pod = json!({"metadata": {"resourceVersion": "4"}, "status": {"conditions": [
            {"type": "A", "status": "False", "reason": "Down", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "B", "status": "True"},
        ]}});
        // Same second as the False: the patch leaves the transition time out.
        remember_conditions(
            &mut pod,
            &json!({"status": {"conditions": [
                {"type": "A", "status": "True", "reason": "Up"},
                {"type": "B", "$patch": "delete"},
                {"type": "C", "status": "True"},
            ]}}),
        );
        assert_eq!(
            pod["status"]["conditions"],
            json!([
                {"type": "A", "status": "True", "reason": "Up", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "C", "status": "True"},
            ])
        );
        assert_eq!(pod["metadata"]["resourceVersion"], "5");
    }

    /// Each hostile answer is what it says on the wire, to the fast path's writes only; its
    /// end is counted once the client hangs up.
    #[tokio::test]
    async fn hostile_answers_are_what_they_say_to_the_fast_path_only() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let api = ApiStandIn::start().await.unwrap();
        let patch = |agent: &str| {
            format!("PATCH /api/v1/namespaces/default/pods/p/status HTTP/1.1\r\nHost: x\r\nUser-Agent: {agent}\r\nContent-Length: 2\r\n\r\n{{}}")
        };
        // The head, as far as 64 KiB of it.
        let head = |agent: String| {
            let addr = api.addr;
            async move {
                let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
                c.write_all(agent.as_bytes()).await.unwrap();
                let mut got = Vec::new();
                let mut buf = [0u8; 8192];
                while got.len() < 64 << 10 && !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = c.read(&mut buf).await.unwrap();
                    assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
                    got.extend_from_slice(&buf[..n]);
                }
                String::from_utf8_lossy(&got).to_ascii_lowercase()
            }
        };
        for (kind, says) in [
            (Hostile::EndlessChunked, "transfer-encoding: chunked\r\n"),
            (
                Hostile::HugeContentLength,
                "content-length: 1099511627776\r\n",
            ),
            (Hostile::HugeHead, "x-stand-in-padding: aaaaaaaa"),
        ] {
            api.hostile_fast_writes(Some(kind));
            let (ended, _) = api.hostile_ended();
            let h = head(patch("observer/0.1.0")).await;
            assert!(
                h.starts_with("http/1.1 200 ok\r\n") && h.contains(says),
                "{kind:?}: {h:.300}"
            );
            // The connection is dropped with the head read: the answer ends.
            let over = crate::poll_until_async(Duration::from_secs(10), || {
                (api.hostile_ended().0 > ended).then_some(())
            })
            .await;
            assert!(over.is_some(), "{kind:?}: its end was not counted");
            // The status manager's write is answered as the API would (no pod: 404).
            let h = head(patch("observer")).await;
            assert!(
                h.starts_with("http/1.1 404 not found\r\n"),
                "{kind:?}: {h:.300}"
            );
        }
        assert!(api.recorded().iter().filter(|r| r.code == 0).count() == 3);
    }
}
