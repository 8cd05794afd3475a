//! `fsbroker console`: opens a running broker's console, or prints its URL; lists them when
//! several run.

use std::path::PathBuf;
use std::process::ExitCode;

/// Runs `fsbroker console`.
pub(super) fn open(url_file: Option<PathBuf>, pid: Option<u32>, print: bool) -> ExitCode {
    let file = match url_file {
        Some(f) => f,
        None => match choose(pid) {
            Ok(f) => f,
            Err(code) => return code,
        },
    };
    let url = match crate::console::read_url_file(&file) {
        Ok((url, _)) => url,
        Err(e) => {
            eprintln!("fsbroker: {e}");
            return ExitCode::FAILURE;
        }
    };
    if print || !crate::console::has_display() {
        println!("{url}");
        return ExitCode::SUCCESS;
    }
    match crate::console::open_in_browser(&file) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fsbroker: cannot open a browser ({e}); open this URL:");
            println!("{url}");
            ExitCode::SUCCESS
        }
    }
}

/// The URL file to open among the running brokers' (the one with `pid`, or the only one);
/// with several and no `pid`, they are listed and the exit code says nothing was opened.
fn choose(pid: Option<u32>) -> Result<PathBuf, ExitCode> {
    let running = match fsbroker::console_url_files() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fsbroker: cannot find the private runtime directory: {e}");
            return Err(ExitCode::FAILURE);
        }
    };
    let dir = fsbroker::console_url_file()
        .ok()
        .and_then(|f| f.parent().map(|d| d.display().to_string()))
        .unwrap_or_default();
    if let Some(pid) = pid {
        return match running.into_iter().find(|(p, _)| *p == pid) {
            Some((_, file)) => Ok(file),
            None => {
                eprintln!(
                    "fsbroker: no broker with process id {pid} has a console (none wrote \
                     console-{pid}.url in {dir}); `fsbroker console` lists the running ones"
                );
                Err(ExitCode::FAILURE)
            }
        };
    }
    match running.len() {
        0 => {
            eprintln!(
                "fsbroker: no running console found in {dir}: start the broker with \
                 --console (a broker given --console-url-file FILE is opened with \
                 `fsbroker console --url-file FILE`)"
            );
            Err(ExitCode::FAILURE)
        }
        1 => Ok(running
            .into_iter()
            .next()
            .map(|(_, f)| f)
            .unwrap_or_default()),
        n => {
            // The list goes to stdout (it is what was asked for); never a URL, whose ticket
            // is for the one console opened.
            println!(
                "{n} brokers have a console running; open one with `fsbroker console --pid PID`:"
            );
            println!("{:>8}  {:<22}  COMMAND", "PID", "ADDRESS");
            for (pid, file) in &running {
                let address = crate::console::read_url_file(file)
                    .ok()
                    .and_then(|(url, _)| url::Url::parse(&url).ok())
                    .map(|u| format!("{}:{}", u.host_str().unwrap_or("?"), u.port().unwrap_or(80)))
                    .unwrap_or_else(|| "?".to_owned());
                println!("{pid:>8}  {address:<22}  {}", command_line(*pid));
            }
            Err(ExitCode::from(2))
        }
    }
}

/// A command line's words with what may be a secret hidden: a header's value (`--header
/// NAME:VALUE`, a token) and a URL's credentials, query and fragment (`?api_key=…`).
fn without_secrets(words: &[String]) -> Vec<String> {
    let header = |value: &str| match value.split_once(':') {
        Some((name, _)) => format!("{name}:…"),
        None => "…".to_owned(),
    };
    let mut out = Vec::with_capacity(words.len());
    let mut after_header = false;
    for word in words {
        let shown = if std::mem::take(&mut after_header) {
            header(word)
        } else if word == "--header" {
            after_header = true;
            word.clone()
        } else if let Some(value) = word.strip_prefix("--header=") {
            format!("--header={}", header(value))
        } else if word.contains("://") {
            url_without_secrets(word)
        } else {
            word.clone()
        };
        out.push(shown);
    }
    out
}

/// `text` up to its first `?` or `#` (then `?…`), without `user:password@`.
fn url_without_secrets(text: &str) -> String {
    let (bare, hidden) = match text.split_once(['?', '#']) {
        Some((before, _)) => (before, true),
        None => (text, false),
    };
    let mut shown = match bare.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}{path}")
        }
        None => bare.to_owned(),
    };
    if hidden {
        shown.push_str("?…");
    }
    shown
}

/// A running process's command line, shortened to a line's width, from `/proc` (what a
/// person recognises a broker by: `fsbroker proxy … -- npx -y SERVER`).
fn command_line(pid: u32) -> String {
    const WIDTH: usize = 100;
    #[allow(clippy::disallowed_methods)] // `/proc`, never a request path
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let words: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    let line = without_secrets(&words).join(" ");
    // Control characters (a line break in an argument) would forge another row.
    let line: String = line
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if line.chars().count() > WIDTH {
        let cut: String = line.chars().take(WIDTH - 1).collect();
        format!("{cut}…")
    } else if line.is_empty() {
        "?".to_owned()
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listing_hides_headers_and_url_secrets() {
        let words: Vec<String> = [
            "fsbroker",
            "proxy",
            "--url",
            "https://u:pw@h/mcp?api_key=SECRET",
            "--header",
            "Authorization:Bearer SECRET",
            "--header=X-Key:SECRET",
            "--console",
        ]
        .map(str::to_owned)
        .to_vec();
        let shown = without_secrets(&words).join(" ");
        assert!(
            !shown.contains("SECRET") && !shown.contains("pw"),
            "{shown}"
        );
        assert!(
            shown.contains("https://h/mcp?…") && shown.contains("Authorization:…"),
            "{shown}"
        );
    }
}
