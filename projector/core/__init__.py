"""The pure core: what a grant means and what to do about it, with no I/O.

Names, the model, grant parsing and validation, desired state, the plan and its values,
reconcile with the ownership and consent rules beside it, status and explain. No asyncio: it
imports nothing of projector but itself and `projector.errors`.
"""
