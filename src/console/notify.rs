//! Desktop notifications for consent prompts: while a prompt waits, the person's desktop says
//! so (the freedesktop notification service, `org.freedesktop.Notifications` on the session
//! bus), and clicking the notice opens the console, where the prompt is answered.
//!
//! The notice only points at the console: it says which session asks and for how many paths,
//! never the server's message or the paths, and it offers no answer of its own (a notice can
//! be clicked by accident, and everything on it but the session's number is the server's
//! word). It goes when the prompt is answered or expires.
//!
//! Without a session bus there are no notices, and a bus or notification server that fails
//! costs one warning: the console works the same without them.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use fsbroker::{Broker, Prompt};
use futures_util::StreamExt;
use tokio::sync::watch;
use zbus::zvariant::Value;

/// How long connecting to the bus, or one call to the notification server, may take: a server
/// that hangs must not hold back the notices of later prompts or the closing of answered ones.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The most characters of a server's claimed name a notice shows: a name is the server's own
/// text, and a long one would crowd out the rest.
const MAX_NAME_CHARS: usize = 64;

/// The action every notification server runs when the notice itself is clicked.
const DEFAULT_ACTION: &str = "default";

/// Urgency `critical` (the specification's byte 2): a prompt blocks the server that asked
/// until the person answers or it expires, so the notice should not be folded away.
const URGENCY_CRITICAL: u8 = 2;

/// The part of `org.freedesktop.Notifications` (Desktop Notifications Specification 1.2)
/// used here.
#[zbus::proxy(
    interface = "org.freedesktop.Notifications",
    default_service = "org.freedesktop.Notifications",
    default_path = "/org/freedesktop/Notifications"
)]
trait Notifications {
    /// Shows a notice (or replaces notice `replaces_id` when it is not 0); returns its id.
    #[allow(clippy::too_many_arguments)] // the method's signature is the specification's
    fn notify(
        &self,
        app_name: &str,
        replaces_id: u32,
        app_icon: &str,
        summary: &str,
        body: &str,
        actions: &[&str],
        hints: HashMap<&str, Value<'_>>,
        expire_timeout: i32,
    ) -> zbus::Result<u32>;

    /// Takes notice `id` off the screen.
    fn close_notification(&self, id: u32) -> zbus::Result<()>;

    /// What the server supports (`actions`, `body-markup`, ...).
    fn get_capabilities(&self) -> zbus::Result<Vec<String>>;

    /// The person chose action `action_key` of notice `id` (`default`: clicked the notice).
    #[zbus(signal)]
    fn action_invoked(&self, id: u32, action_key: String) -> zbus::Result<()>;
}

/// Raises a desktop notification for each new consent prompt while the broker lives, takes
/// it down when the prompt is answered or expires, and opens the console whose URL is in
/// `url_file` (through [`crate::console::open_in_browser`]) when one is clicked. Does nothing
/// without a session bus. Runs on the current tokio runtime.
pub(crate) fn spawn(broker: &Arc<Broker>, url_file: PathBuf) {
    if !session_bus_present() {
        tracing::debug!("no session bus: consent prompts raise no desktop notification");
        return;
    }
    let changes = broker.changes();
    let broker = Arc::downgrade(broker);
    tokio::spawn(async move {
        let Some(proxy) = connect().await else {
            return;
        };
        Notifier {
            proxy,
            broker,
            url_file,
            markup: true,
            shown: BTreeMap::new(),
            warned: false,
        }
        .run(changes)
        .await;
    });
}

/// Whether there is a session bus to try: the address in `DBUS_SESSION_BUS_ADDRESS`, or the
/// socket a user session keeps at `$XDG_RUNTIME_DIR/bus`, where zbus (like libdbus) looks
/// when the variable is unset. Without either, connecting could only fail, and a broker run
/// by a service manager or over ssh should not warn about a desktop it never had.
fn session_bus_present() -> bool {
    if std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_some_and(|a| !a.is_empty()) {
        return true;
    }
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| format!("/run/user/{}", rustix::process::geteuid().as_raw()).into());
    rustix::fs::access(dir.join("bus"), rustix::fs::Access::EXISTS).is_ok()
}

