"""A multilang spout as a Structured Streaming source whose commits ack the spout."""
