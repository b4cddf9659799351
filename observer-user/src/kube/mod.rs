//! The Kubernetes API as the agent reaches it: the client and its kubeconfig ([`client`]), the
//! one error type ([`KubeError`]) and how a failed call is said ([`describe_api_error`]), the
//! reflector on this node's pods ([`pods`]), and the HTTP bits the writers share
//! ([`transport`]). What is written, and when, is [`crate::status`]'s and [`crate::fastpath`]'s.
pub mod pods;
pub mod transport;

#[cfg(test)]
pub(crate) mod testkit;

use std::{ffi::OsStr, path::PathBuf, time::Duration};

use thiserror::Error;

pub use pods::NodePods;
pub use pods::PodChange;

/// The one error type of the module.
#[derive(Debug, Error)]
pub enum KubeError {
    /// Neither `--node-name` nor `NODE_NAME` said which node this is.
    #[error("node name unknown: pass --node-name or set NODE_NAME")]
    NoNodeName,
    #[error("condition prefix {prefix:?} is not a DNS subdomain: {why}")]
    BadConditionPrefix { prefix: String, why: String },
    #[error("unknown status mode {0:?}: expected off, conditions, audit or full")]
    BadMode(String),
    #[error("kubernetes client configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Client(#[from] ::kube::Error),
    #[error("building the request: {0}")]
    Request(#[from] ::kube::core::request::Error),
    #[error("encoding JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The API server answered with an error status.
    #[error("API server answered {code}: {message}")]
    Api {
        code: u16,
        message: String,
        /// `Retry-After` of a 429 (or 503), in whole seconds as HTTP says.
        retry_after: Option<Duration>,
    },
    /// The API server did not answer within the per-request timeout.
    #[error("no answer from the API server within {0:?}")]
    Timeout(Duration),
}

/// The node name: the flag's value, else `NODE_NAME` (the DaemonSet sets it from
/// `spec.nodeName` through the downward API).
pub fn node_name(flag: Option<&str>) -> Result<String, KubeError> {
    flag.map(str::to_string)
        .or_else(|| std::env::var("NODE_NAME").ok())
        .filter(|n| !n.trim().is_empty())
        .ok_or(KubeError::NoNodeName)
}

/// A client to the API server, and the server's URL (every report of an unreachable or refusing
/// API names it).
#[derive(Clone)]
pub struct ApiClient {
    pub client: ::kube::Client,
    pub url: String,
}

/// A client from `kubeconfig` (the flag, else `KUBECONFIG`): a list of files merged as kubectl
/// does (empty entries and files that do not exist skipped, the first to set a value wins).
/// Without one (or with an empty list): `~/.kube/config`, else the in-cluster service account.
pub async fn client(kubeconfig: Option<&OsStr>) -> Result<ApiClient, KubeError> {
    client_config(kubeconfig, true).await
}

async fn client_config(kubeconfig: Option<&OsStr>, retry: bool) -> Result<ApiClient, KubeError> {
    let config = config(kubeconfig, retry).await?;
    let url = config.cluster_url.to_string();
    Ok(ApiClient {
        client: ::kube::Client::try_from(config)?,
        url,
    })
}

/// The configuration [`client`] builds its client from (for a stack of one's own).
pub async fn config(kubeconfig: Option<&OsStr>, retry: bool) -> Result<::kube::Config, KubeError> {
    config_in_context(kubeconfig, None, retry).await
}

/// [`config`] with kubectl's `--context`: that context of the kubeconfig (its cluster, user and
/// namespace) rather than the current one.
pub async fn config_in_context(
    kubeconfig: Option<&OsStr>,
    context: Option<&str>,
    retry: bool,
) -> Result<::kube::Config, KubeError> {
    use ::kube::config::{Config, KubeConfigOptions};
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let from_env = std::env::var_os("KUBECONFIG");
    let list = kubeconfig.or(from_env.as_deref());
    let mut config = match list.map(read_kubeconfigs).transpose()?.flatten() {
        Some((kc, shown)) => Config::from_custom_kubeconfig(kc, &options)
            .await
            .map_err(|e| KubeError::Config(format!("{shown}: {e}")))?,
        // kube's own lookup: `~/.kube/config` (it skips an empty `KUBECONFIG` too), then the
        // in-cluster service account.
        None if context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| KubeError::Config(e.to_string()))?,
        None => Config::infer()
            .await
            .map_err(|e| KubeError::Config(e.to_string()))?,
    };
    config.default_retry = retry;
    Ok(config)
}

/// What a failed API call means for the operator: the server, the cause, and what to check.
pub(crate) fn describe_api_error(e: &::kube::Error, url: &str) -> String {
    match e {
        ::kube::Error::Api(s) => describe_status(s.code, &s.reason, &s.message, url),
        other => format!(
            "{} cannot be reached ({}): check the kubeconfig's server, or the network to it",
            server(url),
            crate::model::chain(other)
        ),
    }
}

