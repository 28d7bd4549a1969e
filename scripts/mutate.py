#!/usr/bin/env python3
"""Mutation run: plants each bug of scripts/mutants.txt, one at a time, rebuilds, runs the whole
test suite, and reports which the suite caught (killed) and which it missed (survived).

    python3 scripts/mutate.py                    # every mutant (about 1-3 minutes each on 2 cores)
    python3 scripts/mutate.py --only ID [ID ...] # some of them
    python3 scripts/mutate.py --list             # the list, checked (each snippet found exactly once)

Builds in build-mutation/ (configured like the default build, without the perf suite). The
suite runs once on the unmutated tree first (it must pass); it is ctest's, in two stages so that a killed mutant is known early: every test but the
per-ISA reruns of the attention suite, then those reruns; a mutant survives only if both pass.
A mutant that does not compile is reported as invalid (the list is meant to hold none). The
source file is restored after each mutant, also on Ctrl-C. Writes the table to
build-mutation/mutation-report.md; exits 0 when the kill rate is >= --min-kill-rate (95%).
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_mutants(path):
    """The list: blocks of '== id', 'area:', 'file:', 'why:', '- ' original and '+ ' new lines."""
    mutants, cur = [], None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if line.startswith("#") or (not line.strip() and cur is None):
                continue
            if line.startswith("== "):
                cur = {"id": line[3:].split()[0], "old": [], "new": [], "line": n}
                mutants.append(cur)
            elif cur is None:
                sys.exit(f"{path}:{n}: expected '== id' first")
            elif re.match(r"^(area|file|why): ", line):
                key, value = line.split(": ", 1)
                cur[key] = value
            elif line.startswith("- ") or line == "-":
                cur["old"].append(line[2:])
            elif line.startswith("+ ") or line == "+":
                cur["new"].append(line[2:])
            elif line.strip():
                sys.exit(f"{path}:{n}: unexpected line: {line!r}")
    ids = set()
    for m in mutants:
        for key in ("area", "file", "why"):
            if key not in m:
                sys.exit(f"{path}:{m['line']}: mutant {m['id']} has no '{key}:'")
        if m["id"] in ids:
            sys.exit(f"{path}:{m['line']}: mutant id {m['id']} repeated")
        ids.add(m["id"])
        m["old"], m["new"] = "\n".join(m["old"]), "\n".join(m["new"])
        text = open(os.path.join(ROOT, m["file"]), encoding="utf-8").read()
        count = text.count(m["old"]) if m["old"] else 0
        if count != 1 or m["old"] == m["new"]:
            sys.exit(f"{path}:{m['line']}: mutant {m['id']}: the original text occurs {count} times in "
                     f"{m['file']} (expected once), or equals the replacement")
    return mutants


def run(cmd, log, timeout=None):
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        try:
            return subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            out.write("timed out\n")
            return 124


def first_failure(log):
    """The first test ctest reported failed in the log's last command, for the table."""
    text = open(log, encoding="utf-8", errors="replace").read()
    text = text[text.rfind("\n$ "):]
    found = re.findall(r"Test +#\d+: (.+?) \.+\*+(?:Failed|Timeout|Exception)", text)
    return found[0].strip()[:60] if found else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mutants", default=os.path.join(ROOT, "scripts", "mutants.txt"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build-mutation"))
    ap.add_argument("--only", nargs="*", default=None, help="mutant ids to run")
    ap.add_argument("--list", action="store_true", help="check and print the list, run nothing")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--min-kill-rate", type=float, default=0.95)
    ap.add_argument("--skip-baseline", action="store_true", help="do not run the suite on the unmutated tree first")
    args = ap.parse_args()

    mutants = parse_mutants(args.mutants)
    if args.only is not None:
        unknown = set(args.only) - {m["id"] for m in mutants}
        if unknown:
            sys.exit(f"mutate.py: unknown mutant id(s): {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m["id"] in args.only]
    if args.list:
        for m in mutants:
            print(f"{m['id']:32} {m['area']:22} {m['file']}: {m['why']}")
        print(f"{len(mutants)} mutants, each snippet found exactly once")
        return 0

    os.makedirs(args.build, exist_ok=True)
    log = os.path.join(args.build, "mutation.log")
    open(log, "w").close()
    cfg = ["cmake", "-S", ROOT, "-B", args.build, "-DCMAKE_BUILD_TYPE=Release", "-DSIMDATTN_BUILD_PERF=OFF"]
    build = ["cmake", "--build", args.build, "-j", str(args.jobs)]
    # stage 1: all but the per-ISA reruns; stage 2: those (the longest, and the same cases again)
    ctest = ["ctest", "--test-dir", args.build, "-j", str(args.jobs), "--timeout", "600", "--stop-on-failure",
             "--output-on-failure"]
    stages = [ctest + ["-E", "^attention_on_"], ctest + ["-R", "^attention_on_"]]
    print(f"mutate.py: building the unmutated tree in {args.build} (log: {log})", flush=True)
    if run(cfg, log) or run(build, log):
        sys.exit(f"mutate.py: the unmutated tree does not build; see {log}")
    if not args.skip_baseline:  # a suite that fails unmutated would count every mutant killed
        print("mutate.py: the suite on the unmutated tree", flush=True)
        for stage in stages:
            if run(stage, log, timeout=1800):
                sys.exit(f"mutate.py: the suite fails on the unmutated tree ({first_failure(log)}); see {log}")

    results = []
    current = {}

    def restore(*_):
        if current:
            with open(current["path"], "w", encoding="utf-8") as f:
                f.write(current["text"])
            current.clear()

    def interrupted(*_):
        restore()
        sys.exit("mutate.py: interrupted; the source restored")

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    for i, m in enumerate(mutants, 1):
        path = os.path.join(ROOT, m["file"])
        text = open(path, encoding="utf-8").read()
        start = time.time()
        current.update(path=path, text=text)
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text.replace(m["old"], m["new"], 1))
            if run(build, log):
                verdict, failed = "invalid", "does not compile"
            else:
                verdict, failed = "survived", ""
                for stage in stages:
                    if run(stage, log, timeout=1800):
                        verdict, failed = "killed", first_failure(log)
                        break
        finally:
            restore()
        seconds = time.time() - start
        results.append((m, verdict, failed, seconds))
        print(f"[{i}/{len(mutants)}] {m['id']:32} {verdict:8} {seconds:5.0f} s  {failed}", flush=True)
    run(build, log)  # leave the build matching the source

    killed = sum(1 for r in results if r[1] == "killed")
    survived = [r for r in results if r[1] == "survived"]
    invalid = [r for r in results if r[1] == "invalid"]
    valid = killed + len(survived)
    rate = killed / valid if valid else 0.0
    lines = ["| mutant | area | file | result | first failing test |", "|---|---|---|---|---|"]
    for m, verdict, failed, _ in results:
        lines.append(f"| {m['id']} | {m['area']} | {m['file']} | {verdict} | {failed} |")
    by_area = {}
    for m, verdict, _, _ in results:
        k, n = by_area.get(m["area"], (0, 0))
        by_area[m["area"]] = (k + (verdict == "killed"), n + (verdict != "invalid"))
    lines += ["", "| area | killed / valid |", "|---|---|"]
    lines += [f"| {a} | {k} / {n} |" for a, (k, n) in sorted(by_area.items())]
    summary = (f"{killed} of {valid} mutants killed ({100 * rate:.1f}%); {len(survived)} survived"
               + (f": {', '.join(r[0]['id'] for r in survived)}" if survived else "")
               + (f"; {len(invalid)} invalid: {', '.join(r[0]['id'] for r in invalid)}" if invalid else ""))
    lines += ["", summary]
    report = os.path.join(args.build, "mutation-report.md")
    with open(report, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"mutate.py: report in {report}")
    return 0 if rate >= args.min_kill_rate and not invalid else 1


if __name__ == "__main__":
    sys.exit(main())
