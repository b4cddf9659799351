//! deploy/ on a real one-node Kubernetes (observer-cluster: etcd, kube-apiserver with the Node
//! authorizer, RBAC and NodeRestriction, kube-controller-manager, kube-scheduler, containerd and
//! kubelet, built from the Go module proxy): the DaemonSet scheduled by the real scheduler and
//! Ready with the manifests' own capabilities and mounts, its metrics, its service account's
//! permissions, the admission policy enforced by the real API server with the agent's real
//! pod-bound token, a rollout restart that keeps the state volume, the agent's conditions
//! written beside kubelet's, and deploy/chart installed and uninstalled by the real helm.
//!
//! Every test is in `real_cluster`, so `--skip real_cluster::` leaves them out (scripts/test.sh
//! runs them in a phase of their own, between `cargo xtask cluster up` and `down`).
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list

mod real_cluster {
    mod cycles;
    mod helm;
    mod large_node;
    mod memory;
    mod plugin;
    mod runtime_restart;
    mod status_diff;
    mod truth;
    mod two_nodes;

    use std::collections::BTreeSet;
    use std::net::SocketAddr;
    use std::time::Duration;

    use observer_tests::cluster::{
        agent_exclusive, agent_pod, agent_shared, apply, busybox_pod, condition, container_pid,
        get_json, pod_volumes, require_cluster, wait_pod, Cluster, Namespace, TestPod, AGENT_ADDR,
        AGENT_NAMESPACE, AGENT_USER, NODE_NAME, POLL,
    };
    use observer_tests::endpoint::{http_get, http_get_as};
    use observer_tests::manifests::{deploy_dir, read_one};
    use observer_tests::wait::poll_every;
    use serde_json::Value;

    const READY: Duration = Duration::from_secs(120);

    fn agent_addr() -> SocketAddr {
        AGENT_ADDR.parse().expect("an address")
    }

    fn ready(pod: &Value) -> bool {
        pod["status"]["phase"] == "Running"
            && condition(pod, "Ready").is_some_and(|c| c["status"] == "True")
    }

    /// The capability numbers of linux/capability.h the manifest names.
    fn cap_number(name: &str) -> u32 {
        match name {
            "SYS_NICE" => 23,
            "SYSLOG" => 34,
            "PERFMON" => 38,
            "BPF" => 39,
            other => panic!("capability {other} has no number here: add it"),
        }
    }

    #[test]
    fn daemonset_scheduled_ready_with_its_capabilities_and_mounts() {
        let Some(c) = require_cluster() else { return };
        let _agent = agent_shared();
        let pod = wait_pod_ready_agent(c);
        assert_eq!(pod["spec"]["nodeName"], NODE_NAME);
        // Placed by the scheduler (the DaemonSet controller only sets node affinity).
        let name = pod["metadata"]["name"].as_str().unwrap();
        let events = get_json(
            c,
            &[
                "get",
                "events",
                "-n",
                AGENT_NAMESPACE,
                "--field-selector",
                &format!("involvedObject.name={name},reason=Scheduled"),
            ],
        )
        .unwrap();
        let scheduled = events["items"].as_array().unwrap();
        assert!(
            scheduled
                .iter()
                .any(|e| e["reportingComponent"] == "default-scheduler"
                    || e["source"]["component"] == "default-scheduler"),
            "no Scheduled event from default-scheduler for {name}: {events}"
        );

        // The effective capabilities of the running agent are exactly the manifest's.
        let ds: k8s_openapi::api::apps::v1::DaemonSet =
            read_one(&deploy_dir().join("daemonset.yaml")).unwrap();
        let spec = ds.spec.template.spec.unwrap();
        let added = spec.containers[0]
            .security_context
            .as_ref()
            .and_then(|s| s.capabilities.as_ref())
            .and_then(|c| c.add.clone())
            .unwrap();
        let want: u64 = added.iter().map(|n| 1u64 << cap_number(n)).sum();
        let id = pod["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .unwrap();
        let pid = container_pid(id).unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
            .unwrap();
        assert_eq!(
            eff, want,
            "CapEff {eff:#x} of the agent (pid {pid}) is not the manifest's {added:?} ({want:#x})"
        );
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert!(
            cmdline.starts_with(b"/usr/bin/observer\0run"),
            "pid {pid} is not the agent: {:?}",
            String::from_utf8_lossy(&cmdline)
        );

        // Its mounts: every host mount read-only but the state volume.
        let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
        let mount = |target: &str| {
            mountinfo
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|f| f.get(4) == Some(&target))
                .map(|f| f[5].split(',').any(|o| o == "ro"))
        };
        for (target, read_only) in [
            ("/sys/kernel/tracing", true),
            ("/host/sys/fs/cgroup", true),
            ("/run/containerd/containerd.sock", true),
            ("/run/observer", false),
            ("/", true),
        ] {
            assert_eq!(
                mount(target),
                Some(read_only),
                "mount {target} (read-only: {read_only}) in the agent's mount namespace"
            );
        }
        // The runtime's socket alone: not the directory, beneath which containerd 1.x keeps
        // running containers' root filesystems.
        assert_eq!(
            mount("/run/containerd"),
            None,
            "/run/containerd is not mounted"
        );
    }

