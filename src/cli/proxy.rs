//! `fsbroker proxy`: the broker in front of a stdio MCP server (or a relay to a shared broker,
//! `--connect`), the server optionally confined (`--confine`), and ended when a reload revokes
//! what it was confined to.

use std::process::ExitCode;
use std::sync::Arc;

use fsbroker::transport;
use fsbroker::{Broker, Policy};

use super::ProxyArgs;
use super::running::{load_policy, runtime, start};

/// Runs `fsbroker proxy`.
pub(super) fn run(args: ProxyArgs) -> ExitCode {
    // The administrator's bounds hold for every proxy, the relays of `--connect` included
    // (whose broker is another process): read first, and no proxy starts without them.
    let managed = match fsbroker::policy::Managed::system() {
        Ok(m) => m,
        Err(e) => return refuse(&e.to_string()),
    };
    // The sign-ins of `--url`, shown on the console and recorded in the audit log.
    let board = transport::proxy::SignIns::new();
    let remote = match remote(&args, &board) {
        Ok(r) => r,
        Err(e) => return refuse(&e),
    };
    if let (Some(m), Some(r)) = (&managed, &remote) {
        let url = url::Url::parse(r.url()).map_err(|e| e.to_string());
        if let Some(no) = url.as_ref().ok().and_then(|u| m.refuse_url(u)) {
            return refuse(&fsbroker::policy::PolicyError::Narrowed(no).to_string());
        }
    }
    // No server process to confine: the policy's `[confine] mode` does not apply either.
    let flag = match remote {
        Some(_) => Some(fsbroker::policy::ConfineMode::Off),
        None => args.confine.map(fsbroker::policy::ConfineMode::from),
    };
    // A relay confines only when asked on its own command line (the policy's mode is the
    // shared broker's); a proxy with a broker of its own, as its policy says.
    let mode = match (&args.connect, remote.is_some()) {
        (_, true) => None,
        (Some(_), false) => Some(flag.unwrap_or(fsbroker::policy::ConfineMode::Off)),
        (None, false) => match load_policy(&args.serve) {
            Ok(policy) => Some(fsbroker::confine::mode(flag, &policy)),
            Err(e) => return refuse(&e),
        },
    };
    if let (Some(m), Some(mode)) = (&managed, mode) {
        if let Some(no) = m.refuse_confinement(mode) {
            return refuse(&fsbroker::policy::PolicyError::Narrowed(no).to_string());
        }
        // The tests' way to pretend an older kernel would lower the confinement the
        // administrator requires (down to none).
        if m.file.confine.required != fsbroker::policy::ConfineMode::Off
            && std::env::var_os(fsbroker::confine::kernel::ABI_ENV).is_some()
        {
            return refuse(
                &fsbroker::policy::PolicyError::Narrowed(fsbroker::policy::Narrowing {
                    rule: "[confine] required".into(),
                    reason:
                        "FSBROKER_LANDLOCK_ABI is set: it lowers the confinement the server must \
                         run with; unset it"
                            .into(),
                })
                .to_string(),
            );
        }
    }
    // What the server would run, checked against `[servers] allow` once a launcher is
    // resolved (below); checked here too when nothing will resolve it.
    let allowed = |command: &[std::ffi::OsString]| -> Result<(), String> {
        match managed.as_ref().and_then(|m| m.refuse_command(command)) {
            Some(no) => Err(fsbroker::policy::PolicyError::Narrowed(no).to_string()),
            None => Ok(()),
        }
    };
    let mut opts = transport::proxy::ProxyOptions {
        command: args.command,
        max_line: args.serve.max_line_bytes,
        max_in_flight: fsbroker::policy::Limits::default().max_in_flight,
        confine: None,
        end_server: None,
        remote,
        start_timeout: (args.start_timeout > 0)
            .then(|| std::time::Duration::from_secs(args.start_timeout)),
    };
    let result = match &args.connect {
        // A shared broker answers; this process only relays. Its confinement comes from the
        // policy and roots given to this proxy, which should be the shared broker's.
        Some(path) => runtime().and_then(|rt| {
            if flag.is_some_and(|f| f != fsbroker::policy::ConfineMode::Off) {
                let confined = load_policy(&args.serve)
                    .map_err(NotStarted::Refused)
                    .and_then(|policy| {
                        confine_in_time(
                            &policy,
                            flag,
                            &opts.command,
                            &super::RegistryArg::all(&args.confine_fetch),
                            None,
                            opts.start_timeout,
                        )
                    });
                match confined {
                    Ok(c) => {
                        // What the server's launcher would have run (`npx -y PKG` runs
                        // PKG's program), resolved when the confinement was planned.
                        if let Some(c) = &c {
                            opts.command = c.command().to_vec();
                        }
                        opts.confine = c
                    }
                    Err(NotStarted::Refused(e)) => {
                        refuse(&e);
                        return Ok(1);
                    }
                    Err(NotStarted::Answered) => return Ok(1),
                }
            }
            if let Err(e) = allowed(&opts.command) {
                refuse(&e);
                return Ok(1);
            }
            let code = rt.block_on(transport::proxy::run(
                transport::proxy::Link::Remote(path.clone()),
                opts,
            ));
            // A read of the host's stdin may still be blocked in tokio's blocking pool;
            // waiting for it would keep the proxy alive after the server exited.
            rt.shutdown_background();
            code
        }),
        None => {
            let running = match start(&args.serve, &board) {
                Ok(r) => r,
                Err(e) => return refuse(&e),
            };
            let session = Arc::new(running.broker.session());
            opts.max_in_flight = running.broker.policy().limits().max_in_flight;
            let policy_mode = fsbroker::confine::mode(None, &running.broker.policy());
            if opts.remote.is_some() && policy_mode != fsbroker::policy::ConfineMode::Off {
                tracing::warn!(
                    "the policy's [confine] mode does not apply to a remote server (--url): there is no process to confine"
                );
            }
            match confine_in_time(
                &running.broker.policy(),
                flag,
                &opts.command,
                &super::RegistryArg::all(&args.confine_fetch),
                Some(&running.broker),
                opts.start_timeout,
            ) {
                Ok(Some(c)) => {
                    opts.end_server = revocations(&running.broker, &c);
                    opts.command = c.command().to_vec();
                    opts.confine = Some(c);
                }
                Ok(None) => {}
                Err(NotStarted::Refused(e)) => return refuse(&e),
                Err(NotStarted::Answered) => return ExitCode::FAILURE,
            }
            if opts.remote.is_none() {
                if let Err(e) = allowed(&opts.command) {
                    return refuse(&e);
                }
                let mode = opts
                    .confine
                    .as_ref()
                    .map_or(fsbroker::policy::ConfineMode::Off, |c| c.mode);
                opts.end_server = managed_revocations(
                    &running.broker,
                    opts.command.clone(),
                    mode,
                    opts.end_server.take(),
                );
            }
            let code = running
                .run(transport::proxy::run(
                    transport::proxy::Link::Local(session),
                    opts,
                ))
                .unwrap_or_else(|signal| Ok(128 + signal));
            // See above: do not wait for a blocked read of the host's stdin.
            running.runtime.shutdown_background();
            code
        }
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("fsbroker: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Says why the server cannot be started, on stderr and to the host (whose first request,
/// its `initialize`, gets the reason as an error instead of no answer at all); fails.
fn refuse(why: &str) -> ExitCode {
    eprintln!("fsbroker: {why}");
    transport::proxy::answer_refused_start(why);
    ExitCode::FAILURE
}

/// The remote server of `--url`, with its headers, checked before anything starts; `None`
/// without `--url`. `--url` with a server command or `--confine` is refused.
fn remote(
    args: &ProxyArgs,
    board: &transport::proxy::SignIns,
) -> Result<Option<transport::proxy::RemoteOptions>, String> {
    let Some(url) = &args.url else {
        return Ok(None);
    };
    if !args.command.is_empty() {
        return Err(
            "--url and `-- SERVER` both name the server: give one (--url reaches a remote server, `-- SERVER` starts a local one)"
                .into(),
        );
    }
    if args.confine.is_some() {
        return Err(
            "--confine confines a server the proxy starts; it cannot apply to a remote server (--url)"
                .into(),
        );
    }
    let mut remote = transport::proxy::RemoteOptions::new(url).map_err(|e| e.to_string())?;
    for header in &args.headers {
        // Not shown: without its colon, a header may be all value (a token).
        let (name, value) = header
            .split_once(':')
            .ok_or("--header: write it as NAME:VALUE (one has no colon)")?;
        remote = remote.header(name, value).map_err(|e| e.to_string())?;
    }
    for header in &args.header_envs {
        let (name, var) = header
            .split_once('=')
            .ok_or_else(|| format!("--header-env {header:?}: write it as NAME=VAR"))?;
        remote = remote
            .header_from_env(name, var)
            .map_err(|e| e.to_string())?;
    }
    for path in &args.ca_certs {
        remote = remote.ca_cert(path.clone());
    }
    if let Some(max) = args.max_chunk_size {
        remote = remote.max_chunk(max);
    }
    if !args.no_sign_in {
        let mut sign_in = transport::proxy::SignIn::new().board(board.clone());
        if let Some(id) = &args.oauth_client_id {
            sign_in = sign_in.client_id(id);
        }
        if let Some(issuer) = &args.oauth_issuer {
            sign_in = sign_in.issuer(issuer);
        }
        if let Some(var) = &args.oauth_client_secret_env {
            sign_in = sign_in
                .client_secret_from_env(var)
                .map_err(|e| e.to_string())?;
        }
        if let Some(port) = args.oauth_redirect_port {
            sign_in = sign_in.redirect_port(port);
        }
        remote = remote.sign_in(sign_in);
    }
    Ok(Some(remote))
}

/// The confinement of the proxy's server, when asked for (`--confine`, or the policy's
/// `[confine] mode`): planned, checked (strict refuses here), reported on stderr and recorded
/// in `broker`'s audit log.
fn confine_server(
    policy: &Policy,
    flag: Option<fsbroker::policy::ConfineMode>,
    command: &[std::ffi::OsString],
    fetch: &[fsbroker::policy::Registry],
    broker: Option<&Arc<Broker>>,
    progress: &dyn Fn(&str),
) -> Result<Option<fsbroker::confine::Confinement>, String> {
    let mode = fsbroker::confine::mode(flag, policy);
    if mode == fsbroker::policy::ConfineMode::Off {
        return Ok(None);
    }
    let confinement =
        fsbroker::confine::Confinement::prepare_with(policy, mode, command, fetch, progress)
            .map_err(|e| e.to_string())?;
    let summary = confinement.summary();
    if let Some((first, rest)) = summary.split_first() {
        tracing::info!("{first}");
        for line in rest {
            tracing::warn!("{line}");
        }
    }
    if let Some(log) = broker.and_then(|b| b.audit()) {
        log.confinement(confinement.audit_record())
            .map_err(|e| format!("cannot record the confinement in the audit log: {e}"))?;
    }
    Ok(Some(confinement))
}

/// How long the proxy waits, once the host was told the start took too long, for the work
/// to end: past the longest install (300 s) by a margin.
const PREPARE_AFTER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(330);

/// Why the proxy's server was not started.
enum NotStarted {
    /// Refused: the reason, not yet told to the host.
    Refused(String),
    /// Told to the host already (the start took too long).
    Answered,
}

/// [`confine_server`] within the start's time limit (`--start-timeout`): planning, and an
/// install before the start (`--confine-fetch`), may take long, and the host waiting for its
/// `initialize` must not wait in silence. Past the limit, the host gets an error saying what
/// fsbroker is still doing, and the work goes on to its end (an install is finished and
/// marked, so that the next start finds it) before the proxy exits.
fn confine_in_time(
    policy: &Policy,
    flag: Option<fsbroker::policy::ConfineMode>,
    command: &[std::ffi::OsString],
    fetch: &[fsbroker::policy::Registry],
    broker: Option<&Arc<Broker>>,
    limit: Option<std::time::Duration>,
) -> Result<Option<fsbroker::confine::Confinement>, NotStarted> {
    let Some(limit) = limit else {
        return confine_server(policy, flag, command, fetch, broker, &|_| {})
            .map_err(NotStarted::Refused);
    };
    let doing = std::sync::Mutex::new(String::from("planning the confinement"));
    std::thread::scope(|scope| {
        let (done, result) = std::sync::mpsc::channel();
        let doing = &doing;
        scope.spawn(move || {
            let progress = |what: &str| {
                *doing.lock().unwrap_or_else(|e| e.into_inner()) = what.to_owned();
            };
            let _ = done.send(confine_server(
                policy, flag, command, fetch, broker, &progress,
            ));
        });
        match result.recv_timeout(limit) {
            Ok(confined) => confined.map_err(NotStarted::Refused),
            Err(_) => {
                let doing = doing.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let why = format!(
                    "the confined server has not started within {} s (--start-timeout): \
                     fsbroker is still {doing}. That goes on to its end (see stderr), then the \
                     proxy exits; start the server again once it has",
                    limit.as_secs()
                );
                eprintln!("fsbroker: {why}");
                transport::proxy::answer_refused_start(&why);
                // The install is bounded (5 minutes) and the plan's reads do not block; should
                // the work still not end, the proxy does not wait for it for good.
                if result.recv_timeout(PREPARE_AFTER_TIMEOUT).is_err() {
                    eprintln!(
                        "fsbroker: still {doing} {} s after the host was told; exiting",
                        PREPARE_AFTER_TIMEOUT.as_secs()
                    );
                    std::process::exit(1);
                }
                Err(NotStarted::Answered)
            }
        }
    })
}

/// `inner` (the confinement's revocations, if any), ended too when the managed policy changes
/// so that the running server is no longer allowed: it now requires more confinement than the
/// server has (`[confine] required`), or no longer lists its program (`[servers] allow`).
fn managed_revocations(
    broker: &Arc<Broker>,
    command: Vec<std::ffi::OsString>,
    mode: fsbroker::policy::ConfineMode,
    inner: Option<transport::proxy::EndServer>,
) -> Option<transport::proxy::EndServer> {
    let weak = Arc::downgrade(broker);
    let mut changes = broker.policy_changes();
    let command = Arc::new(command);
    let managed = async move {
        loop {
            if changes.changed().await.is_err() {
                return std::future::pending().await;
            }
            let Some(broker) = weak.upgrade() else {
                return std::future::pending().await;
            };
            let Some(m) = broker.policy().managed().cloned() else {
                continue;
            };
            let command = Arc::clone(&command);
            // The program's hash may be read: off the async threads.
            let refused = tokio::task::spawn_blocking(move || {
                m.refuse_confinement(mode)
                    .or_else(|| m.refuse_command(&command))
            })
            .await
            .ok()
            .flatten();
            if let Some(no) = refused {
                return fsbroker::policy::PolicyError::Narrowed(no).to_string();
            }
        }
    };
    Some(Box::pin(async move {
        match inner {
            Some(inner) => tokio::select! {
                why = inner => why,
                why = managed => why,
            },
            None => managed.await,
        }
    }))
}

/// A future that resolves, with the reason, when a reload takes away access the confined
/// server was started with and `[confine] on_revoke` is `end`; with `keep`, it warns instead.
fn revocations(
    broker: &Arc<Broker>,
    confinement: &fsbroker::confine::Confinement,
) -> Option<transport::proxy::EndServer> {
    let broker = Arc::downgrade(broker);
    let plan = confinement.plan.clone();
    let end = confinement.on_revoke == fsbroker::policy::OnRevoke::End;
    let strict = confinement.mode == fsbroker::policy::ConfineMode::Strict;
    let mut changes = broker.upgrade()?.policy_changes();
    Some(Box::pin(async move {
        loop {
            if changes.changed().await.is_err() {
                return std::future::pending().await;
            }
            let Some(broker) = broker.upgrade() else {
                return std::future::pending().await;
            };
            let policy = broker.policy();
            let mut lost = plan.lost(&policy);
            let unenforced = plan.newly_unenforced(&policy);
            if strict {
                // Strict started the server because every rule was enforced; a reload that
                // asks for one the kernel cannot hold breaks that promise.
                lost.extend(
                    unenforced
                        .iter()
                        .map(|u| format!("no longer enforced: {u}")),
                );
            } else if !unenforced.is_empty() {
                tracing::warn!(
                    not_enforced = %unenforced.join("; "),
                    "the reloaded policy asks for rules the kernel cannot hold the confined server to"
                );
            }
            if lost.is_empty() {
                continue;
            }
            let lost = lost.join("; ");
            if end {
                return format!("revoked: {lost}");
            }
            tracing::warn!(
                revoked = %lost,
                "the confined server keeps the access it was started with until it restarts ([confine] on_revoke = \"keep\")"
            );
        }
    }))
}
