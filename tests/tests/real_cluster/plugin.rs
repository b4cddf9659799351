//! The kubectl plugin and who may read what the agents saw, on the real cluster: the real
//! kubectl runs `kubectl observer explain POD` and `kubectl observer status` (the release
//! `observer` as `kubectl-observer` on PATH), which read the pods' PodReports through the API
//! server with the user's own rights. Two users: `explainer` has `view` in namespace A (into
//! which deploy/'s observer-reports-reader is aggregated), `nobody` has nothing: the first reads
//! A's report of an OOM kill and is refused B's, the second is refused both, each refusal by the
//! API server naming the right. While the plugin runs, a capture on the agent's port shows no
//! credential of anyone's: the plugin never reaches an agent.
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use observer_tests::cluster::{
    agent_exclusive, apply, condition, get_json, require_cluster, test_guest, wait_pod, Cluster,
    Namespace, TestPod, AGENT_ADDR,
};
use observer_tests::prereq;
use serde_json::Value;

const KILLED: Duration = Duration::from_secs(120);

/// A kubeconfig for service account `sa` of `namespace`: the admin kubeconfig's cluster (the
/// API server on 127.0.0.1 and its CA) with a token from `kubectl create token`.
fn kubeconfig_for(
    c: &Cluster,
    namespace: &str,
    sa: &str,
    dir: &Path,
) -> Result<std::path::PathBuf> {
    let admin = get_json(c, &["config", "view", "--raw", "--minify", "--flatten"])?;
    let cluster = admin["clusters"][0].clone();
    let name = cluster["name"]
        .as_str()
        .context("a cluster name")?
        .to_string();
    let token = c
        .kubectl_ok(&["create", "token", sa, "-n", namespace, "--duration=10m"])?
        .trim()
        .to_string();
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": sa, "user": {"token": token}}],
        // Its namespace is the context's: the plugin takes it when -n is not given.
        "contexts": [{"name": sa, "context": {"cluster": name, "user": sa, "namespace": namespace}}],
        "current-context": sa,
    });
    let path = dir.join(format!("{sa}.kubeconfig"));
    std::fs::write(&path, serde_json::to_string_pretty(&config)?)?;
    Ok(path)
}

/// `kubectl observer <args>` as the user of `kubeconfig`, with `plugins` first on PATH:
/// (success, stdout, stderr).
fn kubectl_observer(
    c: &Cluster,
    plugins: &Path,
    kubeconfig: &Path,
    args: &[&str],
) -> Result<(bool, String, String)> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let path = std::env::join_paths(
        std::iter::once(plugins.to_path_buf()).chain(std::env::split_paths(&path)),
    )?;
    let out = std::process::Command::new(c.bin("kubectl"))
        .arg("observer")
        .args(args)
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .context("running kubectl")?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[test]
fn kubectl_observer_reads_reports_with_the_users_own_rights() {
    let Some(c) = require_cluster() else { return };
    let observer = match prereq::observer_release_binary() {
        Ok(b) => b,
        Err(e) => {
            prereq::require("the plugin test", &[e]);
            return;
        }
    };
    // No other test scrapes the agent meanwhile: the capture on its port is the plugin's alone.
    let _agent = agent_exclusive();
    if let Err(e) = run(c, &observer) {
        panic!("{e:#}");
    }
}

