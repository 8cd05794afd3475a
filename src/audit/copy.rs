//! Copies of the audit log off the file, sent as each line is written to the machine's log
//! collector: RFC 5424 syslog over `/dev/log`, or the systemd journal's native protocol.
//!
//! Whoever can write the log file can recompute a keyless chain; a copy held by a collector
//! that the writer cannot reach is what makes a rewrite visible (the copy's `hash`es no longer
//! match). fsbroker only frames and sends: the collector (rsyslog, syslog-ng, journald) stores
//! and forwards. The two framings are a few lines each and the sockets must be configurable (a
//! test listens on its own), which the journald and syslog crates do not offer, so they are
//! written here.
//!
//! A copy never stalls the broker for long: a send waits at most [`SEND_TIMEOUT`] for room in
//! the collector's queue. Once one fails the copy is *down*: later lines are tried without
//! waiting, counted when they fail, and the first that gets through brings it back. Each
//! change is reported to the log itself ([`Notice`]), so the gap is recorded in the chain.

use std::collections::BTreeMap;
use std::io::{IoSlice, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::limits::{SEND_TIMEOUT, SYSLOG_KEEP, SYSLOG_MAX};
use crate::policy::CopyConfig;

/// A change in a copy's state, to be recorded in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Notice {
    /// The copy could not be delivered (first failure after it last worked).
    Lost {
        /// `syslog` or `journald`.
        to: &'static str,
        /// The socket.
        socket: PathBuf,
        /// The OS error.
        error: String,
    },
    /// The copy works again after `lost` lines did not reach it.
    Resumed {
        /// `syslog` or `journald`.
        to: &'static str,
        /// The socket.
        socket: PathBuf,
        /// Lines that never reached it.
        lost: u64,
    },
}

impl Notice {
    /// The log line's members (besides `ts`, `pid`, `prev`, `hash`).
    pub(crate) fn fields(&self) -> BTreeMap<&'static str, Value> {
        let mut f = BTreeMap::new();
        match self {
            Notice::Lost { to, socket, error } => {
                f.insert("event", Value::from("copy-lost"));
                f.insert("to", Value::from(*to));
                f.insert("socket", Value::from(socket.to_string_lossy()));
                f.insert("error", Value::from(error.as_str()));
            }
            Notice::Resumed { to, socket, lost } => {
                f.insert("event", Value::from("copy-resumed"));
                f.insert("to", Value::from(*to));
                f.insert("socket", Value::from(socket.to_string_lossy()));
                f.insert("lost", Value::from(*lost));
            }
        }
        f
    }
}

/// One destination.
struct Sink {
    config: CopyConfig,
    socket: UnixDatagram,
    /// Lines not delivered since it went down; `None` while it works.
    lost: Option<u64>,
}

impl Sink {
    fn name(&self) -> &'static str {
        match self.config {
            CopyConfig::Syslog { .. } => "syslog",
            CopyConfig::Journald { .. } => "journald",
        }
    }

    fn path(&self) -> &Path {
        match &self.config {
            CopyConfig::Syslog { socket, .. } | CopyConfig::Journald { socket } => socket,
        }
    }
}

/// Every configured copy of one log.
pub(crate) struct Copies {
    sinks: Vec<Sink>,
    host: String,
    pid: u32,
}

impl std::fmt::Debug for Copies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.sinks.iter().map(|s| (s.name(), s.path())))
            .finish()
    }
}

impl Copies {
    /// Unconnected datagram sockets, one per copy: each line is addressed to the collector's
    /// path, so a collector that restarts (and binds its socket anew) is reached again.
    pub(crate) fn new(configs: &[CopyConfig]) -> std::io::Result<Copies> {
        let mut sinks = Vec::with_capacity(configs.len());
        for config in configs {
            let socket = UnixDatagram::unbound()?;
            socket.set_write_timeout(Some(SEND_TIMEOUT))?;
            sinks.push(Sink {
                config: config.clone(),
                socket,
                lost: None,
            });
        }
        Ok(Copies {
            sinks,
            host: hostname(),
            pid: std::process::id(),
        })
    }

