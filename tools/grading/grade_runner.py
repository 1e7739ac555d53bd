"""The grading kernel: runs a submission's cells and checks its test cells, in a process of its own.

tools/grading/grade.py starts this file's source with ``python -I -c`` as an unprivileged user
(when grading as root), in an empty temporary folder, and writes the plan to its stdin:

    {"secret": hex, "fd": n, "cells": [{"n": cell index, "role": "setup" | "answer" |
     "other" | "test", "grade_id": str | null, "source": str}, ...]}

The cells are the solution's setup cells, the learner's answer cells (by grade_id), the
exercise's other code cells, and the solution's test cells, in the solution's order. Each
test cell's result is reported as soon as it is known; when this process dies or hangs,
tools/grading/grade.py starts a fresh one for the tests that remain.
Events go to fd ``n`` as JSON lines, each signed with HMAC(secret): the grader ignores
anything unsigned, so code that prints or writes to the pipe cannot pass a test for it.

The learner's code runs in this process, so nothing here is a secret from code that
inspects memory (frames, gc, ctypes); tools/grading/grade.py flags such code before it runs. What
this file does against code that does not go that far:

* before the test cell, everything the exercise's setup bound (names and the contents of the
  lists, dicts and sets among them, modules, classes, functions' code, sys hooks, torch's
  function modes, sys.modules) is compared with a
  snapshot taken before the first answer cell ran, put back, and every difference is
  reported as interference;
* the test cell sees the setup's own objects, never names the learner rebound;
* the learner's functions are called through a guard: what they return is copied into
  plain Python, torch and numpy objects (no lying ``__eq__``, no tensor subclasses), and
  inputs that they modify, objects of the learner's own classes and the like are reported;
* the same comparison runs again after the test, since the check called the learner's code;
* the result is decided here, from whether the test cell raised, and signed; the process
  then leaves with ``os._exit`` so no ``atexit`` or finalizer of the learner's runs after.
"""

import builtins
import gc
import hashlib
import hmac
import json
import os
import sys
import threading
import traceback
import types

_plan = json.loads(sys.stdin.buffer.read().decode("utf-8"))
sys.stdin.close()
try:
    _fd0 = os.open(os.devnull, os.O_RDONLY)
    os.dup2(_fd0, 0)
except OSError:
    pass
_SECRET = bytes.fromhex(_plan.pop("secret"))
_FD = _plan["fd"]
_write, _hmac_new, _sha256, _dumps = os.write, hmac.new, hashlib.sha256, json.dumps
_exit, _type, _id, _isinstance, _issubclass = os._exit, type, id, isinstance, issubclass
_FunctionType, _ModuleType = types.FunctionType, types.ModuleType
_list, _dict, _tuple, _len, _str, _repr, _vars = list, dict, tuple, len, str, repr, vars
_Thread_count = threading.active_count
_gettrace, _getprofile, _settrace, _setprofile = sys.gettrace, sys.getprofile, sys.settrace, sys.setprofile
_BaseException_str = BaseException.__str__
_MAX_MESSAGE = 20000


def _emit(event):
    data = _dumps(event, default=_str, ensure_ascii=True)
    mac = _hmac_new(_SECRET, data.encode("ascii"), _sha256).hexdigest()
    line = (mac + " " + data + "\n").encode("ascii")
    while line:
        n = _write(_FD, line)
        line = line[n:]


def _text(e):
    """An exception's message without running the learner's __str__ (it may lie or raise)."""
    try:
        s = _BaseException_str(e)
    except Exception:  # noqa: BLE001
        s = "<message could not be read>"
    return s if _len(s) <= _MAX_MESSAGE else s[:_MAX_MESSAGE] + " [...]"


def _describe(e, filename):
    """'TypeName: message' plus the last lines of the traceback that lie in `filename`."""
    name = _type(e).__name__
    where = ""
    try:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == filename]
        if frames:
            where = f" (line {frames[-1].lineno})"
    except Exception:  # noqa: BLE001
        pass
    if _isinstance(e, SyntaxError):
        where = f" (line {e.lineno})"
        return f"SyntaxError{where}: {e.msg}"
    return f"{name}{where}: {_text(e)}"


