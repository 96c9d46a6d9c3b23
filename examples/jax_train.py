"""Train a tiny sequence classifier with ``chronica.jax.iterator`` on variable-length data.

Embedding + masked mean-pool + linear, plain ``jax.numpy`` and ``jax.grad`` (no optax).
The iterator pads each local batch to a bucket boundary, so the jitted step compiles at
most ``iterator.num_shapes`` programs however many lengths the data has. Prints the loss
per epoch, then ``compiled shapes: K (bound: num_shapes=N)``. Runs in seconds on a CPU.

    PYTHONPATH=. python examples/jax_train.py
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

import chronica.jax as cj

VOCAB, CLASSES, DIM = 64, 4, 32


def make_data(n: int, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """Sequences of lognormal length; the label is which quarter of the vocabulary is
    most frequent in the sequence (learnable from a bag of tokens)."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(3.5, 0.8, n).astype(int), 1, 400)
    labels = rng.integers(0, CLASSES, n)
    width = VOCAB // CLASSES
    sequences = []
    for k, y in zip(lengths, labels, strict=True):
        mixed = rng.integers(1, VOCAB, k)
        favoured = rng.integers(y * width, (y + 1) * width, k)
        sequences.append(np.where(rng.random(k) < 0.5, favoured, mixed).astype(np.int32))
    return sequences, labels.astype(np.int32)


def init(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {
        "embed": jax.random.normal(k1, (VOCAB, DIM)) * 0.1,
        "w": jax.random.normal(k2, (DIM, CLASSES)) * 0.1,
        "b": jnp.zeros(CLASSES),
    }


def loss_fn(params: dict[str, jax.Array], batch: dict[str, jax.Array]) -> jax.Array:
    mask = batch["mask"].astype(jnp.float32)
    emb = params["embed"][batch["tokens"]] * mask[..., None]
    pooled = emb.sum(1) / jnp.maximum(mask.sum(1, keepdims=True), 1.0)
    logits = pooled @ params["w"] + params["b"]
    nll = -jax.nn.log_softmax(logits)[jnp.arange(logits.shape[0]), batch["label"]]
    valid = batch["valid"].astype(jnp.float32)  # padded rows of a partial step count 0
    return (nll * valid).sum() / jnp.maximum(valid.sum(), 1.0)


compiled_shapes: set[tuple[int, ...]] = set()


@jax.jit
def train_step(params: dict[str, jax.Array], batch: dict[str, jax.Array], lr: float):
    compiled_shapes.add(batch["tokens"].shape)  # runs once per compiled program
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), loss


def main() -> None:
    start = time.perf_counter()
    sequences, labels = make_data(1024)
    epochs = 4
    it = cj.iterator(
        {"tokens": sequences, "label": labels},
        global_batch_size=32,
        epochs=epochs,
        cost="quadratic",
        seed=0,
        as_jax=True,
    )
    print(
        f"rank {it.rank}/{it.num_replicas}: {it.steps_per_epoch} steps/epoch, "
        f"buckets {it.bucket_boundaries}"
    )
    params = init(jax.random.key(0))
    losses: list[float] = []
    epoch = it.epoch
    for batch in it:
        step_batch = {k: batch[k] for k in ("tokens", "label", "mask", "valid")}
        params, loss = train_step(params, step_batch, 0.5)
        losses.append(float(loss))
        if it.epoch != epoch:  # that was the epoch's last step
            print(f"epoch {epoch}: mean loss {np.mean(losses):.4f}")
            losses, epoch = [], it.epoch
    print(f"compiled shapes: {len(compiled_shapes)} (bound: num_shapes={it.num_shapes})")
    print(f"distinct sequence lengths in the data: {len(set(map(len, sequences)))}")
    print(f"done in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
