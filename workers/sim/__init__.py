"""The cost simulator: the real queue, bandit, SP degree policy and ledger on SimPy's simulated time
(docs/SIMULATOR.md)."""
