//! A server that does not start is never silent to the host.
//!
//! A host that gets no answer to its `initialize` shows the person only "failed to connect",
//! while the reason sits in a log nobody reads. So the host's `initialize` gets an error of
//! the proxy's, with the reason, when the server exits before answering it ([`Start::exited`]),
//! when a confined server does not answer it within the start timeout ([`Start::watch`]: it
//! is then ended), and when the server cannot be started at all ([`answer_refused_start`]).
//! For a confined server the error carries the diagnosis (`diagnosis.rs`), which stderr gets
//! too.

use std::io::{BufRead, Read, Write};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::diagnosis::{Context, diagnosis};
use super::lines::Init;
use super::stderr::Tail;
use crate::error::{Error, ErrorKind};
use crate::jsonrpc::{self, Incoming};
use crate::limits::{REFUSED_START_INPUT, REFUSED_START_WAIT, STDERR_SETTLE};
use crate::outgoing::Outgoing;

/// What the proxy knows of its server's start.
pub(super) struct Start {
    pub(super) init: Arc<Init>,
    /// A confined server's: the end of its stderr and the confinement's facts.
    confined: Option<Confined>,
}

struct Confined {
    tail: Arc<Tail>,
    launch: Vec<String>,
    net: bool,
    command: String,
}

impl Start {
    /// The start of an unconfined server (its stderr is the proxy's own, already shown).
    pub(super) fn unconfined(init: Arc<Init>) -> Start {
        Start {
            init,
            confined: None,
        }
    }

    /// The start of a server confined by `confine`, whose stderr is copied into `tail`.
    pub(super) fn confined(
        init: Arc<Init>,
        tail: Arc<Tail>,
        confine: &crate::confine::Confinement,
    ) -> Start {
        // As the person wrote it (`npx -y PKG`), not as its launcher was resolved.
        let command = confine
            .given_command()
            .iter()
            .map(|a| shell_word(&a.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(" ");
        Start {
            init,
            confined: Some(Confined {
                tail,
                launch: confine.launch_summary(),
                net: confine.plan.net,
                command,
            }),
        }
    }

    /// The diagnosis of a confined server (nothing for an unconfined one).
    fn diagnosis(&self) -> Vec<String> {
        let Some(c) = &self.confined else {
            return Vec::new();
        };
        let cx = Context {
            launch: &c.launch,
            net: c.net,
            command: &c.command,
        };
        diagnosis(&c.tail.lines(), &cx)
    }

    /// The server exited (or closed its stdout and then exited) with `status`: if it had not
    /// answered the host's `initialize`, the host gets the error, and stderr the diagnosis.
    pub(super) async fn exited(
        &self,
        status: std::process::ExitStatus,
        to_host: &mpsc::Sender<Outgoing>,
    ) {
        let Some(id) = self.init.take_pending() else {
            return;
        };
        if let Some(c) = &self.confined {
            // The tree has been ended: the last of its stderr is on its way to the tail.
            c.tail.settled(STDERR_SETTLE).await;
        }
        let headline = format!(
            "fsbroker: the server exited before answering initialize ({})",
            status_text(status)
        );
        self.fail(&id, &headline, to_host).await;
    }

    /// For a confined server, once the host's `initialize` was relayed: if the server has not
    /// answered it within `limit`, the host gets the error, `end` the reason to end the server,
    /// and stderr the diagnosis. A server that answered in time is never touched again.
    pub(super) async fn watch(
        self: Arc<Self>,
        limit: Duration,
        to_host: mpsc::Sender<Outgoing>,
        end: oneshot::Sender<String>,
    ) {
        self.init.wait_relayed().await;
        tokio::time::sleep(limit).await;
        let Some(id) = self.init.fail() else {
            return;
        };
        let headline = format!(
            "fsbroker: the confined server did not answer initialize within {} s",
            limit.as_secs_f64()
        );
        // The server is ended first: nothing here (a host that does not read, a log line
        // that blocks) may keep it running.
        let _ = end.send(headline.clone());
        self.fail(&id, &headline, &to_host).await;
    }

    /// Answers the host's `initialize` `id` with `headline` and the diagnosis; logs both.
    async fn fail(
        &self,
        id: &serde_json::value::RawValue,
        headline: &str,
        to_host: &mpsc::Sender<Outgoing>,
    ) {
        let diagnosis = self.diagnosis();
        let mut reason = headline.to_owned();
        for line in &diagnosis {
            reason.push('\n');
            reason.push_str(line);
        }
        let err = Error::new(ErrorKind::Internal, reason);
        let _ = to_host
            .send(jsonrpc::error_frame(Some(id), &err).into())
            .await;
        tracing::error!("{headline}");
        for line in &diagnosis {
            tracing::warn!("{line}");
        }
    }
}

/// `word` as a shell reads it back (single-quoted unless plain), on one line: the diagnosis
/// shows the server's command for `fsbroker confine check -- …`.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/-_.,:=@%+".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        return word.to_owned();
    }
    let one_line: String = word
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    format!("'{}'", one_line.replace('\'', r"'\''"))
}

/// `exit code N`, or `killed by signal N`.
fn status_text(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "exit status unknown".to_owned(),
    }
}

/// Answers the host when the server cannot be started at all (a strict refusal, a command
/// that cannot be found, a policy that does not load): the first request on the proxy's
/// stdin within [`REFUSED_START_WAIT`] (a host's `initialize`, or `server/discover`) gets a
/// JSON-RPC error (`-32603`) whose reason is `fsbroker: ` and `reason`. Notifications and
/// lines that are not requests are passed over; the end of the input ends the wait at once.
/// It blocks for the wait; the caller exits after it.
pub fn answer_refused_start(reason: &str) {
    let (tx, rx) = std::sync::mpsc::channel();
    // A read of stdin cannot be given a deadline: it runs on a thread of its own, left
    // blocked when the wait ends (the process exits after).
    let reader = std::thread::Builder::new()
        .name("fsbroker-refused-start".into())
        .spawn(move || {
            let mut input =
                std::io::BufReader::new(std::io::stdin().lock().take(REFUSED_START_INPUT));
            let mut line = Vec::new();
            loop {
                line.clear();
                match input.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if let Incoming::Request { id, .. } = jsonrpc::parse(line.trim_ascii_end()) {
                    let _ = tx.send(id.to_owned());
                    return;
                }
            }
        });
    if reader.is_err() {
        return;
    }
    let Ok(id) = rx.recv_timeout(REFUSED_START_WAIT) else {
        return;
    };
    let err = Error::new(ErrorKind::Internal, format!("fsbroker: {reason}"));
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(&jsonrpc::error_frame(Some(&id), &err));
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    #[test]
    fn commands_are_shown_as_a_shell_reads_them() {
        assert_eq!(super::shell_word("npx"), "npx");
        assert_eq!(
            super::shell_word("@modelcontextprotocol/server-filesystem"),
            "@modelcontextprotocol/server-filesystem"
        );
        assert_eq!(super::shell_word(""), "''");
        assert_eq!(super::shell_word("it's a\nscript"), r"'it'\''s a script'");
    }
}