    fn wait_pod_ready_agent(c: &Cluster) -> Value {
        poll_every(POLL, READY, || agent_pod(c).ok().filter(ready))
            .unwrap_or_else(|| panic!("the agent's pod is not Ready: {:?}", agent_pod(c)))
    }

    /// Scraped as an operator's Prometheus is (its account bound to observer-metrics-reader);
    /// refused to a caller without a token, or with one the API server does not vouch for, or
    /// whose user may not get /metrics; and the port tells nobody anything about a pod.
    #[test]
    fn metrics_scraped_with_a_token_and_healthy() {
        let Some(c) = require_cluster() else { return };
        let _agent = agent_shared();
        wait_pod_ready_agent(c);
        let token = observer_tests::cluster::scraper_token(c).unwrap();
        let (code, body) =
            http_get_as(agent_addr(), "/metrics", Some(&token)).expect("the agent answers");
        assert_eq!(code, 200, "{body}");
        for (who, t) in [("no token", None), ("a forged token", Some("forged"))] {
            let (code, body) = http_get_as(agent_addr(), "/metrics", t).unwrap();
            assert_eq!(code, 401, "{who}: {body}");
            assert!(!body.contains("observer_"), "{who}: {body}");
        }
        // A real account without the right (the default service account of a namespace).
        let nobody = c
            .kubectl_ok(&[
                "create",
                "token",
                "default",
                "-n",
                "default",
                "--duration=10m",
            ])
            .unwrap();
        let (code, refusal) = http_get_as(agent_addr(), "/metrics", Some(nobody.trim())).unwrap();
        assert_eq!(code, 403, "{refusal}");
        // Nothing about any pod, to anyone: what /explain served is gone from the port.
        for path in [
            "/explain/observer-system/x",
            "/explain/default/x?output=text",
            "/pods",
        ] {
            let (code, _) = http_get_as(agent_addr(), path, Some(&token)).unwrap();
            assert_eq!(code, 404, "{path}");
        }
        let sample = |name: &str| {
            body.lines()
                .find_map(|l| {
                    l.strip_prefix(name)?
                        .strip_prefix(' ')?
                        .trim()
                        .parse::<f64>()
                        .ok()
                })
                .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{body}"))
        };
        // Connected to the node's containerd through the mounted socket, reading the kernel.
        assert_eq!(sample("observer_cri_connected"), 1.0);
        assert_eq!(sample(r#"observer_kernel_records_total{type="lost"}"#), 0.0);
        assert!(
            sample("observer_kernel_containers") >= 1.0,
            "its own container at least"
        );
        assert!(body.contains("# TYPE observer_status_write_latency_seconds histogram"));
        assert_eq!(http_get(agent_addr(), "/healthz").map(|r| r.0), Some(200));
        assert_eq!(http_get(agent_addr(), "/readyz").map(|r| r.0), Some(200));
    }

    /// `kubectl auth can-i --list` as the agent: exactly what it needs (its node's pods, their
    /// status, Events), beside what every authenticated user may do (discovery, self reviews).
    #[test]
    fn service_account_can_do_what_it_needs_and_nothing_more() {
        let Some(c) = require_cluster() else { return };
        // The deployed RBAC (the helm test replaces it meanwhile).
        let _agent = agent_shared();
        let granted_to = |user: &str| -> (BTreeSet<String>, String) {
            let list = c
                .kubectl_ok(&["auth", "can-i", "--list", "--as", user])
                .unwrap();
            let mut granted = BTreeSet::new();
            for line in list.lines().skip(1) {
                // Verbs are the last bracketed column, and may hold spaces: `[create patch]`.
                let (Some(resource), Some(open)) =
                    (line.split_whitespace().next(), line.rfind('['))
                else {
                    continue;
                };
                // Non-resource URLs (discovery, /healthz...) come as `[]  [/api/*]  []  [get]`.
                if resource.starts_with('[') {
                    continue;
                }
                for verb in line[open..].trim_matches(['[', ']']).split(' ') {
                    granted.insert(format!("{verb} {resource}"));
                }
            }
            (granted, list)
        };
        let (all, list) = granted_to(AGENT_USER);
        // What every service account may do (self reviews; cluster trust bundles since 1.35)
        // is not the agent's to explain.
        let (everyone, _) = granted_to("system:serviceaccount:default:default");
        let granted: BTreeSet<String> = all.difference(&everyone).cloned().collect();
        let want: BTreeSet<String> = [
            "get pods",
            "list pods",
            "watch pods",
            "patch pods/status",
            "create events.events.k8s.io",
            "patch events.events.k8s.io",
            // One pod's Events, before a death is told late (was it told already?).
            "list events.events.k8s.io",
            // Each pod's PodReport, by server-side apply.
            "get podreports.observer.dev",
            "create podreports.observer.dev",
            "patch podreports.observer.dev",
            // /metrics' access check: who a caller's token is, whether it may get /metrics.
            "create tokenreviews.authentication.k8s.io",
            "create subjectaccessreviews.authorization.k8s.io",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        assert_eq!(granted, want, "the agent's permissions:\n{list}");
        for denied in [
            ["update", "pods"],
            ["delete", "pods"],
            ["patch", "pods"],
            ["get", "secrets"],
            ["update", "pods/status"],
            ["create", "events"],
            ["delete", "podreports.observer.dev"],
        ] {
            let out = c
                .kubectl()
                .args(["auth", "can-i", denied[0], denied[1], "--as", AGENT_USER])
                .output()
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                "no",
                "{} {} must be denied",
                denied[0],
                denied[1]
            );
        }
    }

    /// The agent's own pod-bound token (as kubelet projected it into its pod), used for real
    /// status writes: one for a pod of its node is accepted, one for a pod bound to another node
    /// is refused by deploy/'s ValidatingAdmissionPolicy.
    #[test]
    fn admission_policy_keeps_the_agent_to_its_node() {
        let Some(c) = require_cluster() else { return };
        let _agent = agent_shared();
        let ns = Namespace::new(c, "t-admission").unwrap();
        let agent = wait_pod_ready_agent(c);
        let token = agent_token(c, NODE_NAME, &agent);

        apply(c, &busybox_pod("mine", &ns.name, "Never", "sleep 3600")).unwrap();
        // Bound to a node that has no kubelet: it stays Pending, but its spec.nodeName is stored.
        apply(
            c,
            &TestPod::new("theirs", &ns.name, "Never")
                .container("main", "sleep 3600")
                .node_name("another-node")
                .manifest(),
        )
        .unwrap();
        wait_pod(c, &ns.name, "mine", READY, |p| {
            p["spec"]["nodeName"] == NODE_NAME
        })
        .unwrap();

        let as_agent = |pod: &str| write_status_as(c, &token, &ns.name, pod);
        refused_by_policy(as_agent("theirs"), NODE_NAME, "theirs");
        if let Err(e) = as_agent("mine") {
            panic!("a status write to its own node's pod was refused: {e}");
        }
        let pod = get_json(c, &["get", "pod", "mine", "-n", &ns.name]).unwrap();
        assert_eq!(
            condition(&pod, "observer.dev/AdmissionProbe").map(|c| c["status"].clone()),
            Some(Value::from("True"))
        );
    }

    /// Puts deploy/'s mode back when a test that changed it ends, passed or not.
    struct ModeRestored<'a>(&'a Cluster);

    impl Drop for ModeRestored<'_> {
        fn drop(&mut self) {
            if let Err(e) = observer_tests::cluster::set_agent_mode(self.0, None) {
                eprintln!("restoring the agent's mode: {e:#}");
            }
        }
    }

