//! Landlock, the kernel side of `--confine`: which ABI the kernel offers, what each ABI can
//! enforce, the ruleset built from a [`Plan`], and the two system calls the
//! server's process makes on itself before it runs the server.
//!
//! The ruleset is built in the proxy, before the fork: opening paths and adding rules
//! allocate, which a child forked from a many-threaded process must not do. The child only
//! calls `prctl(PR_SET_NO_NEW_PRIVS)` and `landlock_restrict_self(2)` on the ruleset's file
//! descriptor (`restrict_self`); the domain then holds for the server and everything it
//! starts, and cannot be lifted.

use std::io;
use std::os::fd::{OwnedFd, RawFd};

use landlock::{
    ABI, Access as _, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope,
};

use super::{Access, ConfineError, Plan};

/// Set to a number to make fsbroker act as if the kernel's Landlock ABI were at most that
/// (`0`: no Landlock). For tests, and for seeing what an older kernel would enforce.
pub const ABI_ENV: &str = "FSBROKER_LANDLOCK_ABI";

/// The Landlock ABI fsbroker uses: the kernel's, lowered by [`ABI_ENV`]. 0 when the kernel
/// has no Landlock (not built in, or not enabled at boot).
pub fn abi() -> i32 {
    let kernel = kernel_abi();
    match std::env::var(ABI_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<i32>().ok())
    {
        Some(limit) => kernel.min(limit.max(0)),
        None => kernel,
    }
}

/// The kernel's own Landlock ABI version, 0 without Landlock.
pub fn kernel_abi() -> i32 {
    // No safe wrapper: the landlock crate asks the kernel this too, but keeps the answer
    // private (and caps it at the ABIs it knows); rustix has no Landlock calls.
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) reads no
    // memory and creates no descriptor: it only returns the ABI version (or -1 and errno).
    #[allow(unsafe_code)]
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    };
    i32::try_from(version).unwrap_or(0).max(0)
}

/// What a Landlock ABI can enforce, each with the ABI that brought it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// Reading, writing, creating and removing files beneath allowed directories only.
    Files,
    /// Renaming and linking across directories (ABI 2).
    Refer,
    /// Truncating files (ABI 3): without it, `truncate(2)` works on any file.
    Truncate,
    /// TCP connect and bind (ABI 4).
    Tcp,
    /// ioctl on device files (ABI 5).
    IoctlDev,
    /// Signals to, and abstract Unix sockets of, processes outside the sandbox (ABI 6).
    Scopes,
    /// Connecting to Unix sockets by path (ABI 9).
    UnixPaths,
}

impl Feature {
    /// Every feature, oldest first.
    pub const ALL: [Feature; 7] = [
        Feature::Files,
        Feature::Refer,
        Feature::Truncate,
        Feature::Tcp,
        Feature::IoctlDev,
        Feature::Scopes,
        Feature::UnixPaths,
    ];

    /// The ABI that brought it.
    pub fn abi(self) -> i32 {
        match self {
            Feature::Files => 1,
            Feature::Refer => 2,
            Feature::Truncate => 3,
            Feature::Tcp => 4,
            Feature::IoctlDev => 5,
            Feature::Scopes => 6,
            Feature::UnixPaths => 9,
        }
    }

    /// What it stops a confined server doing.
    pub fn describe(self) -> &'static str {
        match self {
            Feature::Files => {
                "files outside the allowed paths: no reading, writing, creating or removing"
            }
            Feature::Refer => {
                "no renaming or linking files across directories beyond the allowed paths"
            }
            Feature::Truncate => "no truncating files outside the read-write paths",
            Feature::Tcp => "no TCP connections or listening ports (unless [confine] net = true)",
            Feature::IoctlDev => "no ioctl on device files",
            Feature::Scopes => {
                "no signals to processes outside the sandbox (the proxy, the host), no abstract Unix sockets outside it"
            }
            Feature::UnixPaths => "no connecting to Unix sockets by path outside the allowed paths",
        }
    }
}