    /// Whether there are no copies at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.sinks.is_empty()
    }

    /// Whether every copy works (none is down).
    pub(crate) fn all_up(&self) -> bool {
        self.sinks.iter().all(|s| s.lost.is_none())
    }

    /// Sends `line` (as written, without its newline; `fields` are its members) to every
    /// copy. Returns the changes of state to record.
    pub(crate) fn send(&mut self, line: &[u8], fields: &BTreeMap<&str, Value>) -> Vec<Notice> {
        let mut notices = Vec::new();
        for sink in &mut self.sinks {
            let datagram = match &sink.config {
                CopyConfig::Syslog { facility, .. } => {
                    syslog_message(*facility, &self.host, self.pid, fields, line)
                }
                CopyConfig::Journald { .. } => journal_message(fields, line),
            };
            let down = sink.lost.is_some();
            // A copy that is down is tried without waiting: a collector that is gone must not
            // cost every request a second.
            let sent = sink
                .socket
                .set_nonblocking(down)
                .and_then(|()| match &sink.config {
                    CopyConfig::Syslog { socket, .. } => sink.socket.send_to(&datagram, socket),
                    CopyConfig::Journald { socket } => {
                        send_journal(&sink.socket, socket, &datagram)
                    }
                });
            match (sent, sink.lost) {
                (Ok(_), None) => {}
                (Ok(_), Some(lost)) => {
                    sink.lost = None;
                    notices.push(Notice::Resumed {
                        to: sink.name(),
                        socket: sink.path().to_owned(),
                        lost,
                    });
                }
                (Err(e), None) => {
                    tracing::warn!(to = sink.name(), socket = %sink.path().display(), error = %e, "audit copy lost; recording the gap in the log");
                    sink.lost = Some(1);
                    notices.push(Notice::Lost {
                        to: sink.name(),
                        socket: sink.path().to_owned(),
                        error: e.to_string(),
                    });
                }
                (Err(_), Some(lost)) => sink.lost = Some(lost + 1),
            }
        }
        notices
    }
}

/// The line's type, for syslog's MSGID: the method, or the event of a broker's own line.
fn kind<'a>(fields: &'a BTreeMap<&str, Value>) -> Option<&'a str> {
    fields
        .get("method")
        .or_else(|| fields.get("event"))
        .and_then(Value::as_str)
}

/// RFC 5424 severity: refusals are notices, a lost copy a warning, the rest informational.
fn severity(fields: &BTreeMap<&str, Value>) -> u8 {
    match (
        fields.get("outcome").and_then(Value::as_str),
        fields.get("event").and_then(Value::as_str),
    ) {
        (Some(o), _) if o != "ok" => 5,
        (_, Some("copy-lost")) => 4,
        _ => 6,
    }
}

/// `<PRI>1 TIMESTAMP HOSTNAME fsbroker PROCID MSGID - MSG`, MSG being the line itself (so the
/// copy can be checked against the file byte for byte). No structured data: fsbroker has no
/// enterprise number to name an SD-ID with, and the line already carries every member.
///
/// A line longer than [`SYSLOG_MAX`] would be cut by the collector; it is sent instead as a
/// shorter JSON object that keeps the chain (`prev`, `hash`), the line's numbers and short
/// strings, the first 512 bytes of each long string, and names what it cut or left out
/// (`elided`) and the line's length (`lineBytes`).
pub(crate) fn syslog_message(
    facility: u8,
    host: &str,
    pid: u32,
    fields: &BTreeMap<&str, Value>,
    line: &[u8],
) -> Vec<u8> {
    let ts = fields.get("ts").and_then(Value::as_str).unwrap_or("-");
    let msgid = kind(fields)
        .filter(|k| !k.is_empty() && k.len() <= 32 && k.bytes().all(|b| (33..=126).contains(&b)))
        .unwrap_or("-");
    let mut out = format!(
        "<{}>1 {ts} {host} fsbroker {pid} {msgid} - ",
        u16::from(facility) * 8 + u16::from(severity(fields))
    )
    .into_bytes();
    if out.len() + line.len() <= SYSLOG_MAX {
        out.extend_from_slice(line);
        return out;
    }
    let mut short: BTreeMap<&str, Value> = BTreeMap::new();
    let mut elided: Vec<Value> = Vec::new();
    for (k, v) in fields {
        match v {
            // The start of a long string still shows what it was (a probe's target).
            Value::String(s) if s.len() > SYSLOG_KEEP => {
                short.insert(k, Value::from(super::cap(s, SYSLOG_KEEP)));
                elided.push(Value::from(*k));
            }
            Value::Array(_) | Value::Object(_) => elided.push(Value::from(*k)),
            _ => {
                short.insert(k, v.clone());
            }
        }
    }
    short.insert("elided", Value::from(elided));
    short.insert("lineBytes", Value::from(line.len()));
    out.extend_from_slice(&super::chain::canonical(&short));
    out
}

