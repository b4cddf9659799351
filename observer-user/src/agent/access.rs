//! Who may read `/metrics`. The endpoint serves nothing about any pod but the metrics, whose
//! OOM-kill and limit-hit series name pods and namespaces: by default they are served only to a
//! caller whose bearer token the API server accepts (TokenReview) and who may `get` the
//! non-resource path `/metrics` (SubjectAccessReview), as kubelet's own `/metrics` and
//! kube-rbac-proxy check it; both answers cached as kubelet caches them (2 min for a token; 5 min
//! allowed, 30 s denied). `/healthz` and `/readyz` stay open (kubelet's probes carry no token, and
//! they tell nothing about any pod).
//!
//! A flood of bogus tokens costs the API server one review per token every 10 s at most, and
//! cannot hold everyone else's scrapes up: a client (a peer address) has at most one review in
//! flight (a second is answered 429 at once, not queued), reviews wait their turn first come
//! first served, and a token already reviewed (the scraper's, after its first scrape) is answered
//! from the cache without waiting at all.
use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec, UserInfo},
    authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{api::PostParams, Api, Client};
use prometheus_client::encoding::DescriptorEncoder;
use sha2::{Digest, Sha256};

/// Who may read `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricsAccess {
    /// Callers who may `get` the non-resource URL `/metrics` (bind the ClusterRole
    /// observer-metrics-reader, or `system:monitoring`, to the scraper's account).
    #[default]
    TokenReview,
    /// Anyone who reaches the port (a node-local scraper on a network no tenant reaches: the
    /// series name pods and namespaces).
    Open,
}

/// Why a request is not answered; the HTTP code is the variant's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denied {
    /// 401: no token, or one the API server does not accept.
    Unauthenticated(String),
    /// 403: a valid token whose user lacks the right.
    Forbidden(String),
    /// 429: this client already has a check in flight.
    Throttled(String),
    /// 503: the check could not be made (no API, the API down or slow).
    Unavailable(String),
}

impl Denied {
    pub fn code(&self) -> u16 {
        match self {
            Self::Unauthenticated(_) => 401,
            Self::Forbidden(_) => 403,
            Self::Throttled(_) => 429,
            Self::Unavailable(_) => 503,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Self::Unauthenticated(m)
            | Self::Forbidden(m)
            | Self::Throttled(m)
            | Self::Unavailable(m) => m,
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

/// Counts of `/metrics`' access checks, by result.
#[derive(Default)]
struct Counts([AtomicU64; 5]);

const RESULTS: [&str; 5] = [
    "allowed",
    "unauthenticated",
    "forbidden",
    "throttled",
    "unavailable",
];

/// The endpoint's access checks: its setting, the API client the reviews go through, and the
/// caches of their answers.
pub struct Gate {
    metrics: MetricsAccess,
    /// `None`: the agent does not reach the API (`--status-mode off`), so nothing can be checked.
    client: Option<Client>,
    tokens: Mutex<Cache<Result<Caller, String>>>,
    rights: Mutex<Cache<bool>>,
    in_flight: tokio::sync::Semaphore,
    /// The clients with a review in flight.
    reviewing: Mutex<HashSet<IpAddr>>,
    counts: Counts,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("metrics", &self.metrics)
            .field("api", &self.client.is_some())
            .finish()
    }
}

/// A client's one review in flight, given back when dropped.
struct Reviewing<'a>(&'a Mutex<HashSet<IpAddr>>, IpAddr);

impl Drop for Reviewing<'_> {
    fn drop(&mut self) {
        crate::sync::lock(self.0).remove(&self.1);
    }
}

impl Gate {
    pub fn new(metrics: MetricsAccess, client: Option<Client>) -> Self {
        Self {
            metrics,
            client,
            tokens: Mutex::new(Cache::new()),
            rights: Mutex::new(Cache::new()),
            in_flight: tokio::sync::Semaphore::new(IN_FLIGHT),
            reviewing: Mutex::new(HashSet::new()),
            counts: Counts::default(),
        }
    }

    /// Everything open: tests of what the endpoint serves, and `--metrics-access open`.
    pub fn open() -> Self {
        Self::new(MetricsAccess::Open, None)
    }

    /// What an operator must know at start: a check that cannot be made without the API.
    pub fn warn_if_unusable(&self) {
        if self.client.is_none() && self.metrics == MetricsAccess::TokenReview {
            tracing::warn!("/metrics answers 503: its access check (--metrics-access token-review, the default) asks the Kubernetes API, which this agent does not reach (--status-mode off); set --metrics-access open (OBSERVER_METRICS_ACCESS) only where no tenant reaches --listen");
        }
    }

