//! The layer rule of `src/lib.rs` ("each layer imports only the layers below it"), checked:
//! every `crate::` path in the library's source is an edge between two top-level modules,
//! and each edge must be one the table below allows. The table itself must have no circle.
//!
//! The same rule holds inside the folders that have layers of their own (`policy/`,
//! `transport/`, `methods/`, `transport/proxy/remote/`: [`INSIDE`]), and no folder of the library has files that use
//! each other in a circle ([`KNOWN_CIRCLES`] lists the ones still to break).
//!
//! A new module goes into the table with what it may use; a new edge means deciding that the
//! module above may lean on the one below (and never the other way round).

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each module of the library and the modules it may import, lowest layers first. The
/// programs (`cli`, `bench`, `console`, `main.rs`) are not the library's and are not listed.
const ALLOWED: &[(&str, &[&str])] = &[
    ("limits", &[]),
    ("random", &[]),
    ("rfc3339", &[]),
    ("error", &[]),
    ("codec", &[]),
    ("buffers", &[]),
    ("digest", &[]),
    ("rundir", &["limits", "random"]),
    ("sandbox", &["error", "limits", "random"]),
    (
        "policy",
        &["digest", "error", "limits", "rundir", "sandbox"],
    ),
    ("throttle", &["error", "policy"]),
    (
        "consent",
        &["error", "limits", "policy", "sandbox", "throttle"],
    ),
    ("locks", &["error", "random"]),
    ("fair", &[]),
    (
        "audit",
        &["digest", "limits", "policy", "rfc3339", "rundir", "sandbox"],
    ),
    ("outgoing", &["limits"]),
    ("jsonrpc", &["error", "outgoing", "random"]),
    (
        "fast",
        &["audit", "error", "jsonrpc", "throttle", "outgoing"],
    ),
    ("upload", &["error", "locks", "sandbox"]),
    (
        "watch",
        &[
            "consent", "error", "jsonrpc", "limits", "policy", "random", "rfc3339", "sandbox",
            "throttle",
        ],
    ),
    ("confine", &["limits", "policy", "random", "sandbox"]),
    (
        "broker",
        &[
            "audit", "consent", "fair", "fast", "limits", "locks", "policy", "random", "rundir",
            "sandbox", "throttle", "watch",
        ],
    ),
    (
        "session",
        &["broker", "consent", "limits", "outgoing", "upload", "watch"],
    ),
    (
        "methods",
        &[
            "audit", "broker", "buffers", "codec", "consent", "digest", "error", "fair", "fast",
            "jsonrpc", "limits", "locks", "outgoing", "policy", "rfc3339", "sandbox", "session",
            "throttle", "upload", "watch",
        ],
    ),
    (
        "host",
        &[
            "audit", "broker", "buffers", "fast", "jsonrpc", "limits", "methods", "outgoing",
            "session",
        ],
    ),
    (
        "transport",
        &[
            "audit", "broker", "buffers", "confine", "error", "fast", "host", "jsonrpc", "limits",
            "methods", "outgoing", "policy", "random", "rundir",
        ],
    ),
    // Built only for `cargo fuzz` and for `cargo test`: what they check of the private layers.
    ("fuzzing", &["jsonrpc", "transport"]),
    ("properties", &["codec", "error", "jsonrpc", "transport"]),
];

/// Modules and the modules each may use, lowest first.
type Table = &'static [(&'static str, &'static [&'static str])];

