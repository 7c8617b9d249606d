"""Pure tests of the data plan and the batch / LR policy (no MXNet needed)."""
import random

import pytest

from dynatrain_runtime.script import data as d
from dynatrain_runtime.contract.checkpoint import audit_check


def test_epoch_order_is_deterministic_permutation():
    a = d.epoch_order(1438, 42, 3)
    assert sorted(a) == list(range(1438))
    assert a == d.epoch_order(1438, 42, 3)
    assert a != d.epoch_order(1438, 42, 4)
    assert a != d.epoch_order(1438, 43, 3)


@pytest.mark.parametrize("n,world", [(0, 1), (1, 3), (7, 3), (64, 5), (29, 29), (10, 64)])
def test_shard_tiles_the_chunk(n, world):
    spans = [d.shard(n, world, r) for r in range(world)]
    assert spans[0][0] == 0 and spans[-1][1] == n
    for (s0, e0), (s1, _e1) in zip(spans, spans[1:]):
        assert e0 == s1
    sizes = [e - s for s, e in spans]
    assert max(sizes) - min(sizes) <= 1


def test_shard_rejects_bad_rank():
    with pytest.raises(ValueError):
        d.shard(10, 2, 2)


def simulate(n, seed, epochs, global_batch, policy, per_worker, world_at):
    """Run the data plan; world_at(step) gives the world size of each step (resizes anywhere)."""
    used = {}
    epoch, pos, step = 0, 0, 0
    while epoch < epochs:
        order = d.epoch_order(n, seed, epoch)
        world = world_at(step)
        size = d.step_global_batch(policy, global_batch, per_worker, world)
        total = 0
        for rank in range(world):
            idx, w, gsize = d.plan_step(order, pos, world, rank, size)
            for i, wt in zip(idx, w):
                if wt > 0:
                    used.setdefault(epoch, []).append(i)
            total = gsize
        pos += total
        step += 1
        if pos >= n:
            epoch, pos = epoch + 1, 0
    return used, step


@pytest.mark.parametrize("policy", d.BATCH_POLICIES)
@pytest.mark.parametrize("trial", range(25))
def test_every_sample_once_per_epoch_across_random_resizes(policy, trial):
    rng = random.Random(trial)
    n = rng.choice([1, 13, 100, 1438])
    worlds = {}

    def world_at(step):
        if step not in worlds:
            worlds[step] = rng.randint(1, 9) if rng.random() < 0.3 or step == 0 else worlds[step - 1]
        return worlds[step]

    used, _steps = simulate(n, trial, 3, rng.choice([1, 7, 64]), policy, rng.choice([1, 5, 32]), world_at)
    for epoch in range(3):
        assert sorted(used[epoch]) == list(range(n)), "epoch %d" % epoch


def test_fixed_global_uses_the_same_global_batches_whatever_the_world():
    def batches(world_at):
        out, pos, step = [], 0, 0
        order = d.epoch_order(200, 1, 0)
        while pos < 200:
            world = world_at(step)
            chunk = []
            for r in range(world):
                idx, w, g = d.plan_step(order, pos, world, r, 64)
                chunk += [i for i, x in zip(idx, w) if x > 0]
            out.append(sorted(chunk))
            pos += g
            step += 1
        return out
    assert batches(lambda s: 1) == batches(lambda s: [2, 4, 3, 1][s % 4])


def test_empty_share_gets_a_zero_weight_placeholder():
    order = list(range(10))
    idx, w, g = d.plan_step(order, 8, 4, 3, 64)    # 2 samples left, 4 workers
    assert g == 2 and w == [0.0] and len(idx) == 1


@pytest.mark.parametrize("size", [64, 5, 2, 1])
def test_a_healing_rank_takes_a_placeholder_and_the_others_the_whole_chunk(size):
    order = list(range(100))
    shares = [d.plan_step(order, 10, 3, r, size, healing=frozenset([1])) for r in range(3)]
    assert shares[1][:2] == ([10], [0.0])                     # the joiner still receiving: consumes nothing
    used = [i for idx, w, _g in shares for i, x in zip(idx, w) if x > 0]
    assert sorted(used) == order[10:10 + size]                # the others: every sample of the chunk once
    assert {g for _i, _w, g in shares} == {size}              # the global size (the loss's scale) unchanged
    assert [d.plan_step(order, 10, 3, r, size) for r in range(3)] == \
        [d.plan_step(order, 10, 3, r, size, healing=()) for r in range(3)]


def test_fixed_global_lr_is_constant():
    s = d.LrSchedule("fixed-global", 0.1, 64, warmup_steps=10)
    assert s.on_world(2, 0) == 0.1
    s.on_world(5, 40)
    assert s.lr_at(41) == 0.1


def test_fixed_per_worker_linear_scaling_with_warmup():
    s = d.LrSchedule("fixed-per-worker", 0.1, 64, per_worker_batch=32, warmup_steps=10)
    assert s.on_world(4, 0) == pytest.approx(0.05)          # starts at one worker's LR (32/64 * 0.1)
    assert s.lr_at(5) == pytest.approx(0.05 + 0.5 * (0.2 - 0.05))
    assert s.lr_at(10) == pytest.approx(0.2)                 # 4 * 32 / 64 * 0.1
    assert s.lr_at(100) == pytest.approx(0.2)
    s.on_world(2, 100)                                       # shrink: ramp 0.2 -> 0.1 over 10 steps
    assert s.lr_at(100) == pytest.approx(0.2)
    assert s.lr_at(105) == pytest.approx(0.15)
    assert s.lr_at(110) == pytest.approx(0.1)
    state = dict(s.state)                                    # survives a checkpoint round trip
    s2 = d.LrSchedule("fixed-per-worker", 0.1, 64, per_worker_batch=32, warmup_steps=10, state=state)
    assert s2.on_world(2, 103) == pytest.approx(s.lr_at(103))


def test_fixed_per_worker_without_warmup_jumps():
    s = d.LrSchedule("fixed-per-worker", 0.1, 64, per_worker_batch=16, warmup_steps=0)
    assert s.on_world(8, 0) == pytest.approx(0.2)
    assert d.step_global_batch("fixed-per-worker", 64, 16, 8) == 128


def test_unknown_policy_rejected():
    with pytest.raises(ValueError):
        d.LrSchedule("bogus", 0.1, 64)
    with pytest.raises(ValueError):
        d.step_global_batch("bogus", 64, 32, 2)


def test_audit_check_detects_repeats_and_gaps():
    good = {"steps": [{"epoch": 0, "idx": [0, 1]}, {"epoch": 0, "idx": [2]}], "completed_epochs": [0]}
    assert audit_check(good, 3) == []
    rep = {"steps": [{"epoch": 0, "idx": [0, 1]}, {"epoch": 0, "idx": [1, 2]}], "completed_epochs": [0]}
    assert "more than once" in audit_check(rep, 3)[0]
    gap = {"steps": [{"epoch": 0, "idx": [0]}], "completed_epochs": [0]}
    assert "never used" in audit_check(gap, 3)[0]
    dup = {"steps": [{"epoch": 0, "idx": [0, 1, 2], "dup": {"1": 2}}], "completed_epochs": [0]}
    assert "more than once" in audit_check(dup, 3)[0]
