"""The dataset catalog from Python: register, derive, list, inspect and remove datasets.

    import carpool.datasets as cds
    cds.add("fmnist", idx=("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"))
    cds.derive("fm-shoes", "fmnist", classes=[5, 7, 9])
    cds.info("fm-shoes")["samples"]

Each call runs `carpool dataset VERB ... --json` (the binary that carpool.binary() finds) and
returns its JSON object as a dict: the package links no catalog, and with a `--group` server the
catalog is the server user's, which that user's CLI opens. Errors of the CLI (a taken name, an
unknown dataset, an empty selection) raise CarpoolError with its message (InvalidArgumentError,
also a ValueError, for the CLI's InvalidArgument; NotFoundError, also a LookupError, for NotFound);
arguments this module can check itself raise ValueError or TypeError first. docs/python.md,
"Datasets".
"""

from __future__ import annotations

import builtins
import json
import numbers
import os
import subprocess
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _args, _ffi
from ._ffi import CarpoolError
from .server import binary

PathLike = Union[str, "os.PathLike[str]"]


def _run(verb: str, args: Sequence[str], state_dir: Optional[PathLike]) -> Dict[str, Any]:
    """Runs `carpool dataset VERB ARGS --json [--state-dir D]`; its object, or CarpoolError."""
    cmd = [binary(), "dataset", verb, *args, "--json"]
    state_dir = _args.optional_path("state_dir", state_dir)
    if state_dir is not None:
        cmd += ["--state-dir", state_dir]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    try:
        out = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        out = None
    if not isinstance(out, dict):
        raise CarpoolError(f"'{' '.join(cmd)}' exited with {r.returncode} without a JSON object "
                           f"(stdout: {r.stdout.strip()[-500:]!r}, stderr: "
                           f"{r.stderr.strip()[-500:]!r}); is {cmd[0]} a carpool with --json?", 9)
    if "error" in out or r.returncode != 0:
        code = out.get("code")
        raise _ffi.error(str(out.get("error", f"exit {r.returncode}")),
                         code if isinstance(code, int) else 9)
    # Warnings (unreadable files, relabelled samples) stay text on stderr; keep them.
    out["warnings"] = [ln for ln in r.stderr.splitlines() if ln.strip()]
    return out


def _name(value: Any, what: str = "name") -> str:
    name = _args.text(what, value, allow_empty=False)
    if name.startswith("-"):
        raise ValueError(f"{what} {name!r} starts with '-'; dataset names are letters, digits, "
                         "'.', '_' and '-', not starting with '-' or '.'")
    return name


def _common(prepare: Optional[str], replace: bool) -> List[str]:
    out = []
    if prepare is not None:
        out += ["--prepare", _args.text("prepare", prepare, allow_empty=False)]
    if not isinstance(replace, bool):
        raise TypeError(f"replace must be True or False, got {replace!r}")
    if replace:
        out.append("--replace")
    return out


def add(name: str, *, dir: Optional[PathLike] = None, list: Optional[PathLike] = None,
        idx: Optional[Tuple[PathLike, PathLike]] = None,
        tar: Optional[Union[PathLike, Sequence[PathLike]]] = None,
        prepare: Optional[str] = None, replace: bool = False, strict: bool = False,
        state_dir: Optional[PathLike] = None) -> Dict[str, Any]:
    """Registers a source: exactly one of dir= (an image folder), list= (a path,label CSV),
    idx=(images, labels) (IDX ubyte files) or tar= (shards: a brace pattern, a glob, or paths).
    Returns the dataset (name, samples, ids, classes, prepare, source, created_unix) with
    new_samples, unreadable, duplicates, label_conflicts and warnings."""
    args = ["--name", _name(name)]
    given = [k for k, v in (("dir", dir), ("list", list), ("idx", idx), ("tar", tar))
             if v is not None]
    if len(given) != 1:
        raise ValueError(f"add({name!r}) needs exactly one source of dir=, list=, idx=(images, "
                         f"labels), tar=; got {given or 'none'}")
    if dir is not None:
        args += ["--dir", _args.path("dir", dir)]
    elif list is not None:
        args += ["--list", _args.path("list", list)]
    elif idx is not None:
        if isinstance(idx, (str, bytes, os.PathLike)) or not isinstance(idx, Sequence) or \
                len(idx) != 2:
            raise TypeError(f"idx must be a pair (images, labels) of IDX file paths, got {idx!r}")
        args += ["--idx", _args.path("idx[0]", idx[0]), _args.path("idx[1]", idx[1])]
    else:
        shards = [tar] if isinstance(tar, (str, os.PathLike)) else builtins.list(tar or ())
        if not shards:
            raise ValueError("tar= is empty; pass a shard pattern like 'DIR/train-{0..9}.tar'")
        args += ["--tar", *(_args.path(f"tar[{i}]", t) for i, t in enumerate(shards))]
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be True or False, got {strict!r}")
    if strict:
        args.append("--strict")
    return _run("add", args + _common(prepare, replace) + ["--quiet"], state_dir)


def _classes(classes: Any) -> str:
    items = classes.split(",") if isinstance(classes, str) else classes
    if isinstance(items, (bytes, numbers.Number)) or not isinstance(items, Sequence):
        raise TypeError(f"classes must be a list of class names or indices (or 'a,b'), got "
                        f"{classes!r}")
    out = []
    for c in items:
        if isinstance(c, bool) or not isinstance(c, (str, numbers.Integral)):
            raise TypeError(f"class {c!r} ({type(c).__name__}) is not a name or an index")
        c = str(c).strip()
        if not c or "," in c:
            raise ValueError(f"class {c!r} is empty or holds a comma; pass names without commas")
        out.append(c)
    if not out:
        raise ValueError("classes is empty; pass at least one class name or index")
    return ",".join(out)


