//! What a server needs to run, found from its command line: the program (looked up in `PATH`
//! as `exec` would), the interpreter of a script (`#!`, through `env`), the installation each
//! lives in, the script and the code it loads, and the system files every runtime reads.
//! All of it read-only; nothing here is a root.
//!
//! The rules are the ones a packager would write by hand, so `fsbroker confine check` can
//! show them and `[confine] read` can add what a server needs beyond them:
//! - a program in `PREFIX/bin` (or `sbin`) brings `PREFIX` (`/usr/bin/node` → `/usr`, a
//!   virtualenv's `bin/python` → the virtualenv, and the Python it links to → its prefix);
//!   a version manager's `shims/` directory brings the manager's whole tree (pyenv, rbenv,
//!   asdf); any other program brings its own directory;
//! - a `#!` line brings its interpreter the same way (`#!/usr/bin/env node` looks `node` up
//!   in `PATH`), if it names an executable file. Not from a file the server can write (in a
//!   read-write root or a `[confine] write` path): it could have rewritten the line, or made
//!   the file a link, on an earlier run, to be granted any directory on the next. Such a
//!   program brings only its own installation; an interpreter outside the system
//!   directories then goes in `[confine] read`. An `env` line whose options this file does
//!   not know (`-u NAME`, `-C DIR`) is not followed either;
//! - the script brings the code around it: its outermost `node_modules` when it lies in one,
//!   else its directory. The script is the first existing file an interpreter run by name
//!   (`node`, `python3`, …) gets before any other plain argument (option values such as
//!   `--env-file FILE` do not count), or a file named like code (`.js`, `.py`, …); either way
//!   it must look like code (named so, executable, or starting `#!`). Any other file
//!   argument is granted alone (it may be a configuration beside secrets). Arguments naming directories bring nothing: those are the server's
//!   data, which only roots grant;
//! - for Node's `npx`/`npm exec`, the `node_modules` (and `package.json`) of the working
//!   directory and its parents, where a locally installed server is found;
//! - the system: `/usr`, `/lib*`, `/bin`, `/sbin`, `/opt` (programs and libraries); the few
//!   files of `/etc` a runtime reads (the loader's cache, time zone, users and names, TLS
//!   roots); a handful of `/proc` files about the machine (never another process's); and
//!   `/dev/null`, `/dev/zero`, `/dev/full`, `/dev/random`, `/dev/urandom`.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::path::{Path, PathBuf};

use super::{Access, ConfineError, Rule};
use crate::limits::MAX_INTERPRETERS;

/// System directories a runtime reads and runs programs from.
const SYSTEM_DIRS: [&str; 7] = ["/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/opt"];

/// Files of `/etc` (and directories of public certificates) a runtime reads at start or in
/// normal work; nothing that holds a secret (not `/etc/ssl/private`, not `/etc/pki/tls/private`).
const SYSTEM_FILES: [&str; 19] = [
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ld.so.preload",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/os-release",
    "/etc/mime.types",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/ca-certificates",
    "/etc/pki/tls/certs",
    "/etc/pki/ca-trust",
];

/// Machine-wide `/proc` files runtimes read (CPU count, memory); no process's own files.
const PROC_FILES: [&str; 6] = [
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/loadavg",
    "/proc/version",
    "/proc/filesystems",
];

/// Devices every runtime may open, read and write.
const DEVICES: [&str; 5] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// What a server needs: a rule, and the narrower path to grant instead when the rule's
/// turns out too broad (see `super::plan`).
#[derive(Debug, Clone)]
pub(crate) struct Need {
    /// The rule.
    pub rule: Rule,
    /// A narrower grant that still lets the server run (the program's own directory instead
    /// of its prefix, the script instead of its directory).
    pub narrower: Option<PathBuf>,
}

