"""Prefix-affinity request routing for the Ray Serve replicas (fastllm.ray_serve).

Requests whose prompts begin alike go to the same replica, so its fastllm-server finds their
common prefix in its KV cache. Each request carries a routing key (the first characters of its
prompt, computed by the ingress); the replica it goes to is the highest-scoring one under
rendezvous hashing of (key, replica id). Every router computes the same choice from the same live
replicas, and a replica that leaves or joins moves only the keys it wins or loses. Affinity yields
to load: when the chosen replica has no free session and another has one, the request goes to the
least loaded replica instead (a prefill recomputed costs less than waiting for a whole generation).
"""
from __future__ import annotations

import hashlib
from typing import List, Optional

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica


def rendezvous_score(key: str, replica_id: str) -> int:
    # blake2b, not hash(): routers in different processes must agree
    digest = hashlib.blake2b(f"{replica_id}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class PrefixAffinityRouter(RequestRouter):
    """request_router_kwargs: free_sessions, the requests a replica decodes together (its
    fastllm-server's --max-sessions): below that many ongoing requests it still has a free session."""

    def initialize_state(self, free_sessions: int = 1, **kwargs) -> None:
        self._free_sessions = free_sessions

    def _has_free_session(self, replica: RunningReplica) -> bool:
        ongoing = self.replica_queue_len_cache.get(replica.replica_id)
        return ongoing is None or ongoing < self._free_sessions  # unknown: assume free, Ray probes it

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        if pending_request is not None:
            # Sleep between rounds when every replica is full, rather than spin.
            pending_request.routing_context.should_backoff = True
        key = pending_request.kwargs.get("route_key") if pending_request is not None else None
        if not candidate_replicas or key is None:
            return [candidate_replicas]  # Ray picks the least loaded
        ranked = sorted(candidate_replicas, key=lambda r: rendezvous_score(key, r.replica_id.unique_id), reverse=True)
        preferred = ranked[0]
        if self._has_free_session(preferred) or not any(self._has_free_session(r) for r in ranked[1:]):
            return [[preferred], ranked[1:]]
        return [ranked]  # the least loaded of all
