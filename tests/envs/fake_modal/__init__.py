"""A fake Modal control plane for tests: the real ``modal`` SDK (1.6.4) talks gRPC to it on loopback.

See ``server.FakeModal``; sandboxes are local processes in per-sandbox folders (``sandboxes.py``).
"""

from fake_modal.server import FakeModal

__all__ = ["FakeModal"]
