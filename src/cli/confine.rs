//! `fsbroker confine check`: what the kernel supports and what `proxy --confine` would allow
//! and enforce.

use std::path::PathBuf;
use std::process::ExitCode;

use super::running::load_policy;
use super::{RegistryArg, ServeArgs, print};

/// Runs `fsbroker confine check`.
pub(super) fn check(
    args: &ServeArgs,
    fetch: &[RegistryArg],
    command: &[std::ffi::OsString],
) -> ExitCode {
    let mut refused = false;
    use fsbroker::confine::{Access, kernel};
    let policy = match load_policy(args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("fsbroker: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let path = std::env::var_os("PATH");
    let tmp = std::env::temp_dir().join("fsbroker-server-XXXXXX");
    let plan = match fsbroker::confine::plan(&policy, command, &cwd, path.as_deref(), Some(&tmp)) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("fsbroker: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (kernel_abi, abi) = (kernel::kernel_abi(), kernel::abi());
    let mut out = String::new();
    let lowered = if abi < kernel_abi {
        format!(" (used as {abi}: {} is set)", kernel::ABI_ENV)
    } else {
        String::new()
    };
    out.push_str(&format!("Landlock: kernel ABI {kernel_abi}{lowered}\n"));
    for f in kernel::Feature::ALL {
        let mark = if abi >= f.abi() { "yes" } else { "no " };
        out.push_str(&format!("  [{mark}] ABI {}: {}\n", f.abi(), f.describe()));
    }
    if let Some(launch) = &plan.launch {
        out.push_str(&format!("\nLauncher: {}\n", launch.launcher));
        for line in &launch.resolved {
            out.push_str(&format!("  - {line}\n"));
        }
        if let Some(missing) = &launch.missing {
            let allowed = RegistryArg::all(fetch)
                .iter()
                .chain(&policy.confine().fetch)
                .any(|r| *r == missing.registry);
            if allowed {
                out.push_str(&format!(
                    "  - before the server starts, fsbroker would install {} into {} (the \
                     {} registry, with the network, running none of its code; the server \
                     itself gets no network)\n",
                    missing.package,
                    missing.cache.display(),
                    missing.registry.name()
                ));
            } else {
                refused = true;
                out.push_str(&format!(
                    "  - the start would be refused: {}\n",
                    missing.instead
                ));
            }
        }
    }
    out.push_str(&format!(
        "\nThe server would be allowed ({}):\n",
        if command.is_empty() {
            "roots only: give the server's command after -- to see what it needs to run"
        } else {
            "its roots, what it needs to run, its TMPDIR"
        }
    ));
    for r in &plan.rules {
        let access = match r.access {
            Access::Read => "read",
            Access::ReadExec => "read+exec",
            Access::ReadWrite => "read-write",
            Access::Device => "device",
        };
        out.push_str(&format!(
            "  {access:<10}  {}  ({})\n",
            r.path.display(),
            r.why
        ));
    }
    if !plan.narrowed.is_empty() {
        out.push_str(
            "\nAsked for, but too broad, or reached through a link the server could have made \
             (narrowed or left out):\n",
        );
        for n in &plan.narrowed {
            out.push_str(&format!("  - {n}\n"));
        }
    }
    if !plan.withheld.is_empty() {
        out.push_str("\nWithheld (nothing allowed):\n");
        for w in &plan.withheld {
            out.push_str(&format!("  {}  ({})\n", w.path.display(), w.why));
        }
    }
    out.push_str(&format!(
        "\nTCP: {}\n",
        if plan.net {
            "allowed ([confine] net = true)"
        } else {
            "refused"
        }
    ));
    let gaps = plan.gaps(abi);
    if gaps.rules.is_empty() {
        out.push_str("\nEvery rule is enforced: --confine=strict would start the server.\n");
    } else {
        out.push_str("\nNot enforced (--confine=strict would refuse to start):\n");
        for g in &gaps.rules {
            out.push_str(&format!("  - {g}\n"));
        }
    }
    if !gaps.hardening.is_empty() {
        out.push_str("\nHardening this kernel lacks (never refused for):\n");
        for g in &gaps.hardening {
            out.push_str(&format!("  - {g}\n"));
        }
    }
    let mode = match policy.confine().mode {
        fsbroker::policy::ConfineMode::Off => "off (proxy --confine turns it on)",
        fsbroker::policy::ConfineMode::BestEffort => "best-effort",
        fsbroker::policy::ConfineMode::Strict => "strict",
    };
    out.push_str(&format!("\nThe policy's [confine] mode: {mode}\n"));
    print(&out);
    if refused {
        return ExitCode::from(2);
    }
    if gaps.rules.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}
