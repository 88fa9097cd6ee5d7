"""The models this library implements, one package each, all on the shared engine
(data, graph, penalties, metrics, exchange, consensus, distributed, audit).

No model package imports another model or the app (``tests/test_architecture.py``).
"""
