"""The worker side's bookkeeping of the governor (raygen/distributed/client_usage.py), without Ray."""

from raygen.distributed.client_usage import DemandMeter


def test_the_demand_meter_counts_thousands_a_second_whole():
    meter = DemandMeter()
    for i in range(3000):  # 3,000 permits asked for over one second
        meter.add(10.0 + i / 3000)
    assert meter.per_s(10.9999) == 3000  # the current second so far
    assert meter.per_s(11.5) == 3000  # the last whole second, while the next one is young
    for i in range(100):
        meter.add(11.6 + i / 1000)
    assert meter.per_s(11.8) == 3000  # the larger of the two


def test_the_demand_meter_forgets_a_quiet_worker():
    meter = DemandMeter()
    for i in range(500):
        meter.add(5.0 + i / 1000)
    assert meter.per_s(6.5) == 500
    assert meter.per_s(8.0) == 0  # more than a second without demand: the old rate says nothing
