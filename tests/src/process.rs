//! The `observer` binary run as a user runs it, its stdout collected line by line as it comes, so
//! a test can wait (with a deadline) for a line, kill the process at a chosen moment, or stop it
//! the way an operator does.
use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use nix::sys::signal::Signal;

pub struct ObserverProcess {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl ObserverProcess {
    /// Starts `observer <args>`.
    pub fn spawn(args: &[&str]) -> anyhow::Result<Self> {
        let mut child = Command::new(crate::observer_bin())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        for (pipe, sink) in [
            (
                Box::new(child.stdout.take().expect("stdout")) as Box<dyn std::io::Read + Send>,
                Arc::clone(&lines),
            ),
            (
                Box::new(child.stderr.take().expect("stderr")),
                Arc::clone(&stderr),
            ),
        ] {
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    sink.lock().expect("lines lock").push(line);
                }
            });
        }
        Ok(Self {
            child,
            lines,
            stderr,
        })
    }

    /// `observer watch --pods --format json` beside the runtime at `endpoint`, its state (the
    /// inits the agent kept) in `state_dir`.
    pub fn watch_pods(endpoint: &str, state_dir: &std::path::Path) -> anyhow::Result<Self> {
        Self::spawn(&[
            "watch",
            "--pods",
            "--format",
            "json",
            "--cri-endpoint",
            endpoint,
            "--state-dir",
            &state_dir.display().to_string(),
        ])
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every stdout line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines lock").clone()
    }

    /// stderr so far, for failure messages.
    pub fn stderr(&self) -> String {
        self.stderr.lock().expect("stderr lock").join("\n")
    }

    /// The newest stdout line that is JSON and satisfies `pred`, waiting up to `timeout`.
    pub async fn json_until(
        &self,
        timeout: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> Option<serde_json::Value> {
        crate::poll_until_async(timeout, || {
            self.lines()
                .iter()
                .rev()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|v| pred(v))
        })
        .await
    }

    /// Sends `sig` (SIGKILL: a crash; SIGTERM: an orderly stop) and reaps the process.
    pub fn stop(&mut self, sig: Signal) -> std::io::Result<std::process::ExitStatus> {
        crate::sys_signal(self.child.id(), sig);
        self.child.wait()
    }
}

impl Drop for ObserverProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
