//! Why a confined server failed to start, read from the end of its stderr: the paths the
//! kernel refused it and the network it could not reach, each with what to change, for the
//! host's error and the proxy's stderr.
//!
//! Everything here is pure: the lines come from [`super::stderr::Tail`] (defanged already)
//! and stay data; every piece of them that is shown is cut to a bound.

/// The most refused paths named.
const MAX_PATHS: usize = 8;
/// The longest path named whole; a longer one is cut.
const MAX_PATH: usize = 256;
/// How many of the server's last stderr lines are shown.
const LAST_LINES: usize = 6;
/// The longest server line shown whole.
const MAX_SHOWN_LINE: usize = 240;

/// What the server's stderr says the sandbox refused it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Findings {
    /// Absolute paths the kernel refused (`EACCES`, `EPERM`, "Permission denied"), in the order
    /// first seen, each once; whether the server was creating or changing something there.
    pub(super) refused: Vec<Refused>,
    /// The first line's marker of a failed network access (`EAI_AGAIN`, `ENOTFOUND`, ...).
    pub(super) network: Option<&'static str>,
}

/// A path the kernel refused the server.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Refused {
    pub(super) path: String,
    /// Refused while creating, renaming or removing (a `write` grant would be needed).
    pub(super) write: bool,
}

/// Words of a refusal by the kernel, as runtimes print them (Node, Python, libc's
/// `strerror`, npm).
const REFUSALS: &[&str] = &[
    "EACCES",
    "EPERM",
    "Permission denied",
    "permission denied",
    "Operation not permitted",
    "operation not permitted",
    "[Errno 13]",
    "[Errno 1]",
];

/// Markers of a network access that failed, as runtimes print them; what they are named as.
const NETWORK: &[(&str, &str)] = &[
    ("EAI_AGAIN", "EAI_AGAIN"),
    ("ENOTFOUND", "ENOTFOUND"),
    ("ECONNREFUSED", "ECONNREFUSED"),
    ("ENETUNREACH", "ENETUNREACH"),
    ("EHOSTUNREACH", "EHOSTUNREACH"),
    ("ENOTCACHED", "ENOTCACHED"),
    ("only-if-cached", "only-if-cached"),
    (
        "Temporary failure in name resolution",
        "Temporary failure in name resolution",
    ),
    ("Name or service not known", "Name or service not known"),
    ("Network is unreachable", "Network is unreachable"),
    ("Connection refused", "Connection refused"),
    ("getaddrinfo", "getaddrinfo"),
    ("connect EACCES", "connect EACCES"),
    ("connect EPERM", "connect EPERM"),
];

/// Words of an operation that creates, renames or removes.
const WRITES: &[&str] = &[
    "mkdir",
    "rename",
    "unlink",
    "rmdir",
    "symlink",
    "cannot create",
    "copyfile",
    "Read-only file system",
    "EROFS",
];

/// Reads the server's last stderr lines for what the sandbox refused it.
pub(super) fn findings(lines: &[String]) -> Findings {
    let mut found = Findings::default();
    // npm names the path of its `code EACCES` on a line of its own: `npm error path /x`.
    let npm_refused = lines.iter().any(|l| {
        npm_field(l, "code").is_some_and(|c| c.starts_with("EACCES") || c.starts_with("EPERM"))
    });
    for line in lines {
        if found.network.is_none() {
            found.network = network(line);
        }
        let write = WRITES.iter().any(|w| line.contains(w));
        let mut add = |path: &str| {
            let path = trim_path(path);
            if path.len() > 1
                && path.starts_with('/')
                && found.refused.len() < MAX_PATHS
                && !found.refused.iter().any(|r| r.path == path)
            {
                found.refused.push(Refused {
                    path: cut(path, MAX_PATH),
                    write,
                });
            }
        };
        if npm_refused {
            if let Some(path) = npm_field(line, "path") {
                add(path);
                continue;
            }
        }
        if !REFUSALS.iter().any(|r| line.contains(r)) {
            continue;
        }
        for path in paths_in(line) {
            add(path);
        }
    }
    found
}

/// The network marker of `line`, if it tells of a network access that failed (a refused
/// `connect`, and any other refusal of a socket, count).
fn network(line: &str) -> Option<&'static str> {
    if let Some((_, name)) = NETWORK.iter().find(|(m, _)| line.contains(m)) {
        return Some(name);
    }
    let socket = line.contains("socket") || line.contains("connect");
    (socket && REFUSALS.iter().any(|r| line.contains(r))).then_some("a refused socket")
}

