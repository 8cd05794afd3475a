//! Opening the console in the person's browser, without showing its token to other users.

// Ambient `std::fs` calls are allowed here (clippy.toml): the opener page is the broker's own
// file, beside the URL file.
#![allow(clippy::disallowed_methods)]

use std::path::Path;

/// Whether there is a desktop to open a browser on.
pub(crate) fn has_display() -> bool {
    std::env::var_os("DISPLAY").is_some() || std::env::var_os("WAYLAND_DISPLAY").is_some()
}

/// Opens `url` with `xdg-open` through a page beside the URL file that sends the browser on:
/// a URL given on a command line can be read by every user of the machine (`ps`), and this
/// one carries the token. The page stays there, as private as the URL file itself.
pub(crate) fn open_in_browser(url: &str, url_file: &Path) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = url_file.parent().unwrap_or(Path::new("."));
    let page = dir.join("console-open.html");
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
