"""robusttune: map where Byzantine-robust federated learning breaks."""

__version__ = "0.1.0"
