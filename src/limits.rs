//! Every fixed bound of the broker, with its value and why: the one table.
//!
//! The limits a policy sets (`[limits]`: rates, `timeout_ms`, chunk and file sizes, quotas)
//! are in `policy/`, with their defaults; docs/protocol.md section 7 lists both kinds. What
//! is here cannot be configured: each bound keeps what a peer can make the broker hold, or
//! how long it waits, finite, and says why its value is enough for honest peers. A test
//! that tries to exceed a bound names it.
//!
//! Performance tunings (the size of a read, of a base64 piece, of a batch) are not bounds
//! and stay beside the code they tune.

use std::time::Duration;

// ---- Lines, frames and output ----
// What one connection may hold: its lines as they arrive, its answers before they are written.

/// The default maximum line length: 32 MiB, room for an 8 MiB chunk in base64 and then some.
pub const DEFAULT_MAX_LINE: usize = 32 << 20;

/// The longest a line waits for room in the shared input budget before it is refused. Honest
/// lines arrive in milliseconds and free their room as they complete; a budget that stays
/// full this long is held by connections that are not finishing theirs. A reader waiting for
/// room does not read, so it does not see its peer leave: the wait is short so that a closed
/// connection is noticed (and its session ended) soon.
pub(crate) const MAX_INPUT_WAIT: Duration = Duration::from_secs(1);

/// KiB of request lines a session may hold while their requests run: with upload chunks
/// pipelined, `max_in_flight` alone would let 64 lines of up to `max_line` bytes pile up. A
/// longer line is let through alone.
pub(crate) const INPUT_BUDGET_KIB: usize = 32 << 10;

/// Frames waiting for a writer; small, so a peer that stops reading stalls the broker's
/// reading rather than growing its memory.
pub(crate) const OUTPUT_QUEUE: usize = 64;

/// KiB of read responses a session may have built but not yet written: a peer that reads
/// slower than the disk makes further reads wait here instead of growing the broker's memory.
/// Room for two 8 MiB chunks in base64 (one being written, one waiting); a larger response
/// counts as half of it, so two are always let through.
pub(crate) const OUTPUT_BUDGET_KIB: usize = 32 << 10;

/// A body unused this long is unmapped (`BodyPool::trim`): a session that stopped reading
/// large chunks does not keep their memory.
pub(crate) const POOL_IDLE: Duration = Duration::from_secs(1);

// ---- A session ----
// What one server's session may make the broker keep or do at once.

/// How many notifications may wait for a session's writer before new ones are dropped.
pub(crate) const NOTIFICATION_QUEUE: usize = 1024;

/// How often a session's refusals over the request rate get an audit line.
pub(crate) const RATE_REFUSAL_LINES: Duration = Duration::from_secs(1);

/// The longest server name kept (consent prompts show it).
pub(crate) const MAX_PEER_NAME: usize = 256;

/// The largest proxy note (`notifications/fsbroker/peer`) taken: a proxy's note (a name, a revision, the rules of
/// a sandbox) is a few KiB.
pub(crate) const MAX_PEER_NOTE: usize = 64 << 10;

/// The most paths one `files/consent` may ask for: a person reads each one, and each is placed
/// where it really leads (file-system work) before anyone is asked.
pub(crate) const MAX_CONSENT_PATHS: usize = 256;

/// The longest consent message a person is shown, in bytes (a longer one is cut, saying so):
/// every console that shows the prompt carries it, as often as it reads the state.
pub(crate) const MAX_CONSENT_MESSAGE: usize = 4096;

/// How many prompts may wait for a person at once, across every session of a broker.
pub(crate) const PROMPTS: usize = 2;

/// The most a `[consent] command` may write: its decision is a few paths, anything longer
/// is not a decision.
pub(crate) const MAX_OUTPUT: u64 = 1 << 20;

/// The largest `files/read` (bytes wanted) that runs inline on the fast path (`fast.rs`):
/// small enough that a read there costs microseconds unless its file system hangs.
pub(crate) const MAX_INLINE_READ: usize = 64 << 10;