    /// May the caller (`peer`, with `headers`) read `/metrics`?
    pub async fn metrics(&self, headers: &http::HeaderMap, peer: IpAddr) -> Result<(), Denied> {
        let r = match self.metrics {
            MetricsAccess::Open => Ok(()),
            MetricsAccess::TokenReview => self.check(headers, peer).await,
        };
        let i = match &r {
            Ok(()) => 0,
            Err(Denied::Unauthenticated(_)) => 1,
            Err(Denied::Forbidden(_)) => 2,
            Err(Denied::Throttled(_)) => 3,
            Err(Denied::Unavailable(_)) => 4,
        };
        self.counts.0[i].fetch_add(1, Ordering::Relaxed);
        r
    }

    async fn check(&self, headers: &http::HeaderMap, peer: IpAddr) -> Result<(), Denied> {
        let Some(token) = bearer(headers) else {
            return Err(Denied::Unauthenticated(
                "a bearer token is needed to get /metrics: `Authorization: Bearer <token>` of an \
                 account allowed get on the non-resource URL /metrics (the ClusterRole \
                 observer-metrics-reader)"
                    .into(),
            ));
        };
        let Some(client) = &self.client else {
            return Err(Denied::Unavailable(
                "the access check needs the Kubernetes API, which this agent does not reach \
                 (--status-mode off)"
                    .into(),
            ));
        };
        let caller = self.authenticate(client, token, peer).await?;
        if self.authorize(client, &caller, peer).await? {
            Ok(())
        } else {
            Err(Denied::Forbidden(format!(
                "{} may not get /metrics",
                crate::model::printable(caller.name())
            )))
        }
    }

    /// The client's one review slot, or 429.
    fn take_review_slot(&self, peer: IpAddr) -> Result<Reviewing<'_>, Denied> {
        if !crate::sync::lock(&self.reviewing).insert(peer) {
            return Err(Denied::Throttled(
                "this client's previous access check is still being made; retry".into(),
            ));
        }
        Ok(Reviewing(&self.reviewing, peer))
    }

    async fn authenticate(
        &self,
        client: &Client,
        token: &str,
        peer: IpAddr,
    ) -> Result<Caller, Denied> {
        let key = digest(&[token]);
        let now = Instant::now();
        if let Some(known) = crate::sync::lock(&self.tokens).get(&key, now) {
            return known.map_err(Denied::Unauthenticated);
        }
        let _slot = self.take_review_slot(peer)?;
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
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
        peer: IpAddr,
    ) -> Result<bool, Denied> {
        let mut parts = caller.key_parts();
        parts.extend(["path".into(), "/metrics".into()]);
        let key = digest(&parts.iter().map(String::as_str).collect::<Vec<_>>());
        if let Some(known) = crate::sync::lock(&self.rights).get(&key, Instant::now()) {
            return Ok(known);
        }
        let _slot = self.take_review_slot(peer)?;
        let user = &caller.0;
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                uid: user.uid.clone(),
                groups: user.groups.clone(),
                extra: user.extra.clone(),
                resource_attributes: None,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
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
        // Waiting for a turn and the API's answer are bounded apart: a review that waited is
        // not cut short for it.
        let _permit = match tokio::time::timeout(REVIEW_TIMEOUT, self.in_flight.acquire()).await {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => return Err(unavailable("the endpoint is stopping".into())),
            Err(_) => {
                return Err(unavailable(format!(
                    "{IN_FLIGHT} other checks held every slot for {REVIEW_TIMEOUT:?}"
                )))
            }
        };
        match tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), object)).await
        {
            Ok(r) => r.map_err(|e| unavailable(format!("{kind}: {}", crate::model::chain(&e)))),
            Err(_) => Err(unavailable(format!(
                "{kind} got no answer within {REVIEW_TIMEOUT:?}"
            ))),
        }
    }

    pub(crate) fn encode_metrics(&self, e: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        crate::exposition::counters(
            e,
            "metrics_access_checks",
            "Requests for /metrics by the result of their access check: allowed, \
             unauthenticated (401: no token or a refused one), forbidden (403: the caller may \
             not get /metrics), throttled (429: the client's previous check still running), \
             unavailable (503: the API could not be asked)",
            "result",
            RESULTS
                .iter()
                .zip(&self.counts.0)
                .map(|(r, n)| (*r, n.load(Ordering::Relaxed))),
        )
    }
}

