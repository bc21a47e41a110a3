"""List/watch into memory: what a reconcile reads instead of the API server.

Each kind's cache, the store and its indexes, snapshots, informers. Imports the client and the
core.
"""
