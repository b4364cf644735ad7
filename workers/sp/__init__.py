"""Elastic sequence parallelism: Ulysses groups, the node agent and its device workers, the degree policy,
shared weights."""
