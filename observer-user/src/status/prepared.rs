//! A running container's death patch, made at the status manager's turn, so that the reader
//! thread only splices in what the death alone knows.
//!
//! A failed death (a non-zero exit, or a signal) of a container the condition covers is always
//! the same transition: ContainersAlive True to False, reason ContainerDied, the message the dead
//! containers' words in the spec's order. Of all that, only this container's words (how and
//! when it ended) and the transition time are new at the death: the rest of the message, the
//! body's JSON around them and the UID precondition follow from the view the manager last
//! computed. Made there, the condition's computation and the JSON encoding leave the death's
//! way: on the reader thread, waking from a sleep, every page they touch is a cache miss, and
//! they took about 200 µs (p50) of the way to the wire on the api_path bench's machine. At the
//! death only the body's parts are made ([`Prepared::fill`], [`Prepared::body`]), and the
//! request is put together from them in its connection's buffer; the condition the ledger keeps
//! ([`Prepared::condition`]) waits until the request is written. An exit 0 (a job's end, which
//! need not be a death) takes the full computation.
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Pod, PodCondition};

use super::{
    compute::{all_containers_could_restart, rfc3339_into, to_time},
    conditions::{death_words, observer_conditions, ConditionTypes, Ending, REASON_DIED},
    patch::conditions_patch,
};
use crate::{
    model::{BootClock, ContainerId},
    pleg::Death,
    reconcile::{ContainerPhase, PodView},
};

/// Stand-ins the made patch carries where the death's own values go: an exit code no process
/// has (exit codes are 0–255), a reason no runtime gives, a time no death has.
const EXIT: i32 = i32::MIN + 7;
const REASON: &str = "\u{1}observer:reason\u{1}";
const MESSAGE: &str = "\u{1}observer:message\u{1}";
const TIME: Duration = Duration::from_secs(1);

/// What a death brings to its made patch: its words (how and when it ended, as the message
/// says them, and JSON-escaped where they need it) and the transition time.
#[derive(Debug)]
pub struct DeathDetails {
    /// The words, then the time: one allocation.
    text: String,
    words_len: usize,
    escaped: Option<Vec<u8>>,
}

impl DeathDetails {
    pub fn words(&self) -> &str {
        &self.text[..self.words_len]
    }

    fn time(&self) -> &str {
        &self.text[self.words_len..]
    }
}

/// One container's death patch, less the death.
#[derive(Debug)]
pub struct Prepared {
    pub container: ContainerId,
    name: String,
    restart_count: u32,
    /// The condition's message before and after this container's words, and the same as JSON
    /// string content (escaped, unquoted).
    message: (String, String),
    message_json: (Vec<u8>, Vec<u8>),
    /// The body's bytes around its two holes, and which hole comes first.
    body: [Vec<u8>; 3],
    message_first: bool,
    /// The pod's generation the condition observed (in the body already).
    generation: Option<i64>,
}

impl Prepared {
    /// The patch for the failed death of `container` (running, the newest of its name in
    /// `view`) of `pod` (the API's): `None` where that death would not be the usual transition
    /// (a container the condition does not cover, a pod already not alive) or depends on the
    /// exit code beyond its failure (a RestartAllContainers rule: which code restarts every
    /// container decides whether the completed ones are done).
    pub fn new(
        types: &ConditionTypes,
        pod: &Pod,
        view: &PodView,
        api_uid: &str,
        container: ContainerId,
    ) -> Option<Self> {
        if pod.spec.as_ref().is_some_and(all_containers_could_restart) {
            return None;
        }
        let mut dead = view.clone();
        let c = dead.containers.iter_mut().find(|c| c.id == container)?;
        if c.phase != ContainerPhase::Running {
            return None;
        }
        c.phase = ContainerPhase::Exited;
        c.exit_code = Some(EXIT);
        c.signal = None;
        c.reason = Some(REASON.to_string());
        c.finished_at = None;
        let (name, restart_count) = (c.name.clone(), c.restart_count);
        let at = UNIX_EPOCH + TIME;
        let mut alive = observer_conditions(Some(pod), &dead, &[], types, at)
            .into_iter()
            .find(|c| c.type_ == types.alive)
            .filter(|c| c.status == "False" && c.reason.as_deref() == Some(REASON_DIED))?;
        let words = death_words(&name, restart_count, &stand_in());
        let generation = alive.observed_generation;
        let (head, tail) = alive.message.as_deref()?.split_once(&words)?;
        let message = (head.to_string(), tail.to_string());
        let message_json = (json_content(head)?, json_content(tail)?);
        alive.message = Some(MESSAGE.to_string());
        let body = conditions_patch(api_uid, &[], std::slice::from_ref(&alive)).ok()??;
        let bytes = serde_json::to_vec(&body).ok()?;
        let m_hole = serde_json::to_vec(MESSAGE).ok()?;
        let t_hole = serde_json::to_vec(&to_time(at)).ok()?;
        let m = find(&bytes, &m_hole)?;
        let t = find(&bytes, &t_hole)?;
        let (first, first_len, second, second_len) = if m < t {
            (m, m_hole.len(), t, t_hole.len())
        } else {
            (t, t_hole.len(), m, m_hole.len())
        };
        Some(Self {
            container,
            name,
            restart_count,
            message,
            message_json,
            body: [
                bytes[..first].to_vec(),
                bytes[first + first_len..second].to_vec(),
                bytes[second + second_len..].to_vec(),
            ],
            message_first: m < t,
            generation,
        })
    }

    /// Whether this death is one the patch was made for: a failure (an exit 0 may be a job's
    /// end, which the full computation tells apart).
    pub fn fits(d: &Death) -> bool {
        d.exit.status.is_some_and(|s| s.exit_code() != 0)
    }