/// Inside a folder: each of its submodules (its files and folders, `mod.rs` aside) and the
/// siblings it may use, lowest first. A folder's `mod.rs` is its table of contents and may use
/// any of them; every submodule may use what `mod.rs` itself defines (a name `mod.rs` only
/// re-exports counts as the submodule's it comes from).
const INSIDE: &[(&str, Table)] = &[
    (
        "policy",
        &[
            // The file as written (and how its paths read), then what each part becomes.
            ("file", &[]),
            ("limits", &["file"]),
            ("config", &["file"]),
            // The administrator's bounds, applied as the rest is compiled.
            ("managed", &["file", "limits"]),
            ("compiled", &["config", "file", "limits", "managed"]),
        ],
    ),
    (
        "transport",
        &[
            ("framing", &[]),
            ("pipe", &[]),
            ("driver", &[]),
            ("lenient", &[]),
            ("pending", &["lenient"]),
            ("modern", &["lenient"]),
            ("serve", &["driver", "framing", "pipe"]),
            ("relay", &["serve"]),
            ("listen", &["pipe", "serve"]),
            ("eras", &["lenient", "modern", "pending", "relay"]),
            (
                "proxy",
                &[
                    "driver", "eras", "framing", "lenient", "modern", "pending", "pipe", "relay",
                    "serve",
                ],
            ),
        ],
    ),
    (
        // A remote server's client: its parts lean on those before them (as the methods on
        // `Remote` each part adds call only those of the parts before it, which this scan
        // of paths cannot see: `remote/mod.rs` says so).
        "transport/proxy/remote",
        &[
            ("given", &[]),
            ("client", &["given"]),
            // Signing in when the server answers 401, on the same client.
            ("auth", &["client", "given"]),
            ("options", &["auth", "given"]),
            ("http", &["auth", "client", "given"]),
            ("sse", &[]),
            ("reads", &[]),
            ("session", &[]),
            ("failure", &["given", "http", "sse"]),
            ("requests", &[]),
            ("inbound", &["failure", "reads"]),
            ("streams", &["failure", "session", "sse"]),
            (
                "exchange",
                &["failure", "http", "session", "sse", "streams"],
            ),
            ("pump", &["exchange", "failure"]),
        ],
    ),
    (
        // Signing in: the sign-in's HTTP, then what finds the authorization server on it,
        // and the browser's side (which shows server-made words as `discover` does); signing
        // out revokes the cache's grants over the same HTTP.
        "transport/proxy/remote/auth",
        &[
            ("board", &[]),
            ("cache", &[]),
            ("fetch", &[]),
            ("discover", &["fetch"]),
            ("browser", &["discover"]),
            ("revoke", &["cache", "discover", "fetch"]),
        ],
    ),
    (
        "methods",
        &[
            // An operation's runtime and a request's way to its answer; then one module per
            // method, each leaning on `op` only (`roots/list` places a person's narrowed
            // folders as `files/consent` does).
            ("op", &[]),
            ("call", &["op"]),
            ("ping", &["op"]),
            ("checksum", &["op"]),
            ("consent", &["op"]),
            ("create", &["op"]),
            ("delete", &["op"]),
            ("list", &["op"]),
            ("read", &["op"]),
            ("rename", &["op"]),
            ("roots", &["consent", "op"]),
            ("unlock", &["op"]),
            ("watch", &["op"]),
            ("write", &["op"]),
        ],
    ),
];

/// Folders of the library whose files still use each other in a circle: debts to pay, each
/// listed so that a new circle anywhere else fails, and so that this list shrinks (a folder
/// listed here without a circle fails too).
const KNOWN_CIRCLES: &[&str] = &["confine", "watch"];

/// Files that are the programs, not the library.
fn is_program(rel: &Path) -> bool {
    rel == Path::new("main.rs")
        || rel.starts_with("cli")
        || rel.starts_with("bench")
        || rel.starts_with("console")
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments (`//` to the end of the line, outside strings).
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = ' ';
        let mut cut = line.len();
        for (i, c) in line.char_indices() {
            if c == '"' && prev != '\\' {
                in_str = !in_str;
            }
            if !in_str && c == '/' && prev == '/' {
                cut = i - 1;
                break;
            }
            prev = c;
        }
        out.push_str(&line[..cut]);
        out.push('\n');
    }
    out
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level modules a file's code names through `crate::`.
fn uses(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            // `use crate::{a, b::c, d::{e, f}}`: the first name of each item at depth one.
            let mut depth = 1;
            let mut start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => start = true,
                    c if start && depth == 1 && !c.is_whitespace() => {
                        start = false;
                        found.insert(ident_at(&group[i..]).to_owned());
                    }
                    _ => {}
                }
            }
        } else {
            found.insert(ident_at(after).to_owned());
        }
        rest = after;
    }
    found.retain(|m| !m.is_empty());
    found
}