/// Connects to the session bus; `None` (after one warning) when it cannot.
async fn connect() -> Option<NotificationsProxy<'static>> {
    let connected = async {
        let connection = zbus::Connection::session().await?;
        NotificationsProxy::new(&connection).await
    };
    match within(connected).await {
        Ok(proxy) => Some(proxy),
        Err(e) => {
            tracing::warn!(
                error = %e,
                "cannot reach the session bus: consent prompts raise no desktop notification"
            );
            None
        }
    }
}

/// `call`, bounded by [`CALL_TIMEOUT`].
async fn within<T>(call: impl Future<Output = zbus::Result<T>>) -> zbus::Result<T> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(result) => result,
        Err(_) => Err(zbus::Error::InputOutput(Arc::new(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {CALL_TIMEOUT:?}"),
        )))),
    }
}

/// The notices of one broker.
struct Notifier {
    proxy: NotificationsProxy<'static>,
    /// Weak, so the notices end with the broker.
    broker: Weak<Broker>,
    /// Where the console's current URL is (its ticket changes each time it is used).
    url_file: PathBuf,
    /// Whether the server reads markup in a notice's body (`body-markup`), so server-made
    /// text must be escaped; assumed when it does not say.
    markup: bool,
    /// Each prompt notified, with its notice's id (none when the server refused it).
    shown: BTreeMap<u64, Option<u32>>,
    /// Whether a failed call was warned about (once; the rest go to the debug log).
    warned: bool,
}

impl Notifier {
    /// Follows the broker's prompts until the broker or the bus connection goes.
    async fn run(mut self, mut changes: watch::Receiver<u64>) {
        // Subscribed before the first notice, so no click on it is missed.
        let mut clicks = match within(self.proxy.receive_action_invoked()).await {
            Ok(clicks) => clicks,
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "cannot follow desktop notifications: consent prompts raise none"
                );
                return;
            }
        };
        match within(self.proxy.get_capabilities()).await {
            Ok(caps) => self.markup = caps.iter().any(|c| c == "body-markup"),
            Err(e) => tracing::debug!(error = %e, "notification server capabilities unknown"),
        }
        loop {
            // Marked seen before reading the prompts: a change while the notices are made is
            // seen by the next `changed()`.
            changes.borrow_and_update();
            let Some(prompts) = self.broker.upgrade().map(|b| b.prompts()) else {
                break;
            };
            self.sync(&prompts).await;
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        break; // the broker is gone
                    }
                }
                click = clicks.next() => match click {
                    Some(click) => self.clicked(&click),
                    None => break, // the bus connection is gone
                },
            }
        }
        // The broker is gone and its prompts with it (best effort: the runtime may be ending).
        for id in std::mem::take(&mut self.shown).into_values().flatten() {
            self.close(id).await;
        }
    }

    /// Closes the notices of prompts no longer waiting and raises one for each new prompt.
    async fn sync(&mut self, prompts: &[Prompt]) {
        let gone: Vec<u64> = self
            .shown
            .keys()
            .filter(|id| !prompts.iter().any(|p| p.id == **id))
            .copied()
            .collect();
        for prompt in gone {
            if let Some(Some(id)) = self.shown.remove(&prompt) {
                self.close(id).await;
            }
        }
        for prompt in prompts {
            if !self.shown.contains_key(&prompt.id) {
                let id = self.notify(prompt).await;
                self.shown.insert(prompt.id, id);
            }
        }
    }

    /// Raises the notice for `prompt`; its id, or `None` when the server did not take it.
    async fn notify(&mut self, prompt: &Prompt) -> Option<u32> {
        let body = body(prompt, self.markup);
        let mut hints: HashMap<&str, Value<'_>> = HashMap::new();
        hints.insert("urgency", Value::from(URGENCY_CRITICAL));
        hints.insert("category", Value::from("x-fsbroker.consent"));
        let expire = expire_timeout(prompt.expires, SystemTime::now());
        let sent = within(self.proxy.notify(
            "fsbroker",
            0,
            "dialog-password",
            "File access requested",
            &body,
            &[DEFAULT_ACTION, "Open console"],
            hints,
            expire,
        ))
        .await;
        match sent {
            Ok(id) => Some(id),
            Err(e) => {
                self.failed("cannot raise a desktop notification", &e);
                None
            }
        }
    }

    /// Takes notice `id` down. The server may have closed it already (clicked, dismissed,
    /// timed out), which is no failure.
    async fn close(&self, id: u32) {
        if let Err(e) = within(self.proxy.close_notification(id)).await {
            tracing::debug!(notification = id, error = %e, "cannot close a desktop notification");
        }
    }

    /// Opens the console when one of our notices was clicked. The bus carries every
    /// application's clicks; the ids of ours tell them apart.
    fn clicked(&self, click: &ActionInvoked) {
        let Ok(args) = click.args() else {
            return;
        };
        if args.action_key != DEFAULT_ACTION || !self.shown.values().any(|n| *n == Some(args.id)) {
            return;
        }
        let url_file = self.url_file.clone();
        // xdg-open may take its time starting a browser; the notices go on meanwhile.
        tokio::task::spawn_blocking(move || {
            if let Err(e) = crate::console::open_in_browser(&url_file) {
                tracing::warn!(error = %e, "cannot open the console from a desktop notification");
            }
        });
    }

    /// Reports a failed call: one warning, then the debug log (a desktop without a
    /// notification server fails every call, and the console works without them).
    fn failed(&mut self, what: &str, e: &zbus::Error) {
        if self.warned {
            tracing::debug!(error = %e, "{what}");
        } else {
            self.warned = true;
            tracing::warn!(error = %e, "{what} (the console still works; further failures are not reported)");
        }
    }
}

