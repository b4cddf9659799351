//! Where the runtime offers GetContainerEvents (containerd 1.7+, CRI-O), each of its events makes
//! the reconciler re-read that pod: it is how the removal of a dead container's record (kubelet's
//! garbage collection, invisible to the kernel) shows without waiting for the relist.
use tokio::sync::mpsc;

use super::runtime::RuntimeService;
use crate::{cri::KubeletLabels, model::PodUid};

pub(super) async fn follow<R: RuntimeService>(cri: R, tx: mpsc::Sender<PodUid>) {
    let mut conn = cri.connection();
    loop {
        let _ = conn.wait_for(|s| s.connected).await;
        let generation = conn.borrow().generation;
        match cri.container_events().await {
            Ok(mut stream) => {
                tracing::info!("following the runtime's container events");
                while let Some(ev) = stream.next().await {
                    let Ok(ev) = ev else { break };
                    let uid = ev.pod_sandbox_status.as_ref().and_then(|s| {
                        s.pod_uid()
                            .or_else(|| s.metadata.as_ref().map(|m| m.uid.as_str()))
                            .and_then(PodUid::parse)
                    });
                    if let Some(uid) = uid {
                        if tx.send(uid).await.is_err() {
                            return;
                        }
                    }
                }
            }
            Err(e) if e.is_unimplemented() => {
                tracing::info!("the runtime has no GetContainerEvents; removals of dead containers show at the relist");
            }
            Err(e) => tracing::debug!("GetContainerEvents: {}", e.chain()),
        }
        // Try again only on the next connection.
        if conn.wait_for(|s| s.generation != generation).await.is_err() {
            return;
        }
    }
}
