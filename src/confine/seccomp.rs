//! A seccomp filter beside the Landlock domain, for what Landlock does not cover:
//! - sockets that leave the machine when `[confine] net` is off. Landlock's TCP rules (ABI 4)
//!   see plain TCP only; MPTCP (`IPPROTO_MPTCP`), SCTP and UDP sockets pass, and so do other
//!   families. The filter allows `socket(2)` only for netlink and (see below) Unix sockets:
//!   IP of any protocol, `AF_VSOCK` to a virtual machine's host, `AF_PACKET` and the rest are
//!   refused;
//! - metadata changes by path (`chmod`, `fchmodat`, `chown` and kin, extended attributes):
//!   Landlock does not restrict them, so a confined server could change the mode or owner of
//!   any file it cannot even read;
//! - `TIOCSTI`/`TIOCLINUX` on a descriptor it inherited: typing commands into the user's
//!   shell (the proxy gives a confined server a pipe for stderr, not its terminal, but a host
//!   may hand a terminal on another descriptor);
//! - set-user-id and set-group-id bits, by `fchmod` or on a file created with `open`,
//!   `creat` or `mknod`: a program of the user's that runs as the user for whoever runs it.
//!   A server started by a proxy running as root gets no `fchmod` at all: it owns the system's
//!   files, so it could make one it may only read writable for everyone;
//! - `prlimit64` on another process: resource limits are not signals, so Landlock's signal
//!   scoping does not cover them, and a limit of no open files on the proxy stops its next
//!   policy reload (and so a revocation), a CPU limit kills a process outside;
//! - System V IPC (shared memory, message queues, semaphores): another process's segment is
//!   found by number and attached, past every file rule;
//! - netlink other than `NETLINK_ROUTE`: `sock_diag` lists every socket of the machine, and
//!   the rest configure it;
//! - io_uring, whose operations do not pass through the filter;
//! - Unix sockets (`socket(AF_UNIX)`, and datagram pairs, which can `sendto` any path) when
//!   `net` is off and the kernel's Landlock cannot hold their paths (before ABI 9): a server
//!   could otherwise ask any unconfined service listening on one (a terminal multiplexer,
//!   the session bus, the system log) to act for it;
//! - changes of user and group ids (a root server's would also clear its death signal);
//! - the kernel keyrings (a user's keys, readable by any of its processes), and what a
//!   server run as root could use to leave every rule: kernel modules, `kexec`, I/O ports,
//!   BPF, open by handle, `perf_event_open`, `userfaultfd`, the clock, the kernel log;
//! - leaving the process group (`setsid`, `setpgid`) and clearing the death signal
//!   (`prctl(PR_SET_PDEATHSIG)`): these return success and do nothing, so everything the
//!   server starts stays in the group the proxy kills at once, and the server dies with the
//!   proxy.
//!
//! Refused calls fail with `EACCES` (sockets) or `EPERM`; the process goes on. Calls of
//! another architecture's ABI (x32, i386 on x86-64) are refused altogether, so none of the
//! above is reachable by another syscall number.
//!
//! The program is built before the fork; the child installs it with one `prctl(2)` after
//! `PR_SET_NO_NEW_PRIVS` ([`install`]).

use std::io;

/// A compiled seccomp program.
#[derive(Debug)]
pub(crate) struct Filter {
    program: Vec<libc::sock_filter>,
}

const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
const AND_K: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;

/// `S_ISUID | S_ISGID`.
const SET_ID_BITS: u32 = 0o6000;
/// The type bits of `socket(2)`'s second argument (the rest are `SOCK_NONBLOCK` and
/// `SOCK_CLOEXEC`).
const SOCK_TYPE_MASK: u32 = 0xf;

/// Offsets in `struct seccomp_data`.
const NR: u32 = 0;
const ARCH: u32 = 4;
/// The low 32 bits of argument `n` (little-endian).
const fn arg(n: u32) -> u32 {
    16 + 8 * n
}

/// `AUDIT_ARCH_*` of this build (linux/audit.h: EM_* | 64-bit | little-endian).
#[cfg(target_arch = "x86_64")]
const NATIVE_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const NATIVE_ARCH: u32 = 0xC000_00B7;

