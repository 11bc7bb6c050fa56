//! The peer gates of an etcd cluster really partition it: an isolated follower loses
//! its leader and its health, the majority keeps or elects a leader, and healing brings
//! the isolated member back.

use std::time::{Duration, Instant};

use dlock_testkit::supervisor::etcd::{EtcdCluster, EtcdConfig};

fn until(what: &str, within: Duration, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_isolated_member_loses_the_cluster_and_heals() {
    let mut cluster = EtcdCluster::start(3, &EtcdConfig::default()).expect("start a 3-member cluster");
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).expect("a leader");
    let follower = (leader + 1) % 3;
    cluster.isolate(follower).expect("isolate a follower");
    until("the isolated follower reports itself unhealthy", Duration::from_secs(15), || {
        !cluster.member(follower).is_healthy()
    });
    assert!(cluster.member(leader).is_healthy(), "the majority's leader stays healthy");
    cluster.heal();
    until("the healed follower is healthy again", Duration::from_secs(15), || cluster.member(follower).is_healthy());

    cluster.isolate(leader).expect("isolate the leader");
    until("the majority elects another leader", Duration::from_secs(15), || {
        (0..3).any(|i| i != leader && cluster.member(i).is_leader())
    });
    cluster.heal();
    cluster.wait_for_leader(Duration::from_secs(20)).expect("one leader after healing");
}