# --------------------------------------------------------------------------------------
# Snapshots of everything the checks rely on
# --------------------------------------------------------------------------------------
_SYS_HOOKS = ("excepthook", "displayhook", "breakpointhook", "unraisablehook", "stdout", "stderr", "meta_path",
              "path_hooks", "path_importer_cache")


def _torch_state():
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    state = {}
    for key, fn in (("default dtype", "get_default_dtype"), ("grad enabled", "is_grad_enabled")):
        try:
            state[key] = getattr(torch, fn)()
        except Exception:  # noqa: BLE001
            pass
    try:
        state["torch function modes"] = torch._C._len_torch_function_stack()
    except Exception:  # noqa: BLE001
        pass
    try:
        from torch.utils._python_dispatch import _len_torch_dispatch_stack
        state["torch dispatch modes"] = _len_torch_dispatch_stack()
    except Exception:  # noqa: BLE001
        pass
    return state


class _Snapshot:
    def __init__(self, setup_ns):
        self.modules = {}  # name -> (module, dict copy)
        self.classes = {}  # id -> (class, dict copy)
        self.functions = {}  # id -> (function, code, defaults, kwdefaults)
        self.known_types = set()
        if True:  # no attribute of a module's objects is read here: lazy or deprecated ones would warn or load
            for name, mod in _list(sys.modules.items()):
                if not _issubclass(_type(mod), _ModuleType):
                    continue
                try:
                    d = _dict(_vars(mod))
                except TypeError:
                    continue
                self.modules[name] = (mod, d)
                for v in d.values():
                    self._add(v)
            self.modules["the exercise's setup"] = (setup_ns, _dict(setup_ns))
            for v in setup_ns.values():
                self._add(v)
            self.contents = {}  # id -> (name, container, its items): what the setup's lists, dicts and sets hold
            for k, v in setup_ns.items():
                self._add_contents(k, v, 0)
            for t in (int, float, bool, complex, str, bytes, list, tuple, dict, set, frozenset, object, type,
                      BaseException, Exception, AssertionError):
                self._add(t)
        self.sys_modules = _dict(sys.modules)
        self.hooks = {k: getattr(sys, k, None) for k in _SYS_HOOKS}
        self.hook_lists = {k: _list(getattr(sys, k)) for k in ("meta_path", "path_hooks")}
        self.torch = _torch_state()
        self.threads = _Thread_count()

    def _add(self, v):
        t = _type(v)
        if t is _FunctionType:
            self.functions[_id(v)] = (v, v.__code__, v.__defaults__, v.__kwdefaults__)
        elif _issubclass(t, type) and _id(v) not in self.classes:
            try:
                cd = _dict(v.__dict__)
            except Exception:  # noqa: BLE001
                return
            self.classes[_id(v)] = (v, cd)
            self.known_types.add(_id(v))
            for m in cd.values():
                if _type(m) in (staticmethod, classmethod):
                    m = m.__func__
                if _type(m) is _FunctionType:
                    self.functions[_id(m)] = (m, m.__code__, m.__defaults__, m.__kwdefaults__)

    def _add_contents(self, name, v, depth):
        """The items of a list, dict or set the setup bound (and of those inside it): a check that reads them
        (ex08's SAMPLERS) must not meet them cleared or edited in place, which comparing names alone misses."""
        t = _type(v)
        if depth > 4 or not (t is list or t is dict or t is set or t is tuple) or _id(v) in self.contents:
            return
        items = _list(dict.items(v)) if t is dict else _list(v)
        if t is not tuple:
            self.contents[_id(v)] = (name, v, items)
        for x in items:
            self._add_contents(name + "[...]", x[1] if t is dict else x, depth + 1)

    def compare_and_restore(self):
        """Every difference from the snapshot, described; each one is put back where Python allows."""
        found = []
        if True:
            for name, old in self.sys_modules.items():
                if sys.modules.get(name) is not old:
                    found.append(f"sys.modules[{name!r}] was replaced or removed")
                    sys.modules[name] = old
            for name, (mod, old) in self.modules.items():
                try:
                    now = mod if _type(mod) is dict else _vars(mod)
                except TypeError:
                    continue
                strict = name in ("builtins", "specref", "the exercise's setup") or name.startswith("specref.")
                for k, v in old.items():
                    if k not in now or now[k] is not v:
                        if k in ("__warningregistry__", "__loader__", "__spec__", "_"):
                            continue
                        found.append(f"{name}.{k} was changed")
                        try:
                            if _type(mod) is dict:
                                mod[k] = v
                            else:
                                setattr(mod, k, v)
                        except Exception:  # noqa: BLE001
                            pass
                if strict:
                    for k in _list(now):
                        if k not in old and k != "__warningregistry__" and not _issubclass(_type(now[k]), _ModuleType):
                            found.append(f"{name}.{k} was added")
                            try:
                                if _type(mod) is dict:
                                    del mod[k]
                                else:
                                    delattr(mod, k)
                            except Exception:  # noqa: BLE001
                                pass
            for cls, old in self.classes.values():
                try:
                    now = cls.__dict__
                except Exception:  # noqa: BLE001
                    continue
                for k, v in old.items():
                    if k not in now or now[k] is not v:
                        if k in ("__abstractmethods__", "_abc_impl", "__parameters__", "__weakref__") or k.startswith("_abc"):
                            continue
                        found.append(f"class {getattr(cls, '__qualname__', '?')}.{k} was changed")
                        try:
                            setattr(cls, k, v)
                        except Exception:  # noqa: BLE001
                            pass
                for k in now:
                    if k not in old and k.startswith("__") and k.endswith("__") and k not in (
                            "__annotations__", "__abstractmethods__", "__orig_bases__", "__parameters__",
                            "__slotnames__", "__weakref__", "__getstate__"):
                        found.append(f"class {getattr(cls, '__qualname__', '?')}.{k} was added")
                        try:
                            delattr(cls, k)
                        except Exception:  # noqa: BLE001
                            pass
            for f, code, defaults, kwdefaults in self.functions.values():
                if f.__code__ is not code or f.__defaults__ is not defaults or f.__kwdefaults__ is not kwdefaults:
                    found.append(f"the code of {getattr(f, '__module__', '?')}.{f.__qualname__} was changed")
                    f.__code__, f.__defaults__, f.__kwdefaults__ = code, defaults, kwdefaults
        for name, v, items in self.contents.values():
            t = _type(v)
            now = _list(dict.items(v)) if t is dict else _list(v)
            if t is set:
                changed = {_id(x) for x in now} != {_id(x) for x in items}
            elif t is dict:
                changed = _len(now) != _len(items) or any(a[0] is not b[0] or a[1] is not b[1]
                                                          for a, b in zip(now, items))
            else:
                changed = _len(now) != _len(items) or any(a is not b for a, b in zip(now, items))
            if changed:
                found.append(f"the contents of the exercise's {name} were changed in place")
                if t is dict:
                    dict.clear(v)
                    dict.update(v, items)
                elif t is set:
                    set.clear(v)
                    set.update(v, items)
                else:
                    list.__setitem__(v, slice(None), items)
        for k, v in self.hooks.items():
            if getattr(sys, k, None) is not v:
                found.append(f"sys.{k} was replaced")
                setattr(sys, k, v)
        for k, v in self.hook_lists.items():
            lst = getattr(sys, k)
            if _list(lst) != v or _len(lst) != _len(v):
                found.append(f"sys.{k} was changed")
                lst[:] = v
        if _gettrace() is not None:
            found.append("sys.settrace was used (a tracer watches the checks)")
            _settrace(None)
        if _getprofile() is not None:
            found.append("sys.setprofile was used")
            _setprofile(None)
        if threading._trace_hook is not None or threading._profile_hook is not None:
            found.append("threading.settrace/setprofile was used")
            threading._trace_hook = threading._profile_hook = None
        now = _torch_state()
        for k, v in self.torch.items():
            if now.get(k) != v:
                found.append(f"torch's {k} was changed ({now.get(k)} instead of {v})")
                torch = sys.modules.get("torch")
                try:
                    if k == "default dtype":
                        torch.set_default_dtype(v)
                    elif k == "grad enabled":
                        torch.set_grad_enabled(v)
                except Exception:  # noqa: BLE001
                    pass
        if _Thread_count() > self.threads:
            found.append(f"the submission started {_Thread_count() - self.threads} thread(s) that still run")
        return found


