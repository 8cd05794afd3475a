//! Opening the console in the person's browser, without showing its token to other users.

// Ambient `std::fs` calls are allowed here (clippy.toml): the opener page is the broker's own
// file, beside the URL file.
#![allow(clippy::disallowed_methods)]

use std::path::Path;

/// Whether there is a desktop to open a browser on.
pub(crate) fn has_display() -> bool {
    std::env::var_os("DISPLAY").is_some() || std::env::var_os("WAYLAND_DISPLAY").is_some()
}

/// The console's URL and token as the broker wrote them to `file`: the first line is the URL
/// to open (its ticket works once: the broker writes the next one there when it is used), the
/// second `token=TOKEN`, for scripts (`Authorization: Bearer`).
pub(crate) fn read_url_file(file: &Path) -> Result<(String, Option<String>), String> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        format!(
            "no running console found at {} ({e}): start the broker with --console",
            file.display()
        )
    })?;
    let mut lines = text.lines();
    let url = lines.next().unwrap_or("").trim().to_owned();
    let token = lines
        .next()
        .and_then(|l| l.trim().strip_prefix("token="))
        .map(str::to_owned);
    let parsed =
        url::Url::parse(&url).map_err(|e| format!("{}: not a URL ({e})", file.display()))?;
    let loopback = match parsed.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    };
    if parsed.scheme() != "http" || !loopback {
        return Err(format!(
            "{}: not a console URL (http on a loopback address)",
            file.display()
        ));
    }
    Ok((url, token))
}

/// Writes `contents` to `path`, readable and writable by its owner only, through a new file
/// renamed into place: a reader sees all of it or none, and whatever someone else made at
/// `path` (a link, another owner's file) is replaced, never written through.
///
/// The new file is `NAME.RANDOM.tmp` beside `path`: a name no one can take first (in a folder
/// others may write to, a guessable one would make every rewrite fail), and one that starts
/// with `path`'s own name, which makes it one of the broker's protected files too
/// (`ProtectedSpec::rewritten`): it holds the same secrets while it exists. Its identity is
/// protected too, from before it holds anything, so a hard link made of it under any name is
/// refused to servers; and the version it replaces is emptied once replaced, so a hard link
/// made of an old version holds nothing.
#[allow(clippy::disallowed_methods)] // the console's own files, never a request path
pub(crate) fn write_owner_only(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("names no file"))?;
    // The version in place now, to empty once it is replaced (not followed if a link; a FIFO
    // there is not waited on).
    let old = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(path)
        .ok()
        .filter(|f| f.metadata().is_ok_and(|m| m.is_file()));
    let mut attempt = 0;
    let (tmp, mut file) = loop {
        let suffix = super::guard::random_hex(8).map_err(std::io::Error::other)?;
        let tmp = dir.join(format!("{}.{suffix}.tmp", name.to_string_lossy()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&tmp)
        {
            Ok(file) => {
                // Known as the broker's own before it holds anything: a hard link made of it
                // later, anywhere, is refused to servers too.
                if let Ok(meta) = file.metadata() {
                    fsbroker::sandbox::protect_written(&meta);
                }
                break (tmp, file);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 8 => {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    };
    let written = file
        .write_all(contents)
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return written;
    }
    if let Some(old) = old {
        let _ = old.set_len(0);
        if let Ok(meta) = old.metadata() {
            fsbroker::sandbox::forget_written(&meta);
        }
    }
    Ok(())
}

/// Opens the console whose URL file is `url_file` with `xdg-open`, through a page in the
/// private runtime directory that sends the browser on: a URL given on a command line can be
/// read by every user of the machine (`ps`), and this one carries a ticket. The page is one
/// of the broker's protected files, and its ticket is spent once the browser used it.
pub(crate) fn open_in_browser(url_file: &Path) -> Result<(), String> {
    let (url, _) = read_url_file(url_file)?;
    let page = fsbroker::console_opener_file()
        .map_err(|e| format!("cannot find the private runtime directory: {e}"))?;
    let escaped = url
        .replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;");
    let html = format!(
        "<!doctype html><meta charset=utf-8><meta http-equiv=\"refresh\" content=\"0;url={escaped}\"><title>fsbroker console</title>\n"
    );
    write_owner_only(&page, html.as_bytes()).map_err(|e| format!("{}: {e}", page.display()))?;
    let status = std::process::Command::new("xdg-open")
        .arg(&page)
        .status()
        .map_err(|e| format!("xdg-open: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("xdg-open failed ({status})"))
    }
}
