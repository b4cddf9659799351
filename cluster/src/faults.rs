//! Faults a node sees, on the host's node: a component killed and started again, stopped for a
//! while, or paused (SIGSTOP). For the large-node suites, which take the ground truth of every
//! container death while the faults run.
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::{daemon, files, Cluster, Error, Result, NODE_NAME};

/// The components a fault can hit (the controller manager and scheduler are not on the path of a
/// death's report).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    Etcd,
    ApiServer,
    Containerd,
    Kubelet,
}

impl Component {
    pub fn name(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::ApiServer => "kube-apiserver",
            Component::Containerd => "containerd",
            Component::Kubelet => "kubelet",
        }
    }
}

impl Cluster {
    /// The component's pid while the process `up` (or [`Cluster::start_component`]) started runs.
    pub fn component_pid(&self, c: Component) -> Option<u32> {
        daemon::running(self.dir(), c.name())
    }

    /// SIGKILL to the component, and waits until it is gone (its pid file removed: it is
    /// started again only by [`Cluster::start_component`]). containerd's shims, and so the
    /// containers, outlive it, as on a real node.
    pub fn kill_component(&self, c: Component) -> Result<()> {
        let name = c.name();
        let pid = self
            .component_pid(c)
            .ok_or_else(|| Error::Missing(format!("{name} is not running")))?;
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(10);
        while daemon::running(self.dir(), name).is_some() {
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!("{name} to exit after SIGKILL"),
                    after: Duration::from_secs(10),
                    detail: String::new(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon::forget(self, name);
        Ok(())
    }

    /// SIGTERM, then SIGKILL after 10 s: a clean stop.
    pub fn stop_component(&self, c: Component) {
        daemon::stop(self, c.name());
    }

    /// Starts a component that was killed or stopped, with the arguments `up` gives it, and waits
    /// until it serves: the API server's /readyz, containerd's CRI plugin, kubelet's /healthz.
    pub fn start_component(&self, c: Component) -> Result<()> {
        if self.component_pid(c).is_some() {
            return Ok(());
        }
        let f = files::write(self)?;
        match c {
            Component::Etcd => daemon::start_etcd(self)?,
            Component::ApiServer => {
                daemon::start_apiserver(self, &f)?;
                self.wait("the API server", || {
                    self.kubectl_ok(&["get", "--raw", "/readyz"]).map(|_| ())
                })?;
            }
            Component::Containerd => daemon::start_containerd(self, &f)?,
            Component::Kubelet => {
                daemon::start_kubelet(self, &f)?;
                self.wait("kubelet's /healthz", || {
                    self.kubectl_ok(&["get", "node", NODE_NAME]).map(|_| ())?;
                    kubelet_healthy()
                })?;
            }
        }
        Ok(())
    }

    /// Restarts the host node's kubelet with these feature gates (none: its defaults), e.g.
    /// `EventedPLEG` (with `PLEGOnDemandRelist`, which 1.37 makes it depend on), and waits until
    /// it serves. The pods keep running meanwhile, as across a kubelet upgrade; the choice lasts
    /// until the next call or `down`.
    pub fn restart_kubelet_with_gates(&self, gates: &[(&str, bool)]) -> Result<()> {
        let file = self.kubelet_gates_file();
        let text: String = gates.iter().map(|(g, on)| format!("{g}: {on}\n")).collect();
        std::fs::write(&file, text).map_err(Error::io(&file))?;
        self.stop_component(Component::Kubelet);
        self.start_component(Component::Kubelet)
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) to the component: a process that holds its sockets
    /// and answers nothing.
    pub fn pause_component(&self, c: Component, pause: bool) -> Result<()> {
        let pid = self
            .component_pid(c)
            .ok_or_else(|| Error::Missing(format!("{} is not running", c.name())))?;
        let sig = if pause {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        kill(Pid::from_raw(pid as i32), sig).map_err(|e| Error::Command {
            what: format!("{sig} to {}", c.name()),
            detail: e.to_string(),
        })
    }
}

/// kubelet's healthz on 127.0.0.1:10248 (kubelet.yaml's `healthzBindAddress`) answers "ok".
fn kubelet_healthy() -> Result<()> {
    use std::io::{Read, Write};
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], 10248).into();
    let err = |detail: String| Error::Missing(format!("kubelet's /healthz: {detail}"));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| err(e.to_string()))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| err(e.to_string()))?;
    s.write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .map_err(|e| err(e.to_string()))?;
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    if answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200") {
        Ok(())
    } else {
        Err(err(answer
            .lines()
            .next()
            .unwrap_or("no answer")
            .to_string()))
    }
}
