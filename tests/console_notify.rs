//! Desktop notifications for consent prompts (`src/console/notify.rs`) on a real D-Bus: a
//! private session bus (`dbus-daemon`), a stand-in notification server on it that records
//! what it is asked, and the real binary (`serve --listen … --console`) pointed at that bus.
//!
//! It proves that a waiting prompt raises a notice from `fsbroker` that names the session,
//! carries no markup of the server's (its `<b>` message stays out) and expires with the
//! prompt; that clicking the notice opens the console through `xdg-open` on the owner-only
//! opener page, not on the URL with its token; and that answering the prompt on the console
//! takes the notice down.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::console::Console;
use common::fsb::Cmd;
use common::procs::Pids;
use common::{Listener, PolicyToml, RootToml};
use serde_json::json;
use zbus::object_server::SignalEmitter;
use zbus::zvariant::OwnedValue;

/// The longest any one step is waited for: a hang guard, not a pass criterion.
const WAIT: Duration = Duration::from_secs(10);

/// Where the notification service lives on the bus (the specification's names).
const SERVICE: &str = "org.freedesktop.Notifications";
const OBJECT: &str = "/org/freedesktop/Notifications";

/// A private session bus, ended when dropped.
struct Bus {
    child: Child,
    /// The address clients connect to (`unix:path=…,guid=…`).
    address: String,
}