/// The rules a server with this command line needs to run, `cwd` its working directory and
/// `path` its `PATH`; `writable` are the (canonical) paths the server may write, whose files
/// are not trusted to say what to grant. What was not followed goes to `notes`.
pub(crate) fn needs(
    command: &[OsString],
    cwd: &Path,
    path: Option<&OsStr>,
    writable: &[PathBuf],
    notes: &mut Vec<String>,
) -> Result<Vec<Need>, ConfineError> {
    let mut rules: Vec<Need> = Vec::new();
    let mut add = |path: PathBuf, access: Access, why: String, narrower: Option<PathBuf>| {
        if !rules.iter().any(|r| r.rule.path == path) {
            rules.push(Need {
                rule: Rule {
                    path,
                    access,
                    why,
                    id: None,
                },
                narrower,
            });
        }
    };
    for dir in SYSTEM_DIRS {
        let why = "system programs and libraries";
        add(dir.into(), Access::ReadExec, why.into(), None);
    }
    for file in SYSTEM_FILES {
        let why = "system configuration a runtime reads";
        add(file.into(), Access::Read, why.into(), None);
    }
    for file in PROC_FILES {
        let why = "machine information a runtime reads";
        add(file.into(), Access::Read, why.into(), None);
    }
    for dev in DEVICES {
        add(dev.into(), Access::Device, "standard device".into(), None);
    }

    let (program, args) = command
        .split_first()
        .ok_or_else(|| ConfineError::Command("no server command given".into()))?;
    let mut next = Some(find_program(program, cwd, path).ok_or_else(|| {
        ConfineError::Command(format!(
            "cannot find the server's program {:?} in PATH",
            Path::new(program)
        ))
    })?);
    let mut node = false;
    for depth in 0..MAX_INTERPRETERS {
        let Some(exe) = next.take() else { break };
        let name = exe.file_name().map(|n| n.to_string_lossy().into_owned());
        node |= matches!(name.as_deref(), Some("node" | "npx" | "npm"));
        let real = exe.canonicalize().ok();
        let untrusted = server_made(&exe, writable);
        // A program the server can write is taken where it lies, not where a link of its
        // making would lead.
        let real = real.filter(|_| !untrusted);
        for exe in std::iter::once(&exe).chain(real.as_ref()) {
            node |= exe.to_string_lossy().contains("/node_modules/npm/");
            let own = exe.parent().map(Path::to_path_buf);
            for dir in installation(exe) {
                // An interpreter that a `#!` line names is a package's choice, not the
                // person's: its installation is granted only when it is one of a runtime
                // (`#!/home/me/other-project/run.sh` would hand over that project), else the
                // interpreter alone.
                let (dir, why) = if depth == 0 || is_runtime_installation(&dir) {
                    (dir, format!("the installation of {}", exe.display()))
                } else {
                    (exe.clone(), format!("the interpreter {}", exe.display()))
                };
                add(dir, Access::ReadExec, why, own.clone());
            }
        }
        next = interpreter(&exe, cwd, path);
        if next.is_none() && has_hash_bang(&exe) {
            notes.push(format!(
                "not followed: the #! line of {}: it names no executable file, or `env` \
                 options this check does not know; put its interpreter in [confine] read if \
                 it is not a system one",
                exe.display()
            ));
        }
        if untrusted && next.is_some() {
            notes.push(format!(
                "not followed: the #! line of {}: the server can write that file, so it \
                 could name anything; put its interpreter in [confine] read if it is not a \
                 system one",
                exe.display()
            ));
            next = None;
        }
        if let Some(interp) = &next {
            node |= interp.file_name().is_some_and(|n| n == "node");
        }
    }
    // The script is the first file argument of an interpreter run by name, before any
    // other plain argument (`node --flag server.js`), or any file whose name says it is code
    // (`uv run server.py`): the code around it is granted. Any other file argument (a
    // configuration: `server -c ~/.aws/config`, `npx pkg settings.json`) is granted alone.
    let interpreted = is_interpreter(program);
    let mut script_seen = false;
    let mut plain_seen = false;
    let mut value_next = false;
    for arg in args {
        let before = plain_seen;
        let value = std::mem::replace(&mut value_next, takes_value(arg));
        plain_seen |= !value && !is_option(arg);
        let p = Path::new(arg);
        let p = if p.is_relative() {
            cwd.join(p)
        } else {
            p.to_path_buf()
        };
        if !p.is_file() {
            continue;
        }
        // Through a link the server could have made, the file stays where it is named, and
        // the rule made of it is refused (`Guard::vet`).
        let p = if planted(&p, writable) {
            p
        } else {
            p.canonicalize().unwrap_or(p)
        };
        let script = !value && looks_like_code(&p) && ((interpreted && !before) || is_code(&p));
        if !script || std::mem::replace(&mut script_seen, true) {
            let why = format!("a file named on the command line, {}", p.display());
            add(p.clone(), Access::Read, why, None);
            continue;
        }
        // Packages run their own programs (`node_modules/.bin`, native helpers).
        let why = format!("the code of the script {}", p.display());
        add(code_around(&p), Access::ReadExec, why, Some(p.clone()));
        node |= p
            .extension()
            .is_some_and(|e| e == "js" || e == "mjs" || e == "cjs");
    }
    if node {
        for dir in cwd.ancestors() {
            for name in ["node_modules", "package.json"] {
                let p = dir.join(name);
                if p.exists() {
                    let why = "where npx finds a locally installed package";
                    add(p, Access::ReadExec, why.into(), None);
                }
            }
        }
    }
    Ok(rules)
}

