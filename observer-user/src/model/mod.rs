//! The vocabulary every layer shares, and nothing else: pod and container ids, the kernel's
//! boot-time stamps and their wall-clock mapping, the injected [`Clock`], and the one way an
//! error is said with its causes. It imports nothing of the agent, so any layer may use it.
//!
//! What a pod *is* in the agent's account ([`crate::reconcile::PodView`]) stays with the
//! reconciler that builds it: its data holds the kernel's evidence (OOM reports, exits), and
//! every layer that reads it sits above the reconciler anyway.
mod clock;
mod ids;
mod text;

pub(crate) use clock::SharedClock;
pub use clock::{system_clock, BootClock, BootNs, Clock, FakeClock, SystemClock};
pub use ids::IdError;
pub use ids::{ContainerId, PodUid};
pub use text::{printable, Printable};

/// An error with its causes, each once: a cause whose text the message already holds (an I/O
/// error repeated by its wrapper) is not said again.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !text.is_empty() && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_chain_says_each_cause_once() {
        let io = std::io::Error::from_raw_os_error(111);
        let wrapped = std::io::Error::new(io.kind(), io);
        let shown = super::chain(&wrapped);
        assert_eq!(shown.matches("Connection refused").count(), 1, "{shown}");
    }
}
