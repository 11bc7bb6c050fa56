//! The in-process backend runs the whole suite.

use conformance::memory::MemoryFixture;

conformance::suite!(MemoryFixture::new());
