//! The Redis backend runs the whole shared suite against a real redis-server.

mod support;

dlock_conformance::suite!(support::RedisFixture::new());