/// The access rights of one rule at `abi`, for a directory or (when `dir` is false) a file.
fn rights(access: Access, abi: ABI, dir: bool) -> BitFlags<AccessFs> {
    let read = AccessFs::ReadFile | AccessFs::ReadDir;
    let all = AccessFs::from_all(abi);
    let wanted = match access {
        Access::Read => read,
        Access::ReadExec => read | AccessFs::Execute,
        Access::ReadWrite => {
            read | AccessFs::WriteFile
                | AccessFs::RemoveDir
                | AccessFs::RemoveFile
                | AccessFs::MakeDir
                | AccessFs::MakeReg
                | AccessFs::MakeSym
                | AccessFs::Refer
                | AccessFs::Truncate
        }
        Access::Device => AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate,
    };
    let file_rights = AccessFs::ReadFile
        | AccessFs::WriteFile
        | AccessFs::Execute
        | AccessFs::Truncate
        | AccessFs::IoctlDev;
    let wanted = wanted & all;
    if dir { wanted } else { wanted & file_rights }
}

/// A ruleset ready for [`restrict_self`]: built, its rules added. `None` inside when the
/// kernel (or [`ABI_ENV`]) has no Landlock.
#[derive(Debug)]
pub(crate) struct Prepared {
    fd: Option<OwnedFd>,
    /// Paths of the plan that do not exist here (left out of the ruleset).
    pub absent: Vec<std::path::PathBuf>,
}

impl Prepared {
    /// The ruleset's descriptor, for [`restrict_self`] in the child.
    pub(crate) fn raw_fd(&self) -> Option<RawFd> {
        use std::os::fd::AsRawFd;
        self.fd.as_ref().map(AsRawFd::as_raw_fd)
    }
}

/// Builds the ruleset of `plan` for the ABI `abi` (from [`abi`]).
pub(crate) fn prepare(plan: &Plan, abi: i32) -> Result<Prepared, ConfineError> {
    if abi < 1 {
        return Ok(Prepared {
            fd: None,
            absent: Vec::new(),
        });
    }
    let level = ABI::from(abi);
    let fail = |e: landlock::RulesetError| ConfineError::Kernel(e.to_string());
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(level))
        .map_err(fail)?;
    if !plan.net && abi >= Feature::Tcp.abi() {
        ruleset = ruleset
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .map_err(fail)?;
    }
    if abi >= Feature::Scopes.abi() {
        ruleset = ruleset
            .scope(Scope::AbstractUnixSocket | Scope::Signal)
            .map_err(fail)?;
    }
    let mut created = ruleset.create().map_err(fail)?;
    let mut absent = Vec::new();
    for rule in &plan.rules {
        // What the plan resolved, opened again with no link followed at all: granted only
        // if it is still the same file (see walk.rs: a directory swapped for a link between
        // the plan and this step would otherwise hand over whatever the link names).
        let Some(planned) = rule.id else {
            absent.push(rule.path.clone());
            continue;
        };
        let no_links = [std::path::PathBuf::from("/")];
        let (fd, is_dir) = match super::walk::resolve(&rule.path, &no_links) {
            super::walk::Walk::Found { id, fd, .. } if id == planned => {
                let st = rustix::fs::fstat(&fd).map_err(|e| ConfineError::Path {
                    path: rule.path.clone(),
                    reason: e.to_string(),
                })?;
                let dir = rustix::fs::FileType::from_raw_mode(st.st_mode)
                    == rustix::fs::FileType::Directory;
                (fd, dir)
            }
            super::walk::Walk::Absent => {
                absent.push(rule.path.clone());
                continue;
            }
            _ => {
                return Err(ConfineError::Path {
                    path: rule.path.clone(),
                    reason: "it changed while the confinement was being set up (a link or \
                             another file was put in its place), so the server was not started"
                        .into(),
                });
            }
        };
        let rights = rights(rule.access, level, is_dir);
        if rights.is_empty() {
            continue;
        }
        created = created
            .add_rule(PathBeneath::new(fd, rights))
            .map_err(|e| ConfineError::Path {
                path: rule.path.clone(),
                reason: e.to_string(),
            })?;
    }
    let fd: Option<OwnedFd> = created.into();
    Ok(Prepared { fd, absent })
}

/// Asks the kernel to `SIGKILL` the calling process when its parent (`proxy`) dies, so a
/// proxy killed outright does not leave its confined server running with the access it was
/// started with, unwatched by revocation. Fails if the proxy is already gone.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked exits: the proxy spawns its server
/// from an async task, whose runtime threads live as long as the proxy. It survives `exec`
/// (not of set-uid programs, which `PR_SET_NO_NEW_PRIVS` keeps from gaining anything anyway).
/// Async-signal-safe: two system calls on integers.
pub(crate) fn die_with_parent(proxy: rustix::process::Pid) -> io::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    if rustix::process::getppid() != Some(proxy) {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    Ok(())
}

