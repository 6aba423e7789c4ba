"""Submit-time refusal: a run's gang against its team's quota, its team's queue and the cluster's nodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from earl_core.config import RunConfig
from webapp.accounts.models import Team
from webapp.runs.models import Run
from webapp.scheduling.gang import is_single_bundle, requested_gang, resources_errors
from webapp.scheduling.models import Allocation, quota_of
from webapp.scheduling.resources import Node, Resources, SchedulingError, amount
from webapp.scheduling.workload import Refusal, RunRequest, refusal


def cluster_nodes(view: Mapping[str, Any]) -> tuple[Node, ...] | None:
    """The live nodes of a ``ray_nodes()`` answer, or None when it cannot be trusted to size the cluster.

    None when the dashboard is not configured or unreachable, reports no live node, or reports a node whose
    resources do not read as numbers: refusing a run because of a half-read cluster would be worse than letting
    it queue.
    """
    if view.get("error"):
        return None
    nodes = []
    for i, row in enumerate(view.get("nodes") or ()):
        if row.get("state") == "DEAD":
            continue
        try:
            total = Resources(cpus=float(row.get("cpus") or 0), gpus=int(row.get("gpus") or 0),
                              memory_bytes=int(row.get("memory_bytes") or 0))
        except (TypeError, ValueError):  # SchedulingError is a ValueError too
            return None
        # Named by Ray's node id: allocations record these names, so they must not change while the node lives.
        nodes.append(Node.idle(str(row.get("node_id") or f"node-{i}"), total))
    return tuple(nodes) or None


def check_submission(team: Team, *, resources: Mapping[str, Any], config: RunConfig,
                     nodes: Sequence[Node] | None) -> None:
    """Raise a SchedulingError naming the request field when this run could never start or may not queue.

    ``nodes`` None (cluster view unavailable) skips the cluster-size checks; the team's quota and queue length
    still apply. Call it inside the transaction that stores the run, with the team's row locked, so two
    submissions cannot both take the last queue place.
    """
    errors = resources_errors(resources)
    if errors:  # the API validated it already; a direct call may not have
        raise errors[0]
    gang = requested_gang(resources, config)
    request = RunRequest(run_id=0, team=team.slug, bundles=gang, submitted_at=0.0)
    if nodes is None:
        # A stand-in cluster exactly the size of the request passes every cluster check (each bundle fits, the
        # total fits, and the whole gang packs onto one node of its own sum), so only the team's limits can refuse.
        nodes = (Node.idle("unknown", request.total),)
    # Waiting runs: admitted ones (an open allocation, a worker about to claim them) no longer wait.
    admitted = Allocation.objects.filter(team=team, ended_at__isnull=True).values("run_id")
    queued = Run.objects.filter(team=team, status=Run.Status.QUEUED).exclude(pk__in=admitted).count()
    found = refusal(request, nodes, quota=quota_of(team), queued_count=queued)
    if found is not None:
        raise SchedulingError(request_field(found.field, single=is_single_bundle(resources)), found.message,
                              allowed=_allowed(found, nodes))


def request_field(field: str, *, single: bool) -> str:
    """The refusal's field (``bundles[2].memory_bytes``) as the submitted JSON names it (``resources...``)."""
    if field == "queued":
        return field
    field = field.replace("memory_bytes", "memory_gib")
    if single and field.startswith("bundles[0]"):
        field = field.removeprefix("bundles[0]").lstrip(".")
    return f"resources.{field}" if field else "resources"


def _allowed(found: Refusal, nodes: Sequence[Node]) -> str:
    dim = found.field.rsplit(".", 1)[-1]
    if found.code == "queue_full":
        return f"at most {found.limit:g} queued runs per team; wait for one to start, or cancel one"
    if found.code == "team_quota":
        return f"at most {amount(dim, found.limit)} (the team's quota)"
    if found.field == "bundles":
        return f"bundles that can all be placed at once on the {len(nodes)} nodes"
    if found.code == "cluster_too_small":
        return f"at most {amount(dim, found.limit)} in all"
    if dim in ("gpus", "cpus", "memory_bytes"):
        return f"at most {amount(dim, found.limit)} per bundle"
    sizes = sorted({n.total.describe() for n in nodes})
    return "a bundle one node can hold; nodes have " + "; ".join(sizes[:5]) + ("; ..." if len(sizes) > 5 else "")
