//! The agent's HTTP endpoint (`/metrics`, `/healthz`, `/readyz`) as a scraper or kubelet's
//! probes see it: plain HTTP/1.0, no client library in between.
use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

/// `GET path`: (status code, body); None when nothing answers.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    http_get_as(addr, path, None)
}

/// [`http_get`] with `Authorization: Bearer <token>`.
pub fn http_get_as(addr: SocketAddr, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(s, "GET {path} HTTP/1.0\r\nHost: agent\r\n{auth}\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, text.split_once("\r\n\r\n")?.1.to_string()))
}

/// An address on 127.0.0.1 with a port free now, for `--listen`.
pub fn free_listen() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

/// The value of an unlabelled sample `name` in /metrics (None: not exported, or no answer).
pub fn metric(addr: SocketAddr, name: &str) -> Option<f64> {
    let (_, text) = http_get(addr, "/metrics")?;
    sample(&text, name)
}

/// The value of the sample `name` (with its labels, if any: `name{a="b"}`) in a /metrics text.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Whether `path` answers 200.
pub fn ok(addr: SocketAddr, path: &str) -> bool {
    http_get(addr, path).is_some_and(|(c, _)| c == 200)
}

/// A histogram `name` (without `_bucket`) from /metrics: (upper bound, cumulative count) per
/// bucket, `+Inf` last.
pub fn histogram(addr: SocketAddr, name: &str) -> Option<Vec<(f64, u64)>> {
    let (_, text) = http_get(addr, "/metrics")?;
    let prefix = format!("{name}_bucket{{le=\"");
    let buckets: Vec<(f64, u64)> = text
        .lines()
        .filter_map(|l| {
            let (le, rest) = l.strip_prefix(&prefix)?.split_once("\"}")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, rest.trim().parse::<f64>().ok()? as u64))
        })
        .collect();
    (!buckets.is_empty()).then_some(buckets)
}

/// The upper bound of the bucket holding quantile `q` (0..1) of a [`histogram`].
pub fn quantile_bound(buckets: &[(f64, u64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    let rank = ((q * total as f64).ceil() as u64).max(1);
    buckets.iter().find(|(_, c)| *c >= rank).map(|(le, _)| *le)
}
