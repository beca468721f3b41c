#!/usr/bin/env python3
"""Mutation testing of the kernel against the simulator alone.

Each mutant in mutants.txt is a one-line semantic bug in kernel/src/{server,
runtime,worker,link,client/lease}. For each, this script applies it, builds
the simulator (release, in target/mutation so other builds are untouched),
and runs the simulator's checks in order, cheapest first:

  swarm   sim --seeds 2000 --from 1      the fault swarm and its checkers
  lease   sim --lease 200                the client machines under faults
  model   sim --model                    the CI model-checker configurations

A mutant is killed by the first check that fails (or times out); it
survives when all pass, and is unviable when it does not compile. Insta
snapshots and unit tests are not consulted: the score is the simulator's.
The source file is restored after every mutant, also on failure or ^C.

usage: sim/mutation/run.py [--all-checks] [--list] [ID ...]
  ID            run only these mutants (default: all)
  --all-checks  run every check on every mutant (which checks kill what)
  --list        print the mutants and exit

Writes sim/mutation/RESULTS.md (the table) and prints progress as it goes.
"""

import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "sim", "mutation")
TARGET = os.path.join(ROOT, "target", "mutation")
SIM = os.path.join(TARGET, "release", "sim")
CHECKS = [
    ("swarm", ["--seeds", "2000", "--from", "1"], 300),
    ("lease", ["--lease", "200"], 300),
    ("model", ["--model"], 900),
]


def parse(path):
    mutants, block = [], {}
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines() + [""]
    for line in lines:
        if line.startswith("#"):
            continue
        if not line.strip():
            if block:
                mutants.append(block)
                block = {}
            continue
        key, _, value = line.partition(": ")
        if key not in ("id", "file", "what", "find", "replace"):
            sys.exit(f"mutants.txt: unknown key in line {line!r}")
        block[key] = value
    for m in mutants:
        missing = {"id", "file", "what", "find", "replace"} - m.keys()
        if missing:
            sys.exit(f"mutant {m.get('id', '?')}: missing {sorted(missing)}")
    return mutants