# --------------------------------------------------------------------------------------
# The guard around the learner's functions, and plain copies of what they return
# --------------------------------------------------------------------------------------
class _Guard:
    def __init__(self, snap):
        self.snap = snap
        self.flags = []
        torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
        self.torch, self.np = torch, np
        if torch is not None:
            self.Tensor, self.Parameter = torch.Tensor, torch.nn.Parameter
            self.detach, self.clone, self.as_subclass = torch.Tensor.detach, torch.Tensor.clone, torch.Tensor.as_subclass
            self.cpu, self.contiguous, self.numpy_ = torch.Tensor.cpu, torch.Tensor.contiguous, torch.Tensor.numpy
            self.equal, self.no_tf = torch.equal, torch._C.DisableTorchFunctionSubclass
        if np is not None:
            self.ndarray, self.np_array, self.generic = np.ndarray, np.array, np.generic

    def flag(self, text):
        if text not in self.flags:
            self.flags.append(text)

    def plain(self, x, what, depth=0):
        """A copy of x made of plain objects, so that comparing it runs no code of the learner's."""
        t = _type(x)
        if depth > 50:
            self.flag(f"{what} is nested too deeply to be checked")
            return None
        if t in (int, float, bool, complex, str, bytes, type(None), range):
            return x
        if t is list or t is tuple or t is set or t is frozenset:
            items = [self.plain(v, what, depth + 1) for v in t.__iter__(x)]
            return items if t is list else t(items)
        if t is dict:
            return {self.plain(k, what, depth + 1): self.plain(v, what, depth + 1) for k, v in dict.items(x)}
        if self.torch is not None and _issubclass(t, self.Tensor):
            if t is not self.Tensor and t is not self.Parameter:
                self.flag(f"{what} is a tensor of class {t.__qualname__}, not a torch.Tensor")
            with self.no_tf():
                y = self.as_subclass(x, self.Tensor)
                return self.clone(self.detach(y))
        if self.np is not None and _issubclass(t, self.ndarray):
            if t is not self.ndarray:
                self.flag(f"{what} is an array of class {t.__qualname__}, not a numpy.ndarray")
            return self.np_array(x, copy=True, subok=False)
        known = _id(t) in self.snap.known_types
        if self.np is not None and _issubclass(t, self.generic) and known:
            return x
        if _issubclass(t, bool):
            self.flag(f"{what} is of class {t.__qualname__}, defined in the submission")
            return bool.__bool__(x) if hasattr(bool, "__bool__") else int.__index__(x) != 0
        if _issubclass(t, int):
            if not known:
                self.flag(f"{what} is of class {t.__qualname__}, defined in the submission")
            return int.__index__(x)
        if _issubclass(t, float):
            if not known:
                self.flag(f"{what} is of class {t.__qualname__}, defined in the submission")
            return float.__float__(x)
        if _issubclass(t, tuple) and known:  # torch.return_types and named tuples of trusted modules
            return tuple(self.plain(v, what, depth + 1) for v in tuple.__iter__(x))
        if _issubclass(t, (list, tuple, dict, set, frozenset, str)):
            self.flag(f"{what} is of class {t.__qualname__}, defined in the submission")
            base = next(b for b in (list, tuple, dict, set, frozenset, str) if _issubclass(t, b))
            if base is dict:
                return {self.plain(k, what, depth + 1): self.plain(v, what, depth + 1) for k, v in dict.items(x)}
            if base is str:
                return str.__str__(x)
            return base(self.plain(v, what, depth + 1) for v in base.__iter__(x))
        if not known:
            self.flag(f"{what} is an object of class {getattr(t, '__qualname__', '?')}, defined in the submission "
                      "(it could answer comparisons with anything)")
        return x

    def _state(self, a):
        """What a call must not change about an argument the check passed in.

        Tensors, lists, dicts and sets: their contents. Other objects (models, caches,
        generators) may change their state, that is what they are for; but not their class,
        not their methods (an instance attribute that is callable), and for a torch module
        not its hooks, submodules, parameters or the parameters' values.
        """
        t = _type(a)
        if self.torch is not None and t is self.Tensor:
            try:
                return ("tensor", a._version, self.clone(self.detach(a)))
            except Exception:  # noqa: BLE001
                return None
        if t is list or t is set or t is dict:
            return ("container", t(a), _list(a.items()) if t is dict else None)
        try:
            d = object.__getattribute__(a, "__dict__")
        except Exception:  # noqa: BLE001
            return None
        if _type(d) is not dict:
            return None
        methods = {k: v for k, v in d.items() if callable(v) and not _issubclass(_type(v), type)}
        inner, versions = {}, None
        if self.torch is not None and _isinstance(a, self.torch.nn.Module):
            for k in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                      "_modules", "_parameters", "_forward_hooks_with_kwargs", "_state_dict_hooks"):
                if k in d and _type(d[k]) in (dict,) or _type(d.get(k)).__name__ == "OrderedDict":
                    inner[k] = dict(d[k])
            try:
                versions = [(p, p._version) for p in a.parameters()]
            except Exception:  # noqa: BLE001
                versions = None
        return ("object", t, methods, inner, versions)

    def _changed(self, a, state):
        if state is None:
            return False
        if state[0] == "tensor":
            try:
                return a._version != state[1] or not self.equal(self.detach(a), state[2])
            except Exception:  # noqa: BLE001
                return True
        if state[0] == "container":
            t = _type(a)
            if t is dict:
                now = _list(a.items())
                return _len(now) != _len(state[2]) or any(k1 is not k2 or v1 is not v2
                                                          for (k1, v1), (k2, v2) in zip(now, state[2]))
            if t is set:
                return a != state[1]
            return _len(a) != _len(state[1]) or any(x is not y for x, y in zip(a, state[1]))
        _, t, methods, inner, versions = state
        if _type(a) is not t:
            return True
        d = object.__getattribute__(a, "__dict__")
        now = {k: v for k, v in d.items() if callable(v) and not _issubclass(_type(v), type)}
        if set(now) != set(methods) or any(now[k] is not v for k, v in methods.items()):
            return True
        for k, v in inner.items():
            cur = d.get(k)
            if cur is None or set(cur) != set(v) or any(cur[j] is not w for j, w in v.items()):
                return True
        return bool(versions) and any(p._version != v for p, v in versions)

    def wrap(self, fn, name):
        guard = self

        def guarded(*args, **kwargs):
            states = [(a, guard._state(a)) for a in _tuple(args) + _tuple(kwargs.values())]
            out = fn(*args, **kwargs)
            for i, (a, st) in enumerate(states):
                if guard._changed(a, st):
                    guard.flag(f"{name}() changed an object that the check passed in (argument {i + 1}): "
                               "a function must not modify its input values, nor replace the methods, hooks or "
                               "weights of the models and generators it is given")
            return guard.plain(out, f"the value {name}() returned")

        try:
            guarded.__name__, guarded.__qualname__ = name, name
            guarded.__doc__ = fn.__doc__ if _type(getattr(fn, "__doc__", None)) is str else None
        except Exception:  # noqa: BLE001
            pass
        return guarded


