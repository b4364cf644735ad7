"""The phases of one iteration as plain functions (sync, rollout, explore, train, validate, report);
the only ledger writer."""
