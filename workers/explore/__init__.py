"""Seed exploration on stale weights: exploration requests, what it remembers, seed plans."""
