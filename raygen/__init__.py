"""raygen: generate tool-using agent trajectories at scale on Ray."""

__version__ = "0.1.0"
