//! deploy/chart under test, with a real helm (helm.sh/helm/v4 built from the Go module proxy by
//! `cargo xtask cluster build`: [`prereq::helm`]). The chart lints strictly; installed as release
//! `observer` in namespace observer-system it renders exactly the objects of `kubectl kustomize
//! deploy/` (but Helm's own labels and annotations, each checked before it is removed); each value
//! shows up where it should and nowhere else; a release's names are all its own, so a second one
//! (a canary) collides with nothing of the first and its admission policies hold its own agents;
//! a mode change rolls the agents (the ConfigMap's checksum) and nothing else does; the monitors,
//! the alerts (run through `promtool test rules`) and the dashboard render only when asked; the
//! values schema refuses what the agent would; and the values the real-cluster test installs it
//! with render the test cluster's overlay. `helm install` and `helm upgrade` themselves run on
//! the real cluster: tests/tests/real_cluster/helm.rs.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use observer_tests::manifests::{deploy_dir, strict};
use observer_tests::prereq;
use serde_json::{json, Value};

/// The release name and namespace of every `helm template` here but the second release's:
/// deploy/'s names (a release named as the chart keeps the chart's name for its objects).
const RELEASE: &str = "observer";
const NAMESPACE: &str = "observer-system";

/// The labels Helm's conventions put on every object of a chart (those of its starter chart,
/// `helm create`, but app.kubernetes.io/name, which deploy/ already uses as the agent's
/// selector): deploy/ does not carry them, so they are removed from each chart object's
/// metadata.labels before the comparison with deploy/, each only after its value was checked
/// ([`comparable`]). app.kubernetes.io/instance is also in the chart's selectors, removed there
/// the same way.
const HELM_LABELS: [&str; 4] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];
const INSTANCE: &str = "app.kubernetes.io/instance";
/// The pod template's annotation that rolls the agents when the mode's ConfigMap changes.
const CHECKSUM: &str = "checksum/config";

