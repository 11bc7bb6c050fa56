//! The shared conformance suite on the lease table in PostgreSQL.

// The shared fixtures start every kind of server; the tests need every database feature.
#![cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]

mod common;

use common::{Kind, LeaseFixture};

dlock_conformance::suite!(LeaseFixture::new(Kind::Postgres).await);
