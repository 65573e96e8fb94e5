"""The main module that helper processes start from: deliberately empty.

multiprocessing's spawn re-runs the parent's ``__main__`` in every child. The
shard writer's helpers are spawned with this module standing in as
``__main__``, so a child never re-runs the user's script or CLI (which would
repeat its side effects, or load Beam for nothing).
"""
