//! The `dlock` command (see the `dlock_cli` library for what it runs).

fn main() -> std::process::ExitCode {
    dlock_cli::main()
}