    /// What `d` (which [`Self::fits`]) brings to the body, the transition at `now`.
    pub fn fill(&self, d: &Death, clock: &BootClock, now: SystemTime) -> Option<DeathDetails> {
        let status = d.exit.status?;
        let ending = Ending {
            exit_code: Some(status.exit_code()),
            signal: status.signal(),
            reason: Some(d.exit.reason.as_str()),
            finished_at: Some(clock.to_system_time(d.at)),
        };
        let mut text = death_words(&self.name, self.restart_count, &ending);
        let words_len = text.len();
        let words = &text[..];
        // The words need no escaping unless a name or reason brings a quote, a backslash or a
        // control character.
        let escaped = if words.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
            None
        } else {
            Some(json_content(words)?)
        };
        // The API's `Time`, without its serializer's runtime-parsed format.
        rfc3339_into(now, &mut text);
        Some(DeathDetails {
            text,
            words_len,
            escaped,
        })
    }

    /// The body with `f` spliced in, in parts (the request is put together from them).
    pub fn body<'a>(&'a self, f: &'a DeathDetails) -> [&'a [u8]; 11] {
        let words = f.escaped.as_deref().unwrap_or(f.words().as_bytes());
        let m = [
            &b"\""[..],
            &self.message_json.0,
            words,
            &self.message_json.1,
            b"\"",
        ];
        let t = [&b"\""[..], f.time().as_bytes(), b"\""];
        let (a, b): (&[&[u8]], &[&[u8]]) = if self.message_first {
            (&m, &t)
        } else {
            (&t, &m)
        };
        let mut parts: [&[u8]; 11] = [&[]; 11];
        let all = std::iter::once(&self.body[0][..])
            .chain(a.iter().copied())
            .chain(std::iter::once(&self.body[1][..]))
            .chain(b.iter().copied())
            .chain(std::iter::once(&self.body[2][..]));
        for (slot, part) in parts.iter_mut().zip(all) {
            *slot = part;
        }
        parts
    }

    /// The condition the body of [`Self::fill`] sets, from the death's `words`.
    pub fn condition(&self, types: &ConditionTypes, words: &str, now: SystemTime) -> PodCondition {
        PodCondition {
            type_: types.alive.clone(),
            status: "False".to_string(),
            reason: Some(REASON_DIED.to_string()),
            message: Some([self.message.0.as_str(), words, self.message.1.as_str()].concat()),
            last_transition_time: Some(to_time(now)),
            observed_generation: self.generation,
            ..Default::default()
        }
    }
}

fn stand_in() -> Ending<'static> {
    Ending {
        exit_code: Some(EXIT),
        signal: None,
        reason: Some(REASON),
        finished_at: None,
    }
}

/// `s` as the content of a JSON string: escaped as serde_json escapes it, without the quotes.
fn json_content(s: &str) -> Option<Vec<u8>> {
    let quoted = serde_json::to_vec(s).ok()?;
    Some(quoted[1..quoted.len() - 1].to_vec())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        kernel::WaitStatus,
        kube::testkit::{container, cv, pod, spec, t, view, UID},
        pleg::{ContainerExit, ExitReason},
    };

    fn failed(view: &PodView, container: ContainerId) -> Death {
        Death {
            pod: view.uid,
            container,
            at: BootClock::now(),
            exit: ContainerExit {
                status: Some(WaitStatus::exited(1)),
                reason: ExitReason::Error,
                pid: Some(4242),
                comm: None,
            },
        }
    }

    /// The made patch's condition observed the pod's generation, in the body sent and in the
    /// condition the ledger keeps (the same JSON).
    #[test]
    fn a_made_patch_carries_the_pods_generation() {
        let types = ConditionTypes::default();
        let mut p = pod(spec("Always", vec![], vec![container("app")]), None);
        p.metadata.generation = Some(5);
        let v = view(vec![cv("app", 0, ContainerPhase::Running)]);
        let id = v.containers[0].id;
        let made = Prepared::new(&types, &p, &v, UID, id).expect("a made patch");
        let filled = made
            .fill(&failed(&v, id), &BootClock::default(), t(100))
            .expect("filled");
        let body: Vec<u8> = made.body(&filled).concat();
        let sent: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        let alive = &sent["status"]["conditions"][0];
        assert_eq!(alive["observedGeneration"], 5, "{sent}");
        let kept = made.condition(&types, filled.words(), t(100));
        assert_eq!(kept.observed_generation, Some(5));
        assert_eq!(serde_json::to_value(&kept).expect("JSON"), *alive);
    }

    /// Under a RestartAllContainers rule a failure's code decides whether the completed
    /// containers run again (and so the message): no patch is made ahead.
    #[test]
    fn no_patch_is_made_ahead_under_a_restart_all_containers_rule() {
        use k8s_openapi::api::core::v1::{ContainerRestartRule, ContainerRestartRuleOnExitCodes};
        let types = ConditionTypes::default();
        let mut trigger = container("app");
        trigger.restart_policy = Some("Never".into());
        trigger.restart_policy_rules = Some(vec![ContainerRestartRule {
            action: "RestartAllContainers".into(),
            exit_codes: Some(ContainerRestartRuleOnExitCodes {
                operator: "In".into(),
                values: Some(vec![42]),
            }),
        }]);
        let p = pod(spec("Never", vec![], vec![trigger]), None);
        let v = view(vec![cv("app", 0, ContainerPhase::Running)]);
        assert!(Prepared::new(&types, &p, &v, UID, v.containers[0].id).is_none());
    }
}
