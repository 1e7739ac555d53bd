"""The jailed kernel: where a submission's code runs, and how it is locked in.

specref_grading/wall.py starts, as root,

    unshare --mount --net --pid --ipc --uts --fork --kill-child --propagation private -- \\
        python -I -m specref_grading.jail launch CONFIG

`launch` (this file, still root, inside the new namespaces) builds a root folder of its own: a
tmpfs holding read-only bind mounts of /usr, /etc and the interpreter, the virtual environment
and the specref package (nothing else of the repository: no solutions/, no tools/, no other
submission), a few device nodes, a fresh /proc, and a tmpfs of its own (TMP_MB) as /tmp. It moves
into the run's cgroups (one CPU, one memory budget, a process count) where the host has cgroup v1.
It changes root into it, drops every capability from the bounding set, takes the run's fresh
unprivileged uid and gid (no groups), sets no_new_privs and the resource limits, and starts the
kernel as its child (it stays the namespace's init, reaping orphans, and leaves with the kernel's
status, 128 + N for signal N): `python -I -c <specref_grading/protocol.py + KERNEL>`.
The network namespace has only a loopback interface, which is down: no network.

The kernel serves calls from the trusted process (specref_grading/trusted.py) over two pipes: `exec`
runs a cell's source in the kernel's namespace (the solution's setup cells, the learner's answer
cells and the exercise's other cells; never a test cell), `get` hands out a name the cells bound,
and every object it hands out can be called back (specref_grading/protocol.py). It holds no key, no test,
no hidden seed and decides nothing: whatever it does to itself, the grade is decided elsewhere.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

KERNEL = r'''
def _jail_main():
    import builtins
    rfd, wfd = int(sys.argv[1]), int(sys.argv[2])
    ns = {"__name__": "__main__", "__builtins__": builtins, "display": print}

    def op_exec(source, filename):
        try:
            code = compile(source, filename, "exec", dont_inherit=True)
            exec(code, ns)  # noqa: S102 - running the learner's cells is this process's job
        except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt of a cell are its errors
            return describe_error(e, filename)
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:  # noqa: BLE001
                pass
        return None

    def op_get(name):
        if type(name) is not str or name not in ns:
            raise NameError(f"name {name!r} is not defined")
        return ns[name]

    Peer(rfd, wfd, "jail", ops={"exec": op_exec, "get": op_get}).serve_forever()


import sys  # noqa: E402
try:
    _jail_main()
finally:
    import os as _os
    _os._exit(0)
'''


def kernel_source() -> str:
    return (HERE / "protocol.py").read_text(encoding="utf-8") + "\n" + KERNEL


def read_only_paths() -> list[str]:
    """What the kernel may read: the system, the interpreter, the environment, the specref package."""
    import importlib.util
    paths = ["/usr", "/etc", os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), sys.prefix,
             os.path.dirname(os.path.realpath(sys.executable))]
    spec = importlib.util.find_spec("specref")
    if spec is not None and spec.origin:
        paths.append(os.path.dirname(os.path.realpath(spec.origin)))
    out: list[str] = []
    for p in paths:
        if p and os.path.isdir(p) and p != "/" and p not in out:
            out.append(p)
    return out


def command(config: dict) -> list[str]:
    """The command that starts the jailed kernel (as root)."""
    return ["unshare", "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child",
            "--propagation", "private", "--", sys.executable, "-I", "-m", "specref_grading.jail", "launch",
            json.dumps(config)]


CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_PARENT = "specref-grade"
TMP_MB = 512  # the kernel's /tmp: a tmpfs of this size, charged to its memory


def cgroup_limits(memory_mb: int, pids: int = 128) -> dict[str, dict[str, str]]:
    """The limits of one submission's cgroup, per cgroup-v1 controller: at most one CPU's time, `memory_mb`
    of memory for all its processes together (its /tmp included), at most `pids` processes and threads."""
    return {"cpu": {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"},
            "memory": {"memory.limit_in_bytes": str(memory_mb << 20)},
            "pids": {"pids.max": str(pids)}}


def cgroup_dirs(name: str) -> dict[str, str]:
    """{controller: the folder of the run's cgroup} on a cgroup-v1 host (one folder per controller)."""
    return {ctrl: os.path.join(CGROUP_ROOT, ctrl, CGROUP_PARENT, name) for ctrl in ("cpu", "memory", "pids")}


def join_cgroups(name: str, memory_mb: int) -> list[str]:
    """Make the run's cgroups, set their limits and move this process into them; the controllers joined.

    Rlimits bound each process; a cgroup bounds the submission: its processes together get one CPU (a
    kernel that forks spinners, each in a session of its own, cannot starve the submission graded beside it),
    one memory budget and a process count. A host without writable cgroup-v1 controllers keeps the rlimits.
    """
    joined = []
    for ctrl, folder in cgroup_dirs(name).items():
        parent = os.path.dirname(folder)
        for old in os.listdir(parent) if os.path.isdir(parent) else []:
            if old.startswith("run-"):  # left by a grader that was killed: rmdir removes only an empty cgroup
                try:  # (and only an old one: a run starting beside this one has made its cgroup but not joined it)
                    if time.time() - os.stat(os.path.join(parent, old)).st_mtime > 600:
                        os.rmdir(os.path.join(parent, old))
                except OSError:
                    pass
        try:
            os.makedirs(folder, exist_ok=True)
            for key, value in cgroup_limits(memory_mb)[ctrl].items():
                with open(os.path.join(folder, key), "w") as f:
                    f.write(value)
            with open(os.path.join(folder, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            joined.append(ctrl)
        except OSError:
            pass
    return joined


def remove_cgroups(name: str) -> None:
    """Remove the run's cgroups (after its processes are gone; an empty cgroup is removed with rmdir)."""
    for folder in cgroup_dirs(name).values():
        try:
            os.rmdir(folder)
        except OSError:
            pass


def arm_parent_death() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies (PR_SET_PDEATHSIG); False where it cannot.

    The jail's init calls it after its change of uid (which clears the setting); our death ends the
    namespace, the kernel with it. specref_grading/wall.py's die_with_parent calls it in every child.
    """
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0) == 0  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def _bind(src: str, root: str, read_only: bool = True) -> None:
    dst = os.path.join(root, src.lstrip("/"))
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    _mount("--bind", src, dst)
    if read_only:
        _mount("-o", "remount,bind,ro,nosuid,nodev", dst)


def launch(config: dict) -> None:
    """Build the root, lock this process in it, drop to the run's uid and become the kernel."""
    root, uid = config["root"], int(config["uid"])
    os.makedirs(root, exist_ok=True)
    _mount("-t", "tmpfs", "-o", "size=16m,mode=755,nosuid,nodev", "tmpfs", root)
    for link in ("/bin", "/lib", "/lib64", "/lib32", "/sbin", "/libx32"):
        if os.path.islink(link):
            os.symlink(os.readlink(link), os.path.join(root, link.lstrip("/")))
    for path in config["read_only"]:
        _bind(path, root)
    for dev in ("null", "zero", "full", "random", "urandom"):
        if os.path.exists(f"/dev/{dev}"):
            _bind(f"/dev/{dev}", root, read_only=False)
    os.makedirs(os.path.join(root, "proc"), exist_ok=True)
    _mount("-t", "proc", "-o", "nosuid,nodev,noexec", "proc", os.path.join(root, "proc"))
    os.makedirs(os.path.join(root, "tmp"), exist_ok=True)  # its own bounded tmpfs: it cannot fill the host's disk
    _mount("-t", "tmpfs", "-o", f"size={TMP_MB}m,mode=700,uid={uid},gid={uid},nosuid,nodev", "tmpfs",
           os.path.join(root, "tmp"))
    if config.get("cgroup"):
        join_cgroups(config["cgroup"], int(config["memory_mb"]))
    _mount("-o", "remount,ro,nosuid,nodev", root)
    os.chroot(root)
    os.chdir("/tmp")
    libc = ctypes.CDLL(None, use_errno=True)
    pr_capbset_drop, pr_set_no_new_privs = 24, 38
    for cap in range(64):
        libc.prctl(pr_capbset_drop, cap, 0, 0, 0)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    arm_parent_death()  # a change of uid clears unshare's --kill-child: armed again, or a stopped grader leaves us
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    memory = int(config["memory_mb"]) << 20
    for lim, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, 256 << 20),
                       (resource.RLIMIT_DATA, memory), (resource.RLIMIT_NPROC, 256), (resource.RLIMIT_NOFILE, 256)):
        try:
            resource.setrlimit(lim, (value, value))
        except (ValueError, OSError):
            pass
    os.umask(0o077)
    fds = [int(config["rfd"]), int(config["wfd"])]
    kernel = os.fork()  # the kernel is not the namespace's init (pid 1 ignores the signals it sends itself)
    if kernel == 0:
        os.execve(config["python"], [config["python"], "-I", "-c", config["source"], *map(str, fds)], config["env"])
    for fd in fds:
        os.close(fd)
    while True:  # init: reap every orphan; leave (which kills the namespace) when the kernel is gone
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(0)
        if pid == kernel:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "launch":
    launch(json.loads(sys.argv[2]))
