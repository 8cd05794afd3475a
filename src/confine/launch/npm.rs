//! npm's launchers: `npx [-y] PKG ARGS…` (and `npm exec`, `npm x`), and a package's program
//! in `node_modules` (a project's `node_modules/.bin/NAME`, a global install's
//! `PREFIX/bin/NAME`, wherever the prefix is).
//!
//! A package's code is its directory and the packages it depends on, found the way Node finds
//! them (`node_modules` of the package, then of each directory above it): a project-local
//! install hoists them beside the package, a global one nests them inside it. That tree, and
//! only it, is granted; never the `node_modules` around it whole, never the prefix or the
//! cache directory it lies in (`~/.npm-global`, `~/.npm`), which hold the person's settings.
//!
//! `npx` is resolved here rather than run: confined, it could neither ask the registry for
//! the newest version nor write its cache (`_npx/HASH/package.json`, a lock) as it does on
//! every start, and would hang retrying a network it does not have. It is looked up where
//! npx looks (the project, the global prefix, npx's own cache), then in fsbroker's cache, and
//! the program npx would have run is run directly.

use std::collections::{BTreeSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use super::{Launch, Missing, cache_root, grant, home, in_writable, real};
use crate::confine::runtime::{find_program, is_executable, read_regular};
use crate::limits::{MAX_DEPENDENCIES, MAX_PACKAGES, TREE_READ_LIMIT};
use crate::policy::Registry;

/// Recognises an npm launcher; `None` for any other command line.
pub(super) fn recognise(
    command: &[OsString],
    cwd: &Path,
    path: Option<&OsStr>,
    writable: &[PathBuf],
) -> Option<Launch> {
    let (program, args) = command.split_first()?;
    let name = Path::new(program)
        .file_name()?
        .to_string_lossy()
        .into_owned();
    let exec_args = match name.as_str() {
        "npx" => Some(args),
        "npm" => match args.first().and_then(|a| a.to_str()) {
            Some("exec" | "x") => Some(&args[1..]),
            _ => None,
        },
        _ => None,
    };
    if let Some(exec_args) = exec_args {
        return npx(program, exec_args, cwd, path, writable);
    }
    let exe = find_program(program, cwd, path)?;
    let real = real(&exe, writable)?;
    let package = package_of(&real)?;
    let manifest = Manifest::read(&package)?;
    let mut launch = Launch {
        launcher: "a package's program in node_modules".into(),
        resolved: vec![format!(
            "{} is {}'s program, installed in {}",
            exe.display(),
            manifest.id(),
            package.display()
        )],
        ..Launch::default()
    };
    if in_writable(&real, writable) {
        launch.command = Some(through_node(real, args, cwd, path, writable)?);
        launch.resolved.push(
            "it lies in a path the server may write, where the kernel runs no program: run \
             by node"
                .into(),
        );
    }
    add_tree(&mut launch, &package, &manifest, writable);
    Some(launch)
}

/// `npx` and `npm exec`: the package resolved to an installation, and its program run.
fn npx(
    program: &OsStr,
    args: &[OsString],
    cwd: &Path,
    path: Option<&OsStr>,
    writable: &[PathBuf],
) -> Option<Launch> {
    let line = match NpxLine::parse(args) {
        Ok(line) => line,
        Err(why) => {
            return Some(Launch {
                launcher: "npx".into(),
                resolved: vec![format!(
                    "not resolved ({why}): npx runs as given, and without the network it \
                     cannot fetch; give the package's program instead (`npm install -g PKG`, \
                     then its path)"
                )],
                ..Launch::default()
            });
        }
    };
    let config = NpmConfig::read(cwd, path);
    // `npx NAME` runs a program NAME the project or the global install already has, before
    // it looks for a package of that name (libnpmexec).
    if line.command.is_none() && valid_name(&line.package) && !line.package.starts_with('@') {
        let bins = std::iter::once(config.local_prefix.join("node_modules/.bin"))
            .chain(config.prefix.iter().map(|p| p.join("bin")));
        for bin in bins.map(|d| d.join(&line.package)) {
            // Not a program the server may write: one server could choose what another
            // (or its own next start) runs by name.
            let Some(file) = real(&bin, writable).filter(|f| !in_writable(f, writable)) else {
                continue;
            };
            if in_writable(&bin, writable) {
                continue;
            }
            let Some(package) = package_of(&file) else {
                continue;
            };
            let Some(manifest) = Manifest::read(&package) else {
                continue;
            };
            let mut launch = Launch {
                launcher: "npx".into(),
                resolved: vec![format!(
                    "runs {}, {}'s program, installed in {}",
                    bin.display(),
                    manifest.id(),
                    package.display()
                )],
                ..Launch::default()
            };
            run_directly(&mut launch, file, &line.args, cwd, path, writable)?;
            add_tree(&mut launch, &package, &manifest, writable);
            return Some(launch);
        }
    }
    let spec = Spec::parse(&line.package)?;
    let hash = npx_hash(&line.package);
    let ours = cache_root().map(|r| r.join("npx").join(&hash));
    let mut places: Vec<(PathBuf, String)> = Vec::new();
    places.push((
        config.local_prefix.join("node_modules"),
        format!(
            "the project's node_modules ({})",
            config.local_prefix.display()
        ),
    ));
    if let Some(prefix) = &config.prefix {
        places.push((
            prefix.join("lib/node_modules"),
            format!("the global install (prefix {})", prefix.display()),
        ));
    }
    if let Some(cache) = &config.cache {
        places.push((
            cache.join("_npx").join(&hash).join("node_modules"),
            format!("npx's own cache ({})", cache.display()),
        ));
    }
    // fsbroker's own installs count once complete (`super::INSTALLED`).
    if let Some(ours) = ours.as_ref().filter(|o| o.join(super::INSTALLED).is_file()) {
        places.push((
            ours.join("node_modules"),
            format!("fsbroker's cache ({})", ours.display()),
        ));
    }
    let mut launch = Launch {
        launcher: "npx".into(),
        ..Launch::default()
    };
    let found = places.iter().find_map(|(dir, what)| {
        let package = dir.join(&spec.name);
        let manifest = Manifest::read(&package)?;
        // What lies where the server may write is the server's choice: another server's
        // `npx -y PKG` started there must not run it.
        if real(&package, writable).is_none_or(|r| in_writable(&r, writable)) {
            launch.resolved.push(format!(
                "not used: {} in {what}: it lies in a path the server may write",
                manifest.id()
            ));
            return None;
        }
        spec.accepts(&manifest.version)
            .then_some((package, manifest, what))
    });
    let Some((package, manifest, what)) = found else {
        let cache = ours?;
        let npm = super::beside(program, "npm", cwd, path);
        // `npm install` into a directory of fsbroker's own, run there (no project's
        // `.npmrc` or `node_modules/.bin` is consulted), running no script and linking no
        // program (a dependency's program named `sh` would otherwise be what npm runs).
        let install = [
            npm.as_os_str(),
            OsStr::new("install"),
            OsStr::new("--prefix"),
            cache.as_os_str(),
            OsStr::new("--ignore-scripts"),
            OsStr::new("--no-bin-links"),
            OsStr::new("--no-audit"),
            OsStr::new("--no-fund"),
            OsStr::new("--no-save"),
            OsStr::new("--loglevel=warn"),
            OsStr::new("--cache"),
            cache.join("cache").as_os_str(),
            OsStr::new(&line.package),
        ]
        .iter()
        .map(|s| s.to_os_string())
        .collect();
        launch.resolved.push(format!(
            "{} is not installed in {}",
            line.package,
            places
                .iter()
                .map(|(_, what)| what.as_str())
                .collect::<Vec<_>>()
                .join(", nor in ")
        ));
        launch.missing = Some(Missing {
            registry: Registry::Npm,
            package: line.package.clone(),
            install,
            env: Vec::new(),
            cache,
            instead: format!(
                "install it first (`npm install -g {}`, or `npx -y {}` once without \
                 --confine), or let fsbroker fetch it (`--confine-fetch npm`, or \
                 `fetch = [\"npm\"]` in the policy's [confine])",
                line.package, line.package
            ),
        });
        return Some(launch);
    };
    let Some(bin) = manifest.program(&package, line.command.as_deref(), writable) else {
        launch.resolved.push(format!(
            "{} in {} has no program {}: npx runs as given",
            manifest.id(),
            package.display(),
            line.command.as_deref().unwrap_or("named after it")
        ));
        return Some(launch);
    };
    launch.resolved.push(format!(
        "runs {}'s program {} from {what}",
        manifest.id(),
        bin.display()
    ));
    run_directly(&mut launch, bin, &line.args, cwd, path, writable)?;
    add_tree(&mut launch, &package, &manifest, writable);
    Some(launch)
}

/// Makes `launch` run `bin` with `args` instead of npx (through `node` when the file is not
/// executable, as npm would have linked it).
fn run_directly(
    launch: &mut Launch,
    bin: PathBuf,
    args: &[OsString],
    cwd: &Path,
    path: Option<&OsStr>,
    writable: &[PathBuf],
) -> Option<()> {
    launch.resolved.push(
        "npx itself is not run: confined, it could neither ask the registry for a newer \
         version nor write its cache; it would have run this program"
            .into(),
    );
    launch.command = Some(through_node(bin, args, cwd, path, writable)?);
    Some(())
}

/// The command that runs the package program `bin` (its real path) with `args`: the file
/// itself, or `node FILE` when it is not executable (npm would have made it so) or lies in a
/// path the server may write, where the kernel runs no program (and its `#!` line is the
/// server's to choose).
fn through_node(
    bin: PathBuf,
    args: &[OsString],
    cwd: &Path,
    path: Option<&OsStr>,
    writable: &[PathBuf],
) -> Option<Vec<OsString>> {
    let mut run = Vec::with_capacity(args.len() + 2);
    if !is_executable(&bin) || in_writable(&bin, writable) {
        run.push(find_program(OsStr::new("node"), cwd, path)?.into_os_string());
    }
    run.push(bin.into_os_string());
    run.extend(args.iter().cloned());
    Some(run)
}

/// Grants `package` and its dependency tree, and says so.
fn add_tree(launch: &mut Launch, package: &Path, manifest: &Manifest, writable: &[PathBuf]) {
    let Tree { dirs, unresolved } = tree(package, writable);
    let why = format!("{}'s dependency tree", manifest.id());
    launch.resolved.push(format!(
        "granted read+exec: {} and its {} dependencies, found as Node finds them; nothing else \
         of the node_modules or the directory they lie in",
        manifest.id(),
        dirs.len().saturating_sub(1)
    ));
    for missing in unresolved {
        launch.resolved.push(format!(
            "not found: {missing}, which the tree depends on; the server may fail to load it"
        ));
    }
    launch
        .needs
        .extend(dirs.into_iter().map(|d| grant(d, &why)));
}

/// The command line after `npx` (or `npm exec`): which package, which of its programs, and
/// the program's arguments.
#[derive(Debug, PartialEq)]
struct NpxLine {
    package: String,
    /// The program named (`npx -p PKG NAME`); `None`: the package's own.
    command: Option<String>,
    args: Vec<OsString>,
}

impl NpxLine {
    /// npx reads its options up to the first plain argument (the package, or the program
    /// with `-p`); everything after is the program's.
    fn parse(args: &[OsString]) -> Result<NpxLine, String> {
        let mut packages = Vec::new();
        let mut it = args.iter();
        let mut first = None;
        while let Some(arg) = it.next() {
            let a = arg
                .to_str()
                .ok_or_else(|| format!("{arg:?} is not UTF-8"))?;
            match a {
                "--" => {
                    first = it.next();
                    break;
                }
                "-y"
                | "--yes"
                | "-q"
                | "--quiet"
                | "--no"
                | "-n"
                | "--prefer-offline"
                | "--prefer-online"
                | "--offline"
                | "--no-update-notifier" => {}
                "-p" | "--package" => packages.push(
                    it.next()
                        .and_then(|p| p.to_str())
                        .ok_or("--package without a package")?
                        .to_owned(),
                ),
                _ if a.starts_with("--package=") => packages.push(a["--package=".len()..].into()),
                _ if a.starts_with('-') => {
                    return Err(format!("the option {a} is not one fsbroker reads"));
                }
                _ => {
                    first = Some(arg);
                    break;
                }
            }
        }
        let first = first
            .and_then(|f| f.to_str())
            .ok_or("no package named")?
            .to_owned();
        let args = it.cloned().collect();
        match packages.len() {
            0 => Ok(NpxLine {
                package: first,
                command: None,
                args,
            }),
            1 => Ok(NpxLine {
                package: packages.remove(0),
                command: Some(first),
                args,
            }),
            _ => Err("several --package".into()),
        }
    }
}

/// A registry package spec: `name`, `@scope/name`, with `@version`, `@range` or `@tag`.
#[derive(Debug, PartialEq)]
struct Spec {
    name: String,
    selector: Option<String>,
}

impl Spec {
    /// `None` for anything but a registry package (a path, a URL, a git or GitHub spec).
    fn parse(spec: &str) -> Option<Spec> {
        let at = if let Some(rest) = spec.strip_prefix('@') {
            rest.find('@').map(|i| i + 1)
        } else {
            spec.find('@')
        };
        let (name, selector) = match at {
            Some(i) => (&spec[..i], Some(spec[i + 1..].to_owned())),
            None => (spec, None),
        };
        valid_name(name).then(|| Spec {
            name: name.to_owned(),
            selector: selector.filter(|s| !s.is_empty()),
        })
    }

    /// Whether an installed `version` is what the spec asks for. An exact version must
    /// match; a tag or a range takes what is installed (npx would take a local install in
    /// range as well, and asks the registry only for its own cache).
    fn accepts(&self, version: &str) -> bool {
        match self.selector.as_deref() {
            Some(v)
                if v.chars().next().is_some_and(|c| c.is_ascii_digit())
                    && !v.contains([' ', '|', '<', '>', 'x', '*'])
                    && v.matches('.').count() == 2 =>
            {
                v.trim_start_matches('v') == version
            }
            _ => true,
        }
    }
}

/// Whether `name` is a package name npm could have installed, and so a path of one or two
/// plain components under `node_modules` (never `..`, never absolute).
fn valid_name(name: &str) -> bool {
    let ok = |part: &str| {
        !part.is_empty()
            && part.len() <= 214
            && !part.starts_with('.')
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._~".contains(c))
    };
    match name.strip_prefix('@') {
        Some(scoped) => scoped
            .split_once('/')
            .is_some_and(|(scope, pkg)| ok(scope) && ok(pkg)),
        None => ok(name),
    }
}

/// The directory npx's cache keeps a package list in: the first 16 hex digits of the SHA-512
/// of the specs, sorted, one per line (libnpmexec).
fn npx_hash(spec: &str) -> String {
    use sha2::{Digest, Sha512};
    let digest = Sha512::digest(spec.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// What npx's configuration says about where packages are: the project around the working
/// directory, the global prefix, the cache.
struct NpmConfig {
    local_prefix: PathBuf,
    prefix: Option<PathBuf>,
    cache: Option<PathBuf>,
}

impl NpmConfig {
    /// From the environment (`npm_config_*`), then the person's `.npmrc`, then npm's
    /// defaults (the prefix above `node`'s `bin`, the cache `~/.npm`). The `.npmrc` is read
    /// here, by the proxy, for these two keys: the confined server never reads it (it holds
    /// registry tokens).
    fn read(cwd: &Path, path: Option<&OsStr>) -> NpmConfig {
        let env = |key: &str| {
            std::env::var_os(format!("npm_config_{key}"))
                .or_else(|| std::env::var_os(format!("NPM_CONFIG_{}", key.to_uppercase())))
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let userconfig = env("userconfig").or_else(|| home().map(|h| h.join(".npmrc")));
        let rc = userconfig.as_deref().map(read_npmrc).unwrap_or_default();
        let from_rc = |key: &str| {
            rc.iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| expand_home(v))
        };
        let node_prefix = find_program(OsStr::new("node"), cwd, path)
            .and_then(|n| n.canonicalize().ok())
            .and_then(|n| n.parent()?.parent().map(Path::to_path_buf));
        // npm's project root: the nearest directory holding package.json or node_modules.
        let local_prefix = cwd
            .ancestors()
            .find(|d| d.join("package.json").is_file() || d.join("node_modules").is_dir())
            .unwrap_or(cwd)
            .to_path_buf();
        NpmConfig {
            local_prefix,
            prefix: env("prefix").or_else(|| from_rc("prefix")).or(node_prefix),
            cache: env("cache")
                .or_else(|| from_rc("cache"))
                .or_else(|| home().map(|h| h.join(".npm"))),
        }
    }
}

/// The `key = value` lines of an npmrc (at most 64 KiB of it).
fn read_npmrc(file: &Path) -> Vec<(String, String)> {
    let Some(text) = read_regular(file, 64 * 1024) else {
        return Vec::new();
    };
    String::from_utf8_lossy(&text)
        .lines()
        .filter(|l| !l.trim_start().starts_with(['#', ';']))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// A path of an npmrc: `~/` and `${HOME}` are the home.
fn expand_home(value: &str) -> PathBuf {
    let home = home().unwrap_or_default();
    let value = value.replace("${HOME}", &home.to_string_lossy());
    match value.strip_prefix("~/") {
        Some(rest) => home.join(rest),
        None => PathBuf::from(value),
    }
}

/// The package a file belongs to: the nearest directory above it that sits in `node_modules`
/// (or in a scope there) and holds a `package.json`.
fn package_of(file: &Path) -> Option<PathBuf> {
    file.ancestors().skip(1).find_map(|dir| {
        let parent = dir.parent()?;
        let in_modules = parent.file_name() == Some(OsStr::new("node_modules"))
            || (parent
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('@'))
                && parent.parent()?.file_name() == Some(OsStr::new("node_modules")));
        (in_modules && dir.join("package.json").is_file()).then(|| dir.to_path_buf())
    })
}

/// The fields of a `package.json` this module reads.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct Manifest {
    name: String,
    version: String,
    bin: Option<serde_json::Value>,
    dependencies: serde_json::Map<String, serde_json::Value>,
    #[serde(rename = "optionalDependencies")]
    optional: serde_json::Map<String, serde_json::Value>,
    #[serde(rename = "peerDependencies")]
    peer: serde_json::Map<String, serde_json::Value>,
}

impl Manifest {
    /// `dir/package.json` (at most 1 MiB of it), if it reads.
    fn read(dir: &Path) -> Option<Manifest> {
        serde_json::from_slice(&read_regular(&dir.join("package.json"), 1 << 20)?).ok()
    }

    fn id(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }

    /// The file of the program npx would run from this package installed in `dir`: the one
    /// named `command`, else its only program, else the one named after the package. It
    /// must lie inside the package.
    fn program(&self, dir: &Path, command: Option<&str>, writable: &[PathBuf]) -> Option<PathBuf> {
        let unscoped = self.name.rsplit('/').next().unwrap_or(&self.name);
        let file = match self.bin.as_ref()? {
            serde_json::Value::String(file) => {
                (command.is_none_or(|c| c == unscoped)).then_some(file.as_str())?
            }
            serde_json::Value::Object(bins) => {
                let pick = match command {
                    Some(c) => bins.get(c),
                    None if bins.len() == 1 => bins.values().next(),
                    None => bins.get(unscoped),
                };
                pick?.as_str()?
            }
            _ => return None,
        };
        let dir = real(dir, writable)?;
        let file = real(&dir.join(file), writable)?;
        (file.starts_with(&dir) && file.is_file()).then_some(file)
    }
}

/// A package's dependency tree.
struct Tree {
    /// The package's directory, then each dependency's, canonical, each once.
    dirs: Vec<PathBuf>,
    /// Required dependencies found nowhere Node would look.
    unresolved: Vec<String>,
}

/// The packages `package` loads: its dependencies, optional and peer dependencies, theirs,
/// and so on, each found as Node's resolution finds it from the package that needs it (in
/// its own `node_modules`, then in the `node_modules` of each directory above), at most
/// [`MAX_PACKAGES`].
fn tree(package: &Path, writable: &[PathBuf]) -> Tree {
    let mut seen: BTreeSet<PathBuf> = BTreeSet::new();
    let mut dirs = Vec::new();
    let mut unresolved = Vec::new();
    let Some(start) = real(package, writable) else {
        unresolved.push(format!(
            "{} (reached through a link the server could have made)",
            package.display()
        ));
        return Tree { dirs, unresolved };
    };
    let mut queued: BTreeSet<PathBuf> = BTreeSet::from([start.clone()]);
    let mut queue = VecDeque::from([start]);
    let started = std::time::Instant::now();
    while let Some(dir) = queue.pop_front() {
        if started.elapsed() > TREE_READ_LIMIT {
            unresolved.push(format!(
                "{} queued package(s) and what they need: the tree was not read whole within {} s",
                queue.len() + 1,
                TREE_READ_LIMIT.as_secs()
            ));
            break;
        }
        if dirs.len() >= MAX_PACKAGES || !seen.insert(dir.clone()) {
            continue;
        }
        dirs.push(dir.clone());
        let Some(manifest) = Manifest::read(&dir) else {
            continue;
        };
        let required = manifest.dependencies.keys().map(|n| (n, true));
        let optional = manifest
            .optional
            .keys()
            .chain(manifest.peer.keys())
            .map(|n| (n, false));
        for (name, needed) in required.chain(optional).take(MAX_DEPENDENCIES) {
            match resolve(&dir, name, writable) {
                Ok(found) if seen.contains(&found) || queued.contains(&found) => {}
                Ok(_) if queued.len() >= MAX_PACKAGES => {
                    unresolved.push(format!(
                        "{name} (for {}): past {MAX_PACKAGES} packages",
                        manifest.id()
                    ));
                }
                Ok(found) => {
                    queued.insert(found.clone());
                    queue.push_back(found);
                }
                Err(Some(link)) => unresolved.push(format!(
                    "{name} (for {}): not followed, {} is a link out of node_modules, or \
                     one in a path the server may write",
                    manifest.id(),
                    link.display()
                )),
                Err(None) if needed => unresolved.push(format!("{name} (for {})", manifest.id())),
                Err(None) => {}
            }
        }
    }
    Tree { dirs, unresolved }
}

/// Where Node finds package `name` when `from` (a package directory) loads it. `Err(None)`:
/// nowhere; `Err(Some(path))`: where Node would find it, through a link the server could
/// have planted, which is not followed.
fn resolve(from: &Path, name: &str, writable: &[PathBuf]) -> Result<PathBuf, Option<PathBuf>> {
    if !valid_name(name) {
        return Err(None);
    }
    let found = from
        .ancestors()
        .filter(|d| d.file_name() != Some(OsStr::new("node_modules")))
        .map(|d| d.join("node_modules").join(name))
        .find(|c| c.join("package.json").is_file())
        .ok_or(None)?;
    // A package is a directory of a `node_modules` (or of a scope in one): a `file:` or
    // linked dependency leading anywhere else (`file:../../../projects/app`) is not a
    // package's code, whoever made the link.
    let dir = real(&found, writable).ok_or_else(|| Some(found.clone()))?;
    package_of(&dir.join("package.json"))
        .filter(|p| *p == dir)
        .ok_or(Some(found))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    /// Attack (a server plants `node_modules/.bin/goodsrv` in a project it may write): `npx -y
    /// goodsrv`, and `npx goodsrv`, run from there do not take the planted program; the
    /// package is sought where the server cannot write.
    #[test]
    fn npx_takes_no_program_from_a_writable_project() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().canonicalize().unwrap();
        let pkg = project.join("node_modules/goodsrv");
        std::fs::create_dir_all(&pkg).unwrap();
        std::fs::create_dir_all(project.join("node_modules/.bin")).unwrap();
        std::fs::write(
            pkg.join("package.json"),
            r#"{"name":"goodsrv","version":"1.0.0","bin":{"goodsrv":"cli.js"}}"#,
        )
        .unwrap();
        std::fs::write(pkg.join("cli.js"), "planted\n").unwrap();
        std::os::unix::fs::symlink(
            "../goodsrv/cli.js",
            project.join("node_modules/.bin/goodsrv"),
        )
        .unwrap();
        std::fs::write(project.join("package.json"), "{}").unwrap();
        let writable = std::slice::from_ref(&project);
        for line in [&["npx", "-y", "goodsrv"][..], &["npx", "goodsrv"]] {
            let command: Vec<OsString> = line.iter().map(OsString::from).collect();
            let launch = super::super::recognise(
                &command,
                &project,
                Some(OsStr::new("/usr/bin:/bin")),
                writable,
            )
            .unwrap();
            let runs = format!("{:?}", launch.command);
            assert!(
                !runs.contains("cli.js"),
                "{line:?}: {runs} {:?}",
                launch.resolved
            );
        }
        // Not writable, the project's program is the one npx runs.
        let command: Vec<OsString> = ["npx", "goodsrv"].iter().map(OsString::from).collect();
        let launch =
            super::super::recognise(&command, &project, Some(OsStr::new("/usr/bin:/bin")), &[])
                .unwrap();
        assert!(
            format!("{:?}", launch.command).contains("cli.js"),
            "{:?}",
            launch.resolved
        );
    }

    /// Attack (a server makes `package.json`, `pyvenv.cfg` or `.npmrc` a FIFO in its root, for
    /// its next start's plan to read): the plan reads regular files only, so it does not
    /// block waiting for a writer that never comes.
    #[test]
    fn a_fifo_for_a_file_the_plan_reads_does_not_block_it() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["package.json", ".npmrc"] {
            let made = std::process::Command::new("mkfifo")
                .arg(dir.path().join(name))
                .status()
                .unwrap();
            assert!(made.success());
        }
        assert!(Manifest::read(dir.path()).is_none());
        assert!(read_npmrc(&dir.path().join(".npmrc")).is_empty());
    }

    #[test]
    fn npx_lines_name_the_package_and_the_programs_arguments() {
        let line = NpxLine::parse(&os(&["-y", "@m/server", "/data", "--flag"])).unwrap();
        assert_eq!(line.package, "@m/server");
        assert_eq!(line.command, None);
        assert_eq!(line.args, os(&["/data", "--flag"]));
        let line = NpxLine::parse(&os(&["--package=@m/pkg@1.2.3", "tool", "-x"])).unwrap();
        assert_eq!(line.package, "@m/pkg@1.2.3");
        assert_eq!(line.command.as_deref(), Some("tool"));
        assert_eq!(line.args, os(&["-x"]));
        assert!(NpxLine::parse(&os(&["-c", "evil"])).is_err());
        assert!(NpxLine::parse(&os(&["-p", "a", "-p", "b", "x"])).is_err());
    }

    #[test]
    fn specs_are_registry_packages_only() {
        let s = Spec::parse("@scope/name@1.2.3").unwrap();
        assert_eq!(
            (s.name.as_str(), s.selector.as_deref()),
            ("@scope/name", Some("1.2.3"))
        );
        assert!(s.accepts("1.2.3") && !s.accepts("1.2.4"));
        let s = Spec::parse("name").unwrap();
        assert!(s.selector.is_none() && s.accepts("9.9.9"));
        assert!(Spec::parse("name@^1.2.0").unwrap().accepts("1.5.0"));
        for bad in [
            "../x",
            "user/repo",
            "git+https://x/y.git",
            "./dir",
            "/abs",
            "@s/../x",
            "@/x",
        ] {
            assert_eq!(Spec::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_npx_hash_is_libnpmexecs() {
        // `npm exec --package @modelcontextprotocol/server-filesystem@2026.8.31 -- true`
        // installed into `_npx/68b53d3fd47bf8db` (npm 11.19).
        assert_eq!(
            npx_hash("@modelcontextprotocol/server-filesystem@2026.8.31"),
            "68b53d3fd47bf8db"
        );
    }

    #[test]
    fn a_tree_is_found_as_node_finds_it_and_stays_inside_node_modules() {
        let dir = tempfile::tempdir().unwrap();
        let nm = dir.path().join("node_modules");
        let put = |pkg: &str, json: &str| {
            std::fs::create_dir_all(nm.join(pkg)).unwrap();
            std::fs::write(nm.join(pkg).join("package.json"), json).unwrap();
        };
        put(
            "@s/server",
            r#"{"name":"@s/server","version":"1.0.0","dependencies":{"a":"1","../../etc":"1"},"optionalDependencies":{"gone":"1"}}"#,
        );
        put(
            "a",
            r#"{"name":"a","version":"1.0.0","dependencies":{"b":"1","missing":"1"}}"#,
        );
        put("a/node_modules/b", r#"{"name":"b","version":"2.0.0"}"#);
        put("b", r#"{"name":"b","version":"1.0.0"}"#);
        put("unrelated", r#"{"name":"unrelated","version":"1.0.0"}"#);
        let tree = tree(&nm.join("@s/server"), &[]);
        let real = nm.canonicalize().unwrap();
        assert_eq!(
            tree.dirs,
            vec![
                real.join("@s/server"),
                real.join("a"),
                real.join("a/node_modules/b")
            ]
        );
        assert_eq!(
            tree.unresolved,
            vec!["../../etc (for @s/server@1.0.0)", "missing (for a@1.0.0)"]
        );
        assert_eq!(
            package_of(&real.join("a/node_modules/b/index.js")),
            Some(real.join("a/node_modules/b"))
        );
    }

    #[test]
    fn a_link_the_server_could_have_planted_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let nm = dir.path().join("node_modules");
        let secret = dir.path().join("secret");
        for d in [nm.join("srv"), secret.clone()] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(
            nm.join("srv/package.json"),
            r#"{"name":"srv","version":"1.0.0","dependencies":{"evil":"1"}}"#,
        )
        .unwrap();
        std::fs::write(
            secret.join("package.json"),
            r#"{"name":"evil","version":"1.0.0"}"#,
        )
        .unwrap();
        std::os::unix::fs::symlink(&secret, nm.join("evil")).unwrap();
        let real_nm = nm.canonicalize().unwrap();
        // The node_modules is the server's to write: the link may be its own.
        let t = tree(&nm.join("srv"), std::slice::from_ref(&real_nm));
        assert_eq!(t.dirs, vec![real_nm.join("srv")]);
        assert!(
            t.unresolved[0].contains("not followed"),
            "{:?}",
            t.unresolved
        );
        // Elsewhere, a link out of node_modules is not a package either (npm makes them for
        // `file:` dependencies: `file:../../projects/app`).
        let t = tree(&nm.join("srv"), &[]);
        assert_eq!(t.dirs, vec![real_nm.join("srv")]);
        // A link to a package in another node_modules (pnpm's store) is followed.
        let store = dir.path().join("store/node_modules/evil");
        std::fs::create_dir_all(&store).unwrap();
        std::fs::write(
            store.join("package.json"),
            r#"{"name":"evil","version":"1.0.0"}"#,
        )
        .unwrap();
        std::fs::remove_file(nm.join("evil")).unwrap();
        std::os::unix::fs::symlink(&store, nm.join("evil")).unwrap();
        let t = tree(&nm.join("srv"), &[]);
        assert_eq!(
            t.dirs,
            vec![real_nm.join("srv"), store.canonicalize().unwrap()]
        );
    }
}
