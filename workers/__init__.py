"""workers (built in the web-service issue)."""
