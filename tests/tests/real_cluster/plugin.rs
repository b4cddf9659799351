//! The kubectl plugin on the real cluster: the real kubectl runs `kubectl observer explain POD`
//! (the release `observer` as `kubectl-observer` on PATH) with the token of a service account
//! bound to deploy/plugin-rbac.yaml's ClusterRole and nothing else; the plugin finds the pod's
//! node and the agent there, and the real API server's pod proxy brings back the agent's report
//! of an OOM kill. Without the role, and with only the built-in `view` role (pods but not
//! pods/proxy), the plugin fails naming the right it lacks.
//!
//! The pod proxy dials the agent's pod IP, and the API server refuses loopback pod IPs; the
//! test node's host-network agent has the node's address (this machine's own, so the traffic
//! stays on the machine). For this test only the agent listens on every address of the node
//! (deploy/'s own `0.0.0.0:9891`); it is set back to loopback afterwards.
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use observer_tests::cluster::{
    agent_exclusive, apply, condition, get_json, require_cluster, set_agent_env, test_guest,
    wait_pod, Cluster, Namespace, TestPod, AGENT_ADDR,
};
use observer_tests::prereq;
use serde_json::Value;

const KILLED: Duration = Duration::from_secs(120);

/// Sets the agent back to the overlay's loopback address when the test ends, passed or not.
struct ListenRestored<'a>(&'a Cluster);

impl Drop for ListenRestored<'_> {
    fn drop(&mut self) {
        if let Err(e) = set_agent_env(self.0, "OBSERVER_LISTEN", Some(AGENT_ADDR)) {
            eprintln!("restoring the agent's OBSERVER_LISTEN={AGENT_ADDR}: {e:#}");
        }
    }
}

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
        "contexts": [{"name": sa, "context": {"cluster": name, "user": sa}}],
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
fn kubectl_observer_explain_with_only_the_plugins_role() {
    let Some(c) = require_cluster() else { return };
    if let Some(g) = test_guest(c) {
        // The pod proxy would have the API server dial the guest's node address, which nothing
        // may ever be sent to (and which is only reachable inside qemu).
        eprintln!("not run on {}: the host node only", g.name);
        return;
    }
    let observer = match prereq::observer_release_binary() {
        Ok(b) => b,
        Err(e) => {
            prereq::require("the plugin test", &[e]);
            return;
        }
    };
    // The agent is restarted (its listen address) and must not be by another test meanwhile.
    let _agent = agent_exclusive();
    if let Err(e) = run(c, &observer) {
        panic!("{e:#}");
    }
}

fn run(c: &Cluster, observer: &Path) -> Result<()> {
    let ns = Namespace::new(c, "plugin")?;
    let plugins = tempfile::tempdir()?;
    std::os::unix::fs::symlink(observer, plugins.path().join("kubectl-observer"))?;

    let _restore = ListenRestored(c);
    set_agent_env(c, "OBSERVER_LISTEN", Some("0.0.0.0:9891"))?;

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

    // Three users: the plugin's role only, none, and the built-in `view` (pods, not pods/proxy).
    for sa in ["explainer", "nobody", "viewer"] {
        c.kubectl_ok(&["create", "serviceaccount", sa, "-n", &ns.name])?;
    }
    let bindings = [("explainer", "observer-explain"), ("viewer", "view")];
    for (sa, role) in bindings {
        apply(
            c,
            &serde_json::json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": format!("plugin-test-{sa}")},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns.name}],
            })
            .to_string(),
        )?;
    }
    let dir = tempfile::tempdir()?;
    let result = check(c, &ns.name, plugins.path(), dir.path()).and_then(|()| {
        set_agent_env(c, "OBSERVER_LISTEN", Some(AGENT_ADDR))?;
        unreachable(c, &ns.name, plugins.path(), dir.path())
    });
    for (sa, _) in bindings {
        let _ = c.kubectl_ok(&["delete", "clusterrolebinding", &format!("plugin-test-{sa}")]);
    }
    result
}