// ---- The proxy and the MCP 2026-07-28 era ----
// What a server behind `fsbroker proxy` may make it hold, and how long the proxy waits for
// the ends of a run.

/// KiB of lines each relay queue may hold (host → server, server → host, and to and from a
/// shared broker); a longer line is let through alone.
pub const RELAY_BUDGET_KIB: usize = 32 << 10;

/// Host requests kept for a retry at once (each answered or cancelled lets go of its own).
pub(crate) const MAX_KEPT: usize = 1024;

/// Bytes of host requests kept for a retry at once.
pub(crate) const MAX_KEPT_BYTES: usize = 64 << 20;

/// The longest host request kept for a retry: `tools/call` and its kin are small; the
/// `input_required` answer to a longer one has the broker's input requests taken out.
pub(crate) const MAX_KEPT_REQUEST: usize = 1 << 20;

/// The broker answers at most this many input requests of one `input_required` result; the
/// rest get a `QuotaExceeded` error as their answer.
pub(crate) const MAX_BROKER_INPUTS: usize = 16;

/// Bytes of the broker's answers in one round (a retry line carries them all); past this, the
/// rest get a `QuotaExceeded` error as their answer.
pub(crate) const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Rounds of input requests the broker answers at once on one connection; past this, the
/// proxy stops reading the server until one is done.
pub(crate) const ROUNDS_AT_ONCE: usize = 2;

/// The broker's answers waiting for the host's retry; past this, the oldest are let go (the
/// server then asks again).
pub(crate) const MAX_STASHED: usize = 256;

/// Errors sent for one unreadable message, at most: one per distinct id it carries.
pub(crate) const MAX_UNREADABLE_IDS: usize = 8;

/// Bytes of the broker's answers waiting for the host's retry; past this, the oldest are let
/// go.
pub(crate) const MAX_STASHED_BYTES: usize = 32 << 20;

/// At most this many rounds of `input_required` answered by the broker for one host request
/// (the SDKs stop at 10 too): a server that keeps asking gets its last answer to the host.
pub(crate) const MAX_ROUNDS: u32 = 10;

/// An `input_required` result with more input requests than this is not relayed: no peer
/// asks for so much at once, and the proxy would hold them all.
pub(crate) const MAX_INPUT_REQUESTS: usize = 64;

/// An object at a level that decides where a message goes (the message, its result, the
/// input requests and each of them) with more members than this is unreadable: the proxy
/// tracks each member's name there (and keeps each member of an `input_required` result),
/// so their number bounds what a line costs it beyond its own bytes. No peer writes so many.
pub(crate) const MAX_MEMBERS: usize = 4096;

/// How many distinct ids of one message are kept: a message that writes its id more than
/// once is unreadable anyway, and answered under at most a few of them.
pub(crate) const MAX_IDS: usize = 8;

/// How many of the server's requests the broker took the proxy remembers, so that the
/// server's `notifications/cancelled` for one stays away from the host: a cancellation comes
/// within the server's request timeout, long before this many more requests.
pub(crate) const TAKEN_IDS: usize = 4096;

/// How long a server told to end (SIGTERM) has before it is killed.
pub const END_GRACE: Duration = Duration::from_secs(3);

/// How long a server has to exit by itself once the host has gone (the proxy's stdin closed,
/// and with it the server's) before it is sent SIGTERM, when nothing stops the proxy. Longer
/// than the grace a stopping proxy gives ([`CLOSE_GRACE`]): no stop grace runs, and a server
/// may still be finishing what it was asked (a host that wants it gone sooner sends the proxy
/// SIGTERM, as the MCP SDKs do 2 s after closing its stdin).
pub const HOST_GONE_GRACE: Duration = Duration::from_secs(10);

