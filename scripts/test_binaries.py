#!/usr/bin/env python3
"""Runs every test binary of the workspace, several at once: what `cargo test --workspace --all-targets
--no-fail-fast` does, one binary after another, in about a third of the time.

Most of `make test`'s time is end-to-end tests waiting on real time (a two-minute DynamoDB outage, SQS
visibility timeouts, Terraform applies), not on the CPU, so binaries overlap well even on 2 cores.
Each binary still runs its own tests as libtest does (in threads, one process), from its package's
folder with the `CARGO` variable set, exactly as `cargo test` starts it; they already share the
emulators with each other and with other checkouts (unique queue and table names per test).

    scripts/test_binaries.py [--jobs N] [--also COMMAND] [cargo test options, e.g. --workspace --all-targets]

Builds with `cargo test --no-run --message-format json` and the given options, then runs the binaries,
the longest first (LONGEST below), N at a time (default 3, or CONVEYOR_TEST_JOBS). A binary's output is
printed whole when it ends, with its time; at the end, the binaries that failed, and the exit status is
1 if any did (all run, as with --no-fail-fast).

`--also COMMAND` (a shell command, e.g. the doctests and `cargo doc`) starts beside the binaries once
they are built, outside the N (it compiles while the binaries mostly wait on real time); its output is
printed when it ends, and its failure counts as a binary's. With N = 1 it runs after them. It and the
CPU-bound binaries (CPU_BOUND below) run at nice 19, so the time-sensitive tests keep the CPU they need.
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

# Started first (measured on 2 cores, seconds): the long ones must not start last.
LONGEST = [
    "fifo_brownout",  # 322: two real two-minute DynamoDB outages
    "simulations",  # ~150 alone, 690 niced in a fresh run (2026-12-05): the simulator's seeds, on every core
    "flows",  # 177 (conveyor-e2e)
    "terraform",  # 162
    "lambda_runner",  # 131
    "schedules",  # 103 (conveyor-cli), 8 (conveyor-e2e)
    "chaos",  # 74
    "time_budgets",  # 62
    "outbox",  # 52
    "exactly_once",  # 48
    "emulators",  # conveyor-testing's fault layer and conformance on the emulators
    "aws",  # 137 (conveyor-worker on the emulators)
    "crash",  # 33
]

# Binaries that only compute (no emulator, no real time): they run at the lowest CPU priority, as the
# `--also` command does, so that on 2 cores they use what the end-to-end tests leave and never starve
# those tests' workers, Lambda runners and emulators, whose timeouts are real time (a CI run with the
# simulations and the doctests' compilation at full priority beside `fifo_brownout` and `flows` failed
# both: a 10 s function timeout and a 120 s flow deadline passed on a starved machine).
CPU_BOUND = {"simulations"}


def lowest_priority():
    """Runs in the child before it starts: the lowest CPU priority (nice 19)."""
    os.nice(19)


def build(cargo, options):
    """The test executables: (name, path, package folder), in cargo's order."""
    command = [cargo, "test", "--no-run", "--message-format", "json-render-diagnostics", *options]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    binaries = []
    for line in process.stdout:
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            continue
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message.get("profile", {}).get("test"):
            continue
        target = message["target"]
        folder = os.path.dirname(message["manifest_path"])
        binaries.append((target["name"], message["executable"], folder))
    if process.wait() != 0:
        sys.exit(f"`{' '.join(command)}` failed")
    return binaries


def order(binaries):
    """LONGEST first, in that order, then the rest as cargo listed them."""
    rank = {name: index for index, name in enumerate(LONGEST)}
    return sorted(binaries, key=lambda binary: rank.get(binary[0], len(LONGEST)))


def digest(text, most=30):
    """The lines of a failed test binary's output that say what failed, without its backtraces."""
    lines = text.splitlines()
    kept = set()
    for index, line in enumerate(lines):
        stripped = line.strip()
        said = (
            stripped.startswith("---- ")
            or "panicked at" in stripped
            or stripped.startswith(("Error:", "VIOLATION", "assertion", "left:", "right:"))
            or ("seeds failed" in stripped)
        )
        if said:
            kept.add(index)
            # What an `Error:` or a panic says is on the lines after it.
            if stripped.startswith("Error:") or "panicked at" in stripped:
                kept.update(following for following in (index + 1, index + 2) if following < len(lines))
    keep = [lines[index][:300] for index in sorted(kept) if lines[index].strip()]
    return keep[:most]


def run(binaries, jobs, cargo):
    """Runs them `jobs` at a time; returns the failed ones' names, and each one's digest (printed again
    at the very end: CI keeps only the log's tail)."""
    environment = dict(os.environ, CARGO=cargo)
    pending = list(binaries)
    failed = []
    digests = []
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                if not pending:
                    return
                name, path, folder = pending.pop(0)
            with tempfile.TemporaryFile(mode="w+") as output:
                started = time.monotonic()
                status = subprocess.call(
                    [path],
                    cwd=folder,
                    env=environment,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    preexec_fn=lowest_priority if name in CPU_BOUND else None,
                )
                elapsed = time.monotonic() - started
                output.seek(0)
                text = output.read()
            with lock:
                verdict = "ok" if status == 0 else f"FAILED (exit {status})"
                print(f"\n===== {name} ({os.path.relpath(path)}): {verdict} in {elapsed:.0f} s", flush=True)
                print(text, end="", flush=True)
                if status != 0:
                    failed.append(f"{name} ({folder})")
                    digests.append((name, digest(text)))

    threads = [threading.Thread(target=worker) for _ in range(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failed, digests


def run_also(command, failed):
    """Runs the shell `command`, prints its output when it ends, and records a failure in `failed`."""
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "-c", command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lowest_priority,
    )
    verdict = "ok" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
    print(f"\n===== {command}: {verdict} in {time.monotonic() - started:.0f} s", flush=True)
    print(done.stdout, end="", flush=True)
    if done.returncode != 0:
        failed.append(command)


def main():
    arguments = sys.argv[1:]
    jobs = int(os.environ.get("CONVEYOR_TEST_JOBS", "3"))
    also = []
    while arguments[:1] in (["--jobs"], ["--also"]):
        if arguments[0] == "--jobs":
            jobs = int(arguments[1])
        else:
            also.append(arguments[1])
        arguments = arguments[2:]
    cargo = os.environ.get("CARGO", "cargo")
    binaries = order(build(cargo, arguments))
    started = time.monotonic()
    also_failed = []
    beside = [threading.Thread(target=run_also, args=(command, also_failed)) for command in also]
    if jobs > 1:
        for thread in beside:
            thread.start()
    failed, digests = run(binaries, max(jobs, 1), cargo)
    for thread in beside:
        if jobs <= 1:
            thread.start()
        thread.join()
    failed += also_failed
    minutes = (time.monotonic() - started) / 60
    print(f"\n{len(binaries)} test binaries in {minutes:.1f} min, {jobs} at a time; {len(failed)} failed")
    for name, lines in digests:
        print(f"\n----- what failed in {name}:")
        for line in lines:
            print(f"  {line}")
    for name in failed:
        print(f"  failed: {name}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
