//! The shared conformance suite against a real etcd.

mod common;

conformance::suite!(common::EtcdFixture::start().await);