fn run(c: &Cluster, observer: &Path) -> Result<()> {
    let ns = Namespace::new(c, "plugin")?;
    let plugins = tempfile::tempdir()?;
    std::os::unix::fs::symlink(observer, plugins.path().join("kubectl-observer"))?;

    // dd's 64 MiB buffer in a 32 MiB container: the init is OOM-killed at its container's limit.
    // The second container has no limit, so kubelet sets none on the pod's cgroup: alone, main's
    // 32 MiB would be the pod cgroup's limit too, and the sandbox's memory charged there makes
    // the pod's limit the one hit (the agent then rightly says scope pod).
    apply(
        c,
        &TestPod::new("oomer", &ns.name, "Never")
            .limited(
                "main",
                "exec dd if=/dev/zero of=/dev/null bs=64M count=1",
                "32Mi",
            )
            .container("idle", "exec sleep 3600")
            .manifest(),
    )?;
    wait_pod(c, &ns.name, "oomer", KILLED, |p| {
        condition(p, "observer.dev/OOMKilled").is_some_and(|c| c["status"] == "True")
    })?;

    // Namespace B and a pod there with a death to report, which user A may not read.
    let other = Namespace::new(c, "plugin-b")?;
    apply(
        c,
        &TestPod::new("other", &other.name, "Never")
            .container("main", "exit 3")
            .manifest(),
    )?;
    wait_pod(c, &other.name, "other", KILLED, |p| {
        p["status"]["phase"] == "Failed"
    })?;
    // Each pod's report, as the admin sees it, written by its node's agent.
    for (n, pod) in [(&ns.name, "oomer"), (&other.name, "other")] {
        let report = observer_tests::wait::poll_every(Duration::from_millis(250), KILLED, || {
            get_json(c, &["get", "podreport", pod, "-n", n]).ok()
        })
        .with_context(|| format!("no PodReport of {n}/{pod}"))?;
        let uid = get_json(c, &["get", "pod", pod, "-n", n])?["metadata"]["uid"].clone();
        if report["podUID"] != uid || report["metadata"]["ownerReferences"][0]["uid"] != uid {
            bail!("the report of {n}/{pod} is not owned by it: {report:#}");
        }
    }

    // `view` in A (observer-reports-reader aggregated into it) for explainer; nothing for
    // nobody.
    for sa in ["explainer", "nobody"] {
        c.kubectl_ok(&["create", "serviceaccount", sa, "-n", &ns.name])?;
    }
    apply(
        c,
        &serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "view-explainer", "namespace": ns.name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "ServiceAccount", "name": "explainer", "namespace": ns.name}],
        })
        .to_string(),
    )?;
    let dir = tempfile::tempdir()?;
    check(c, &ns.name, &other.name, plugins.path(), dir.path())
}

/// Captures the agent's port on loopback (the host node's agent serves there) while `f` runs:
/// the bytes that crossed it.
fn captured_on_agent_port<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, Vec<u8>)> {
    let (_, port) = AGENT_ADDR.rsplit_once(':').context("a port")?;
    let dir = tempfile::tempdir()?;
    let pcap = dir.path().join("agent-port.pcap");
    let mut tcpdump = std::process::Command::new("tcpdump")
        .args(["-i", "lo", "-U", "-s", "0", "-w"])
        .arg(&pcap)
        .args(["tcp", "port", port])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("tcpdump (scripts/bootstrap.sh installs it)")?;
    // tcpdump says "listening on lo" once it captures.
    let mut stderr = tcpdump.stderr.take().context("tcpdump's stderr")?;
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("listening on") {
        use std::io::Read;
        let n = stderr.read(&mut buf)?;
        if n == 0 {
            bail!("tcpdump ended: {}", String::from_utf8_lossy(&seen));
        }
        seen.extend_from_slice(&buf[..n]);
    }
    let r = f();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(tcpdump.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )?;
    tcpdump.wait()?;
    Ok((r?, std::fs::read(&pcap)?))
}

