"""raygen benchmarks: ``python -m bench [--quick] [--only NAME,...]`` (see bench/README.md).

Every scenario runs the real code path (the ``raygen`` CLI as a subprocess, the simulator as its own
process) and measures side by side in one invocation, so the ratios hold on a noisy shared machine.
"""
