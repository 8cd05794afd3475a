//! The console's desk: consent prompts waiting for a person who answers them on a page (or
//! any host's own window) through [`crate::Broker::prompts`] and
//! [`crate::Broker::answer_prompt`].
//!
//! A prompt waits on the blocking pool thread that asked it, as the other providers do, so
//! the bounds are the same: one prompt per session and [`crate::limits::PROMPTS`] per broker
//! (`turns.rs`), each for at most `[consent] timeout_ms`. Nobody answering is a denial: when
//! the time is up the prompt leaves the desk and the answer is "none".

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, SystemTime};

use super::Request;
use crate::sandbox::Mode;

/// A consent prompt waiting for the person.
///
/// Everything in it but `id`, `session`, the paths' `root` and `mode` and the times comes
/// from the server or is named by it: show it as text, never as markup.
#[derive(Debug, Clone)]
pub struct Prompt {
    /// The prompt's number, to answer it by ([`crate::Broker::answer_prompt`]).
    pub id: u64,
    /// The session that asks ([`crate::SessionInfo`] says what the broker knows of it).
    pub session: u64,
    /// The name the server gave itself (its claim, not something the broker checked).
    pub server: Option<String>,
    /// The explanation: the server's own words, or the broker's when `from_server` is false.
    pub message: String,
    /// Whether `message` is the server's (`files/consent`) rather than the broker's (its offer
    /// of `prompt` roots when a server first asks `roots/list`).
    pub from_server: bool,
    /// The paths asked for, canonical, each inside a `prompt` root.
    pub paths: Vec<PromptPath>,
    /// When it was asked.
    pub asked: SystemTime,
    /// When it is denied if nobody answers.
    pub expires: SystemTime,
}

/// One path a prompt asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptPath {
    /// The canonical absolute path.
    pub path: String,
    /// The name of the root it is in.
    pub root: String,
    /// What the root allows there (a grant never allows more).
    pub mode: Mode,
}

/// The person's answer to a [`Prompt`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptAnswer {
    /// Approve these paths: each one asked for, or a folder beneath one (narrowed). An empty
    /// list approves nothing.
    Approve(Vec<String>),
    /// Approve nothing.
    Deny,
}

/// Why an answer was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AnswerError {
    /// No prompt has this number now: answered already, timed out, or never asked.
    #[error("prompt {id}: no such prompt is waiting (answered, timed out or never asked)")]
    Unknown {
        /// The number given.
        id: u64,
    },
    /// An approved path is neither one asked for nor beneath one: the person can only
    /// narrow what a server asked for, never widen it.
    #[error("prompt {id}: {path:?} was not asked for, and is not beneath a path that was")]
    NotAsked {
        /// The prompt's number.
        id: u64,
        /// The path refused.
        path: String,
    },
}

/// One prompt on the desk, and where its answer goes.
struct Waiting {
    prompt: Prompt,
    reply: mpsc::SyncSender<Vec<String>>,
}

/// The prompts waiting for an answer on a console, shared by the broker's sessions.
#[derive(Default)]
pub(crate) struct Desk {
    waiting: Mutex<Vec<Waiting>>,
    next: AtomicU64,
    /// Consoles open now ([`Desk::open`]): with none, the `auto` provider does not ask here.
    open: Arc<AtomicUsize>,
    /// Told whenever a prompt comes or goes.
    changed: Option<Arc<tokio::sync::watch::Sender<u64>>>,
    /// The sessions whose prompts were withdrawn last, and why: a prompt a session puts on
    /// the desk after that (it had its turn already) is withdrawn at once, not left for
    /// nobody until its timeout. Session numbers are never reused, so the last
    /// [`ENDED_KEPT`] are enough to cover that moment.
    ended: Mutex<VecDeque<(u64, &'static str)>>,
}

/// How many withdrawn sessions the desk remembers ([`Desk::withdraw_session`]).
const ENDED_KEPT: usize = 256;

impl std::fmt::Debug for Desk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Desk")
            .field("waiting", &self.lock().len())
            .field("open", &self.open.load(Ordering::Relaxed))
            .finish()
    }
}

/// Keeps a console counted as open until dropped ([`crate::Broker::open_console`]).
#[derive(Debug)]
pub struct ConsoleOpen(Arc<AtomicUsize>);

impl Drop for ConsoleOpen {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Desk {
    /// A desk that bumps `changed` whenever a prompt comes or goes.
    pub(crate) fn new(changed: Arc<tokio::sync::watch::Sender<u64>>) -> Desk {
        Desk {
            next: AtomicU64::new(1),
            changed: Some(changed),
            ..Desk::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn changed(&self) {
        if let Some(c) = &self.changed {
            c.send_modify(|n| *n += 1);
        }
    }

    /// Counts a console as open while the guard lives.
    pub(crate) fn open(&self) -> ConsoleOpen {
        self.open.fetch_add(1, Ordering::AcqRel);
        ConsoleOpen(Arc::clone(&self.open))
    }

    /// Whether a console is open.
    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire) > 0
    }