/// Kinds that have no namespace.
const CLUSTER_SCOPED: [&str; 7] = [
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// Every alert of the chart's PrometheusRule.
const ALERTS: [&str; 8] = [
    "ObserverAgentDown",
    "ObserverAgentsUnavailable",
    "ObserverRingBufferDrops",
    "ObserverCRIUnreachable",
    "ObserverStatusWritesFailing",
    "ObserverReportWritesFailing",
    "ObserverHeartbeatStale",
    "ObserverMemoryNearLimit",
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

    /// `helm template <release> deploy/chart -n <namespace> <args>`: the rendered objects keyed
    /// as [`key`] does, or helm's error.
    fn release(
        &self,
        release: &str,
        namespace: &str,
        args: &[&str],
    ) -> Result<BTreeMap<String, Value>, String> {
        let chart = chart_dir();
        let mut all = vec![
            "template",
            release,
            chart.to_str().unwrap(),
            "--namespace",
            namespace,
        ];
        all.extend(args);
        self.run(&all).map(|out| objects(documents(&out)))
    }

    /// [`Helm::release`] of [`RELEASE`] in [`NAMESPACE`].
    fn template(&self, args: &[&str]) -> Result<BTreeMap<String, Value>, String> {
        self.release(RELEASE, NAMESPACE, args)
    }

    /// NOTES.txt as `helm install --dry-run=client` prints it (no cluster is asked).
    fn notes(&self, args: &[&str]) -> String {
        let chart = chart_dir();
        let mut all = vec![
            "install",
            RELEASE,
            chart.to_str().unwrap(),
            "--namespace",
            NAMESPACE,
            "--dry-run=client",
        ];
        all.extend(args);
        let out = self.run(&all).unwrap_or_else(|e| panic!("{e}"));
        out.split_once("NOTES:\n")
            .unwrap_or_else(|| panic!("no NOTES in {out}"))
            .1
            .to_string()
    }
}

/// `kubectl kustomize <dir>`, keyed as [`key`] does, or None when kubectl is missing (skipped,
/// as deploy.rs's kustomization test does). kustomize 5.5 (kubectl 1.32) does not know
/// ValidatingAdmissionPolicy and its binding as cluster-scoped and gives them the
/// kustomization's namespace; the API server drops the namespace of a cluster-scoped object, so
/// it is removed here from those kinds only (the chart must not render one: [`objects`]).
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

/// Rendered objects keyed as [`key`] does; a cluster-scoped one must have no namespace.
fn objects(docs: Vec<Value>) -> BTreeMap<String, Value> {
    let mut objects = BTreeMap::new();
    for doc in docs {
        let k = key(&doc);
        if CLUSTER_SCOPED.contains(&doc["kind"].as_str().unwrap_or_default()) {
            assert!(
                doc["metadata"]["namespace"].is_null(),
                "{k}: a cluster-scoped object rendered with a namespace"
            );
        }
        assert!(objects.insert(k.clone(), doc).is_none(), "{k} twice");
    }
    objects
}

/// Removes `name` from the map at `pointer` of `doc` (and the map, left empty), panicking unless
/// it was there and `ok` with its value.
fn take(doc: &mut Value, pointer: &str, name: &str, ok: impl Fn(&Value) -> bool) {
    let k = key(doc);
    let (parent, last) = pointer.rsplit_once('/').unwrap();
    let map = doc
        .pointer_mut(pointer)
        .and_then(Value::as_object_mut)
        .unwrap_or_else(|| panic!("{k}: nothing at {pointer}"));
    let v = map
        .remove(name)
        .unwrap_or_else(|| panic!("{k}: no {name} at {pointer}"));
    assert!(ok(&v), "{k}: {pointer} {name}: {v}");
    if map.is_empty() {
        doc.pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .unwrap()
            .remove(last);
    }
}

/// The chart's objects as deploy/ would have them: Helm's labels ([`HELM_LABELS`], each with
/// the value Helm's conventions give it for this chart and `release`) off every object's
/// metadata, the release's label off the selectors and the pod template, the ConfigMap's
/// checksum off the pod template, and the CRD's resource policy (keep). Nothing else.
fn comparable(mut objects: BTreeMap<String, Value>, release: &str) -> BTreeMap<String, Value> {
    let chart = chart_yaml();
    let want = [
        format!(
            "{}-{}",
            chart["name"].as_str().unwrap(),
            chart["version"].as_str().unwrap()
        ),
        "Helm".to_string(),
        release.to_string(),
        chart["appVersion"].as_str().unwrap().to_string(),
    ];
    let is = |want: &str| {
        let want = want.to_string();
        move |v: &Value| v.as_str() == Some(&want)
    };
    for doc in objects.values_mut() {
        for (label, want) in HELM_LABELS.iter().zip(&want) {
            take(doc, "/metadata/labels", label, is(want));
        }
        let selectors: &[&str] = match doc["kind"].as_str().unwrap() {
            "DaemonSet" => &[
                "/spec/selector/matchLabels",
                "/spec/template/metadata/labels",
            ],
            "Service" => &["/spec/selector"],
            "NetworkPolicy" => &["/spec/podSelector/matchLabels"],
            _ => &[],
        };
        for at in selectors {
            take(doc, at, INSTANCE, is(release));
        }
        match doc["kind"].as_str().unwrap() {
            "DaemonSet" => take(doc, "/spec/template/metadata/annotations", CHECKSUM, |v| {
                v.as_str()
                    .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            }),
            "CustomResourceDefinition" => take(
                doc,
                "/metadata/annotations",
                "helm.sh/resource-policy",
                is("keep"),
            ),
            _ => {}
        }
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

/// The objects of `kind`, by name.
fn named<'a>(objects: &'a BTreeMap<String, Value>, kind: &str) -> BTreeMap<String, &'a Value> {
    objects
        .values()
        .filter(|o| o["kind"] == kind)
        .map(|o| (o["metadata"]["name"].as_str().unwrap().to_string(), o))
        .collect()
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

/// The values files of the tests here: the test cluster's, a canary's, everything on.
fn value_files(dir: &Path) -> Vec<PathBuf> {
    let canary = dir.join("canary.json");
    std::fs::write(
        &canary,
        json!({
            "fullnameOverride": "observer-canary",
            "crds": {"install": false},
            "statusMode": "audit",
            "stateDir": {"hostPath": "/run/observer-canary"},
            "nodeSelector": {"observer.dev/canary": "true"},
        })
        .to_string(),
    )
    .unwrap();
    let everything = dir.join("everything.json");
    std::fs::write(
        &everything,
        json!({
            "namespace": {"create": true},
            "metrics": {
                "readers": [{"namespace": "monitoring", "name": "prometheus-k8s"}],
                "serviceMonitor": {"enabled": true, "labels": {"release": "kps"}},
                "podMonitor": {"enabled": true, "scrapeClass": "observer"},
            },
            "prometheusRule": {"enabled": true},
            "dashboard": {"enabled": true},
            "networkPolicy": {"from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]},
        })
        .to_string(),
    )
    .unwrap();
    vec![overlay_dir().join("chart-values.yaml"), canary, everything]
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
    let values = tempfile::tempdir().unwrap();
    // --strict: a warning fails too. With the defaults and each values file.
    let files = value_files(values.path());
    let mut sets: Vec<Vec<&str>> = vec![vec![]];
    sets.extend(files.iter().map(|f| vec!["-f", f.to_str().unwrap()]));
    for extra in sets {
        let mut args = vec![
            "lint",
            "--strict",
            dir.to_str().unwrap(),
            "--namespace",
            NAMESPACE,
        ];
        args.extend(&extra);
        let out = helm.run(&args).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{extra:?}: {out}"
        );
    }
}

/// The `license` of a Cargo.toml's table `[table]`.
fn cargo_license(manifest: &Path, table: &str) -> String {
    let text = std::fs::read_to_string(manifest).unwrap();
    let section = text
        .split_once(&format!("[{table}]\n"))
        .unwrap_or_else(|| panic!("{}: no [{table}]", manifest.display()))
        .1;
    let section = section.split("\n[").next().unwrap();
    section
        .lines()
        .find_map(|l| l.strip_prefix("license = \""))
        .and_then(|l| l.strip_suffix('"'))
        .unwrap_or_else(|| panic!("{}: no license in [{table}]", manifest.display()))
        .to_string()
}

/// The chart names the licences Cargo.toml gives: the user-space code's (the workspace's) and the
/// eBPF object's (observer-ebpf's, GPL-compatible as the kernel requires), each with its text.
#[test]
fn chart_names_the_licences_of_what_it_runs() {
    let chart = chart_yaml();
    let root = workspace();
    let user = cargo_license(&root.join("Cargo.toml"), "workspace.package");
    let ebpf = cargo_license(&root.join("observer-ebpf/Cargo.toml"), "package");
    assert_eq!(
        chart["annotations"]["artifacthub.io/license"],
        user.as_str()
    );
    assert_eq!(
        chart["annotations"]["observer.dev/ebpf-license"],
        ebpf.as_str()
    );
    assert!(
        ebpf.split(" OR ").any(|l| l.starts_with("GPL-2.0")),
        "{ebpf}"
    );
    // What the object itself declares to the kernel (its `license` section): the kernel's name
    // for the same choice (include/linux/module.h), GPL-compatible.
    let source = std::fs::read_to_string(root.join("observer-ebpf/src/main.rs")).unwrap();
    let declared = source
        .split_once("#[unsafe(link_section = \"license\")]")
        .and_then(|(_, rest)| rest.split_once("*b\""))
        .and_then(|(_, rest)| rest.split_once("\\0\""))
        .map(|(s, _)| s)
        .expect("observer-ebpf's license section");
    assert_eq!(
        (declared, ebpf.as_str()),
        ("Dual MIT/GPL", "MIT OR GPL-2.0-only"),
        "the object's license section and observer-ebpf's Cargo.toml"
    );
    // The records compiled into the object as well as the agent: MIT among their choices.
    let common = cargo_license(&root.join("observer-common/Cargo.toml"), "package");
    assert!(common.split(" OR ").any(|l| l == "MIT"), "{common}");
    // The texts: Apache-2.0 at the root; each of the eBPF object's beside it.
    let text =
        |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    assert!(text("LICENSE").contains("Apache License\n                           Version 2.0"));
    for mit in ["observer-ebpf/LICENSE-MIT", "observer-common/LICENSE-MIT"] {
        assert!(text(mit).contains("Permission is hereby granted"), "{mit}");
    }
    assert!(text("observer-ebpf/LICENSE-GPL-2.0")
        .contains("GNU GENERAL PUBLIC LICENSE\n                       Version 2"));
}

/// With its default values, installed as [`RELEASE`] in [`NAMESPACE`], the chart renders
/// deploy/'s objects, exactly, but Helm's labels and annotations ([`comparable`]) and the
/// Namespace, which `helm install --create-namespace` makes and `namespace.create` renders.
#[test]
fn default_values_render_the_objects_of_deploy() {
    let Some(helm) = Helm::require("the chart's comparison with deploy/") else {
        return;
    };
    let Some(mut kustomized) = kustomize(&deploy_dir()) else {
        return;
    };
    let with_ns = comparable(
        helm.template(&["--set", "namespace.create=true"]).unwrap(),
        RELEASE,
    );
    let problems = compare(&kustomized, &with_ns);
    assert!(
        problems.is_empty(),
        "helm template deploy/chart --set namespace.create=true against kubectl kustomize \
         deploy/:\n{}",
        problems.join("\n")
    );
    let chart = comparable(helm.template(&[]).unwrap(), RELEASE);
    assert!(kustomized
        .remove(&format!("Namespace /{NAMESPACE}"))
        .is_some());
    let problems = compare(&kustomized, &chart);
    assert!(
        problems.is_empty(),
        "helm template deploy/chart (default values) against kubectl kustomize deploy/, its \
         Namespace aside:\n{}",
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
    let mut chart = comparable(
        helm.template(&[
            "--set",
            "terminationMessages.fromNode=true,namespace.create=true",
        ])
        .unwrap(),
        RELEASE,
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

    let defaults = comparable(helm.template(&[]).unwrap(), RELEASE);
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

/// Every field that differs between two renderings, the DaemonSet's env aside: `Key path` →
/// the new value.
fn changes(
    before: &BTreeMap<String, Value>,
    after: &BTreeMap<String, Value>,
) -> Vec<(String, Value)> {
    let mut found = Vec::new();
    for (k, new) in after {
        let Some(old) = before.get(k) else { continue };
        let (mut old, mut new) = (old.clone(), new.clone());
        if new["kind"] == "DaemonSet" {
            for o in [&mut old, &mut new] {
                o["spec"]["template"]["spec"]["containers"][0]["env"] = Value::Null;
            }
        }
        let mut d = Vec::new();
        diff(&old, &new, "", &mut d);
        found.extend(d.into_iter().map(|(p, _, v)| (format!("{k} {p}"), v)));
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// Each agent setting shows up exactly where it should: against the default rendering, every
/// object and every field that changes is listed here, with its new value, and nothing else
/// changes.
#[test]
fn each_value_shows_up_where_it_should() {
    let Some(helm) = Helm::require("the chart's values test") else {
        return;
    };
    let defaults = helm.template(&[]).unwrap();
    let set = [
        "image.repository=registry.example/observer",
        "image.tag=9.9.9",
        "image.pullPolicy=Always",
        "statusMode=full",
        "conditionPrefix=observer.example.com",
        "listen.address=127.0.0.1",
        "listen.port=9900",
        "metrics.access=open",
        "networkPolicy.enabled=false",
        "priorityClass.create=false",
        "priorityClassName=system-node-critical",
    ]
    .join(",");
    let changed = helm.template(&["--set", &set]).unwrap();

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
        ("OBSERVER_METRICS_ACCESS", "open"),
    ] {
        env.insert(name.into(), json!({ "value": value }));
    }
    assert_eq!(env_map(&changed[ds]), env, "the agent's environment");

    let found = changes(&defaults, &changed);
    let checksum = changed[ds]["spec"]["template"]["metadata"]["annotations"][CHECKSUM].clone();
    assert_ne!(
        checksum,
        defaults[ds]["spec"]["template"]["metadata"]["annotations"][CHECKSUM]
    );
    let container = format!("{ds} .spec.template.spec.containers[0]");
    let policy = "ValidatingAdmissionPolicy /observer-status-mode .spec.variables";
    let mut want: Vec<(String, Value)> = vec![
        // One place for the mode and the prefix: the agent's env and the policy's literals.
        (
            "ConfigMap observer-system/observer .data.conditionPrefix".into(),
            json!("observer.example.com"),
        ),
        (
            "ConfigMap observer-system/observer .data.statusMode".into(),
            json!("full"),
        ),
        (format!("{policy}[0].expression"), json!("'full'")),
        (
            format!("{policy}[1].expression"),
            json!("'observer.example.com' + '/'"),
        ),
        // A mode change rolls the agents.
        (
            format!("{ds} .spec.template.metadata.annotations.{CHECKSUM}"),
            checksum,
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
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        found, want,
        "what changed with --set {set} (path, new value)"
    );

    // realtimePriority null: normal priority, and no CAP_SYS_NICE, which only it needs.
    let normal = helm.template(&["--set", "realtimePriority=null"]).unwrap();
    let d: DaemonSet = strict(&normal[ds]).unwrap();
    let c = &d.spec.template.spec.unwrap().containers[0];
    assert!(c
        .env
        .iter()
        .flatten()
        .all(|e| e.name != "OBSERVER_REALTIME_PRIORITY"));
    let added = c.security_context.as_ref().unwrap().capabilities.as_ref();
    assert_eq!(
        added.and_then(|c| c.add.clone()).unwrap(),
        ["BPF", "PERFMON", "SYSLOG"]
    );
}

/// The keys every chart takes, each rendered where it belongs and nowhere else: read back
/// through the API's own types (a misplaced field fails to parse), and against the defaults,
/// every change listed.
#[test]
fn the_standard_keys_render_where_they_belong() {
    let Some(helm) = Helm::require("the chart's standard keys") else {
        return;
    };
    let defaults = helm.template(&[]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.json");
    let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "observer.dev/canary", "operator": "DoesNotExist"}]}]}}});
    let resources = json!({"requests": {"cpu": "500m", "memory": "256Mi"},
                           "limits": {"cpu": "500m", "memory": "256Mi"}});
    std::fs::write(
        &values,
        json!({
            "podAnnotations": {"example.com/team": "nodes"},
            "podLabels": {"example.com/tier": "agent"},
            "imagePullSecrets": [{"name": "regcred"}],
            "affinity": affinity,
            "nodeSelector": {"kubernetes.io/os": "linux", "pool": "general"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
            "priorityClassName": "system-node-critical",
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "serviceAccount": {"annotations": {"example.com/owner": "sre"}},
            "extraArgs": ["--health-stale-after", "90"],
            "extraEnv": [{"name": "OBSERVER_SHUTDOWN_TIMEOUT", "value": "20"}],
            "resources": resources,
        })
        .to_string(),
    )
    .unwrap();
    let changed = helm.template(&["-f", values.to_str().unwrap()]).unwrap();
    // The same objects, but the chart's own PriorityClass: the pods run at the class named.
    let mut want_keys: Vec<&String> = defaults.keys().collect();
    want_keys.retain(|k| k.as_str() != "PriorityClass /observer-node-agent");
    assert_eq!(changed.keys().collect::<Vec<_>>(), want_keys, "the objects");
    let ds_key = "DaemonSet observer-system/observer";
    let ds: DaemonSet = strict(&changed[ds_key]).unwrap();
    let template = &ds.spec.template;
    let meta = template.metadata.as_ref().unwrap();
    let pod = template.spec.as_ref().unwrap();
    let c = &pod.containers[0];
    assert_eq!(
        meta.annotations.as_ref().unwrap()["example.com/team"],
        "nodes"
    );
    assert_eq!(meta.labels.as_ref().unwrap()["example.com/tier"], "agent");
    // Pod labels are not in the selector: it cannot change after install.
    let selector = ds.spec.selector.match_labels.clone().unwrap();
    assert!(!selector.contains_key("example.com/tier"), "{selector:?}");
    assert_eq!(
        c.args.as_ref().unwrap(),
        &["run", "--health-stale-after", "90"]
    );
    let env = c.env.as_ref().unwrap();
    assert_eq!(env.last().unwrap().name, "OBSERVER_SHUTDOWN_TIMEOUT");
    assert_eq!(
        serde_json::to_value(&pod.affinity).unwrap(),
        affinity,
        "affinity as given"
    );
    assert_eq!(
        serde_json::to_value(&c.resources).unwrap(),
        resources,
        "resources as given"
    );

    let mut want: Vec<(String, Value)> = vec![
        (
            format!("{ds_key} .spec.template.metadata.annotations.example.com/team"),
            json!("nodes"),
        ),
        (
            format!("{ds_key} .spec.template.metadata.labels.example.com/tier"),
            json!("agent"),
        ),
        (
            format!("{ds_key} .spec.template.spec.imagePullSecrets"),
            json!([{"name": "regcred"}]),
        ),
        (
            format!("{ds_key} .spec.template.spec.nodeSelector.pool"),
            json!("general"),
        ),
        (
            format!("{ds_key} .spec.template.spec.priorityClassName"),
            json!("system-node-critical"),
        ),
        (
            format!("{ds_key} .spec.updateStrategy.rollingUpdate.maxUnavailable"),
            json!("10%"),
        ),
        (
            "ServiceAccount observer-system/observer .metadata.annotations".into(),
            json!({"example.com/owner": "sre"}),
        ),
        (
            format!("{ds_key} .spec.template.spec.containers[0].args[1]"),
            json!("--health-stale-after"),
        ),
        (
            format!("{ds_key} .spec.template.spec.containers[0].args[2]"),
            json!("90"),
        ),
    ];
    for (field, value) in [
        ("effect", "NoSchedule"),
        ("key", "dedicated"),
        ("operator", "Equal"),
        ("value", "gpu"),
    ] {
        want.push((
            format!("{ds_key} .spec.template.spec.tolerations[0].{field}"),
            json!(value),
        ));
    }
    for (path, v) in [
        ("limits.cpu", "500m"),
        ("limits.memory", "256Mi"),
        ("requests.cpu", "500m"),
        ("requests.memory", "256Mi"),
    ] {
        want.push((
            format!("{ds_key} .spec.template.spec.containers[0].resources.{path}"),
            json!(v),
        ));
    }
    let mut found = changes(&defaults, &changed);
    // The affinity, whole (checked above).
    found.retain(|(p, _)| !p.contains(".spec.template.spec.affinity"));
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        found, want,
        "what the standard keys changed (path, new value)"
    );
    // extraEnv after the chart's own.
    let mut env = env_map(&defaults[ds_key]);
    env.insert("OBSERVER_SHUTDOWN_TIMEOUT".into(), json!({"value": "20"}));
    assert_eq!(env_map(&changed[ds_key]), env);

    // The service account: an existing one, by name; RBAC left to the operator.
    let own = helm
        .template(&[
            "--set",
            "serviceAccount.create=false,serviceAccount.name=agents,rbac.create=false",
        ])
        .unwrap();
    for kind in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"] {
        assert!(
            named(&own, kind).is_empty(),
            "{kind} rendered: {:?}",
            own.keys()
        );
    }
    assert_eq!(
        own[ds_key]["spec"]["template"]["spec"]["serviceAccountName"],
        "agents"
    );
    for policy in named(&own, "ValidatingAdmissionPolicy").values() {
        assert_eq!(
            policy["spec"]["matchConditions"][0]["expression"],
            "request.userInfo.username == 'system:serviceaccount:observer-system:agents'"
        );
    }
    // OnDelete: no rollingUpdate.
    let on_delete = helm
        .template(&["--set-json", r#"updateStrategy={"type":"OnDelete"}"#])
        .unwrap();
    assert_eq!(
        on_delete[ds_key]["spec"]["updateStrategy"],
        json!({"type": "OnDelete"})
    );
}

/// The checksum of the mode's ConfigMap rolls the agents on a change of the mode or the prefix,
/// and on nothing else (a pod annotation, the log level, the image change the pod template by
/// themselves, not the checksum).
#[test]
fn only_a_mode_or_prefix_change_rolls_the_agents_through_the_checksum() {
    let Some(helm) = Helm::require("the chart's checksum") else {
        return;
    };
    let checksum = |set: &str| {
        let args: Vec<&str> = if set.is_empty() {
            vec![]
        } else {
            vec!["--set", set]
        };
        let o = helm.template(&args).unwrap();
        only(&o, "DaemonSet")["spec"]["template"]["metadata"]["annotations"][CHECKSUM]
            .as_str()
            .unwrap()
            .to_string()
    };
    let base = checksum("");
    for set in [
        "statusMode=audit",
        "statusMode=off",
        "conditionPrefix=example.com",
    ] {
        assert_ne!(checksum(set), base, "{set} must roll the agents");
    }
    for set in [
        "log.level=debug",
        "image.tag=9.9.9",
        "podAnnotations.a=b",
        "listen.port=9900",
        "fullnameOverride=observer",
    ] {
        assert_eq!(checksum(set), base, "{set} changes no ConfigMap data");
    }
    // The same mode gives the same checksum: an upgrade that changes nothing rolls nothing.
    assert_eq!(checksum("statusMode=audit"), checksum("statusMode=audit"));
}

/// Every object of a release is named from its full name (the CRD aside, whose name is its
/// group's), in its namespace, and every reference between them resolves within the release:
/// the service account the pods run as, the ConfigMap they read, the class they run at, the
/// roles the bindings give, the policies the bindings name, the account the policies hold, the
/// pods the Service and the NetworkPolicy select.
fn assert_one_release(objects: &BTreeMap<String, Value>, ns: &str, full: &str) {
    for (k, o) in objects {
        let name = o["metadata"]["name"].as_str().unwrap();
        if o["kind"] == "CustomResourceDefinition" {
            assert_eq!(name, "podreports.observer.dev");
            continue;
        }
        if o["kind"] == "Namespace" {
            assert_eq!(name, ns);
            continue;
        }
        assert!(
            name == full || name.starts_with(&format!("{full}-")),
            "{k} is not named after the release's {full}"
        );
        if !CLUSTER_SCOPED.contains(&o["kind"].as_str().unwrap()) {
            assert_eq!(o["metadata"]["namespace"], ns, "{k}");
        }
    }
    let ds = only(objects, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let sa = pod["serviceAccountName"].as_str().unwrap();
    assert!(
        named(objects, "ServiceAccount").contains_key(sa),
        "the pods' {sa} is not the release's"
    );
    let maps = named(objects, "ConfigMap");
    for e in pod["containers"][0]["env"].as_array().unwrap() {
        if let Some(cm) = e["valueFrom"]["configMapKeyRef"]["name"].as_str() {
            assert!(maps.contains_key(cm), "{} reads ConfigMap {cm}", e["name"]);
        }
    }
    let class = pod["priorityClassName"].as_str().unwrap();
    assert!(
        named(objects, "PriorityClass").contains_key(class),
        "{class}"
    );
    let roles = named(objects, "ClusterRole");
    for (name, b) in named(objects, "ClusterRoleBinding") {
        let role = b["roleRef"]["name"].as_str().unwrap();
        assert!(roles.contains_key(role), "{name} binds {role}");
    }
    assert_eq!(
        named(objects, "ClusterRoleBinding")[full]["subjects"],
        json!([{"kind": "ServiceAccount", "name": sa, "namespace": ns}])
    );
    let policies = named(objects, "ValidatingAdmissionPolicy");
    assert_eq!(policies.len(), 2);
    for (name, b) in named(objects, "ValidatingAdmissionPolicyBinding") {
        assert_eq!(b["spec"]["policyName"], name.as_str());
        assert!(policies.contains_key(&name), "{name}");
    }
    for (name, p) in &policies {
        assert_eq!(
            p["spec"]["matchConditions"],
            json!([{"name": "observer-agent", "expression":
                format!("request.userInfo.username == 'system:serviceaccount:{ns}:{sa}'")}]),
            "{name} holds the release's own agents, and only them"
        );
    }
    let selector = &ds["spec"]["selector"]["matchLabels"];
    let labels = ds["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .unwrap();
    for (k, v) in selector.as_object().unwrap() {
        assert_eq!(labels.get(k), Some(v), "the selector takes the pods: {k}");
    }
    assert_eq!(&only(objects, "Service")["spec"]["selector"], selector);
    if let Some(np) = named(objects, "NetworkPolicy").get(full) {
        assert_eq!(&np["spec"]["podSelector"]["matchLabels"], selector);
    }
}

/// fullnameOverride renames every object, cluster-scoped ones included, and every reference
/// follows; nameOverride changes the name label and every selector with it.
#[test]
fn fullname_override_renames_everything_consistently() {
    let Some(helm) = Helm::require("the chart's names") else {
        return;
    };
    let defaults = helm.template(&[]).unwrap();
    assert_one_release(&defaults, NAMESPACE, "observer");
    let renamed = helm
        .template(&["--set", "fullnameOverride=node-watch"])
        .unwrap();
    assert_one_release(&renamed, NAMESPACE, "node-watch");
    // The same objects, each renamed: observer → node-watch.
    let rename = |k: &String| k.replace("/observer", "/node-watch");
    let want: BTreeSet<String> = defaults
        .keys()
        .map(|k| {
            if k.starts_with("CustomResourceDefinition") {
                k.clone()
            } else {
                rename(k)
            }
        })
        .collect();
    assert_eq!(renamed.keys().cloned().collect::<BTreeSet<_>>(), want);

    let relabelled = helm.template(&["--set", "nameOverride=agent"]).unwrap();
    // A release named observer with the chart named agent: observer-agent.
    assert_one_release(&relabelled, NAMESPACE, "observer-agent");
    let ds = only(&relabelled, "DaemonSet");
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "agent"
    );
}

/// A second release (a canary) in a namespace of its own: every name its own, none of the
/// first's cluster-scoped names, its policies holding its own agents, no second CRD.
#[test]
fn a_second_release_is_its_own() {
    let Some(helm) = Helm::require("the chart's second release") else {
        return;
    };
    let first = helm.template(&[]).unwrap();
    let canary = helm
        .release(
            "observer-canary",
            "observer-canary",
            &["--set", "crds.install=false,statusMode=audit"],
        )
        .unwrap();
    assert_one_release(&canary, "observer-canary", "observer-canary");
    assert!(named(&canary, "CustomResourceDefinition").is_empty());
    let cluster_scoped = |o: &BTreeMap<String, Value>| -> BTreeSet<String> {
        o.iter()
            .filter(|(_, d)| CLUSTER_SCOPED.contains(&d["kind"].as_str().unwrap()))
            .map(|(k, _)| k.clone())
            .collect()
    };
    let shared: Vec<String> = cluster_scoped(&first)
        .intersection(&cluster_scoped(&canary))
        .cloned()
        .collect();
    assert!(shared.is_empty(), "both releases would own {shared:?}");
    // Its mode is its own, in its policy.
    let policy = &named(&canary, "ValidatingAdmissionPolicy")["observer-canary-status-mode"];
    assert_eq!(policy["spec"]["variables"][0]["expression"], "'audit'");
    // And its selectors take none of the first release's pods, even in one namespace.
    let same_ns = helm
        .release("canary", NAMESPACE, &["--set", "crds.install=false"])
        .unwrap();
    assert_ne!(
        only(&same_ns, "DaemonSet")["spec"]["selector"],
        only(&first, "DaemonSet")["spec"]["selector"]
    );
}

/// The NetworkPolicy, strictly an API NetworkPolicy: ingress to the agent's port only, from the
/// listed peers only, and from nobody when none is listed; no address block unless given.
#[test]
fn network_policy_admits_only_the_listed_peers() {
    let Some(helm) = Helm::require("the chart's NetworkPolicy test") else {
        return;
    };
    let objects = helm.template(&[]).unwrap();
    let ds = only(&objects, "DaemonSet");
    let np = only(&objects, "NetworkPolicy");
    let typed: NetworkPolicy = strict(np).unwrap();
    assert_eq!(typed.metadata.namespace.as_deref(), Some(NAMESPACE));
    let spec = typed.spec.unwrap();
    // It selects the agent's pods, and only them.
    assert_eq!(
        serde_json::to_value(spec.pod_selector.unwrap()).unwrap(),
        json!({ "matchLabels": ds["spec"]["selector"]["matchLabels"] })
    );
    assert_eq!(spec.policy_types.unwrap(), ["Ingress"]);
    // deploy/'s peer by default (compared with deploy/ above): no address block.
    let ingress = spec.ingress.unwrap_or_default();
    assert_eq!(ingress.len(), 1);
    assert!(ingress[0]
        .from
        .iter()
        .flatten()
        .all(|p| p.ip_block.is_none()));
    // No peer listed: no rule, so nothing may connect (a rule without peers would admit all).
    let none = helm
        .template(&[
            "--set-json",
            // null removes the default map (an empty one would merge with it).
            r#"networkPolicy={"enabled":true,"namespaces":[],"namespaceLabels":null,"pods":[],"from":[]}"#,
        ])
        .unwrap();
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
                "from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}],
            },
        })
        .to_string(),
    )
    .unwrap();
    let objects = helm.template(&["-f", values.to_str().unwrap()]).unwrap();
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
                {"ipBlock": {"cidr": "192.0.2.0/24"}},
            ],
        }])
    );
}

