//! `fsbroker console`: opens the running broker's console, or prints its URL.

// Ambient `std::fs` calls are allowed here (clippy.toml): the URL file is the broker's own.
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;
use std::process::ExitCode;

/// Runs `fsbroker console`.
pub(super) fn open(url_file: Option<PathBuf>, print: bool) -> ExitCode {
    match find(url_file) {
        Err(e) => {
            eprintln!("fsbroker: {e}");
            ExitCode::FAILURE
        }
        Ok((url, file)) => {
            if print || !crate::console::has_display() {
                println!("{url}");
                return ExitCode::SUCCESS;
            }
            match crate::console::open_in_browser(&url, &file) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("fsbroker: cannot open a browser ({e}); open this URL:");
                    println!("{url}");
                    ExitCode::SUCCESS
                }
            }
        }
    }
}

/// The URL in the file, checked to be a console's (loopback, with a token).
fn find(url_file: Option<PathBuf>) -> Result<(String, PathBuf), String> {
    let file = match url_file {
        Some(f) => f,
        None => fsbroker::console_url_file()
            .map_err(|e| format!("cannot find the private runtime directory: {e}"))?,
    };
    let text = std::fs::read_to_string(&file).map_err(|e| {
        format!(
            "no running console found at {} ({e}): start the broker with --console",
            file.display()
        )
    })?;
    let url = text.trim().to_owned();
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
    Ok((url, file))
}