#[test]
fn every_crate_path_follows_the_layer_table() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let table: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(m, allowed)| (*m, allowed.iter().copied().collect()))
        .collect();
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut bad = Vec::new();
    let mut edges = 0;
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        if is_program(rel) || rel == Path::new("lib.rs") {
            continue;
        }
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap();
        let module = first.strip_suffix(".rs").unwrap_or(first);
        let Some(allowed) = table.get(module) else {
            bad.push(format!(
                "{}: module {module:?} is not in the layer table",
                rel.display()
            ));
            continue;
        };
        for used in uses(&code(&std::fs::read_to_string(file).unwrap())) {
            if used == module {
                continue;
            }
            edges += 1;
            if !allowed.contains(used.as_str()) {
                bad.push(format!(
                    "{}: {module} uses crate::{used}, which the layer table does not allow",
                    rel.display()
                ));
            }
        }
    }
    println!("{} files, {edges} edges checked", files.len());
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_layer_table_has_no_circle_and_only_real_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let names: BTreeSet<&str> = ALLOWED.iter().map(|(m, _)| *m).collect();
    // Listed lowest first: each module may use only modules listed before it.
    let mut seen = BTreeSet::new();
    for (module, allowed) in ALLOWED {
        for a in *allowed {
            assert!(
                names.contains(a),
                "{module} may use {a}, which is not a module"
            );
            assert!(
                seen.contains(a),
                "{module} may use {a}, which is listed after it: a circle is possible"
            );
        }
        seen.insert(*module);
        assert!(
            src.join(format!("{module}.rs")).exists() || src.join(module).join("mod.rs").exists(),
            "{module} is not a module of src/"
        );
    }
}

#[test]
fn the_scanner_reads_grouped_and_nested_uses() {
    let found = uses("use crate::{a, b::c, d::{e, f}};\nlet x = crate::g::h(); // crate::z\n");
    let want: BTreeSet<String> = ["a", "b", "d", "g", "z"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(found, want);
    assert_eq!(uses(&code("let x = 1; // crate::z\n")), BTreeSet::new());
    assert_eq!(
        uses(&code("let u = \"http://x\"; crate::q::r();\n")).len(),
        1
    );
}

// ---------------------------------------------------------------------------------------------
// Inside folders
// ---------------------------------------------------------------------------------------------

/// A file's module path below `src/` (`transport/proxy/lines.rs` → `transport`, `proxy`,
/// `lines`; a `mod.rs` is its folder).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_str().unwrap().to_owned())
        .collect();
    let last = parts.pop().unwrap();
    let last = last.strip_suffix(".rs").unwrap();
    if last != "mod" {
        parts.push(last.to_owned());
    }
    parts
}

/// `code` without the inline test modules at the end of a file (`#[cfg(test)] mod tests
/// {`), whose `super::` is the file itself, not its parent.
fn without_test_modules(code: &str) -> &str {
    let lines: Vec<&str> = code.split('\n').collect();
    let mut offset = 0;
    for (i, line) in lines.iter().enumerate() {
        if *line == "#[cfg(test)]" {
            let next = lines[i + 1..]
                .iter()
                .find(|l| !l.trim_start().starts_with("#["));
            if next.is_some_and(|l| l.starts_with("mod ") && l.trim_end().ends_with('{')) {
                return &code[..offset];
            }
        }
        offset += line.len() + 1;
    }
    code
}

/// Every path through `crate::`, `super::` or `self::` in `code`, as its segments (a group
/// `super::{a, b::c}` gives each of its paths).
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(start) {
            let before = at.checked_sub(1).map(|i| bytes[i]);
            if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':') {
                continue;
            }
            path_at(&code[at..], Vec::new(), &mut out);
        }
    }
    out
}

