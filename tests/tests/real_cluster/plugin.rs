//! The kubectl plugin and explain's access control on the real cluster: the real kubectl runs
//! `kubectl observer explain POD` (the release `observer` as `kubectl-observer` on PATH); the
//! plugin finds the pod's node and the agent there, and the real API server's pod proxy brings
//! back the agent's report of an OOM kill, which the agent gives only to a caller who may get
//! that pod (TokenReview and SubjectAccessReview by the real API server). Two users: `explainer`
//! may get pods in namespace A only (and has deploy/plugin-rbac.yaml's Role in the agents'
//! namespace), `nobody` has nothing. On every path (the plugin, the pod proxy asked directly,
//! the agent's port asked directly) the first reads A and is refused B, the second is refused
//! both, and a request without a token is refused. A third, `viewer`, may get pods in A but has
//! not the plugin's Role: the plugin names the Role it lacks.
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
    wait_pod, Cluster, Namespace, TestPod, AGENT_ADDR, AGENT_NAMESPACE,
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

    // Namespace B and a pod there that user A may not read.
    let other = Namespace::new(c, "plugin-b")?;
    apply(
        c,
        &TestPod::new("other", &other.name, "Never")
            .container("main", "exec sleep 3600")
            .manifest(),
    )?;
    wait_pod(c, &other.name, "other", KILLED, |p| {
        p["status"]["phase"] == "Running"
    })?;

    // `get pods` in A (the built-in `view` ClusterRole, bound in A only) for explainer and
    // viewer; the plugin's Role in the agents' namespace for explainer; nothing for nobody.
    for sa in ["explainer", "nobody", "viewer"] {
        c.kubectl_ok(&["create", "serviceaccount", sa, "-n", &ns.name])?;
    }
    let binding = |name: &str, in_ns: &str, kind: &str, role: &str, sa: &str| {
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": in_ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns.name}],
        })
        .to_string()
    };
    apply(
        c,
        &binding(
            "view-explainer",
            &ns.name,
            "ClusterRole",
            "view",
            "explainer",
        ),
    )?;
    apply(
        c,
        &binding("view-viewer", &ns.name, "ClusterRole", "view", "viewer"),
    )?;
    let plugin_binding = format!("plugin-test-{}", ns.name);
    apply(
        c,
        &binding(
            &plugin_binding,
            AGENT_NAMESPACE,
            "Role",
            "observer-explain",
            "explainer",
        ),
    )?;
    let dir = tempfile::tempdir()?;
    let result = check(c, &ns.name, &other.name, plugins.path(), dir.path()).and_then(|()| {
        set_agent_env(c, "OBSERVER_LISTEN", Some(AGENT_ADDR))?;
        unreachable(c, &ns.name, plugins.path(), dir.path())
    });
    let _ = c.kubectl_ok(&[
        "delete",
        "rolebinding",
        "-n",
        AGENT_NAMESPACE,
        &plugin_binding,
    ]);
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

/// `GET path` on the agent's port (the test node's agent, on every address for this test),
/// with `token` as a bearer token if given: (code, body).
fn agent_get(path: &str, token: Option<&str>) -> Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect("127.0.0.1:9891")?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(s, "GET {path} HTTP/1.0\r\nHost: agent\r\n{auth}\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("a status line")?;
    Ok((
        code,
        text.split_once("\r\n\r\n").map_or("", |b| b.1).to_string(),
    ))
}

/// `GET` through the API server's pod proxy to the agent's `/explain/<ns>/<pod>`, as the user of
/// `kubeconfig`, forwarding its token as the plugin does: (code, body).
fn proxy_get(kubeconfig: &Path, agent: &str, ns: &str, pod: &str) -> Result<(u16, String)> {
    let token = token_of(kubeconfig)?;
    let path = format!(
        "/api/v1/namespaces/{AGENT_NAMESPACE}/pods/{agent}:9891/proxy/explain/{ns}/{pod}?output=text"
    );
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        let client = kube::Client::try_from(config)?;
        let req = http::Request::get(path)
            .header("X-Observer-Authorization", format!("Bearer {token}"))
            .body(Vec::new())?;
        Ok(match client.request_text(req).await {
            Ok(body) => (200, body),
            Err(kube::Error::Api(s)) => (s.code, s.message),
            Err(e) => return Err(e.into()),
        })
    })
}

fn token_of(kubeconfig: &Path) -> Result<String> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(kubeconfig)?)?;
    Ok(v["users"][0]["user"]["token"]
        .as_str()
        .context("a token")?
        .to_string())
}

