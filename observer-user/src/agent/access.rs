//! Who may read what the endpoint serves. An explanation holds a pod's processes, exits, memory
//! and cgroup paths, and whether a pod exists at all: `/explain/<namespace>/<pod>` answers only a
//! caller that may `get` that pod, as kubelet answers its own endpoints: the caller's bearer
//! token is checked with a TokenReview, its right with a SubjectAccessReview, both by the API
//! server, both cached as kubelet caches them (2 min for a token; 5 min allowed, 30 s denied).
//! `/metrics` can be held to the same check (`get` on the non-resource path `/metrics`, as
//! kube-rbac-proxy does); `/healthz` and `/readyz` stay open (kubelet's probes carry no token,
//! and they tell nothing about any pod).
//!
//! The token comes in `Authorization: Bearer`, or, through the API server's pod proxy (which
//! authenticates the caller and then removes `Authorization`), in [`FORWARDED`]: the kubectl
//! plugin sends its user's token there. A refusal says the same whether or not the pod exists.
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec, UserInfo},
    authorization::v1::{
        NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    },
};
use kube::{api::PostParams, Api, Client};
use prometheus_client::encoding::DescriptorEncoder;
use sha2::{Digest, Sha256};

pub use crate::kube::FORWARDED;

/// Who may read `/explain`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ExplainAccess {
    /// Callers whose token the API server accepts and who may `get` the pod.
    #[default]
    TokenReview,
    /// Anyone who reaches the port (a node-local debugging setup; never on a shared network).
    None,
}

/// Who may read `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricsAccess {
    /// Anyone who reaches the port, as Prometheus scrapes by default (the counts name pods).
    #[default]
    Open,
    /// Callers who may `get` the non-resource URL `/metrics` (bind `system:monitoring` or a
    /// role with `nonResourceURLs: ["/metrics"]`).
    TokenReview,
}

/// Why a request is not answered; the HTTP code is the variant's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denied {
    /// 401: no token, or one the API server does not accept.
    Unauthenticated(String),
    /// 403: a valid token whose user lacks the right.
    Forbidden(String),
    /// 503: the check could not be made (no API, the API down or slow).
    Unavailable(String),
}

impl Denied {
    pub fn code(&self) -> u16 {
        match self {
            Self::Unauthenticated(_) => 401,
            Self::Forbidden(_) => 403,
            Self::Unavailable(_) => 503,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Self::Unauthenticated(m) | Self::Forbidden(m) | Self::Unavailable(m) => m,
        }
    }
}

/// How long an answer of the API server is believed: kubelet's defaults
/// (`authentication.webhook.cacheTTL`, `authorization.webhook.cacheAuthorizedTTL` and
/// `cacheUnauthorizedTTL`), plus a short memory of refused tokens so that a client retrying a bad
/// token costs the API server one review every 10 s.
const TOKEN_ACCEPTED: Duration = Duration::from_secs(120);
const TOKEN_REFUSED: Duration = Duration::from_secs(10);
const ALLOWED: Duration = Duration::from_secs(300);
const DENIED: Duration = Duration::from_secs(30);
/// Reviews in flight at once: the endpoint takes 256 connections, the API server need not take
/// 256 reviews from one agent.
const IN_FLIGHT: usize = 4;
/// One review's bound: an API server that hangs is answered with 503, not a held connection.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// Entries per cache; full of live entries, a cache starts over (the cost is a review each).
const CACHE_ENTRIES: usize = 4096;

/// Answers keyed by a digest (a token is never kept, only its SHA-256), each until its deadline.
struct Cache<V> {
    entries: HashMap<[u8; 32], (Instant, V)>,
}

impl<V: Clone> Cache<V> {
    fn new() -> Self {
        Self {
            entries: HashMap::new(),
        }
    }

    fn get(&self, key: &[u8; 32], now: Instant) -> Option<V> {
        self.entries
            .get(key)
            .filter(|(until, _)| *until > now)
            .map(|(_, v)| v.clone())
    }

    fn put(&mut self, key: [u8; 32], v: V, ttl: Duration, now: Instant) {
        if self.entries.len() >= CACHE_ENTRIES {
            self.entries.retain(|_, (until, _)| *until > now);
            if self.entries.len() >= CACHE_ENTRIES {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (now + ttl, v));
    }
}

fn digest(parts: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        // A separator no part can hold: ("ab","c") and ("a","bc") differ.
        h.update([0]);
    }
    h.finalize().into()
}

