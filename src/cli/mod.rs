//! The `fsbroker` command line (feature `cli`): raw flags become a validated policy before
//! anything runs. [`main`] is all the binary calls.

use std::io;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand, ValueEnum};

use fsbroker::Broker;
use fsbroker::policy::{Overrides, Policy, PolicyFile};
use fsbroker::sandbox::ConsentMode;
use fsbroker::transport::{self, DEFAULT_MAX_LINE, ServeOptions};

/// Hand an MCP server file access without handing it the disk.
///
/// fsbroker answers an MCP server's `roots/list` and `files/*` requests on the client's
/// side. Every path is resolved beneath an approved root through a directory capability,
/// so no `..`, absolute path or symlink leads out of it.
#[derive(Debug, Parser)]
#[command(name = "fsbroker", version = VERSION, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Answer requests on stdin, one JSON-RPC message per line; responses go to stdout.
    ///
    /// Example: echo '{"jsonrpc":"2.0","id":1,"method":"roots/list"}' | fsbroker serve --root .
    ///
    /// Logs go to stderr (set RUST_LOG, e.g. RUST_LOG=fsbroker=debug); stdout carries
    /// protocol messages only. At end of input, requests in flight finish and it exits 0.
    Serve(ServeArgs),
    /// Put the broker in front of a stdio MCP server: `fsbroker proxy [OPTIONS] -- SERVER ARGS`.
    ///
    /// The host runs this instead of the server. Messages pass through unchanged, except
    /// that the host's `initialize` gains `roots.filesystemBrokering`, and the server's
    /// `roots/list` and `files/*` requests are answered here and never reach the host. The
    /// proxy exits with the server's exit code.
    ///
    /// Example: fsbroker proxy --root ~/src/project -- npx -y @modelcontextprotocol/server-filesystem
    Proxy(ProxyArgs),
    /// Check a policy file, or print its JSON Schema.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Work with audit logs.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// The kernel sandbox of `proxy --confine` (Linux Landlock).
    #[command(subcommand)]
    Confine(ConfineCommand),
    /// Print a shell completion script: `fsbroker completions bash > ~/.local/share/bash-completion/completions/fsbroker`.
    ///
    /// Shells: bash, zsh, fish, elvish, powershell. For zsh, write it as `_fsbroker` in a
    /// directory of your `fpath`; for fish, to `~/.config/fish/completions/fsbroker.fish`.
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Measure a broker over real pipes: chunked reads, a chunked upload, small operations,
    /// watch latency, a large recursive listing.
    ///
    /// Starts `fsbroker serve` (this executable, or --broker-cmd) with a policy of its own (no
    /// rate limits), makes a test file of random bytes in the temp directory (removed after)
    /// unless --file is given, and prints MB/s, ops/s, latency p50/p99 and the broker's peak
    /// memory (VmHWM). With --compare-sftp, OpenSSH's `sftp -D sftp-server` moves the same file
    /// in the same run and the ratios are printed. A run can take several chunk sizes: reads
    /// and uploads run once per size, each followed by sftp's. The report ends with the speed
    /// goals the run measured, met or not.
    ///
    /// Example: fsbroker bench --size 1GiB --chunk-size 256KiB,1MiB,8MiB --compare-sftp --compare-mcp 'rust-mcp-filesystem {dir}'
    Bench(BenchArgs),
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// Read (and upload a copy of) this file instead of making one; it is left as it is.
    #[arg(long, value_name = "FILE")]
    file: Option<PathBuf>,
    /// Size of the file to make: bytes, or with a unit (KiB, MiB, GiB; kB, MB, GB)
    /// [default: 1GiB; with --quick 64MiB]
    #[arg(long, value_name = "SIZE", value_parser = crate::bench::parse_size)]
    size: Option<u64>,
    /// Bytes per files/read and files/write request, at most 16MiB. Several sizes
    /// (comma-separated or repeated) run the reads and the upload once per size, in the order
    /// given [default: 8MiB; with --quick 1MiB]
    #[arg(
        long,
        value_name = "SIZE",
        value_delimiter = ',',
        value_parser = crate::bench::parse_size
    )]
    chunk_size: Vec<u64>,
    /// Encoding of reads and uploads; for utf-8 the file made is random text.
    #[arg(long, value_enum, value_name = "ENCODING", default_value = "base64")]
    encoding: crate::bench::Encoding,
    /// Read and upload requests in flight at once (the speed goals are set at 8).
    #[arg(long, value_name = "N", default_value_t = 8)]
    depth: usize,
    /// Small operations (1 KiB reads, lists) per kind and mode
    /// [default: 20000; with --quick 2000]
    #[arg(long, value_name = "N")]
    small_ops: Option<usize>,
    /// Requests in flight in the pipelined small-operation runs.
    #[arg(long, value_name = "N", default_value_t = 64)]
    small_depth: usize,
    /// Check every byte: the sha256 of everything read, and of the uploaded file (slower;
    /// without it, three windows of every chunk are compared with the file).
    #[arg(long)]
    verify: bool,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Small sizes for a short run: a 64MiB file, 1MiB chunks, 2000 small operations.
    #[arg(long)]
    quick: bool,
    /// Also run OpenSSH's sftp against sftp-server (no ssh, just pipes) on the same file and
    /// print the ratios; needs openssh-client and openssh-sftp-server.
    #[arg(long)]
    compare_sftp: bool,
    /// Start this shell command as the broker instead of `fsbroker serve --policy FILE`;
    /// {policy}, {data} and {scratch} become the bench's policy file and its two roots. A
    /// command naming none of them gets ` serve --policy FILE` appended.
    #[arg(long, value_name = "COMMAND")]
    broker_cmd: Option<String>,
    /// Run only these phases (comma-separated or repeated).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "PHASE")]
    only: Vec<crate::bench::Phase>,
    /// Changes timed by the watch phase (one every 60 ms) [default: 200; with --quick 20]
    #[arg(long, value_name = "N")]
    watch_samples: Option<usize>,
    /// Entries of the tree the list phase makes and lists recursively
    /// [default: 100000; with --quick 10000]
    #[arg(long, value_name = "N")]
    list_entries: Option<usize>,
    #[command(flatten)]
    mcp: crate::bench::McpArgs,
}

