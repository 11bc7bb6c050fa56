//! The in-process backend runs the whole suite.

use dlock_conformance::memory::MemoryFixture;

dlock_conformance::suite!(MemoryFixture::new());
