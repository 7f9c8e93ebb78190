"""Traffic as data: public request traces read into one typed table, and workloads fitted to
them (or to a running server's metrics).

A trace becomes the same seeded request plan as a synthetic workload (:mod:`tuner.loadgen`
replays both); a fit always says how close it is to its source. Depends only on
:mod:`tuner.config` and :mod:`tuner.errors`, so the load generator can import it.
"""