# --------------------------------------------------------------------------------------
# Running the cells
# --------------------------------------------------------------------------------------
def _names_loaded(source):
    import ast
    return {n.id for n in ast.walk(ast.parse(source)) if _isinstance(n, ast.Name)}


def _cell_name(cell):
    return f"answer cell {cell.get('grade_id')!r}" if cell["role"] == "answer" else f"cell {cell['n']}"


def _run_test(test, ns, snap, trusted, trusted_fn, early_flags, answer_errors):
    _emit({"ev": "start", "n": test["n"], "role": "test"})
    flags = early_flags + [f"before the test: {d}" for d in snap.compare_and_restore()]
    guard = _Guard(snap)
    tns = {"__name__": "__main__", "__builtins__": builtins, "display": print}
    for name in sorted(_names_loaded(test["source"])):
        if name in trusted:
            if ns.get(name) is not trusted[name]:
                flags.append(f"the answer cells rebound {name!r}, which the exercise's setup defines (the test used "
                             "the exercise's own)")
            tns[name] = trusted[name]
        elif name in ns:
            v = ns[name]
            tns[name] = guard.wrap(v, name) if callable(v) and not _isinstance(v, type) else guard.plain(v, name)
    for k, (f, code, defaults) in trusted_fn.items():
        if f.__code__ is not code or f.__defaults__ is not defaults:
            flags.append(f"the code of the exercise's function {k}() was changed")
            f.__code__, f.__defaults__ = code, defaults
    filename = f"<test cell {test['n']}>"
    outcome, message = "passed", ""
    try:
        code = compile(test["source"], filename, "exec", dont_inherit=True)
        exec(code, tns)  # noqa: S102
    except AssertionError as e:
        outcome, message = "failed", _text(e)
    except NotImplementedError as e:
        outcome, message = "failed", "not implemented yet: an answer still raises NotImplementedError" + (
            f" ({_text(e)})" if _text(e) else "")
    except Exception as e:  # noqa: BLE001
        outcome, message = "error", _describe(e, filename)
    except BaseException as e:  # noqa: BLE001
        outcome, message = "error", _describe(e, filename)
        flags.append(f"the check was interrupted by {_type(e).__name__} raised from the submission's code")
    flags += [f"during the test: {d}" for d in snap.compare_and_restore()]
    flags += guard.flags
    _emit({"ev": "result", "n": test["n"], "grade_id": test.get("grade_id"), "outcome": outcome,
           "message": message, "flags": flags, "answer_errors": _list(answer_errors)})


