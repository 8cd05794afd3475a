//! The `fsbroker` command line: raw flags become a validated policy before anything runs.
//! [`main`] is all the binary calls.
//!
//! This file holds the flags (clap's definitions, hence every `--help` text) and the dispatch;
//! each subcommand's body is a file of its own: `serve.rs`, `proxy.rs`, `policy.rs`,
//! `audit.rs`, `confine.rs`, `bench.rs` (the flags into `crate::bench`'s options) and
//! `man.rs` (the man pages made from these definitions), with what `serve` and `proxy` share
//! (a broker, its runtime, the stop signals) in `running.rs`, the log's set-up in
//! `logging.rs`, and systemd's socket activation and readiness for `serve --listen` in
//! `activation.rs`. It uses the library through its public API only.

mod activation;
mod audit;
mod auth;
mod bench;
mod confine;
mod console;
mod logging;
mod man;
mod policy;
mod proxy;
mod running;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use fsbroker::sandbox::ConsentMode;
use fsbroker::transport::DEFAULT_MAX_LINE;

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
    /// Put the broker in front of an MCP server: a stdio server it starts
    /// (`fsbroker proxy [OPTIONS] -- SERVER ARGS`) or a remote one over Streamable HTTP
    /// (`fsbroker proxy [OPTIONS] --url URL`).
    ///
    /// The host runs this instead of the server. Messages pass through unchanged, except
    /// that the host's `initialize` gains `roots.filesystemBrokering`, and the server's
    /// `roots/list` and `files/*` requests are answered here and never reach the host. The
    /// proxy exits with the server's exit code (0 for a remote server).
    ///
    /// Example: fsbroker proxy --root ~/src/project -- npx -y @modelcontextprotocol/server-filesystem
    ///
    /// Example, a remote server with a bearer token from the environment (the token stays
    /// out of the command line, `ps` and the logs): MCP_TOKEN="Bearer $(cat ~/.config/acme/token)" fsbroker proxy --root ~/src/project --url https://mcp.example.com/mcp --header-env Authorization=MCP_TOKEN
    Proxy(Box<ProxyArgs>),
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
    /// Open the running broker's console in the browser (xdg-open), or print its URL.
    ///
    /// The URL is read from the file the broker wrote: `--url-file FILE` (the broker's
    /// `--console-url-file`), or by default the one each broker started with `--console`
    /// writes to the user's private runtime directory. With one such broker running, its
    /// console opens; with several, they are listed (process id, address, command line) and
    /// `--pid PID` opens one. The browser gets the URL through an owner-only local page, so
    /// the token never appears in a command line other users can see.
    Console(ConsoleArgs),
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
    /// The sign-ins kept for remote servers (`proxy --url`): list them, or forget one.
    ///
    /// They are kept in ~/.local/state/fsbroker/sign-in ($XDG_STATE_HOME/fsbroker/sign-in),
    /// one owner-only file per server and authorization server; no token is ever printed.
    #[command(subcommand)]
    Auth(AuthCommand),
    /// Write a man page for fsbroker and each of its subcommands (fsbroker.1,
    /// fsbroker-serve.1, ...) into DIR, from these same definitions. For packagers
    /// (dist/debian/build), hence hidden from `--help`, the man pages and completions.
    #[command(hide = true)]
    GenerateMan {
        /// An existing directory; pages already there are overwritten.
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum AuthCommand {
    /// List the kept sign-ins: server, authorization server, scopes, expiry.
    List,
    /// Sign out of the server at URL (as given to `proxy --url`): its tokens are revoked at
    /// the authorization server that issued them, where it offers that (RFC 7009), and
    /// forgotten here in every case, so the next start signs in again.
    ///
    /// Exits 1 when an authorization server was asked and did not revoke the tokens (they are
    /// forgotten here all the same; they stay valid there until they expire).
    ///
    /// Example: fsbroker auth logout https://mcp.example.com/mcp
    Logout {
        /// The server's URL.
        url: String,
        /// Also trust the certificates of this PEM file (a private CA) when revoking, as
        /// `proxy --ca-cert` does (repeatable).
        #[arg(long = "ca-cert", value_name = "FILE")]
        ca_certs: Vec<PathBuf>,
        /// The environment variable holding the secret of a client registered beforehand
        /// (as given to `proxy --oauth-client-secret-env`): the sign-in cache does not keep
        /// it, and the authorization server may want it to revoke that client's tokens.
        #[arg(long = "oauth-client-secret-env", value_name = "VAR")]
        client_secret_env: Option<String>,
        /// Only forget the tokens here; do not ask the authorization server to revoke them.
        #[arg(long, conflicts_with = "client_secret_env")]
        no_revoke: bool,
    },
}

#[derive(Debug, Args)]
struct ConsoleArgs {
    /// The URL file the broker wrote (`serve|proxy --console-url-file`).
    #[arg(long, value_name = "FILE", conflicts_with = "pid")]
    url_file: Option<PathBuf>,
    /// The console of the broker with this process id (as `fsbroker console` lists them).
    #[arg(long, value_name = "PID")]
    pid: Option<u32>,
    /// Print the URL instead of opening it.
    #[arg(long)]
    print: bool,
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
    /// without it, three windows of every chunk are compared with the file). The broker's
    /// own hashes are checked too (the integrity extension): `sha256` on every read and
    /// upload, and `files/checksum` of the whole file.
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
    /// Run only these phases (comma-separated or repeated). The console phase runs only when
    /// named here.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "PHASE")]
    only: Vec<crate::bench::Phase>,
    /// Changes timed by the watch phase (one every 60 ms); the console phase times a tenth as
    /// many, at least 5, of each of its latencies [default: 200; with --quick 20]
    #[arg(long, value_name = "N")]
    watch_samples: Option<usize>,
    /// Entries of the tree the list phase makes and lists recursively
    /// [default: 100000; with --quick 10000]
    #[arg(long, value_name = "N")]
    list_entries: Option<usize>,
    #[command(flatten)]
    mcp: crate::bench::McpArgs,
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
    /// How long a confined server has to answer the host's `initialize`, in seconds (0: no
    /// limit). Past it, the host gets an error with the diagnosis (paths and network the
    /// sandbox refused, the server's last stderr lines), stderr gets it too, and the server
    /// is ended. A server that answered in time is never ended for it.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = fsbroker::transport::proxy::START_TIMEOUT.as_secs()
    )]
    start_timeout: u64,
    /// Let a launcher that would fetch its package at start (`npx -y PKG` with nothing
    /// installed) get it from this registry first (npm, pypi; repeatable or comma-separated;
    /// as the policy's `[confine] fetch`). fsbroker installs it before the server starts,
    /// with the network, into its own cache (~/.cache/fsbroker/launch), running none of the
    /// package's code; the server then runs confined, with no network. Without it, such a
    /// start is refused with what to do.
    #[arg(long, value_enum, value_name = "REGISTRY", value_delimiter = ',')]
    confine_fetch: Vec<RegistryArg>,
    /// The MCP server to run, after `--` (or --url).
    #[arg(last = true, required_unless_present = "url", value_name = "SERVER")]
    command: Vec<std::ffi::OsString>,
    /// Reach a remote MCP server over Streamable HTTP (http:// or https://) instead of
    /// starting one: the host's messages are POSTed to URL, and the server's (JSON answers,
    /// event streams, the session's GET stream) come back to the host, its roots/list and
    /// files/* requests answered here. Not with `-- SERVER` or --confine.
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// A header for every request to --url, as NAME:VALUE (repeatable). The value shows in
    /// `ps`: put secrets in --header-env.
    #[arg(long = "header", value_name = "NAME:VALUE", requires = "url")]
    headers: Vec<String>,
    /// A header for every request to --url whose value is the environment variable VAR, read
    /// at start, as NAME=VAR (repeatable): `--header-env Authorization=MCP_TOKEN` with
    /// MCP_TOKEN="Bearer …". The value never appears in logs or errors.
    #[arg(long = "header-env", value_name = "NAME=VAR", requires = "url")]
    header_envs: Vec<String>,
    /// Also trust the certificates of this PEM file (a private CA) for an https --url, besides
    /// the system's roots (repeatable).
    #[arg(long = "ca-cert", value_name = "FILE", requires = "url")]
    ca_certs: Vec<PathBuf>,
    /// Cap the length of the remote server's files/read requests (bytes, or KiB, MiB...), so
    /// that the answers fit its request-body limit. Without it the proxy learns the limit
    /// from the first answer the server refuses (HTTP 413) and clamps later reads.
    #[arg(long, value_name = "SIZE", value_parser = crate::bench::parse_size, requires = "url")]
    max_chunk_size: Option<u64>,
    /// Do not sign in when --url answers HTTP 401: the host gets the 401 as an error. By
    /// default the proxy signs in (MCP authorization: the browser opens at the server's
    /// authorization server, `$BROWSER` or xdg-open, and with --console the console shows a
    /// "Sign in" card), keeps the token in ~/.local/state/fsbroker/sign-in for the next start
    /// (`fsbroker auth list`), and sends it to --url alone. Never with an Authorization
    /// header of your own.
    #[arg(long, requires = "url")]
    no_sign_in: bool,
    /// Sign in as this client, registered beforehand with the authorization server, instead
    /// of registering one dynamically (RFC 7591).
    #[arg(long, value_name = "ID", requires = "url")]
    oauth_client_id: Option<String>,
    /// The --oauth-client-id's secret, from the environment variable VAR (never the command
    /// line, which other users can read). Needs --oauth-issuer.
    #[arg(long, value_name = "VAR", requires_all = ["oauth_client_id", "oauth_issuer"])]
    oauth_client_secret_env: Option<String>,
    /// The authorization server (its issuer URL) the --oauth-client-id is registered with:
    /// the client's id and secret are sent to it alone, whichever authorization server the
    /// remote server names.
    #[arg(long, value_name = "URL", requires = "oauth_client_id")]
    oauth_issuer: Option<String>,
    /// Receive the sign-in on this loopback port (http://127.0.0.1:PORT/callback), for a
    /// client registered with a fixed redirect; by default any free port.
    #[arg(long, value_name = "PORT", requires = "url")]
    oauth_redirect_port: Option<u16>,
}

