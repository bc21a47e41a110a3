"""One leadership term: what to reconcile when, and the one write path.

The work queue and its timing, the controller, leader election and the fence, the writer with
its bodies and Events, the hash key, conflict watches and the producers' notices.
"""