def _main():
    """Run the cells in order; each test cell is checked as described above, and reported at once."""
    cells = _plan["cells"]
    # The setup runs in a namespace of its own: functions it defines look their globals up there,
    # where the learner's cells (which run in a copy) cannot rebind them.
    ns = setup_ns = {"__name__": "__main__", "__builtins__": builtins, "display": print}
    snap = trusted = trusted_fn = None
    answer_errors, early_flags = [], []
    for cell in cells:
        n, role, source = cell["n"], cell["role"], cell["source"]
        if role != "setup" and snap is None:
            snap = _Snapshot(setup_ns)
            ns = dict(setup_ns)
            trusted = dict(setup_ns)
            trusted_fn = {k: (v, v.__code__, v.__defaults__) for k, v in ns.items() if _type(v) is _FunctionType}
        if role == "test":
            _run_test(cell, ns, snap, trusted, trusted_fn, early_flags, answer_errors)
            continue
        _emit({"ev": "start", "n": n, "role": role})
        filename = f"<{role} cell {n}>"
        try:
            code = compile(source, filename, "exec", dont_inherit=True)
            exec(code, ns)  # noqa: S102 - running the cells is the point
        except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt of a cell are its errors too
            message = _describe(e, filename)
            _emit({"ev": "cell_error", "n": n, "role": role, "grade_id": cell.get("grade_id"), "message": message})
            if role == "setup":
                _exit(0)
            answer_errors.append(f"{role} cell {cell.get('grade_id') or n}: {message}")
        if snap is not None:  # put back at once what the cell changed: this file's own code relies on it too
            early_flags += [f"after {_cell_name(cell)}: {d}" for d in snap.compare_and_restore()]
        _emit({"ev": "end", "n": n})
    _emit({"ev": "done"})


try:
    _main()
except BaseException as _e:  # noqa: BLE001
    try:
        _emit({"ev": "internal_error", "message": _describe(_e, "")})
    except BaseException:  # noqa: BLE001
        pass
try:
    sys.stdout.flush()
    sys.stderr.flush()
except BaseException:  # noqa: BLE001
    pass
gc.disable()
_exit(0)
