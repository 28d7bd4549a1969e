#!/usr/bin/env python3
"""The README's C and Python examples, run as written against the installed package.

  check_readme.py README.md BUILD_DIR WORK_DIR PYTHON_INSTALL_DIR

Installs BUILD_DIR into WORK_DIR/prefix (cmake --install), then
  - compiles the README's ```c block with the command the README gives (cc -std=c11 ...
    $(pkg-config --cflags --libs simdattn), plus -Wall -Wextra -pedantic -Werror) and runs it;
  - runs each of the README's ```python blocks with the installed package on PYTHONPATH (it is
    imported from the prefix, not the build tree); each block's last line printed holds True.
Each must exit 0 (the examples check their own results) and print the line the check below
looks for.
"""
import os
import re
import shutil
import subprocess
import sys


def blocks(text, lang):
    return re.findall(r"^```" + lang + r"\n(.*?)^```", text, flags=re.S | re.M)


def run(cmd, **kw):
    print("+", " ".join(cmd) if isinstance(cmd, list) else cmd, flush=True)
    r = subprocess.run(cmd, text=True, capture_output=True, **kw)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        sys.exit(f"check_readme: failed with status {r.returncode}")
    return r.stdout


def main():
    readme, build, work, pydir = sys.argv[1:5]
    text = open(readme, encoding="utf-8").read()
    c_blocks, py_blocks = blocks(text, "c"), blocks(text, "python")
    if len(c_blocks) != 1 or not py_blocks:
        sys.exit(f"check_readme: expected one ```c and at least one ```python block in {readme}, "
                 f"got {len(c_blocks)} and {len(py_blocks)}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    prefix = os.path.join(work, "prefix")
    run(["cmake", "--install", build, "--prefix", prefix])
    libdir = next(os.path.dirname(os.path.join(d, f)) for d, _, fs in os.walk(prefix) for f in fs
                  if f == "simdattn.pc")
    env = dict(os.environ, PKG_CONFIG_PATH=libdir)

    # The C example, built as the README says.
    src = os.path.join(work, "example.c")
    open(src, "w").write(c_blocks[0])
    flags = run(["pkg-config", "--cflags", "--libs", "simdattn"], env=env).split()
    exe = os.path.join(work, "example")
    run(["cc", "-std=c11", "-Wall", "-Wextra", "-pedantic", "-Werror", src, "-o", exe] + flags, env=env)
    out = run([exe], env=dict(env, LD_LIBRARY_PATH=os.path.dirname(libdir)))
    if "invalid argument (k)" not in out:
        sys.exit("check_readme: the C example did not report the bad argument k")

    # The Python examples, on the installed package.
    site = os.path.join(prefix, pydir)
    out = run([sys.executable, "-c", "import simdattn, sys; print(simdattn.__file__)"],
              env=dict(os.environ, PYTHONPATH=site))
    if not out.strip().startswith(site):
        sys.exit(f"check_readme: simdattn imported from {out.strip()}, not the installed {site}")
    for i, block in enumerate(py_blocks):
        script = os.path.join(work, f"example{i}.py")
        open(script, "w").write(block)
        out = run([sys.executable, script], env=dict(os.environ, PYTHONPATH=site))
        if "True" not in out.split("\n")[-2]:
            sys.exit(f"check_readme: the Python example {i + 1}'s check did not print True")
    print(f"check_readme: the C example and {len(py_blocks)} Python examples ran")


if __name__ == "__main__":
    main()
