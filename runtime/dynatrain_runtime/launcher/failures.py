"""What the launcher does when a generation fails: a lost worker, survivor recovery, the give-up counter.

A lost worker is logged ``FAILED`` and dropped from ``host_worker`` (the master never is: it hosts the
rendezvous).  The job resumes from the state of the last completed step, which one survivor writes
as a recovery checkpoint when asked (``--recovery survivor``), else from the last regular checkpoint;
the launch strategy may instead keep the survivors and re-form the group in place (``InPlace``).
``--max-restarts`` failed generations in a row without progress end the launcher (EXIT_GAVE_UP).
"""

from __future__ import annotations

import time

from .generation import clean_int
from .resize import ResizeRecord


class FailureHandling:
    """The failure path of ``launcher``: report, recover, count, and the resize record of the failure."""

    def __init__(self, launcher):
        self.launcher = launcher
        self.without_progress = 0               # failed generations in a row without progress

    def report(self, g, failed):
        L = self.launcher
        for host, why in sorted(failed.items()):
            L.out(f"generation {g.id}: FAILED {host}: {why}")
            L.event("worker_failed", generation=g.id, ip=host, reason=why,
                    dropped=host != L.master and host not in g.script_failed)

    def recover(self, g, failed):
        """Ask the survivors, best rank first, to write the last completed step's state.

        Their training threads are blocked in a collective with the dead peer; the request is
        served by their stdin channel.  Returns the answer that wrote a checkpoint, else None.
        """
        L = self.launcher
        if L.config.recovery != "survivor" or not g.survivors_hold_state():
            return None                         # before its first step the group is at its resume point
        t0 = time.monotonic()
        deadline = t0 + L.config.recover_timeout
        tried = []
        for w in g.survivors(failed):
            if time.monotonic() >= deadline:
                break
            g.recovery = None
            tried.append(w.host)
            if not w.send({"kind": "recover", "generation": g.id, "failed": sorted(failed)}):
                continue
            while g.recovery is None and w.alive() and time.monotonic() < deadline:
                L.drain_messages()
            answer = g.recovery
            if answer is not None and answer.get("ok"):
                answer["seconds_total"] = round(answer["received_at"] - t0, 3)
                L.out(f"generation {g.id}: survivor {w.host} (rank {answer.get('rank')}) wrote the state of "
                      f"step {answer.get('step')} in {answer['seconds_total']:.2f} s")
                L.event("recovery_checkpoint", generation=g.id, writer=w.host, rank=answer.get("rank"),
                        step=answer.get("step"), path=answer.get("path"), seconds=answer["seconds_total"],
                        write_s=answer.get("seconds"), failed=sorted(failed))
                return answer
            why = answer.get("reason") if answer else ("no answer" if w.alive() else "exited")
            L.out(f"generation {g.id}: survivor {w.host} could not give the state: {why}")
        L.event("recovery_unavailable", generation=g.id, tried=tried, failed=sorted(failed),
                seconds=round(time.monotonic() - t0, 3))
        return None

    # ------------------------------------------------------------------ the give-up counter
    def count(self, g):
        """One more failed generation; the count starts again after one that made progress."""
        if g.made_progress():
            self.without_progress = 0
        self.without_progress += 1

    def progressed(self, g):
        """``g`` took its first step: a group that reports steps made progress (a torchrun script's is
        judged when it fails: ``Generation.made_progress``)."""
        if not g.plain:
            self.without_progress = 0

    def gave_up(self):
        return self.without_progress > self.launcher.config.max_restarts

    # ------------------------------------------------------------------ going on
    def handle(self, g, failed, recovery=None):
        """The lost hosts leave; returns the failure's resize record (``resize_start`` written)."""
        L = self.launcher
        self.count(g)
        drop = [h for h in g.lost(failed) if h != L.master]
        for host in drop:
            L.members.append_log("FAILED", host)
        if drop:
            L.members.drop(drop)
            self.without_progress = 0
        if g.first_step_at is None and g.resume:
            L.store.forget(g.resume[0])         # it failed to start: verify its checkpoint again
        latest = L.resume_point()
        resume_step = latest[1]["step"] if latest else 0
        mark = (latest[1].get("recovery") or {}) if latest else {}
        # a survivor wrote it (also when its answer came too late), or gave a checkpoint of its very step
        # that a periodic save had written already: the same state, nothing lost
        from_survivor = mark.get("generation") == g.id or bool(
            latest and recovery and recovery.get("ok") and recovery.get("path") == latest[0])
        stop_step = max(g.max_step, clean_int((recovery or {}).get("step"), 0))     # last completed step
        record = ResizeRecord.for_failure(g, drop, stop_step, resume_step, from_survivor)
        if recovery:
            record.set(recovery_s=recovery.get("seconds_total"))
        L.strategy.after_failure(g, record)
        L.event("resize_start", **record.event_fields())
        return record
