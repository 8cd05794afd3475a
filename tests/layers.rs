//! The layer rule of `src/lib.rs` ("each layer imports only the layers below it"), checked:
//! every `crate::` path in the library's source is an edge between two top-level modules,
//! and each edge must be one the table below allows. The table itself must have no circle.
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
    ("policy", &["error", "limits", "rundir", "sandbox"]),
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
            "broker", "buffers", "confine", "error", "fast", "host", "jsonrpc", "limits",
            "methods", "outgoing", "policy", "random", "rundir",
        ],
    ),
    // Built only for `cargo fuzz` and for `cargo test`: what they check of the private layers.
    ("fuzzing", &["jsonrpc", "transport"]),
    ("properties", &["codec", "error", "jsonrpc", "transport"]),
];

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