/// The agent back on loopback, where the pod proxy cannot reach it: the plugin says so at once
/// (the API server's 503 is not retried for minutes).
fn unreachable(c: &Cluster, ns: &str, plugins: &Path, dir: &Path) -> Result<()> {
    let explainer = dir.join("explainer.kubeconfig");
    let started = std::time::Instant::now();
    let (ok, out, err) = kubectl_observer(c, plugins, &explainer, &["explain", "oomer", "-n", ns])?;
    eprintln!("agent unreachable ({:?}): {err}", started.elapsed());
    if ok
        || !err.contains("through the API server's pod proxy")
        || !err.contains("connection refused")
    {
        bail!("an unreachable agent must be said: ok={ok}\n{out}{err}");
    }
    if started.elapsed() > Duration::from_secs(20) {
        bail!(
            "an unreachable agent took {:?} to be said",
            started.elapsed()
        );
    }
    Ok(())
}

fn check(c: &Cluster, ns: &str, plugins: &Path, dir: &Path) -> Result<()> {
    let explainer = kubeconfig_for(c, ns, "explainer", dir)?;
    let nobody = kubeconfig_for(c, ns, "nobody", dir)?;
    let viewer = kubeconfig_for(c, ns, "viewer", dir)?;

    // The role's rights, as the API server's authorizer says (the binding may take a moment to
    // reach the RBAC cache).
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
        || can(&["get", "pods/proxy", "-n", "observer-system"]).then_some(()),
    );
    if allowed.is_none() {
        bail!("{user} never got pods/proxy in observer-system");
    }
    if can(&["delete", "pods", "-n", ns]) || can(&["create", "pods/proxy", "-n", "observer-system"])
    {
        bail!("the plugin's role grants more than get/list pods and get pods/proxy");
    }

    let (ok, out, err) = kubectl_observer(c, plugins, &explainer, &["explain", "oomer", "-n", ns])?;
    eprintln!("kubectl observer explain oomer -n {ns}:\n{out}{err}");
    if !ok {
        bail!(
            "the plugin failed with the plugin's role: {err}\nagent log:\n{}",
            c.agent_log().unwrap_or_default()
        );
    }
    for want in [
        format!("Pod:        {ns}/oomer"),
        "OOM kill in main".to_string(),
        "(scope: container)".to_string(),
        "container main hit its 32.0 MiB limit".to_string(),
        "dd".to_string(),
    ] {
        if !out.contains(&want) {
            bail!("the plugin's output does not have {want:?}:\n{out}");
        }
    }
    let (ok, json, err) = kubectl_observer(
        c,
        plugins,
        &explainer,
        &["explain", "oomer", "main", "-n", ns, "-o", "json"],
    )?;
    let v: Value = serde_json::from_str(&json).map_err(|e| anyhow!("{e}: {json}{err}"))?;
    let kills = v["kills"].as_array().cloned().unwrap_or_default();
    if !ok
        || !kills
            .iter()
            .any(|k| k["container"] == "main" && k["scope"] == "container")
    {
        bail!("-o json has no container-scope kill of main: {v:#}");
    }

    // Without the role: refused at the first step, which the message names.
    let (ok, out, err) = kubectl_observer(c, plugins, &nobody, &["explain", "oomer", "-n", ns])?;
    eprintln!("without the role: {err}");
    if ok
        || !err.contains(&format!("not allowed to get pods in namespace {ns}"))
        || !err.contains("observer-explain")
    {
        bail!("without the role the plugin must fail naming `get pods`: ok={ok}\n{out}{err}");
    }
    // With `view`: the pods are readable, the proxy is not.
    let (ok, out, err) = kubectl_observer(c, plugins, &viewer, &["explain", "oomer", "-n", ns])?;
    eprintln!("with view only: {err}");
    if ok
        || !err.contains("not allowed to get pods/proxy in namespace observer-system")
        || !err.contains("observer-explain")
    {
        bail!("with view only the plugin must fail naming `get pods/proxy`: ok={ok}\n{out}{err}");
    }
    Ok(())
}
