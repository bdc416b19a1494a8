"""The guard: the process between jaxmigrate and anything that runs the user's code.

Run as `python -I -S guard.py --parent PID [--netns PID] -- COMMAND...` (standard library only,
no site, no PYTHON* variables: the recorder's sitecustomize never loads here). It

- ends with jaxmigrate, however jaxmigrate ends: `PR_SET_PDEATHSIG` (Linux) sends it SIGTERM
  when jaxmigrate dies, even by SIGKILL, and it also polls its parent's pid (elsewhere, or if
  the signal was lost);
- is a subreaper (`PR_SET_CHILD_SUBREAPER`, Linux): a grandchild that escaped with `setsid` or
  a double fork is reparented to it, not to init, and is killed with the rest;
- on SIGTERM/SIGINT/SIGHUP, on its parent's death, and when COMMAND ends, kills every process
  below it (its descendants by parent pid, and its process group), so nothing outlives it;
- mirrors COMMAND's end: the same exit status, or death by the same signal;
- with `--netns PID`, first joins the network namespace (and its user namespace, if any) that
  the holder process PID made (`--hold`): the code then sees only a loopback interface.

`--hold` makes that namespace: a new network namespace (in a new user namespace when not root)
with loopback up, then prints `ok` (or `no: why`) and waits until its parent dies or stdin closes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
POLL = 0.05


class Stop(Exception):
    """A signal asked the guard to stop everything."""


def libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def prctl(option: int, value: int) -> bool:
    lib = libc()
    return lib is not None and lib.prctl(option, value, 0, 0, 0) == 0


def descendants() -> set[int]:
    """Return the pids below this process, and the other members of its process group."""
    me = os.getpid()
    group = os.getpgrp()
    parents: dict[int, int] = {}
    members = set()
    try:
        names = os.listdir("/proc")
    except OSError:
        return set()
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        pid, ppid, pgrp = int(name), int(fields[1]), int(fields[2])
        parents[pid] = ppid
        if pgrp == group and pid != me:
            members.add(pid)
    below: set[int] = set()
    frontier = {me}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - below
        below |= frontier
    return below | members


def kill_everything() -> None:
    """Kill every process below the guard (and in its group), until none is left."""
    if not sys.platform.startswith("linux"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            os.killpg(os.getpgrp(), signal.SIGTERM)
        except OSError:
            pass
        return
    for _ in range(50):
        found = descendants()
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap()
        time.sleep(0.01)


def reap() -> list[tuple[int, int]]:
    """Reap every child that ended (the command, or orphans reparented here)."""
    ended: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.append((pid, status))


STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def stop(number: int, frame: object) -> None:
    """Stop once: later signals (jaxmigrate's second SIGTERM as it stops its children, the
    death signal as it exits) are ignored, so none can raise again while the guard is past its
    `try` and about to kill what is below it (a guard dying there left the command running).
    They are blocked first, in the kernel: none is delivered while the handlers change."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    for each in STOPS:
        signal.signal(each, ignore)
    raise Stop(number)


def ignore(number: int, frame: object) -> None:
    """A signal after the first stop: nothing to do (a Python handler, not SIG_IGN, so that a
    signal already pending is not reported as lost)."""


def join_namespace(holder: int) -> None:
    """Enter the user (if any) and network namespaces of process `holder`."""
    lib = libc()
    if lib is None:
        return
    for kind, flag in (("user", CLONE_NEWUSER), ("net", CLONE_NEWNET)):
        path = f"/proc/{holder}/ns/{kind}"
        if os.readlink(path) == os.readlink(f"/proc/self/ns/{kind}"):
            continue  # the same namespace (root needs no user namespace)
        fd = os.open(path, os.O_RDONLY)
        try:
            if lib.setns(fd, flag) != 0:
                raise OSError(ctypes.get_errno(), f"setns({kind})")
        finally:
            os.close(fd)


def loopback_up() -> None:
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))


def isolate() -> str:
    """Move this process into a new network namespace with loopback up; return why not, or ''."""
    lib = libc()
    if lib is None:
        return f"network namespaces are Linux-only (this is {sys.platform})"
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0 and lib.unshare(CLONE_NEWNET) == 0:
        pass
    elif lib.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        try:
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                               ("gid_map", f"{gid} {gid} 1")):  # fmt: skip
                with open(f"/proc/self/{name}", "w") as handle:
                    handle.write(text)
        except OSError as exc:
            return f"cannot map the user into a user namespace: {exc.strerror}"
    else:
        return f"unshare: {os.strerror(ctypes.get_errno() or errno.EPERM)}"
    try:
        loopback_up()
    except OSError as exc:
        return f"cannot bring loopback up: {exc.strerror}"
    return ""


def hold(parent: int) -> int:
    """Make the namespace, say so, and keep it alive while the parent lives and stdin is open."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    why = isolate()
    sys.stdout.write(f"no: {why}\n" if why else "ok\n")
    sys.stdout.flush()
    if why:
        return 1
    import select

    while os.getppid() == parent:
        readable, _, _ = select.select([sys.stdin], [], [], 1.0)
        if readable and not os.read(sys.stdin.fileno(), 1024):
            break
    return 0


def mirror(status: int) -> None:
    """End as the command ended: its exit status, or its signal."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        except (ImportError, ValueError, OSError):
            pass
        signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {number})
        os.kill(os.getpid(), number)
        time.sleep(1)
        os._exit(128 + number)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else len(argv)
    options, command = argv[:split], argv[split + 1 :]
    parent = int(options[options.index("--parent") + 1])
    if "--hold" in options:
        return hold(parent)
    for number in STOPS:
        signal.signal(number, stop)
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    if os.getppid() != parent:
        return 1  # jaxmigrate ended before the signal was armed
    if "--netns" in options:
        try:
            join_namespace(int(options[options.index("--netns") + 1]))
        except OSError as exc:
            sys.stderr.write(f"jaxmigrate guard: cannot join the sandbox: {exc}\n")
            return 1
    status = None
    try:
        child = subprocess.Popen(command, close_fds=False)
        # The command holds the pipes now: when it ends, jaxmigrate must see end-of-file.
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        while status is None:
            for pid, ended in reap():
                if pid == child.pid:
                    status = ended
            if status is None:
                if os.getppid() != parent:
                    break
                time.sleep(POLL)
    except Stop:
        pass
    except OSError as exc:
        sys.stderr.write(f"jaxmigrate guard: cannot run {command[:1]}: {exc}\n")
        return 127
    for number in STOPS:
        signal.signal(number, ignore)
    kill_everything()
    if status is None:
        return 143
    mirror(status)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
