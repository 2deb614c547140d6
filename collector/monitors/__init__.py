"""Monitors: declarative rules over what agentfunnel measures (funnel steps, proven outcomes, drop-off reasons,
pass^k, the judge, tail cost and latency), each change tested for significance before it fires.

``settings`` is what the configuration holds; ``stats`` the tests (pure); ``measures`` the SQL;
``engine`` evaluates rules into firings; ``table`` stores them; ``webhook`` delivers them;
``service`` runs them in ``serve``; ``command`` is ``agentfunnel monitors``.
"""
