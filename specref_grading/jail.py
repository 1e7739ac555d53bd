"""The jailed kernel: where a submission's code runs, and how it is locked in.

specref_grading/trust/wall.py starts, as root,

    unshare --mount --net --pid --ipc --uts --fork --kill-child --propagation private -- \\
        python -I -m specref_grading.jail launch CONFIG

`launch` (this file, still root, inside the new namespaces) builds a root folder of its own: a
tmpfs holding read-only bind mounts of /usr, /etc and the interpreter, the virtual environment
and the specref package (nothing else of the repository: no solutions/, no tools/, no other
submission; an installed copy of the grader or of specref under those binds, as a non-editable install leaves
in site-packages, is covered by an empty read-only tmpfs: `hidden_paths`), a few device nodes, a fresh /proc, and a tmpfs of its own (TMP_MB) as /tmp, mounted before
those binds: a venv or checkout under /tmp is bound at its own path inside it, and nothing else of the host's
/tmp (no other submission, no grader's work folder) is there. It moves into the run's cgroup (one CPU, one memory
budget, a process count) where the host has writable cgroups, v1 or v2 (`join_cgroups`).
It changes root into it, drops every capability from the bounding set, takes the run's fresh
unprivileged uid and gid (no groups), sets no_new_privs and the resource limits, and starts the
kernel as its child (it stays the namespace's init, reaping orphans, and leaves with the kernel's
status, 128 + N for signal N): `python -I -c <kernel_program(KERNEL)>` (specref_grading/trust/program.py: the
trusted core's kernel-side modules, then KERNEL).
The network namespace has only a loopback interface, which is down: no network.

The kernel serves calls from the trusted process (specref_grading/trust/trusted.py) over two pipes: `exec`
runs a cell's source in the kernel's namespace (the solution's setup cells, the learner's answer
cells and the exercise's other cells; never a test cell), `get` hands out a name the cells bound,
and every object it hands out can be called back (specref_grading/trust/calls.py). It holds no key, no test,
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

KERNEL = r'''
def _jail_main():
    import builtins
    rfd, wfd = int(sys.argv[1]), int(sys.argv[2])
    # The grader is not on the kernel's filesystem (its specref is kernel_tree's copy), but an editable install's
    # namespace finder would still make an empty package of the name: importing it fails instead.
    sys.modules["specref_grading"] = None
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

    def op_bind(values):  # what the trusted process serves the setup (specref_grading/trust/kernel_tree.py)
        if type(values) is not dict or any(type(k) is not str or not k.isidentifier() for k in values):
            raise TypeError("bind takes a dict of names")
        ns.update(values)

    Peer(rfd, wfd, "jail", ops={"exec": op_exec, "get": op_get, "bind": op_bind}).serve_forever()


import sys  # noqa: E402
try:
    _jail_main()
finally:
    import os as _os
    _os._exit(0)
'''


def read_only_paths(with_specref: bool = True) -> list[str]:
    """What the kernel may read: the system, the interpreter, the environment, the specref package.

    `with_specref=False` leaves the package out: the exercise's copy of it (specref_grading/trust/kernel_tree.py, no
    answer key) is bound at its path instead (`launch`'s config "specref": [copy, package path]).
    """
    import importlib.util
    paths = ["/usr", "/etc", os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), sys.prefix,
             os.path.dirname(os.path.realpath(sys.executable))]
    spec = importlib.util.find_spec("specref")
    if with_specref and spec is not None and spec.origin:
        paths.append(os.path.dirname(os.path.realpath(spec.origin)))
    out: list[str] = []
    for p in paths:
        if p and os.path.isdir(p) and p != "/" and p not in out:
            out.append(p)
    return out


def hidden_paths(read_only: list[str], keep: list[str] = (), search: list[str] | None = None,
                 grader: list[str] | None = None) -> list[str]:
    """The folders under the read-only binds that the kernel must not read, as it sees them: `launch` mounts an
    empty read-only tmpfs over each.

    A non-editable install (``pip install .``) puts the grader (specref_grading: its checks, the hidden specs) and
    the real specref (the exercise's reference answers) into site-packages, under the bound environment. Hidden:
    specref_grading's folder (`grader`: where importlib finds it) and any specref_grading or specref folder on the
    import path (`search`: sys.path), where they lie under a bound path, at each path it is bound at; except the
    folders in `keep` (where the exercise's copy of specref is bound).
    """
    import importlib.util
    if grader is None:
        spec = importlib.util.find_spec("specref_grading")
        grader = [os.path.dirname(spec.origin)] if spec is not None and spec.origin else list(
            getattr(spec, "submodule_search_locations", None) or [])
    found = [os.path.realpath(g) for g in grader]
    for entry in sys.path if search is None else search:
        for name in ("specref_grading", "specref"):
            if entry and os.path.isdir(os.path.join(entry, name)):
                found.append(os.path.realpath(os.path.join(entry, name)))
    kept = {os.path.realpath(k) for k in keep}
    out: list[str] = []
    for path in found:
        if path in kept:
            continue
        for bound in read_only:
            real = os.path.realpath(bound)
            if os.path.commonpath([path, real]) == real:  # seen inside at the bind's own path
                at = os.path.normpath(os.path.join(bound, os.path.relpath(path, real)))
                if at not in out and os.path.realpath(at) not in kept:
                    out.append(at)
    return out


def command(config: dict) -> list[str]:
    """The command that starts the jailed kernel (as root)."""
    return ["unshare", "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child",
            "--propagation", "private", "--", sys.executable, "-I", "-m", "specref_grading.jail", "launch",
            json.dumps(config)]


CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_PARENT = "specref-grade"
TMP_MB = 512  # the kernel's /tmp: a tmpfs of this size, charged to its memory


CONTROLLERS = ("cpu", "memory", "pids")


def cgroup_version(root: str | None = None) -> int:
    """2 where `root` is the unified hierarchy (cgroup v2: one tree, a cgroup.controllers file at its top), 1 where
    it holds cgroup-v1 controllers (a folder per controller: cpu/, memory/, pids/; a hybrid host's v2 tree under
    unified/ has none of them), 0 where neither."""
    root = root or CGROUP_ROOT
    if os.path.isfile(os.path.join(root, "cgroup.controllers")):
        return 2
    return 1 if any(os.path.isdir(os.path.join(root, c)) for c in CONTROLLERS) else 0


def cgroup_limits(memory_mb: int, pids: int = 128, version: int = 1) -> dict[str, dict[str, str]]:
    """The limits of one run's cgroup, per controller: at most one CPU's time, `memory_mb` of memory for all its
    processes together (a jail's /tmp included), at most `pids` processes and threads; in the files of cgroup v1
    (`version` 1) or v2."""
    if version == 2:
        return {"cpu": {"cpu.max": "100000 100000"}, "memory": {"memory.max": str(memory_mb << 20)},
                "pids": {"pids.max": str(pids)}}
    return {"cpu": {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"},
            "memory": {"memory.limit_in_bytes": str(memory_mb << 20)},
            "pids": {"pids.max": str(pids)}}


GRADER_LEAF = "specref-grader"  # cgroup v2: where the grader's own cgroup's processes move, if they must


def own_cgroups(text: str | None = None) -> dict[str, str]:
    """{controller: this process's cgroup path} from /proc/self/cgroup (`text`, for a test): one entry per cgroup-v1
    controller ("4:memory:/user.slice" gives memory), and "" for the unified (v2) hierarchy ("0::/user.slice")."""
    if text is None:
        try:
            with open("/proc/self/cgroup") as f:
                text = f.read()
        except OSError:
            text = ""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        if parts[0] == "0" and parts[1] == "":
            out[""] = parts[2]
        for ctrl in parts[1].split(","):
            if ctrl:
                out[ctrl] = parts[2]
    return out


def grader_cgroup(path: str) -> str:
    """The grader's own cgroup, given the path of a process of the grading: above the grader's leaf
    (GRADER_LEAF) and above a run's cgroup (CGROUP_PARENT/run-*), where a process of the run may sit."""
    parts = [p for p in path.split("/") if p]
    if parts and parts[-1] == GRADER_LEAF:
        parts.pop()
    if len(parts) >= 2 and parts[-2] == CGROUP_PARENT:
        parts = parts[:-2]
    return "/" + "/".join(parts)


def cgroup_dirs(name: str, root: str | None = None, version: int | None = None,
                own: dict[str, str] | None = None) -> dict[str, str]:
    """{controller: the folder of the run's cgroup}, under the grader's own cgroup (`own`: `own_cgroups`), never at
    the hierarchy's root: a limit the instructor put around grading (a systemd slice, a container, a batch job)
    then holds the learner's code too. cgroup v1: one folder per controller, ROOT/<controller>/<the grader's
    path in that hierarchy>/specref-grade/NAME; v2: one leaf ROOT/<the grader's path>/specref-grade/NAME for all
    three."""
    root = root or CGROUP_ROOT
    version = cgroup_version(root) if version is None else version
    own = own_cgroups() if own is None else own
    if version == 2:
        base = grader_cgroup(own.get("", "/")).lstrip("/")
        return {ctrl: os.path.join(root, base, CGROUP_PARENT, name) for ctrl in CONTROLLERS}
    out = {}
    for ctrl in CONTROLLERS:
        mount = os.path.join(root, ctrl)
        if not os.path.isdir(mount):  # mounted as a list of controllers only ("cpu,cpuacct")
            mount = next((os.path.join(root, d) for d in sorted(os.listdir(root)) if ctrl in d.split(",")), mount) \
                if os.path.isdir(root) else mount
        out[ctrl] = os.path.join(mount, grader_cgroup(own.get(ctrl, "/")).lstrip("/"), CGROUP_PARENT, name)
    return out


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _sweep(parent: str) -> None:
    for old in os.listdir(parent) if os.path.isdir(parent) else []:
        if old.startswith("run-"):  # left by a grader that was killed: rmdir removes only an empty cgroup
            try:  # (and only an old one: a run starting beside this one has made its cgroup but not joined it)
                if time.time() - os.stat(os.path.join(parent, old)).st_mtime > 600:
                    os.rmdir(os.path.join(parent, old))
            except OSError:
                pass


def _enable_controllers(folder: str) -> bool:
    """cgroup v2: let `folder`'s children use cpu, memory and pids (those the folder has), one at a time; whether
    memory is now theirs (refused, EBUSY, while `folder` itself holds processes; not asked where it lacks it)."""
    try:
        with open(os.path.join(folder, "cgroup.controllers")) as f:
            have = f.read().split()
    except OSError:
        have = list(CONTROLLERS)
    memory = "memory" not in have
    for ctrl in CONTROLLERS:
        if ctrl in have:
            try:
                _write(os.path.join(folder, "cgroup.subtree_control"), f"+{ctrl}")
                memory = memory or ctrl == "memory"
            except OSError:
                pass
    return memory


def _move_into_leaf(folder: str) -> bool:
    """cgroup v2: move every process of `folder` into its child GRADER_LEAF (v2 lets a cgroup hand controllers to
    its children only while it holds no process itself); whether `folder` is now empty of processes."""
    leaf = os.path.join(folder, GRADER_LEAF)
    try:
        os.makedirs(leaf, exist_ok=True)
        for _ in range(3):  # a process forked meanwhile is moved on the next pass
            with open(os.path.join(folder, "cgroup.procs")) as f:
                pids = f.read().split()
            if not pids:
                return True
            for pid in pids:
                try:
                    _write(os.path.join(leaf, "cgroup.procs"), pid)
                except OSError:
                    pass
    except OSError:
        return False
    return False


def _v2_parent(root: str, base: str) -> str | None:
    """cgroup v2: make ROOT/BASE/specref-grade with cpu, memory and pids enabled for its children; None where that
    cannot be done (the controllers are not delegated down to the grader's cgroup)."""
    folder = root
    for part in [p for p in base.split("/") if p]:  # each level hands the controllers down to the next
        _enable_controllers(folder)
        folder = os.path.join(folder, part)
    if not _enable_controllers(folder) and not (folder != root and _move_into_leaf(folder)
                                                 and _enable_controllers(folder)):
        return None
    parent = os.path.join(folder, CGROUP_PARENT)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError:
        return None
    _enable_controllers(parent)
    return parent


def join_cgroups(name: str, memory_mb: int, root: str | None = None, pid: int | None = None,
                 pids: int = 128, own: dict[str, str] | None = None) -> list[str]:
    """Make the run's cgroup(s) under the grader's own cgroup (`cgroup_dirs`), set their limits and move process
    `pid` (default: this one) in; the controllers whose limits took.

    Rlimits bound each process; a cgroup bounds the run: its processes together get one CPU (a kernel that forks
    spinners, each in a session of its own, cannot starve the submission graded beside it), one memory budget and
    a process count, and every limit on the grader's own cgroup holds them too. cgroup v1 (a hierarchy per
    controller) and v2 (the unified hierarchy: the controllers are enabled down to the grader's cgroup and in its
    specref-grade child, and the processes sit only in the leaves specref-grade/run-*, v2's rule of no processes in
    a cgroup whose children have controllers; where the grader's cgroup holds processes, they move into its leaf
    GRADER_LEAF first) are both handled, whichever `cgroup_version` finds. A host without writable cgroups keeps
    the rlimits alone (returns []).
    """
    root = root or CGROUP_ROOT
    version = cgroup_version(root)
    if version == 0:
        return []
    own = own_cgroups() if own is None else own
    pid = os.getpid() if pid is None else pid
    limits = cgroup_limits(memory_mb, pids, version)
    folders = cgroup_dirs(name, root, version, own)
    if version == 2:
        parent = _v2_parent(root, grader_cgroup(own.get("", "/")))
        if parent is None:
            return []
        _sweep(parent)
        try:
            os.makedirs(folders["cpu"], exist_ok=True)
        except OSError:
            return []
        took = []
        for ctrl in CONTROLLERS:
            try:
                for key, value in limits[ctrl].items():
                    _write(os.path.join(folders[ctrl], key), value)
                took.append(ctrl)
            except OSError:
                pass
        try:
            _write(os.path.join(folders["cpu"], "cgroup.procs"), str(pid))
        except OSError:
            return []
        return took
    joined = []
    for ctrl, folder in folders.items():
        _sweep(os.path.dirname(folder))
        try:
            os.makedirs(folder, exist_ok=True)
            for key, value in limits[ctrl].items():
                _write(os.path.join(folder, key), value)
            _write(os.path.join(folder, "cgroup.procs"), str(pid))
            joined.append(ctrl)
        except OSError:
            pass
    return joined


def remove_cgroups(name: str, root: str | None = None, own: dict[str, str] | None = None) -> None:
    """Remove the run's cgroups (after its processes are gone; an empty cgroup is removed with rmdir). A process
    just killed may leave its cgroup busy for a moment: tried for up to a second, then left to `_sweep`."""
    for folder in set(cgroup_dirs(name, root, own=own).values()):
        for _ in range(20):
            try:
                os.rmdir(folder)
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno != 16:  # EBUSY: still has a process
                    break
                time.sleep(0.05)
                continue
            break


def arm_parent_death() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies (PR_SET_PDEATHSIG); False where it cannot.

    The jail's init calls it after its change of uid (which clears the setting); our death ends the
    namespace, the kernel with it. specref_grading/trust/wall.py's die_with_parent calls it in every child.
    """
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0) == 0  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def _bind(src: str, root: str, read_only: bool = True, at: str | None = None) -> None:
    dst = os.path.join(root, (at or src).lstrip("/"))
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
    exposed = [p for p in config["read_only"] if os.path.commonpath([os.path.realpath(p), os.path.realpath(root)])
               == os.path.realpath(p)]
    if exposed:  # the grader's work folder (its logs, the trusted process's output) would be readable inside
        raise SystemExit(f"the jail's root {root} lies inside {exposed[0]}, which the kernel would read")
    os.makedirs(root, exist_ok=True)
    _mount("-t", "tmpfs", "-o", "size=16m,mode=755,nosuid,nodev", "tmpfs", root)
    for link in ("/bin", "/lib", "/lib64", "/lib32", "/sbin", "/libx32"):
        if os.path.islink(link):
            os.symlink(os.readlink(link), os.path.join(root, link.lstrip("/")))
    # The kernel's /tmp first: its own bounded tmpfs (it cannot fill the host's disk, and sees none of the host's
    # /tmp: no other submission, no grader's work folder); the read-only binds below may then lie under /tmp
    # (a checkout or a venv in /tmp), each at its own path inside that empty tmpfs.
    os.makedirs(os.path.join(root, "tmp"), exist_ok=True)
    _mount("-t", "tmpfs", "-o", f"size={TMP_MB}m,mode=700,uid={uid},gid={uid},nosuid,nodev", "tmpfs",
           os.path.join(root, "tmp"))
    for path in config["read_only"]:
        _bind(path, root)
    for path in config.get("hide", []):  # the grader, or another specref, under a bound path (`hidden_paths`)
        dst = os.path.join(root, path.lstrip("/"))
        if os.path.isdir(dst):
            _mount("-t", "tmpfs", "-o", "size=4k,mode=555,ro,nosuid,nodev,noexec", "tmpfs", dst)
    if config.get("specref"):  # the exercise's copy of specref (kernel_tree: no answer key), at the package's path
        _bind(config["specref"][0], root, at=config["specref"][1])
    for dev in ("null", "zero", "full", "random", "urandom"):
        if os.path.exists(f"/dev/{dev}"):
            _bind(f"/dev/{dev}", root, read_only=False)
    os.makedirs(os.path.join(root, "proc"), exist_ok=True)
    _mount("-t", "proc", "-o", "nosuid,nodev,noexec", "proc", os.path.join(root, "proc"))
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