/// The Prometheus Operator's objects and the dashboard render only when asked (a cluster
/// without those CRDs installs the rest), and scrape as the agents require: a bearer token (the
/// Prometheus's own, or a Secret's), the release's own pods, the metrics' own labels kept, the
/// job the alerts select; metrics.readers binds the reader role to the given accounts.
#[test]
fn monitoring_renders_only_when_asked_and_scrapes_with_a_token() {
    let Some(helm) = Helm::require("the chart's monitoring objects") else {
        return;
    };
    let defaults = helm.template(&[]).unwrap();
    for o in defaults.values() {
        assert!(
            !o["apiVersion"]
                .as_str()
                .unwrap()
                .starts_with("monitoring.coreos.com"),
            "{} rendered without being asked",
            key(o)
        );
    }
    assert!(!defaults.contains_key("ConfigMap observer-system/observer-dashboard"));
    assert!(!defaults.contains_key("ClusterRoleBinding /observer-metrics-reader"));

    let on = helm
        .template(&[
            "--set",
            "metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true,\
             metrics.serviceMonitor.labels.release=kps",
            "--set-json",
            r#"metrics.readers=[{"namespace":"monitoring","name":"prometheus-k8s"}]"#,
        ])
        .unwrap();
    let service = only(&on, "Service");
    let sm = only(&on, "ServiceMonitor");
    assert_eq!(sm["metadata"]["labels"]["release"], "kps");
    for (k, v) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &service["metadata"]["labels"][k], v,
            "the Service carries {k}"
        );
    }
    assert_eq!(
        sm["spec"]["namespaceSelector"],
        json!({"matchNames": [NAMESPACE]})
    );
    let endpoint = &sm["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], service["spec"]["ports"][0]["name"]);
    assert_eq!(endpoint["honorLabels"], true);
    assert_eq!(
        endpoint["bearerTokenFile"],
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
    // The job is the Service's name, the release's full name: the alerts' selector.
    assert_eq!(service["metadata"]["name"], "observer");
    let pm = only(&on, "PodMonitor");
    assert_eq!(
        pm["spec"]["selector"]["matchLabels"],
        only(&on, "DaemonSet")["spec"]["selector"]["matchLabels"]
    );
    let pm_endpoint = &pm["spec"]["podMetricsEndpoints"][0];
    assert_eq!(pm_endpoint["port"], "metrics");
    assert_eq!(
        pm_endpoint["relabelings"][0],
        json!({"targetLabel": "job", "replacement": "observer"})
    );
    let binding = &on["ClusterRoleBinding /observer-metrics-reader"];
    assert_eq!(binding["roleRef"]["name"], "observer-metrics-reader");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}])
    );

    // A Secret's token instead of the file.
    let secret = helm
        .template(&[
            "--set",
            "metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true",
            "--set-json",
            r#"metrics.serviceMonitor.authorization={"type":"Bearer","credentials":{"name":"scraper","key":"token"}}"#,
            "--set-json",
            r#"metrics.podMonitor.authorization={"type":"Bearer","credentials":{"name":"scraper","key":"token"}}"#,
        ])
        .unwrap();
    let endpoint = &only(&secret, "ServiceMonitor")["spec"]["endpoints"][0];
    assert!(endpoint.get("bearerTokenFile").is_none(), "{endpoint}");
    assert_eq!(endpoint["authorization"]["credentials"]["name"], "scraper");
    assert_eq!(
        only(&secret, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["authorization"]
            ["credentials"]["key"],
        "token"
    );
}

