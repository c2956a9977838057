"""keel's fuzz harnesses: `ops` (every op of every keel namespace) and `loaders` (checkpoint and GGUF files)."""
