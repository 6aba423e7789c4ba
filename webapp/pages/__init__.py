"""Browser pages: login, runs, new run, run detail (live), compare, cluster."""