/// How long the broker's answers to a server's requests in flight when its host left (the
/// consent prompts withdrawn then, above all) have to reach the server before its stdin
/// closes: a server whose questions go unanswered waits for them and is ended
/// ([`HOST_GONE_GRACE`]) instead of ending by itself. Answers are queued in microseconds; a
/// read of a big file still running is cut, as it would be anyway.
pub(crate) const HOST_LEFT_ANSWERS: Duration = Duration::from_secs(2);

/// How long a server's session must have no request in flight, once its host has left, for
/// the server to count as having nothing more to ask ([`HOST_LEFT_ANSWERS`] bounds the wait):
/// a server answered asks its next question within milliseconds.
pub(crate) const HOST_LEFT_QUIET: Duration = Duration::from_millis(100);

/// How long the server of a proxy stopped by a signal has, from the moment its stdin closed,
/// before it is sent SIGTERM (the MCP stdio transport's shutdown: close the server's input,
/// wait, SIGTERM, wait, SIGKILL). A server whose stdin closed longer ago (the host closed the
/// proxy's stdin, then sent SIGTERM) is sent SIGTERM at once.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// How long a server sent SIGTERM because the host has gone or the proxy stops has before
/// SIGKILL. With [`CLOSE_GRACE`], it fits in the grace a stopping broker gives its work (5 s,
/// `fsbroker serve` and `proxy`), so a proxy stopped by a signal seals its audit log whatever its server does.
pub const STOP_KILL_GRACE: Duration = Duration::from_secs(1);

/// How long the relay drains an unconfined server's stdout after the server exited and the
/// host has gone, when what the server started still holds it open.
pub(crate) const DRAIN: Duration = Duration::from_millis(500);

/// How long past `timeout_ms` the proxy waits for its server's last requests once the server
/// is gone (`BrokerSide::finish`).
pub(crate) const FINISH_SLACK: Duration = Duration::from_secs(1);

/// How long a confined server has to answer the host's `initialize`, from the moment the
/// proxy relayed it, before the host gets an error, stderr the diagnosis, and the server is
/// ended (`proxy --start-timeout SECS`, 0 for no limit). A server installed locally answers
/// within a second or two, a cold start on a slow machine within several; one that has not
/// answered after this long is waiting for something the sandbox refuses (npm retries a
/// refused network for minutes), and a host that gave up first would show the person only
/// "failed to connect".
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a proxy that cannot start its server (a strict refusal, a command not found)
/// reads the host's input for a request to answer with the reason before it exits: a host
/// writes its `initialize` as soon as it has started the proxy.
pub const REFUSED_START_WAIT: Duration = Duration::from_secs(5);

/// The most host input read while waiting for that request; an `initialize` is a few KiB.
pub(crate) const REFUSED_START_INPUT: u64 = 1 << 20;

/// Lines of a confined server's stderr kept (the last ones) for the diagnosis of a start
/// that failed: the errors that explain it are among the last a server writes.
pub(crate) const STDERR_TAIL_LINES: usize = 64;

/// Bytes of those lines kept at most.
pub(crate) const STDERR_TAIL_BYTES: usize = 16 << 10;

/// The longest stderr line kept whole for the diagnosis; the rest of a longer one is cut.
pub(crate) const STDERR_TAIL_LINE: usize = 1024;

/// How long the diagnosis of a confined server that exited waits for the last of its
/// stderr to be copied: the tree has been ended, so the pipe closes at once.
pub(crate) const STDERR_SETTLE: Duration = Duration::from_secs(1);

// ---- The broker ----
// Waits of the shared broker itself, and what it keeps for a host's live view.

/// Answered requests a host's live view ([`crate::Broker::events`]) may fall behind by
/// before it loses the oldest: a few seconds of a busy session's small requests. A view that
/// falls further behind is told how many it lost, and the broker never waits for it.
pub const EVENT_BACKLOG: usize = 4096;

/// How often a broker whose policy file is held tries to read it again.
pub(crate) const HELD_RETRY: Duration = Duration::from_millis(250);

/// Changes to the policy file arriving within this long of each other are one reload.
pub(crate) const QUIET: Duration = Duration::from_millis(50);

