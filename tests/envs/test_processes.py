"""raygen.envs.processes.use_pidfd_child_watcher, in a child interpreter: it changes the process-wide
child watcher, which must not leak into the other tests of this process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import asyncio, os, sys, threading
    from raygen.envs.processes import run_captured, use_pidfd_child_watcher

    async def main():
        use_pidfd_child_watcher()
        use_pidfd_child_watcher()  # a second call keeps the active watcher
        watcher = asyncio.get_child_watcher()
        groups = set()
        before = threading.active_count()
        running = asyncio.gather(*(
            run_captured(["bash", "-c", f"sleep 1; echo {i}; exit {i % 3}"], env=None, cwd=None,
                         timeout_s=30, max_output_chars=100, groups=groups)
            for i in range(20)
        ))
        await asyncio.sleep(0.5)
        during = threading.active_count()
        results = await running
        if isinstance(watcher, asyncio.PidfdChildWatcher):
            assert during == before, f"{during - before} threads for 20 children"
        assert [r.returncode for r in results] == [i % 3 for i in range(20)]
        assert [r.out.render()[0] for r in results] == [f"{i}\\n" for i in range(20)]
        try:
            os.close(os.pidfd_open(os.getpid()))
            pidfd = "pidfd"
        except (AttributeError, OSError):
            pidfd = "no-pidfd"
        print(type(watcher).__name__, pidfd)

    asyncio.run(main())
    """
)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12's default already uses pidfds")
def test_commands_run_and_report_their_exit_without_a_thread_each():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    watcher, pidfd = done.stdout.split()
    if pidfd == "no-pidfd":
        assert watcher == "ThreadedChildWatcher"
        pytest.skip("no pidfd_open here (kernel < 5.3 or a seccomp filter): the threads stay")
    assert watcher == "PidfdChildWatcher"