def build():
    env = dict(os.environ, CARGO_TARGET_DIR=TARGET)
    result = subprocess.run(
        ["cargo", "build", "--release", "-p", "sim", "--bin", "sim"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    return result.returncode == 0, result.stderr


def check(name, args, timeout):
    """Returns (passed, what it said last)."""
    try:
        result = subprocess.run(
            [SIM] + args, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout} s"
    out = (result.stdout + result.stderr).strip().splitlines()
    verdict = re.compile(r"FAILED|panicked|\[[a-z]+\] ")
    failed = [l for l in out if verdict.search(l)]
    said = (failed or out or [""])[0][:160]
    return result.returncode == 0, said


def run_mutant(m, all_checks):
    path = os.path.join(ROOT, m["file"])
    with open(path, encoding="utf-8") as f:
        original = f.read()
    if original.count(m["find"]) != 1:
        return "stale", f"`find` occurs {original.count(m['find'])} times", {}
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(original.replace(m["find"], m["replace"], 1))
        ok, stderr = build()
        if not ok:
            errors = [l for l in stderr.splitlines() if l.startswith("error")]
            return "unviable", (errors or ["build failed"])[0][:160], {}
        verdicts, killer, said = {}, None, ""
        for name, args, timeout in CHECKS:
            passed, what = check(name, args, timeout)
            verdicts[name] = passed
            if not passed and killer is None:
                killer, said = name, what
                if not all_checks:
                    break
        if killer:
            return f"killed by {killer}", said, verdicts
        return "SURVIVED", "", verdicts
    finally:
        with open(path, "w", encoding="utf-8") as f:
            f.write(original)


def main():
    args = sys.argv[1:]
    all_checks = "--all-checks" in args
    mutants = parse(os.path.join(HERE, "mutants.txt"))
    if "--list" in args:
        for m in mutants:
            print(f"{m['id']:<40} {m['file']}: {m['what']}")
        return
    wanted = [a for a in args if not a.startswith("--")]
    if wanted:
        unknown = set(wanted) - {m["id"] for m in mutants}
        if unknown:
            sys.exit(f"no such mutant: {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m["id"] in wanted]

    started = time.time()
    print(f"baseline: building and checking the unmutated kernel", flush=True)
    ok, stderr = build()
    if not ok:
        sys.exit("the unmutated simulator does not build:\n" + stderr[-2000:])
    for name, cargs, timeout in CHECKS:
        passed, said = check(name, cargs, timeout)
        if not passed:
            sys.exit(f"the unmutated kernel fails {name}: {said}")

    rows = []
    for i, m in enumerate(mutants, 1):
        t = time.time()
        verdict, said, verdicts = run_mutant(m, all_checks)
        rows.append((m, verdict, said, verdicts))
        print(f"[{i}/{len(mutants)}] {m['id']}: {verdict} ({time.time() - t:.0f} s) {said}",
              flush=True)

    viable = [r for r in rows if r[1].startswith("killed") or r[1] == "SURVIVED"]
    killed = [r for r in viable if r[1].startswith("killed")]
    score = 100.0 * len(killed) / max(len(viable), 1)
    minutes = (time.time() - started) / 60
    summary = (f"{len(killed)} of {len(viable)} viable mutants killed ({score:.0f} %), "
               f"{len(rows) - len(viable)} unviable or stale, in {minutes:.0f} min")
    print(summary)
    write_results(rows, minutes)


MACHINES = [
    ("server/", "Server"),
    ("runtime.rs", "Runtime"),
    ("worker.rs", "Worker"),
    ("link.rs", "Link"),
    ("host.rs", "WorkerHost"),
    ("client/lease.rs", "Leases"),
    ("client/follow.rs", "Follower"),
    ("client/mod.rs", "Client"),
    ("client/front.rs", "Front"),
]


def machine_of(file):
    """The kernel machine a mutated file (relative to kernel/src/) holds."""
    return next((name for prefix, name in MACHINES if file.startswith(prefix)), file)


def write_results(rows, minutes):
    """Writes the table; a run of some mutants updates their rows only."""
    path = os.path.join(HERE, "RESULTS.md")
    table = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                cells = line.split(" | ")
                if line.startswith("| ") and len(cells) >= 5 and not line.startswith("| mutant"):
                    table[cells[0][2:]] = line.rstrip("\n")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    for m, verdict, said, _ in rows:
        file = m["file"].removeprefix("kernel/src/")
        said = said.replace("|", "\\|")
        table[m["id"]] = f"| {m['id']} | {file} | {m['what']} | {verdict} | {commit} | {said} |"
    order = [m["id"] for m in parse(os.path.join(HERE, "mutants.txt"))]
    lines = [table[i] for i in order if i in table]
    viable = [l for l in lines if "| killed by " in l or "| SURVIVED |" in l]
    killed = [l for l in viable if "| killed by " in l]
    score = 100.0 * len(killed) / max(len(viable), 1)
    by_machine = {}
    for line in viable:
        machine = machine_of(line.split(" | ")[1])
        kills, total = by_machine.get(machine, (0, 0))
        by_machine[machine] = (kills + ("| killed by " in line), total + 1)
    scores = [f"| {m} | {k} of {t} | {100.0 * k / t:.0f} % |"
              for m, (k, t) in sorted(by_machine.items())]
    out = [
        "# Mutation results",
        "",
        "Written by `sim/mutation/run.py`; each row gives the commit of the",
        "simulator that judged it. The last run took " + f"{minutes:.0f} min.",
        "Survivors are discussed in README.md.",
        "",
        f"{len(killed)} of {len(viable)} viable mutants killed ({score:.0f} %).",
        "",
        "| machine | killed | score |",
        "|---|---|---|",
    ] + scores + [
        "",
        "| mutant | file | bug | verdict | judged at | first failure |",
        "|---|---|---|---|---|---|",
    ] + lines
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