/// The dashboard's ConfigMap holds deploy/grafana/observer.json byte for byte (the chart's copy
/// is the same file), labelled for Grafana's sidecar.
#[test]
fn the_dashboard_is_deploys_for_grafanas_sidecar() {
    let canonical = std::fs::read_to_string(deploy_dir().join("grafana/observer.json")).unwrap();
    let copy = std::fs::read_to_string(chart_dir().join("files/observer.json")).unwrap();
    assert!(
        copy == canonical,
        "deploy/chart/files/observer.json is not deploy/grafana/observer.json: copy it"
    );
    let Some(helm) = Helm::require("the chart's dashboard") else {
        return;
    };
    let on = helm
        .template(&[
            "--set",
            "dashboard.enabled=true,dashboard.namespace=grafana,dashboard.annotations.grafana_folder=observer",
        ])
        .unwrap();
    let cm = &on["ConfigMap grafana/observer-dashboard"];
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(cm["metadata"]["annotations"]["grafana_folder"], "observer");
    assert_eq!(
        cm["data"]["observer.json"].as_str().unwrap(),
        canonical.trim_end()
    );
}

/// The rendered PrometheusRule's groups, with or without the alerts' annotations.
fn rules(helm: &Helm, annotations: bool) -> Value {
    let on = helm
        .template(&["--set", "prometheusRule.enabled=true"])
        .unwrap();
    let mut groups = only(&on, "PrometheusRule")["spec"]["groups"].clone();
    if !annotations {
        for g in groups.as_array_mut().unwrap() {
            for r in g["rules"].as_array_mut().unwrap() {
                r.as_object_mut().unwrap().remove("annotations");
            }
        }
    }
    json!({ "groups": groups })
}

