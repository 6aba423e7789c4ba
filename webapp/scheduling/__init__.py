"""Pure scheduling policy of the team-shared cluster: gang placement, quotas, priority, fair share, backfill."""
