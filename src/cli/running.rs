//! What `serve` and `proxy` share: the policy the flags name, a broker and the runtime it runs
//! in, and running it under the stop and reload signals until its transport ends.

use std::sync::Arc;

use fsbroker::Broker;
use fsbroker::policy::{Overrides, Policy};
use fsbroker::transport::{self, ServeOptions};

use super::ServeArgs;

/// What `serve` and `proxy` share: a loaded policy, a broker, a runtime.
///
/// `W` is the policy file's watcher ([`Broker::watch_policy`]), held only to keep it running.
pub(super) struct Running<W> {
    pub(super) broker: Arc<Broker>,
    pub(super) runtime: tokio::runtime::Runtime,
    _watcher: W,
    /// The person's console, when asked for (`--console`, `[console] enabled`).
    _console: Option<crate::console::Console>,
}

pub(super) fn overrides(args: &ServeArgs) -> Overrides {
    Overrides {
        roots: args.roots.clone(),
        read_write: args.read_write,
        consent: args.consent.map(Into::into),
        audit: args.audit.clone(),
        listen: args.listen.clone(),
        console_url_file: args.console_url_file.clone(),
        audit_in_use: None,
    }
}

/// The policy the options name (file and command-line roots), without starting a broker.
pub(super) fn load_policy(args: &ServeArgs) -> Result<Policy, String> {
    Policy::load(args.policy.as_deref(), &overrides(args)).map_err(|e| e.to_string())
}

/// Loads the policy (its warnings and roots logged), builds the runtime and the broker, and
/// watches the policy file.
pub(super) fn start(
    args: &ServeArgs,
    sign_ins: &fsbroker::transport::proxy::SignIns,
) -> Result<Running<impl Sized + use<>>, String> {
    let overrides = overrides(args);
    let policy = Policy::load(args.policy.as_deref(), &overrides).map_err(|e| e.to_string())?;
    for warning in policy.warnings() {
        tracing::warn!("{warning}");
    }
    if policy.roots().is_empty() {
        tracing::warn!(
            "no roots: every files/* request will be refused (add --root DIR or a policy)"
        );
    }
    for root in policy.roots() {
        tracing::info!(name = root.name(), path = %root.path().display(), mode = ?root.mode(), consent = ?root.consent(), "root");
    }
    let runtime = runtime().map_err(|e| format!("cannot start the runtime: {e}"))?;
    let broker = Broker::with_overrides(policy, overrides).map_err(|e| e.to_string())?;
    // The policy file is watched, and SIGHUP reloads it too: either is how a user revokes
    // access in the middle of a session.
    let watcher = broker.watch_policy();
    // A proxy's sign-ins to its remote server are recorded with the rest.
    if let Some(log) = broker.audit() {
        sign_ins.audit_to(Arc::clone(log));
    }
    let console = start_console(args, &broker, &runtime, sign_ins)?;
    Ok(Running {
        broker,
        runtime,
        _watcher: watcher,
        _console: console,
    })
}

/// Starts the console when the flags or the policy ask for it, and says where it is.
fn start_console(
    args: &ServeArgs,
    broker: &Arc<Broker>,
    runtime: &tokio::runtime::Runtime,
    sign_ins: &fsbroker::transport::proxy::SignIns,
) -> Result<Option<crate::console::Console>, String> {
    let policy = broker.policy();
    let config = policy.console();
    // The managed policy may require the console, whatever the flags and policy say.
    let required = policy.managed().is_some_and(|m| m.file.console.required);
    let addr = match (args.console, config.enabled || required) {
        (Some(addr), _) => addr,
        (None, true) => config
            .addr
            .unwrap_or((std::net::Ipv4Addr::LOCALHOST, 0).into()),
        (None, false) => return Ok(None),
    };
    let url_file = match args.console_url_file.clone().or(config.url_file.clone()) {
        Some(file) => file,
        None => fsbroker::console_url_file()
            .map_err(|e| format!("cannot place the console's URL file: {e}"))?,
    };
    let _in_runtime = runtime.enter();
    let console = crate::console::start(broker, addr, Some(&url_file), sign_ins)?;
    // On stderr, which hosts keep in their logs (where a server with a root over them could
    // read it): the bare address, never the one-time ticket, which only the URL file holds.
    let how = if fsbroker::console_url_file().is_ok_and(|default| default == url_file) {
        "fsbroker console".to_owned()
    } else {
        format!("fsbroker console --url-file {}", url_file.display())
    };
    eprintln!(
        "fsbroker: console at {} (open it with `{how}`)",
        console.address
    );
    Ok(Some(console))
}