/// The paths written at the start of `text`, after `prefix`.
fn path_at(text: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut segments = prefix;
    let mut rest = text.trim_start();
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' | ',' if depth == 1 => {
                        let piece = group[item..i].trim();
                        if !piece.is_empty() {
                            path_at(piece, segments.clone(), out);
                        }
                        item = i + 1;
                        if c == '}' {
                            return;
                        }
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            return;
        }
        let name = if rest.starts_with('*') {
            "*"
        } else {
            ident_at(rest)
        };
        if name.is_empty() {
            break;
        }
        segments.push(name.to_owned());
        rest = &rest[name.len()..];
        match rest.strip_prefix("::") {
            Some(after) => rest = after.trim_start(),
            None => break,
        }
    }
    if !segments.is_empty() {
        out.push(segments);
    }
}

/// `segments` written in the module `module`, as a path from the crate's root.
fn resolve(module: &[String], segments: &[String]) -> Vec<String> {
    let mut at = module.to_vec();
    let mut rest = segments;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            at.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        _ => {}
    }
    while rest.first().is_some_and(|s| s == "super") {
        at.pop();
        rest = &rest[1..];
    }
    at.extend(rest.iter().cloned());
    at
}

/// The submodules of `folder` (below `src/`), `mod.rs` aside.
fn submodules(src: &Path, folder: &str) -> BTreeSet<String> {
    let mut subs = BTreeSet::new();
    for entry in std::fs::read_dir(src.join(folder)).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap();
        if path.is_dir() && path.join("mod.rs").exists() {
            subs.insert(name.to_owned());
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem != "mod" {
                subs.insert(stem.to_owned());
            }
        }
    }
    subs
}

/// The names `folder/mod.rs` imports from its submodules (`pub use compiled::{Policy}`), each
/// with the submodule it comes from.
fn imported_names(src: &Path, folder: &str, subs: &BTreeSet<String>) -> BTreeMap<String, String> {
    let text = code(&std::fs::read_to_string(src.join(folder).join("mod.rs")).unwrap());
    let mut names = BTreeMap::new();
    for statement in text.split(';') {
        // Without its attributes (`#[cfg(test)]`).
        let statement: Vec<&str> = statement
            .lines()
            .filter(|l| !l.trim_start().starts_with("#["))
            .collect();
        let statement = statement.join("\n");
        let statement = statement.trim();
        let Some(at) = statement.find("use ") else {
            continue;
        };
        if !(at == 0 || statement[..at].trim_start().starts_with("pub")) {
            continue;
        }
        let path = statement[at + 4..].trim();
        let from = ident_at(path);
        if !subs.contains(from) {
            continue;
        }
        let mut found = Vec::new();
        path_at(path, Vec::new(), &mut found);
        for segments in found {
            if let Some(last) = segments.last().filter(|_| segments.len() > 1) {
                names.insert(last.clone(), from.to_owned());
            }
        }
    }
    names
}

/// The edges between the submodules of `folder`: for each, the siblings it uses, each with
/// a path that uses it.
fn folder_edges(src: &Path, folder: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let subs = submodules(src, folder);
    let names = imported_names(src, folder, &subs);
    let base: Vec<String> = folder.split('/').map(str::to_owned).collect();
    let mut files = Vec::new();
    sources(&src.join(folder), &mut files);
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap();
        let module = module_path(rel);
        let Some(unit) = module.get(base.len()) else {
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        let text = code(&text);
        for segments in crate_paths(without_test_modules(&text)) {
            let path = resolve(&module, &segments);
            if path.len() <= base.len() || path[..base.len()] != base[..] {
                continue;
            }
            let name = &path[base.len()];
            let used = if subs.contains(name) {
                name
            } else {
                match names.get(name) {
                    Some(from) => from,
                    None => continue,
                }
            };
            if used != unit {
                edges
                    .entry(unit.clone())
                    .or_default()
                    .entry(used.clone())
                    .or_insert_with(|| format!("{}: {}", rel.display(), segments.join("::")));
            }
        }
    }
    edges
}