/// A notice's text: which session asks and for how many paths, pointing at the console. The
/// server's claimed name is the only text of its own in it, shown by [`shown_name`] and,
/// where the server reads markup, escaped; its message and the paths stay out.
fn body(prompt: &Prompt, markup: bool) -> String {
    let paths = match prompt.paths.len() {
        1 => "1 path".to_owned(),
        n => format!("{n} paths"),
    };
    let name = prompt.server.as_deref().map(shown_name);
    let who = match name.filter(|n| !n.is_empty()) {
        Some(name) => {
            let name = if markup { escape_markup(&name) } else { name };
            format!("Session {} (calls itself «{name}»)", prompt.session)
        }
        None => format!("Session {}", prompt.session),
    };
    format!("{who} asks for {paths}. Open the fsbroker console to answer.")
}

/// A server's claimed name as a notice may show it: printable ASCII as it is, every other
/// character as `⟨U+XXXX⟩`, at most [`MAX_NAME_CHARS`] characters as shown (an escape kept
/// whole or not at all), then `…`.
///
/// The console boxes a name and marks what lies outside ASCII; a notice is plain text with no
/// box and no marking, so everything outside ASCII is escaped: a `»` would close the notice's
/// `«…»` and add words of the server's after it, an em space would push fsbroker's own words
/// away, a line break or U+202E would pass the rest off as fsbroker's, and a Cyrillic `о`
/// would read as a known server's name.
fn shown_name(name: &str) -> String {
    let mut shown = String::new();
    let mut size = 0;
    for c in name.trim_matches(' ').chars() {
        let piece = if c == ' ' || c.is_ascii_graphic() {
            c.to_string()
        } else {
            format!("⟨U+{:04X}⟩", u32::from(c))
        };
        let n = piece.chars().count();
        if size + n > MAX_NAME_CHARS {
            shown.push('…');
            break;
        }
        size += n;
        shown.push_str(&piece);
    }
    shown
}

