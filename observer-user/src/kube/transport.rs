//! Where a status request goes: kube's client (the status manager's), or the fast path's lean
//! stack.
//!
//! The lean stack is kube's own configuration (base URI, credentials with their refresh, TLS,
//! impersonation headers) on hyper's pooled client, without the layers `kube::Client` puts
//! around it: the tower `Buffer` (a channel and a worker task between caller and connection),
//! the tracing layer, decompression, and retries (a fast-path request that fails is the status
//! manager's to write; kube's retries could hold it for minutes). After the reader thread slept,
//! a death's request runs with cold caches, and every layer is code and memory it touches first.
use std::time::Duration;

use ::kube::client::{Body, ConfigExt};
use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use tower::{util::BoxCloneSyncService, BoxError, ServiceBuilder, ServiceExt};

use super::KubeError;

type Lean =
    BoxCloneSyncService<http::Request<Body>, http::Response<hyper::body::Incoming>, BoxError>;

/// One way to the API server.
#[derive(Clone)]
pub enum Transport {
    Kube(::kube::Client),
    Lean(Lean),
}

/// What the API server answered: status, `Retry-After` (whole seconds), body.
pub struct Answer {
    pub status: StatusCode,
    pub retry_after: Option<Duration>,
    pub body: Bytes,
}

impl Transport {
    /// The lean stack for `config`; kube's client where it has what the lean stack lacks (a
    /// proxy).
    pub fn lean(config: ::kube::Config) -> Result<Self, KubeError> {
        if config.proxy_url.is_some() {
            return Ok(Transport::Kube(::kube::Client::try_from(config)?));
        }
        let https = config.rustls_https_connector()?;
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(https);
        let svc = ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .option_layer(config.auth_layer()?)
            .layer(config.extra_headers_layer()?)
            .map_err(BoxError::from)
            .service(client);
        Ok(Transport::Lean(BoxCloneSyncService::new(svc)))
    }

    /// `GET path` within `timeout`; an answer other than 2xx is an error.
    pub async fn get(&self, path: &str, timeout: Duration) -> Result<Answer, KubeError> {
        let req = http::Request::get(path)
            .body(Vec::new())
            .map_err(::kube::Error::HttpError)?;
        let a = tokio::time::timeout(timeout, self.exchange(req))
            .await
            .map_err(|_| KubeError::Timeout(timeout))??;
        if !a.status.is_success() {
            return Err(KubeError::Api {
                code: a.status.as_u16(),
                message: api_message(&a.body),
                retry_after: a.retry_after,
            });
        }
        Ok(a)
    }

    /// One request and its whole answer.
    pub async fn exchange(&self, req: http::Request<Vec<u8>>) -> Result<Answer, KubeError> {
        let req = req.map(Body::from);
        match self {
            Transport::Kube(c) => answer(c.send(req).await?).await,
            Transport::Lean(s) => {
                let r = s
                    .clone()
                    .oneshot(req)
                    .await
                    .map_err(::kube::Error::Service)?;
                answer(r).await
            }
        }
    }
}

async fn answer<B>(r: http::Response<B>) -> Result<Answer, KubeError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let status = r.status();
    let retry_after = r
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let body = r
        .into_body()
        .collect()
        .await
        .map_err(|e| ::kube::Error::Service(e.into()))?
        .to_bytes();
    Ok(Answer {
        status,
        retry_after,
        body,
    })
}

/// The `message` of a `Status` body, else the body's text (proxies answer in HTML).
pub fn api_message(bytes: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| {
            v.get("message")
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| String::from_utf8_lossy(bytes).chars().take(200).collect())
}