/// System calls refused outright: metadata by path, ownership, extended attributes,
/// io_uring.
fn refused() -> Vec<libc::c_long> {
    let mut calls = vec![
        libc::SYS_fchmodat,
        libc::SYS_fchownat,
        libc::SYS_fchown,
        libc::SYS_setxattr,
        libc::SYS_lsetxattr,
        libc::SYS_fsetxattr,
        libc::SYS_removexattr,
        libc::SYS_lremovexattr,
        libc::SYS_fremovexattr,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        // fchmodat2 (Linux 6.6), setxattrat and removexattrat (6.13): the same numbers on
        // every architecture.
        452,
        463,
        466,
    ];
    // Times by path (`utime`, `utimes`, `futimesat`; `utimensat` with a path is checked in
    // the filter): Landlock does not govern metadata, so a server could otherwise change the
    // times of any file it can name.
    #[cfg(target_arch = "x86_64")]
    calls.extend([
        libc::SYS_chmod,
        libc::SYS_chown,
        libc::SYS_lchown,
        libc::SYS_utime,
        libc::SYS_utimes,
        libc::SYS_futimesat,
    ]);
    calls
}

/// Calls no MCP server needs that reach past every file rule: the kernel keyrings (a
/// session's keys, Kerberos tickets and the like, which Landlock does not cover, readable by
/// any process of the user), and what only a server run as root could do: load a kernel
/// module or a new kernel, reach I/O ports, reboot, swap, open files by handle, load BPF
/// programs, watch other processes' events, fault pages in by hand, change the clock or read
/// the kernel log.
fn privileged() -> Vec<libc::c_long> {
    let mut calls = vec![
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_reboot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_open_by_handle_at,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
        libc::SYS_clock_adjtime,
        libc::SYS_adjtimex,
        libc::SYS_syslog,
        libc::SYS_acct,
        libc::SYS_quotactl,
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([libc::SYS_iopl, libc::SYS_ioperm]);
    calls
}

/// System V IPC: segments, queues and semaphore sets are named by number, not by path, so
/// Landlock does not see them; any of the user's (or, for root, anyone's) can be attached.
fn sysv_ipc() -> Vec<libc::c_long> {
    vec![
        libc::SYS_shmget,
        libc::SYS_shmat,
        libc::SYS_shmctl,
        libc::SYS_shmdt,
        libc::SYS_msgget,
        libc::SYS_msgsnd,
        libc::SYS_msgrcv,
        libc::SYS_msgctl,
        libc::SYS_semget,
        libc::SYS_semop,
        libc::SYS_semctl,
        libc::SYS_semtimedop,
    ]
}

/// Changes of user or group identity. Refused (`EPERM`), not faked: a server that drops
/// privileges must know it did not. Only a server run as root could make them, and any
/// change of its effective or file-system ids would clear the death signal the proxy set.
fn identity_changes() -> Vec<libc::c_long> {
    vec![
        libc::SYS_setuid,
        libc::SYS_setgid,
        libc::SYS_setreuid,
        libc::SYS_setregid,
        libc::SYS_setresuid,
        libc::SYS_setresgid,
        libc::SYS_setfsuid,
        libc::SYS_setfsgid,
    ]
}

/// One instruction, its jumps given as labels until [`assemble`] resolves them.
enum Insn {
    Load(u32),
    /// Jump to the label when equal to `k` (else fall through).
    JumpIfEq(u32, &'static str),
    /// Jump to the label when at least `k`.
    JumpIfGe(u32, &'static str),
    /// Keep only the bits of `k` in the loaded word.
    And(u32),
    Ret(u32),
    Label(&'static str),
}

fn assemble(insns: &[Insn]) -> Vec<libc::sock_filter> {
    let mut at = std::collections::HashMap::new();
    let mut n = 0usize;
    for insn in insns {
        match insn {
            Insn::Label(name) => {
                at.insert(*name, n);
            }
            _ => n += 1,
        }
    }
    let mut out = Vec::with_capacity(n);
    for insn in insns {
        let here = out.len();
        let skip = |label: &str| -> u8 {
            // Jumps only go forward. A classic BPF jump reaches 255 instructions at most: a
            // longer one is a bug of this file, caught by its tests before any server runs.
            u8::try_from(at[label] - here - 1).expect("a seccomp jump longer than 255")
        };
        let (code, jt, jf, k) = match insn {
            Insn::Label(_) => continue,
            Insn::Load(offset) => (LD_W_ABS, 0, 0, *offset),
            Insn::JumpIfEq(k, label) => (JEQ_K, skip(label), 0, *k),
            Insn::JumpIfGe(k, label) => (JGE_K, skip(label), 0, *k),
            Insn::And(k) => (AND_K, 0, 0, *k),
            Insn::Ret(k) => (RET_K, 0, 0, *k),
        };
        out.push(libc::sock_filter { code, jt, jf, k });
    }
    out
}

impl Filter {
    /// The filter for a server with the network allowed (`net`) or not, on a kernel whose
    /// Landlock holds Unix sockets by path to the allowed paths (`unix_paths`, ABI 9) or not.
    ///
    /// `root`: the proxy runs as root, so the server owns the system's files (`fchmod` is
    /// refused outright).
    pub(crate) fn new(net: bool, unix_paths: bool, root: bool) -> Filter {
        use Insn::*;
        let errno = |e: i32| libc::SECCOMP_RET_ERRNO | (e as u32 & libc::SECCOMP_RET_DATA);
        let mut p = vec![
            Load(ARCH),
            JumpIfEq(NATIVE_ARCH, "native"),
            Ret(errno(libc::EPERM)),
            Label("native"),
            Load(NR),
        ];
        #[cfg(target_arch = "x86_64")]
        p.push(JumpIfGe(0x4000_0000, "deny")); // x32 numbers
        for call in refused()
            .into_iter()
            .chain(identity_changes())
            .chain(privileged())
            .chain(sysv_ipc())
        {
            p.push(JumpIfEq(call as u32, "deny"));
        }
        // Leaving the process group would take a process out of the proxy's reach
        // (`crate::confine::reap` ends the group at once); clearing the death signal would
        // let the server outlive a killed proxy. Both "succeed" and do nothing, so the many
        // programs that call them in passing (a detached child, a daemon) go on working.
        p.push(JumpIfEq(libc::SYS_setsid as u32, "pretend"));
        p.push(JumpIfEq(libc::SYS_setpgid as u32, "pretend"));
        p.push(JumpIfEq(libc::SYS_prctl as u32, "prctl"));
        p.push(JumpIfEq(libc::SYS_ioctl as u32, "ioctl"));
        p.push(JumpIfEq(libc::SYS_socket as u32, "socket"));
        if !net && !unix_paths {
            p.push(JumpIfEq(libc::SYS_socketpair as u32, "socketpair"));
        }
        // Set-id bits: by `fchmod` (`chmod` and `fchmodat` are refused outright), or at
        // creation (`open`'s and `openat`'s mode). `openat2` takes its mode in memory the
        // filter cannot read: it fails as if the kernel lacked it, and the C library falls
        // back to `openat`.
        p.push(JumpIfEq(
            libc::SYS_fchmod as u32,
            if root { "deny" } else { "mode1" },
        ));
        p.push(JumpIfEq(libc::SYS_mknodat as u32, "mode2"));
        // Limits of other processes: only the caller's own (pid 0).
        p.push(JumpIfEq(libc::SYS_prlimit64 as u32, "prlimit"));
        p.push(JumpIfEq(libc::SYS_openat as u32, "mode3"));
        #[cfg(target_arch = "x86_64")]
        {
            p.push(JumpIfEq(libc::SYS_open as u32, "mode2"));
            p.push(JumpIfEq(libc::SYS_creat as u32, "mode1"));
            p.push(JumpIfEq(libc::SYS_mknod as u32, "mode1"));
        }
        p.push(JumpIfEq(libc::SYS_openat2 as u32, "nosys"));
        // Times: only of a file the server opened (`futimens`, `utimensat` with no path),
        // never by path, which Landlock would not check (see `refused`).
        p.push(JumpIfEq(libc::SYS_utimensat as u32, "nopath1"));
        p.extend([
            Ret(libc::SECCOMP_RET_ALLOW),
            Label("ioctl"),
            Load(arg(1)),
            JumpIfEq(libc::TIOCSTI as u32, "deny"),
            JumpIfEq(libc::TIOCLINUX as u32, "deny"),
            Ret(libc::SECCOMP_RET_ALLOW),
            Label("prlimit"),
            Load(arg(0)),
            JumpIfEq(0, "allow"),
            Ret(errno(libc::EPERM)),
        ]);
        // `modeN`: the mode is argument N; refused when it has a set-id bit.
        for (label, n) in [("mode1", 1), ("mode2", 2), ("mode3", 3)] {
            p.extend([
                Label(label),
                Load(arg(n)),
                Insn::And(SET_ID_BITS),
                JumpIfEq(0, "allow"),
                Ret(errno(libc::EPERM)),
            ]);
        }
        p.extend([
            // Netlink, whatever `net` says, only for `NETLINK_ROUTE` (`getaddrinfo` and
            // `getifaddrs` ask it which addresses are configured): `sock_diag` lists every
            // socket of the machine, and the other protocols configure it.
            Label("socket"),
            Load(arg(0)),
            JumpIfEq(libc::AF_NETLINK as u32, "netlink"),
        ]);
        if net {
            p.push(Ret(libc::SECCOMP_RET_ALLOW));
        } else {
            // With `net` off, only sockets that stay on this machine: netlink (above) and Unix
            // sockets where Landlock holds their paths. Every other family is a way out: IP
            // of any protocol, `AF_VSOCK` (a virtual machine's channel to its host: WSL 2,
            // Firecracker), `AF_PACKET` (raw frames, for a server run as root), and the
            // transports a kernel may have as modules (TIPC, RDS, ...).
            if unix_paths {
                p.push(JumpIfEq(libc::AF_UNIX as u32, "allow"));
            }
            // Before ABI 9 a Unix socket can connect to any path (a terminal multiplexer's,
            // the session bus, `systemd-run --user`'s): a way out of everything, refused too.
            p.push(Ret(errno(libc::EACCES)));
        }
        p.extend([
            Label("netlink"),
            Load(arg(2)),
            JumpIfEq(libc::NETLINK_ROUTE as u32, "allow"),
            Ret(errno(libc::EACCES)),
            // Pairs stay, for runtimes make their children's pipes with them, but only
            // connected ones: a datagram pair can `sendto` any path, and before ABI 9
            // Landlock does not stop it. (`SOCK_RAW` is a datagram pair too.)
            Label("socketpair"),
            Load(arg(1)),
            Insn::And(SOCK_TYPE_MASK),
            JumpIfEq(libc::SOCK_STREAM as u32, "allow"),
            JumpIfEq(libc::SOCK_SEQPACKET as u32, "allow"),
            Ret(errno(libc::EACCES)),
            Label("nosys"),
            Ret(errno(libc::ENOSYS)),
            // `nopath1`: argument 1 (a path) must be NULL, all 64 bits of it.
            Label("nopath1"),
            Load(arg(1)),
            JumpIfEq(0, "nopath1_high"),
            Ret(errno(libc::EPERM)),
            Label("nopath1_high"),
            Load(arg(1) + 4),
            JumpIfEq(0, "allow"),
            Ret(errno(libc::EPERM)),
            Label("allow"),
            Ret(libc::SECCOMP_RET_ALLOW),
            Label("prctl"),
            Load(arg(0)),
            JumpIfEq(libc::PR_SET_PDEATHSIG as u32, "pretend"),
            Ret(libc::SECCOMP_RET_ALLOW),
            Label("pretend"),
            Ret(errno(0)),
            Label("noaccess"),
            Ret(errno(libc::EACCES)),
            Label("deny"),
            Ret(errno(libc::EPERM)),
        ]);
        Filter {
            program: assemble(&p),
        }
    }

    /// Installs the filter on the calling thread (and what it runs). Requires
    /// `PR_SET_NO_NEW_PRIVS`, set first. Async-signal-safe: one system call on memory built
    /// before the fork, nothing allocated.
    pub(crate) fn install(&self) -> io::Result<()> {
        let prog = libc::sock_fprog {
            len: u16::try_from(self.program.len()).unwrap_or(u16::MAX),
            filter: self.program.as_ptr().cast_mut(),
        };
        // No safe wrapper: rustix's `set_secure_computing_mode` passes no filter program.
        // SAFETY: `prog` points at `self.program`, which lives (unchanged) for the whole call;
        // the kernel copies the program before returning and keeps no pointer to it.
        #[allow(unsafe_code)]
        let done = unsafe {
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            )
        };
        if done != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_land_on_their_labels() {
        for f in [
            Filter::new(false, false, false),
            Filter::new(false, true, true),
            Filter::new(true, false, false),
            Filter::new(true, true, true),
        ] {
            // Every jump ends at a return or at a load of what it tests next.
            let n = f.program.len();
            for (i, insn) in f.program.iter().enumerate() {
                if insn.code == JEQ_K || insn.code == JGE_K {
                    let target = i + 1 + usize::from(insn.jt);
                    assert!(target < n, "jump {i} past the end");
                    let class = f.program[target].code & 0x07;
                    assert!(
                        class == 0x06 || class == 0x00,
                        "jump {i} lands on a return or a load"
                    );
                }
                if insn.code == AND_K {
                    // Masks follow a load of the argument they mask.
                    assert_eq!(f.program[i - 1].code, LD_W_ABS, "mask {i}");
                }
            }
        }
    }
}
