//! A real Prometheus server (Debian's `prometheus`) scraping one target on loopback, and its HTTP
//! query API, for the Grafana dashboard's test. Its configuration, database and log live in a
//! temporary directory; the server is killed when dropped.
use std::{
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::{
    endpoint::{free_listen, http_get},
    prereq,
    wait::poll_every,
};

/// The `prometheus` binary, or None after saying why (a failure under CI=true).
pub fn require_prometheus() -> Option<std::path::PathBuf> {
    let found = prereq::which("prometheus");
    let missing = match &found {
        Some(_) => vec![],
        None => {
            vec!["`prometheus` on PATH (Debian's package; scripts/bootstrap.sh installs it)".into()]
        }
    };
    prereq::require("the dashboard test", &missing)
        .then_some(found)
        .flatten()
}

pub struct Prometheus {
    child: Child,
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts `bin` scraping `target`'s `/metrics` every `interval` (job `observer`), and waits
    /// until it is ready.
    pub fn start(bin: &Path, target: SocketAddr, interval: Duration) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let secs = interval.as_secs_f64();
        let config = format!(
            "global:\n  scrape_interval: {secs}s\n  scrape_timeout: {secs}s\n  evaluation_interval: {secs}s\n\
             scrape_configs:\n  - job_name: observer\n    static_configs:\n      - targets: ['{target}']\n"
        );
        let config_file = dir.path().join("prometheus.yml");
        std::fs::write(&config_file, config)?;
        let log = std::fs::File::create(dir.path().join("prometheus.log"))?;
        let addr = free_listen();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut p = Self { child, addr, dir };
        let ready = poll_every(Duration::from_millis(100), Duration::from_secs(30), || {
            if let Ok(Some(exit)) = p.child.try_wait() {
                return Some(Err(exit));
            }
            http_get(addr, "/-/ready")
                .is_some_and(|(c, _)| c == 200)
                .then_some(Ok(()))
        });
        match ready {
            Some(Ok(())) => Ok(p),
            Some(Err(exit)) => bail!("prometheus exited ({exit}): {}", p.log()),
            None => bail!("prometheus not ready on {addr} after 30 s: {}", p.log()),
        }
    }

    /// Prometheus's own log so far, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/query?query=<expr>` (an instant query at now): the whole JSON answer, on
    /// success and on error (`status` says which), or an error when nothing answers or the
    /// answer is not JSON.
    pub fn query(&self, expr: &str) -> Result<Value> {
        let path = format!("/api/v1/query?query={}", percent_encode(expr));
        let (code, body) =
            http_get(self.addr, &path).with_context(|| format!("no answer from {}", self.addr))?;
        serde_json::from_str(&body)
            .with_context(|| format!("HTTP {code}, not JSON, for {expr}: {body}"))
    }

    /// The vector result of a query that must succeed.
    pub fn vector(&self, expr: &str) -> Result<Vec<Value>> {
        let v = self.query(expr)?;
        if v["status"] != "success" {
            bail!("{expr}: {v}");
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A sample's value (`[time, "value"]`) as a number (NaN and ±Inf included).
pub fn sample_value(sample: &Value) -> Option<f64> {
    sample["value"][1].as_str()?.parse().ok()
}

/// RFC 3986 percent-encoding of everything but the unreserved characters, for a query string.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_promql_for_a_query_string() {
        assert_eq!(
            percent_encode(r#"sum by (le) (x{a=~".*"}[1m])"#),
            "sum%20by%20%28le%29%20%28x%7Ba%3D~%22.%2A%22%7D%5B1m%5D%29"
        );
        assert_eq!(percent_encode("a+b&c"), "a%2Bb%26c");
    }
}
