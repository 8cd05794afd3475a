//! A loopback npm registry for the launch-line tests: `npx -y PKG` with a cold cache must fetch
//! from a registry, and the tests may use no network but loopback, so [`NpmRegistry`] serves
//! real, pinned packages itself, on 127.0.0.1: the tarballs of every package in
//! `tests/launchers/npm/package-lock.json` (the reference filesystem server and its tree),
//! which `tests/launchers/fetch.sh` saves into `tests/launchers/tarballs/` beforehand
//! (`.ci/run` runs it; [`require_tarballs`] runs it once, under a lock, when one is missing).
//!
//! It speaks as much of the registry protocol as `npm install`, `npm exec` and `npx` use:
//! `GET /NAME`, `GET /@SCOPE%2fNAME` and `GET /@SCOPE/NAME` answer a packument built from
//! the tarballs' own `package.json` (whatever the `Accept`, the abbreviated
//! `application/vnd.npm.install-v1+json` included), `GET /tarballs/FILE.tgz` the bytes, and
//! anything else a 404 `{"error":"not found"}`. Every request's path is recorded
//! ([`NpmRegistry::requests`]), so a test can show the registry was, or was not, asked.
//! [`npm_env`] is the environment that points npm at it, with a private cache, home and
//! global prefix, and a dead proxy for any other host.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha512};

/// How long a connection may sit idle between two requests before the registry drops it.
const IDLE: Duration = Duration::from_secs(60);

/// `tests/launchers`.
pub fn launchers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/launchers")
}

/// `tests/launchers/npm`: the project whose lock pins the packages the registry serves (and a
/// project-local install of them: [`require_local_install`]).
pub fn project_dir() -> PathBuf {
    launchers_dir().join("npm")
}

/// `npm`: `$NPM`, else `npm` on the PATH.
pub fn npm() -> String {
    std::env::var("NPM").unwrap_or_else(|_| "npm".to_owned())
}

/// `npx`: `$NPX`, else `npx` on the PATH.
pub fn npx() -> String {
    std::env::var("NPX").unwrap_or_else(|_| "npx".to_owned())
}

/// The tarball file names the lock calls for, as `fetch.sh` and `npm pack` name them
/// (`NAME-VERSION.tgz`, a scope's `@` dropped and its `/` made `-`): every `node_modules/`
/// entry of `package-lock.json` but links and bundled ones, a nested duplicate once.
pub fn lock_tarballs() -> BTreeSet<String> {
    let lock_path = project_dir().join("package-lock.json");
    let text = std::fs::read_to_string(&lock_path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", lock_path.display()));
    let lock: Value = serde_json::from_str(&text).expect("package-lock.json is JSON");
    let packages = lock["packages"]
        .as_object()
        .expect("a lockfileVersion 3 lock");
    let mut files = BTreeSet::new();
    for (key, entry) in packages {
        let Some(at) = key.rfind("node_modules/") else {
            continue;
        };
        if entry["link"] == true || entry["inBundle"] == true {
            continue;
        }
        let name = entry["name"]
            .as_str()
            .unwrap_or(&key[at + "node_modules/".len()..]);
        let version = entry["version"]
            .as_str()
            .unwrap_or_else(|| panic!("{key}: no version in the lock"));
        files.insert(tarball_file(name, version));
    }
    files
}

/// `NAME-VERSION.tgz` for a package, as `npm pack` names it.
pub fn tarball_file(name: &str, version: &str) -> String {
    format!(
        "{}-{version}.tgz",
        name.trim_start_matches('@').replacen('/', "-", 1)
    )
}

/// `tests/launchers/tarballs`, holding exactly the tarballs the lock calls for: when one is
/// missing (or one is there that the lock does not name), runs `tests/launchers/fetch.sh`
/// (which fetches them from the npm registry and checks each against the lock's integrity),
/// once, under `tests/launchers/.fetch.lock`, so tests starting together fetch once and wait
/// for each other. Fails, saying why, when the script cannot run or fails: never skipped, like
/// the npm peers (`peers::require_npm`).
pub fn require_tarballs() -> PathBuf {
    let dir = launchers_dir().join("tarballs");
    let ready = || {
        let present: BTreeSet<String> = std::fs::read_dir(&dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|name| name.ends_with(".tgz"))
                    .collect()
            })
            .unwrap_or_default();
        present == lock_tarballs()
    };
    super::peers::install_once(&launchers_dir().join(".fetch.lock"), ready, || {
        let script = launchers_dir().join("fetch.sh");
        let status = Command::new("bash")
            .arg(&script)
            .stdin(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("cannot run `bash {}`: {e}", script.display()));
        assert!(
            status.success(),
            "`bash tests/launchers/fetch.sh` failed ({status}): the loopback registry's \
             tarballs could not be fetched (it needs Node.js 20 or newer with npm, or NPM set to \
             npm's path, and the npm registry; .ci/run runs it)"
        );
    });
    assert!(
        ready(),
        "fetch.sh ran but {} still does not hold exactly the lock's tarballs",
        dir.display()
    );
    dir
}