/// The value of npm's `npm error FIELD VALUE` (or the older `npm ERR! FIELD VALUE`).
fn npm_field<'a>(line: &'a str, field: &str) -> Option<&'a str> {
    let rest = line
        .trim_start()
        .strip_prefix("npm error ")
        .or_else(|| line.trim_start().strip_prefix("npm ERR! "))?;
    rest.strip_prefix(field)?
        .strip_prefix(' ')
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// The absolute paths `line` names: quoted ones (`'/x'`, `"/x"`), or else bare words that
/// start with `/` (`cat: /x: Permission denied`).
fn paths_in(line: &str) -> Vec<&str> {
    let mut quoted = Vec::new();
    for quote in ['\'', '"'] {
        let mut parts = line.split(quote);
        parts.next();
        // Every other piece is inside quotes.
        while let Some(inside) = parts.next() {
            if inside.starts_with('/') {
                quoted.push(inside);
            }
            parts.next();
        }
    }
    if !quoted.is_empty() {
        return quoted;
    }
    line.split_whitespace()
        .filter(|w| w.starts_with('/'))
        .collect()
}

/// A path without the punctuation around it in a message (`/x:`, `(/x)`, `/x,`).
fn trim_path(path: &str) -> &str {
    path.trim_end_matches([':', ',', ';', ')', ']', '.', '\'', '"'])
}

/// `text` cut to at most `max` bytes (on a character boundary), marked when cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// What the proxy knows of the confinement, for the diagnosis.
pub(super) struct Context<'a> {
    /// `Confinement::launch_summary`: the launcher detected and what it was granted.
    pub(super) launch: &'a [String],
    /// Whether the policy allows the network (`[confine] net`).
    pub(super) net: bool,
    /// The server's command line, as the user would type it after `--`.
    pub(super) command: &'a str,
}

