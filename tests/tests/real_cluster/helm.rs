//! `helm install` of deploy/chart on the real cluster, in place of the overlay's deploy/: the
//! real helm (helm.sh/helm/v4, built with the cluster's components) installs the chart from
//! nothing into the release's namespace (`--create-namespace`), the real scheduler and kubelet
//! run its agent Ready on the test's node, and the agent writes its condition on a pod created
//! after it. Then `helm upgrade --set statusMode=audit`: the mode's ConfigMap and its admission
//! policy say audit at once, the ConfigMap's checksum on the pod template rolls the agent, and
//! the new agent runs in audit (a dead pod gets its PodReport and no condition of the agent's).
//! `helm uninstall` takes every object of the release away but the PodReport CRD, which the
//! chart keeps. The overlay's agent is then put back exactly as the test found it, passed or
//! failed.
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

/// The release, in the agents' namespace: named as the chart, its objects keep deploy/'s names
/// (the DaemonSet observer, the policy observer-status-mode), which the harness looks for.
const RELEASE: &str = "observer";
const CRD: &str = "podreports.observer.dev";

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

/// Waits until `kubectl get <args>` says NotFound (an object finishing its deletion).
fn wait_gone(c: &Cluster, args: &[&str]) -> Result<()> {
    let mut last = String::new();
    let mut all = vec!["get"];
    all.extend(args);
    poll_every(POLL, deadline(), || match c.kubectl_ok(&all) {
        Err(e) if e.to_string().contains("NotFound") => Some(()),
        Err(e) => {
            last = e.to_string();
            None
        }
        Ok(out) => {
            last = out;
            None
        }
    })
    .ok_or_else(|| anyhow!("{args:?} still there after {:?}: {last}", deadline()))
}

/// Waits until no pod of the release is left, terminating ones included: the overlay's agent
/// listens on the same host address and port.
fn wait_release_pods_gone(c: &Cluster) -> Result<()> {
    let selector = format!("app.kubernetes.io/instance={RELEASE}");
    let mut last = Value::Null;
    poll_every(POLL, deadline(), || {
        let pods = get_json(c, &["-n", AGENT_NAMESPACE, "get", "pods", "-l", &selector]).ok()?;
        let none = pods["items"].as_array().is_some_and(Vec::is_empty);
        last = pods;
        none.then_some(())
    })
    .ok_or_else(|| anyhow!("the release's agents are still there: {last}"))
}

/// The text between the first two quotes of a variable of the mode's admission policy: what
/// the chart wrote there (`'audit'`, `'observer.dev' + '/'`).
fn policy_literal(c: &Cluster, variable: &str) -> Result<String> {
    let p = get_json(
        c,
        &["get", "validatingadmissionpolicy", "observer-status-mode"],
    )?;
    let expr = p["spec"]["variables"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == variable))
        .and_then(|v| v["expression"].as_str())
        .with_context(|| format!("the policy's {variable} variable: {p}"))?;
    Ok(expr.split('\'').nth(1).unwrap_or_default().to_string())
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
            AGENT_NAMESPACE,
            "--ignore-not-found",
        ])?;
        wait_release_pods_gone(c)?;
        // The namespace (made by --create-namespace, not the release's) and the kept CRD are
        // taken over by the overlay's apply.
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
fn helm_install_upgrade_and_uninstall_run_the_agent_as_the_values_say() {
    let Some(c) = require_cluster() else { return };
    // The agent is removed and replaced: no other test may use it meanwhile.
    let _agent = agent_exclusive();
    if let Err(e) = run(c) {
        panic!("{e:#}");
    }
}

/// The release's status as `helm status -o json` says it, and its revision.
fn release_status(c: &Cluster) -> Result<(String, u64)> {
    let status: Value = serde_json::from_str(&c.helm_ok(&[
        "status",
        RELEASE,
        "--namespace",
        AGENT_NAMESPACE,
        "-o",
        "json",
    ])?)
    .context("helm status -o json")?;
    Ok((
        status["info"]["status"].as_str().unwrap_or_default().into(),
        status["version"].as_u64().unwrap_or_default(),
    ))
}