/// Whether `path` (as named) goes through a symbolic link that lies in one of `writable`
/// (canonical paths): a server that may write there could have made it on an earlier run.
fn planted(path: &Path, writable: &[PathBuf]) -> bool {
    matches!(
        super::walk::resolve(path, writable),
        super::walk::Walk::Planted { .. }
    )
}

/// Whether the server could have chosen what `file` holds or where it leads: it lies in a
/// writable path, or is reached through a link made there.
fn server_made(file: &Path, writable: &[PathBuf]) -> bool {
    planted(file, writable)
        || file
            .canonicalize()
            .is_ok_and(|real| writable.iter().any(|w| real.starts_with(w)))
}

/// Programs that run the file named by their first plain argument.
const INTERPRETERS: [&str; 11] = [
    "node", "nodejs", "deno", "bun", "python", "pypy", "ruby", "perl", "php", "bash", "sh",
];

/// Whether `program` (as named on the command line) is an interpreter: `python3.11` and
/// `/usr/bin/node` count.
fn is_interpreter(program: &OsStr) -> bool {
    let name = Path::new(program)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    INTERPRETERS.contains(&stem)
}

/// Whether `arg` is an option (`-x`, `--flag`, `--key=value`) rather than a plain argument.
fn is_option(arg: &OsStr) -> bool {
    arg.to_string_lossy().starts_with('-')
}

/// Options of the interpreters whose value (the next argument) is a file or a module, never
/// the script: `node --env-file .env server.js`, `node -r ./setup.js server.js`.
const VALUE_OPTIONS: [&str; 12] = [
    "-r",
    "--require",
    "--import",
    "--loader",
    "--experimental-loader",
    "--env-file",
    "--env-file-if-exists",
    "--config",
    "--rcfile",
    "-X",
    "-W",
    "-e",
];

/// Whether `arg` is an option whose value is the next argument.
fn takes_value(arg: &OsStr) -> bool {
    VALUE_OPTIONS.contains(&arg.to_string_lossy().as_ref())
}

/// Whether `file` can be a program's code: named like code, executable, or starting `#!`.
fn looks_like_code(file: &Path) -> bool {
    is_code(file) || is_executable(file) || has_hash_bang(file)
}

/// Whether `file` starts with `#!`.
/// Opens a regular file of the server's command line for reading without waiting: the
/// server, or what it left running, may hold a lease on its own files (an open would wait out
/// the kernel's `lease-break-time`), or have put a FIFO there. Anything else fails.
/// Up to `limit` bytes of the regular file `file`, opened as [`open_now`] opens it: what a
/// plan reads of files the server may have made (a manifest, `pyvenv.cfg`, an npmrc), where
/// a FIFO would block the start for good.
pub(crate) fn read_regular(file: &Path, limit: u64) -> Option<Vec<u8>> {
    let mut text = Vec::new();
    open_now(file)
        .ok()?
        .take(limit)
        .read_to_end(&mut text)
        .ok()?;
    Some(text)
}

fn open_now(file: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(file)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(f)
}

fn has_hash_bang(file: &Path) -> bool {
    let mut head = [0u8; 2];
    open_now(file)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| &head == b"#!")
}

