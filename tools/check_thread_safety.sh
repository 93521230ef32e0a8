#!/usr/bin/env bash
# Clang's thread-safety analysis over the code that locks: every .cc under
# common/, scheduler/, worker/, tools/ and tests/ that includes
# absl/synchronization/mutex.h or absl/base/thread_annotations.h, itself or
# through its own header (foo.cc through foo.h), is compiled with
# `clang++ -fsyntax-only -Wthread-safety -Werror=thread-safety`, using the
# flags CMake recorded for it in compile_commands.json (whichever compiler the
# build used; GCC's warning and output flags are dropped). A member marked
# ABSL_GUARDED_BY(mu_) touched without mu_ held, a lock not released, or a
# method that needs a lock called without it fails the check. -Wthread-safety
# is clang's stable set (analysis, attributes, precise, reference); -negative
# (REQUIRES(!mu) on every locking method) and -beta (experimental) are left out.
#
#   tools/check_thread_safety.sh BUILD_DIR/compile_commands.json
#
# Exits 77 (skipped) when clang++ is not installed; the build it reads must be
# complete (generated protobuf headers are included).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v clang++ >/dev/null 2>&1; then
  echo "thread-safety: skipped, clang++ is not installed (tools/setup.sh installs the Debian package clang)"
  exit 77
fi
if [ $# -ne 1 ] || [ ! -f "$1" ]; then
  echo "usage: $0 BUILD_DIR/compile_commands.json (configure with CMAKE_EXPORT_COMPILE_COMMANDS=ON)" >&2
  exit 2
fi

exec python3 - "$1" "$(command -v clang++)" <<'PY'
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys
import time

database, clang = sys.argv[1], sys.argv[2]
root = os.getcwd()
folders = ("common/", "scheduler/", "worker/", "tools/", "tests/")
marker = re.compile(r'^\s*#\s*include\s+"absl/(synchronization/mutex|base/thread_annotations)\.h"', re.M)
analysis = ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety"]


def uses_locks(source):
    for path in (source, source[:-3] + ".h"):
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                if marker.search(f.read()):
                    return True
    return False


def clang_args(entry):
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out = [clang]
    skip_next = False
    for arg in args[1:]:
        if skip_next:
            skip_next = False
            continue
        if arg in ("-o", "-MF", "-MT", "-MQ"):
            skip_next = True
        elif arg in ("-c", "-w", "-MD", "-MMD") or arg.startswith("-W") or arg.startswith("-fdiagnostics-color"):
            pass  # GCC's warnings and outputs; the analysis adds its own
        elif arg.startswith("-fmax-errors=") or arg.startswith("-fconcepts"):
            pass  # GCC-only
        else:
            out.append(arg)
    return out + analysis


with open(database, encoding="utf-8") as f:
    entries = json.load(f)
jobs = {}
for entry in entries:
    source = os.path.normpath(os.path.join(entry.get("directory", ""), entry["file"]))
    relative = os.path.relpath(source, root)
    if not relative.endswith(".cc") or not relative.startswith(folders) or relative in jobs:
        continue
    if uses_locks(source):
        jobs[relative] = (clang_args(entry), entry.get("directory") or root)
if not jobs:
    print("thread-safety: no source in", database, "includes absl/synchronization/mutex.h; is it this tree's build?")
    sys.exit(1)


def check(item):
    relative, (args, directory) = item
    run = subprocess.run(args, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return relative, run.returncode, run.stdout


start = time.monotonic()
failed = 0
with concurrent.futures.ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
    for relative, code, output in pool.map(check, sorted(jobs.items())):
        if code != 0:
            failed += 1
            print(f"thread-safety: {relative} FAILED\n{output}")
        elif output.strip():
            print(f"thread-safety: {relative}\n{output}")
print(f"thread-safety: {len(jobs) - failed} of {len(jobs)} files pass ({time.monotonic() - start:.0f} s)")
sys.exit(1 if failed else 0)
PY
