//! containerd's own event service (containerd.services.events.v1.Events/Subscribe), filtered to
//! `/tasks/exit`: the runtime's view of a process exit, to compare kernel-based detection against.
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use containerd_client::events::TaskExit as TaskExitProto;
use containerd_client::services::v1::events_client::EventsClient;
use containerd_client::services::v1::{PublishRequest, SubscribeRequest};
use prost::Message;
use tonic::transport::Channel;

/// One `/tasks/exit` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskExit {
    /// containerd namespace (`k8s.io` for CRI containers).
    pub namespace: String,
    /// The container (the CRI container or sandbox id).
    pub container_id: String,
    /// The process: equal to `container_id` for the container's init, an exec id otherwise.
    pub id: String,
    pub pid: u32,
    /// The exit code, or 128 + signal for a killed process (containerd's convention).
    pub exit_status: u32,
    /// When the shim reaped the process.
    pub exited_at: SystemTime,
    /// When containerd published the event.
    pub published_at: Option<SystemTime>,
    /// When this client received it (stamped by the task reading the stream).
    pub received_at: SystemTime,
}

impl TaskExit {
    pub fn is_init(&self) -> bool {
        self.id == self.container_id
    }
}

/// Topic of the marker events [`TaskExitStream::subscribe`] publishes to itself.
const SYNC_TOPIC: &str = "/observer-tests/subscribed";
const SYNC_NAMESPACE: &str = "observer-tests";

type Received = (
    Result<containerd_client::types::Envelope, tonic::Status>,
    SystemTime,
);

/// A live subscription to `/tasks/exit`. Every event published after
/// [`TaskExitStream::subscribe`] returned is seen.
pub struct TaskExitStream {
    rx: tokio::sync::mpsc::UnboundedReceiver<Received>,
    pump: tokio::task::JoinHandle<()>,
}

impl Drop for TaskExitStream {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

impl TaskExitStream {
    /// Subscribes on a channel connected to containerd's socket (the one that also serves CRI).
    /// `namespace` restricts to one containerd namespace (`Some("k8s.io")` for CRI).
    ///
    /// containerd sends the response headers of Subscribe only with the first event, and tonic
    /// waits for headers, so the call is driven in a background task and this publishes marker
    /// events until one comes back: then the subscription is known to be live.
    pub async fn subscribe(channel: Channel, namespace: Option<&str>) -> Result<Self> {
        let exits = match namespace {
            Some(ns) => format!(r#"topic=="/tasks/exit",namespace=="{ns}""#),
            None => r#"topic=="/tasks/exit""#.to_string(),
        };
        let filters = vec![exits, format!(r#"topic=="{SYNC_TOPIC}""#)];
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Received>();
        let mut client = EventsClient::new(channel.clone());
        let pump = tokio::spawn(async move {
            let mut stream = match client.subscribe(SubscribeRequest { filters }).await {
                Ok(resp) => resp.into_inner(),
                Err(status) => {
                    let _ = tx.send((Err(status), SystemTime::now()));
                    return;
                }
            };
            loop {
                let msg = stream.message().await;
                // Stamped here, as soon as the message is decoded, for latency measurements.
                let now = SystemTime::now();
                let item = match msg {
                    Ok(Some(env)) => Ok(env),
                    Ok(None) => return,
                    Err(status) => Err(status),
                };
                let end = item.is_err();
                if tx.send((item, now)).is_err() || end {
                    return;
                }
            }
        });
        let token = format!("{:016x}", fastrand::u64(..));
        let mut publisher = EventsClient::new(channel);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut req = tonic::Request::new(PublishRequest {
                topic: SYNC_TOPIC.into(),
                event: Some(prost_types::Any {
                    type_url: "observer-tests/subscribed".into(),
                    value: token.clone().into_bytes(),
                }),
            });
            req.metadata_mut()
                .insert("containerd-namespace", SYNC_NAMESPACE.parse()?);
            publisher
                .publish(req)
                .await
                .context("containerd Events.Publish")?;
            let wait = tokio::time::sleep(Duration::from_millis(100));
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    item = rx.recv() => match item {
                        Some((Ok(env), _)) => {
                            if env.topic == SYNC_TOPIC && env.event.is_some_and(|e| e.value == token.as_bytes()) {
                                return Ok(TaskExitStream { rx, pump });
                            }
                        }
                        Some((Err(status), _)) => bail!("containerd Events.Subscribe: {status}"),
                        None => bail!("containerd ended the event stream while subscribing"),
                    },
                    _ = &mut wait => break,
                }
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("containerd Events.Subscribe: no marker event came back within 10 s");
            }
        }
    }

    /// The next exit; `None` when containerd ended the stream (e.g. it stopped).
    pub async fn next(&mut self) -> Result<Option<TaskExit>> {
        loop {
            let Some((env, received_at)) = self.rx.recv().await else {
                return Ok(None);
            };
            let env = env.context("containerd event stream")?;
            let Some(any) = env.event else { continue };
            // Skip the markers; check the payload type too, so a change in containerd cannot
            // make us decode something else as an exit.
            if env.topic != "/tasks/exit" || !any.type_url.ends_with("containerd.events.TaskExit") {
                continue;
            }
            let ev = TaskExitProto::decode(any.value.as_slice()).context("decoding TaskExit")?;
            return Ok(Some(TaskExit {
                namespace: env.namespace,
                container_id: ev.container_id,
                id: ev.id,
                pid: ev.pid,
                exit_status: ev.exit_status,
                exited_at: ev.exited_at.map(to_system_time).unwrap_or(UNIX_EPOCH),
                published_at: env.timestamp.map(to_system_time),
                received_at,
            }));
        }
    }

    /// The next exit of `container_id`'s init process, skipping others, within `timeout`.
    pub async fn wait_for(&mut self, container_id: &str, timeout: Duration) -> Result<TaskExit> {
        tokio::time::timeout(timeout, async {
            loop {
                match self.next().await? {
                    Some(ev) if ev.container_id == container_id && ev.is_init() => return Ok(ev),
                    Some(_) => continue,
                    None => bail!("containerd ended the event stream"),
                }
            }
        })
        .await
        .with_context(|| format!("no /tasks/exit for {container_id} within {timeout:?}"))?
    }
}

fn to_system_time(ts: prost_types::Timestamp) -> SystemTime {
    let nanos = u32::try_from(ts.nanos).unwrap_or(0);
    match u64::try_from(ts.seconds) {
        Ok(s) => UNIX_EPOCH + Duration::new(s, nanos),
        Err(_) => UNIX_EPOCH,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_convert() {
        let t = to_system_time(prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 5,
        });
        assert_eq!(
            t.duration_since(UNIX_EPOCH).unwrap(),
            Duration::new(1_700_000_000, 5)
        );
        assert_eq!(
            to_system_time(prost_types::Timestamp {
                seconds: -1,
                nanos: 0
            }),
            UNIX_EPOCH
        );
    }
}
