"""The opt-in rollout wing: workloads that read a copy through env vars restart on change.

The wiring starts it beside the controller, on the same leadership term.
"""