/// The caller the API server vouched for.
#[derive(Clone, Debug)]
struct Caller(UserInfo);

impl Caller {
    fn name(&self) -> &str {
        self.0.username.as_deref().unwrap_or("?")
    }

    /// Everything the SubjectAccessReview is about: user, uid, groups and extra, in an order of
    /// their own.
    fn key_parts(&self) -> Vec<String> {
        let mut parts = vec![
            self.name().to_string(),
            self.0.uid.clone().unwrap_or_default(),
        ];
        let mut groups = self.0.groups.clone().unwrap_or_default();
        groups.sort();
        parts.push(groups.join("\u{1}"));
        for (k, v) in self.0.extra.iter().flatten() {
            parts.push(format!("{k}\u{1}{}", v.join("\u{1}")));
        }
        parts
    }
}

/// What a request asks to read.
#[derive(Clone, Debug)]
enum Want<'a> {
    Pod { namespace: &'a str, name: &'a str },
    Path(&'a str),
}

impl Want<'_> {
    fn describe(&self) -> String {
        match self {
            Want::Pod { namespace, name } => format!("get pod {namespace}/{name}"),
            Want::Path(p) => format!("get {p}"),
        }
    }
}

/// Counts of the endpoint's access checks, by endpoint and result.
#[derive(Default)]
struct Counts([[AtomicU64; 4]; 2]);

const RESULTS: [&str; 4] = ["allowed", "unauthenticated", "forbidden", "unavailable"];

/// The endpoint's access checks: its settings, the API client the reviews go through, and the
/// caches of their answers.
pub struct Gate {
    explain: ExplainAccess,
    metrics: MetricsAccess,
    /// `None`: the agent does not reach the API (`--status-mode off`), so nothing can be checked.
    client: Option<Client>,
    tokens: Mutex<Cache<Result<Caller, String>>>,
    rights: Mutex<Cache<bool>>,
    in_flight: tokio::sync::Semaphore,
    counts: Counts,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("explain", &self.explain)
            .field("metrics", &self.metrics)
            .field("api", &self.client.is_some())
            .finish()
    }
}

impl Gate {
    pub fn new(explain: ExplainAccess, metrics: MetricsAccess, client: Option<Client>) -> Self {
        Self {
            explain,
            metrics,
            client,
            tokens: Mutex::new(Cache::new()),
            rights: Mutex::new(Cache::new()),
            in_flight: tokio::sync::Semaphore::new(IN_FLIGHT),
            counts: Counts::default(),
        }
    }

    /// Everything open: tests of what the endpoint serves, and `--explain-access none`.
    pub fn open() -> Self {
        Self::new(ExplainAccess::None, MetricsAccess::Open, None)
    }

    /// What an operator must know at start: a check that cannot be made without the API.
    pub fn warn_if_unusable(&self) {
        if self.client.is_some() {
            return;
        }
        if self.explain == ExplainAccess::TokenReview {
            tracing::warn!("/explain answers 503: its access check (--explain-access token-review) asks the Kubernetes API, which this agent does not reach (--status-mode off); set --explain-access none (OBSERVER_EXPLAIN_ACCESS) to serve it to anyone who reaches --listen, on a node-local address only");
        }
        if self.metrics == MetricsAccess::TokenReview {
            tracing::warn!("/metrics answers 503: its access check (--metrics-access token-review) asks the Kubernetes API, which this agent does not reach (--status-mode off)");
        }
    }

    /// May the request's caller read the explanation of `namespace/name`?
    pub async fn explain(
        &self,
        headers: &http::HeaderMap,
        namespace: &str,
        name: &str,
    ) -> Result<(), Denied> {
        let r = match self.explain {
            ExplainAccess::None => Ok(()),
            ExplainAccess::TokenReview => self.check(headers, Want::Pod { namespace, name }).await,
        };
        self.count(0, &r);
        r
    }

    /// May the request's caller read `/metrics`?
    pub async fn metrics(&self, headers: &http::HeaderMap) -> Result<(), Denied> {
        let r = match self.metrics {
            MetricsAccess::Open => Ok(()),
            MetricsAccess::TokenReview => self.check(headers, Want::Path("/metrics")).await,
        };
        self.count(1, &r);
        r
    }

