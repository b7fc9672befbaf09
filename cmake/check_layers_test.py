#!/usr/bin/env python3
"""Proves cmake/check_layers.py passes the repository and fails on each kind of violation, on
small trees written to a temporary folder. Exit 0 when every case behaves; run by ctest."""
import os
import subprocess
import sys
import tempfile

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_layers.py")

# A minimal legal tree: server links and includes the cache; client links the protocol.
GOOD = {
    "cache/CMakeLists.txt": "add_library(carpool_cache reserve.cc)\n",
    "cache/reserve.h": "#pragma once\n",
    "cache/reserve.cc": '#include "cache/reserve.h"\n#include "carpool/status.h"\n',
    "protocol/CMakeLists.txt": "add_library(carpool_protocol frame.cc)\n",
    "protocol/frame.h": "#pragma once\n",
    "protocol/frame.cc": '#include "protocol/frame.h"\n',
    "server/CMakeLists.txt": ("add_library(carpool_control pool.cc)\n"
                              "target_link_libraries(carpool_control PUBLIC carpool_cache\n"
                              "  carpool_protocol)\n"),
    "server/pool.h": '#pragma once\n#include "protocol/frame.h"\n',
    "server/pool.cc": '#include "server/pool.h"\n#include "cache/reserve.h"\n',
    "client/CMakeLists.txt": ("add_library(carpool_client client.cc)\n"
                              "target_link_libraries(carpool_client PUBLIC carpool_protocol)\n"),
    "client/client.cc": '#include "carpool/client.h"\n#include "protocol/frame.h"\n',
    # Python: a benchmark imports the client package, an example both.
    "client/python/carpool/loader.py": "import numpy\nfrom carpool import _ffi\n",
    "bench/gpu.py": "import carpool\nfrom bench import common\n",
    "examples/sweep.py": "import carpool\nfrom bench import cache\n",
}

# name -> (files changed from GOOD, a phrase the error must contain)
BAD = {
    "sampler includes the cache": (
        {"sampler/tree.cc": '#include "cache/reserve.h"\n'}, 'includes "cache/reserve.h"'),
    "client includes the server": (
        {"client/client.cc": '#include "server/pool.h"\n'}, 'includes "server/pool.h"'),
    "server includes the public client header": (
        {"server/pool.cc": '#include "carpool/client.h"\n'}, 'includes "carpool/client.h"'),
    "server includes, through its own header, a folder it does not link": (
        {"server/CMakeLists.txt": ("add_library(carpool_control pool.cc)\n"
                                   "target_link_libraries(carpool_control PUBLIC carpool_cache)\n")},
        "carpool_control links no library of protocol/"),
    "server includes a simulator": (
        {"server/pool.cc": '#include "sim/sim.h"\n'}, 'includes "sim/sim.h"'),
    "the client package imports the benchmarks": (
        {"client/python/carpool/loader.py": "import numpy\nfrom bench import common\n"},
        "imports bench, but client/python/carpool/"),
    "a benchmark imports an example": (
        {"bench/gpu.py": "import carpool\nimport examples.optuna_sweep\n"},
        "imports examples, but bench/"),
    "client links the server": (
        {"client/CMakeLists.txt": ("add_library(carpool_client client.cc)\n"
                                   "target_link_libraries(carpool_client PUBLIC carpool_protocol\n"
                                   "  carpool_control)\n")},
        "carpool_client links carpool_control (server/)"),
}


def run_checker(root):
    return subprocess.run([sys.executable, CHECKER, root], capture_output=True, text=True)


def write_tree(root, files):
    for path, text in files.items():
        os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(root, path), "w", encoding="utf-8") as f:
            f.write(text)


def main():
    failures = []
    repo = os.path.dirname(os.path.dirname(CHECKER))
    result = run_checker(repo)
    if result.returncode != 0:
        failures.append(f"the repository fails the check:\n{result.stderr}")
    cases = {"legal tree": ({}, None), **BAD}
    for name, (changes, phrase) in cases.items():
        with tempfile.TemporaryDirectory() as root:
            write_tree(root, {**GOOD, **changes})
            result = run_checker(root)
        if phrase is None and result.returncode != 0:
            failures.append(f"{name}: exit {result.returncode}, expected 0\n{result.stderr}")
        if phrase is not None and (result.returncode != 1 or phrase not in result.stderr):
            failures.append(f"{name}: exit {result.returncode}, expected 1 with '{phrase}'\n"
                            f"{result.stderr}")
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    print(f"check_layers: {len(cases) + 1 - len(failures)} of {len(cases) + 1} cases behave")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
