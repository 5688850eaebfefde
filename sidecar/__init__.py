"""The marker-batching sidecar: an aiohttp server that batches executors' markers into files."""
