//! The Debian package (issue 42): `dist/debian/build` run for real, with cargo-deb, on the
//! binary these tests run (the debug one `cargo test` built, which cargo-deb strips: no
//! release build), then read back with `dpkg-deb`, checked by `lintian`, and its binary run.
//!
//! The package is built once, for every test here (about 10 s with `--fast`, then lintian
//! about 15 s). Without cargo-deb, dpkg-deb, lintian, readelf or man the tests say SKIPPED
//! (`.ci/run` installs them: lintian brings the others but cargo-deb).

// Tests work on their own files with `std::fs` (clippy.toml keeps it out of the library's
// request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use common::registry::output_within;

/// A man page for the program and for every subcommand, nested ones included, by the name
/// `man` finds it by. `generate-man` is hidden and has none; neither has clap's `help`.
const MAN_PAGES: [&str; 18] = [
    "fsbroker",
    "fsbroker-serve",
    "fsbroker-proxy",
    "fsbroker-policy",
    "fsbroker-policy-check",
    "fsbroker-policy-schema",
    "fsbroker-policy-explain",
    "fsbroker-audit",
    "fsbroker-audit-verify",
    "fsbroker-audit-head",
    "fsbroker-auth",
    "fsbroker-auth-list",
    "fsbroker-auth-logout",
    "fsbroker-confine",
    "fsbroker-confine-check",
    "fsbroker-completions",
    "fsbroker-console",
    "fsbroker-bench",
];

/// The administrator's managed policy: installed under /etc, hence a conffile.
const CONFFILE: &str = "/etc/fsbroker/managed.toml";

/// Every other file the package must hold (paths as `dpkg-deb -c` lists them, without the
/// leading `.`).
const FILES: [&str; 12] = [
    "/usr/bin/fsbroker",
    "/usr/lib/systemd/user/fsbroker.socket",
    "/usr/lib/systemd/user/fsbroker.service",
    "/usr/share/bash-completion/completions/fsbroker",
    "/usr/share/zsh/vendor-completions/_fsbroker",
    "/usr/share/fish/vendor_completions.d/fsbroker.fish",
    "/usr/share/doc/fsbroker/README.md",
    "/usr/share/doc/fsbroker/policy.md",
    "/usr/share/doc/fsbroker/security.md",
    "/usr/share/doc/fsbroker/copyright",
    "/usr/share/doc/fsbroker/changelog.Debian.gz",
    "/usr/share/lintian/overrides/fsbroker",
];

/// The package, built once, and its files unpacked with `dpkg-deb -x`.
struct Package {
    _dir: tempfile::TempDir,
    deb: PathBuf,
    /// Where `dpkg-deb -x` unpacked it.
    tree: PathBuf,
}

/// The repository's root.
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The package, or `None` (having said SKIPPED) when a tool it needs is missing.
fn package() -> Option<&'static Package> {
    static PACKAGE: OnceLock<Result<Package, String>> = OnceLock::new();
    match PACKAGE.get_or_init(build) {
        Ok(p) => Some(p),
        Err(missing) => {
            common::skipped(missing);
            None
        }
    }
}