/// The diagnosis: one item a line, plain, for stderr and the host's error. `tail` is the end
/// of the server's stderr.
pub(super) fn diagnosis(tail: &[String], cx: &Context<'_>) -> Vec<String> {
    let found = findings(tail);
    let mut out: Vec<String> = cx.launch.to_vec();
    let check = format!(
        "`fsbroker confine check -- {}` (with the proxy's --policy or --root) shows every rule",
        cut(cx.command, MAX_PATH)
    );
    for r in &found.refused {
        let (key, what) = if r.write {
            ("write", "a change in")
        } else {
            ("read", "access to")
        };
        let quoted = serde_json::to_string(&r.path).unwrap_or_default();
        out.push(format!(
            "the sandbox refused the server {what} {}: if the server really needs it, add `[confine] {key} = [{quoted}]` to the policy (that path, never a whole settings directory of the home); {check}",
            r.path
        ));
    }
    match (found.network, cx.net) {
        (Some(marker), false) => out.push(format!(
            "the server tried the network ({marker}): a server gets no network under --confine; install what it downloads first, or allow it with `[confine] net = true` in the policy"
        )),
        (Some(marker), true) => out.push(format!(
            "the server could not reach the network ({marker}); `[confine] net = true` allows it, so the failure is not the sandbox's"
        )),
        (None, _) => {}
    }
    if found.refused.is_empty() && found.network.is_none() {
        out.push(format!(
            "nothing in the server's stderr names a refusal of the sandbox; {check}"
        ));
    }
    let last: Vec<&String> = tail.iter().filter(|l| !l.trim().is_empty()).collect();
    let last = &last[last.len().saturating_sub(LAST_LINES)..];
    if last.is_empty() {
        out.push("the server wrote nothing to stderr".to_owned());
    } else {
        out.push("the server's last stderr lines:".to_owned());
        out.extend(
            last.iter()
                .map(|l| format!("  {}", cut(l.trim_end(), MAX_SHOWN_LINE))),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    fn paths(f: &Findings) -> Vec<&str> {
        f.refused.iter().map(|r| r.path.as_str()).collect()
    }

    #[test]
    fn refused_paths_and_the_network_are_read_from_each_runtime() {
        let node = findings(&lines(
            "node:internal/fs/utils:351\n\
             Error: EACCES: permission denied, open '/root/.npmrc'\n\
             \x20   at Object.openSync (node:fs:596:3) {\n\
             \x20 errno: -13,\n\
             \x20 code: 'EACCES',\n\
             \x20 syscall: 'open',\n\
             \x20 path: '/root/.npmrc'\n\
             }\n\
             Error: EPERM: operation not permitted, mkdir '/home/ana/.cache/x'\n\
             npm error code EAI_AGAIN\n\
             npm error request to https://registry.npmjs.org/x failed, reason: getaddrinfo EAI_AGAIN registry.npmjs.org",
        ));
        assert_eq!(paths(&node), ["/root/.npmrc", "/home/ana/.cache/x"]);
        assert!(!node.refused[0].write);
        assert!(node.refused[1].write, "mkdir needs write");
        assert_eq!(node.network, Some("EAI_AGAIN"));

        let python = findings(&lines(
            "Traceback (most recent call last):\n\
             \x20 File \"/srv/server.py\", line 3, in <module>\n\
             PermissionError: [Errno 13] Permission denied: '/etc/secret.conf'\n\
             socket.gaierror: [Errno -3] Temporary failure in name resolution",
        ));
        assert_eq!(paths(&python), ["/etc/secret.conf"]);
        assert_eq!(python.network, Some("Temporary failure in name resolution"));

        let shell = findings(&lines(
            "sh: 1: cannot open /opt/tool/config: Permission denied\n\
             cat: /var/lib/x: Permission denied\n\
             mkdir: cannot create directory '/data/new': Permission denied",
        ));
        assert_eq!(
            paths(&shell),
            ["/opt/tool/config", "/var/lib/x", "/data/new"]
        );
        assert!(shell.refused[2].write);
        assert_eq!(shell.network, None);

        // npm's own lines: the path of its `code EACCES`, and its offline cache refusal.
        let npm = findings(&lines(
            "npm error code EACCES\n\
             npm error syscall open\n\
             npm error path /root/.npm/_cacache/index-v5/aa\n\
             npm error errno -13",
        ));
        assert_eq!(paths(&npm), ["/root/.npm/_cacache/index-v5/aa"]);
        let offline = findings(&lines(
            "npm error code ENOTCACHED\n\
             npm error request to https://registry.npmjs.org/x failed: cache mode is 'only-if-cached' but no cached response is available.",
        ));
        assert_eq!(offline.network, Some("ENOTCACHED"));
        assert!(offline.refused.is_empty(), "{offline:?}");

        // A refused socket is the network, not a path.
        let socket = findings(&lines("Error: connect EACCES 93.184.216.34:443"));
        assert_eq!(socket.network, Some("connect EACCES"));
        assert!(socket.refused.is_empty());
        let py_socket = findings(&lines(
            "    s = socket.socket(socket.AF_INET)\nPermissionError: [Errno 13] Permission denied (socket)",
        ));
        assert_eq!(py_socket.network, Some("a refused socket"));

        // Nothing refused: nothing found; a relative path or a lone `/` is no path.
        assert_eq!(
            findings(&lines(
                "listening on stdio\nError: EACCES: permission denied, open 'rel/x'\nEPERM /"
            )),
            Findings::default()
        );
    }

    #[test]
    fn paths_are_named_once_and_bounded() {
        let mut text = String::new();
        for i in 0..40 {
            text.push_str(&format!(
                "Error: EACCES: permission denied, open '/p/{i}'\n"
            ));
            text.push_str("Error: EACCES: permission denied, open '/p/0'\n");
        }
        text.push_str(&format!(
            "Error: EACCES: permission denied, open '/{}'\n",
            "y".repeat(4000)
        ));
        let f = findings(&lines(&text));
        assert_eq!(f.refused.len(), MAX_PATHS);
        assert_eq!(f.refused[0].path, "/p/0");
        assert_eq!(f.refused[1].path, "/p/1");
        let long = findings(&lines(&format!(
            "Error: EACCES: permission denied, open '/{}'",
            "é".repeat(400)
        )));
        assert!(long.refused[0].path.len() <= MAX_PATH + "…".len());
    }

    #[test]
    fn the_diagnosis_says_what_to_change() {
        let tail = lines(
            "Error: EACCES: permission denied, open '/root/.npmrc'\n\
             npm error code EAI_AGAIN\n\
             npm error A complete log of this run can be found in: /tmp/x.log",
        );
        let launch = vec!["launcher: npx (node), its cache granted".to_owned()];
        let cx = Context {
            launch: &launch,
            net: false,
            command: "npx -y @modelcontextprotocol/server-filesystem",
        };
        let d = diagnosis(&tail, &cx);
        assert_eq!(d[0], launch[0]);
        assert!(
            d[1].contains("[confine] read = [\"/root/.npmrc\"]")
                && d[1].contains(
                    "fsbroker confine check -- npx -y @modelcontextprotocol/server-filesystem"
                ),
            "{d:?}"
        );
        assert!(
            d[2].contains("EAI_AGAIN") && d[2].contains("[confine] net = true"),
            "{d:?}"
        );
        assert_eq!(d[3], "the server's last stderr lines:");
        assert_eq!(d.len(), 4 + 3, "{d:?}");

        // With the network allowed, the sandbox is not blamed; with nothing found, say so.
        let d = diagnosis(
            &lines("getaddrinfo ENOTFOUND example.invalid"),
            &Context {
                launch: &[],
                net: true,
                command: "srv",
            },
        );
        assert!(d[0].contains("not the sandbox's"), "{d:?}");
        let d = diagnosis(
            &[],
            &Context {
                launch: &[],
                net: false,
                command: "srv",
            },
        );
        assert!(d[0].starts_with("nothing in the server's stderr"), "{d:?}");
        assert_eq!(d[1], "the server wrote nothing to stderr");

        // Only the last lines are shown, each cut.
        let many: Vec<String> = (0..20)
            .map(|i| format!("{i} {}", "z".repeat(500)))
            .collect();
        let d = diagnosis(
            &many,
            &Context {
                launch: &[],
                net: false,
                command: "srv",
            },
        );
        let shown: Vec<&String> = d.iter().filter(|l| l.starts_with("  ")).collect();
        assert_eq!(shown.len(), LAST_LINES);
        assert!(shown[0].starts_with("  14 "));
        assert!(
            shown
                .iter()
                .all(|l| l.len() <= MAX_SHOWN_LINE + 2 + "…".len())
        );
    }
}
