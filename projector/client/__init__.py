"""The only HTTP: requests to the API server, its answers, and the one retry rule.

The `Api` requests, the client over keep-alive connections, the wire format. Imports the core.
"""
