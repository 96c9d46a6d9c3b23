"""One worker of the 2-process TensorFlow job of tests/test_grad_tf.py (not run by pytest).

Usage: ``python tests/grad_tf_worker.py RANK PORT0,PORT1 OUT.json TIMELINE``. Builds a
``MultiWorkerMirroredStrategy`` from ``TF_CONFIG`` on 127.0.0.1 and trains a small Keras model
whose forward order differs from its variable creation order (one sparse embedding gradient),
for SGD with momentum, Adam and AdamW: plainly (``optimizer.apply_gradients``, which
all-reduces the whole list), with ``ScheduledAllReduce`` one step per ``tf.function``, and (Adam)
two unrolled steps per ``tf.function``; then ``mode="auto"`` beside plain steps (a search
of settings decided by measurements through ``multi_step``, the same with eager steps and a
second decision after ``trial.reopen``, and ``min_saving=1``, which never tries
scheduling). Writes the variables' bytes, the schedule, the decisions and an analysis of
the traced graphs to OUT.json.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import chronica.tf
from chronica.runtime import auto

STEPS, BATCH, WORKERS = 4, 16, 2
# mode="auto" with min_saving=0: a bucketed window, two settings searched (each beside bucketed
# windows) and a window of the better one after the search (windows of MEASURE_STEPS + 1 steps,
# set below): decided by step 18, whatever it measured. A run goes on AFTER steps past each
# decision (the decided engine applies them); "redecided" then reopens the trial and decides
# again, the others stop. AUTO_STEPS only bounds a run that never decides (its checks fail).
AUTO_STEPS, AFTER, MEASURE_STEPS = 60, 3, 2
VOCAB, FEATURES, CLASSES = 10, 8, 3
KNOBS = {"partition_bytes": 2048, "credit_bytes": 3000, "comm_ratio": 4.0}
COLLECTIVES = ("CollectiveReduceV2", "CollectiveGatherV2")


class Net(keras.Model):
    """Created head first; used stem, norm, big, embed, head (embed's gradient is sparse)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = keras.layers.Dense(CLASSES)
        self.big = keras.layers.Dense(64)
        self.stem = keras.layers.Dense(32)
        self.norm = keras.layers.LayerNormalization()
        self.embed = keras.layers.Embedding(VOCAB, 64)

    def call(self, x: tf.Tensor, tokens: tf.Tensor) -> tf.Tensor:
        h = self.big(self.norm(tf.nn.relu(self.stem(x))))
        return self.head(tf.nn.relu(h + tf.reduce_mean(self.embed(tokens), axis=1)))


def make_optimizer(kind: str) -> keras.optimizers.Optimizer:
    if kind == "sgd":
        return keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
    if kind == "adam":
        return keras.optimizers.Adam(learning_rate=1e-2)
    return keras.optimizers.AdamW(learning_rate=1e-2, weight_decay=0.1)


def data(rank: int, steps: int = STEPS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + rank)
    n = steps * BATCH
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    return x, rng.integers(0, VOCAB, (n, 4)).astype(np.int32), rng.integers(0, CLASSES, n)


def hexes(variables: list) -> list[str]:
    return [np.asarray(v.numpy()).tobytes().hex() for v in variables]


def ancestors(op: tf.Operation, skip_token_edges: bool = False) -> set[tf.Operation]:
    """Every op that ``op`` waits for, through data and control edges.

    ``skip_token_edges`` drops the control edges that automatic control dependencies add
    between collectives (their shared ordering token), leaving chronica's own gates.
    """
    seen: set[tf.Operation] = set()
    stack = [op]
    while stack:
        cur = stack.pop()
        preds = [t.op for t in cur.inputs]
        for c in cur.control_inputs:
            if not (skip_token_edges and c.type in COLLECTIVES and cur.type in COLLECTIVES):
                preds.append(c)
        for p in preds:
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return seen


def handle_users(graph, variable, types: tuple[str, ...]) -> list[tf.Operation]:
    """Ops of ``types`` in ``graph`` (creation order) that take ``variable``'s handle."""
    local = tf.distribute.get_strategy().experimental_local_results(variable.value)
    handles = {id(c.handle) for c in local}
    internal = {id(i) for e, i in graph.captures if id(e) in handles}
    return [
        op
        for op in graph.get_operations()
        if op.type in types and any(id(t) in internal for t in op.inputs)
    ]


def analyse(
    graph, reducer: chronica.tf.ScheduledAllReduce, net: Net, steps: int, short: dict
) -> dict:
    """What the traced graph of ``steps`` scheduled steps allows to run concurrently."""
    ops = graph.get_operations()
    pos = {op: i for i, op in enumerate(ops)}
    colls = [op for op in ops if op.type in COLLECTIVES]
    reduces = [op for op in colls if op.type == "CollectiveReduceV2"]
    size = {op: op.inputs[0].shape.num_elements() * op.inputs[0].dtype.size for op in reduces}
    worst = 0
    for j, op in enumerate(reduces):
        anc = ancestors(op, skip_token_edges=True)
        worst = max(worst, size[op] + sum(size[k] for k in reduces[:j] if k not in anc))
    per_step = len(colls) // steps
    dense = len(reduces) // steps
    report = {
        "reduce_sizes": [op.inputs[0].shape.num_elements() for op in reduces],
        "graph_max_in_flight": worst,
        "token_serialized": all(
            reduces[j - 1] in reduces[j].control_inputs for j in range(len(reduces)) if j % dense
        ),
        "collectives_per_step": per_step,
        "markers": sum(op.type in ("PyFunc", "EagerPyFunc") for op in ops),
    }
    # The variable whose partitions are reduced first is updated without waiting for the
    # rest of the step's collectives.
    layout, order = reducer.layout, reducer.dispatch_order
    finished = {}
    for position, p in enumerate(order):
        for t, _, _ in layout.segments(p):
            finished[t] = position
    path = reducer.priority[min(finished, key=finished.get)]
    var = next(v for v in net.trainable_variables if v.path == path)
    step1 = colls[:per_step]
    end1 = pos[colls[per_step]] if steps > 1 else len(ops)
    writes = handle_users(graph, var, ("AssignAddVariableOp", "AssignSubVariableOp"))
    update = [w for w in writes if pos[w] < end1][-1]  # AdamW decays first, then updates
    report["first_updated"] = short[path]
    report["first_update_waits_for"] = sum(c in ancestors(update) for c in step1)
    if steps > 1:
        # Step 2 reads stem.kernel once step 1 wrote it, not once all of step 1 is done.
        reads = handle_users(graph, net.stem.kernel, ("ReadVariableOp",))
        read2 = next(r for r in reads if pos[r] > pos[step1[-1]])
        report["step2_stem_read_waits_for"] = sum(c in ancestors(read2) for c in step1)
    return report


def train(strategy, kind: str, mode: str, rank: int, timeline: str | None) -> dict:
    x, tok, y = data(rank)
    with strategy.scope():
        net = Net()
        net(x[:1], tok[:1])
        init = np.random.default_rng(7)
        for v in net.trainable_variables:
            v.assign(init.normal(scale=0.3, size=v.shape).astype(np.float32))
        opt = make_optimizer(kind)
        opt.build(net.trainable_variables)
    reducer = None
    if mode != "plain":
        reducer = chronica.tf.ScheduledAllReduce(timeline=timeline, **KNOBS)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def replica_step(xb: tf.Tensor, tb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            per_example = loss_fn(yb, net(xb, tb))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH * WORKERS)
        variables = net.trainable_variables
        grads = tape.gradient(loss, variables)
        if reducer is None:
            opt.apply_gradients(zip(grads, variables, strict=True))
        else:
            reducer.apply_gradients(opt, zip(grads, variables, strict=True))
        return loss

    def step(iterator) -> tf.Tensor:
        return strategy.run(replica_step, args=next(iterator))

    per_call = 2 if mode == "multi" else 1
    fn = chronica.tf.multi_step(step, per_call)
    iterator = iter(tf.data.Dataset.from_tensor_slices((x, tok, y)).batch(BATCH))
    for _ in range(STEPS // per_call):
        fn(iterator)
    report = {"params": hexes(net.trainable_variables), "slots": hexes(opt.variables)}
    if reducer is None:
        return report
    short = {
        v.path: f"{attr}.{v.name}"
        for attr in ("head", "big", "stem", "norm", "embed")
        for v in getattr(net, attr).trainable_variables
    }
    layout = reducer.layout
    report |= {
        "dispatch": reducer.last_dispatch,
        "order": reducer.dispatch_order,
        "priority": [short[p] for p in reducer.priority],
        "partitions": [
            [(short[n], a, b) for n, a, b in part] for part in reducer.partition_shapes()
        ],
        "numel": layout.numel.tolist(),
        "itemsize": layout.itemsize.tolist(),
        "part_bytes": layout.part_bytes.tolist(),
        "max_in_flight": reducer.max_in_flight_bytes,
        "credit": reducer.credit_bytes,
        "partition": reducer.partition_bytes,
        "sizes": {short[v.path]: int(np.prod(v.shape)) for v in net.trainable_variables},
    }
    if timeline is None:  # timeline markers are chained like the collectives: analyse without
        report["graph"] = analyse(
            fn.get_concrete_function(iterator).graph, reducer, net, per_call, short
        )
    reducer.close()
    return report


def auto_mode(strategy, rank: int, min_saving: float, reopen: bool, eager: bool) -> dict:
    """``mode="auto"`` SGD with momentum beside plain ``apply_gradients``, step by step."""
    x, tok, y = data(rank, AUTO_STEPS)
    nets, opts = [], []
    with strategy.scope():
        for _ in range(2):
            net = Net()
            net(x[:1], tok[:1])
            init = np.random.default_rng(7)
            for v in net.trainable_variables:
                v.assign(init.normal(scale=0.3, size=v.shape).astype(np.float32))
            opt = make_optimizer("sgd")
            opt.build(net.trainable_variables)
            nets.append(net)
            opts.append(opt)
    reducer = chronica.tf.ScheduledAllReduce(mode="auto", min_saving=min_saving, **KNOBS)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def replica_step(k: int, xb: tf.Tensor, tb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        net, opt = nets[k], opts[k]
        with tf.GradientTape() as tape:
            per_example = loss_fn(yb, net(xb, tb))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH * WORKERS)
        grads = tape.gradient(loss, net.trainable_variables)
        pairs = zip(grads, net.trainable_variables, strict=True)
        if k == 0:
            opt.apply_gradients(pairs)
        else:
            reducer.apply_gradients(opt, pairs)
        return loss

    def stepper(k: int):
        def step(iterator) -> tf.Tensor:
            return strategy.run(replica_step, args=(k, *next(iterator)))

        return step if eager else chronica.tf.multi_step(step, 1)

    plain, auto = stepper(0), stepper(1)
    its = [iter(tf.data.Dataset.from_tensor_slices((x, tok, y)).batch(BATCH)) for _ in range(2)]
    decisions, engines, decided_at = [], [], []
    for step in range(AUTO_STEPS):
        plain(its[0])
        auto(its[1])
        stats = reducer.stats()
        decisions.append(stats.decision)
        engines.append(stats.mode)
        trial = reducer.trial  # agreed by every worker: all reopen and stop at the same step
        if trial.decisions > len(decided_at):
            decided_at.append(step)
        if decided_at and step == decided_at[-1] + AFTER:
            if not reopen or trial.decisions > 1:
                break
            trial.reopen("reopened by the test")
    stats = reducer.stats()
    return {
        "exact": hexes(nets[0].trainable_variables) == hexes(nets[1].trainable_variables),
        "slots": hexes(opts[0].variables) == hexes(opts[1].variables),
        "decisions": decisions,
        "decided": reducer.trial.decisions if reducer.trial is not None else 0,
        "engines": engines,
        "mode": stats.mode,
        "verdict": stats.verdict,
        "repr": repr(reducer),
    }


def main() -> None:
    rank, ports, out, timeline = int(sys.argv[1]), sys.argv[2].split(","), *sys.argv[3:5]
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": rank},
        }
    )
    tf.config.threading.set_inter_op_parallelism_threads(2)  # two workers share small CI boxes
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    assert strategy.num_replicas_in_sync == WORKERS
    results = {}
    for kind in ("sgd", "adam", "adamw"):
        tl = timeline if kind == "adam" else None
        results[kind] = {
            "plain": train(strategy, kind, "plain", rank, None),
            "scheduled": train(strategy, kind, "scheduled", rank, tl),
        }
    results["adam"]["multi"] = train(strategy, "adam", "multi", rank, None)
    results["mode-auto"] = {
        "measured": auto_mode(strategy, rank, 0.0, False, eager=False),
        "redecided": auto_mode(strategy, rank, 0.0, True, eager=True),
        "never": auto_mode(strategy, rank, 1.0, False, eager=False),
    }
    with open(out, "w") as f:
        json.dump({"rank": rank, "results": results}, f)


if __name__ == "__main__":
    # The trial at its shortest: windows of MEASURE_STEPS measured steps, one window of the
    # survivor after the search, no extra ones where the noise cannot tell (bounds the unit
    # tests of chronica.runtime.auto cover), so that the steps below always decide. Set here,
    # not at import: a test that imports this module must not change its process.
    auto.MEASURE_STEPS = MEASURE_STEPS
    auto.MIN_WINDOWS_KEPT = auto.MAX_WINDOWS_KEPT = 1
    main()