/// A registry `--confine-fetch` allows.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum RegistryArg {
    /// The npm registry npm's configuration names (npx, npm exec).
    Npm,
    /// The Python Package Index uv's and pip's configuration name (uvx, pipx run).
    Pypi,
}

impl RegistryArg {
    /// The registries, as the library names them.
    fn all(args: &[RegistryArg]) -> Vec<fsbroker::policy::Registry> {
        args.iter()
            .map(|r| match r {
                RegistryArg::Npm => fsbroker::policy::Registry::Npm,
                RegistryArg::Pypi => fsbroker::policy::Registry::Pypi,
            })
            .collect()
    }
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
        /// As `proxy --confine-fetch`: the registries a launcher's missing package may be
        /// installed from before the server starts.
        #[arg(long, value_enum, value_name = "REGISTRY", value_delimiter = ',')]
        confine_fetch: Vec<RegistryArg>,
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
    /// Serve the person's console, a local web page to answer consent prompts, watch what
    /// every server does and take access back, on ADDR (loopback only; default
    /// 127.0.0.1:0, any free port). Its address goes to stderr (`fsbroker: console at
    /// ADDR`), and its URL, with a one-time ticket, only to the owner-only URL file, which
    /// `fsbroker console` opens.
    #[arg(
        long,
        value_name = "ADDR",
        num_args = 0..=1,
        require_equals = false,
        default_missing_value = "127.0.0.1:0",
        value_parser = fsbroker::policy::loopback_addr
    )]
    console: Option<std::net::SocketAddr>,
    /// Write the console's URL to FILE (owner-only) instead of the user's private runtime
    /// directory, where `fsbroker console` looks by default.
    #[arg(long, value_name = "FILE")]
    console_url_file: Option<PathBuf>,
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
    ///
    /// With --managed, FILE is an administrator's managed policy (what
    /// /etc/fsbroker/managed.toml holds), checked before it is deployed: its keys, paths,
    /// globs, ceilings and URLs, and (for a file already at /etc/fsbroker/managed.toml) that
    /// it is owned by root and writable by no one else.
    Check {
        /// The policy file.
        file: PathBuf,
        /// FILE is a managed policy.
        #[arg(long)]
        managed: bool,
    },
    /// Print the JSON Schema of policy files, for editors (e.g. taplo, Even Better TOML).
    /// With --managed, the schema of the administrator's managed policy
    /// (/etc/fsbroker/managed.toml).
    Schema {
        /// The managed policy's schema instead.
        #[arg(long)]
        managed: bool,
    },
    /// Print the rules a broker started with these options would run with, each marked with
    /// where it comes from: [managed] (your organisation's managed policy,
    /// /etc/fsbroker/managed.toml, which no flag or user policy can lift), [policy] (the
    /// policy file), [flag] (the command line) or [default]. What the managed policy refuses
    /// is listed too (exit 1 then, as `serve` would not start).
    ///
    /// Example: fsbroker policy explain --policy ~/.config/fsbroker/policy.toml --root ~/src/project
    Explain {
        #[command(flatten)]
        serve: ServeArgs,
    },
}

