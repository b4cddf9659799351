//! What an operator is told when an input is wrong: `observer run` against an absent runtime and an
//! API that refuses its credentials, a second agent on the same state directory, a misspelt log
//! filter. Each answer is read as the operator reads it: the log lines and `/readyz`.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{net::SocketAddr, process::Command, time::Duration};

use anyhow::{Context, Result};
use observer_tests::{
    apiserver::ApiStandIn, endpoint::http_get, kernel::require_kernel, observer_bin,
    poll_until_async, process::ObserverProcess,
};

/// The answers must come within this (issue 19: "within 5 s").
const SAID_WITHIN: Duration = Duration::from_secs(5);

#[test]
fn a_log_filter_that_would_suppress_everything_is_refused() {
    for (filter, says) in [
        ("debgu", "--log / OBSERVER_LOG \"debgu\": \"debgu\" is neither a level nor target=level, and would suppress every log line: a level is one of error, warn, info, debug, trace or off; one target's level is written observer=debug"),
        ("observer:debug", "did you mean observer=debug?"),
    ] {
        let out = Command::new(observer_bin())
            .args(["status"])
            .env("OBSERVER_LOG", filter)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{filter} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{filter}: {err}");
    }
}

#[test]
fn a_condition_prefix_the_api_would_refuse_is_refused_at_start() {
    let out = Command::new(observer_bin())
        .args(["run", "--condition-prefix", "bad prefix!!"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("condition prefix \"bad prefix!!\" is not a DNS subdomain"),
        "{err}"
    );
}

/// The bound address from the agent's `agent running listen=…` line.
fn bound(agent: &ObserverProcess) -> Option<SocketAddr> {
    agent.stderr().lines().find_map(|l| {
        l.contains("agent running")
            .then(|| {
                l.split_once("listen=")?
                    .1
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .flatten()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_says_what_is_wrong_and_guards_its_state() -> Result<()> {
    if !require_kernel() {
        return Ok(());
    }
    observer_tests::init_tracing();
    let api = ApiStandIn::start().await?;
    api.refuse(Some(401));
    let kubeconfig = api.kubeconfig()?;
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("absent.sock");
    let state = dir.path().join("state");
    let args = [
        "run",
        "--kubeconfig",
        kubeconfig.to_str().context("path")?,
        "--node-name",
        "node-1",
        "--cri-endpoint",
        socket.to_str().context("path")?,
        // A stand-in API reviews no tokens: the scrapes here are on loopback.
        "--metrics-access",
        "open",
        "--listen",
        "127.0.0.1:0",
        "--state-dir",
        state.to_str().context("path")?,
    ];
    let first = ObserverProcess::spawn(&args)?;
    let listen = poll_until_async(Duration::from_secs(60), || bound(&first))
        .await
        .with_context(|| format!("no bound address said:\n{}", first.stderr()))?;
    assert_ne!(listen.port(), 0);

    let runtime = format!(
        "CRI socket {} does not exist; is the runtime running, and is --cri-endpoint (OBSERVER_CRI_ENDPOINT) its socket? containerd: /run/containerd/containerd.sock, CRI-O: /var/run/crio/crio.sock",
        socket.display()
    );
    let refused = format!(
        "the API server at {}/ refused the agent's credentials (401 Unauthorized: refused by the stand-in): check the kubeconfig's user, or the service account's token",
        api.url()
    );
    let said = poll_until_async(SAID_WITHIN, || {
        let log = first.stderr();
        (log.contains(&format!(
            "WARN CRI runtime not reachable: {runtime}; retrying"
        )) && log.contains(&format!(
            "WARN listing this node's pods failed: {refused}; retrying"
        )))
        .then_some(())
    })
    .await;
    assert!(
        said.is_some(),
        "not said within {SAID_WITHIN:?}:\n{}",
        first.stderr()
    );
    let (code, body) = http_get(listen, "/readyz").context("/readyz answers")?;
    assert_eq!(
        (code, body),
        (
            503,
            format!(
                "the first sync with the runtime is not done: {runtime}\nthe API's first list of this node's pods has not succeeded: {refused}\n"
            )
        )
    );
    assert_eq!(http_get(listen, "/healthz"), Some((200, "ok\n".into())));

    // A second agent on the same state directory is refused, naming the first.
    let second = Command::new(observer_bin()).args(args).output()?;
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains(&format!(
            "the state directory {} is held by another observer (pid {})",
            state.display(),
            first.pid()
        )),
        "{err}"
    );
    assert!(
        first.stderr().lines().all(|l| !l.contains("ERROR")),
        "{}",
        first.stderr()
    );
    Ok(())
}