impl BenchArgs {
    fn options(self) -> crate::bench::Options {
        let (size, chunk, small) = if self.quick {
            (64 << 20, 1 << 20, 2_000)
        } else {
            (1 << 30, 8 << 20, 20_000)
        };
        let mut chunk_sizes = Vec::new();
        for c in self.chunk_size {
            if !chunk_sizes.contains(&c) {
                chunk_sizes.push(c);
            }
        }
        if chunk_sizes.is_empty() {
            chunk_sizes.push(chunk);
        }
        crate::bench::Options {
            file: self.file,
            size: self.size.unwrap_or(size),
            chunk_sizes,
            encoding: self.encoding,
            depth: self.depth,
            small_ops: self.small_ops.unwrap_or(small),
            small_depth: self.small_depth,
            verify: self.verify,
            json: self.json,
            compare_sftp: self.compare_sftp,
            broker_cmd: self.broker_cmd,
            only: self.only,
            watch_samples: self
                .watch_samples
                .unwrap_or(if self.quick { 20 } else { 200 })
                .max(1),
            list_entries: self
                .list_entries
                .unwrap_or(if self.quick { 10_000 } else { 100_000 })
                .max(1),
            mcp: self.mcp,
        }
    }
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// Check an audit log's hash chain. Exit 0 with a one-line summary when every line is
    /// intact and in order and every run of a broker ended with its seal; exit 1 naming the
    /// first line that was edited, reformatted, removed, reordered or inserted (or when the
    /// --head given is not in the log); exit 3 when the chain is intact but a run has no seal:
    /// a broker still running, a crash, or lines removed from the end.
    ///
    /// A log rolled over by `[audit] max_bytes` is checked across its files: give them oldest
    /// first and the current one last, e.g. `fsbroker audit verify audit.jsonl.2* audit.jsonl`.
    /// A file left out or out of order breaks the chain at the next file's first line.
    Verify {
        /// The audit log (JSON lines): one file, or its files oldest first.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// A head printed earlier by `audit head` and kept elsewhere: it must still be the
        /// hash of one of the log's lines (the log may have grown since).
        #[arg(long, value_name = "HASH")]
        head: Option<String>,
    },
    /// Print the log's head: the hash of its last line, after checking the chain. Keep it
    /// somewhere the log's writers cannot reach, and check it later with `verify --head`.
    Head {
        /// The audit log (JSON lines): one file, or its files oldest first.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
}

#[derive(Debug, Args)]
struct ProxyArgs {
    #[command(flatten)]
    serve: ServeArgs,
    /// Use the shared broker listening on this Unix socket (`fsbroker serve --listen PATH`)
    /// instead of a broker of this process; the other broker options are then ignored.
    #[arg(long, value_name = "PATH")]
    connect: Option<PathBuf>,
    /// Start the server in a Landlock sandbox built from the policy: its roots (read-write or
    /// read-only as the policy says; nothing of `deny` and unapproved `prompt` roots), what it
    /// needs to run, a private TMPDIR, no network unless `[confine] net`. `--confine` enforces
    /// what the kernel can and names the rest on stderr; `--confine=strict` refuses to start
    /// unless every rule is enforced; `--confine=off` overrides the policy's `[confine] mode`.
    /// See `fsbroker confine check`.
    #[arg(
        long,
        value_enum,
        value_name = "MODE",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "best-effort"
    )]
    confine: Option<ConfineArg>,
    /// The MCP server to run, after `--`.
    #[arg(last = true, required = true, value_name = "SERVER")]
    command: Vec<std::ffi::OsString>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ConfineArg {
    /// No sandbox.
    Off,
    /// Enforce what the kernel can; name the rest on stderr.
    BestEffort,
    /// Refuse to start unless every rule is enforced.
    Strict,
}