/// "the API server at <url>", or without a URL when none is known (tests).
fn server(url: &str) -> String {
    if url.is_empty() {
        "the API server".into()
    } else {
        format!("the API server at {url}")
    }
}

fn describe_status(code: u16, reason: &str, message: &str, url: &str) -> String {
    let server = server(url);
    match code {
        401 => format!("{server} refused the agent's credentials (401 {reason}: {message}): check the kubeconfig's user, or the service account's token"),
        403 => format!("{server} forbids it (403 {reason}: {message}): the agent's account needs get, list and watch on pods, patch on pods/status and create on events (deploy/'s ClusterRole)"),
        _ => format!("{server} answered {code} {reason}: {message}"),
    }
}

/// A failed request, described ([`describe_api_error`] for the client's own errors).
pub fn describe(e: &KubeError, url: &str) -> String {
    match e {
        KubeError::Client(k) => describe_api_error(k, url),
        other => other.to_string(),
    }
}

/// A failed list or watch of pods, described.
pub(crate) fn describe_watch_error(e: &::kube::runtime::watcher::Error, url: &str) -> String {
    use ::kube::runtime::watcher::Error as W;
    match e {
        W::InitialListFailed(k) | W::WatchStartFailed(k) | W::WatchFailed(k) => {
            describe_api_error(k, url)
        }
        W::WatchError(s) => describe_status(s.code, &s.reason, &s.message, url),
        W::NoResourceVersion => format!("{}: {e}", server(url)),
    }
}

/// The files of a kubeconfig list merged, and how to name them in errors; `None` when the list
/// names no file.
fn read_kubeconfigs(
    list: &OsStr,
) -> Result<Option<(::kube::config::Kubeconfig, String)>, KubeError> {
    use ::kube::config::Kubeconfig;
    let paths: Vec<PathBuf> = std::env::split_paths(list)
        .filter(|p| !p.as_os_str().is_empty())
        .collect();
    if paths.is_empty() {
        return Ok(None);
    }
    let shown = paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    let mut merged: Option<Kubeconfig> = None;
    for p in paths.iter().filter(|p| p.exists()) {
        let kc = Kubeconfig::read_from(p)
            .map_err(|e| KubeError::Config(format!("{}: {e}", p.display())))?;
        merged = Some(match merged {
            None => kc,
            Some(m) => m
                .merge(kc)
                .map_err(|e| KubeError::Config(format!("{}: {e}", p.display())))?,
        });
    }
    match merged {
        Some(kc) => Ok(Some((kc, shown))),
        None => Err(KubeError::Config(format!(
            "kubeconfig {shown}: no such file"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_name_flag_wins_and_blank_is_an_error() {
        assert_eq!(node_name(Some("n1")).unwrap(), "n1");
        assert!(matches!(node_name(Some(" ")), Err(KubeError::NoNodeName)));
    }

    fn kubeconfig_part(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[tokio::test]
    async fn kubeconfig_lists_are_merged_as_kubectl_does() {
        let dir = tempfile::tempdir().unwrap();
        let clusters = kubeconfig_part(
            dir.path(),
            "clusters",
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:6443\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\ncurrent-context: ctx\n",
        );
        let users = kubeconfig_part(
            dir.path(),
            "users",
            "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    token: t\ncurrent-context: other\n",
        );
        let list = std::env::join_paths([
            clusters.clone(),
            dir.path().join("absent"),
            PathBuf::new(),
            users,
        ])
        .unwrap();
        let api = client(Some(&list)).await.expect("merged");
        assert_eq!(api.url, "http://127.0.0.1:6443/");

        let e = client(Some(dir.path().join("absent").as_os_str()))
            .await
            .err()
            .expect("nothing to read")
            .to_string();
        assert!(e.contains("absent: no such file"), "{e}");
        let broken = kubeconfig_part(dir.path(), "broken", "clusters: [");
        let e = client(Some(&std::env::join_paths([clusters, broken]).unwrap()))
            .await
            .err()
            .expect("unparsable")
            .to_string();
        assert!(e.contains("broken: "), "{e}");
    }

    #[test]
    fn an_empty_kubeconfig_list_names_no_file() {
        assert!(read_kubeconfigs(OsStr::new("")).unwrap().is_none());
        assert!(read_kubeconfigs(OsStr::new("::")).unwrap().is_none());
    }

    #[test]
    fn failed_requests_name_the_server_and_say_each_cause_once() {
        let refused = KubeError::Client(::kube::Error::Api(Box::new(::kube::core::Status {
            code: 403,
            reason: "Forbidden".into(),
            message: "pods is forbidden".into(),
            ..Default::default()
        })));
        assert_eq!(
            describe(&refused, "https://10.0.0.1:6443"),
            "the API server at https://10.0.0.1:6443 forbids it (403 Forbidden: pods is forbidden): the agent's account needs get, list and watch on pods, patch on pods/status and create on events (deploy/'s ClusterRole)"
        );
        let timeout = KubeError::Timeout(Duration::from_secs(5));
        assert_eq!(
            describe(&timeout, ""),
            "no answer from the API server within 5s"
        );
    }
}
