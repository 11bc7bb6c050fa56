//! The shared conformance suite against a real ZooKeeper server.

mod common;

conformance::suite!(common::ZkFixture::standalone().await);
