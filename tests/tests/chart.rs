//! deploy/chart under test, with a real helm (helm.sh/helm/v4 built from the Go module proxy by
//! `cargo xtask cluster build`: [`prereq::helm`]). The chart lints strictly; with its default
//! values it renders exactly the objects of `kubectl kustomize deploy/` (and a NetworkPolicy,
//! which deploy/ does not have yet); each value shows up where it should and nowhere else; its
//! values schema refuses what the agent would; and the values the real-cluster test installs it
//! with render the test cluster's overlay. `helm install` itself runs on the real cluster:
//! tests/tests/real_cluster/helm.rs.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use observer_tests::manifests::{deploy_dir, strict};
use observer_tests::prereq;
use serde_json::{json, Value};

/// The release name of every `helm template` here.
const RELEASE: &str = "observer";

/// The labels Helm's conventions put on every object of a chart (those of its starter chart,
/// `helm create`, but app.kubernetes.io/name, which deploy/ already uses as the agent's
/// selector): deploy/ does not carry them, so they are removed from each chart object's
/// metadata.labels before the comparison with deploy/, each only after its value was checked
/// ([`strip_helm_labels`]). Nothing else is removed; the chart puts none of them anywhere else.
const HELM_LABELS: [&str; 4] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];

/// Kinds that have no namespace.
const CLUSTER_SCOPED: [&str; 6] = [
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

fn chart_dir() -> PathBuf {
    deploy_dir().join("chart")
}

fn workspace() -> PathBuf {
    deploy_dir().parent().expect("workspace root").to_path_buf()
}

/// The test cluster's overlay of deploy/, and its values for the chart.
fn overlay_dir() -> PathBuf {
    workspace().join("cluster/overlay")
}

/// Chart.yaml, parsed.
fn chart_yaml() -> Value {
    let text = std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

/// Every document of a multi-document YAML stream, empty ones left out.
fn documents(text: &str) -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).expect("YAML");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// helm, with its cache, configuration and data in a directory of the test's own.
struct Helm {
    bin: PathBuf,
    home: tempfile::TempDir,
}

impl Helm {
    /// The built helm, or None when it is missing (skipped saying so; a failure under CI=true).
    fn require(what: &str) -> Option<Helm> {
        match prereq::helm() {
            Ok(bin) => Some(Helm {
                bin,
                home: tempfile::tempdir().unwrap(),
            }),
            Err(missing) => {
                prereq::require(what, &[missing]);
                None
            }
        }
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        let home = self.home.path();
        c.env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            // Nothing of the machine's cluster: `helm template` renders offline.
            .env("KUBECONFIG", home.join("no-kubeconfig"));
        c
    }

    /// stdout, or stdout and stderr as the error.
    fn run(&self, args: &[&str]) -> Result<String, String> {
        let out = self.command().args(args).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "helm {} failed ({}): {stdout}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// `helm template observer deploy/chart <args>`: the rendered objects, or helm's error.
    fn template(&self, args: &[&str]) -> Result<Vec<Value>, String> {
        let chart = chart_dir();
        let mut all = vec!["template", RELEASE, chart.to_str().unwrap()];
        all.extend(args);
        self.run(&all).map(|out| documents(&out))
    }
}

/// `kubectl kustomize <dir>`, keyed as [`key`] does, or None when kubectl is missing (skipped,
/// as deploy.rs's kustomization test does). kustomize 5.5 (kubectl 1.32) does not know
/// ValidatingAdmissionPolicy and its binding as cluster-scoped and gives them the
/// kustomization's namespace; the API server drops the namespace of a cluster-scoped object, so
/// it is removed here from those kinds only (the chart must not render one: [`chart_objects`]).
fn kustomize(dir: &Path) -> Option<BTreeMap<String, Value>> {
    let Some(kubectl) = prereq::which("kubectl") else {
        prereq::require(
            "the chart's comparison with deploy/",
            &["kubectl on PATH".into()],
        );
        return None;
    };
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut objects = BTreeMap::new();
    for mut doc in documents(&String::from_utf8_lossy(&out.stdout)) {
        if CLUSTER_SCOPED.contains(&doc["kind"].as_str().unwrap_or_default()) {
            if let Some(meta) = doc["metadata"].as_object_mut() {
                meta.remove("namespace");
            }
        }
        let k = key(&doc);
        assert!(objects.insert(k.clone(), doc).is_none(), "{k} twice");
    }
    Some(objects)
}

/// `Kind namespace/name` (an empty namespace for cluster-scoped objects).
fn key(doc: &Value) -> String {
    format!(
        "{} {}/{}",
        doc["kind"].as_str().unwrap_or("?"),
        doc["metadata"]["namespace"].as_str().unwrap_or(""),
        doc["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Removes [`HELM_LABELS`] from the object's metadata.labels, panicking unless each is there
/// with the value Helm's conventions give it for this chart and release.
fn strip_helm_labels(doc: &mut Value) {
    let chart = chart_yaml();
    let want = [
        format!(
            "{}-{}",
            chart["name"].as_str().unwrap(),
            chart["version"].as_str().unwrap()
        ),
        "Helm".to_string(),
        RELEASE.to_string(),
        chart["appVersion"].as_str().unwrap().to_string(),
    ];
    let k = key(doc);
    let labels = doc["metadata"]["labels"]
        .as_object_mut()
        .unwrap_or_else(|| panic!("{k}: no labels"));
    for (label, want) in HELM_LABELS.iter().zip(want) {
        assert_eq!(
            labels.remove(*label),
            Some(Value::from(want)),
            "{k}: label {label}"
        );
    }
}

/// The chart's rendered objects keyed as [`key`] does, [`HELM_LABELS`] removed.
fn chart_objects(docs: Vec<Value>) -> BTreeMap<String, Value> {
    let mut objects = BTreeMap::new();
    for mut doc in docs {
        let k = key(&doc);
        if CLUSTER_SCOPED.contains(&doc["kind"].as_str().unwrap_or_default()) {
            assert!(
                doc["metadata"]["namespace"].is_null(),
                "{k}: a cluster-scoped object rendered with a namespace"
            );
        }
        strip_helm_labels(&mut doc);
        assert!(objects.insert(k.clone(), doc).is_none(), "{k} twice");
    }
    objects
}

/// Where `a` and `b` differ: (path, a's value, b's value), `null` where one has nothing.
fn diff(a: &Value, b: &Value, at: &str, out: &mut Vec<(String, Value, Value)>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let null = Value::Null;
                diff(
                    x.get(k).unwrap_or(&null),
                    y.get(k).unwrap_or(&null),
                    &format!("{at}.{k}"),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            for i in 0..x.len().max(y.len()) {
                let null = Value::Null;
                diff(
                    x.get(i).unwrap_or(&null),
                    y.get(i).unwrap_or(&null),
                    &format!("{at}[{i}]"),
                    out,
                );
            }
        }
        (x, y) if x == y => {}
        (x, y) => out.push((at.to_string(), x.clone(), y.clone())),
    }
}

fn show(diffs: &[(String, Value, Value)], left: &str, right: &str) -> String {
    diffs
        .iter()
        .map(|(p, a, b)| format!("  {p}: {left} {a} | {right} {b}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The one object of `kind`.
fn only<'a>(objects: &'a BTreeMap<String, Value>, kind: &str) -> &'a Value {
    let all: Vec<&Value> = objects.values().filter(|o| o["kind"] == kind).collect();
    assert_eq!(all.len(), 1, "one {kind}: {:?}", objects.keys());
    all[0]
}

#[test]
fn chart_lints_strictly() {
    let Some(helm) = Helm::require("the chart's lint") else {
        return;
    };
    let chart = chart_yaml();
    assert_eq!(chart["name"], "observer");
    assert_eq!(
        chart["appVersion"],
        env!("CARGO_PKG_VERSION"),
        "the chart's appVersion is the agent's version (the workspace's)"
    );
    let dir = chart_dir();
    let values = overlay_dir().join("chart-values.yaml");
    // --strict: a warning fails too. With the test cluster's values as well as the defaults.
    for extra in [vec![], vec!["-f", values.to_str().unwrap()]] {
        let mut args = vec!["lint", "--strict", dir.to_str().unwrap()];
        args.extend(&extra);
        let out = helm.run(&args).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{out}"
        );
    }
}

/// Where the chart's objects and kustomize's differ, one line per difference: every object must
/// be in both, and equal.
fn compare(kustomized: &BTreeMap<String, Value>, chart: &BTreeMap<String, Value>) -> Vec<String> {
    let mut problems = Vec::new();
    for (k, want) in kustomized {
        match chart.get(k) {
            None => problems.push(format!("{k}: rendered by kustomize, not by the chart")),
            Some(got) => {
                let mut d = Vec::new();
                diff(want, got, "", &mut d);
                if !d.is_empty() {
                    problems.push(format!("{k} differs:\n{}", show(&d, "kustomize", "chart")));
                }
            }
        }
    }
    for k in chart.keys() {
        if !kustomized.contains_key(k) {
            problems.push(format!("{k}: rendered by the chart, not by kustomize"));
        }
    }
    problems
}

/// The chart with its default values renders deploy/'s objects, exactly, but HELM_LABELS.
#[test]
fn default_values_render_the_objects_of_deploy() {
    let Some(helm) = Helm::require("the chart's comparison with deploy/") else {
        return;
    };
    let Some(kustomized) = kustomize(&deploy_dir()) else {
        return;
    };
    let chart = chart_objects(helm.template(&[]).unwrap());
    let problems = compare(&kustomized, &chart);
    assert!(
        problems.is_empty(),
        "helm template deploy/chart (default values) against kubectl kustomize deploy/:\n{}",
        problems.join("\n")
    );
}

/// Termination messages from the node: the chart's value and deploy/'s example render the same
/// objects, which differ from the defaults by the two read-only mounts alone.
#[test]
fn termination_messages_from_the_node_mount_two_directories_read_only() {
    let Some(helm) = Helm::require("the chart's terminationMessages value") else {
        return;
    };
    // An overlay of deploy/ with the Component, as a user writes one (kustomize refuses
    // absolute paths, and a base that contains its overlay).
    let overlay = workspace().join(format!("target/tmp/chart-tm-{}", std::process::id()));
    std::fs::create_dir_all(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "resources: [../../../deploy]\n\
         components: [../../../deploy/components/termination-messages]\n",
    )
    .unwrap();
    let kustomized = kustomize(&overlay);
    std::fs::remove_dir_all(&overlay).unwrap();
    let Some(mut kustomized) = kustomized else {
        return;
    };
    let mut chart = chart_objects(
        helm.template(&["--set", "terminationMessages.fromNode=true"])
            .unwrap(),
    );
    let ds = "DaemonSet observer-system/observer";
    for objects in [&mut kustomized, &mut chart] {
        let spec = &mut objects.get_mut(ds).unwrap()["spec"]["template"]["spec"];
        for list in ["/volumes", "/containers/0/volumeMounts"] {
            spec.pointer_mut(list)
                .and_then(Value::as_array_mut)
                .unwrap()
                .sort_by_key(|e| e["name"].as_str().unwrap().to_string());
        }
    }
    let problems = compare(&kustomized, &chart);
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    let defaults = chart_objects(helm.template(&[]).unwrap());
    let mut d = Vec::new();
    diff(&defaults[ds], &chart[ds], "", &mut d);
    let mounts = &chart[ds]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"];
    for (name, path) in [
        ("kubelet-pods", "/var/lib/kubelet/pods"),
        ("pod-logs", "/var/log/pods"),
    ] {
        let m = mounts
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("{name} mounted: {mounts}"));
        assert_eq!(m["mountPath"], path);
        assert_eq!(m["readOnly"], true, "{name} read-only");
        assert_eq!(m["recursiveReadOnly"], "IfPossible");
    }
    for (path, _, _) in &d {
        assert!(
            path.contains("volumeMounts") || path.contains("volumes"),
            "terminationMessages.fromNode changes only mounts, not {path}"
        );
    }
    assert!(!d.is_empty());
}

/// The DaemonSet's env as name → the entry without its name.
fn env_map(ds: &Value) -> BTreeMap<String, Value> {
    ds["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let mut e = e.clone();
            let name = e["name"].as_str().unwrap().to_string();
            e.as_object_mut().unwrap().remove("name");
            (name, e)
        })
        .collect()
}

/// Each value shows up exactly where it should: against the default rendering, every object
/// and every field that changes is listed here, with its new value, and nothing else changes.
#[test]
fn each_value_shows_up_where_it_should() {
    let Some(helm) = Helm::require("the chart's values test") else {
        return;
    };
    let defaults = chart_objects(helm.template(&[]).unwrap());
    let set = [
        "image.repository=registry.example/observer",
        "image.tag=9.9.9",
        "image.pullPolicy=Always",
        "statusMode=full",
        "conditionPrefix=observer.example.com",
        "listen.address=127.0.0.1",
        "listen.port=9900",
        "explain.access=none",
        "metrics.access=token-review",
        "networkPolicy.enabled=false",
        "priorityClass.create=false",
        "priorityClass.name=system-node-critical",
    ]
    .join(",");
    let changed = chart_objects(helm.template(&["--set", &set]).unwrap());

    let before: BTreeSet<&String> = defaults.keys().collect();
    let after: BTreeSet<&String> = changed.keys().collect();
    let gone: Vec<String> = before.difference(&after).map(|k| k.to_string()).collect();
    assert_eq!(
        gone,
        [
            "NetworkPolicy observer-system/observer",
            "PriorityClass /observer-node-agent"
        ],
        "networkPolicy.enabled=false and priorityClass.create=false remove exactly their objects"
    );
    assert!(after.is_subset(&before), "{after:?}");

    let ds = "DaemonSet observer-system/observer";
    let mut env = env_map(&defaults[ds]);
    // The mode and the prefix are the ConfigMap's (below), which the env refers to.
    for (name, value) in [
        ("OBSERVER_LISTEN", "127.0.0.1:9900"),
        ("OBSERVER_EXPLAIN_ACCESS", "none"),
        ("OBSERVER_METRICS_ACCESS", "token-review"),
    ] {
        env.insert(name.into(), json!({ "value": value }));
    }
    assert_eq!(env_map(&changed[ds]), env, "the agent's environment");

    // Every other difference, the env aside.
    let mut found = Vec::new();
    for (k, new) in &changed {
        let (mut old, mut new) = (defaults[k].clone(), new.clone());
        if k == ds {
            for o in [&mut old, &mut new] {
                o["spec"]["template"]["spec"]["containers"][0]["env"] = Value::Null;
            }
        }
        let mut d = Vec::new();
        diff(&old, &new, "", &mut d);
        found.extend(d.into_iter().map(|(p, _, v)| (format!("{k} {p}"), v)));
    }
    let container = format!("{ds} .spec.template.spec.containers[0]");
    let mut want: Vec<(String, Value)> = vec![
        // One place for the mode and the prefix: the agent's env and the policy's parameter.
        (
            "ConfigMap observer-system/observer .data.conditionPrefix".into(),
            json!("observer.example.com"),
        ),
        (
            "ConfigMap observer-system/observer .data.statusMode".into(),
            json!("full"),
        ),
        (
            format!("{container}.image"),
            json!("registry.example/observer:9.9.9"),
        ),
        (format!("{container}.imagePullPolicy"), json!("Always")),
        // Probes go where the agent listens.
        (
            format!("{container}.livenessProbe.httpGet.host"),
            json!("127.0.0.1"),
        ),
        (format!("{container}.ports[0].containerPort"), json!(9900)),
        (
            format!("{container}.readinessProbe.httpGet.host"),
            json!("127.0.0.1"),
        ),
        (
            format!("{container}.startupProbe.httpGet.host"),
            json!("127.0.0.1"),
        ),
        (
            format!("{ds} .spec.template.spec.priorityClassName"),
            json!("system-node-critical"),
        ),
        (
            "Service observer-system/observer .metadata.annotations.prometheus.io/port".into(),
            json!("9900"),
        ),
        (
            "Service observer-system/observer .spec.ports[0].port".into(),
            json!(9900),
        ),
    ];
    found.sort_by(|a, b| a.0.cmp(&b.0));
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        found, want,
        "what changed with --set {set} (path, new value)"
    );

    // realtimePriority null: normal priority, and no CAP_SYS_NICE, which only it needs.
    let normal = chart_objects(helm.template(&["--set", "realtimePriority=null"]).unwrap());
    let d: DaemonSet = strict(&normal[ds]).unwrap();
    let c = &d.spec.unwrap().template.spec.unwrap().containers[0];
    assert!(c
        .env
        .iter()
        .flatten()
        .all(|e| e.name != "OBSERVER_REALTIME_PRIORITY"));
    let added = c.security_context.as_ref().unwrap().capabilities.as_ref();
    assert_eq!(
        added.and_then(|c| c.add.clone()).unwrap(),
        ["BPF", "PERFMON", "DAC_READ_SEARCH", "SYSLOG"]
    );
}

/// The NetworkPolicy, strictly an API NetworkPolicy: ingress to the agent's port only, from the
/// listed peers only, and from nobody when none is listed.
#[test]
fn network_policy_admits_only_the_listed_peers() {
    let Some(helm) = Helm::require("the chart's NetworkPolicy test") else {
        return;
    };
    let objects = chart_objects(helm.template(&[]).unwrap());
    let ds = only(&objects, "DaemonSet");
    let np = only(&objects, "NetworkPolicy");
    let typed: NetworkPolicy = strict(np).unwrap();
    assert_eq!(typed.metadata.namespace.as_deref(), Some("observer-system"));
    let spec = typed.spec.unwrap();
    // It selects the agent's pods, and only them.
    assert_eq!(
        serde_json::to_value(spec.pod_selector.unwrap()).unwrap(),
        json!({ "matchLabels": ds["spec"]["template"]["metadata"]["labels"] })
    );
    assert_eq!(spec.policy_types.unwrap(), ["Ingress"]);
    // deploy/'s peers by default (compared with deploy/ in the test above).
    assert_eq!(spec.ingress.unwrap_or_default().len(), 1);
    // No peer listed: no rule, so nothing may connect (a rule without peers would admit all).
    let none = chart_objects(
        helm.template(&[
            "--set-json",
            // null removes the default map (an empty one would merge with it).
            r#"networkPolicy={"enabled":true,"namespaces":[],"namespaceLabels":null,"pods":[],"apiServerCIDRs":[]}"#,
        ])
        .unwrap(),
    );
    let empty: NetworkPolicy = strict(only(&none, "NetworkPolicy")).unwrap();
    assert!(empty.spec.unwrap().ingress.unwrap_or_default().is_empty());

    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.json");
    std::fs::write(
        &values,
        json!({
            "listen": {"port": 9900},
            "networkPolicy": {
                "namespaces": ["monitoring"],
                "namespaceLabels": null,
                "pods": [{"namespace": "team", "matchLabels": {"app": "scraper"}}],
                "apiServerCIDRs": ["10.0.0.1/32"],
            },
        })
        .to_string(),
    )
    .unwrap();
    let objects = chart_objects(helm.template(&["-f", values.to_str().unwrap()]).unwrap());
    let np = only(&objects, "NetworkPolicy");
    strict::<NetworkPolicy>(np).unwrap();
    let by_name = |ns: &str| json!({"matchLabels": {"kubernetes.io/metadata.name": ns}});
    assert_eq!(
        np["spec"]["ingress"],
        json!([{
            "ports": [{"port": 9900, "protocol": "TCP"}],
            "from": [
                {"namespaceSelector": by_name("monitoring")},
                {"namespaceSelector": by_name("team"), "podSelector": {"matchLabels": {"app": "scraper"}}},
                {"ipBlock": {"cidr": "10.0.0.1/32"}},
            ],
        }])
    );
}

/// values.schema.json refuses, naming it, a value the agent or the API would refuse, and a
/// misspelled key (which Helm would otherwise ignore, leaving the default in place).
#[test]
fn values_schema_refuses_what_the_agent_would() {
    let Some(helm) = Helm::require("the chart's values schema test") else {
        return;
    };
    for (set, names) in [
        ("statusMode=bogus", "/statusMode"),
        ("explain.access=open", "/explain/access"),
        ("metrics.access=none", "/metrics/access"),
        ("conditionPrefix=Not_A_Domain", "/conditionPrefix"),
        ("listen.port=70000", "/listen/port"),
        ("realtimePriority=100", "/realtimePriority"),
        (
            "networkPolicy.apiServerCIDRs={10.0.0.1}",
            "/networkPolicy/apiServerCIDRs/0",
        ),
        ("namespace.name=Observer", "/namespace/name"),
        ("statsMode=full", "statsMode"),
        ("explain.acess=none", "acess"),
    ] {
        let err = helm
            .template(&["--set", set])
            .err()
            .unwrap_or_else(|| panic!("--set {set} was accepted"));
        assert!(
            err.contains("values don't meet the specifications of the schema")
                && err.contains(names),
            "--set {set}: the error does not name {names}: {err}"
        );
    }
}

/// The values tests/tests/real_cluster/helm.rs installs the chart with render the objects of
/// `kubectl kustomize cluster/overlay`, by the same rules as deploy/'s. kustomize's strategic
/// merge puts the patch's env entries and volumes in an order of its own: the DaemonSet's env,
/// volumes and volume mounts are compared by name (the agent's env has no $(VAR) reference,
/// where order would matter).
#[test]
fn test_cluster_values_render_the_overlay() {
    let Some(helm) = Helm::require("the chart's comparison with cluster/overlay") else {
        return;
    };
    let Some(mut kustomized) = kustomize(&overlay_dir()) else {
        return;
    };
    let values = overlay_dir().join("chart-values.yaml");
    let mut chart = chart_objects(helm.template(&["-f", values.to_str().unwrap()]).unwrap());
    for objects in [&mut kustomized, &mut chart] {
        for ds in objects.values_mut().filter(|o| o["kind"] == "DaemonSet") {
            let spec = &mut ds["spec"]["template"]["spec"];
            let sort = |list: &mut Value| {
                list.as_array_mut()
                    .unwrap()
                    .sort_by_key(|e| e["name"].as_str().unwrap().to_string())
            };
            sort(&mut spec["volumes"]);
            sort(&mut spec["containers"][0]["env"]);
            sort(&mut spec["containers"][0]["volumeMounts"]);
        }
    }
    let problems = compare(&kustomized, &chart);
    assert!(
        problems.is_empty(),
        "helm template -f cluster/overlay/chart-values.yaml against kubectl kustomize \
         cluster/overlay:\n{}",
        problems.join("\n")
    );
    // What the overlay is there for.
    let ds = only(&chart, "DaemonSet");
    assert_eq!(ds["spec"]["template"]["spec"]["hostNetwork"], true);
    strict::<DaemonSet>(ds).unwrap();
}