/// Whether `file`'s name says it is a program's code.
fn is_code(file: &Path) -> bool {
    const CODE: [&str; 12] = [
        "js", "mjs", "cjs", "ts", "mts", "py", "rb", "pl", "php", "sh", "jar", "lua",
    ];
    file.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| CODE.contains(&e))
}

/// `program` as `execvp` would find it.
pub(crate) fn find_program(program: &OsStr, cwd: &Path, path: Option<&OsStr>) -> Option<PathBuf> {
    let p = Path::new(program);
    if p.as_os_str().to_string_lossy().contains('/') {
        let p = if p.is_relative() {
            cwd.join(p)
        } else {
            p.to_path_buf()
        };
        return p.is_file().then_some(p);
    }
    let path = path
        .map(OsStr::to_os_string)
        .unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| if d.is_relative() { cwd.join(d) } else { d })
        .map(|d| d.join(p))
        .find(|c| is_executable(c))
}

/// Whether `p` is a regular file with an execute bit.
pub(crate) fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The directories a program's installation occupies (see the module's rules).
fn installation(exe: &Path) -> Vec<PathBuf> {
    let Some(dir) = exe.parent() else {
        return Vec::new();
    };
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
    match name.as_deref() {
        Some("bin" | "sbin" | "shims") => {
            let prefix = dir.parent().unwrap_or(dir);
            if prefix == Path::new("/") {
                vec![dir.to_path_buf()]
            } else {
                vec![prefix.to_path_buf()]
            }
        }
        _ => vec![dir.to_path_buf()],
    }
}

/// Whether `dir` is a runtime's installation: a system directory, a Python installation or
/// virtual environment, a Node.js installation (`bin/node` beside npm or its headers), or a
/// version manager's tree directly in the home (`~/.nvm`). Judged on the directory `dir`
/// resolves to, never on its spelling (`/usr/../home/me/project`, a `.nvm` a package ships).
fn is_runtime_installation(dir: &Path) -> bool {
    let Ok(dir) = dir.canonicalize() else {
        return false;
    };
    let homes = [std::env::var_os("HOME").map(PathBuf::from)];
    let managed = homes
        .iter()
        .flatten()
        .filter(|h| h.is_absolute())
        .any(|home| {
            let home = home.canonicalize().unwrap_or_else(|_| home.clone());
            super::guard::VERSION_MANAGERS
                .iter()
                .any(|m| dir.starts_with(home.join(m)))
        });
    SYSTEM_DIRS.iter().any(|s| dir.starts_with(s))
        || managed
        || super::launch::is_python_installation(&dir)
        || dir.join("pyvenv.cfg").is_file()
        || (is_executable(&dir.join("bin/node"))
            && (dir.join("lib/node_modules/npm").is_dir() || dir.join("include/node").is_dir()))
}

/// The interpreter a `#!` line names, looked up as the kernel (and `env`) would.
fn interpreter(exe: &Path, cwd: &Path, path: Option<&OsStr>) -> Option<PathBuf> {
    // Room for a `#!` line and a trampoline's second line, which holds a whole path.
    let mut head = vec![0u8; 256 + 4096];
    let n = read_head(exe, &mut head)?;
    let rest = head[..n].strip_prefix(b"#!")?;
    let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
    let line = String::from_utf8_lossy(&rest[..end]);
    let mut words = line.split_whitespace();
    let first = PathBuf::from(words.next()?);
    if first.file_name().is_some_and(|n| n == "env") {
        return env_program(words, cwd, path);
    }
    if first == Path::new("/bin/sh") && words.next().is_none() {
        if let Some(program) = rest.get(end + 1..).and_then(trampoline) {
            return is_executable(&program).then_some(program);
        }
    }
    // The kernel runs only an executable file. A relative one it looks up from the working
    // directory, which the server may write: not followed.
    (first.is_absolute() && is_executable(&first)).then_some(first)
}

/// Reads the start of `exe` into `buf`: how much was read.
fn read_head(exe: &Path, buf: &mut [u8]) -> Option<usize> {
    let mut file = open_now(exe).ok()?;
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]).ok()? {
            0 => break,
            got => n += got,
        }
    }
    Some(n)
}

