//! The shared conformance suite against a real etcd.

mod common;

dlock_conformance::suite!(common::EtcdFixture::start().await);