/// `tests/launchers/npm` with its `node_modules` installed exactly as locked
/// (`npm ci --prefix tests/launchers/npm`, from the npm registry, once, under
/// `tests/launchers/.install.lock`): a real hoisted project-local install, the server's
/// dependencies (`@modelcontextprotocol/sdk`, ...) beside it. Fails, saying why, if it cannot.
pub fn require_local_install() -> PathBuf {
    let project = project_dir();
    let modules = project.join("node_modules");
    let ready = || {
        [
            "@modelcontextprotocol/server-filesystem",
            "@modelcontextprotocol/sdk",
        ]
        .iter()
        .all(|p| modules.join(p).join("package.json").is_file())
            && modules.join(".bin/mcp-server-filesystem").exists()
    };
    super::peers::install_once(&launchers_dir().join(".install.lock"), ready, || {
        let npm = npm();
        let status = Command::new(&npm)
            .args(["ci", "--no-audit", "--no-fund", "--prefix"])
            .arg(&project)
            .stdin(Stdio::null())
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run `{npm} ci --prefix tests/launchers/npm`: {e} (install Node.js 20 \
                     or newer with npm, or set NPM to its path)"
                )
            });
        assert!(
            status.success(),
            "`{npm} ci --prefix tests/launchers/npm` failed ({status})"
        );
    });
    assert!(
        ready(),
        "npm ci ran but tests/launchers/npm/node_modules is still incomplete"
    );
    project
}

