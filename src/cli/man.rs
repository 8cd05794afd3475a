//! `fsbroker generate-man DIR`: the man pages of the Debian package (dist/debian/build).
//!
//! They are rendered by clap_mangen from the very `Cli` definition that parses the command
//! line and prints `--help`, so a flag added or reworded there is in the next package's
//! pages too; nobody writes or updates a page by hand.

use std::path::Path;
use std::process::ExitCode;

/// Writes `fsbroker.1` and one page per visible subcommand, nested ones included
/// (`fsbroker-policy-check.1`), into `dir`, an existing directory. Hidden subcommands (this
/// one) and clap's `help` get none, as `clap_mangen::generate_to` does; that function is not
/// used because it would put the subcommand's name and `--version`'s whole line (with the MCP
/// revisions) in every page's footer, where `man` has room for "fsbroker 0.1.0" only.
pub(super) fn generate(cli: clap::Command, dir: &Path) -> ExitCode {
    let mut cli = cli.disable_help_subcommand(true);
    // Built once from the top, so that each subcommand knows its full name
    // ("fsbroker policy check") for its synopsis and its page's name.
    cli.build();
    match write_pages(&cli, dir) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fsbroker: cannot write man pages to {}: {e}", dir.display());
            ExitCode::FAILURE
        }
    }
}

/// Writes `cmd`'s page and its visible subcommands', depth first.
fn write_pages(cmd: &clap::Command, dir: &Path) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir)?;
    }
    let man = clap_mangen::Man::new(cmd.clone())
        .source(concat!("fsbroker ", env!("CARGO_PKG_VERSION")))
        .manual("fsbroker manual");
    let mut page = Vec::new();
    man.render(&mut page)?;
    // The packager's output directory, named on its command line: never a request's path.
    #[allow(clippy::disallowed_methods)]
    std::fs::write(dir.join(man.get_filename()), page)
}