/// How long `serve --listen` waits before accepting again after running out of descriptors.
pub(crate) const BACKOFF: Duration = Duration::from_millis(100);

// ---- Paths and trees ----
// How far a request may make the broker walk.

/// The most components a request path may have beneath its root. Checks on a path (a deny
/// glob for each folder above it, the tree lock held while a rename checks both names) cost
/// more the deeper it is; no real tree needs more, and `PATH_MAX` stops the kernel not far
/// beyond.
pub(crate) const MAX_DEPTH: usize = 256;

/// The most levels a walk goes beneath the folder it starts from (a recursive delete or
/// listing). A tree can be deeper than any request path — renames nest folders without
/// naming their contents — and a walk holds a directory, and for a listing that level's
/// path, per level: deeper trees are refused (`QUOTA_EXCEEDED`), to be handled in parts.
pub const MAX_WALK_DEPTH: usize = 128;

/// The most entries a directory rename checks against deny globs and fsbroker's own files
/// while it holds the tree lock exclusively; a larger tree is not moved (`QUOTA_EXCEEDED`).
/// It bounds how long one rename can hold up every other session's changes (a few hundred
/// milliseconds on a slow disk).
pub(crate) const MAX_TREE_CHECK: usize = 20_000;

/// The most glob matches (an entry's folders, counted for each entry) a directory rename
/// makes under the tree lock; with [`MAX_TREE_CHECK`] it keeps a hold to a fraction of a
/// second whatever the tree's shape.
pub(crate) const MAX_TREE_WORK: usize = 200_000;

// ---- Watches ----
// What `files/watch` may make the broker remember and queue.

/// The most entries one watch's snapshot holds (`QUOTA_EXCEEDED` beyond): a recursive watch
/// remembers each entry to tell what changed.
pub(crate) const MAX_ENTRIES: usize = 100_000;

/// The most bytes of paths one watch's snapshot holds.
pub(crate) const MAX_PATH_BYTES: usize = 16 << 20;

/// Paths waiting per watch before further events are dropped (and the watch rescanned once
/// the server catches up).
pub(crate) const MAX_PENDING_PER_WATCH: usize = 10_000;

/// A burst of events on one path within this window is one notification.
pub(crate) const COALESCE: Duration = Duration::from_millis(50);

/// Raw events waiting for the worker; beyond this the worker rescans instead.
pub(crate) const EVENT_QUEUE: usize = 16 * 1024;

/// When a new directory is listed (see `watch::worker::Worker::rechecks`): at once, and twice again.
pub(crate) const RECHECK_AFTER: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_millis(100),
    Duration::from_millis(500),
];

/// How often every root is checked for having been deleted, moved or unmounted.
pub(crate) const ROOT_CHECK: Duration = Duration::from_millis(500);

// ---- The policy file ----

/// The largest policy file read. Real ones are a few KiB.
pub(crate) const MAX_POLICY_BYTES: u64 = 4 << 20;

/// The smallest `[audit] max_bytes` (a log rolled over at that size): a few lines per file
/// at least.
pub const MIN_AUDIT_BYTES: u64 = 4096;

// ---- The audit log ----
// What a server can make the broker write, and how long a line waits.

/// How long the broker's own lines (its start, a seal, a proxy's account) wait for the log:
/// they have no request deadline of their own, and must not wait forever either.
pub const OWN_LINE_WAIT: Duration = Duration::from_secs(10);

/// The longest path logged whole (Linux's `PATH_MAX`); a longer one is cut.
pub const MAX_LOGGED_PATH: usize = 4096;

/// How many of a consent request's paths a line lists.
pub const MAX_LOGGED_PATHS: usize = 16;

/// How many bytes of the consent paths a line lists, as written (escapes included).
pub const MAX_LOGGED_PATHS_BYTES: usize = 16 << 10;

/// The longest line `tail` and `verify` read: far above any line a broker writes (its strings
/// are capped), far below what a file that is not a log can make them hold in memory.
pub const MAX_LINE: u64 = 1 << 20;

