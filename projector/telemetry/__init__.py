"""What an operator sees: metrics and their table, tracing, logs.

And the HTTP ports that serve health and /metrics.
"""
