"""``specwatch report``, HTML and plots from the pair ledger; may import shadow, vllm, core.

:mod:`specwatch.report.data` reads the ledger and the optional acceptance source and computes
everything with the shadow statistics (no statistics of its own); :mod:`specwatch.report.render`
draws the plots with matplotlib (the ``report`` extra, Agg backend) and writes ``index.html``.
"""
