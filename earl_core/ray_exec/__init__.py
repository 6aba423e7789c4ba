"""Ray execution of the core: cluster connection, rollout and trainer worker groups (the only Ray-aware package)."""
