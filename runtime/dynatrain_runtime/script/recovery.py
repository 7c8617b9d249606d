"""Recovery from a survivor: the state of the last completed step, kept in memory by every worker.

With ``update_on_kvstore=False`` (MXNet) or DistributedDataParallel (torch) every worker applies
the same aggregated gradient to the same weights, so each one holds the job's full state:
parameters, optimizer state and sampler position.  At a step boundary a worker *issues* a
snapshot (its engine's ``snapshot``; the engine-neutral part is ``engines.snapshot.Snapshot``):
with MXNet, copies of the parameters and optimizer states queued on MXNet's engine (ordered
after this step's update and before the next one's, so they hold exactly this boundary's
state) and the optimizer's update counters (``engines.mxnet.MXNetSnapshot``); with torch, CPU
clones of the ``state_dict``s, complete when taken (``engines.torch.TorchSnapshot``); the
checkpoint meta with both.  Nothing waits for MXNet's copies there: the training thread only
confirms a snapshot when it issues the next one, after later forward passes needed the same
update, so the wait is free.  A confirmed snapshot is never one whose step's collective did
not finish.  ``Elastic`` issues one at a boundary when the wall time since the last is at
least ``1 / SNAPSHOT_BUDGET`` (50) times what issuing costs (a few engine calls): every step
for steps longer than that, every few steps of a toy model, so snapshots take <= 2 % of
the time.

When a peer dies, the survivors block in the next collective (MXNet) or see it raise (torch);
the launcher sends one of them ``recover`` on the stdin channel, whose thread writes the
newest snapshot with ``CheckpointStore`` -- the regular checkpoint format, marked
``meta["recovery"]`` -- the pending one if its copies complete within ``CONFIRM_WAIT`` s (its
step's collective finished), else the confirmed one.  The next generation resumes from it.

Bound: a lost worker costs at most the steps since the newest usable snapshot -- the
pending one when its step's collective finished, else the confirmed one -- plus the step in
flight: at most two snapshot intervals (each the larger of one step and 50 times a copy's
cost, a few tens of ms of training) plus one step.  With steps longer than 50 copies
(a real model) that is the step in flight and, when the dead peer never pushed the previous
step's gradients, that step too.  Redone steps never reached the audit (it is written with
the snapshot), so every sample is still used once per epoch.
"""

from __future__ import annotations

CONFIRM_WAIT = 1.0        # s the recover handler waits for a pending snapshot's copies
