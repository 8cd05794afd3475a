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

/// Opens the console whose URL file is `url_file` with `xdg-open`, through a page in the
/// private runtime directory that sends the browser on: a URL given on a command line can be
/// read by every user of the machine (`ps`), and this one carries a ticket. The page is one
/// of the broker's protected files, and its ticket is spent once the browser used it.
pub(crate) fn open_in_browser(url_file: &Path) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let (url, _) = read_url_file(url_file)?;
    let page = fsbroker::console_opener_file()
        .map_err(|e| format!("cannot find the private runtime directory: {e}"))?;
    let dir = page.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".console-open.{}.tmp", std::process::id()));
    let escaped = url
        .replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;");
    let html = format!(
        "<!doctype html><meta charset=utf-8><meta http-equiv=\"refresh\" content=\"0;url={escaped}\"><title>fsbroker console</title>\n"
    );
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(html.as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, &page));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("{}: {e}", page.display()));
    }
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
