"""Run a command with THP turned off for it, as MariaDB does for itself at start-up.

`python thp_prctl.py off|advised [--after S] -- CMD [ARGS...]`: sleeps S seconds (default 0),
calls prctl(PR_SET_THP_DISABLE, 1, FLAGS) -- FLAGS 0 for `off`, PR_THP_DISABLE_EXCEPT_ADVISED
for `advised` (Linux 6.18+) -- and execs CMD, which keeps the setting (prctl survives exec).
"""

import ctypes
import os
import sys
import time

PR_SET_THP_DISABLE = 41
PR_THP_DISABLE_EXCEPT_ADVISED = 1 << 1


def main() -> None:
    args = sys.argv[1:]
    split = args.index("--")
    opts, command = args[:split], args[split + 1:]
    flags = {"off": 0, "advised": PR_THP_DISABLE_EXCEPT_ADVISED}[opts[0]]
    if "--after" in opts:
        time.sleep(float(opts[opts.index("--after") + 1]))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_THP_DISABLE, 1, flags, 0, 0):
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_THP_DISABLE)")
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