/// What `fsbroker --version` prints after the name: the version, and the MCP revisions the
/// proxy understands (the `initialize` era up to 2025-11-25; the `server/discover` era from
/// 2026-07-28, whose later dated revisions it treats the same way).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (MCP 2024-11-05 to 2025-11-25 through initialize; 2026-07-28 through server/discover)"
);

/// Parses the command line and runs it: what the `fsbroker` binary's `main` does.
pub(crate) fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init();
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Proxy(args) => proxy::run(*args),
        Command::Policy(PolicyCommand::Check {
            file,
            managed: false,
        }) => policy::check(file),
        Command::Policy(PolicyCommand::Check {
            file,
            managed: true,
        }) => policy::check_managed(file),
        Command::Audit(AuditCommand::Verify { files, head }) => {
            audit::verify(&files, head.as_deref())
        }
        Command::Audit(AuditCommand::Head { files }) => audit::head(&files),
        Command::Bench(args) => bench::run(args),
        Command::Auth(AuthCommand::List) => auth::list(),
        Command::Auth(AuthCommand::Logout {
            url,
            ca_certs,
            client_secret_env,
            no_revoke,
        }) => auth::logout(&url, &ca_certs, client_secret_env.as_deref(), !no_revoke),
        Command::Console(args) => console::open(args.url_file, args.pid, args.print),
        Command::Confine(ConfineCommand::Check {
            serve,
            confine_fetch,
            command,
        }) => confine::check(&serve, &confine_fetch, &command),
        Command::Policy(PolicyCommand::Schema { managed }) => policy::schema(managed),
        Command::Policy(PolicyCommand::Explain { serve }) => policy::explain(&serve),
        Command::GenerateMan { dir } => {
            man::generate(<Cli as clap::CommandFactory>::command(), &dir)
        }
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut completed_command(), "fsbroker", &mut out);
            print(&String::from_utf8_lossy(&out))
        }
    }
}

/// The command line that completion scripts offer: `Cli` without its hidden subcommands
/// (`generate-man`), which clap_complete's scripts would offer too (it leaves hidden ones out
/// of `--help` and man pages only). Its texts, top-level flags and every visible
/// subcommand, with all of theirs, are `Cli`'s own.
fn completed_command() -> clap::Command {
    let cli = <Cli as clap::CommandFactory>::command();
    let mut visible = clap::Command::new("fsbroker")
        .version(VERSION)
        .propagate_version(true)
        .args(cli.get_arguments().cloned())
        .subcommands(cli.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    if let Some(about) = cli.get_about() {
        visible = visible.about(about.clone());
    }
    if let Some(long_about) = cli.get_long_about() {
        visible = visible.long_about(long_about.clone());
    }
    visible
}

/// Writes command output to stdout; a reader that went away (`| head`) is not an error.
fn print(text: &str) -> ExitCode {
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
