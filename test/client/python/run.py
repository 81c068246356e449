"""Run the Python client tests (psycopg 3 and psycopg2), each test bounded
in time, printing TAP lines and the "# pass N" / "# fail N" summary that
test/run-tests counts.

Usage: python3 run.py [psycopg3|psycopg2 ...]   (all drivers by default)
Connects with PGHOST / PGPORT / PGUSER / PGDATABASE.
"""

import importlib
import signal
import sys
import time
import traceback

import scenarios

DRIVERS = {"psycopg3": ("test_psycopg", "Psycopg3"), "psycopg2": ("test_psycopg2", "Psycopg2")}
TEST_TIMEOUT = 60    # seconds for one test


class Timeout(Exception):
    pass


def alarm(signum, frame):
    raise Timeout(f"test took more than {TEST_TIMEOUT} s")


def main(names):
    signal.signal(signal.SIGALRM, alarm)
    passed = failed = n = 0
    for name in names or list(DRIVERS):
        module, cls_name = DRIVERS[name]
        try:
            cls = getattr(importlib.import_module(module), cls_name)
            signal.alarm(TEST_TIMEOUT)
            driver = cls()
            signal.alarm(0)
        except Exception:
            signal.alarm(0)
            n += 1
            failed += 1
            print(f"not ok {n} - {name}: setup")
            print("# " + traceback.format_exc().replace("\n", "\n# "))
            continue
        for test in scenarios.tests(cls):
            n += 1
            t0 = time.monotonic()
            try:
                signal.alarm(TEST_TIMEOUT)
                getattr(driver, test)()
                signal.alarm(0)
                passed += 1
                print(f"ok {n} - {name}: {test} ({time.monotonic() - t0:.2f} s)")
            except Exception:
                signal.alarm(0)
                failed += 1
                print(f"not ok {n} - {name}: {test}")
                print("# " + traceback.format_exc().replace("\n", "\n# "))
            sys.stdout.flush()
        driver.close()
    print(f"1..{n}")
    print(f"# pass {passed}")
    print(f"# fail {failed}")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
