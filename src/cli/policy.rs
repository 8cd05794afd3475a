//! `fsbroker policy check` and `policy schema`.

use std::path::PathBuf;
use std::process::ExitCode;

use fsbroker::policy::{Overrides, Policy, PolicyFile};
use fsbroker::sandbox::ConsentMode;

use super::print;

/// Runs `fsbroker policy check`: the policy file loaded, summed up, its warnings named.
pub(super) fn check(file: PathBuf) -> ExitCode {
    match Policy::load(Some(&file), &Overrides::default()) {
        Ok(policy) => {
            let mut text = format!("{}: ok, {} root(s)\n", file.display(), policy.roots().len());
            for r in policy.roots() {
                text += &format!(
                    "  {} = {} ({}, consent {}{})\n",
                    r.name(),
                    r.path().display(),
                    match r.mode() {
                        fsbroker::sandbox::Mode::ReadOnly => "read-only",
                        fsbroker::sandbox::Mode::ReadWrite => "read-write",
                    },
                    match r.consent() {
                        ConsentMode::Auto => "auto",
                        ConsentMode::Prompt => "prompt",
                        ConsentMode::Deny => "deny",
                    },
                    if r.deny().is_empty() {
                        String::new()
                    } else {
                        format!(", deny {}", r.deny().patterns().join(" "))
                    }
                );
            }
            for warning in policy.warnings() {
                eprintln!("fsbroker: warning: {warning}");
            }
            print(&text)
        }
        Err(e) => {
            eprintln!("fsbroker: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `fsbroker policy schema`.
pub(super) fn schema() -> ExitCode {
    print(&format!("{:#}\n", PolicyFile::json_schema()))
}
