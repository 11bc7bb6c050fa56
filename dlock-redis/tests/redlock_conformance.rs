//! RedLock runs the whole shared suite against five real, persistent redis-servers.

mod support;

dlock_conformance::suite!(support::redlock::RedLockFixture::new());
