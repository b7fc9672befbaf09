#!/usr/bin/env python3
"""Checks the dependencies between carpool's folders (docs/architecture.md "Layers"); exit 1 on a
violation.

Two checks, both from the same table:
  - every #include "folder/..." in a folder names a folder that LAYERS allows it;
  - every library (add_library in a folder's CMakeLists.txt) links only libraries of allowed
    folders, and links, directly or through its dependencies, a library of each folder whose
    headers its sources include (own-folder headers followed transitively).
The build runs this before compiling (cmake/layers.cmake); cmake/check_layers_test.py proves it
fails on a violation. Usage: check_layers.py REPO_ROOT
"""
import os
import re
import sys

# folder -> the folders it may include and link, besides itself and include/carpool.
_ALL = {"common", "datasets", "sampler", "cache", "protocol", "server", "client"}
LAYERS = {
    "common": set(),  # internal header-only helpers (log, mutex, annotations): every layer's base
    "datasets": {"common"},
    "sampler": {"common"},
    "cache": {"common"},
    "protocol": {"common"},
    "server": {"common", "sampler", "cache", "datasets", "protocol"},
    "client": {"common", "protocol"},
    # The simulators (`carpool sim`): the sampler, cache and scheduler in simulated time. Nothing
    # that serves includes them.
    "sim": {"common", "sampler", "cache", "server"},
    "tools": _ALL | {"sim"},
    "tests": _ALL | {"sim", "tools"},
}
# include/carpool is the public API. client.h and carpool.h belong to the client library; status.h
# and types.h, which they include, are shared by every layer.
PUBLIC_OWNER = {"carpool/client.h": "client", "carpool/carpool.h": "client"}
SOURCE_EXTENSIONS = (".h", ".cc", ".cu", ".cuh")

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
_ADD_LIBRARY = re.compile(r"add_library\(\s*(\w+)\s+([^)]*)\)")
_LINK = re.compile(r"target_link_libraries\(\s*(\w+)\s+([^)]*)\)")
_SOURCE = re.compile(r"[\w./-]+\.(?:cc|cu|cpp)\b")
_OUR_LIBRARY = re.compile(r"\bcarpool_\w+")


def layer_of(include):
    """The folder an include path belongs to, or None for include/carpool's common headers."""
    if include in PUBLIC_OWNER:
        return PUBLIC_OWNER[include]
    head = include.split("/", 1)[0]
    return head if head in LAYERS and "/" in include else None


def includes_of(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    for match in _INCLUDE.finditer(text):
        yield text.count("\n", 0, match.start()) + 1, match.group(1)


def check_includes(root):
    errors = []
    for folder, allowed in LAYERS.items():
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in sorted(files):
                if not name.endswith(SOURCE_EXTENSIONS):
                    continue
                path = os.path.join(dirpath, name)
                for line, include in includes_of(path):
                    dep = layer_of(include)
                    if dep and dep != folder and dep not in allowed:
                        errors.append(
                            f"{os.path.relpath(path, root)}:{line}: includes \"{include}\", but "
                            f"{folder}/ may depend only on {sorted(allowed) or 'include/carpool'}"
                            f" (cmake/check_layers.py, docs/architecture.md \"Layers\"); move "
                            f"the code down a layer or the file to a folder that may depend on "
                            f"{dep}/")
    return errors


def read_libraries(root):
    """{library: (folder, [sources], set(linked carpool libraries))} from the folders' CMake."""
    libraries, links = {}, {}
    for folder in LAYERS:
        cmake = os.path.join(root, folder, "CMakeLists.txt")
        if not os.path.exists(cmake):
            continue
        with open(cmake, encoding="utf-8") as f:
            text = re.sub(r"#[^\n]*", "", f.read())
        for name, args in _ADD_LIBRARY.findall(text):
            if "ALIAS" not in args.split():
                libraries[name] = (folder, _SOURCE.findall(args))
        for name, args in _LINK.findall(text):
            links.setdefault(name, set()).update(_OUR_LIBRARY.findall(args))
    return {name: (folder, sources, links.get(name, set()))
            for name, (folder, sources) in libraries.items()}


def folders_needed(root, folder, sources):
    """{dependency folder: first include that needs it}, following own-folder headers."""
    needed, seen = {}, set()
    pending = [os.path.join(root, folder, s) for s in sources]
    while pending:
        path = pending.pop()
        if path in seen or not os.path.exists(path):
            continue
        seen.add(path)
        for _, include in includes_of(path):
            dep = layer_of(include)
            if dep == folder:
                pending.append(os.path.join(root, include))
            elif dep is None and "/" not in include:
                pending.append(os.path.join(os.path.dirname(path), include))
            elif dep:
                needed.setdefault(dep, f"{os.path.relpath(path, root)} includes \"{include}\"")
    return needed


def check_links(root):
    libraries = read_libraries(root)
    errors = []
    for name, (folder, sources, linked) in sorted(libraries.items()):
        for dep in sorted(linked):
            dep_folder = libraries[dep][0] if dep in libraries else None
            if dep_folder and dep_folder != folder and dep_folder not in LAYERS[folder]:
                errors.append(f"{folder}/CMakeLists.txt: {name} links {dep} ({dep_folder}/), but "
                              f"{folder}/ may depend only on "
                              f"{sorted(LAYERS[folder]) or 'include/carpool'}")
        closure, pending = set(), list(linked)
        while pending:
            dep = pending.pop()
            if dep not in closure:
                closure.add(dep)
                pending.extend(libraries.get(dep, (None, [], set()))[2])
        reached = {libraries[d][0] for d in closure if d in libraries}
        for dep, why in sorted(folders_needed(root, folder, sources).items()):
            if dep not in reached:
                errors.append(f"{folder}/CMakeLists.txt: {name} links no library of {dep}/, but "
                              f"{why}; add the library to its target_link_libraries")
    return errors


# Python: the client package must not import the benchmarks or the examples, and the benchmarks
# not the examples. Folder -> (its own top-level package, the packages of ours it may import).
PY_LAYERS = {
    "client/python/carpool": ("carpool", set()),
    "bench": ("bench", {"carpool"}),
    "examples": (None, {"carpool", "bench"}),
}
_OUR_PY = {"carpool", "bench", "examples"}
_PY_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", re.M)


def check_python(root):
    errors = []
    for folder, (own, allowed) in PY_LAYERS.items():
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for match in _PY_IMPORT.finditer(text):
                    top = (match.group(1) or match.group(2)).split(".")[0]
                    if top in _OUR_PY and top != own and top not in allowed:
                        line = text.count("\n", 0, match.start()) + 1
                        errors.append(
                            f"{os.path.relpath(path, root)}:{line}: imports {top}, but {folder}/ "
                            f"may import only {sorted(allowed) or 'itself'} of ours "
                            f"(cmake/check_layers.py PY_LAYERS); move the code to the package "
                            f"that may depend on {top}")
    return errors


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.abspath(argv[1])
    errors = check_includes(root) + check_links(root) + check_python(root)
    for error in errors:
        print(f"layer violation: {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