/// `CLOSE_RANGE_CLOEXEC` (linux/close_range.h).
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

/// Marks every descriptor above stderr close-on-exec, so the server starts with its three
/// pipes and nothing else. A host (or whatever started the proxy) may have left descriptors
/// open, a file outside every root or a directory among them, and a descriptor is a
/// capability no Landlock rule takes back.
///
/// Marked, not closed: the standard library reports a failed `exec` through a close-on-exec
/// pipe of its own, which must stay usable until then. Async-signal-safe: system calls on
/// integers.
pub(crate) fn close_inherited() -> io::Result<()> {
    // No safe wrapper: rustix has no close_range(2).
    // SAFETY: close_range(first, last, flags) takes integers and touches no memory of ours;
    // it only sets a flag on descriptors of this process.
    #[allow(unsafe_code)]
    let done = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if done == 0 {
        return Ok(());
    }
    // Before Linux 5.11: one `fcntl` per descriptor number up to the limit (an unlimited
    // one, `RLIM_INFINITY`, is `None`, and capped like any other).
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let last = limit.current.map_or(1 << 20, |n| n.min(1 << 20)) as libc::c_int;
    for fd in 3..last {
        // Not rustix's `fcntl_setfd`: it takes a borrowed descriptor, which a number that may
        // not be open cannot soundly be made into.
        // SAFETY: fcntl(fd, F_SETFD, FD_CLOEXEC) takes integers; on a number that is not an
        // open descriptor it fails with EBADF and changes nothing.
        #[allow(unsafe_code)]
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
    Ok(())
}

/// Drops every capability the calling process holds or could regain at `exec`: the
/// bounding set, the ambient set, then its own sets. A server started by a proxy that runs
/// as root is then an ordinary process: no `CAP_NET_ADMIN` to reconfigure the network over
/// netlink, no `CAP_DAC_OVERRIDE`, nothing. For a user without capabilities it changes
/// nothing. Fails only if root keeps a capability it could take back at `exec`.
/// Async-signal-safe: system calls on integers and on locals.
pub(crate) fn drop_capabilities() -> io::Result<()> {
    use rustix::thread::{CapabilitySet, CapabilitySets};
    // Past the last capability the kernel refuses with EINVAL, and without CAP_SETPCAP with
    // EPERM: either way nothing changes, and the check below says whether what matters was
    // dropped. (A set of one bit names one capability, known to rustix or not.)
    for cap in 0..64 {
        let _ = rustix::thread::remove_capability_from_bounding_set(
            CapabilitySet::from_bits_retain(1 << cap),
        );
    }
    let _ = rustix::thread::clear_ambient_capability_set();
    // capset(2), `_LINUX_CAPABILITY_VERSION_3`, this process: dropping is always allowed.
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: CapabilitySet::empty(),
            permitted: CapabilitySet::empty(),
            inheritable: CapabilitySet::empty(),
        },
    )?;
    // Root regains at `exec` whatever is left in its bounding set. (A failed read counts as
    // not kept, as `prctl(PR_CAPBSET_READ)` returning -1 did.)
    let kept =
        rustix::thread::capability_is_in_bounding_set(CapabilitySet::SYS_ADMIN).unwrap_or(false);
    if rustix::process::geteuid().is_root() && kept {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(())
}

/// Puts the calling process under the ruleset `fd` (when the kernel has Landlock) and the
/// seccomp `filter`: `PR_SET_NO_NEW_PRIVS` (which both require of a process without
/// `CAP_SYS_ADMIN`, and which keeps set-uid programs from gaining privileges inside), the
/// filter, then `landlock_restrict_self(2)`.
///
/// Meant for the child between `fork` and `exec`: it makes three system calls on memory built
/// before the fork, allocates nothing and takes no lock, so it is async-signal-safe.
pub(crate) fn restrict_self(fd: Option<RawFd>, filter: &super::seccomp::Filter) -> io::Result<()> {
    rustix::thread::set_no_new_privs(true)?;
    filter.install()?;
    let Some(fd) = fd else { return Ok(()) };
    // No safe wrapper: the landlock crate's `restrict_self` consumes its own ruleset object
    // (and does more than one system call), which the child of a fork cannot use.
    // SAFETY: landlock_restrict_self(fd, 0) takes a descriptor and flags, both integers, and
    // touches no memory of ours; `fd` is the ruleset's, kept open by the caller past the fork.
    #[allow(unsafe_code)]
    let done = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