/// How long one send may wait for room in a collector's queue before the copy counts as down.
pub(crate) const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// rsyslog's default `maxMessageSize`: a syslog message longer than this is cut by common
/// collectors, so a longer line is sent elided (`audit::copy::syslog_message`).
pub(crate) const SYSLOG_MAX: usize = 8192;

/// How much of each long string an elided syslog message keeps.
pub(crate) const SYSLOG_KEEP: usize = 512;

// ---- Confinement and the runtime directory ----

/// How many `#!` interpreters deep the search goes (a script run by a script …).
pub(crate) const MAX_INTERPRETERS: usize = 4;

/// How many packages a confined npm server's dependency tree may grant: far above what real
/// servers load (the reference filesystem server loads about 100), low enough that a hostile
/// `package.json` web cannot make the plan (one Landlock rule each) unbounded.
pub(crate) const MAX_PACKAGES: usize = 4096;

/// How long reading a confined npm server's dependency tree may take: real trees take
/// milliseconds (the reference server's, about 100 packages, under 50 ms), while a hostile
/// web of manifests in a writable install (thousands of packages, each naming a thousand
/// missing ones, hundreds of directories deep) could take minutes. Past it, the rest of the
/// tree is not granted, and the plan says so.
pub(crate) const TREE_READ_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How many dependency names of one `package.json` the tree walk reads: far above real
/// packages (a few dozen), so that a hostile manifest naming every package of a huge
/// `node_modules` cannot make planning quadratic.
pub(crate) const MAX_DEPENDENCIES: usize = 1024;

/// How long fsbroker's install of a launcher's missing package (`[confine] fetch`) may take
/// before the start is refused: a cold `npx -y` of the reference filesystem server takes
/// about 10 s here; a registry that stalls must not hold the host's `initialize` for good.
pub(crate) const INSTALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// How many fresh names a confined server's private temporary directory is tried under
/// when the directory a proxy made is taken from it.
pub(crate) const ATTEMPTS: usize = 8;

/// How old (by its modification time: nothing is written into it while it is staged) an
/// unlocked staging directory must be before clean-up takes it for abandoned: its proxy
/// needs microseconds between making it and locking it, this leaves room for a stalled one.
pub(crate) const STAGING_GRACE: Duration = Duration::from_secs(60);

/// How many links `--confine`'s walk of a server's paths follows before it gives up (the
/// kernel's own limit).
pub(crate) const MAX_LINKS: usize = 40;

/// How long `confine::reap::end_descendants` keeps ending a tree that keeps growing or will not die
/// (a process in uninterruptible sleep dies only when it leaves the kernel).
pub(crate) const GIVE_UP: Duration = Duration::from_secs(30);

/// How many times (10 ms apart) a proxy looks for a shared broker's key that is not there
/// yet (the broker writes it just after its socket appears).
pub(crate) const KEY_WAIT_TRIES: u32 = 100;

// ---- The proxy's Streamable HTTP client (`proxy --url`) ----
// What a remote MCP server can make the proxy hold or wait for. Event and body sizes are
// bounded by the proxy's `max_line`: a message longer than that could not be relayed anyway.

/// How long a TCP connection to the remote server may take to open.
pub(crate) const REMOTE_CONNECT: Duration = Duration::from_secs(10);

/// How long a response's status and headers may take after the request was sent (TLS
/// handshake included). A server that answers a request with one JSON body only once its work
/// is done sends its headers then, so this is also the longest such a request may run; a
/// server that streams (SSE) sends its headers at once.
pub(crate) const REMOTE_HEAD: Duration = Duration::from_secs(300);

/// How long a JSON response body may go without a byte once its headers came: the body is
/// being sent, and a server that stalls in the middle of it (slow-loris) is given up on. Event
/// streams have no such limit: a stream may idle while the server works.
pub(crate) const REMOTE_BODY_IDLE: Duration = Duration::from_secs(60);

/// How many times in a row a dropped event stream (a POST's or the GET stream) is resumed
/// before the proxy gives up on it.
pub(crate) const REMOTE_RESUMES: u32 = 5;