/// `cargo`, as the test runner's Cargo (the build script calls the one on `PATH`).
fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Whether `cmd` runs and exits 0.
fn runs(mut cmd: Command) -> bool {
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `cmd` within `limit`; panics with its output unless it exits 0.
fn run_ok(mut cmd: Command, limit: Duration) -> Output {
    let out = output_within(&mut cmd, limit);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Builds the package with `dist/debian/build` from the tests' binary, and unpacks it.
fn build() -> Result<Package, String> {
    let mut deb_version = cargo();
    deb_version.args(["deb", "--version"]);
    if !runs(deb_version) {
        return Err("cargo-deb is not installed (cargo install --locked cargo-deb)".into());
    }
    for (tool, flag, package) in [
        ("dpkg-deb", "--version", "dpkg"),
        ("lintian", "--version", "lintian"),
        ("readelf", "--version", "binutils"),
        ("man", "--version", "man-db"),
    ] {
        let mut cmd = Command::new(tool);
        cmd.arg(flag);
        if !runs(cmd) {
            return Err(format!("{tool} is not installed (Debian's {package})"));
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let out_dir = dir.path().join("out");
    let mut script = Command::new("bash");
    script
        .arg(repo().join("dist/debian/build"))
        .arg(&out_dir)
        .arg("--fast")
        .env("FSBROKER_DEB_BIN", common::bin());
    let out = run_ok(script, Duration::from_secs(300));
    // The script prints the package's path, and nothing else, on stdout.
    let printed = text(&out.stdout);
    let deb = PathBuf::from(printed.trim_end());
    assert_eq!(
        printed.lines().count(),
        1,
        "the build printed more than the package's path: {printed:?}"
    );
    assert!(deb.starts_with(&out_dir), "{deb:?} is not in {out_dir:?}");
    assert!(deb.is_file(), "the printed path {deb:?} is not a file");
    let tree = dir.path().join("tree");
    let mut extract = Command::new("dpkg-deb");
    extract.arg("-x").arg(&deb).arg(&tree);
    run_ok(extract, Duration::from_secs(60));
    Ok(Package {
        _dir: dir,
        deb,
        tree,
    })
}

/// `dpkg-deb ARGS PACKAGE`'s standard output.
fn dpkg_deb(p: &Package, args: &[&str]) -> String {
    let mut cmd = Command::new("dpkg-deb");
    cmd.args(args).arg(&p.deb);
    text(&run_ok(cmd, Duration::from_secs(60)).stdout)
}

/// The regular files the package holds, as `dpkg-deb -c` lists them (`/usr/bin/fsbroker`).
fn contents(p: &Package) -> BTreeSet<String> {
    dpkg_deb(p, &["-c"])
        .lines()
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split_whitespace().last())
        .map(|path| path.trim_start_matches('.').to_owned())
        .collect()
}

/// Rule: the package holds the binary, both systemd user units, the three shell completions,
/// the docs, the copyright file, the changelog and the managed policy.
#[test]
fn the_package_holds_the_binary_units_completions_docs_and_managed_policy() {
    let Some(p) = package() else { return };
    let files = contents(p);
    for file in FILES.iter().chain([&CONFFILE]) {
        assert!(
            files.contains(*file),
            "{file} is not in the package: {files:#?}"
        );
    }
    // Each completion is the one fsbroker writes for that shell, from its own definition,
    // without the hidden packager's subcommand.
    for (file, shell) in [
        ("usr/share/bash-completion/completions/fsbroker", "bash"),
        ("usr/share/zsh/vendor-completions/_fsbroker", "zsh"),
        ("usr/share/fish/vendor_completions.d/fsbroker.fish", "fish"),
    ] {
        let packaged = std::fs::read_to_string(p.tree.join(file)).expect(file);
        let mut cmd = Command::new(common::bin());
        cmd.args(["completions", shell]);
        let expected = text(&run_ok(cmd, Duration::from_secs(30)).stdout);
        assert_eq!(
            packaged, expected,
            "{file} is not `fsbroker completions {shell}`"
        );
        assert!(packaged.contains("policy") && packaged.contains("confine"));
        assert!(
            !packaged.contains("generate-man"),
            "{file} offers generate-man"
        );
    }
}

/// Rule: there is a gzipped man page in section 1 for fsbroker and for each of its
/// subcommands, exactly the pages `fsbroker generate-man` writes, and each is a page `man`
/// renders with the subcommand's name.
#[test]
fn the_package_has_a_man_page_for_every_subcommand() {
    let Some(p) = package() else { return };
    let pages: BTreeSet<String> = contents(p)
        .into_iter()
        .filter_map(|f| {
            f.strip_prefix("/usr/share/man/man1/")
                .map(|page| page.strip_suffix(".1.gz").unwrap_or(page).to_owned())
        })
        .collect();
    let expected: BTreeSet<String> = MAN_PAGES.iter().map(|s| s.to_string()).collect();
    assert_eq!(pages, expected, "the package's man pages (man1, NAME.1.gz)");

    // The same set as the binary writes, so a subcommand added later is in the package
    // too (and then has to be named above).
    let (_t, generated) = common::tempdir();
    let mut cmd = Command::new(common::bin());
    cmd.arg("generate-man").arg(&generated);
    run_ok(cmd, Duration::from_secs(30));
    let written: BTreeSet<String> = std::fs::read_dir(&generated)
        .expect("generated pages")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .map(|name| name.strip_suffix(".1").unwrap_or(&name).to_owned())
        .collect();
    assert_eq!(written, expected, "fsbroker generate-man");

    for page in MAN_PAGES {
        let path = p.tree.join(format!("usr/share/man/man1/{page}.1.gz"));
        let bytes = std::fs::read(&path).expect("page");
        assert_eq!(
            bytes.get(..2),
            Some(&[0x1f, 0x8b][..]),
            "{page} is not gzipped"
        );
        let mut man = Command::new("man");
        man.arg("-l")
            .arg(&path)
            .env("MANWIDTH", "80")
            .env("MANPAGER", "cat");
        let out = output_within(&mut man, Duration::from_secs(30));
        let shown = text(&out.stdout);
        assert!(
            out.status.success() && shown.contains(page) && shown.contains("NAME"),
            "man -l {page}: {}\n{shown}",
            text(&out.stderr)
        );
    }
}

/// Rule: the managed policy is a conffile (dpkg keeps the administrator's edits across
/// upgrades), it is `dist/debian/managed.toml`, and as shipped every line is a comment, so it
/// narrows nothing.
#[test]
fn the_managed_policy_is_a_conffile_of_comments_only() {
    let Some(p) = package() else { return };
    let conffiles = dpkg_deb(p, &["-I"]);
    assert!(
        conffiles.contains(" conffiles "),
        "no conffiles: {conffiles}"
    );
    let mut cmd = Command::new("dpkg-deb");
    cmd.arg("--info").arg(&p.deb).arg("conffiles");
    let listed = text(&run_ok(cmd, Duration::from_secs(60)).stdout);
    assert_eq!(
        listed.lines().collect::<Vec<_>>(),
        [CONFFILE],
        "the conffiles"
    );
    let shipped = std::fs::read_to_string(p.tree.join(CONFFILE.trim_start_matches('/')))
        .expect("the managed policy");
    let source = std::fs::read_to_string(repo().join("dist/debian/managed.toml")).expect("source");
    assert_eq!(shipped, source);
    assert!(shipped.contains("docs/policy.md"), "{shipped}");
    for line in shipped.lines() {
        assert!(
            line.trim().is_empty() || line.trim_start().starts_with('#'),
            "a line of the shipped managed policy is not a comment: {line:?}"
        );
    }
}

/// Rule: the control fields name the package, its version (the crate's, revision 1), a
/// dependency on libc found from the binary, and the metadata of Cargo.toml; and the
/// package has no maintainer scripts, so installing it enables and starts no unit for
/// anyone (user units are each user's to enable).
#[test]
fn the_control_fields_are_the_crates_and_nothing_is_enabled_on_install() {
    let Some(p) = package() else { return };
    let control = dpkg_deb(p, &["-f"]);
    let field = |name: &str| {
        control
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")).map(str::to_owned))
    };
    assert_eq!(field("Package").as_deref(), Some("fsbroker"));
    assert_eq!(
        field("Version"),
        Some(format!("{}-1", env!("CARGO_PKG_VERSION")))
    );
    assert_eq!(field("Section").as_deref(), Some("utils"));
    assert_eq!(field("Priority").as_deref(), Some("optional"));
    let depends = field("Depends").unwrap_or_default();
    assert!(depends.contains("libc6"), "Depends: {depends}");
    assert!(field("Maintainer").is_some_and(|m| m.contains('@')));
    let info = dpkg_deb(p, &["-I"]);
    assert!(info.contains("Description: "), "{info}");
    for script in ["preinst", "postinst", "prerm", "postrm"] {
        assert!(
            !info.contains(&format!(" {script} ")),
            "the package has a {script}: {info}"
        );
    }
}

/// Rule: lintian, Debian's package checker, finds no error in the package. Its warnings
/// are printed (the package has none today; `dist/debian/lintian-overrides` says why the
/// one it overrides does not apply).
#[test]
fn lintian_reports_no_errors() {
    let Some(p) = package() else { return };
    let mut cmd = Command::new("lintian");
    cmd.arg(&p.deb);
    let out = output_within(&mut cmd, Duration::from_secs(300));
    let report = text(&out.stdout);
    eprintln!("lintian:\n{report}{}", text(&out.stderr));
    let errors: Vec<&str> = report.lines().filter(|l| l.starts_with("E:")).collect();
    assert!(errors.is_empty(), "lintian errors:\n{}", errors.join("\n"));
    assert!(out.status.success(), "lintian failed: {}", out.status);
}

/// Rule: the packaged binary runs and is the one built (its `--version`), stripped of its
/// debug information (cargo-deb strips even the debug binary of the tests).
#[test]
fn the_packaged_binary_runs_and_is_stripped() {
    let Some(p) = package() else { return };
    let binary = p.tree.join("usr/bin/fsbroker");
    let mut cmd = Command::new(&binary);
    cmd.arg("--version");
    let version = text(&run_ok(cmd, Duration::from_secs(30)).stdout);
    assert!(
        version.starts_with(&format!("fsbroker {} ", env!("CARGO_PKG_VERSION"))),
        "{version}"
    );
    let mut readelf = Command::new("readelf");
    readelf.arg("--sections").arg("--wide").arg(&binary);
    let sections = text(&run_ok(readelf, Duration::from_secs(30)).stdout);
    assert!(sections.contains(".text"), "{sections}");
    for debug in [".debug_info", ".symtab"] {
        assert!(
            !sections.contains(debug),
            "the packaged binary still has {debug}"
        );
    }
}