    /// The refusal of the admission policy for a write outside the mode, with its message.
    fn refused_for_mode(r: Result<(), kube::Error>, what: &str, want: &str) {
        match r {
            Ok(()) => panic!("{what}: accepted"),
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 403, "{what}: {s:?}");
                assert!(
                    s.message.contains("observer-status-mode") && s.message.contains(want),
                    "{what}: refused, but not for {want:?}: {s:?}"
                );
                eprintln!("{what}: refused ({})", s.message);
            }
            Err(other) => panic!("{what}: failed, not refused: {other}"),
        }
    }

    /// The policy per mode, with the agent's own token and deploy/'s ConfigMap as its parameter:
    /// in `conditions` mode only conditions under the prefix, in `full` only what `full`
    /// computes (and the agent's own full-mode writes after a death are all accepted, as the API
    /// server's audit log shows), in `audit` no status at all.
    #[test]
    fn admission_policy_holds_each_mode_to_what_it_writes() {
        let Some(c) = require_cluster() else { return };
        let _agent = agent_exclusive();
        let ns = Namespace::new(c, "t-modes").unwrap();
        apply(c, &busybox_pod("mine", &ns.name, "Never", "sleep 3600")).unwrap();
        wait_pod(c, &ns.name, "mine", READY, |p| {
            p["status"]["phase"] == "Running"
        })
        .unwrap();
        let _restore = ModeRestored(c);
        observer_tests::cluster::set_agent_mode(c, None).unwrap();

        let token = agent_token(c, NODE_NAME, &wait_pod_ready_agent(c));
        let patch = |p: &str| patch_status_as(c, &token, &ns.name, "mine", p);
        if let Err(e) = write_status_as(c, &token, &ns.name, "mine") {
            panic!("conditions mode: a condition under the prefix was refused: {e}");
        }
        let conditions = "in statusMode conditions the observer agent may only change conditions of type observer.dev/*";
        refused_for_mode(
            patch(r#"{"status":{"phase":"Failed"}}"#),
            "conditions mode, status.phase",
            conditions,
        );
        refused_for_mode(
            patch(r#"{"status":{"conditions":[{"type":"Ready","status":"False"}]}}"#),
            "conditions mode, kubelet's Ready",
            conditions,
        );

        observer_tests::cluster::set_agent_mode(c, Some("full")).unwrap();
        let token = agent_token(c, NODE_NAME, &wait_pod_ready_agent(c));
        let patch = |p: &str| patch_status_as(c, &token, &ns.name, "mine", p);
        if let Err(e) = patch(r#"{"status":{"message":"admission probe"}}"#) {
            panic!("full mode: status.message (which full writes) was refused: {e}");
        }
        // (nominatedNodeName, qosClass, hostIPs: the API server's own validation refuses their
        // change on a bound pod before admission; resize it takes.)
        refused_for_mode(
            patch(r#"{"status":{"resize":"Proposed"}}"#),
            "full mode, status.resize",
            "in statusMode full the observer agent may not change: status.resize",
        );
        // The agent's own full-mode writes: a container dies, the agent writes the pod's status.
        let since = std::time::SystemTime::now();
        apply(
            c,
            &busybox_pod("dies", &ns.name, "Never", "sleep 2; exit 3"),
        )
        .unwrap();
        wait_pod(c, &ns.name, "dies", READY, |p| {
            p["status"]["phase"] == "Failed"
        })
        .unwrap();
        let agent_writes = |all: &[Value]| -> Vec<Value> {
            all.iter()
                .filter(|e| e["user"]["username"] == AGENT_USER)
                .cloned()
                .collect()
        };
        let writes = poll_every(POLL, READY, || {
            let w = agent_writes(&observer_tests::cluster::status_writes(c, &ns.name, since).ok()?);
            (!w.is_empty()).then_some(w)
        })
        .expect("the agent wrote the status of the pod that died (full mode)");
        let codes: Vec<i64> = writes
            .iter()
            .map(|e| e["responseStatus"]["code"].as_i64().unwrap_or(0))
            .collect();
        eprintln!("full mode: the agent's status writes answered {codes:?}");
        assert!(
            codes.iter().all(|c| (200..300).contains(c)),
            "full mode: the agent's own writes were refused: {writes:#?}"
        );

        observer_tests::cluster::set_agent_mode(c, Some("audit")).unwrap();
        let token = agent_token(c, NODE_NAME, &wait_pod_ready_agent(c));
        refused_for_mode(
            write_status_as(c, &token, &ns.name, "mine"),
            "audit mode, a condition under the prefix",
            "in statusMode audit the observer agent writes no pod status",
        );
    }

    /// The token kubelet projected into an agent's pod (its `kube-api-access-*` volume), read on
    /// the node that holds it: the host's kubelet directory, or a guest's through its agent.
    fn agent_token(c: &Cluster, node: &str, agent: &Value) -> String {
        let uid = agent["metadata"]["uid"].as_str().unwrap();
        if node != NODE_NAME {
            let g = observer_cluster::Guest::new(c, node);
            let r = g
                .exec(
                    "/bin/sh",
                    &[
                        "-c",
                        &format!("cat /var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~projected/kube-api-access-*/token"),
                    ],
                    Duration::from_secs(60),
                )
                .unwrap();
            assert_eq!(r.code, 0, "reading the token on {node}: {}", r.stderr);
            return r.stdout.trim().to_string();
        }
        let projected = pod_volumes(c, uid).join("kubernetes.io~projected");
        let dir = std::fs::read_dir(&projected)
            .unwrap_or_else(|e| panic!("{}: {e}", projected.display()))
            .flatten()
            .find(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("kube-api-access-")
            })
            .expect("the agent's kube-api-access volume");
        std::fs::read_to_string(dir.path().join("token"))
            .unwrap()
            .trim()
            .to_string()
    }

    /// Asserts that deploy/'s `observer-own-node` policy refused the agent of `writer` writing
    /// `pod`'s status, and returns its message.
    fn refused_by_policy(r: Result<(), kube::Error>, writer: &str, pod: &str) -> String {
        match r {
            Ok(()) => panic!("the agent of {writer} wrote the status of {pod}"),
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 403, "{status:?}");
                assert!(
                    status.message.contains("observer-own-node")
                        && status.message.contains(&format!(
                            "the observer agent of node {writer} may only change pods bound to that node"
                        )),
                    "refused, but not by the admission policy: {status:?}"
                );
                status.message
            }
            Err(other) => panic!("the write failed, not refused: {other}"),
        }
    }

    /// A status write with `token`, as the agent makes it (kube's patch_status: a strategic
    /// merge patch of one condition of its own, no GET first).
    fn write_status_as(c: &Cluster, token: &str, ns: &str, pod: &str) -> Result<(), kube::Error> {
        let patch =
            r#"{"status":{"conditions":[{"type":"observer.dev/AdmissionProbe","status":"True"}]}}"#;
        patch_status_as(c, token, ns, pod, patch)
    }

    /// A strategic merge patch of `pod`'s status with `token`.
    fn patch_status_as(
        c: &Cluster,
        token: &str,
        ns: &str,
        pod: &str,
        patch: &str,
    ) -> Result<(), kube::Error> {
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{}\n    certificate-authority: {}\nusers:\n- name: agent\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context: {{cluster: c, user: agent}}\ncurrent-context: c\n",
            observer_cluster::APISERVER_PORT,
            c.dir().join("pki/ca.crt").display(),
        );
        let patch: Value = serde_json::from_str(patch).unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let kc = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
            let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .unwrap();
            let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
                kube::Api::namespaced(kube::Client::try_from(config).unwrap(), ns);
            pods.patch_status(
                pod,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Strategic(patch),
            )
            .await
            .map(|_| ())
        })
    }

    /// A status PATCH with the agent's own pod-bound token, sent with curl (a kubeconfig with a
    /// client certificate would authenticate as someone else): (HTTP code, body).
    fn curl_status_patch(
        c: &Cluster,
        token: &str,
        ns: &str,
        pod: &str,
        patch: &str,
    ) -> (u16, String) {
        let out = std::process::Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "30",
                "-X",
                "PATCH",
                "-w",
                "\n%{http_code}",
            ])
            .arg("--cacert")
            .arg(c.dir().join("pki/ca.crt"))
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .args(["-H", "Content-Type: application/strategic-merge-patch+json"])
            .args(["--data-binary", patch])
            .arg(format!(
                "https://127.0.0.1:{}/api/v1/namespaces/{ns}/pods/{pod}/status",
                observer_cluster::APISERVER_PORT
            ))
            .output()
            .expect("curl runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    fn refused_saying(r: (u16, String), what: &str, want: &str) {
        assert_eq!(r.0, 403, "{what}: {}", r.1);
        assert!(
            r.1.contains(want),
            "{what}: refused, but not for {want:?}: {}",
            r.1
        );
        eprintln!("{what}: refused");
    }

    /// What a stolen agent token cannot do, tried with curl against the real API server: change
    /// a pod's labels, annotations or finalizers through pods/status (in every mode that writes
    /// status), move a pod out of a terminal phase, make a terminated container of a Never pod
    /// run again, or claim Succeeded over a failure (full mode); and with the mode's ConfigMap
    /// deleted, nothing more than before, while kubelet's own status writes go on.
    #[test]
    fn a_stolen_agent_token_reaches_no_further_than_kubelets() {
        let Some(c) = require_cluster() else { return };
        let _agent = agent_exclusive();
        let ns = Namespace::new(c, "t-stolen").unwrap();
        apply(c, &busybox_pod("mine", &ns.name, "Never", "sleep 3600")).unwrap();
        apply(c, &busybox_pod("done", &ns.name, "Never", "exit 0")).unwrap();
        apply(c, &busybox_pod("failed", &ns.name, "Never", "exit 3")).unwrap();
        for (pod, phase) in [
            ("mine", "Running"),
            ("done", "Succeeded"),
            ("failed", "Failed"),
        ] {
            wait_pod(c, &ns.name, pod, READY, |p| p["status"]["phase"] == phase).unwrap();
        }
        let _restore = ModeRestored(c);
        observer_tests::cluster::set_agent_mode(c, None).unwrap();
        let own =
            r#"{"status":{"conditions":[{"type":"observer.dev/AdmissionProbe","status":"True"}]}}"#;
        let metadata = [
            (
                "labels",
                r#"{"metadata":{"labels":{"app":"elsewhere"}},"status":{"conditions":[{"type":"observer.dev/AdmissionProbe","status":"True"}]}}"#,
            ),
            (
                "annotations",
                r#"{"metadata":{"annotations":{"owned":"yes"}}}"#,
            ),
            (
                "finalizers",
                r#"{"metadata":{"finalizers":["example.com/never"]}}"#,
            ),
        ];
        for mode in ["conditions", "full"] {
            observer_tests::cluster::set_agent_mode(c, Some(mode)).unwrap();
            let token = agent_token(c, NODE_NAME, &wait_pod_ready_agent(c));
            for (field, patch) in metadata {
                refused_saying(
                    curl_status_patch(c, &token, &ns.name, "mine", patch),
                    &format!("{mode} mode, metadata.{field} through pods/status"),
                    &format!("metadata.{field}"),
                );
            }
            let r = curl_status_patch(c, &token, &ns.name, "mine", own);
            assert_eq!(r.0, 200, "{mode} mode: the agent's own condition: {}", r.1);
        }
        let pod = get_json(c, &["get", "pod", "mine", "-n", &ns.name]).unwrap();
        assert!(pod["metadata"]["labels"]["app"].is_null(), "{pod}");
        assert!(pod["metadata"]["finalizers"].is_null(), "{pod}");

        // full mode, held to kubelet's rules.
        let token = agent_token(c, NODE_NAME, &wait_pod_ready_agent(c));
        refused_saying(
            curl_status_patch(
                c,
                &token,
                &ns.name,
                "done",
                r#"{"status":{"phase":"Running"}}"#,
            ),
            "full mode, Succeeded back to Running",
            "terminal phase",
        );
        let failed = get_json(c, &["get", "pod", "failed", "-n", &ns.name]).unwrap();
        let mut statuses = failed["status"]["containerStatuses"].clone();
        // `terminated: null` deletes it in the strategic merge (a state holds one of the three).
        statuses[0]["state"] = serde_json::json!({"running": {"startedAt": "2026-12-06T00:00:00Z"}, "terminated": null});
        let revive = serde_json::json!({"status": {"containerStatuses": statuses}}).to_string();
        // Refused twice over: the API server's own validation (ValidateContainerStateTransition,
        // 422) before admission, and the policy's rule behind it.
        let r = curl_status_patch(c, &token, &ns.name, "failed", &revive);
        assert!(
            (r.0 == 422
                && r.1
                    .contains("may not be transitioned to non-terminated state"))
                || (r.0 == 403
                    && r.1
                        .contains("may not make a terminated container run again")),
            "full mode, a Never pod's terminated container running again: {} {}",
            r.0,
            r.1
        );
        refused_saying(
            curl_status_patch(
                c,
                &token,
                &ns.name,
                "mine",
                r#"{"status":{"observedGeneration":7}}"#,
            ),
            "full mode, observedGeneration not the pod's generation",
            "status.observedGeneration only to the pod's metadata.generation",
        );
        refused_saying(
            curl_status_patch(
                c,
                &token,
                &ns.name,
                "mine",
                r#"{"status":{"phase":"Succeeded"}}"#,
            ),
            "full mode, Succeeded while the container runs",
            "only when every container terminated with exit code 0",
        );

        // A PodReport signed with another node's name: refused (only its own node's).
        let forged = serde_json::json!({
            "apiVersion": "observer.dev/v1alpha1", "kind": "PodReport",
            "metadata": {"name": "mine", "namespace": ns.name},
            "nodeName": "another-node", "podUID": "00000000-0000-4000-8000-000000000000",
            "summary": {"deaths": 9, "oomKills": 0, "warnings": 0},
            "explanation": {},
        })
        .to_string();
        let out = std::process::Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "30",
                "-X",
                "POST",
                "-w",
                "\n%{http_code}",
            ])
            .arg("--cacert")
            .arg(c.dir().join("pki/ca.crt"))
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .args(["-H", "Content-Type: application/json"])
            .args(["--data-binary", &forged])
            .arg(format!(
                "https://127.0.0.1:{}/apis/observer.dev/v1alpha1/namespaces/{}/podreports",
                observer_cluster::APISERVER_PORT,
                ns.name
            ))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap();
        refused_saying(
            (code.trim().parse().unwrap_or(0), body.to_string()),
            "a PodReport naming another node",
            "may only write PodReports naming node",
        );

        // The mode's ConfigMap deleted: the agents keep exactly their rights (the policy
        // carries its mode), and kubelet's own writes go on.
        observer_tests::cluster::set_agent_mode(c, None).unwrap();
        let token = agent_token(c, NODE_NAME, &wait_pod_ready_agent(c));
        let cm = c
            .kubectl_ok(&[
                "-n",
                AGENT_NAMESPACE,
                "get",
                "configmap",
                "observer",
                "-o",
                "json",
            ])
            .unwrap();
        c.kubectl_ok(&["-n", AGENT_NAMESPACE, "delete", "configmap", "observer"])
            .unwrap();
        let deleted = || {
            refused_saying(
                curl_status_patch(
                    c,
                    &token,
                    &ns.name,
                    "mine",
                    r#"{"status":{"phase":"Failed"}}"#,
                ),
                "ConfigMap deleted, a running pod's phase",
                "in statusMode conditions the observer agent may only change conditions",
            );
            apply(c, &busybox_pod("after", &ns.name, "Never", "exit 0")).unwrap();
            wait_pod(c, &ns.name, "after", READY, |p| {
                p["status"]["phase"] == "Succeeded"
            })
            .expect("kubelet writes pod status with the ConfigMap gone");
        };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(deleted));
        // Put back as it was (without its server-set fields).
        let mut cm: Value = serde_json::from_str(&cm).unwrap();
        for f in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "managedFields",
        ] {
            cm["metadata"].as_object_mut().unwrap().remove(f);
        }
        apply(c, &cm.to_string()).unwrap();
        if let Err(p) = result {
            std::panic::resume_unwind(p);
        }
    }

    /// `kubectl rollout restart`: a new agent pod, the state volume's file carried over.
    #[test]
    fn rollout_restart_keeps_the_state_volume() {
        let Some(c) = require_cluster() else { return };
        let _agent = agent_exclusive();
        let ns = Namespace::new(c, "t-rollout").unwrap();
        let before = wait_pod_ready_agent(c);
        apply(c, &busybox_pod("sleeper", &ns.name, "Always", "sleep 3600")).unwrap();
        let sleeper = wait_pod(c, &ns.name, "sleeper", READY, ready).unwrap();
        let id = sleeper["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .unwrap()
            .rsplit_once("://")
            .unwrap()
            .1
            .to_string();
        let state = std::path::Path::new(observer_cluster::RUN_DIR).join("agent-state/inits");
        let recorded = poll_every(POLL, Duration::from_secs(30), || {
            std::fs::read_to_string(&state)
                .ok()
                .filter(|s| s.contains(&id))
        })
        .unwrap_or_else(|| panic!("{} never named container {id}", state.display()));

        c.kubectl_ok(&[
            "-n",
            AGENT_NAMESPACE,
            "rollout",
            "restart",
            "daemonset/observer",
        ])
        .unwrap();
        c.wait_rollout().unwrap();
        let after = wait_pod_ready_agent(c);
        assert_ne!(
            before["metadata"]["uid"], after["metadata"]["uid"],
            "the rollout did not replace the agent's pod"
        );
        let kept = std::fs::read_to_string(&state).unwrap();
        for line in recorded.lines().filter(|l| l.contains(&id)) {
            assert!(
                kept.contains(line),
                "{line:?} lost across the restart:\n{kept}"
            );
        }
    }
}
