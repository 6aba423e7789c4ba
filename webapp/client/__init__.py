"""`earl`: the command-line client of the EARL service (HTTP + websockets only; no Django in here)."""
