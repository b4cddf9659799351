//! The status manager's requests as raw exchanges through kube's client: the status, the
//! `Retry-After` and the body of every answer, which the writer's outcomes are made of. (The
//! fast path has connections of its own: [`crate::fastpath::wire`].)
use std::time::Duration;

use ::kube::client::Body;
use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use tower::BoxError;

use super::KubeError;

/// The way to the API server: kube's client.
#[derive(Clone)]
pub struct Transport(pub ::kube::Client);

/// What the API server answered: status, `Retry-After` (whole seconds), body.
pub struct Answer {
    pub status: StatusCode,
    pub retry_after: Option<Duration>,
    pub body: Bytes,
}

impl Transport {
    /// One request and its whole answer.
    pub(crate) async fn exchange(&self, req: http::Request<Vec<u8>>) -> Result<Answer, KubeError> {
        answer(self.0.send(req.map(Body::from)).await?).await
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
pub(crate) fn api_message(bytes: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| {
            v.get("message")
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| String::from_utf8_lossy(bytes).chars().take(200).collect())
}
