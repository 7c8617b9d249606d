"""A checkpoint is data, never code (issue 27, path 3): the MXNet engine writes the optimizer state as arrays in
MXNet's NDArray format plus a JSON layout, restores it without pickle (a resumed Trainer continues exactly as the
original, for SGD momentum's array state and Adam's tuple state), and refuses an older checkpoint's pickled
``trainer.states`` -- whose payload would run on load -- unless DYNATRAIN_TRUST_PICKLED_STATES=1 says it is trusted."""
import json
import subprocess
import textwrap

SCRIPT = textwrap.dedent("""
    import json, os, pickle, sys
    import mxnet as mx
    from mxnet import autograd, gluon, nd
    from dynatrain_runtime.engines.mxnet import MXNetEngine, UntrustedCheckpoint

    root, marker = sys.argv[1], sys.argv[2]

    def build(opt, params):
        mx.random.seed(1)
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3))
        net.initialize(mx.init.Xavier())
        net(nd.zeros((1, 4)))
        tr = gluon.Trainer(net.collect_params(), opt, params, kvstore="local", update_on_kvstore=False)
        engine = MXNetEngine(kvstore="local")
        engine.bind(net, tr)
        return net, tr, engine

    def step(net, tr, seed):
        x = nd.arange(20).reshape((5, 4)) / 20.0 + seed
        with autograd.record():
            loss = (net(x) ** 2).sum()
        loss.backward()
        tr.step(5)

    def weights(net):
        return [p.data().asnumpy() for p in net.collect_params().values()]

    out = {}
    for opt, params in (("sgd", {"learning_rate": 0.1, "momentum": 0.9}), ("adam", {"learning_rate": 0.01})):
        net, tr, engine = build(opt, params)
        for k in range(3):
            step(net, tr, k)
        ckpt = os.path.join(root, opt)
        os.makedirs(ckpt)
        engine.save(ckpt)
        net2, tr2, engine2 = build(opt, params)
        real_loads = pickle.loads
        pickle.loads = lambda *a, **k: (_ for _ in ()).throw(AssertionError("pickle.loads called"))
        try:
            engine2.load(ckpt)
        finally:
            pickle.loads = real_loads
        step(net, tr, 3)
        step(net2, tr2, 3)
        diff = max(float(abs(a - b).max()) for a, b in zip(weights(net), weights(net2)))
        out[opt] = {"files": sorted(os.listdir(ckpt)), "diff": diff, "num_update": tr2._optimizer.num_update}

    # an older checkpoint: Trainer.save_states' pickle, here one whose payload would run on load
    class Payload:
        def __reduce__(self):
            return (open, (marker, "w"))
    legacy = os.path.join(root, "legacy")
    os.makedirs(legacy)
    net, tr, engine = build("sgd", {"learning_rate": 0.1})
    net.save_parameters(os.path.join(legacy, "params"))
    with open(os.path.join(legacy, "trainer.states"), "wb") as handle:
        handle.write(pickle.dumps(({0: Payload()}, None)))
    try:
        engine.load(legacy)
        out["legacy"] = "loaded"
    except UntrustedCheckpoint as exc:
        out["legacy"] = str(exc)
    out["marker_after_refusal"] = os.path.exists(marker)
    os.environ["DYNATRAIN_TRUST_PICKLED_STATES"] = "1"
    try:
        engine.load(legacy)
    except Exception:       # the payload is not a real state; what matters is that it was unpickled
        pass
    out["marker_when_trusted"] = os.path.exists(marker)
    print(json.dumps(out))
""")


def test_optimizer_state_round_trips_without_pickle_and_a_pickle_is_refused(tmp_path, node_python):
    marker = tmp_path / "payload-ran"
    proc = subprocess.run([node_python, "-c", SCRIPT, str(tmp_path / "ckpts"), str(marker)], capture_output=True,
                          text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    for opt in ("sgd", "adam"):
        assert res[opt]["files"] == ["optimizer.json", "optimizer.states", "params"], res
        assert res[opt]["diff"] < 1e-6 and res[opt]["num_update"] == 4, res
    assert "pickle" in res["legacy"] and "DYNATRAIN_TRUST_PICKLED_STATES=1" in res["legacy"], res
    assert res["marker_after_refusal"] is False
    assert res["marker_when_trusted"] is True        # the opt-in really is the old loader