/// The program a `#!/bin/sh` trampoline execs, from the line after its `#!` line. pip
/// (distlib) and uv write one in place of `#!PYTHON` when the path is too long for the
/// kernel's `#!` line (or holds a space): `'''exec' "PYTHON" "$0" "$@"`, uv quoting with `'`.
/// Only that exact shape, with an absolute path and nothing a shell would expand in it; any
/// other is `None` (the shell is then the last program followed).
fn trampoline(after: &[u8]) -> Option<PathBuf> {
    let line = &after[..after.iter().position(|&b| b == b'\n')?];
    let line = std::str::from_utf8(line).ok()?;
    let word = line.strip_prefix("'''exec' ")?;
    let (program, tail) = match word.chars().next()? {
        q @ ('\'' | '"') => word[1..].split_once(q)?,
        _ => word.split_once(' ')?,
    };
    // Unquoted, the shell splits and expands (`/a;/evil`, `/a*`): only a plain path passes.
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._+-".contains(c);
    let unquoted = !word.starts_with(['\'', '"']);
    if tail.trim_start() != r#""$0" "$@""#
        || program.contains(['\\', '$', '`', '"', '\''])
        || (unquoted && !program.chars().all(plain))
        || Path::new(program)
            .components()
            .any(|c| c == std::path::Component::ParentDir)
    {
        return None;
    }
    let program = PathBuf::from(program);
    program.is_absolute().then_some(program)
}

/// The program `env [-S] [-i] [VAR=value …] PROGRAM` runs. Any other option (`-u NAME`,
/// `-C DIR`, one this function does not know) makes it `None`: an option that takes a value
/// would otherwise pass its value off as the program.
fn env_program<'a>(
    words: impl Iterator<Item = &'a str>,
    cwd: &Path,
    path: Option<&OsStr>,
) -> Option<PathBuf> {
    for word in words {
        match word {
            "-S"
            | "--split-string"
            | "-i"
            | "--ignore-environment"
            | "-"
            | "-0"
            | "--null"
            | "-v"
            | "--debug"
            | "--" => {}
            w if w.starts_with('-') => return None,
            w if w.contains('=') => {}
            program => return find_program(OsStr::new(program), cwd, path),
        }
    }
    None
}