impl<W> Running<W> {
    /// Runs `main` with SIGHUP reloading the policy; seals the audit log afterwards.
    ///
    /// SIGTERM or SIGINT (how hosts stop their servers) stops `main` cleanly: the transports
    /// take no more requests and let the ones they took finish and be recorded
    /// ([`Broker::stop`]), except watches not yet made, which are abandoned; the proxy ends its
    /// server within the grace (`transport::proxy::CLOSE_GRACE`); then the log is sealed. Work
    /// still running [`STOP_GRACE`] after the signal is not waited for: the result is then
    /// `Err(signal number)` and the log is left unsealed, which is what it is (`audit verify`
    /// reports the run, exit 3).
    pub(super) fn run<T>(&self, main: impl std::future::Future<Output = T>) -> Result<T, i32> {
        let result = self.runtime.block_on(async {
            // The stop signals are caught from before `main` is first polled: a request it
            // answers at once must not leave a window in which SIGTERM still kills the broker
            // unsealed (the handlers are installed when the streams are made, not when polled).
            let stop = stop_signal();
            let hup = Arc::clone(&self.broker);
            let hangups = tokio::spawn(async move {
                let Ok(mut signal) =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                else {
                    return;
                };
                while signal.recv().await.is_some() {
                    let b = Arc::clone(&hup);
                    let _ = tokio::task::spawn_blocking(move || b.reload_and_log()).await;
                }
            });
            tokio::pin!(main);
            let result = tokio::select! {
                result = &mut main => Ok(result),
                signal = stop => {
                    tracing::info!(signal, "stopping: no new requests; the running ones finish first");
                    // Watches not yet made are abandoned too (answered `TIMEOUT`): registering
                    // a large tree takes seconds the stop's grace does not have.
                    self.broker.stop();
                    match tokio::time::timeout(STOP_GRACE, &mut main).await {
                        Ok(result) => Ok(result),
                        Err(_) => {
                            tracing::warn!("operations still running {STOP_GRACE:?} after the signal; stopping without sealing the audit log");
                            Err(signal)
                        }
                    }
                }
            };
            hangups.abort();
            result
        });
        // A clean end: the run's part of the log is sealed (a crash leaves it unsealed).
        if let (Ok(_), Some(log)) = (&result, self.broker.audit()) {
            log.seal();
        }
        result
    }

    /// The transport's options: the policy's limits, and the longest line the flags allow.
    pub(super) fn options(&self, args: &ServeArgs) -> ServeOptions {
        ServeOptions::for_policy(&self.broker.policy(), args.max_line_bytes)
    }
}

/// How long a broker that has answered everything waits for file work still running on the
/// blocking pool before it exits without it.
pub(super) const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a stopping broker waits for the requests it took to finish.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

// A stopping proxy ends its server (stdin closed, SIGTERM, SIGKILL) with time left in the
// grace for the broker to finish and seal the log.
const _: () = assert!(
    transport::proxy::CLOSE_GRACE.as_millis() + transport::proxy::STOP_KILL_GRACE.as_millis()
        < STOP_GRACE.as_millis()
);

/// Installs the SIGTERM and SIGINT handlers now; the future waits for either and returns its
/// number.
fn stop_signal() -> impl std::future::Future<Output = i32> {
    use tokio::signal::unix::{SignalKind, signal};
    let streams = signal(SignalKind::terminate()).and_then(|term| {
        let int = signal(SignalKind::interrupt())?;
        Ok((term, int))
    });
    async move {
        let Ok((mut term, mut int)) = streams else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => libc::SIGTERM,
            _ = int.recv() => libc::SIGINT,
        }
    }
}

/// The runtime for `serve` and `proxy`.
///
/// File operations run on tokio's blocking pool. Its default (up to 512 threads) turns a burst
/// of small requests into a thread per request, each woken for one operation and put back to
/// sleep: with 64 reads of 1 KiB in flight, context switches took most of the CPU. A few
/// threads that stay busy, taking the next operation from the queue, answer more than twice as
/// many (measured with `fsbroker bench`). The bound is also a bound on what a stuck file system
/// can hold; requests queued behind it answer `TIMEOUT` and skip their work.
///
/// File operations take one of the broker's slots ([`Broker::blocking_slots`], as many as
/// these threads) before they take a thread, so no session holds more than its share; a few
/// threads more serve tokio's own blocking work (stdin that is not a pipe, the file API).
pub(super) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(Broker::blocking_slots() + 4)
        .build()
}
