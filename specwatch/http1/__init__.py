"""HTTP/1.1 forwarding engine: client side, exchanges, upstream pool, fast path; may import core."""