/// Every alert the docs promise, each checked by promtool, each firing on the failure it names
/// for the agent that has it and for no healthy one (`promtool test rules`, synthetic series
/// labelled as the chart's monitors label them). Annotations (their templates checked by
/// `promtool check rules`) are left out of the unit test, which would compare their text.
#[test]
fn the_alerts_fire_on_what_they_name() {
    let Some(helm) = Helm::require("the chart's alerts") else {
        return;
    };
    let promtool = prereq::which("promtool");
    let missing: Vec<String> = promtool
        .is_none()
        .then(|| "`promtool` on PATH (Debian's prometheus; scripts/bootstrap.sh)".to_string())
        .into_iter()
        .collect();
    if !prereq::require("the alerts' test", &missing) {
        return;
    }
    let promtool = promtool.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let full = rules(&helm, true);
    let names: Vec<&str> = full["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["alert"].as_str().unwrap())
        .collect();
    assert_eq!(names, ALERTS);
    for r in full["groups"][0]["rules"].as_array().unwrap() {
        for a in ["summary", "description"] {
            assert!(r["annotations"][a].is_string(), "{}: no {a}", r["alert"]);
        }
    }
    let checked = dir.path().join("checked.yaml");
    std::fs::write(&checked, full.to_string()).unwrap();
    let out = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&checked)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let tested = dir.path().join("rules.yaml");
    std::fs::write(&tested, rules(&helm, false).to_string()).unwrap();
    // Agent a fails, agent b is healthy; both labelled as the monitors label them.
    let agent = |instance: &str| {
        format!(
            r#"job="observer",namespace="observer-system",instance="{instance}",node="node-{instance}""#
        )
    };
    let (a, b) = (agent("a"), agent("b"));
    let series = |name: &str, labels: &str, values: &str| json!({"series": format!("{name}{{{labels}}}"), "values": values});
    let input = vec![
        series("up", &a, "0x30"),
        series("up", &b, "1x30"),
        series(
            "kube_daemonset_status_number_unavailable",
            r#"namespace="observer-system",daemonset="observer""#,
            "1x30",
        ),
        // Another DaemonSet's unavailable pods are not this release's.
        series(
            "kube_daemonset_status_number_unavailable",
            r#"namespace="observer-system",daemonset="other""#,
            "1x30",
        ),
        series(
            "observer_kernel_ring_buffer_drops_total",
            &a,
            "0 0 0 5 5 5 5 5",
        ),
        series("observer_kernel_ring_buffer_drops_total", &b, "0x30"),
        series("observer_cri_connected", &a, "0x30"),
        series("observer_cri_connected", &b, "1x30"),
        series("observer_status_write_errors_total", &a, "0+2x30"),
        series("observer_status_rejected_total", &a, "0x30"),
        series("observer_status_write_errors_total", &b, "0x30"),
        series("observer_status_rejected_total", &b, "0x30"),
        series(
            "observer_report_writes_total",
            &format!(r#"{a},result="error""#),
            "0+1x30",
        ),
        series(
            "observer_report_writes_total",
            &format!(r#"{b},result="error""#),
            "0x30",
        ),
        series(
            "observer_report_writes_total",
            &format!(r#"{b},result="ok""#),
            "0+9x30",
        ),
        series("observer_events_failed_total", &a, "0x30"),
        series("observer_events_failed_total", &b, "0x30"),
        series(
            "observer_pipeline_heartbeat_age_seconds",
            &a,
            "1 1 20 80 140 200",
        ),
        series("observer_reconciler_heartbeat_age_seconds", &a, "1x6"),
        series("observer_pipeline_heartbeat_age_seconds", &b, "1x6"),
        series("observer_reconciler_heartbeat_age_seconds", &b, "2x6"),
        // 120 MiB of the default 128 Mi limit, and 40 MiB.
        series("observer_resident_memory_bytes", &a, "125829120x30"),
        series("observer_resident_memory_bytes", &b, "41943040x30"),
    ];
    let labels = |severity: &str, extra: &[(&str, &str)]| {
        let mut l = json!({"severity": severity, "job": "observer",
            "namespace": "observer-system", "instance": "a", "node": "node-a"});
        for (k, v) in extra {
            l[*k] = json!(v);
        }
        json!({ "exp_labels": l })
    };
    let expect = |alert: &str, at: &str, alerts: Vec<Value>| json!({"eval_time": at, "alertname": alert, "exp_alerts": alerts});
    let tests = json!({
        "rule_files": [tested.to_str().unwrap()],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": input,
            "alert_rule_test": [
                // Not yet: 5 minutes down are needed.
                expect("ObserverAgentDown", "3m", vec![]),
                expect("ObserverAgentDown", "10m", vec![labels("critical", &[])]),
                expect("ObserverAgentsUnavailable", "20m", vec![json!({"exp_labels": {
                    "severity": "critical", "namespace": "observer-system", "daemonset": "observer"}})]),
                expect("ObserverRingBufferDrops", "2m", vec![]),
                expect("ObserverRingBufferDrops", "5m", vec![labels("warning", &[])]),
                expect("ObserverCRIUnreachable", "10m", vec![labels("warning", &[])]),
                expect("ObserverStatusWritesFailing", "25m", vec![labels("warning", &[])]),
                expect("ObserverReportWritesFailing", "25m",
                    vec![labels("warning", &[("result", "error")])]),
                expect("ObserverHeartbeatStale", "4m",
                    vec![labels("warning", &[("loop", "kernel reader")])]),
                expect("ObserverMemoryNearLimit", "20m", vec![labels("warning", &[])]),
            ],
        }],
    });
    let test_file = dir.path().join("tests.yaml");
    std::fs::write(&test_file, tests.to_string()).unwrap();
    let out = Command::new(&promtool)
        .args(["test", "rules"])
        .arg(&test_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool test rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The alerts read only metrics the agent serves (tests/tests/run/metric_names.txt, checked
/// against a running agent's /metrics by tests/tests/run.rs), Prometheus's `up`, and
/// kube-state-metrics' DaemonSet series.
#[test]
fn the_alerts_read_metrics_that_exist() {
    let Some(helm) = Helm::require("the chart's alerts") else {
        return;
    };
    let served: BTreeSet<String> =
        std::fs::read_to_string(workspace().join("tests/tests/run/metric_names.txt"))
            .unwrap()
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect();
    let rules = rules(&helm, true);
    let mut read = BTreeSet::new();
    for r in rules["groups"][0]["rules"].as_array().unwrap() {
        let expr = r["expr"].as_str().unwrap();
        let mut rest = expr;
        while let Some(at) = rest.find("observer_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            read.insert(name);
        }
        assert!(
            expr.contains("observer_")
                || expr.starts_with("up{")
                || expr.starts_with("kube_daemonset_"),
            "{}: {expr}",
            r["alert"]
        );
    }
    let unknown: Vec<&String> = read.difference(&served).collect();
    assert!(
        unknown.is_empty(),
        "the alerts read metrics the agent does not serve: {unknown:?}"
    );
    assert!(read.len() >= 8, "{read:?}");
}

/// NOTES.txt says what was installed, how to verify it and what to do next, and warns about
/// what the NetworkPolicy admits (and when it admits nothing, or does not apply).
#[test]
fn notes_say_what_was_installed_and_what_the_network_policy_admits() {
    let Some(helm) = Helm::require("the chart's NOTES") else {
        return;
    };
    let notes = helm.notes(&[]);
    for want in [
        "DaemonSet observer-system/observer",
        "statusMode conditions",
        "observer-own-node, observer-status-mode",
        "system:serviceaccount:observer-system:observer",
        "CRD podreports.observer.dev",
        "ClusterRole observer-metrics-reader   bound to nobody",
        "kubectl -n observer-system rollout status daemonset/observer",
        "kubectl get podreports -A",
        "docs/operating.md",
        "conditionType: observer.dev/ContainersAlive",
        "before uninstalling, remove the gates",
        "every pod of every namespace labelled observer.dev/scrape=true",
        "kubectl label namespace NAMESPACE observer.dev/scrape=true",
    ] {
        assert!(notes.contains(want), "NOTES lack {want:?}:\n{notes}");
    }
    let nobody = helm.notes(&[
        "--set-json",
        r#"networkPolicy={"enabled":true,"namespaces":[],"namespaceLabels":null,"pods":[],"from":[]}"#,
    ]);
    assert!(
        nobody.contains("WARNING: the NetworkPolicy admits no peer"),
        "{nobody}"
    );
    let host = helm.notes(&["--set", "hostNetwork=true,listen.address=127.0.0.1"]);
    assert!(host.contains("no NetworkPolicy applies"), "{host}");
    let audit = helm.notes(&[
        "--set",
        "statusMode=audit,prometheusRule.enabled=true,crds.install=false",
        "--set-json",
        r#"metrics.readers=[{"namespace":"monitoring","name":"prometheus"}]"#,
    ]);
    for want in [
        "statusMode audit",
        "PrometheusRule observer-system/observer",
        "no CRD (crds.install=false)",
        "bound to monitoring/prometheus",
    ] {
        assert!(audit.contains(want), "NOTES lack {want:?}:\n{audit}");
    }
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
        ("metrics.access=none", "/metrics/access"),
        ("conditionPrefix=Not_A_Domain", "/conditionPrefix"),
        // A quote would end the mode's literal in the policy's CEL.
        ("conditionPrefix=a'b", "/conditionPrefix"),
        ("listen.port=70000", "/listen/port"),
        ("realtimePriority=100", "/realtimePriority"),
        ("fullnameOverride=Observer", "/fullnameOverride"),
        ("updateStrategy.rollingUpdate.maxSurge=1", "/updateStrategy"),
        ("updateStrategy.type=Recreate", "/updateStrategy"),
        (
            "prometheusRule.memoryRatio=2",
            "/prometheusRule/memoryRatio",
        ),
        (
            "prometheusRule.disabled.ObserverNoSuchAlert=true",
            "ObserverNoSuchAlert",
        ),
        (
            "metrics.podMonitor.bearerTokenFile=/token",
            "bearerTokenFile",
        ),
        // Pod labels may not take the selector's: a second release's pods would be the first's.
        (
            "podLabels.app\\.kubernetes\\.io/instance=observer",
            "app.kubernetes.io/instance",
        ),
        ("statsMode=full", "statsMode"),
        ("explain.access=none", "explain"),
        ("env[0].name=X", "env"),
        ("namespace.name=observer-system", "name"),
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
    for json in [
        r#"networkPolicy.from=[{"ipBlock":{"cidr":"10.0.0.1"}}]"#,
        r#"metrics.readers=[{"name":"prometheus"}]"#,
        r#"imagePullSecrets=["regcred"]"#,
    ] {
        assert!(
            helm.template(&["--set-json", json]).is_err(),
            "--set-json {json} was accepted"
        );
    }
    // No address block is needed: a NetworkPolicy of namespaces alone renders.
    helm.template(&["--set-json", r#"networkPolicy={"enabled":true}"#])
        .unwrap();
}

/// The values tests/tests/real_cluster/helm.rs installs the chart with render the objects of
/// `kubectl kustomize cluster/overlay`, by the same rules as deploy/'s (`helm install
/// --create-namespace` makes the Namespace). kustomize's strategic merge puts the patch's env
/// entries and volumes in an order of its own: the DaemonSet's env, volumes and volume mounts
/// are compared by name (the agent's env has no $(VAR) reference, where order would matter).
#[test]
fn test_cluster_values_render_the_overlay() {
    let Some(helm) = Helm::require("the chart's comparison with cluster/overlay") else {
        return;
    };
    let Some(mut kustomized) = kustomize(&overlay_dir()) else {
        return;
    };
    assert!(kustomized
        .remove(&format!("Namespace /{NAMESPACE}"))
        .is_some());
    let values = overlay_dir().join("chart-values.yaml");
    let mut chart = comparable(
        helm.template(&["-f", values.to_str().unwrap()]).unwrap(),
        RELEASE,
    );
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