/// The environment that points npm (and `npx`, and an `npm exec` under a broker) at the
/// registry `registry` (a URL: [`NpmRegistry::url`], which stays the cache's key after the
/// registry is dropped) with `cache` as its cache and `home` as `HOME`: no user config (a
/// `.npmrc` in `home`, if any), a global prefix of its own (`home/.npm-global`, so nothing
/// installed globally on the machine satisfies a spec), no audit, fund or update check, no
/// retries, and a proxy that does not exist for every host but 127.0.0.1, so no request leaves
/// loopback. Later entries of the same name win, so a caller can append its own (`npm_config_offline`,
/// another `npm_config_prefix`). Add these to a command after [`clear_npm_env`].
pub fn npm_env(registry: &str, cache: &Path, home: &Path) -> Vec<(String, String)> {
    let path = |p: &Path| p.to_str().expect("utf-8 path").to_owned();
    [
        ("HOME", path(home)),
        ("npm_config_registry", registry.to_owned()),
        ("npm_config_cache", path(cache)),
        ("npm_config_userconfig", path(&home.join(".npmrc"))),
        ("npm_config_prefix", path(&home.join(".npm-global"))),
        ("npm_config_audit", "false".to_owned()),
        ("npm_config_fund", "false".to_owned()),
        ("npm_config_update_notifier", "false".to_owned()),
        // A request that fails (the registry gone, a confined server cut off) fails at once.
        ("npm_config_fetch_retries", "0".to_owned()),
        ("npm_config_proxy", "http://127.0.0.1:9".to_owned()),
        ("npm_config_https_proxy", "http://127.0.0.1:9".to_owned()),
        ("npm_config_noproxy", "127.0.0.1".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Removes from `cmd` every `npm_config_*` variable (any case) the tests inherited, so only
/// [`npm_env`]'s reach npm.
pub fn clear_npm_env(cmd: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        let lower = name.to_string_lossy().to_ascii_lowercase();
        if lower.starts_with("npm_config_") {
            cmd.env_remove(&name);
        }
    }
    cmd
}

/// Runs `cmd` (stdin closed) in a process group of its own and returns its output; past
/// `limit`, kills the group and panics with what it printed.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    use std::os::unix::process::CommandExt as _;
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("stderr")));
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() > end {
            super::procs::kill_group(child.id());
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    let Some(status) = status else {
        panic!(
            "{what} ran longer than {limit:?}; killed.\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        );
    };
    Output {
        status,
        stdout,
        stderr,
    }
}

/// One tarball the registry serves.
struct Tarball {
    bytes: Vec<u8>,
    /// The package's `package.json`.
    manifest: Value,
    /// `sha512-BASE64`.
    integrity: String,
    /// SHA-1, hex.
    shasum: String,
}

/// What the registry serves: packuments by package name, tarballs by file name.
struct Index {
    packuments: HashMap<String, Vec<u8>>,
    tarballs: HashMap<String, Vec<u8>>,
}

/// A loopback npm registry serving the `.tgz` files of one directory; dropped, it stops
/// (its port refuses, its open connections are shut).
pub struct NpmRegistry {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
    /// The requests answered 404.
    misses: Arc<Mutex<Vec<String>>>,
    served: Vec<String>,
    stop: Arc<AtomicBool>,
    /// The open connections, by number, shut when the registry is dropped.
    connections: Arc<Mutex<HashMap<u64, TcpStream>>>,
    accept: Option<JoinHandle<()>>,
}

impl NpmRegistry {
    /// Serves every `*.tgz` in `tarballs` (each with its `package.json` under one top folder,
    /// as npm packs them) on 127.0.0.1 at a port of the system's choosing.
    pub fn start(tarballs: &Path) -> NpmRegistry {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let base = format!("http://{addr}/");
        let mut files: Vec<PathBuf> = std::fs::read_dir(tarballs)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", tarballs.display()))
            .map(|e| e.expect("dir entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "tgz"))
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no .tgz in {}", tarballs.display());
        let loaded: Vec<(String, Tarball)> = std::thread::scope(|s| {
            let handles: Vec<_> = files
                .chunks(files.len().div_ceil(4))
                .map(|chunk| s.spawn(move || chunk.iter().map(|f| load(f)).collect::<Vec<_>>()))
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("load tarballs"))
                .collect()
        });
        let mut versions: BTreeMap<String, Vec<(String, Value)>> = BTreeMap::new();
        let mut served = Vec::new();
        let mut index = Index {
            packuments: HashMap::new(),
            tarballs: HashMap::new(),
        };
        for (file, t) in loaded {
            let name = t.manifest["name"].as_str().expect("name").to_owned();
            let version = t.manifest["version"].as_str().expect("version").to_owned();
            let mut entry = abbreviated(&t.manifest);
            entry.insert(
                "dist".into(),
                json!({
                    "tarball": format!("{base}tarballs/{file}"),
                    "integrity": t.integrity,
                    "shasum": t.shasum,
                }),
            );
            served.push(format!("{name}@{version}"));
            versions
                .entry(name)
                .or_default()
                .push((version, Value::Object(entry)));
            index.tarballs.insert(file, t.bytes);
        }
        for (name, mut list) in versions {
            list.sort_by(|a, b| semver_cmp(&a.0, &b.0));
            let latest = list.last().expect("one version").0.clone();
            let packument = json!({
                "name": name,
                "dist-tags": {"latest": latest},
                "versions": list.into_iter().collect::<Map<String, Value>>(),
            });
            index
                .packuments
                .insert(name, serde_json::to_vec(&packument).expect("packument"));
        }
        served.sort();
        let index = Arc::new(index);
        let requests: Arc<Mutex<Vec<String>>> = Arc::default();
        let misses: Arc<Mutex<Vec<String>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let connections: Arc<Mutex<HashMap<u64, TcpStream>>> = Arc::default();
        let accept = {
            let (requests, misses, stop, connections) = (
                Arc::clone(&requests),
                Arc::clone(&misses),
                Arc::clone(&stop),
                Arc::clone(&connections),
            );
            std::thread::spawn(move || {
                for (id, stream) in (0u64..).zip(listener.incoming()) {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let Ok(clone) = stream.try_clone() else {
                        continue;
                    };
                    connections.lock().unwrap().insert(id, clone);
                    let log = Log {
                        requests: Arc::clone(&requests),
                        misses: Arc::clone(&misses),
                    };
                    let index = Arc::clone(&index);
                    let connections = Arc::clone(&connections);
                    std::thread::spawn(move || {
                        serve(&stream, &index, &log);
                        let _ = stream.shutdown(Shutdown::Both);
                        connections.lock().unwrap().remove(&id);
                    });
                }
            })
        };
        NpmRegistry {
            addr,
            requests,
            misses,
            served,
            stop,
            connections,
            accept: Some(accept),
        }
    }

    /// `http://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The path (and query, if any) of every request so far, in order, as sent
    /// (`/@modelcontextprotocol%2fserver-filesystem`, `/tarballs/zod-4.6.7.tgz`, ...).
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    /// The requests answered 404 so far (a package or tarball it does not hold, or anything
    /// else npm asked: audits, pings, ...), as [`Self::requests`] has them.
    pub fn misses(&self) -> Vec<String> {
        self.misses.lock().unwrap().clone()
    }

    /// The `FILE.tgz` of every tarball asked for so far (served or not).
    pub fn tarballs_fetched(&self) -> Vec<String> {
        self.requests()
            .iter()
            .filter_map(|p| p.strip_prefix("/tarballs/").map(str::to_owned))
            .collect()
    }

    /// Every `name@version` it serves, sorted.
    pub fn served(&self) -> &[String] {
        &self.served
    }
}

impl Drop for NpmRegistry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which sees `stop` and returns, closing the listener.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        for (_, c) in self.connections.lock().unwrap().drain() {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

/// Reads one tarball: its bytes, hashes and `package.json` (`tar`, as the crate has no gzip).
fn load(file: &Path) -> (String, Tarball) {
    let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    let out = Command::new("tar")
        .args(["-xzOf"])
        .arg(file)
        .args([
            "--wildcards",
            "--no-wildcards-match-slash",
            "*/package.json",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| panic!("cannot run tar: {e}"));
    assert!(
        out.status.success(),
        "no package.json in {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{}: package.json: {e}", file.display()));
    let integrity = format!(
        "sha512-{}",
        base64::engine::general_purpose::STANDARD.encode(Sha512::digest(&bytes))
    );
    let shasum = sha1_hex(&bytes);
    let name = file
        .file_name()
        .unwrap()
        .to_str()
        .expect("utf-8")
        .to_owned();
    (
        name,
        Tarball {
            bytes,
            manifest,
            integrity,
            shasum,
        },
    )
}

/// A version's entry in the packument: the fields of `package.json` npm resolves and
/// installs with (as the registry's abbreviated metadata has them), `bin` normalized to an
/// object as the registry stores it, and `hasInstallScript`.
fn abbreviated(manifest: &Value) -> Map<String, Value> {
    const FIELDS: [&str; 16] = [
        "name",
        "version",
        "dependencies",
        "optionalDependencies",
        "peerDependencies",
        "peerDependenciesMeta",
        "bundleDependencies",
        "bundledDependencies",
        "bin",
        "directories",
        "engines",
        "os",
        "cpu",
        "libc",
        "deprecated",
        "license",
    ];
    let mut entry: Map<String, Value> = FIELDS
        .iter()
        .filter_map(|&f| Some((f.to_owned(), manifest.get(f)?.clone())))
        .collect();
    if let Some(Value::String(path)) = manifest.get("bin") {
        let name = manifest["name"].as_str().unwrap_or_default();
        let command = name.rsplit('/').next().unwrap_or(name);
        entry.insert("bin".into(), json!({ command: path }));
    }
    let scripts = &manifest["scripts"];
    if ["preinstall", "install", "postinstall"]
        .iter()
        .any(|s| scripts.get(s).is_some())
    {
        entry.insert("hasInstallScript".into(), Value::Bool(true));
    }
    entry
}

/// Orders `MAJOR.MINOR.PATCH[-PRE][+BUILD]`: numerically, a release after its pre-releases.
fn semver_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn key(v: &str) -> (Vec<u64>, bool, String) {
        let v = v.split('+').next().unwrap_or(v);
        let (core, pre) = v.split_once('-').unwrap_or((v, ""));
        let nums = core.split('.').map(|n| n.parse().unwrap_or(0)).collect();
        (nums, pre.is_empty(), pre.to_owned())
    }
    key(a).cmp(&key(b))
}

/// SHA-1 of `data`, hex (the packument's legacy `shasum`; the crate has no SHA-1).
pub fn sha1_hex(data: &[u8]) -> String {
    let mut h: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 80];
        for (word, bytes) in w.iter_mut().zip(block.chunks_exact(4)) {
            *word = u32::from_be_bytes(bytes.try_into().unwrap());
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*wi);
            (e, d, c, b, a) = (d, c, b.rotate_left(30), a, t);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

/// Where a connection records what it was asked.
struct Log {
    requests: Arc<Mutex<Vec<String>>>,
    misses: Arc<Mutex<Vec<String>>>,
}

/// Answers the requests of one connection (HTTP/1.1, kept alive until the client closes it,
/// asks to close, or is idle for [`IDLE`]).
fn serve(stream: &TcpStream, index: &Index, log: &Log) {
    let _ = stream.set_read_timeout(Some(IDLE));
    let mut writer = stream;
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut parts = line.split_whitespace();
        let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
            return;
        };
        let (method, target) = (method.to_owned(), target.to_owned());
        let http10 = parts.next() == Some("HTTP/1.0");
        let mut length = 0usize;
        let mut close = http10;
        loop {
            let mut header = String::new();
            match reader.read_line(&mut header) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
                if name == "content-length" {
                    length = value.parse().unwrap_or(0);
                } else if name == "connection" {
                    close = value.eq_ignore_ascii_case("close");
                }
            }
        }
        if std::io::copy(&mut (&mut reader).take(length as u64), &mut std::io::sink()).is_err() {
            return;
        }
        log.requests.lock().unwrap().push(target.clone());
        let path = target.split('?').next().unwrap_or_default();
        let found = if method != "GET" && method != "HEAD" {
            None
        } else if let Some(file) = path.strip_prefix("/tarballs/") {
            index
                .tarballs
                .get(file)
                .map(|b| ("application/octet-stream", b))
        } else {
            let name = path
                .trim_start_matches('/')
                .replace("%2f", "/")
                .replace("%2F", "/")
                .replace("%40", "@");
            index.packuments.get(&name).map(|b| ("application/json", b))
        };
        let not_found = br#"{"error":"not found"}"#.to_vec();
        let (status, kind, body) = match found {
            Some((kind, body)) => ("200 OK", kind, body),
            None => {
                log.misses.lock().unwrap().push(target.clone());
                ("404 Not Found", "application/json", &not_found)
            }
        };
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n",
            body.len(),
            if close { "close" } else { "keep-alive" }
        );
        let sent = writer.write_all(head.as_bytes()).and_then(|()| {
            if method == "HEAD" {
                Ok(())
            } else {
                writer.write_all(body)
            }
        });
        if sent.is_err() || close {
            return;
        }
    }
}
