//! The large node's CI version: 60 pods of four shapes (half gated on the agent's condition), a
//! churn of one container death a second and a pod replaced every 15 s, the agent SIGKILLed once
//! and the API server stopped for 20 s once in the middle of it. Every death the churn caused
//! (its own SIGKILLs: the ground truth) must reach the API, in the pod's status or in an Event,
//! with no duplicate Event and no pod left with a stale `ContainersAlive=True`.
//! `cargo bench -p observer-tests --bench large_node` is the full run (250 pods, every fault).
use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use observer_cluster::Component;
use observer_tests::cluster::{
    agent_exclusive, require_cluster, set_agent_mode, Namespace, AGENT_USER,
};
use observer_tests::large_node::*;
use observer_tests::wait::poll_every;

/// Lets the churn run: a span of load, not a wait for a state.
fn churn_for(d: Duration) {
    std::thread::sleep(d);
}

#[test]
fn sixty_pods_lose_no_death_through_an_agent_kill_and_an_api_server_restart() {
    let Some(c) = require_cluster() else { return };
    let _agent = agent_exclusive();
    set_agent_mode(c, None).unwrap();
    let ns = Namespace::new(c, "t-large").unwrap();
    let since = SystemTime::now();
    let fleet = Fleet::start(c, &ns.name, 60, 20, Duration::from_secs(600)).unwrap();
    let churn = Churn::start(
        c,
        &fleet,
        ChurnConfig {
            deaths_per_sec: 1.0,
            replace_every: Some(Duration::from_secs(15)),
        },
    );
    let mut faults = Vec::new();
    churn_for(Duration::from_secs(20));

    let start = SystemTime::now();
    let (_, ready_after) = kill_agent(c, Duration::from_secs(180)).unwrap();
    faults.push(Span {
        start,
        end: SystemTime::now(),
    });
    eprintln!("agent SIGKILLed: the new one was ready {ready_after:?} after its start");
    churn_for(Duration::from_secs(20));

    let start = SystemTime::now();
    c.stop_component(Component::ApiServer);
    churn_for(Duration::from_secs(20));
    c.start_component(Component::ApiServer).unwrap();
    let back = SystemTime::now();
    faults.push(Span { start, end: back });
    churn_for(Duration::from_secs(30));

    churn.pause();
    let log = churn.log();
    let stale = settle(c, &ns.name, &log.pods, Duration::from_secs(240)).unwrap();
    let excluded: HashSet<String> = log.replaced.iter().cloned().collect();
    // Deaths per container, and those no one can tell: a container that died twice while the
    // agent was away leaves the runtime one dead instance, the later (the README says so).
    let mut per_pair: HashMap<(String, String), u64> = HashMap::new();
    let mut away: HashMap<(String, String), u64> = HashMap::new();
    for d in log.deaths.iter().filter(|d| !excluded.contains(&d.pod)) {
        let key = (d.pod.clone(), d.container.clone());
        *per_pair.entry(key.clone()).or_default() += 1;
        if faults[0].holds(d.at) {
            *away.entry(key).or_default() += 1;
        }
    }
    let unknowable = |key: &(String, String)| away.get(key).map_or(0, |n| n.saturating_sub(1));
    // Events are published at the publisher's pace, and the API server may take seconds to
    // accept each: wait until every container's Events cover its deaths.
    let mut short = Vec::new();
    let events = poll_every(Duration::from_secs(1), Duration::from_secs(180), || {
        let (told, late) = agent_death_events(c, &ns.name).ok()?;
        short = per_pair
            .iter()
            .filter(|(k, n)| told.get(*k).copied().unwrap_or(0) + unknowable(k) < **n)
            .map(|(k, n)| (k.clone(), *n, told.get(k).copied().unwrap_or(0)))
            .collect::<Vec<_>>();
        short.is_empty().then_some((told, late))
    });
    // Past the deadline the account below says what is missing: read what there is.
    let events = match events {
        Some(e) => e,
        None => agent_death_events(c, &ns.name).unwrap(),
    };
    let log = churn.stop();
    let audit = audit_events(c, since).unwrap();
    let writes = agent_writes(&audit, &ns.name);
    let mut a = account(
        &log.deaths,
        &excluded,
        &writes,
        &HashMap::new(),
        &events.0,
        events.1,
        &faults,
    );
    a.stale = stale;
    let minute = back + Duration::from_secs(60);
    let agent = cost(&audit, AGENT_USER, back, minute);
    let kubelet = cost(&audit, KUBELET_USER, back, minute);
    eprintln!("{}; {} pods replaced", a.summary(), log.replaced.len());
    eprintln!(
        "first minute after the API server returned: agent {} requests ({}), {} B of pod lists; kubelet {} ({}), {} B of pod lists",
        agent.requests(),
        agent.verbs(),
        agent.list_bytes,
        kubelet.requests(),
        kubelet.verbs(),
        kubelet.list_bytes
    );
    assert!(a.deaths >= 40, "only {} deaths counted", a.deaths);
    assert!(a.during_fault > 0, "no death fell inside a fault");
    assert_eq!(
        a.lost, 0,
        "deaths told neither in status nor by an Event: {:?} (faults: {:?})",
        a.lost_where, faults
    );
    assert_eq!(a.duplicate_events, 0, "a death told by more than one Event");
    // Every death has its Event, but where the agent was away across two deaths of one
    // container.
    let untellable: Vec<_> = a
        .missing
        .iter()
        .filter(|(p, ct, deaths, told)| {
            let key = (p.clone(), ct.clone());
            deaths - told > unknowable(&key)
        })
        .collect();
    assert!(
        untellable.is_empty(),
        "deaths no Event told after 180 s (pod, container, deaths, told): {untellable:?} (still short when the wait ended: {short:?})"
    );
    assert!(
        a.stale.is_empty(),
        "pods left with a stale {ALIVE}=True: {:?}",
        a.stale
    );
    // A write sent again after the first went unanswered for the agent's request timeout is a
    // retry (printed in the summary); one sent again after its answer is a defect.
    assert_eq!(
        a.duplicate_writes, 0,
        "status writes that changed nothing: {:?}",
        a.duplicate_writes_where
    );
    // No relist storm: a re-watch from its resourceVersion, or one list of this node's pods.
    let lists = agent.by_verb.get("list").copied().unwrap_or(0);
    assert!(
        lists <= 2,
        "the agent listed {lists} times in the minute after the API server returned"
    );
}