/// The Ready agent on the test's node, owned by the release's DaemonSet.
fn release_agent(c: &Cluster, ds: &Value) -> Result<Value> {
    let node = test_node();
    let pod = poll_every(POLL, deadline(), || agent_pod(c).ok().filter(ready))
        .ok_or_else(|| anyhow!("no Ready agent on {node}: {:?}", agent_pod(c)))?;
    let owner = &pod["metadata"]["ownerReferences"][0];
    if owner["kind"] != "DaemonSet" || owner["uid"] != ds["metadata"]["uid"] {
        bail!("the agent's pod is not the release's DaemonSet's: {owner}");
    }
    Ok(pod)
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
    // object it did not make: all of them go, the namespace, the CRD and the agent with them.
    let overlay = c.overlay();
    c.kubectl_ok(&[
        "delete",
        "-k",
        &overlay.to_string_lossy(),
        "--ignore-not-found",
        "--wait=false",
    ])?;
    // Its namespaced objects are gone once the namespace is; the CRD once its reports are.
    wait_gone(c, &["namespace", AGENT_NAMESPACE])?;
    wait_gone(c, &["customresourcedefinition", CRD])?;

    // The values: cluster/overlay/chart-values.yaml, what the overlay patches into deploy/ for
    // this machine, each said there: the host's network (the node has no CNI), the agent on
    // loopback (and so its probes' host), kubelet's cgroup roots of both kinds of node, the
    // node's containerd socket, a state directory apart from the host suites', the API server
    // on loopback. The image is the chart's default, localhost/observer:<appVersion>: the name
    // under which the fixture imported the release binary under test into each node's
    // containerd, the overlay's image too.
    let values = overlay.join("chart-values.yaml");
    let values = values.to_string_lossy();
    let chart = c.chart();
    let chart = chart.to_string_lossy();
    c.helm_ok(&[
        "install",
        RELEASE,
        &chart,
        "--namespace",
        AGENT_NAMESPACE,
        "--create-namespace",
        "-f",
        &values,
    ])?;
    let (status, revision) = release_status(c)?;
    if status != "deployed" || revision != 1 {
        bail!("the release is not deployed: {status}, revision {revision}");
    }
    let ds = get_json(c, &["-n", AGENT_NAMESPACE, "get", "daemonset", "observer"])?;
    if ds["metadata"]["labels"]["app.kubernetes.io/managed-by"] != "Helm"
        || ds["metadata"]["annotations"]["meta.helm.sh/release-name"] != RELEASE
        || ds["metadata"]["annotations"]["meta.helm.sh/release-namespace"] != AGENT_NAMESPACE
    {
        bail!("the DaemonSet is not the release's: {}", ds["metadata"]);
    }

    // The chart's agent on the test's node: scheduled, started and Ready by kubelet's probes.
    let before = release_agent(c, &ds)?;
    // It serves where the values say (loopback: the probes' host), to the scrapers' account
    // bound to the chart's observer-metrics-reader.
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

    // helm upgrade to audit: the ConfigMap and the policy at once, the agents by their rollout.
    let checksum = |ds: &Value| {
        ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    c.helm_ok(&[
        "upgrade",
        RELEASE,
        &chart,
        "--namespace",
        AGENT_NAMESPACE,
        "-f",
        &values,
        "--set",
        "statusMode=audit",
    ])?;
    let (status, revision) = release_status(c)?;
    if status != "deployed" || revision != 2 {
        bail!("the upgrade is not deployed: {status}, revision {revision}");
    }
    let cm = get_json(c, &["-n", AGENT_NAMESPACE, "get", "configmap", "observer"])?;
    if cm["data"]["statusMode"] != "audit" {
        bail!("the mode's ConfigMap after the upgrade: {}", cm["data"]);
    }
    let mode = policy_literal(c, "mode")?;
    let prefix = policy_literal(c, "prefix")?;
    if (mode.as_str(), prefix.as_str()) != ("audit", "observer.dev") {
        bail!("the policy observer-status-mode says mode {mode:?}, prefix {prefix:?}");
    }
    let upgraded = get_json(c, &["-n", AGENT_NAMESPACE, "get", "daemonset", "observer"])?;
    if checksum(&upgraded).is_empty() || checksum(&upgraded) == checksum(&ds) {
        bail!(
            "the pod template's checksum did not change with the mode: {} then {}",
            checksum(&ds),
            checksum(&upgraded)
        );
    }
    // The rollout replaced the agent: a new pod, Ready, whose environment reads audit.
    c.wait_rollout()?;
    let after = release_agent(c, &upgraded)?;
    if after["metadata"]["uid"] == before["metadata"]["uid"] {
        bail!("the agent was not restarted by the mode's change");
    }
    // The new agent runs in audit: a pod's death is told (its PodReport, written by this node's
    // agent) and no condition of the agent's is written (in conditions mode ContainersAlive
    // would be on the pod from its start, long before the report).
    apply(
        c,
        &busybox_pod("dier", &ns.name, "Never", "sleep 2; exit 3"),
    )?;
    let node = test_node();
    let report = poll_every(POLL, deadline(), || {
        get_json(c, &["-n", &ns.name, "get", "podreport", "dier"])
            .ok()
            .filter(|r| r["summary"]["deaths"].as_u64().is_some_and(|d| d >= 1))
    })
    .with_context(|| format!("no PodReport of {}/dier with its death", ns.name))?;
    if report["nodeName"] != node.as_str() {
        bail!("the report of dier is not {node}'s agent's: {report:#}");
    }
    let dier = get_json(c, &["-n", &ns.name, "get", "pod", "dier"])?;
    let written: Vec<&Value> = dier["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| {
            c["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("observer.dev/"))
        })
        .collect();
    if !written.is_empty() {
        bail!("an agent in audit mode wrote conditions on dier: {written:?}");
    }

    // Uninstalled: the release and every object it made are gone, but the CRD (kept) and the
    // namespace (--create-namespace's, not the release's).
    c.helm_ok(&["uninstall", RELEASE, "--namespace", AGENT_NAMESPACE])?;
    for kind in [
        "daemonset",
        "configmap",
        "service",
        "serviceaccount",
        "networkpolicy",
    ] {
        wait_gone(c, &["-n", AGENT_NAMESPACE, kind, "observer"])?;
    }
    for (kind, name) in [
        ("clusterrole", "observer"),
        ("clusterrole", "observer-reports-reader"),
        ("clusterrole", "observer-metrics-reader"),
        ("clusterrolebinding", "observer"),
        ("validatingadmissionpolicy", "observer-own-node"),
        ("validatingadmissionpolicybinding", "observer-own-node"),
        ("validatingadmissionpolicy", "observer-status-mode"),
        ("validatingadmissionpolicybinding", "observer-status-mode"),
        ("priorityclass", "observer-node-agent"),
    ] {
        wait_gone(c, &[kind, name])?;
    }
    wait_release_pods_gone(c)?;
    let crd = get_json(c, &["get", "customresourcedefinition", CRD])
        .context("the CRD is kept by the uninstall (crds.keep)")?;
    if crd["metadata"]["annotations"]["helm.sh/resource-policy"] != "keep" {
        bail!(
            "the CRD left is not the chart's kept one: {}",
            crd["metadata"]
        );
    }
    // The report of a pod that is still there is kept with the CRD.
    get_json(c, &["-n", &ns.name, "get", "podreport", "dier"])
        .context("dier's report after the uninstall")?;
    let namespace = get_json(c, &["get", "namespace", AGENT_NAMESPACE])?;
    if namespace["status"]["phase"] != "Active" {
        bail!(
            "the namespace is not left as it was: {}",
            namespace["status"]
        );
    }
    // helm v4's list shows releases of every state (v3's --all is gone).
    let list = c.helm_ok(&["list", "--namespace", AGENT_NAMESPACE, "-q"])?;
    if list.lines().any(|l| l.trim() == RELEASE) {
        bail!("helm still lists the release after its uninstall: {list}");
    }
    restore.restore()
}
