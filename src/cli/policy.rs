//! `fsbroker policy check` and `policy schema`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use fsbroker::policy::{Overrides, Policy, PolicyFile};
use fsbroker::sandbox::{ConsentMode, Mode};

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

/// Runs `fsbroker policy check --managed FILE`: a managed policy checked before it is deployed.
#[allow(clippy::disallowed_methods)] // the administrator's file, named on the command line
pub(super) fn check_managed(file: PathBuf) -> ExitCode {
    use fsbroker::policy::{MANAGED_PATH, Managed};
    let at_system_path = std::fs::canonicalize(&file).is_ok_and(|p| p == Path::new(MANAGED_PATH));
    let loaded = if at_system_path {
        // Where brokers read it: checked as they check it, owner and mode included.
        Managed::system().and_then(|m| {
            m.ok_or_else(|| fsbroker::policy::PolicyError::Managed {
                path: file.clone(),
                reason: "it disappeared while being checked".into(),
            })
        })
    } else {
        std::fs::read(&file)
            .map_err(|source| fsbroker::policy::PolicyError::Read {
                path: file.clone(),
                source,
            })
            .and_then(|bytes| Managed::from_bytes(bytes, &file))
    };
    match loaded {
        Ok(m) => {
            let f = &m.file;
            let mut text = format!(
                "{}: ok, a managed policy (sha256 {})\n",
                file.display(),
                m.sha256
            );
            if let Some(within) = m.within() {
                text += &format!("  roots within: {}\n", paths(within));
            }
            if !m.read_only().is_empty() {
                text += &format!("  read-only: {}\n", paths(m.read_only()));
            }
            if !m.consent().is_empty() {
                text += &format!("  consent always: {}\n", paths(m.consent()));
            }
            if !f.roots.deny.is_empty() {
                text += &format!("  deny: {}\n", f.roots.deny.join(" "));
            }
            for (key, ceiling) in f.limits.entries() {
                text += &format!("  [limits] {key} at most {ceiling}\n");
            }
            if f.audit.required || !f.audit.copies.is_empty() {
                let copies: Vec<&str> = f.audit.copies.iter().map(|c| c.name()).collect();
                text += &format!(
                    "  audit required{}\n",
                    if copies.is_empty() {
                        String::new()
                    } else {
                        format!(", with copies to {}", copies.join(", "))
                    }
                );
            }
            if f.confine.required != fsbroker::policy::ConfineMode::Off {
                text += &format!("  confinement required: {:?}\n", f.confine.required);
            }
            if let Some(list) = &f.servers.allow {
                let list: Vec<String> = list
                    .iter()
                    .map(|a| a.path().display().to_string())
                    .collect();
                text += &format!("  servers allowed: {}\n", list.join(", "));
            }
            if let Some(list) = &f.remote.allow {
                text += &format!("  remote servers allowed: {}\n", list.join(", "));
            }
            if f.console.required {
                text += "  console required\n";
            }
            if !at_system_path {
                text += &format!(
                    "  deploy it as {MANAGED_PATH}, owned by root, mode 0644 (writable by root only)\n"
                );
            }
            print(&text)
        }
        Err(e) => {
            eprintln!("fsbroker: {e}");
            ExitCode::FAILURE
        }
    }
}

