//! kubelet's generic PLEG as the benches model it: CRI ListContainers, then wait the period
//! (kubelet's `wait.Until` slides the period after each relist).
use std::time::{Duration, Instant, SystemTime};

use observer::cri::{api, CriClient};
use tokio::sync::watch;

/// kubelet's relist period.
pub const RELIST_PERIOD: Duration = Duration::from_secs(1);

/// Relists every [`RELIST_PERIOD`] until `stop` changes, calling `exited(id, received)` for each
/// EXITED container of each list (`received`: when the list arrived). Returns each relist's round
/// trip.
pub async fn relist_exited(
    cri: CriClient,
    mut stop: watch::Receiver<bool>,
    exited: impl Fn(&str, SystemTime),
) -> anyhow::Result<Vec<Duration>> {
    let mut rtts = Vec::new();
    loop {
        let t = Instant::now();
        let containers = cri.list_containers(None).await?;
        let received = SystemTime::now();
        rtts.push(t.elapsed());
        for c in containers {
            if c.state == api::ContainerState::ContainerExited as i32 {
                exited(&c.id, received);
            }
        }
        tokio::select! {
            _ = stop.changed() => return Ok(rtts),
            _ = tokio::time::sleep(RELIST_PERIOD) => {}
        }
    }
}
