//! The comparison: OpenSSH's `sftp` client talking to `sftp-server` over pipes (`sftp -D`,
//! no ssh, no encryption), on the same file in the same run: `get FILE /dev/null` and
//! `put FILE TARGET` (and `put -f`, which syncs the file like a broker's commit does).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use super::progress::Bars;
use super::report::{self, Throughput};

/// What to say when the tools are missing.
pub(crate) const MISSING: &str =
    "sftp not installed; install openssh-client and openssh-sftp-server";

/// Where Linux distributions put the server.
const SERVERS: &[&str] = &[
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/sftp-server",
    "/usr/lib/sftp-server",
    "/usr/libexec/openssh/sftp-server",
];

/// The client and the server, or why the comparison cannot run.
pub(crate) enum Tool {
    Found(Sftp),
    Missing(String),
}

/// Both programs.
pub(crate) struct Sftp {
    pub client: PathBuf,
    pub server: PathBuf,
}

/// Looks for `sftp` on `PATH` and for an sftp-server binary.
pub(crate) fn find() -> Tool {
    let client = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("sftp"))
            .find(|p| is_executable(p))
    });
    let server = SERVERS.iter().map(PathBuf::from).find(|p| is_executable(p));
    match (client, server) {
        (Some(client), Some(server)) => Tool::Found(Sftp { client, server }),
        (client, _) => Tool::Missing(format!(
            "{MISSING} ({})",
            if client.is_none() {
                "no sftp found on PATH".to_owned()
            } else {
                format!("no sftp-server found in {}", SERVERS.join(", "))
            }
        )),
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `get FILE /dev/null`.
pub(crate) fn get(tool: &Sftp, file: &Path, size: u64, bars: &Bars) -> Result<Throughput, String> {
    let spinner = bars.spinner("sftp get");
    let elapsed = batch(tool, &format!("get {} /dev/null\n", quote(file)?));
    spinner.finish_and_clear();
    Ok(Throughput::new(size, elapsed?))
}

/// `put FILE TARGET` (`put -f` with `fsync`); checks the size and removes the copy.
pub(crate) fn put(
    tool: &Sftp,
    file: &Path,
    target: &Path,
    size: u64,
    fsync: bool,
    bars: &Bars,
) -> Result<Throughput, String> {
    let spinner = bars.spinner(if fsync { "sftp put -f" } else { "sftp put" });
    let flag = if fsync { "-f " } else { "" };
    let elapsed = batch(
        tool,
        &format!("put {flag}{} {}\n", quote(file)?, quote(target)?),
    );
    spinner.finish_and_clear();
    let elapsed = elapsed?;
    let landed = std::fs::metadata(target)
        .map_err(|e| format!("sftp put left no {}: {e}", target.display()))?
        .len();
    std::fs::remove_file(target).map_err(|e| format!("cannot remove {}: {e}", target.display()))?;
    if landed != size {
        return Err(format!("sftp put wrote {landed} bytes of {size}"));
    }
    Ok(Throughput::new(size, elapsed))
}

/// Runs `sftp -q -D SERVER -b -` with `commands` on its stdin; the time it took.
fn batch(tool: &Sftp, commands: &str) -> Result<std::time::Duration, String> {
    let started = Instant::now();
    let mut child = Command::new(&tool.client)
        .arg("-q")
        .arg("-D")
        .arg(&tool.server)
        .args(["-b", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", tool.client.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(commands.as_bytes())
            .map_err(|e| format!("cannot give sftp its commands: {e}"))?;
    }
    let mut errors = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut errors);
    }
    let status = child
        .wait()
        .map_err(|e| format!("cannot wait for sftp: {e}"))?;
    let elapsed = started.elapsed();
    if !status.success() {
        return Err(format!(
            "sftp failed ({status}) on {:?}: {}",
            commands.trim(),
            errors.trim()
        ));
    }
    Ok(elapsed)
}

/// A path as one sftp batch argument: quoted, with quotes, backslashes and glob characters
/// escaped.
fn quote(path: &Path) -> Result<String, String> {
    let text = path
        .to_str()
        .ok_or_else(|| format!("{} is not UTF-8", path.display()))?;
    let mut out = String::from("\"");
    for c in text.chars() {
        if matches!(c, '"' | '\\' | '*' | '?' | '[' | ']') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    Ok(out)
}

/// What the report says of the sftp tools found (or why there are none).
pub(crate) fn report(tool: &Tool) -> report::Sftp {
    match tool {
        Tool::Found(t) => report::Sftp {
            available: true,
            client: Some(t.client.display().to_string()),
            server: Some(t.server.display().to_string()),
            ..report::Sftp::default()
        },
        Tool::Missing(why) => report::Sftp {
            note: Some(why.clone()),
            ..report::Sftp::default()
        },
    }
}
