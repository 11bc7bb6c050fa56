//! The shared conformance suite on MariaDB's `GET_LOCK` advisory locks.

// The shared fixtures start every kind of server; the tests need every database feature.
#![cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]

mod common;

use common::{AdvisoryFixture, Kind};

dlock_conformance::suite!(AdvisoryFixture::new(Kind::MariaDb).await);
