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
    let line = words.join(" ");
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
