//! The `dlock` command.
fn main() {}
