"""What a tuning record may hold, and when its claims are believed.

A record is data, never code: its trace may only replay what our own design spaces emit
(:mod:`qcompile.trust.traces`), records that cross a trust boundary (an import, a merge) are
validated whole before anything is stored (:mod:`qcompile.trust.records`), and a latency that
this machine type did not measure does not decide what gets built (:mod:`qcompile.trust.seals`).
"""
