//! `helm install` of deploy/chart on the real cluster, in place of the overlay's deploy/: the
//! real helm (helm.sh/helm/v4, built with the cluster's components) installs the chart from
//! nothing, the real scheduler and kubelet run its agent Ready on the test's node, the agent
//! writes its condition on a pod created after it, and `helm uninstall` takes every object away.
//! The overlay's agent is then put back exactly as the test found it, passed or failed.
//!
//! tests/tests/chart.rs proves, without a cluster, that the chart renders deploy/'s objects and,
//! with the values used here, the overlay's.
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use observer_tests::cluster::{
    agent_exclusive, agent_metrics, agent_pod, apply, busybox_pod, condition, emulated, get_json,
    require_cluster, test_node, wait_pod, Cluster, Namespace, AGENT_NAMESPACE, POLL,
};
use observer_tests::wait::poll_every;
use serde_json::{json, Value};

/// The release, and the namespace that keeps its record: the chart's objects name their own
/// namespace (observer-system, which the chart makes, Pod Security labels included).
const RELEASE: &str = "observer";
const RELEASE_NAMESPACE: &str = "default";

/// How long the agent may take to be Ready, and its condition to reach a pod: longer on a guest
/// node under software emulation.
fn deadline() -> Duration {
    Duration::from_secs(if emulated() { 600 } else { 180 })
}

fn ready(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running"
        && condition(pod, "Ready").is_some_and(|c| c["status"] == "True")
}

/// The overlay's DaemonSet's pod template spec, as the API server keeps it.
fn template_spec(c: &Cluster) -> Result<Value> {
    let ds = get_json(c, &["-n", AGENT_NAMESPACE, "get", "daemonset", "observer"])?;
    Ok(ds["spec"]["template"]["spec"].clone())
}

/// Waits until `kubectl get <kind> <name>` says NotFound (a namespace finishing its deletion).
fn wait_gone(c: &Cluster, kind: &str, name: &str) -> Result<()> {
    let mut last = String::new();
    poll_every(POLL, deadline(), || {
        match c.kubectl_ok(&["get", kind, name]) {
            Err(e) if e.to_string().contains("NotFound") => Some(()),
            Err(e) => {
                last = e.to_string();
                None
            }
            Ok(out) => {
                last = out;
                None
            }
        }
    })
    .ok_or_else(|| anyhow!("{kind} {name} still there after {:?}: {last}", deadline()))
}

/// The overlay's agent as the test found it, put back by [`OverlayRestored::restore`] at the
/// test's end, or when dropped if the test failed before: the release uninstalled, deploy/
/// applied through cluster/overlay, and the DaemonSet's pod template what it was (a value an
/// earlier test set with `kubectl set env` included), Ready again.
struct OverlayRestored<'a> {
    c: &'a Cluster,
    template: Value,
    done: bool,
}

impl OverlayRestored<'_> {
    fn restore(&mut self) -> Result<()> {
        self.done = true;
        let c = self.c;
        c.helm_ok(&[
            "uninstall",
            RELEASE,
            "--namespace",
            RELEASE_NAMESPACE,
            "--ignore-not-found",
        ])?;
        // The chart's namespace goes with the release, and the overlay's cannot be made while
        // it terminates; one the overlay made (the test failed before deleting it) stays.
        let mut last = Value::Null;
        poll_every(POLL, deadline(), || {
            match get_json(c, &["get", "namespace", AGENT_NAMESPACE]) {
                Err(e) if e.to_string().contains("NotFound") => Some(()),
                Err(_) => None,
                Ok(ns) => {
                    let overlays = ns["status"]["phase"] == "Active"
                        && ns["metadata"]["labels"]["app.kubernetes.io/managed-by"] != "Helm";
                    last = ns;
                    overlays.then_some(())
                }
            }
        })
        .ok_or_else(|| anyhow!("namespace {AGENT_NAMESPACE} is still the release's: {last}"))?;
        c.kubectl_ok(&["apply", "-k", &c.overlay().to_string_lossy()])?;
        c.wait_rollout()?;
        if template_spec(c)? != self.template {
            let patch =
                json!([{"op": "replace", "path": "/spec/template/spec", "value": self.template}]);
            c.kubectl_ok(&[
                "-n",
                AGENT_NAMESPACE,
                "patch",
                "daemonset",
                "observer",
                "--type",
                "json",
                "-p",
                &patch.to_string(),
            ])?;
            c.wait_rollout()?;
        }
        let now = template_spec(c)?;
        if now != self.template {
            bail!(
                "the overlay's DaemonSet is not as it was:\nbefore {}\nnow {now}",
                self.template
            );
        }
        poll_every(POLL, deadline(), || agent_pod(c).ok().filter(ready))
            .map(drop)
            .ok_or_else(|| anyhow!("the overlay's agent is not Ready again: {:?}", agent_pod(c)))
    }
}

impl Drop for OverlayRestored<'_> {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = self.restore() {
                eprintln!("restoring the overlay's agent after the helm test: {e:#}");
            }
        }
    }
}