fn paths(list: &[PathBuf]) -> String {
    list.iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs `fsbroker policy schema [--managed]`.
pub(super) fn schema(managed: bool) -> ExitCode {
    let schema = if managed {
        fsbroker::policy::Managed::json_schema()
    } else {
        PolicyFile::json_schema()
    };
    print(&format!("{schema:#}\n"))
}

/// Runs `fsbroker policy explain`: the effective rules, each marked with where it comes from.
#[allow(clippy::disallowed_methods)] // the `--root` flags, resolved as the policy resolves them
pub(super) fn explain(args: &super::ServeArgs) -> ExitCode {
    let overrides = super::running::overrides(args);
    let (policy, refused) =
        match fsbroker::policy::Policy::load_narrowed(args.policy.as_deref(), &overrides) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("fsbroker: {e}");
                return ExitCode::FAILURE;
            }
        };
    let managed = policy.managed().cloned();
    let mut out = String::new();
    match &managed {
        Some(m) => {
            out += &format!(
                "managed policy: {} (sha256 {}): set by your organisation; nothing below \
                 marked [managed] can be lifted\n",
                fsbroker::policy::MANAGED_PATH,
                m.sha256
            );
        }
        None => {
            out += &format!(
                "managed policy: none ({} is absent)\n",
                fsbroker::policy::MANAGED_PATH
            )
        }
    }
    match args.policy.as_deref() {
        Some(p) => out += &format!("policy file: {}\n", p.display()),
        None => out += "policy file: none\n",
    }
    let m = managed.as_deref();
    if let Some(within) = m.and_then(|m| m.within()) {
        out += &format!(
            "roots must lie within: {} [managed: [roots] within]\n",
            if within.is_empty() {
                "nowhere (no roots allowed)".to_owned()
            } else {
                within
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
    }
    let flag_roots: Vec<std::path::PathBuf> = args
        .roots
        .iter()
        .filter_map(|r| std::fs::canonicalize(r).ok())
        .collect();
    out += &format!("roots: {}\n", policy.roots().len());
    for r in policy.roots() {
        let from_flag = flag_roots.iter().any(|p| p == r.path());
        let origin = if from_flag {
            "[flag --root]"
        } else {
            "[policy]"
        };
        out += &format!("  {} = {} {origin}\n", r.name(), r.path().display());
        let mode = match r.mode() {
            Mode::ReadOnly => "read-only",
            Mode::ReadWrite => "read-write",
        };
        let mode_from = match m.and_then(|m| m.read_only_at(r.path())) {
            Some(p) => format!("[managed: [roots] read_only {}]", p.display()),
            None if from_flag && args.read_write => "[flag --read-write]".to_owned(),
            None if from_flag => "[default]".to_owned(),
            None => "[policy]".to_owned(),
        };
        out += &format!("    mode {mode} {mode_from}\n");
        let consent = match r.consent() {
            ConsentMode::Auto => "auto",
            ConsentMode::Prompt => "prompt",
            ConsentMode::Deny => "deny",
        };
        let consent_from = match m.and_then(|m| m.consent_at(r.path())) {
            Some(p) => format!("[managed: [roots] consent {}]", p.display()),
            None if args.consent.is_some() => "[flag --consent]".to_owned(),
            None if from_flag => "[default]".to_owned(),
            None => "[policy]".to_owned(),
        };
        out += &format!("    consent {consent} {consent_from}\n");
        for (at, mode, consent) in r.managed_parts().iter().filter(|(at, ..)| !at.is_empty()) {
            if *mode == Mode::ReadOnly {
                out += &format!("    {at}: read-only [managed: [roots] read_only]\n");
            }
            if *consent == ConsentMode::Prompt {
                out += &format!("    {at}: needs consent [managed: [roots] consent]\n");
            }
        }
        for glob in r.managed_deny().patterns() {
            out += &format!("    deny {glob} [managed: [roots] deny]\n");
        }
        for glob in r.deny().patterns() {
            out += &format!("    deny {glob} [policy]\n");
        }
    }
    out += "limits:\n";
    let limits = serde_json::to_value(fsbroker::policy::LimitsFile::default()).unwrap_or_default();
    let ceilings: std::collections::BTreeMap<&str, u64> = m
        .map(|m| m.file.limits.entries().into_iter().collect())
        .unwrap_or_default();
    let l = policy.limits();
    let effective: Vec<(&str, u128)> = vec![
        ("chunk_size", l.chunk_size as u128),
        ("max_chunk_size", l.max_chunk_size as u128),
        ("max_file_size", l.max_file_size.into()),
        ("timeout_ms", l.timeout.as_millis()),
        ("requests_per_second", l.requests_per_second.into()),
        ("request_burst", l.request_burst.into()),
        ("bytes_per_second", l.bytes_per_second.into()),
        ("max_watches", l.max_watches.into()),
        ("max_list_entries", l.max_list_entries as u128),
        ("max_locks", l.max_locks.into()),
        ("lock_timeout_ms", l.lock_timeout.as_millis()),
        ("max_in_flight", l.max_in_flight as u128),
        ("max_uploads", l.max_uploads as u128),
        ("max_sessions", l.max_sessions as u128),
        ("max_pending_input", l.max_pending_input as u128),
    ];
    for (key, value) in effective {
        let default = limits.get(key).and_then(serde_json::Value::as_u64);
        let from = match ceilings.get(key) {
            Some(c) if u128::from(*c) == value => format!("[managed: ceiling {c}]"),
            Some(c) => format!("[policy; managed ceiling {c}]"),
            None if default.map(u128::from) == Some(value) => "[default]".to_owned(),
            None => "[policy]".to_owned(),
        };
        out += &format!("  {key} = {value} {from}\n");
    }
    let audit_rules = m.map(|m| &m.file.audit);
    let required = audit_rules.is_some_and(|a| a.required || !a.copies.is_empty());
    match policy.audit() {
        Some(a) => {
            let from = if args.audit.is_some() {
                "[flag --audit]"
            } else {
                "[policy]"
            };
            out += &format!("audit: {} {from}", a.path.display());
            if required {
                out += " (required [managed: [audit] required])";
            }
            out += "\n";
            for copy in &a.copies {
                let (name, kind) = match copy {
                    fsbroker::policy::CopyConfig::Syslog { socket, .. } => {
                        (format!("syslog {}", socket.display()), "syslog")
                    }
                    fsbroker::policy::CopyConfig::Journald { socket } => {
                        (format!("journald {}", socket.display()), "journald")
                    }
                };
                let forced = audit_rules.is_some_and(|r| r.copies.iter().any(|c| c.name() == kind));
                out += &format!(
                    "  copy to {name} {}\n",
                    if forced {
                        "[policy; required by managed: [audit] copies]"
                    } else {
                        "[policy]"
                    }
                );
            }
            if a.require_copies {
                let from = if audit_rules.is_some_and(|r| r.require_copies) {
                    "[managed: [audit] require_copies]"
                } else {
                    "[policy]"
                };
                out += &format!("  requests refused while a copy is lost {from}\n");
            }
        }
        None => out += "audit: off\n",
    }
    let confine = fsbroker::confine::mode(None, &policy);
    let name = |c: fsbroker::policy::ConfineMode| match c {
        fsbroker::policy::ConfineMode::Off => "off",
        fsbroker::policy::ConfineMode::BestEffort => "best-effort",
        fsbroker::policy::ConfineMode::Strict => "strict",
    };
    out += &format!("confine (proxy -- SERVER): {} [policy]", name(confine));
    if let Some(required) = m
        .map(|m| m.file.confine.required)
        .filter(|r| *r != fsbroker::policy::ConfineMode::Off)
    {
        out += &format!(
            "; at least {} required [managed: [confine] required]",
            name(required)
        );
    }
    out += "\n";
    let c = policy.confine();
    for (key, paths) in [("read", &c.read), ("write", &c.write)] {
        for p in paths {
            out += &format!(
                "  a confined server may also {key} {} [policy]\n",
                p.display()
            );
        }
    }
    if c.net {
        out += "  a confined server may use the network [policy]\n";
    } else if m.is_some_and(|m| m.file.confine.net == Some(false)) {
        out += "  no network for confined servers [managed: [confine] net]\n";
    }
    if c.on_revoke == fsbroker::policy::OnRevoke::Keep {
        out += "  a confined server keeps revoked access until it restarts [policy]\n";
    }
    match m.and_then(|m| m.file.servers.allow.as_ref()) {
        Some(list) => {
            out += "servers allowed (proxy -- SERVER) [managed: [servers] allow]:\n";
            for s in list {
                out += &format!(
                    "  {}{}{}\n",
                    s.interpreter()
                        .map(|i| format!("{} ", i.display()))
                        .unwrap_or_default(),
                    s.path().display(),
                    s.sha256()
                        .map(|h| format!(" (sha256 {h})"))
                        .unwrap_or_default()
                );
            }
        }
        None => out += "servers allowed (proxy -- SERVER): any\n",
    }
    match m.and_then(|m| m.file.remote.allow.as_ref()) {
        Some(list) => {
            out += &format!(
                "remote servers allowed (proxy --url): {} [managed: [remote] allow]\n",
                list.join(", ")
            )
        }
        None => out += "remote servers allowed (proxy --url): any\n",
    }
    let console_required = m.is_some_and(|m| m.file.console.required);
    out += &format!(
        "console: {}\n",
        if console_required {
            "on [managed: [console] required]"
        } else if args.console.is_some() {
            "on [flag --console]"
        } else if policy.console().enabled {
            "on [policy]"
        } else {
            "off [default]"
        }
    );
    for no in &refused {
        out += &format!("refused: {} [managed: {}]\n", no.reason, no.rule);
    }
    let code = print(&out);
    if refused.is_empty() {
        code
    } else {
        ExitCode::FAILURE
    }
}
