"""What every layer shares (clock, config, logs, numbers, store, wire); may import nothing."""
