"""Run one command; write its own wall time, CPU time and peak RSS to a result file.

    python -S -I spawn.py RESULT LOG TIMEOUT_S AS_LIMIT_BYTES -- COMMAND...

Why a launcher: on Linux a child's ru_maxrss starts from the resident size of the process that
forked it (fork copies the page-table counts into the child's high-water mark, and exec keeps
the maximum). Forked from the benchmark driver (numpy, pyarrow, id maps: 100+ MB), every child
would report at least the driver's size. This launcher imports nothing but built-in modules
(about 9 MiB resident), so a measured child reports max(~9 MiB, its own peak) = its own peak.

The child gets stdout and stderr in LOG, an address-space limit (RLIMIT_AS) when AS_LIMIT_BYTES
> 0, and SIGKILL after TIMEOUT_S. RESULT gets one line:
`wall_s user_s sys_s maxrss_kib exit_code timed_out` (exit_code negative = killed by that signal).
"""

import os
import resource
import signal
import sys
import time


def main():
    result, log, timeout, as_limit = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    if sys.argv[5] != "--":
        sys.exit("usage: spawn.py RESULT LOG TIMEOUT_S AS_LIMIT_BYTES -- COMMAND...")
    cmd = sys.argv[6:]
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            if as_limit > 0:
                resource.setrlimit(resource.RLIMIT_AS, (as_limit, as_limit))
            os.execvp(cmd[0], cmd)
        except BaseException as e:  # noqa: BLE001
            os.write(2, f"spawn.py: cannot run {cmd[0]!r}: {e}\n".encode())
        os._exit(127)
    os.close(fd)
    timed_out = []

    def on_alarm(signum, frame):
        timed_out.append(1)
        os.kill(pid, signal.SIGKILL)

    def on_stop(signum, frame):
        os.kill(pid, signal.SIGKILL)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    if timeout > 0:
        signal.setitimer(signal.ITIMER_REAL, timeout)
    _, status, ru = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    signal.setitimer(signal.ITIMER_REAL, 0)
    rc = os.waitstatus_to_exitcode(status)
    with open(result, "w") as f:
        f.write(f"{wall:.6f} {ru.ru_utime:.6f} {ru.ru_stime:.6f} {ru.ru_maxrss} {rc} {1 if timed_out else 0}\n")


if __name__ == "__main__":
    main()
