"""The seccomp filter sandboxed code runs under: system calls a tool never needs fail.

Built once per sandbox with libseccomp (through ``pyseccomp``, a ctypes binding; the library
itself is Debian's ``libseccomp2``, which apt depends on) and handed to bubblewrap as a BPF
program (``--seccomp FD``). bubblewrap installs it last, just before our init starts, so it
covers every process of the call and cannot be lifted (``no_new_privs`` is set).

What fails, and why a tool never needs it:
- namespaces and mounts (``unshare``, ``setns``, ``mount``, the new mount API, ``pivot_root``,
  ``chroot``; ``clone`` with a namespace flag, ``clone3`` as ENOSYS so libc falls back to
  ``clone``, whose flags can be checked): the kernel's largest attack surface for an
  unprivileged process is a user namespace of its own;
- looking into or controlling other processes and the kernel (``ptrace``,
  ``process_vm_*``, ``pidfd_getfd``, ``kcmp``, ``perf_event_open``, ``bpf``, ``userfaultfd``,
  ``io_uring_*``, keyrings, modules, ``kexec``, ``reboot``, swap, clocks, ``syslog``, ``acct``,
  quotas, handles by number (``open_by_handle_at``), host and domain names);
- the terminal injection ioctls ``TIOCSTI`` and ``TIOCLINUX``.
Calls on other architectures' ABIs (32-bit ``int 0x80`` on x86-64) kill the process.
"""

from __future__ import annotations

import errno
import os
import platform
from dataclasses import dataclass

REFUSED = (
    # namespaces, mounts, roots
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "mount_setattr",
    "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
    # other processes, the kernel's debugging and tracing faces
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_getfd",
    "kcmp", "perf_event_open", "bpf", "userfaultfd", "lookup_dcookie",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # keyrings, modules, the machine
    "add_key", "request_key", "keyctl", "init_module", "finit_module", "delete_module",
    "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "syslog", "acct",
    "quotactl", "quotactl_fd", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "sethostname", "setdomainname", "open_by_handle_at", "name_to_handle_at", "vhangup",
    "iopl", "ioperm", "uselib", "nfsservctl",
)
# Namespace flags of clone(2): CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER,
# NEWPID, NEWNET.
CLONE_NAMESPACES = (0x00000080, 0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000,
                    0x20000000, 0x40000000)
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
# Architectures where clone's flags are its first argument (s390 has them second).
_CLONE_FLAGS_FIRST = ("x86_64", "aarch64", "arm64", "riscv64", "ppc64le", "loongarch64")


@dataclass(frozen=True)
class Filter:
    """A compiled filter (the BPF program bubblewrap reads), or why there is none."""

    program: bytes | None
    refused: int = 0  # how many system calls fail under it
    problem: str | None = None

    def open_fd(self) -> int:
        """A fresh descriptor holding the program, for one bubblewrap start (it reads it to
        the end); the caller closes it once bubblewrap has started."""
        assert self.program is not None
        fd = os.memfd_create("whetstone-seccomp", 0)
        os.write(fd, self.program)
        os.lseek(fd, 0, os.SEEK_SET)
        return fd


def build_filter() -> Filter:
    """The filter for this machine's architecture; ``problem`` says why there is none."""
    try:
        import pyseccomp as sc  # optional: ctypes over libseccomp.so.2, loaded on import
    except (ImportError, RuntimeError, OSError) as exc:
        return Filter(None, 0, f"no seccomp filter: libseccomp is unavailable ({exc}); "
                               "install libseccomp2 and the pyseccomp package")
    try:
        filt = sc.SyscallFilter(sc.ALLOW)
        refused = 0
        for name in REFUSED:
            try:
                filt.add_rule(sc.ERRNO(errno.EPERM), name)
                refused += 1
            except (OSError, ValueError, RuntimeError):
                continue  # not a system call on this architecture or kernel headers
        filt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        if platform.machine() in _CLONE_FLAGS_FIRST:
            for flag in CLONE_NAMESPACES:
                filt.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        for request in (TIOCSTI, TIOCLINUX):
            filt.add_rule(sc.ERRNO(errno.EPERM), "ioctl",
                          sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
        with os.fdopen(os.memfd_create("whetstone-seccomp-build"), "w+b") as fh:
            filt.export_bpf(fh)
            fh.seek(0)
            program = fh.read()
    except (OSError, ValueError, RuntimeError) as exc:
        return Filter(None, 0, f"no seccomp filter: libseccomp could not build one ({exc})")
    return Filter(program, refused + 2)