impl From<ConfineArg> for fsbroker::policy::ConfineMode {
    fn from(c: ConfineArg) -> Self {
        match c {
            ConfineArg::Off => fsbroker::policy::ConfineMode::Off,
            ConfineArg::BestEffort => fsbroker::policy::ConfineMode::BestEffort,
            ConfineArg::Strict => fsbroker::policy::ConfineMode::Strict,
        }
    }
}

#[derive(Debug, Subcommand)]
enum ConfineCommand {
    /// Print what the kernel supports and what `proxy --confine` would allow the server and
    /// enforce: each allowed path and why, the roots withheld, and every rule that would not
    /// be enforced (exit 0; exit 2 when `--confine=strict` would refuse to start).
    ///
    /// Example: fsbroker confine check --policy policy.toml -- npx @modelcontextprotocol/server-filesystem /
    Check {
        #[command(flatten)]
        serve: ServeArgs,
        /// The server's command line, after `--` (its program and scripts decide what it
        /// needs to run). Without it, only the roots and the kernel are shown.
        #[arg(last = true, value_name = "SERVER")]
        command: Vec<std::ffi::OsString>,
    },
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Policy file (TOML): roots, deny globs, limits. See `fsbroker policy schema`.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Add a root (repeatable), named after its last component, consent "auto", read-only
    /// unless --read-write. Added to the policy's roots.
    #[arg(long = "root", value_name = "DIR")]
    roots: Vec<PathBuf>,
    /// Make the --root directories writable (policy roots keep their own mode).
    #[arg(long)]
    read_write: bool,
    /// Override the consent mode of every root.
    #[arg(long, value_enum, value_name = "MODE")]
    consent: Option<ConsentArg>,
    /// Append a hash-chained audit line for every roots/list and files/* request to FILE
    /// (overrides the policy's [audit] path). If it cannot be written, requests are refused.
    #[arg(long, value_name = "FILE")]
    audit: Option<PathBuf>,
    /// Serve a Unix socket at PATH (owner-only) instead of stdio: each connection is a
    /// session of one shared broker (locks, limits, audit and watches shared).
    #[arg(long, value_name = "PATH")]
    listen: Option<PathBuf>,
    /// Longest accepted input line in bytes; longer lines are discarded and answered -32600.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_LINE)]
    max_line_bytes: usize,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ConsentArg {
    /// Approve paths inside roots.
    Auto,
    /// Ask a person.
    Prompt,
    /// Approve nothing.
    Deny,
}

impl From<ConsentArg> for ConsentMode {
    fn from(c: ConsentArg) -> Self {
        match c {
            ConsentArg::Auto => ConsentMode::Auto,
            ConsentArg::Prompt => ConsentMode::Prompt,
            ConsentArg::Deny => ConsentMode::Deny,
        }
    }
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Validate a policy: syntax, unknown keys, roots that exist and open, names, globs,
    /// limits. Prints a summary and exits 0, or names the problem and exits 1.
    Check {
        /// The policy file.
        file: PathBuf,
    },
    /// Print the JSON Schema of policy files, for editors (e.g. taplo, Even Better TOML).
    Schema,
}

/// What `fsbroker --version` prints after the name: the version, and the MCP revisions the
/// proxy understands (the `initialize` era up to 2025-11-25; the `server/discover` era from
/// 2026-07-28, whose later dated revisions it treats the same way).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (MCP 2024-11-05 to 2025-11-25 through initialize; 2026-07-28 through server/discover)"
);

