"""projector: mirror contract Secrets across namespaces, only where admin and producer agree."""

__version__ = "0.1.0"