/// A circle among `edges`, if there is one (its modules, in order).
fn circle(edges: &BTreeMap<String, BTreeMap<String, String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeMap<String, String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            return Some(path[at..].to_vec());
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in edges.get(node).into_iter().flat_map(BTreeMap::keys) {
            if let Some(found) = visit(next, edges, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|node| visit(node, edges, &mut Vec::new(), &mut done))
}

#[test]
fn every_edge_inside_a_layered_folder_follows_its_table() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut bad = Vec::new();
    for (folder, table) in INSIDE {
        let listed: BTreeSet<String> = table.iter().map(|(m, _)| m.to_string()).collect();
        let subs = submodules(&src, folder);
        for missing in subs.difference(&listed) {
            bad.push(format!("{folder}/{missing} is not in {folder}'s table"));
        }
        for gone in listed.difference(&subs) {
            bad.push(format!(
                "{folder}'s table lists {gone}, which is not a module of it"
            ));
        }
        let mut seen = BTreeSet::new();
        for (module, allowed) in *table {
            for a in *allowed {
                assert!(
                    seen.contains(a),
                    "{folder}/{module} may use {a}, which is listed after it: a circle is possible"
                );
            }
            seen.insert(*module);
        }
        let allowed: BTreeMap<&str, &[&str]> = table.iter().copied().collect();
        for (module, used) in folder_edges(&src, folder) {
            for (other, example) in used {
                let ok = allowed
                    .get(module.as_str())
                    .is_some_and(|a| a.contains(&other.as_str()));
                if !ok {
                    bad.push(format!(
                        "{folder}/{module} uses {folder}/{other}, which its table does not allow ({example})"
                    ));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn no_folder_has_files_in_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut folders = Vec::new();
    let mut files = Vec::new();
    sources(&src, &mut files);
    for file in files {
        let rel = file.strip_prefix(&src).unwrap();
        if rel.file_name().is_some_and(|n| n == "mod.rs") && !is_program(rel) {
            folders.push(rel.parent().unwrap().to_str().unwrap().to_owned());
        }
    }
    let mut bad = Vec::new();
    for folder in &folders {
        let found = circle(&folder_edges(&src, folder));
        let known = KNOWN_CIRCLES.contains(&folder.as_str());
        match (found, known) {
            (Some(circle), false) => bad.push(format!(
                "{folder}: {} use each other in a circle",
                circle.join(" → ")
            )),
            (None, true) => bad.push(format!(
                "{folder} has no circle any more: take it out of KNOWN_CIRCLES"
            )),
            _ => {}
        }
    }
    for known in KNOWN_CIRCLES {
        assert!(
            folders.contains(&known.to_string()),
            "{known} is not a folder"
        );
    }
    println!("{} folders checked", folders.len());
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_folder_scanner_resolves_relative_paths_and_groups() {
    let mut found = Vec::new();
    path_at("super::{a, b::c, d::{e, f}}", Vec::new(), &mut found);
    let found: Vec<String> = found.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        found,
        ["super::a", "super::b::c", "super::d::e", "super::d::f"]
    );
    let here: Vec<String> = ["transport", "proxy", "lines"].map(String::from).to_vec();
    let path = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    assert_eq!(
        resolve(&here, &path("super::super::lenient::RequestId")),
        path("transport::lenient::RequestId")
    );
    assert_eq!(resolve(&here, &path("crate::limits::X")), path("limits::X"));
    assert_eq!(
        module_path(Path::new("transport/proxy/mod.rs")),
        ["transport", "proxy"]
    );
    let code = "use super::x;\n#[cfg(test)]\n#[allow(y)]\nmod tests {\n    use super::z;\n}\n";
    assert_eq!(crate_paths(without_test_modules(code)).len(), 1);
}