/// Parses the command line and runs it: what the `fsbroker` binary's `main` does.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Proxy(args) => proxy(args),
        Command::Policy(PolicyCommand::Check { file }) => policy_check(file),
        Command::Audit(AuditCommand::Verify { files, head }) => {
            audit_verify(&files, head.as_deref())
        }
        Command::Audit(AuditCommand::Head { files }) => audit_head(&files),
        Command::Bench(args) => match crate::bench::main(args.options()) {
            Ok(report) => print(&report),
            Err(e) => {
                eprintln!("fsbroker bench: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Confine(ConfineCommand::Check { serve, command }) => {
            confine_check(&serve, &command)
        }
        Command::Policy(PolicyCommand::Schema) => {
            print(&format!("{:#}\n", PolicyFile::json_schema()))
        }
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "fsbroker",
                &mut out,
            );
            print(&String::from_utf8_lossy(&out))
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| LossyStderr(std::io::stderr()))
        .log_internal_errors(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// stderr for logs, where a failed write is dropped. A host that closes its end of the pipe,
/// or a log file on a full disk, must cost the log's lines, not the request that logged them:
/// tracing's writer otherwise reports the error with `eprintln!`, which panics on the same
/// stderr and takes the request (and its audit line) with it.
struct LossyStderr(std::io::Stderr);

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = self.0.write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = self.0.flush();
        Ok(())
    }
}

/// What `serve` and `proxy` share: a loaded policy, a broker, a runtime.
///
/// `W` is the policy file's watcher ([`Broker::watch_policy`]), held only to keep it running.
struct Running<W> {
    broker: Arc<Broker>,
    runtime: tokio::runtime::Runtime,
    _watcher: W,
}

fn overrides(args: &ServeArgs) -> Overrides {
    Overrides {
        roots: args.roots.clone(),
        read_write: args.read_write,
        consent: args.consent.map(Into::into),
        audit: args.audit.clone(),
        listen: args.listen.clone(),
        audit_in_use: None,
    }
}

/// The policy the options name (file and command-line roots), without starting a broker.
fn load_policy(args: &ServeArgs) -> Result<Policy, String> {
    Policy::load(args.policy.as_deref(), &overrides(args)).map_err(|e| e.to_string())
}

