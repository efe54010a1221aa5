"""The request pipeline: one module per stage, run in a fixed order built once at start-up.

See :mod:`~tokenplane.gateway.stages.pipeline` for the shape of a stage and how the chain runs,
and :mod:`~tokenplane.gateway.stages.context` for the per-request context the stages share.
"""