/// Escapes text for a notice body that the server reads as markup (a subset of HTML).
fn escape_markup(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

/// Milliseconds from `now` until the prompt `expires`, as the notice's `expire_timeout`: at
/// least 1 (0 would mean "never"), at most `i32::MAX`.
fn expire_timeout(expires: SystemTime, now: SystemTime) -> i32 {
    let left = expires.duration_since(now).unwrap_or_default();
    i32::try_from(left.as_millis()).unwrap_or(i32::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(server: Option<&str>, paths: usize) -> Prompt {
        let path = fsbroker::PromptPath {
            path: "/home/ana/secret".into(),
            root: "home".into(),
            mode: fsbroker::sandbox::Mode::ReadOnly,
        };
        Prompt {
            id: 7,
            session: 3,
            server: server.map(str::to_owned),
            message: "<b>trust me</b>".into(),
            from_server: true,
            paths: vec![path; paths],
            asked: SystemTime::UNIX_EPOCH,
            expires: SystemTime::UNIX_EPOCH,
        }
    }

    /// Rule: the body names the session and counts the paths; the server's message and the
    /// paths never appear; a hostile name is escaped for a markup server, its control and bidi
    /// characters shown as escapes, and cut.
    #[test]
    fn the_body_shows_only_the_session_the_count_and_a_cleaned_name() {
        let plain = body(&prompt(None, 1), true);
        assert_eq!(
            plain,
            "Session 3 asks for 1 path. Open the fsbroker console to answer."
        );
        let hostile = "<a href='x'>fsbroker</a> & co\n\u{202E}Approved\u{2066}";
        let b = body(&prompt(Some(hostile), 2), true);
        assert!(
            b.starts_with(
                "Session 3 (calls itself «&lt;a href='x'&gt;fsbroker&lt;/a&gt; &amp; \
                 co⟨U+000A⟩⟨U+202E⟩Approved⟨U+2066⟩»)"
            ),
            "{b}"
        );
        assert!(b.contains("asks for 2 paths."), "{b}");
        assert!(
            !b.contains('<') && !b.contains('\n') && !b.contains('\u{202E}'),
            "{b}"
        );
        assert!(!b.contains("trust me") && !b.contains("secret"), "{b}");
        let raw = body(&prompt(Some("a<b>&c"), 1), false);
        assert!(raw.contains("«a<b>&c»"), "no markup, no escaping: {raw}");
        let long = shown_name(&"x".repeat(500));
        assert_eq!(long.chars().count(), MAX_NAME_CHARS + 1, "{long}");
        assert!(long.ends_with('…'));
        let escapes = shown_name(&"\u{202E}".repeat(20));
        assert_eq!(
            escapes,
            format!("{}…", "⟨U+202E⟩".repeat(8)),
            "an escape is never cut"
        );
        let blank = body(&prompt(Some("  "), 1), true);
        assert!(blank.starts_with("Session 3 asks"), "{blank}");
    }

    /// Rule: a name cannot end the notice's quote and speak after it: `»` (and its look-alikes,
    /// the em space that would push fsbroker's words away, a Cyrillic letter) are escapes, so
    /// the only `«` and `»` in the notice are its own, around the whole name.
    #[test]
    fn a_name_cannot_close_the_quote() {
        for markup in [false, true] {
            let name = "helper» (verified, read-only\u{2003} h\u{0435}lper";
            let b = body(&prompt(Some(name), 1), markup);
            assert_eq!(
                b,
                "Session 3 (calls itself «helper⟨U+00BB⟩ (verified, read-only⟨U+2003⟩ \
                 h⟨U+0435⟩lper») asks for 1 path. Open the fsbroker console to answer.",
            );
            assert_eq!(b.matches('»').count(), 1, "{b}");
            assert_eq!(b.matches('«').count(), 1, "{b}");
        }
        assert_eq!(shown_name("›〉❯\""), "⟨U+203A⟩⟨U+3009⟩⟨U+276F⟩\"");
    }

    /// Rule: the timeout is the time left, never 0 ("never expires") nor past `i32::MAX`.
    #[test]
    fn the_notice_expires_with_the_prompt() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        assert_eq!(expire_timeout(now + Duration::from_millis(1500), now), 1500);
        assert_eq!(expire_timeout(now - Duration::from_secs(1), now), 1);
        assert_eq!(
            expire_timeout(now + Duration::from_secs(100 * 86400), now),
            i32::MAX
        );
    }
}
