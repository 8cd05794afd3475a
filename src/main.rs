//! The `fsbroker` binary: a thin shell over the library (see `fsbroker --help`).

fn main() -> std::process::ExitCode {
    fsbroker::cli::main()
}