impl Bus {
    /// Starts `dbus-daemon` listening at `dir/bus`; `Err` when it cannot run here.
    fn start(dir: &Path) -> Result<Bus, String> {
        let mut child = Command::new("dbus-daemon")
            .args(["--session", "--nofork", "--print-address=1"])
            .arg(format!("--address=unix:path={}", dir.join("bus").display()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot run dbus-daemon (Debian package dbus): {e}"))?;
        let mut address = String::new();
        let read = child
            .stdout
            .take()
            .map(|out| BufReader::new(out).read_line(&mut address));
        let bus = Bus {
            child,
            address: address.trim().to_owned(),
        };
        match read {
            Some(Ok(n)) if n > 0 && !bus.address.is_empty() => Ok(bus),
            other => Err(format!("dbus-daemon printed no address: {other:?}")),
        }
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One `Notify` call as the stand-in received it.
#[derive(Debug, Clone)]
struct Notice {
    /// The id the stand-in answered with.
    id: u32,
    app_name: String,
    replaces_id: u32,
    summary: String,
    body: String,
    actions: Vec<String>,
    hints: HashMap<String, OwnedValue>,
    expire_timeout: i32,
}

/// Everything the stand-in was asked.
#[derive(Debug, Default)]
struct Record {
    notices: Vec<Notice>,
    closed: Vec<u32>,
}

/// A notification server that only records: what a desktop's would be asked.
struct StandIn {
    record: Arc<Mutex<Record>>,
    next_id: u32,
}

#[zbus::interface(name = "org.freedesktop.Notifications")]
impl StandIn {
    #[allow(clippy::too_many_arguments)] // the specification's signature
    fn notify(
        &mut self,
        app_name: String,
        replaces_id: u32,
        _app_icon: String,
        summary: String,
        body: String,
        actions: Vec<String>,
        hints: HashMap<String, OwnedValue>,
        expire_timeout: i32,
    ) -> u32 {
        self.next_id += 1;
        let notice = Notice {
            id: self.next_id,
            app_name,
            replaces_id,
            summary,
            body,
            actions,
            hints,
            expire_timeout,
        };
        lock(&self.record).notices.push(notice);
        self.next_id
    }

    fn close_notification(&self, id: u32) {
        lock(&self.record).closed.push(id);
    }

    fn get_capabilities(&self) -> Vec<String> {
        ["actions", "body", "body-markup"]
            .map(String::from)
            .to_vec()
    }

    #[zbus(out_args("name", "vendor", "version", "spec_version"))]
    fn get_server_information(&self) -> (String, String, String, String) {
        (
            "stand-in".into(),
            "fsbroker tests".into(),
            "1".into(),
            "1.2".into(),
        )
    }

    /// What a desktop sends when the person clicks a notice.
    #[zbus(signal)]
    async fn action_invoked(
        emitter: &SignalEmitter<'_>,
        id: u32,
        action_key: &str,
    ) -> zbus::Result<()>;
}

fn lock(record: &Mutex<Record>) -> std::sync::MutexGuard<'_, Record> {
    record.lock().unwrap_or_else(|e| e.into_inner())
}

/// Polls `get` until it gives something (at most [`WAIT`]); panics with `what` otherwise.
fn wait_for<T>(what: &str, mut get: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + WAIT;
    loop {
        if let Some(v) = get() {
            return v;
        }
        assert!(Instant::now() < end, "{what}: not within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Rule: a consent prompt waiting on the console raises one desktop notice (app `fsbroker`,
/// a `default` action, the session's number, no server markup, expiring with the prompt);
/// clicking it runs `xdg-open` on the owner-only opener page beside the URL file; answering
/// the prompt closes the notice.
#[test]
fn a_prompt_raises_a_notice_that_opens_the_console_and_goes_when_answered() {
    let (_dir, base) = common::tempdir();
    let bus = match Bus::start(&base) {
        Ok(bus) => bus,
        Err(why) => {
            common::skipped(&why.to_string());
            return;
        }
    };

    // The stand-in owns the service's name before the broker starts.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let record = Arc::new(Mutex::new(Record::default()));
    let stand_in = StandIn {
        record: Arc::clone(&record),
        next_id: 40,
    };
    let server = runtime
        .block_on(async {
            zbus::connection::Builder::address(bus.address.as_str())?
                .name(SERVICE)?
                .serve_at(OBJECT, stand_in)?
                .build()
                .await
        })
        .expect("the stand-in notification server on the private bus");

    // `xdg-open` as the broker finds it first on its PATH: it only notes its arguments.
    let bin = base.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let opened = base.join("xdg-open.log");
    let fake = bin.join("xdg-open");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$@\" >> '{}'\n",
            opened.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    let root = base.join("docs");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    let policy = PolicyToml::new()
        .root(RootToml::at(&root).name("docs").consent("prompt"))
        .table(
            "consent",
            "provider = \"console\"\nterminal = false\ntimeout_ms = 20000\n",
        )
        .write_to(&base.join("policy.toml"));
    std::fs::create_dir(base.join("run")).unwrap();
    let url_file = base.join("run").join("console.url");
    let pids = Pids::default();
    let args: Vec<PathBuf> = [
        "--policy".into(),
        policy.clone(),
        "--console".into(),
        "--console-url-file".into(),
        url_file.clone(),
    ]
    .to_vec();
    let mut broker = Listener::spawn(
        &base.join("s.sock"),
        Cmd::new(&args)
            .env("DBUS_SESSION_BUS_ADDRESS", &bus.address)
            .env("PATH", &path)
            .env("RUST_LOG", "fsbroker=debug")
            .pids(&pids),
    );
    if let Err(status) = broker.wait_listening(Duration::from_secs(15)) {
        panic!("serve --listen exited before listening ({status})");
    }
    let console = Console::from_url_file(&url_file);

    let mut session = broker.connect();
    session.set_deadline(Duration::from_secs(30));
    // Blocks until the person answers; its answer is read at the end.
    let asked = session.send(
        "files/consent",
        json!({"message": "<b>hi</b>", "requestedPaths": [root.join("sub")]}),
    );

    let state = console.wait_state(WAIT, |s| {
        s["prompts"].as_array().is_some_and(|p| !p.is_empty())
    });
    let prompt = &state["prompts"][0];
    let prompt_id = prompt["id"].as_u64().expect("a prompt id");
    let session_id = prompt["session"].as_u64().expect("the prompt's session");

    let notice = wait_for("a Notify call", || lock(&record).notices.first().cloned());
    assert_eq!(notice.app_name, "fsbroker", "{notice:?}");
    assert_eq!(notice.replaces_id, 0, "{notice:?}");
    assert!(!notice.summary.is_empty(), "{notice:?}");
    assert!(
        notice.actions.iter().step_by(2).any(|a| a == "default"),
        "{notice:?}"
    );
    assert!(
        notice.body.contains(&format!("Session {session_id}")),
        "{notice:?}"
    );
    assert!(
        !notice.body.contains("<b>") && !notice.body.contains("hi</"),
        "no server markup, no message: {notice:?}"
    );
    assert!(
        !notice.body.contains(root.to_str().unwrap()),
        "no paths: {notice:?}"
    );
    assert!(notice.expire_timeout > 0, "{notice:?}");
    assert!(
        notice.expire_timeout <= 20_000,
        "expires with the prompt: {notice:?}"
    );
    let urgency = notice.hints.get("urgency").map(|v| u8::try_from(v.clone()));
    assert!(matches!(urgency, Some(Ok(2))), "critical: {notice:?}");

    // The person clicks the notice.
    runtime
        .block_on(async {
            let iface = server
                .object_server()
                .interface::<_, StandIn>(OBJECT)
                .await?;
            StandIn::action_invoked(iface.signal_emitter(), notice.id, "default").await
        })
        .expect("emit ActionInvoked");
    let page = wait_for("xdg-open run by the click", || {
        let log = std::fs::read_to_string(&opened).ok()?;
        log.lines().next().map(PathBuf::from)
    });
    assert!(page.ends_with("console-open.html"), "{page:?}");
    assert!(page.is_file(), "{page:?}");
    let log = std::fs::read_to_string(&opened).unwrap();
    assert!(
        !log.contains(&console.token),
        "the token is never on a command line: {log}"
    );

    // The person answers on the console: the notice goes.
    let answered = console.post(
        &format!("/api/prompts/{prompt_id}"),
        Some(r#"{"deny":true}"#),
    );
    assert_eq!(answered.status / 100, 2, "{answered:?}");
    wait_for("CloseNotification for the answered prompt", || {
        lock(&record).closed.contains(&notice.id).then_some(())
    });
    let reply = session.response(asked);
    assert_eq!(reply["result"]["granted"], json!(false), "{reply}");
    assert_eq!(lock(&record).notices.len(), 1, "one notice per prompt");

    broker.assert_alive();
    drop(broker);
    runtime.block_on(async move { drop(server) });
}
