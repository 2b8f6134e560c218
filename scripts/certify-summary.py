#!/usr/bin/env python3
"""Summarises `racecert certify` reports (report.json files given as arguments): verdict per
run, cases and seconds per suite, and for every fault kind of every suite on how many runs it
landed on its target path at least once (the "covered on N of N seeds" figure)."""
import json
import sys
from collections import defaultdict

reports = []
for path in sys.argv[1:]:
    with open(path) as f:
        reports.append((path, json.load(f)))
if not reports:
    sys.exit("no reports given")

passed = 0
cases = defaultdict(list)
seconds = defaultdict(list)
covered = defaultdict(int)
applied = defaultdict(int)
totals = []
for path, report in reports:
    ok = all(s.get("error") is None and s["held"] == s["expect_pass"] for s in report["suites"])
    passed += ok
    total = 0.0
    for suite in report["suites"]:
        cases[suite["name"]].append(suite["cases_run"])
        seconds[suite["name"]].append(suite["elapsed_ms"] / 1000)
        total += suite["elapsed_ms"] / 1000
        for row in suite["coverage"]:
            key = (suite["name"], row["fault"])
            covered[key] += row["landed"] > 0
            applied[key] += row["applied"]
    totals.append(total)
    if not ok:
        print(f"NOT PASSED: {path}")

n = len(reports)
print(f"runs: {n}, passed: {passed}/{n}; seconds in suites per run: mean {sum(totals)/n:.1f}, "
      f"min {min(totals):.1f}, max {max(totals):.1f}")
print(f"{'suite':<24} {'mean cases':>10} {'mean s':>7}")
for name in sorted(cases):
    print(f"{name:<24} {sum(cases[name])/n:>10.1f} {sum(seconds[name])/n:>7.2f}")
print(f"{'suite':<24} {'fault kind':<24} {'runs covered':>12} {'applied (all runs)':>18}")
for (name, fault) in sorted(covered):
    print(f"{name:<24} {fault:<24} {covered[(name, fault)]:>9}/{n} {applied[(name, fault)]:>18}")
