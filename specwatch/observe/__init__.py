"""Observe chain: scrape -> parse -> window -> health."""