fn check(c: &Cluster, ns: &str, other: &str, plugins: &Path, dir: &Path) -> Result<()> {
    let explainer = kubeconfig_for(c, ns, "explainer", dir)?;
    let nobody = kubeconfig_for(c, ns, "nobody", dir)?;
    let viewer = kubeconfig_for(c, ns, "viewer", dir)?;

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
        || {
            // `pods/proxy` alone would read as the pod named "proxy".
            (can(&["get", "pods", "--subresource=proxy", "-n", AGENT_NAMESPACE])
                && can(&["get", "pods", "-n", ns]))
            .then_some(())
        },
    );
    if allowed.is_none() {
        bail!("{user} never got pods/proxy in {AGENT_NAMESPACE} and pods in {ns}");
    }
    if can(&["get", "pods", "-n", other])
        || can(&[
            "create",
            "pods",
            "--subresource=proxy",
            "-n",
            AGENT_NAMESPACE,
        ])
        || can(&["get", "pods", "--subresource=proxy", "-n", ns])
    {
        bail!("the test's bindings grant more than pods in {ns} and the plugin's Role");
    }

    // User A, the plugin, namespace A: the report.
    let (ok, out, err) = kubectl_observer(c, plugins, &explainer, &["explain", "oomer", "-n", ns])?;
    eprintln!("kubectl observer explain oomer -n {ns}:\n{out}{err}");
    if !ok {
        bail!(
            "the plugin failed for a user who may get the pod: {err}\nagent log:\n{}",
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
    // User A, the plugin, namespace B: refused by the API server at the pod.
    let (ok, out, err) =
        kubectl_observer(c, plugins, &explainer, &["explain", "other", "-n", other])?;
    if ok || !err.contains(&format!("not allowed to get pods in namespace {other}")) {
        bail!("user A read namespace B through the plugin: ok={ok}\n{out}{err}");
    }

    // The pod proxy and the agent's port asked directly, where the API server's check of the
    // pod is not made: the agent's own check is all there is.
    let agent = get_json(
        c,
        &[
            "get",
            "pods",
            "-n",
            AGENT_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=observer",
            "--field-selector",
            &format!("spec.nodeName={}", observer_tests::cluster::NODE_NAME),
        ],
    )?["items"][0]["metadata"]["name"]
        .as_str()
        .context("the agent's pod")?
        .to_string();
    let a = token_of(&explainer)?;
    let none = token_of(&nobody)?;
    let (code, body) = proxy_get(&explainer, &agent, ns, "oomer")?;
    if code != 200 || !body.contains("OOM kill in main") {
        bail!("user A through the pod proxy, namespace A: {code} {body}");
    }
    let (code, body) = proxy_get(&explainer, &agent, other, "other")?;
    eprintln!("user A through the pod proxy, namespace B: {code} {body}");
    if code != 403 || !body.contains(&format!("may not get pod {other}/other")) {
        bail!("user A through the pod proxy read namespace B: {code} {body}");
    }
    // Nobody has not even the proxy: the API server refuses.
    let (code, body) = proxy_get(&nobody, &agent, ns, "oomer")?;
    if code != 403 || !body.contains("pods/proxy") {
        bail!("nobody through the pod proxy: {code} {body}");
    }
    let (code, body) = agent_get(&format!("/explain/{ns}/oomer?output=text"), Some(&a))?;
    if code != 200 || !body.contains("OOM kill in main") {
        bail!("user A at the agent's port, namespace A: {code} {body}");
    }
    for (who, token, target_ns, pod) in [
        ("user A", &a, other, "other"),
        ("nobody", &none, ns, "oomer"),
        ("nobody", &none, other, "other"),
    ] {
        let (code, body) = agent_get(&format!("/explain/{target_ns}/{pod}"), Some(token))?;
        eprintln!("{who} at the agent's port, {target_ns}/{pod}: {code} {body}");
        if code != 403 || !body.contains(&format!("may not get pod {target_ns}/{pod}")) {
            bail!("{who} at the agent's port read {target_ns}/{pod}: {code} {body}");
        }
    }
    // No token, a forged one: 401, whether the pod exists or not.
    for pod in ["oomer", "no-such-pod"] {
        let (code, body) = agent_get(&format!("/explain/{ns}/{pod}"), None)?;
        if code != 401 {
            bail!("no token at the agent's port, {pod}: {code} {body}");
        }
        let (code, body) = agent_get(&format!("/explain/{ns}/{pod}"), Some("forged"))?;
        if code != 401 || !body.contains("does not accept the token") {
            bail!("a forged token at the agent's port, {pod}: {code} {body}");
        }
    }
    // The metrics stay open (deploy/'s OBSERVER_METRICS_ACCESS), the checks counted there.
    let (code, metrics) = agent_get("/metrics", None)?;
    let forbidden = observer_tests::endpoint::sample(
        &metrics,
        r#"observer_http_access_checks_total{endpoint="explain",result="forbidden"}"#,
    );
    if code != 200 || forbidden.is_none_or(|n| n < 4.0) {
        bail!("/metrics: {code}, explain's forbidden checks {forbidden:?}");
    }

    // Nobody, the plugin: refused at the first step, which the message names.
    let (ok, out, err) = kubectl_observer(c, plugins, &nobody, &["explain", "oomer", "-n", ns])?;
    eprintln!("without rights: {err}");
    if ok
        || !err.contains(&format!("not allowed to get pods in namespace {ns}"))
        || !err.contains("observer-explain")
    {
        bail!("without rights the plugin must fail naming `get pods`: ok={ok}\n{out}{err}");
    }
    // With `view` in A but not the plugin's Role: the pods are readable, the agents are not.
    let (ok, out, err) = kubectl_observer(c, plugins, &viewer, &["explain", "oomer", "-n", ns])?;
    eprintln!("with view only: {err}");
    if ok
        || !err.contains(&format!(
            "not allowed to list pods in namespace {AGENT_NAMESPACE}"
        ))
        || !err.contains("Role observer-explain")
    {
        bail!("with view only the plugin must fail naming the plugin's Role: ok={ok}\n{out}{err}");
    }
    Ok(())
}