    /// The prompts waiting, oldest first.
    pub(crate) fn prompts(&self) -> Vec<Prompt> {
        self.lock().iter().map(|w| w.prompt.clone()).collect()
    }

    /// Puts `req` on the desk and waits up to `timeout` for the person; returns the paths
    /// approved (each asked for or beneath one), or why none were.
    pub(super) fn ask(&self, req: &Request, timeout: Duration) -> Result<Vec<String>, String> {
        if let Some(why) = self.withdrawn(req.session) {
            return Err(why.into());
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = mpsc::sync_channel(1);
        let now = SystemTime::now();
        let prompt = Prompt {
            id,
            session: req.session,
            server: req.server.clone(),
            message: req.message.clone(),
            from_server: req.from_server,
            paths: req.details.clone(),
            asked: now,
            expires: now + timeout,
        };
        {
            let mut waiting = self.lock();
            // Checked again under the lock a withdrawal takes: withdrawn now, or never put.
            if let Some(why) = self.withdrawn(req.session) {
                return Err(why.into());
            }
            waiting.push(Waiting { prompt, reply });
        }
        self.changed();
        let got = answer.recv_timeout(timeout);
        // Answered or not, it leaves the desk now (an answer took it off already).
        let was_there = {
            let mut waiting = self.lock();
            let before = waiting.len();
            waiting.retain(|w| w.prompt.id != id);
            before != waiting.len()
        };
        if was_there {
            self.changed();
        }
        match got {
            Ok(approved) => Ok(approved),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                Err(format!("nobody answered on the console within {timeout:?}"))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(self
                .withdrawn(req.session)
                .unwrap_or("the prompt was withdrawn")
                .into()),
        }
    }

    /// Why `session`'s prompts were withdrawn, if they were.
    fn withdrawn(&self, session: u64) -> Option<&'static str> {
        let ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        ended
            .iter()
            .find(|(s, _)| *s == session)
            .map(|(_, why)| *why)
    }

    /// Withdraws the prompts of `session`, now and from now on, saying `why` (its server
    /// ended, or the host it served left): nobody should answer a question whose answer
    /// nobody will use, and each held one of the broker's few turns.
    pub(crate) fn withdraw_session(&self, session: u64, why: &'static str) {
        let gone = {
            let mut waiting = self.lock();
            {
                let mut ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
                if !ended.iter().any(|(s, _)| *s == session) {
                    if ended.len() >= ENDED_KEPT {
                        ended.pop_front();
                    }
                    ended.push_back((session, why));
                }
            }
            let before = waiting.len();
            // Dropping a prompt's reply end tells its asker at once ("withdrawn").
            waiting.retain(|w| w.prompt.session != session);
            before != waiting.len()
        };
        if gone {
            self.changed();
        }
    }

    /// Takes the person's answer to prompt `id`.
    pub(crate) fn answer(&self, id: u64, answer: PromptAnswer) -> Result<Prompt, AnswerError> {
        let mut waiting = self.lock();
        let at = waiting
            .iter()
            .position(|w| w.prompt.id == id)
            .ok_or(AnswerError::Unknown { id })?;
        let approved = match answer {
            PromptAnswer::Deny => Vec::new(),
            PromptAnswer::Approve(paths) => {
                for path in &paths {
                    let asked = waiting[at]
                        .prompt
                        .paths
                        .iter()
                        .any(|p| within(path, &p.path));
                    if !asked {
                        return Err(AnswerError::NotAsked {
                            id,
                            path: path.clone(),
                        });
                    }
                }
                paths
            }
        };
        let w = waiting.remove(at);
        drop(waiting);
        // The asker waits with a slot for exactly one answer; if it gave up this instant,
        // the answer goes nowhere and the prompt was a denial.
        let _ = w.reply.try_send(approved);
        self.changed();
        Ok(w.prompt)
    }
}

/// Whether `path` is `asked` or a folder beneath it, read as written: absolute, with no
/// `.`, `..` or empty part. (Where it really leads is checked again when it is granted.)
pub(crate) fn within(path: &str, asked: &str) -> bool {
    let plain = path.strip_prefix('/').is_some_and(|rest| {
        rest.split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
    });
    plain && Path::new(path).starts_with(asked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_asked_paths_or_folders_beneath_them() {
        let asked = "/home/p/docs";
        assert!(within("/home/p/docs", asked));
        assert!(within("/home/p/docs/a/b", asked));
        assert!(!within("/home/p/docsx", asked));
        assert!(!within("/home/p", asked));
        assert!(!within("/home/p/docs/../x", asked));
        assert!(!within("/home/p/docs/./a", asked));
        assert!(!within("/home/p/docs//a", asked));
        assert!(!within("/home/p/docs/a/", asked));
        assert!(!within("home/p/docs/a", asked));
    }
}