fn start(args: &ServeArgs) -> Result<Running<impl Sized + use<>>, String> {
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
    Ok(Running {
        broker,
        runtime,
        _watcher: watcher,
    })
}

impl<W> Running<W> {
    /// Runs `main` with SIGHUP reloading the policy; seals the audit log afterwards.
    ///
    /// SIGTERM or SIGINT (how hosts stop their servers) stops `main` cleanly: the transports
    /// take no more requests and let the ones they took finish and be recorded ([`Broker::stop`]),
    /// except watches not yet made, which are abandoned; the
    /// proxy ends its server within the grace (`transport::proxy::CLOSE_GRACE`); then the log
    /// is sealed. Work still running [`STOP_GRACE`] after the signal is not waited
    /// for: the result is then `Err(signal number)` and the log is left unsealed, which is
    /// what it is (`audit verify` reports the run, exit 3).
    fn run<T>(&self, main: impl std::future::Future<Output = T>) -> Result<T, i32> {
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

    fn options(&self, args: &ServeArgs) -> ServeOptions {
        ServeOptions::for_policy(&self.broker.policy(), args.max_line_bytes)
    }
}

/// How long a broker that has answered everything waits for file work still running on the
/// blocking pool before it exits without it.
const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

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

fn serve(args: ServeArgs) -> ExitCode {
    raise_descriptor_limit();
    let running = match start(&args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fsbroker: {e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = running.options(&args);
    let broker = Arc::clone(&running.broker);
    let result = running.run(async move {
        match &args.listen {
            Some(path) => transport::listen::listen(broker, path, opts).await,
            None => transport::serve_stdio(Arc::new(broker.session()), opts).await,
        }
    });
    // Every request is answered by now; file work still on the blocking pool is stuck in a
    // file system (its requests were answered `TIMEOUT`). Dropping the runtime would wait
    // for it forever, keeping a broker whose peer has left alive.
    running.runtime.shutdown_timeout(SHUTDOWN_WAIT);
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("fsbroker: {e}");
            ExitCode::FAILURE
        }
        // Stopped by a signal with work still running: not a clean end.
        Err(signal) => ExitCode::from(128 + signal as u8),
    }
}

/// Raises the soft limit on open descriptors to the hard limit, as servers do: each upload
/// and connection holds a few, and the default soft limit (often 1024) is far below what the
/// system allows. Only `serve` does: the proxy's server inherits the proxy's limits, and some
/// programs still assume descriptors below 1024. The bounds that matter are the policy's (`max_uploads`, `max_sessions`);
/// should descriptors still run out, that request or connection fails, never the broker.
fn raise_descriptor_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::debug!(error = %e, "descriptor limit left as it is");
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
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(Broker::blocking_slots() + 4)
        .build()
}

