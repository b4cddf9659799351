//! The fast path beside the status manager, on paused time.
use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::PodCondition;

use super::*;
use crate::{
    kube::testkit::{api, server, *},
    reconcile::{ContainerPhase::Running, ReconcileHandle},
    status::{manager::testkit::*, StatusConfig, StatusManager, StatusMode},
};

/// With the fast path: a death it wrote (and the API accepted) is not written again, a view that
/// has not caught up with it is not written (it would say True), and the transition time is the
/// fast path's.
#[tokio::test(start_paused = true)]
async fn a_death_the_fast_path_wrote_is_not_written_again_nor_undone() {
    let (client, handle) = api::client();
    let log = server::serve(handle, vec![app_pod()], vec![]);
    let mut cfg = StatusConfig::new("node-1", StatusMode::Conditions);
    cfg.backoff_seed = Some(1);
    let reconcile = ReconcileHandle::detached();
    let (mut m, h) = StatusManager::new(client, cfg, reconcile.clone());
    let ledger = Arc::new(AliveLedger::new().unwrap());
    m.set_alive_ledger(Arc::clone(&ledger));
    tokio::spawn(m.run());
    tokio::time::timeout(Duration::from_secs(5), h.pods().ready())
        .await
        .expect("the reflector listed");
    let h = Handles {
        status: h,
        reconcile,
    };
    let up = view(vec![cv("app", 0, Running)]);
    h.observe(&up);
    settle().await;
    assert_eq!(server::patches(&log).len(), 1, "True written");

    // The PLEG's hook decides the death from what the manager last computed (no lock of the
    // reconciler's or the reflector's), claims it, and hands the patch over; the API accepts it.
    let dead = view(vec![died_now("app", 0, 1, "Error")]);
    let uid = up.uid;
    let id = up.containers[0].id;
    let stats = Arc::new(FastStats::default());
    let decider = |ledger: &Arc<AliveLedger>| DeathDecider {
        types: ConditionTypes::default(),
        ledger: Arc::clone(ledger),
        stats: Arc::clone(&stats),
        clock: crate::model::system_clock(),
    };
    let clock = crate::model::BootClock::default();
    // No dialer runs: the hook only decides and claims here (what it writes is the API
    // stand-in's and the cluster's tests').
    let (_dialer, dialed) = crate::fastpath::dial::pair(None, Duration::from_secs(5)).unwrap();
    let mut hook = FastDeaths::new(
        decider(&ledger),
        clock.clone(),
        "observer",
        Duration::from_secs(5),
        dialed,
    );
    let death = super::exited_1(uid, id);
    assert!(
        hook.claim(&death).is_none(),
        "no client yet: left to the manager"
    );
    assert_eq!(FastStats::get(&stats.skipped), 1);
    ledger.writer_running(true);
    let job = hook.claim(&death).expect("the death's patch");
    let body: serde_json::Value = serde_json::from_slice(&job.patch.parts().concat()).unwrap();
    // As once its request is written: the claimed condition into the ledger.
    decider(&ledger).settle(job.patch, &job.death);
    let claimed: Vec<PodCondition> =
        serde_json::from_value(body["status"]["conditions"].clone()).unwrap();
    let claimed = claimed
        .into_iter()
        .find(|c| c.type_ == "observer.dev/ContainersAlive")
        .expect("ContainersAlive in the patch");
    assert_eq!(claimed.status, "False");
    assert!(
        claimed.message.as_deref().unwrap_or("").contains("app"),
        "{claimed:?}"
    );
    // The same death again (a resync): the ledger says False already, nothing more is sent.
    assert!(hook.claim(&death).is_none());
    // The answer is the ledger's signal to the manager (not a change of the view): its turn
    // comes, and waits, its view not showing the death yet.
    ledger.confirm(&uid, id);
    settle().await;
    assert_eq!(h.stats().fast_waits.load(Ordering::Relaxed), 1);

    // A change of the view that does not show the death yet: not written.
    h.observe(&up);
    settle().await;
    assert_eq!(
        server::patches(&log).len(),
        1,
        "nothing written over the fast path's False"
    );
    assert_eq!(h.stats().fast_waits.load(Ordering::Relaxed), 2);

    // The view shows it, later: the same condition, its transition time kept, not sent again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    h.observe(&dead);
    settle().await;
    assert_eq!(
        server::patches(&log).len(),
        1,
        "{:#?}",
        server::patches(&log)
    );
    match ledger.manager_turn(&uid, |_| true) {
        crate::status::ledger::ManagerTurn::Unclaimed { alive: Some(a) } => {
            assert_eq!(a.status, "False");
            // As the API has it: seconds.
            assert_eq!(
                serde_json::to_value(&a.last_transition_time).unwrap(),
                serde_json::to_value(&claimed.last_transition_time).unwrap()
            );
        }
        other => panic!("the claim is settled by the manager: {other:?}"),
    }

    // Back up: True is the manager's to write.
    let mut again = cv("app", 1, Running);
    again.id = crate::model::ContainerId::parse(&format!("{:064x}", 99)).unwrap();
    h.observe(&view(vec![again]));
    settle().await;
    let p = server::patches(&log);
    assert_eq!(p.len(), 2);
    assert_eq!(
        condition(&p[1].body, "observer.dev/ContainersAlive").unwrap()["status"],
        "True"
    );
}
