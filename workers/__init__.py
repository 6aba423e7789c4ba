"""Celery workers: take a queued run, drive the EARL core on Ray, store and publish its events."""