/// The code a script loads: everything under its outermost `node_modules`, or else its
/// directory.
fn code_around(script: &Path) -> PathBuf {
    let outermost = script
        .ancestors()
        .filter(|a| a.file_name().is_some_and(|n| n == "node_modules"))
        .last();
    match outermost {
        Some(dir) => dir.to_path_buf(),
        None => script.parent().unwrap_or(script).to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trampolines_of_pip_and_uv_name_their_python_and_nothing_else_passes() {
        let t = |s: &str| trampoline(s.as_bytes());
        let uv = "'''exec' '/a b/venv/bin/python' \"$0\" \"$@\"\n' '''\n";
        assert_eq!(t(uv), Some(PathBuf::from("/a b/venv/bin/python")));
        let pip = "'''exec' \"/v/bin/python\" \"$0\" \"$@\"\n' '''\n";
        assert_eq!(t(pip), Some(PathBuf::from("/v/bin/python")));
        let bare = "'''exec' /v/bin/python \"$0\" \"$@\"\n";
        assert_eq!(t(bare), Some(PathBuf::from("/v/bin/python")));
        for hostile in [
            // More than exec: a second command, or arguments the shell would expand.
            "'''exec' '/v/bin/python' \"$0\" \"$@\"; cat ~/.ssh/id\n",
            "'''exec' \"$HOME/bin/python\" \"$0\" \"$@\"\n",
            "'''exec' \"/v/`id`/python\" \"$0\" \"$@\"\n",
            "'''exec' 'relative/python' \"$0\" \"$@\"\n",
            "'''exec' '/v/bin/python\n",
            "exec /v/bin/python \"$0\" \"$@\"\n",
            // The shell splits an unquoted word (`;`), and `..` makes one path pass for another.
            "'''exec' /usr/../p/a;/../../x/bin/tool \"$0\" \"$@\"\n",
            "'''exec' '/usr/../home/me/project/bin/python' \"$0\" \"$@\"\n",
            // No line end: the head was cut short.
            "'''exec' '/v/bin/python' \"$0\" \"$@\"",
        ] {
            assert_eq!(t(hostile), None, "{hostile}");
        }
    }

    #[test]
    fn installations_follow_the_usual_layouts() {
        assert_eq!(
            installation(Path::new("/usr/bin/node")),
            vec![PathBuf::from("/usr")]
        );
        assert_eq!(
            installation(Path::new("/home/u/.pyenv/shims/python3")),
            vec![PathBuf::from("/home/u/.pyenv")]
        );
        assert_eq!(
            installation(Path::new("/bin/sh")),
            vec![PathBuf::from("/bin")]
        );
        assert_eq!(
            installation(Path::new("/srv/tools/server")),
            vec![PathBuf::from("/srv/tools")]
        );
    }

    #[test]
    fn env_lines_are_followed_only_when_every_option_is_known() {
        let (cwd, path) = (Path::new("/"), Some(OsStr::new("/usr/bin:/bin")));
        let sh = |words: &str| env_program(words.split_whitespace(), cwd, path);
        assert!(sh("sh").is_some());
        assert!(sh("-S sh -e").is_some());
        assert!(sh("-i A=1 sh").is_some());
        // `-u` takes a value: the value is not the program.
        assert_eq!(sh("-S -u /etc/shadow sh"), None);
        assert_eq!(sh("-C /etc sh"), None);
        assert_eq!(sh("--unset=X sh"), None);
    }

    /// Attack (a package's program names its interpreter): a relative `#!` (which the kernel
    /// looks up from the working directory, the server's to write) is not followed, and an
    /// absolute one that is no runtime's (another project's script) brings the interpreter
    /// alone, not its directory.
    #[test]
    fn a_packages_hash_bang_brings_a_runtime_or_the_interpreter_alone() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let t = t.path().canonicalize().unwrap();
        let exec = |p: &Path, text: &str| {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        let other = t.join("other-project/run.sh");
        exec(&other, "#!/bin/sh\n");
        exec(&t.join("etc/bin/node"), "#!/bin/sh\n");
        let relative = t.join("pkg/relative.js");
        exec(&relative, "#!etc/bin/node\n");
        assert_eq!(interpreter(&relative, &t, None), None);
        let server = t.join("pkg/server.js");
        exec(&server, &format!("#!{}\n", other.display()));
        let mut notes = Vec::new();
        let needs = needs(
            &[server.clone().into_os_string()],
            &t,
            None,
            &[],
            &mut notes,
        )
        .unwrap();
        let granted: Vec<&Path> = needs.iter().map(|n| n.rule.path.as_path()).collect();
        assert!(granted.contains(&other.as_path()), "{granted:?}");
        assert!(
            !granted.contains(&t.join("other-project").as_path()),
            "{granted:?}"
        );
        // The program the person named brings its own directory, as before.
        assert!(granted.contains(&t.join("pkg").as_path()), "{granted:?}");
        // Spelled to pass for a system directory, or in a `.nvm` the package ships: judged
        // by where it leads.
        let sneaky = t.join("other-project/bin/tool");
        exec(&sneaky, "#!/bin/sh\n");
        exec(&t.join("pkg/.nvm/bin/node"), "#!/bin/sh\n");
        for interp in [
            format!("/usr/..{}", sneaky.display()),
            t.join("pkg/.nvm/bin/node").display().to_string(),
        ] {
            exec(&server, &format!("#!{interp}\n"));
            let got = super::needs(
                &[server.clone().into_os_string()],
                &t,
                None,
                &[],
                &mut notes,
            );
            let got = got.unwrap();
            let granted: Vec<&Path> = got.iter().map(|n| n.rule.path.as_path()).collect();
            assert!(
                !granted.contains(&t.join("other-project").as_path())
                    && !granted.iter().any(|g| g.ends_with("pkg/.nvm")),
                "{interp}: {granted:?}"
            );
        }
    }

    #[test]
    fn scripts_bring_their_outermost_node_modules() {
        assert_eq!(
            code_around(Path::new(
                "/p/node_modules/@m/server/node_modules/x/dist/index.js"
            )),
            PathBuf::from("/p/node_modules")
        );
        assert_eq!(
            code_around(Path::new("/p/srv/server.py")),
            PathBuf::from("/p/srv")
        );
    }
}