/// The bearer token of `Authorization`.
fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    let v = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
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

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn the_token_is_read_from_authorization_only() {
        assert_eq!(
            bearer(&headers(&[("authorization", "Bearer abc")])),
            Some("abc")
        );
        assert_eq!(
            bearer(&headers(&[("authorization", "bearer  xyz ")])),
            Some("xyz")
        );
        // What a proxy in front might forward is no credential here.
        assert_eq!(
            bearer(&headers(&[("x-observer-authorization", "Bearer b")])),
            None
        );
        assert_eq!(
            bearer(&headers(&[("authorization", "Basic dXNlcg==")])),
            None
        );
        assert_eq!(bearer(&headers(&[("authorization", "Bearer ")])), None);
        assert_eq!(bearer(&http::HeaderMap::new()), None);
    }

    /// The reviews the API server is sent say who and what, the answers are believed and
    /// cached; a refused token is asked about once however often it comes back.
    #[tokio::test]
    async fn metrics_asks_the_api_who_the_caller_is_and_whether_it_may_get_the_path() {
        let (client, mock) = api::client();
        let log = api::serve(
            mock,
            vec![
                accepted("prometheus"),
                allowed(true),
                accepted("mallory"),
                allowed(false),
                refused(),
                status(500, "InternalError"),
            ],
        );
        let gate = Gate::new(MetricsAccess::TokenReview, Some(client));
        let scraper = headers(&[("authorization", "Bearer scrape")]);
        assert_eq!(gate.metrics(&scraper, A).await, Ok(()));
        // Cached: no second TokenReview or SubjectAccessReview for the same question.
        assert_eq!(gate.metrics(&scraper, A).await, Ok(()));
        let seen = log.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(seen[0].path, "/apis/authentication.k8s.io/v1/tokenreviews");
        assert_eq!(seen[0].body["spec"]["token"], "scrape");
        assert_eq!(
            seen[1].path,
            "/apis/authorization.k8s.io/v1/subjectaccessreviews"
        );
        assert_eq!(
            seen[1].body["spec"],
            json!({"user": "prometheus", "uid": "u-1", "groups": ["team-a", "system:authenticated"],
                   "nonResourceAttributes": {"path": "/metrics", "verb": "get"}})
        );
        assert_eq!(
            gate.metrics(&headers(&[("authorization", "Bearer m")]), A)
                .await,
            Err(Denied::Forbidden("mallory may not get /metrics".into()))
        );

        // A token the API server refuses: 401, and asked once however often it comes back.
        let bad = headers(&[("authorization", "Bearer forged")]);
        let e = gate.metrics(&bad, A).await.unwrap_err();
        assert_eq!(
            e,
            Denied::Unauthenticated(
                "the API server does not accept the token: invalid bearer token".into()
            )
        );
        assert_eq!(gate.metrics(&bad, A).await.unwrap_err(), e);
        assert_eq!(log.lock().unwrap().len(), 5);

        // No token at all: 401 without asking the API.
        let e = gate.metrics(&http::HeaderMap::new(), A).await.unwrap_err();
        assert_eq!(e.code(), 401);
        assert!(e.message().contains("observer-metrics-reader"), "{e:?}");
        assert_eq!(log.lock().unwrap().len(), 5);

        // The API failing: 503, naming the review, and not cached.
        let e = gate
            .metrics(&headers(&[("authorization", "Bearer tok-b")]), A)
            .await
            .unwrap_err();
        assert_eq!(e.code(), 503, "{e:?}");
        assert!(e.message().contains("TokenReview"), "{e:?}");

        let counts: Vec<u64> = gate
            .counts
            .0
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        // allowed 2, unauthenticated 3 (refused twice, no token once), forbidden 1,
        // throttled 0, unavailable 1.
        assert_eq!(counts, [2, 3, 1, 0, 1]);
    }

    /// One client flooding bogus tokens holds one review at a time (the rest answered 429 at
    /// once, the API not asked), and another client's scrape goes through meanwhile.
    #[tokio::test]
    async fn a_flood_of_bogus_tokens_from_one_client_does_not_hold_up_another() {
        let (client, mock) = api::client();
        // The flood's first review never comes back (an API server slow for it); the others
        // are answered at once.
        let log = api::serve(
            mock,
            vec![Reply::Hang, accepted("prometheus"), allowed(true)],
        );
        let gate = std::sync::Arc::new(Gate::new(MetricsAccess::TokenReview, Some(client)));
        let first = {
            let gate = std::sync::Arc::clone(&gate);
            tokio::spawn(async move {
                gate.metrics(&headers(&[("authorization", "Bearer bogus-0")]), A)
                    .await
            })
        };
        api::wait_for(&log, 1, Duration::from_secs(5)).await;
        for i in 1..50 {
            let h = headers(&[("authorization", &format!("Bearer bogus-{i}"))]);
            assert_eq!(gate.metrics(&h, A).await.unwrap_err().code(), 429);
        }
        let scraper = headers(&[("authorization", "Bearer scrape")]);
        let answered = tokio::time::timeout(Duration::from_secs(2), gate.metrics(&scraper, B))
            .await
            .expect("the other client is answered while the flood's review hangs");
        assert_eq!(answered, Ok(()));
        assert_eq!(log.lock().unwrap().len(), 3, "one review of the flood's");
        first.abort();
    }

    #[tokio::test]
    async fn without_the_api_metrics_are_unavailable_not_open() {
        let gate = Gate::new(MetricsAccess::TokenReview, None);
        let e = gate
            .metrics(&headers(&[("authorization", "Bearer t")]), A)
            .await
            .unwrap_err();
        assert_eq!(e.code(), 503);
        assert!(e.message().contains("--status-mode off"), "{e:?}");
        assert_eq!(
            Gate::open().metrics(&http::HeaderMap::new(), A).await,
            Ok(())
        );
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