/// The wait before resuming a stream when the server named none (`retry:`), and the most a
/// server's `retry:` may ask for.
pub(crate) const REMOTE_RETRY: Duration = Duration::from_secs(1);
/// See [`REMOTE_RETRY`].
pub(crate) const REMOTE_MAX_RETRY: Duration = Duration::from_secs(30);
/// The least wait before resuming a stream, whatever the server's `retry:` (`retry: 0` and a
/// stream that drops after each event would have the proxy reconnect in a tight loop).
pub(crate) const REMOTE_MIN_RETRY: Duration = Duration::from_millis(100);

/// How long a whole JSON response body may take once its headers came: a server that sends
/// a byte just inside [`REMOTE_BODY_IDLE`] each time would hold the request forever.
pub(crate) const REMOTE_BODY_TOTAL: Duration = Duration::from_secs(300);

/// Host requests sent to the remote server at once (each holds a connection and its stream);
/// the next wait, holding their share of the relay's budget, which stops the host when full.
pub(crate) const REMOTE_POSTS_AT_ONCE: usize = 64;

/// How long the proxy waits, once the host has gone, for answers still in flight before it
/// ends the session, and then for the session's `DELETE`.
pub(crate) const REMOTE_GOODBYE: Duration = Duration::from_secs(2);

/// The server's `files/read` requests remembered until their answers are sent (to turn an
/// HTTP 413 into a clamp); past this the oldest are forgotten.
pub(crate) const REMOTE_READS_KEPT: usize = 1024;

/// Host requests the proxy answered with its own error whose ids it remembers, so that the
/// server's late answer to one is not passed on as a second answer.
pub(crate) const REMOTE_FAILED_KEPT: usize = 256;

/// Host requests waiting for the remote server's answer at once; past this the next one is
/// answered with the proxy's error instead of being sent. A host waits for its requests long
/// before it has this many out: only a server that answers none of them gets near it.
pub(crate) const REMOTE_PENDING: usize = 4096;

/// Event streams the proxy follows at once that answer no host request (a stream opened for
/// a notification or for the broker's answer, which nothing ends); past this a new one is
/// closed unread (servers answer those POSTs with 202).
pub(crate) const REMOTE_SIDE_STREAMS: usize = 4;

/// The least of the one byte budget that everything being read from the server shares (the
/// events not yet whole, the JSON bodies not yet ended); it is at least twice `max_line`. A
/// stream or body that finds it spent fails at once (waiting could deadlock partial events
/// on each other).
pub(crate) const REMOTE_IN_FLIGHT_MIN: usize = 32 << 20;

/// The smallest `files/read` length the proxy clamps to after HTTP 413s.
pub(crate) const REMOTE_MIN_CHUNK: u64 = 4096;

// ---- Signing in to a remote server (`proxy --url`, MCP authorization) ----

/// How long one request of the sign-in (a metadata document, a registration, the token
/// endpoint) may take, body included: an authorization server that stalls fails the step.
pub(crate) const SIGN_IN_FETCH: Duration = Duration::from_secs(30);

/// The longest body the sign-in reads from a metadata document, a registration or the token
/// endpoint: those are a few KiB.
pub(crate) const SIGN_IN_BODY: usize = 256 << 10;

/// How long the host's request that met a 401 waits for the person to sign in before it gets
/// an error saying how to finish: under the 60 s a host's SDK waits for an answer by default,
/// so the host hears the reason from the proxy rather than a time-out of its own.
pub(crate) const SIGN_IN_WAIT: Duration = Duration::from_secs(45);

/// How long a sign-in stays open for the person (the redirect listener, the console's card):
/// the host's next request, once they signed in, finds the token there.
pub(crate) const SIGN_IN_OPEN: Duration = Duration::from_secs(600);

/// A token this close to its expiry is refreshed before it is sent, not after a 401.
pub(crate) const TOKEN_REFRESH_MARGIN: Duration = Duration::from_secs(60);