#[test]
fn helm_install_runs_the_agent_and_uninstall_removes_it() {
    let Some(c) = require_cluster() else { return };
    // The agent is removed and replaced: no other test may use it meanwhile.
    let _agent = agent_exclusive();
    if let Err(e) = run(c) {
        panic!("{e:#}");
    }
}

fn run(c: &Cluster) -> Result<()> {
    // Built with the cluster's components (Cluster::up, cargo xtask cluster build).
    let helm = c.bin("helm");
    if !helm.is_file() {
        bail!("{} missing: cargo xtask cluster build", helm.display());
    }
    let mut restore = OverlayRestored {
        c,
        template: template_spec(c)?,
        done: false,
    };
    // Every object of the overlay's has a name the chart's has too, and Helm takes over no
    // object it did not make: all of them go, the namespace and the agent with it.
    let overlay = c.overlay();
    c.kubectl_ok(&[
        "delete",
        "-k",
        &overlay.to_string_lossy(),
        "--ignore-not-found",
        "--wait=false",
    ])?;
    // Its namespaced objects are gone once the namespace is.
    wait_gone(c, "namespace", AGENT_NAMESPACE)?;

    // The values: cluster/overlay/chart-values.yaml, what the overlay patches into deploy/ for
    // this machine, each said there: the host's network (the node has no CNI), the agent on
    // loopback (and so its probes' host), kubelet's cgroup roots of both kinds of node, the
    // node's containerd socket directory, a state directory apart from the host suites', the API
    // server on loopback. The image is the chart's default, localhost/observer:<appVersion>:
    // the name under which the fixture imported the release binary under test into each node's
    // containerd, the overlay's image too.
    c.helm_ok(&[
        "install",
        RELEASE,
        &c.chart().to_string_lossy(),
        "--namespace",
        RELEASE_NAMESPACE,
        "-f",
        &overlay.join("chart-values.yaml").to_string_lossy(),
    ])?;

    let status: Value = serde_json::from_str(&c.helm_ok(&[
        "status",
        RELEASE,
        "--namespace",
        RELEASE_NAMESPACE,
        "-o",
        "json",
    ])?)
    .context("helm status -o json")?;
    if status["info"]["status"] != "deployed" {
        bail!("the release is not deployed: {}", status["info"]);
    }
    let ds = get_json(c, &["-n", AGENT_NAMESPACE, "get", "daemonset", "observer"])?;
    if ds["metadata"]["labels"]["app.kubernetes.io/managed-by"] != "Helm"
        || ds["metadata"]["annotations"]["meta.helm.sh/release-name"] != RELEASE
    {
        bail!("the DaemonSet is not the release's: {}", ds["metadata"]);
    }

    // The chart's agent on the test's node: scheduled, started and Ready by kubelet's probes.
    let node = test_node();
    let pod = poll_every(POLL, deadline(), || agent_pod(c).ok().filter(ready))
        .ok_or_else(|| anyhow!("no Ready agent on {node}: {:?}", agent_pod(c)))?;
    let owner = &pod["metadata"]["ownerReferences"][0];
    if owner["kind"] != "DaemonSet" || owner["uid"] != ds["metadata"]["uid"] {
        bail!("the agent's pod is not the release's DaemonSet's: {owner}");
    }
    // It serves where the values say (loopback: the probes' host).
    let metrics = agent_metrics(c)?;
    if !metrics.contains("observer_") {
        bail!("the chart's agent's /metrics has no observer_ metric:\n{metrics}");
    }
    // And writes its condition on a pod made after it: the overlay's agent was gone by then.
    let ns = Namespace::new(c, "t-helm")?;
    apply(c, &busybox_pod("sleeper", &ns.name, "Always", "sleep 3600"))?;
    wait_pod(c, &ns.name, "sleeper", deadline(), |p| {
        condition(p, "observer.dev/ContainersAlive").is_some_and(|c| c["status"] == "True")
    })?;

    // Uninstalled: the release and every object it made are gone.
    c.helm_ok(&["uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE])?;
    wait_gone(c, "namespace", AGENT_NAMESPACE)?;
    for (kind, name) in [
        ("clusterrole", "observer"),
        ("clusterrole", "observer-explain"),
        ("clusterrolebinding", "observer"),
        ("validatingadmissionpolicy", "observer-own-node"),
        ("validatingadmissionpolicybinding", "observer-own-node"),
        ("validatingadmissionpolicy", "observer-status-mode"),
        ("validatingadmissionpolicybinding", "observer-status-mode"),
        ("priorityclass", "observer-node-agent"),
    ] {
        wait_gone(c, kind, name)?;
    }
    // helm v4's list shows releases of every state (v3's --all is gone).
    let list = c.helm_ok(&["list", "--namespace", RELEASE_NAMESPACE, "-q"])?;
    if list.lines().any(|l| l.trim() == RELEASE) {
        bail!("helm still lists the release after its uninstall: {list}");
    }
    restore.restore()
}
