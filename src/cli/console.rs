//! `fsbroker console`: opens the running broker's console, or prints its URL.

use std::path::PathBuf;
use std::process::ExitCode;

/// Runs `fsbroker console`.
pub(super) fn open(url_file: Option<PathBuf>, print: bool) -> ExitCode {
    let file = match url_file {
        Some(f) => f,
        None => match fsbroker::console_url_file() {
            Ok(f) => f,
            Err(e) => {
                eprintln!("fsbroker: cannot find the private runtime directory: {e}");
                return ExitCode::FAILURE;
            }
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
