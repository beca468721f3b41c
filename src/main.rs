//! The `pi-server` binary: see [`pi_io::cli`] for the commands.

fn main() -> std::process::ExitCode {
    pi_io::cli::main()
}
