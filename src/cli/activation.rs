//! systemd's socket activation and readiness for `serve --listen` (sd_listen_fds(3),
//! sd_notify(3)): the socket a `.socket` unit listens on is handed to the broker as
//! descriptor 3, with `LISTEN_FDS`, `LISTEN_PID` and `LISTEN_FDNAMES` saying so.
//!
//! The protocol is read with the `sd-notify` crate rather than `listenfd`: `listenfd` takes a
//! missing `LISTEN_PID` as ours, honours `LISTEN_FDS_FIRST_FD` (not systemd's, and a way for
//! an environment to name any descriptor), and leaves `LISTEN_FDNAMES` set; `sd-notify`
//! takes the descriptors only when `LISTEN_PID` is this process, makes them close-on-exec,
//! and unsets all three. What the descriptor must be is the library's check
//! (`fsbroker::transport::listen::Socket::handed`).

use std::os::fd::{FromRawFd, OwnedFd};

/// Where systemd puts the first handed descriptor (`SD_LISTEN_FDS_START`).
const FIRST_FD: i32 = 3;

/// Takes the listening socket systemd handed this process, if it handed one: `Ok(None)`
/// without `LISTEN_FDS`, or when `LISTEN_PID` names another process (the variables were
/// inherited from a parent they were meant for). Exactly one descriptor is accepted; more,
/// or variables that do not parse, are an error that names them. The three variables are
/// unset whenever `LISTEN_FDS` was set, so no program the broker starts (a consent command)
/// inherits them.
///
/// Must run first in `serve`, while the process has one thread and has opened no descriptor
/// of its own beyond stdio (see the `SAFETY` comments).
pub(super) fn take_listening_socket() -> Result<Option<OwnedFd>, String> {
    // Without it there is nothing to take: everything is as without systemd.
    let Some(count) = std::env::var_os("LISTEN_FDS") else {
        return Ok(None);
    };
    let for_pid = std::env::var_os("LISTEN_PID");
    let names = std::env::var_os("LISTEN_FDNAMES");
    let threads = threads()?;
    if threads != 1 {
        return Err(format!(
            "cannot take the socket systemd handed over: the environment can be changed only \
             while the process has one thread, and it has {threads}"
        ));
    }
    // SAFETY: `listen_fds_with_names_and_unset_env` calls `std::env::remove_var`, which is
    // sound while no other thread reads or writes the environment. This process has exactly
    // one thread (counted just above in /proc/self/task; only this thread could start
    // another, and it starts none before the call returns), so none can.
    #[allow(unsafe_code)]
    let fds = unsafe { sd_notify::listen_fds_with_names_and_unset_env() };
    let fds: Vec<(i32, String)> = fds
        .map_err(|e| {
            // `fcntl` on a descriptor that is not open: the variables promise more than came.
            let why = if e.raw_os_error() == Some(libc::EBADF) {
                format!("a descriptor it names (from {FIRST_FD} on) is not open")
            } else {
                e.to_string()
            };
            format!(
                "systemd's socket activation: {why} (LISTEN_FDS={}, LISTEN_PID={}, \
                 LISTEN_FDNAMES={})",
                count.to_string_lossy(),
                shown(for_pid.as_ref()),
                shown(names.as_ref())
            )
        })?
        .collect();
    match fds.as_slice() {
        [] => {
            tracing::info!(
                listen_pid = shown(for_pid.as_ref()),
                "LISTEN_FDS is for another process (LISTEN_PID); ignored, and unset"
            );
            Ok(None)
        }
        [(fd, name)] if *fd == FIRST_FD => {
            tracing::info!(fd, name, "taking the socket systemd handed over");
            // SAFETY: `from_raw_fd` needs `fd` open and owned by nothing else in the process.
            // It is open: `sd-notify` has just set close-on-exec on it (`fcntl` fails on a
            // closed descriptor). It is owned by nothing else: it came with `exec`, because
            // nothing this process ran before keeps a descriptor of its own open (`main`:
            // `mallopt`; clap's parsing; the log's set-up, which writes to the stderr it has),
            // and no code but this reads `LISTEN_FDS`, which is now unset, so it is taken
            // once.
            #[allow(unsafe_code)]
            let fd = unsafe { OwnedFd::from_raw_fd(*fd) };
            Ok(Some(fd))
        }
        more => Err(format!(
            "systemd handed over {} descriptors (LISTEN_FDS={}, LISTEN_FDNAMES={}); `serve \
             --listen` takes exactly one listening socket: give the socket unit a single \
             ListenStream=",
            more.len(),
            count.to_string_lossy(),
            shown(names.as_ref())
        )),
    }
}

/// The number of threads of this process.
// Ambient `std::fs` is right here (clippy.toml keeps it from request paths): /proc is the
// kernel's, not a root's.
#[allow(clippy::disallowed_methods)]
fn threads() -> Result<usize, String> {
    std::fs::read_dir("/proc/self/task")
        .map(Iterator::count)
        .map_err(|e| {
            format!(
                "cannot take the socket systemd handed over: cannot count this process's \
                 threads in /proc/self/task: {e}"
            )
        })
}

fn shown(value: Option<&std::ffi::OsString>) -> String {
    value.map_or_else(
        || "(unset)".to_owned(),
        |v| v.to_string_lossy().into_owned(),
    )
}

/// Tells systemd the broker is ready (`READY=1`), when it runs as a `Type=notify` service
/// (`NOTIFY_SOCKET` set; nothing is sent otherwise). The variable is left set: a program the
/// broker starts could send messages of its own, but with `NotifyAccess=main` (the default,
/// and the unit's) the service manager takes them only from the broker's own process.
pub(super) fn notify_ready() {
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        tracing::warn!(error = %e, "could not tell systemd the broker is ready (READY=1)");
    }
}