    fn count(&self, endpoint: usize, r: &Result<(), Denied>) {
        let i = match r {
            Ok(()) => 0,
            Err(Denied::Unauthenticated(_)) => 1,
            Err(Denied::Forbidden(_)) => 2,
            Err(Denied::Unavailable(_)) => 3,
        };
        self.counts.0[endpoint][i].fetch_add(1, Ordering::Relaxed);
    }

    async fn check(&self, headers: &http::HeaderMap, want: Want<'_>) -> Result<(), Denied> {
        let Some(token) = bearer(headers) else {
            return Err(Denied::Unauthenticated(format!(
                "a bearer token is needed to {}: `Authorization: Bearer <token>`, or through the \
                 API server's pod proxy `{FORWARDED}: Bearer <token>` (kubectl observer explain \
                 sends its user's)",
                want.describe()
            )));
        };
        let Some(client) = &self.client else {
            return Err(Denied::Unavailable(
                "the access check needs the Kubernetes API, which this agent does not reach \
                 (--status-mode off)"
                    .into(),
            ));
        };
        let caller = self.authenticate(client, token).await?;
        if self.authorize(client, &caller, &want).await? {
            Ok(())
        } else {
            Err(Denied::Forbidden(format!(
                "{} may not {}",
                crate::model::printable(caller.name()),
                want.describe()
            )))
        }
    }

