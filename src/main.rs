//! The `fsbroker` binary: a thin shell over the library (see `fsbroker --help`). The command
//! line (`cli/`), `fsbroker bench` (`bench/`) and the person's web console (`console/`) are
//! modules of this binary, not of the library, and use the library only through its public
//! API (`fsbroker::...`).

mod bench;
mod cli;
mod console;

fn main() -> std::process::ExitCode {
    limit_malloc_arenas();
    cli::main()
}

/// glibc gives each thread that allocates an arena of its own (up to eight per CPU) and keeps
/// what is freed in it. The broker's blocking threads take turns building large, short-lived
/// things (line buffers, watch snapshots), so each arena grew to the largest it ever held:
/// refused watches of one wide tree, handled by different threads, left 28 MiB each behind
/// (`docs/security.md`, "Known limits"). Two arenas keep the threads from contending much
/// while the memory freed by one is reused by the next.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` takes two integers and touches only the allocator's own settings;
        // it has no memory-safety preconditions, and it runs first thing in `main`, before
        // any thread of ours exists.
        #[allow(unsafe_code)]
        let set = unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
        if set != 1 {
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                b"fsbroker: could not limit malloc arenas; memory use may be higher\n",
            );
        }
    }
}
