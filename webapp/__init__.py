"""webapp (built in the web-service issue)."""