def _id_range(ids: Any) -> str:
    if isinstance(ids, str):
        lo_text, sep, hi_text = ids.partition(":")
        if not sep:
            raise ValueError(f"ids {ids!r} is not LO:HI; pass e.g. ids=(0, 1000) or '0:1000'")
        try:
            bounds = [int(t) if t.strip() else None for t in (lo_text, hi_text)]
        except ValueError:
            raise ValueError(f"ids {ids!r} is not LO:HI of integers; pass e.g. '0:1000'") from None
    elif isinstance(ids, Sequence) and len(ids) == 2:
        bounds = [None if b is None else _args.integer("ids bound", b, 0) for b in ids]
    else:
        raise TypeError(f"ids must be (lo, hi) or 'LO:HI' (half-open sample ids), got {ids!r}")
    lo, hi = bounds
    if lo is not None and hi is not None and lo >= hi:
        raise ValueError(f"ids ({lo}, {hi}) is empty: need lo < hi (half-open)")
    return f"{'' if lo is None else lo}:{'' if hi is None else hi}"


def derive(name: str, source: str, *, classes: Optional[Union[str, Sequence[Any]]] = None,
           fraction: Optional[float] = None, ids: Optional[Union[str, Sequence[Any]]] = None,
           seed: Optional[int] = None, prepare: Optional[str] = None, replace: bool = False,
           state_dir: Optional[PathLike] = None) -> Dict[str, Any]:
    """A dataset of some of `source`'s samples: exactly one of classes= (names or indices; labels
    are kept), fraction= (in (0, 1], with seed=) or ids=(lo, hi) (sample ids, half-open)."""
    args = ["--name", _name(name), "--from", _name(source, "source")]
    given = [k for k, v in (("classes", classes), ("fraction", fraction), ("ids", ids))
             if v is not None]
    if len(given) != 1:
        raise ValueError(f"derive({name!r}) needs exactly one of classes=, fraction=, ids=; got "
                         f"{given or 'none'}")
    if seed is not None and fraction is None:
        raise ValueError("seed= goes with fraction= only (classes and ids select no randomness)")
    if classes is not None:
        args += ["--classes", _classes(classes)]
    elif fraction is not None:
        f = _args.number("fraction", fraction)
        if f > 1:
            raise ValueError(f"fraction must be in (0, 1], got {f}; pass e.g. fraction=0.1")
        args += ["--fraction", repr(f), "--seed", str(_args.integer("seed", seed or 0, 0))]
    else:
        args += ["--ids", _id_range(ids)]
    return _run("add", args + _common(prepare, replace), state_dir)


def _combine(flag: str, name: str, a: str, b: str, prepare: Optional[str], replace: bool,
             state_dir: Optional[PathLike]) -> Dict[str, Any]:
    args = ["--name", _name(name), flag, _name(a, "a"), _name(b, "b")]
    return _run("add", args + _common(prepare, replace), state_dir)


def union(name: str, a: str, b: str, *, prepare: Optional[str] = None, replace: bool = False,
          state_dir: Optional[PathLike] = None) -> Dict[str, Any]:
    """The samples in a or b (a's classes; the specs must agree unless prepare= is given)."""
    return _combine("--union", name, a, b, prepare, replace, state_dir)


def intersect(name: str, a: str, b: str, *, prepare: Optional[str] = None, replace: bool = False,
              state_dir: Optional[PathLike] = None) -> Dict[str, Any]:
    """The samples in both a and b."""
    return _combine("--intersect", name, a, b, prepare, replace, state_dir)


def minus(name: str, a: str, b: str, *, prepare: Optional[str] = None, replace: bool = False,
          state_dir: Optional[PathLike] = None) -> Dict[str, Any]:
    """The samples in a and not in b."""
    return _combine("--minus", name, a, b, prepare, replace, state_dir)


def list(state_dir: Optional[PathLike] = None) -> List[Dict[str, Any]]:  # noqa: A001 (the CLI's ls)
    """Every registered dataset, by name: name, samples, ids, classes, prepare, source."""
    datasets: List[Dict[str, Any]] = _run("ls", [], state_dir)["datasets"]
    return datasets


def info(name: str, state_dir: Optional[PathLike] = None) -> Dict[str, Any]:
    """One dataset, with "overlap": common, union, jaccard, share_bound against each other one."""
    return _run("show", [_name(name)], state_dir)


def overlap(a: str, b: str, state_dir: Optional[PathLike] = None) -> Dict[str, Any]:
    """size_a, size_b, common, union, jaccard and share_bound (|A∩B|/max(|A|,|B|)) of a and b."""
    return _run("overlap", [_name(a, "a"), _name(b, "b")], state_dir)


def remove(name: str, missing_ok: bool = False, state_dir: Optional[PathLike] = None) -> bool:
    """Removes a dataset (its sample ids stay reserved). False if it did not exist and
    missing_ok; otherwise a missing one raises CarpoolError (NotFound)."""
    try:
        _run("rm", [_name(name)], state_dir)
    except CarpoolError as e:
        if missing_ok and e.code_name == "NotFound":
            return False
        raise
    return True
