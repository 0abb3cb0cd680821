#!/usr/bin/env python3
"""Print why tests were skipped in the last ctest run, after ctest's own summary.

ctest lists skipped tests as "(Skipped)" but shows their output only with -V. tests/CMakeLists.txt
makes this script ctest's CTEST_CUSTOM_POST_TEST, so every ctest run ends with the reasons, read
from ctest's log, <build>/Testing/Temporary/LastTest.log(.tmp):
  - GoogleTest (GTEST_SKIP, GHT_REQUIRE_GPU): the message after "file:line: Skipped";
  - shell tests (tests/cli): a line "<name>_test: skipped: <reason>".
Tests skipped for the same reason are grouped. It never fails: a problem here must not turn a
passing ctest run into a failing one.

  python3 tests/common/skip_reasons.py BUILD_DIR
"""
import re
import sys
from pathlib import Path

NAMES_SHOWN = 4  # a group of more tests names this many and counts the rest


def reasons(log_text):
    """(test name, reason) for each skipped test in a LastTest.log."""
    out = []
    blocks = re.split(r"^\d+/\d+ Testing: ", log_text, flags=re.M)[1:]
    for block in blocks:
        # Typed tests carry "  # TypeParam = ..." in their names; the instance name says enough.
        name = block.split("\n", 1)[0].split("  # ", 1)[0].strip()
        if "Skip regular expression found in output" not in block and "\nTest Skipped" not in block:
            continue
        output = block.split("\nOutput:\n", 1)[-1].split("<end of output>", 1)[0]
        lines = output.splitlines()
        why = ""
        for i, line in enumerate(lines):
            if re.search(r":\d+: Skipped$", line):
                msg = []
                for follow in lines[i + 1:]:
                    if follow.startswith("[  SKIPPED ]"):
                        break
                    msg.append(follow.strip())
                why = " ".join(m for m in msg if m) or "(GTEST_SKIP without a message)"
                break
            m = re.search(r"_test: skipped: (.*)$", line)
            if m:
                why = m.group(1).strip()
                break
        out.append((name, why or "(no reason printed)"))
    return out


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return
    tmp = Path(sys.argv[1]) / "Testing" / "Temporary"
    # While ctest runs this hook its log is still LastTest.log.tmp (renamed when ctest exits);
    # LastTest.log is then the previous run's.
    logs = [p for p in (tmp / "LastTest.log.tmp", tmp / "LastTest.log") if p.exists()]
    if not logs:
        return
    log = max(logs, key=lambda p: p.stat().st_mtime)
    found = reasons(log.read_text(encoding="utf-8", errors="replace"))
    if not found:
        return
    groups = {}
    for name, why in found:
        groups.setdefault(why, []).append(name)
    print(f"\nWhy {len(found)} test{'s were' if len(found) != 1 else ' was'} skipped:")
    for why, names in sorted(groups.items(), key=lambda g: -len(g[1])):
        shown = ", ".join(names[:NAMES_SHOWN])
        more = f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
        print(f"  {len(names):4d} x {why}\n         ({shown}{more})")


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # the reader went away (| head)
        pass
    except Exception as e:  # noqa: BLE001 - a report must not fail the test run
        print(f"skip_reasons.py: could not read the skip reasons: {e}")
    sys.exit(0)