fn check(c: &Cluster, ns: &str, other: &str, plugins: &Path, dir: &Path) -> Result<()> {
    let explainer = kubeconfig_for(c, ns, "explainer", dir)?;
    let nobody = kubeconfig_for(c, ns, "nobody", dir)?;

    // The rights, as the API server's authorizer says (a binding may take a moment to reach the
    // RBAC cache).
    let user = format!("system:serviceaccount:{ns}:explainer");
    let can = |args: &[&str]| {
        let mut all = vec!["auth", "can-i"];
        all.extend_from_slice(args);
        all.extend(["--as", &user]);
        c.kubectl_ok(&all).is_ok_and(|o| o.trim() == "yes")
    };
    let allowed = observer_tests::wait::poll_every(
        Duration::from_millis(200),
        Duration::from_secs(30),
        || can(&["get", "podreports.observer.dev", "-n", ns]).then_some(()),
    );
    if allowed.is_none() {
        bail!("{user} never got podreports in {ns} through view");
    }
    if can(&["get", "podreports.observer.dev", "-n", other])
        || can(&["create", "podreports.observer.dev", "-n", ns])
    {
        bail!("the test's binding grants more than reading reports in {ns}");
    }

    // User A, the plugin, namespace A (the context's: no -n), under capture on the agent's port.
    let host = test_guest(c).is_none();
    let explain = || kubectl_observer(c, plugins, &explainer, &["explain", "oomer"]);
    let ((ok, out, err), pcap) = if host {
        captured_on_agent_port(explain)?
    } else {
        (explain()?, Vec::new())
    };
    eprintln!("kubectl observer explain oomer (namespace {ns} from the context):\n{out}{err}");
    if !ok {
        bail!(
            "the plugin failed for a user who may read the report: {err}\nagent log:\n{}",
            c.agent_log().unwrap_or_default()
        );
    }
    for want in [
        format!("Pod:        {ns}/oomer"),
        "OOM kill in main".to_string(),
        "(scope: container)".to_string(),
        "container main hit its 32.0 MiB limit".to_string(),
        "dd".to_string(),
        "Reported by: the observer agent of node".to_string(),
    ] {
        if !out.contains(&want) {
            bail!("the plugin's output does not have {want:?}:\n{out}");
        }
    }
    if host {
        let token = token_of(&explainer)?;
        let text = String::from_utf8_lossy(&pcap);
        eprintln!(
            "capture on the agent's port while the plugin ran: {} bytes",
            pcap.len()
        );
        for secret in ["Bearer", "X-Observer-Authorization", token.as_str()] {
            if text.contains(secret) {
                bail!("the capture on the agent's port holds {secret:?}");
            }
        }
    }
    let (ok, json, err) = kubectl_observer(
        c,
        plugins,
        &explainer,
        &["explain", "oomer", "main", "-n", ns, "-o", "json"],
    )?;
    let v: Value = serde_json::from_str(&json).map_err(|e| anyhow!("{e}: {json}{err}"))?;
    let kills = v["explanation"]["kills"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !ok
        || !kills
            .iter()
            .any(|k| k["container"] == "main" && k["scope"] == "container")
        || v["summary"]["oomKills"].as_u64() < Some(1)
    {
        bail!("-o json has no container-scope kill of main: {v:#}");
    }
    let (ok, table, err) = kubectl_observer(c, plugins, &explainer, &["status"])?;
    eprintln!("kubectl observer status:\n{table}{err}");
    if !ok
        || !table
            .lines()
            .any(|l| l.starts_with("oomer ") && l.contains("OOM kill of"))
    {
        bail!("status has no line for oomer's kill: ok={ok}\n{table}{err}");
    }
    // User A, namespace B, and across every namespace: refused by the API server.
    let (ok, out, err) =
        kubectl_observer(c, plugins, &explainer, &["explain", "other", "-n", other])?;
    if ok
        || !err.contains(&format!(
            "not allowed to get podreports in namespace {other}"
        ))
    {
        bail!("user A read namespace B through the plugin: ok={ok}\n{out}{err}");
    }
    let (ok, out, err) = kubectl_observer(c, plugins, &explainer, &["status", "-A"])?;
    if ok || !err.contains("not allowed to list podreports at the cluster scope") {
        bail!("user A listed every namespace's reports: ok={ok}\n{out}{err}");
    }
    // Nobody: refused in A and in B, the message naming the right.
    for target in [ns, other] {
        let pod = if target == ns { "oomer" } else { "other" };
        let (ok, out, err) =
            kubectl_observer(c, plugins, &nobody, &["explain", pod, "-n", target])?;
        eprintln!("without rights, {target}: {err}");
        if ok
            || !err.contains(&format!(
                "not allowed to get podreports in namespace {target}"
            ))
            || !err.contains("observer-reports-reader")
        {
            bail!("without rights the plugin must fail naming the right: ok={ok}\n{out}{err}");
        }
    }
    Ok(())
}

fn token_of(kubeconfig: &Path) -> Result<String> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(kubeconfig)?)?;
    Ok(v["users"][0]["user"]["token"]
        .as_str()
        .context("a token")?
        .to_string())
}
