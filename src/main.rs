//! The `pi-server` binary: the command line of [`pi_front::cli`], with the
//! daemon ([`pi_daemon`]) handed in for `serve` and the session workers.

fn main() -> std::process::ExitCode {
    pi_front::cli::main(pi_front::cli::Daemon {
        serve: |options| Box::pin(pi_daemon::serve(options)),
        worker: || Box::pin(pi_daemon::worker::run_worker()),
    })
}