/// The journal's native protocol: `NAME=value\n` fields, or `NAME\n`, a 64-bit little-endian
/// length, the value and `\n` for a value that holds a newline. `MESSAGE` is the line; every
/// member is also a field of its own, `FSBROKER_` and its name in upper snake case
/// (`durationMs` → `FSBROKER_DURATION_MS`), an array's items one field each.
pub(crate) fn journal_message(fields: &BTreeMap<&str, Value>, line: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(line.len() * 2 + 256);
    put_field(&mut out, "MESSAGE", line);
    put_field(
        &mut out,
        "PRIORITY",
        severity(fields).to_string().as_bytes(),
    );
    put_field(&mut out, "SYSLOG_IDENTIFIER", b"fsbroker");
    for (k, v) in fields {
        let name = field_name(k);
        match v {
            Value::Array(items) => {
                for item in items {
                    put_value(&mut out, &name, item);
                }
            }
            v => put_value(&mut out, &name, v),
        }
    }
    out
}

fn put_value(out: &mut Vec<u8>, name: &str, v: &Value) {
    match v {
        Value::String(s) => put_field(out, name, s.as_bytes()),
        other => put_field(out, name, other.to_string().as_bytes()),
    }
}

fn put_field(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    if value.contains(&b'\n') {
        out.push(b'\n');
        out.extend_from_slice(&(value.len() as u64).to_le_bytes());
    } else {
        out.push(b'=');
    }
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// `FSBROKER_` and `member` in upper snake case. Journal field names are `[A-Z0-9_]`, so any
/// other byte becomes `_`.
fn field_name(member: &str) -> String {
    let mut name = String::from("FSBROKER_");
    let mut prev_lower = false;
    for c in member.chars() {
        if c.is_ascii_uppercase() && prev_lower {
            name.push('_');
        }
        prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        name.push(if c.is_ascii_alphanumeric() {
            c.to_ascii_uppercase()
        } else {
            '_'
        });
    }
    name
}

/// Sends one journal datagram; one too large for a datagram goes the way journald takes
/// large entries: in a sealed memfd passed along with an empty datagram.
fn send_journal(sock: &UnixDatagram, to: &Path, datagram: &[u8]) -> std::io::Result<usize> {
    match sock.send_to(datagram, to) {
        Err(e)
            if e.raw_os_error() == Some(libc::EMSGSIZE)
                || e.raw_os_error() == Some(libc::ENOBUFS) =>
        {
            send_memfd(sock, to, datagram)
        }
        other => other,
    }
}

fn send_memfd(sock: &UnixDatagram, to: &Path, datagram: &[u8]) -> std::io::Result<usize> {
    use rustix::fs::{MemfdFlags, SealFlags};
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix};
    let fd = rustix::fs::memfd_create(
        "fsbroker-audit",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    let mut file = std::fs::File::from(fd);
    file.write_all(datagram)?;
    // journald accepts only a memfd nobody can change any more.
    rustix::fs::fcntl_add_seals(
        &file,
        SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE | SealFlags::SEAL,
    )?;
    let fds = [file.as_fd()];
    let msg = SendAncillaryMessage::ScmRights(&fds);
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    control.push(msg);
    let addr = SocketAddrUnix::new(to)?;
    rustix::net::sendmsg_addr(
        sock,
        &addr,
        &[IoSlice::new(&[])],
        &mut control,
        SendFlags::empty(),
    )?;
    Ok(datagram.len())
}

/// The host's name for syslog's HOSTNAME: printable ASCII without spaces, at most 255 bytes,
/// or `-`.
fn hostname() -> String {
    let uname = rustix::system::uname();
    let name = uname.nodename().to_string_lossy().into_owned();
    if name.is_empty() || name.len() > 255 || !name.bytes().all(|b| (33..=126).contains(&b)) {
        "-".to_owned()
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> BTreeMap<&'static str, Value> {
        let mut f = BTreeMap::new();
        f.insert("ts", Value::from("2026-11-23T08:00:00.000Z"));
        f.insert("method", Value::from("files/read"));
        f.insert("path", Value::from("p/a\nb"));
        f.insert("durationMs", Value::from(1.5));
        f.insert("outcome", Value::from("ok"));
        f
    }

    #[test]
    fn syslog_header_is_rfc5424() {
        let m = syslog_message(10, "host", 42, &fields(), b"{\"x\":1}");
        assert_eq!(
            m,
            b"<86>1 2026-11-23T08:00:00.000Z host fsbroker 42 files/read - {\"x\":1}"
        );
    }

    #[test]
    fn a_long_line_keeps_its_chain_in_syslog() {
        let mut f = fields();
        f.insert("path", Value::from("x".repeat(SYSLOG_MAX)));
        f.insert("hash", Value::from("h".repeat(64)));
        let line = super::super::chain::canonical(&f);
        let m = syslog_message(10, "host", 42, &f, &line);
        assert!(m.len() <= SYSLOG_MAX, "{}", m.len());
        let text = String::from_utf8(m).unwrap();
        assert!(text.contains(&"h".repeat(64)), "{text}");
        assert!(text.contains("\"elided\":[\"path\"]"), "{text}");
        assert!(
            text.contains(&format!("\"path\":\"{}\"", "x".repeat(512))),
            "{text}"
        );
    }

    #[test]
    fn journal_fields_use_the_binary_form_for_newlines() {
        let m = journal_message(&fields(), b"{}");
        let mut want = b"FSBROKER_PATH\n".to_vec();
        want.extend_from_slice(&5u64.to_le_bytes());
        want.extend_from_slice(b"p/a\nb\n");
        assert!(m.windows(want.len()).any(|w| w == want.as_slice()));
        let text = String::from_utf8_lossy(&m);
        assert!(text.contains("MESSAGE={}\n"), "{text}");
        assert!(text.contains("FSBROKER_DURATION_MS=1.5\n"), "{text}");
        assert!(text.contains("PRIORITY=6\n"), "{text}");
    }

    /// An entry too large for one datagram is passed in a sealed memfd with an empty
    /// datagram, as journald takes it.
    #[test]
    fn a_large_journal_entry_goes_in_a_sealed_memfd() {
        use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
        use std::io::{Read, Seek};
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("journal.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        let big = vec![b'x'; 1 << 20];
        let entry = journal_message(&fields(), &big);
        assert_eq!(send_journal(&sender, &path, &entry).unwrap(), entry.len());
        let mut buf = [0u8; 16];
        let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let msg = rustix::net::recvmsg(
            &listener,
            &mut [std::io::IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::empty(),
        )
        .unwrap();
        assert_eq!(msg.bytes, 0);
        let mut got = None;
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(mut fds) = m {
                got = fds.next();
            }
        }
        let fd = got.expect("a descriptor came with the datagram");
        let seals = rustix::fs::fcntl_get_seals(&fd).unwrap();
        assert!(seals.contains(rustix::fs::SealFlags::WRITE | rustix::fs::SealFlags::SEAL));
        let mut file = std::fs::File::from(fd);
        file.rewind().unwrap();
        let mut read = Vec::new();
        file.read_to_end(&mut read).unwrap();
        assert!(read == entry, "the memfd holds the entry");
    }

    #[test]
    fn field_names_are_upper_snake() {
        assert_eq!(field_name("durationMs"), "FSBROKER_DURATION_MS");
        assert_eq!(field_name("newPathSha256"), "FSBROKER_NEW_PATH_SHA256");
        assert_eq!(field_name("firstSession"), "FSBROKER_FIRST_SESSION");
        assert_eq!(field_name("prev"), "FSBROKER_PREV");
    }
}
