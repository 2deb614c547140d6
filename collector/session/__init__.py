"""The session stage: committed spans in, scored sessions out, in named parts.

``tracker`` knows which traces are open and when they go idle; ``held`` keeps open traces' spans,
normalized once, until they are assembled (read back from the store when not held whole);
``assembly`` turns a trace's records into its sessions' shares, and the tool-call, stamp and index
rows; ``rows`` scores sessions and makes their rows (pure, as ``assembly`` is); ``trace_text`` keeps
assembled traces' texts for a lake's replicas; ``jobs`` is what one job does with them in one
transaction on the store's writer, asking the store through its one port (``store/tables.py``);
``service`` plans and schedules the jobs.
"""