    async fn authenticate(&self, client: &Client, token: &str) -> Result<Caller, Denied> {
        let key = digest(&[token]);
        let now = Instant::now();
        if let Some(known) = crate::sync::lock(&self.tokens).get(&key, now) {
            return known.map_err(Denied::Unauthenticated);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                // The API server's own audiences: the tokens its clients hold.
                audiences: None,
            },
            ..Default::default()
        };
        let done = self
            .review(Api::<TokenReview>::all(client.clone()), &review)
            .await?;
        let status = done.status.unwrap_or_default();
        let verdict = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => Ok(Caller(user)),
            _ => Err(format!(
                "the API server does not accept the token{}",
                status
                    .error
                    .filter(|e| !e.is_empty())
                    .map(|e| format!(": {}", crate::model::printable(&e)))
                    .unwrap_or_default()
            )),
        };
        let ttl = if verdict.is_ok() {
            TOKEN_ACCEPTED
        } else {
            TOKEN_REFUSED
        };
        crate::sync::lock(&self.tokens).put(key, verdict.clone(), ttl, Instant::now());
        verdict.map_err(Denied::Unauthenticated)
    }

    async fn authorize(
        &self,
        client: &Client,
        caller: &Caller,
        want: &Want<'_>,
    ) -> Result<bool, Denied> {
        let mut parts = caller.key_parts();
        match want {
            Want::Pod { namespace, name } => {
                parts.extend(["pod".into(), namespace.to_string(), name.to_string()])
            }
            Want::Path(p) => parts.extend(["path".into(), p.to_string()]),
        }
        let key = digest(&parts.iter().map(String::as_str).collect::<Vec<_>>());
        if let Some(known) = crate::sync::lock(&self.rights).get(&key, Instant::now()) {
            return Ok(known);
        }
        let user = &caller.0;
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                uid: user.uid.clone(),
                groups: user.groups.clone(),
                extra: user.extra.clone(),
                resource_attributes: match want {
                    Want::Pod { namespace, name } => Some(ResourceAttributes {
                        namespace: Some(namespace.to_string()),
                        verb: Some("get".into()),
                        resource: Some("pods".into()),
                        name: Some(name.to_string()),
                        ..Default::default()
                    }),
                    Want::Path(_) => None,
                },
                non_resource_attributes: match want {
                    Want::Path(p) => Some(NonResourceAttributes {
                        path: Some(p.to_string()),
                        verb: Some("get".into()),
                    }),
                    Want::Pod { .. } => None,
                },
            },
            ..Default::default()
        };
        let done = self
            .review(Api::<SubjectAccessReview>::all(client.clone()), &review)
            .await?;
        let allowed = done
            .status
            .is_some_and(|s| s.allowed && !s.denied.unwrap_or(false));
        let ttl = if allowed { ALLOWED } else { DENIED };
        crate::sync::lock(&self.rights).put(key, allowed, ttl, Instant::now());
        Ok(allowed)
    }

    /// One review, bounded in time and in how many run at once.
    async fn review<K>(&self, api: Api<K>, object: &K) -> Result<K, Denied>
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let unavailable = |why: String| {
            Denied::Unavailable(format!(
                "the access check could not be made: {why}; the agent's account needs create on \
                 tokenreviews and subjectaccessreviews (deploy/'s ClusterRole)"
            ))
        };
        let kind = K::kind(&()).into_owned();
        let work = async {
            let _permit = self
                .in_flight
                .acquire()
                .await
                .map_err(|_| unavailable("the endpoint is stopping".into()))?;
            api.create(&PostParams::default(), object)
                .await
                .map_err(|e| unavailable(format!("{kind}: {}", crate::model::chain(&e))))
        };
        match tokio::time::timeout(REVIEW_TIMEOUT, work).await {
            Ok(r) => r,
            Err(_) => Err(unavailable(format!(
                "{kind} got no answer within {REVIEW_TIMEOUT:?}"
            ))),
        }
    }

    pub(crate) fn encode_metrics(&self, e: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        use prometheus_client::{encoding::EncodeMetric, metrics::counter::ConstCounter};
        let mut family = e.encode_descriptor(
            "http_access_checks",
            "Requests to the HTTP endpoint's guarded paths, by path (explain, metrics) and \
             result: allowed, unauthenticated (401: no token or a refused one), forbidden (403: \
             the caller may not get the pod or the path), unavailable (503: the API could not \
             be asked)",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (endpoint, counts) in ["explain", "metrics"].iter().zip(&self.counts.0) {
            for (result, n) in RESULTS.iter().zip(counts) {
                let labels = [("endpoint", *endpoint), ("result", *result)];
                ConstCounter::new(n.load(Ordering::Relaxed))
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The bearer token of `Authorization`, else of [`FORWARDED`].
fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    [http::header::AUTHORIZATION.as_str(), FORWARDED]
        .iter()
        .filter_map(|h| headers.get(*h)?.to_str().ok())
        .find_map(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            let token = token.trim();
            (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::kube::testkit::api::{self, status, Reply};

    fn headers(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    fn accepted(user: &str) -> Reply {
        Reply::Json(
            201,
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                   "spec": {}, "status": {"authenticated": true,
                   "user": {"username": user, "uid": "u-1", "groups": ["team-a", "system:authenticated"]}}}),
        )
    }

    fn refused() -> Reply {
        Reply::Json(
            201,
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                   "spec": {}, "status": {"authenticated": false, "error": "invalid bearer token"}}),
        )
    }

    fn allowed(yes: bool) -> Reply {
        Reply::Json(
            201,
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                   "spec": {}, "status": {"allowed": yes}}),
        )
    }

    #[test]
    fn the_token_is_read_from_authorization_else_the_forwarded_header() {
        assert_eq!(
            bearer(&headers(&[("authorization", "Bearer abc")])),
            Some("abc")
        );
        assert_eq!(
            bearer(&headers(&[(FORWARDED, "bearer  xyz ")])),
            Some("xyz")
        );
        assert_eq!(
            bearer(&headers(&[
                ("authorization", "Bearer a"),
                (FORWARDED, "Bearer b")
            ])),
            Some("a")
        );
        assert_eq!(
            bearer(&headers(&[("authorization", "Basic dXNlcg==")])),
            None
        );
        assert_eq!(bearer(&headers(&[("authorization", "Bearer ")])), None);
        assert_eq!(bearer(&http::HeaderMap::new()), None);
    }

    /// The reviews the API server is sent say who and what, the answers are believed (and
    /// cached), and a refusal reads the same whether or not the pod exists.
    #[tokio::test]
    async fn explain_asks_the_api_who_the_caller_is_and_whether_it_may_get_the_pod() {
        let (client, mock) = api::client();
        let log = api::serve(
            mock,
            vec![
                accepted("alice"),
                allowed(true),
                allowed(false),
                refused(),
                status(500, "InternalError"),
            ],
        );
        let gate = Gate::new(
            ExplainAccess::TokenReview,
            MetricsAccess::Open,
            Some(client),
        );
        let alice = headers(&[(FORWARDED, "Bearer tok-a")]);
        assert_eq!(gate.explain(&alice, "shop", "web").await, Ok(()));
        // Cached: no second TokenReview or SubjectAccessReview for the same question.
        assert_eq!(gate.explain(&alice, "shop", "web").await, Ok(()));
        assert_eq!(
            gate.explain(&alice, "bank", "vault").await,
            Err(Denied::Forbidden("alice may not get pod bank/vault".into()))
        );
        let seen = log.lock().unwrap().clone();
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert_eq!(seen[0].path, "/apis/authentication.k8s.io/v1/tokenreviews");
        assert_eq!(seen[0].body["spec"]["token"], "tok-a");
        assert_eq!(
            seen[1].path,
            "/apis/authorization.k8s.io/v1/subjectaccessreviews"
        );
        assert_eq!(
            seen[1].body["spec"],
            json!({"user": "alice", "uid": "u-1", "groups": ["team-a", "system:authenticated"],
                   "resourceAttributes": {"namespace": "shop", "verb": "get", "resource": "pods",
                                          "name": "web"}})
        );
        assert_eq!(seen[2].body["spec"]["resourceAttributes"]["name"], "vault");

        // A token the API server refuses: 401, and asked once however often it comes back.
        let bad = headers(&[("authorization", "Bearer forged")]);
        let e = gate.explain(&bad, "shop", "web").await.unwrap_err();
        assert_eq!(
            e,
            Denied::Unauthenticated(
                "the API server does not accept the token: invalid bearer token".into()
            )
        );
        assert_eq!(gate.explain(&bad, "shop", "web").await.unwrap_err(), e);
        assert_eq!(log.lock().unwrap().len(), 4);

        // No token at all: 401 without asking the API.
        let e = gate
            .explain(&http::HeaderMap::new(), "shop", "web")
            .await
            .unwrap_err();
        assert_eq!(e.code(), 401);
        assert!(e.message().contains(FORWARDED), "{e:?}");
        assert_eq!(log.lock().unwrap().len(), 4);

        // The API failing: 503, naming the review, and not cached.
        let e = gate
            .explain(&headers(&[(FORWARDED, "Bearer tok-b")]), "shop", "web")
            .await
            .unwrap_err();
        assert_eq!(e.code(), 503, "{e:?}");
        assert!(e.message().contains("TokenReview"), "{e:?}");

        let counts: Vec<u64> = gate.counts.0[0]
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        // allowed 2, unauthenticated 3 (refused twice, no token once), forbidden 1, unavailable 1.
        assert_eq!(counts, [2, 3, 1, 1]);
    }

    #[tokio::test]
    async fn metrics_asks_for_the_non_resource_path_and_health_needs_nothing() {
        let (client, mock) = api::client();
        let log = api::serve(mock, vec![accepted("prometheus"), allowed(true)]);
        let gate = Gate::new(
            ExplainAccess::None,
            MetricsAccess::TokenReview,
            Some(client),
        );
        let h = headers(&[("authorization", "Bearer scrape")]);
        assert_eq!(gate.metrics(&h).await, Ok(()));
        assert_eq!(
            log.lock().unwrap()[1].body["spec"]["nonResourceAttributes"],
            json!({"path": "/metrics", "verb": "get"})
        );
        assert_eq!(
            gate.metrics(&http::HeaderMap::new())
                .await
                .unwrap_err()
                .code(),
            401
        );
        // Explain open: nothing asked.
        assert_eq!(
            gate.explain(&http::HeaderMap::new(), "a", "b").await,
            Ok(())
        );
        assert_eq!(log.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn without_the_api_a_guarded_path_is_unavailable_not_open() {
        let gate = Gate::new(ExplainAccess::TokenReview, MetricsAccess::Open, None);
        let e = gate
            .explain(&headers(&[("authorization", "Bearer t")]), "a", "b")
            .await
            .unwrap_err();
        assert_eq!(e.code(), 503);
        assert!(e.message().contains("--status-mode off"), "{e:?}");
        assert_eq!(gate.metrics(&http::HeaderMap::new()).await, Ok(()));
    }

    #[test]
    fn a_full_cache_drops_the_expired_first_then_starts_over() {
        let now = Instant::now();
        let mut c = Cache::new();
        for i in 0..CACHE_ENTRIES {
            let ttl = if i % 2 == 0 { Duration::ZERO } else { DENIED };
            c.put(digest(&[&i.to_string()]), i, ttl, now);
        }
        c.put(digest(&["new"]), 1, DENIED, now + Duration::from_millis(1));
        assert_eq!(c.entries.len(), CACHE_ENTRIES / 2 + 1);
        assert_eq!(c.get(&digest(&["1"]), now), Some(1));
        assert_eq!(c.get(&digest(&["0"]), now), None, "expired");
    }
}
