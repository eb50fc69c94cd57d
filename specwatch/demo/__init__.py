"""The local demo (``specwatch demo``); may import server and everything below it, and simulate."""
