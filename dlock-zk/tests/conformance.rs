//! The shared conformance suite against a real ZooKeeper server.

mod common;

dlock_conformance::suite!(common::ZkFixture::standalone().await);