fn proxy(args: ProxyArgs) -> ExitCode {
    let flag = args.confine.map(fsbroker::policy::ConfineMode::from);
    let mut opts = transport::proxy::ProxyOptions {
        command: args.command,
        max_line: args.serve.max_line_bytes,
        max_in_flight: fsbroker::policy::Limits::default().max_in_flight,
        confine: None,
        end_server: None,
    };
    let result = match &args.connect {
        // A shared broker answers; this process only relays. Its confinement comes from the
        // policy and roots given to this proxy, which should be the shared broker's.
        Some(path) => runtime().and_then(|rt| {
            if flag.is_some() {
                let policy = match load_policy(&args.serve) {
                    Ok(p) => p,
                    Err(e) => return Err(io::Error::other(e)),
                };
                match confine_server(&policy, flag, &opts.command, None) {
                    Ok(c) => opts.confine = c,
                    Err(e) => return Err(io::Error::other(e)),
                }
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
            let running = match start(&args.serve) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("fsbroker: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let session = Arc::new(running.broker.session());
            opts.max_in_flight = running.broker.policy().limits().max_in_flight;
            match confine_server(
                &running.broker.policy(),
                flag,
                &opts.command,
                Some(&running.broker),
            ) {
                Ok(Some(c)) => {
                    opts.end_server = revocations(&running.broker, &c);
                    opts.confine = Some(c);
                }
                Ok(None) => {}
                Err(e) => {
                    eprintln!("fsbroker: {e}");
                    return ExitCode::FAILURE;
                }
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

/// The confinement of the proxy's server, when asked for (`--confine`, or the policy's
/// `[confine] mode`): planned, checked (strict refuses here), reported on stderr and recorded
/// in `broker`'s audit log.
fn confine_server(
    policy: &Policy,
    flag: Option<fsbroker::policy::ConfineMode>,
    command: &[std::ffi::OsString],
    broker: Option<&Arc<Broker>>,
) -> Result<Option<fsbroker::confine::Confinement>, String> {
    let mode = fsbroker::confine::mode(flag, policy);
    if mode == fsbroker::policy::ConfineMode::Off {
        return Ok(None);
    }
    let confinement =
        fsbroker::confine::Confinement::prepare(policy, mode, command).map_err(|e| e.to_string())?;
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

fn confine_check(args: &ServeArgs, command: &[std::ffi::OsString]) -> ExitCode {
    use fsbroker::confine::{Access, kernel};
    let policy = match load_policy(args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("fsbroker: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let path = std::env::var_os("PATH");
    let tmp = std::env::temp_dir().join("fsbroker-server-XXXXXX");
    let plan = match fsbroker::confine::plan(&policy, command, &cwd, path.as_deref(), Some(&tmp)) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("fsbroker: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (kernel_abi, abi) = (kernel::kernel_abi(), kernel::abi());
    let mut out = String::new();
    let lowered = if abi < kernel_abi {
        format!(" (used as {abi}: {} is set)", kernel::ABI_ENV)
    } else {
        String::new()
    };
    out.push_str(&format!("Landlock: kernel ABI {kernel_abi}{lowered}\n"));
    for f in kernel::Feature::ALL {
        let mark = if abi >= f.abi() { "yes" } else { "no " };
        out.push_str(&format!("  [{mark}] ABI {}: {}\n", f.abi(), f.describe()));
    }
    out.push_str(&format!(
        "\nThe server would be allowed ({}):\n",
        if command.is_empty() {
            "roots only: give the server's command after -- to see what it needs to run"
        } else {
            "its roots, what it needs to run, its TMPDIR"
        }
    ));
    for r in &plan.rules {
        let access = match r.access {
            Access::Read => "read",
            Access::ReadExec => "read+exec",
            Access::ReadWrite => "read-write",
            Access::Device => "device",
        };
        out.push_str(&format!(
            "  {access:<10}  {}  ({})\n",
            r.path.display(),
            r.why
        ));
    }
    if !plan.narrowed.is_empty() {
        out.push_str(
            "\nAsked for, but too broad, or reached through a link the server could have made \
             (narrowed or left out):\n",
        );
        for n in &plan.narrowed {
            out.push_str(&format!("  - {n}\n"));
        }
    }
    if !plan.withheld.is_empty() {
        out.push_str("\nWithheld (nothing allowed):\n");
        for w in &plan.withheld {
            out.push_str(&format!("  {}  ({})\n", w.path.display(), w.why));
        }
    }
    out.push_str(&format!(
        "\nTCP: {}\n",
        if plan.net {
            "allowed ([confine] net = true)"
        } else {
            "refused"
        }
    ));
    let gaps = plan.gaps(abi);
    if gaps.rules.is_empty() {
        out.push_str("\nEvery rule is enforced: --confine=strict would start the server.\n");
    } else {
        out.push_str("\nNot enforced (--confine=strict would refuse to start):\n");
        for g in &gaps.rules {
            out.push_str(&format!("  - {g}\n"));
        }
    }
    if !gaps.hardening.is_empty() {
        out.push_str("\nHardening this kernel lacks (never refused for):\n");
        for g in &gaps.hardening {
            out.push_str(&format!("  - {g}\n"));
        }
    }
    let mode = match policy.confine().mode {
        fsbroker::policy::ConfineMode::Off => "off (proxy --confine turns it on)",
        fsbroker::policy::ConfineMode::BestEffort => "best-effort",
        fsbroker::policy::ConfineMode::Strict => "strict",
    };
    out.push_str(&format!("\nThe policy's [confine] mode: {mode}\n"));
    print(&out);
    if gaps.rules.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}

fn audit_verify(files: &[PathBuf], anchor: Option<&str>) -> ExitCode {
    let s = match fsbroker::audit::verify_files(files, anchor) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fsbroker: {e}");
            return ExitCode::FAILURE;
        }
    };
    let name = files
        .iter()
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(" ");
    if let Some(anchor) = anchor.filter(|_| !s.anchor_found) {
        eprintln!(
            "fsbroker: audit log {name}: the head {anchor} is not in it: the log was cut or \
             rewritten before that line"
        );
        return ExitCode::FAILURE;
    }
    // What the files given leave unchecked: the file before them, and the one after.
    let mut scope = String::new();
    if let Some(from) = &s.continues_from {
        scope += &format!(
            "; it continues {from}, which was not checked (give the files together, oldest \
             first, to check the link)"
        );
    }
    if s.continued {
        scope += "; the log goes on in a later file, which was not checked";
    }
    if !s.unsealed.is_empty() {
        let pids: Vec<String> = s.unsealed.iter().map(u64::to_string).collect();
        eprintln!(
            "fsbroker: audit log {name}: unsealed: crash or truncation — the run(s) of pid {} \
             have no seal (a broker still running, one that crashed, or lines removed from the \
             end); the chain itself is intact, {} line(s), head {}{scope}",
            pids.join(", "),
            s.lines,
            s.head
        );
        return ExitCode::from(3);
    }
    let sealed = if s.continued {
        "every run that ended in them is sealed"
    } else {
        "every run is sealed"
    };
    print(&format!(
        "{name}: ok, {} line(s), first {}, last {}, head {}; the hash chain is intact and \
         {sealed}{scope}\n",
        s.lines,
        s.first.as_deref().unwrap_or("-"),
        s.last.as_deref().unwrap_or("-"),
        s.head
    ))
}

fn audit_head(files: &[PathBuf]) -> ExitCode {
    match fsbroker::audit::verify_files(files, None) {
        Ok(s) => print(&format!("{}\n", s.head)),
        Err(e) => {
            eprintln!("fsbroker: {e}");
            ExitCode::FAILURE
        }
    }
}

fn policy_check(file: PathBuf) -> ExitCode {
    match Policy::load(Some(&file), &Overrides::default()) {
        Ok(policy) => {
            let mut text = format!("{}: ok, {} root(s)\n", file.display(), policy.roots().len());
            for r in policy.roots() {
                text += &format!(
                    "  {} = {} ({}, consent {}{})\n",
                    r.name(),
                    r.path().display(),
                    match r.mode() {
                        fsbroker::sandbox::Mode::ReadOnly => "read-only",
                        fsbroker::sandbox::Mode::ReadWrite => "read-write",
                    },
                    match r.consent() {
                        ConsentMode::Auto => "auto",
                        ConsentMode::Prompt => "prompt",
                        ConsentMode::Deny => "deny",
                    },
                    if r.deny().is_empty() {
                        String::new()
                    } else {
                        format!(", deny {}", r.deny().patterns().join(" "))
                    }
                );
            }
            for warning in policy.warnings() {
                eprintln!("fsbroker: warning: {warning}");
            }
            print(&text)
        }
        Err(e) => {
            eprintln!("fsbroker: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes command output to stdout; a reader that went away (`| head`) is not an error.
pub(crate) fn print(text: &str) -> ExitCode {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fsbroker: cannot write output: {e}");
            ExitCode::FAILURE
        }
    }
}
