"""Layer profiles of well-known models for ``chronica simulate gradients``.

Sizes are the models' real parameter tensors (fp32 gradients: 4 bytes per parameter, as DDP
all-reduces an fp32 model's gradients under mixed precision). Compute times are *derived*,
not measured: each layer's forward FLOPs (2 per multiply-add of its matrix products, the
attention's two ``seq × seq`` products included, element-wise work ignored) divided by a
stated device throughput, backward twice the forward, and the optimizer's update of a layer
memory-bound: Adam reads parameter, gradient and two moments and writes three of them back,
7 fp32 accesses per parameter at ``memory_bandwidth``. Defaults: 100 TFLOP/s sustained and
2 TB/s, a current data-centre GPU at roughly a third of its dense bf16 peak.

- ``vgg16``: 13 convolutions and 3 fully connected layers, 224×224 images (138 M
  parameters; the first fully connected layer alone holds 74% of them);
- ``bert-base`` / ``bert-large``: embeddings, 12 / 24 encoder blocks (each: Q/K/V with the
  attention products, output projection, two feed-forward layers), pooler and masked-LM head
  (its decoder tied to the word embeddings), sequences of 128 tokens;
- ``gpt2`` / ``gpt2-medium``: token and position embeddings, 12 / 24 blocks (fused QKV with
  the attention products, projection, two MLP layers), the LM head tied to the token
  embedding, sequences of 1024 tokens.

A tied embedding is used first in the forward pass but its gradient is final only at the
end of the backward pass, the largest tensor arriving last: that is the real models' shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from chronica.core.checks import check_int, check_number
from chronica.sim.gradients import Layer

__all__ = ["PROFILES", "DeviceModel", "profile_layers"]

BYTES = 4  # fp32 gradients


@dataclass(frozen=True)
class DeviceModel:
    """How FLOPs and parameters become seconds: ``flops`` sustained per second, and
    ``memory_bandwidth`` bytes per second for the optimizer's update."""

    flops: float = 100e12
    memory_bandwidth: float = 2e12

    def __post_init__(self) -> None:
        for name in ("flops", "memory_bandwidth"):
            if check_number(name, getattr(self, name), 0.0) <= 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be > 0")

    def layer(self, name: str, params: tuple[int, ...], forward_flops: float) -> Layer:
        """A ``Layer`` of parameter tensors ``params`` (element counts) and forward FLOPs."""
        forward = forward_flops / self.flops
        update = 7 * BYTES * sum(params) / self.memory_bandwidth
        return Layer(name, tuple(BYTES * p for p in params), forward, 2 * forward, update)


def _vgg16(device: DeviceModel, batch: int, seq: int) -> list[Layer]:
    del seq  # images: 224x224
    layers = []
    side, cin, n = 224, 3, 0
    for cout in (64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0):
        if cout == 0:  # 2x2 max pooling
            side //= 2
            continue
        flops = 2 * 9 * cin * cout * side * side * batch
        layers.append(device.layer(f"conv{n}", (9 * cin * cout, cout), flops))
        cin, n = cout, n + 1
    for i, (fin, fout) in enumerate(((512 * 7 * 7, 4096), (4096, 4096), (4096, 1000))):
        layers.append(device.layer(f"fc{i}", (fin * fout, fout), 2 * fin * fout * batch))
    return layers


def _block(
    device: DeviceModel, prefix: str, d: int, tokens: int, seq: int, gpt: bool
) -> list[Layer]:
    """One transformer block: attention (QKV and the two seq × seq products), output
    projection, two feed-forward layers. GPT-2 (``gpt``) fuses Q, K and V and puts its two
    layer norms before attention and MLP; BERT has three Q/K/V tensors and its layer norms
    after the attention output and after the second feed-forward layer."""
    qkv = (2 * d, 3 * d * d, 3 * d) if gpt else (d * d, d, d * d, d, d * d, d)
    attention = 2 * 3 * d * d * tokens + 2 * 2 * seq * d * tokens
    fc2 = (4 * d * d, d) if gpt else (4 * d * d, d, 2 * d)
    return [
        device.layer(f"{prefix}.attn", qkv, attention),
        device.layer(f"{prefix}.proj", (d * d, d, 2 * d), 2 * d * d * tokens),
        device.layer(f"{prefix}.fc1", (4 * d * d, 4 * d), 2 * 4 * d * d * tokens),
        device.layer(f"{prefix}.fc2", fc2, 2 * 4 * d * d * tokens),
    ]


def _bert(d: int, blocks: int) -> Callable[[DeviceModel, int, int], list[Layer]]:
    vocab = 30522

    def build(device: DeviceModel, batch: int, seq: int) -> list[Layer]:
        tokens = batch * seq
        # word, position and token-type embeddings and their layer norm (a lookup: no FLOPs)
        layers = [device.layer("embeddings", (vocab * d, 512 * d, 2 * d, 2 * d), 0.0)]
        for b in range(blocks):
            layers += _block(device, f"block{b}", d, tokens, seq, gpt=False)
        layers.append(device.layer("pooler", (d * d, d), 2 * d * d * batch))
        # masked-LM head: transform, layer norm, decoder (weight tied to the word
        # embeddings, so only its bias is a tensor of its own)
        head = 2 * d * d * tokens + 2 * d * vocab * tokens
        layers.append(device.layer("mlm_head", (d * d, d, 2 * d, vocab), head))
        return layers

    return build


def _gpt2(d: int, blocks: int) -> Callable[[DeviceModel, int, int], list[Layer]]:
    vocab = 50257

    def build(device: DeviceModel, batch: int, seq: int) -> list[Layer]:
        tokens = batch * seq
        layers = [device.layer("wte+wpe", (vocab * d, 1024 * d), 0.0)]
        for b in range(blocks):
            layers += _block(device, f"block{b}", d, tokens, seq, gpt=True)
        # final layer norm, then the LM head tied to wte (no tensor of its own)
        layers.append(device.layer("ln_f+lm_head", (2 * d,), 2 * d * vocab * tokens))
        return layers

    return build


# name -> (builder, default per-rank batch, default sequence length, description)
PROFILES: dict[str, tuple[Callable[[DeviceModel, int, int], list[Layer]], int, int, str]] = {
    "vgg16": (_vgg16, 32, 0, "VGG-16, 224x224 images"),
    "bert-base": (_bert(768, 12), 32, 128, "BERT-base, 128 tokens"),
    "bert-large": (_bert(1024, 24), 32, 128, "BERT-large, 128 tokens"),
    "gpt2": (_gpt2(768, 12), 8, 1024, "GPT-2 small, 1024 tokens"),
    "gpt2-medium": (_gpt2(1024, 24), 8, 1024, "GPT-2 medium, 1024 tokens"),
}


def profile_layers(
    name: str,
    device: DeviceModel | None = None,
    batch: int | None = None,
    seq: int | None = None,
) -> list[Layer]:
    """The layers of profile ``name`` (one of ``PROFILES``) for a per-rank ``batch`` of
    sequences of ``seq`` tokens (defaults: the profile's) on ``device``."""
    if name not in PROFILES:
        raise ValueError(f"--profile {name!r} must be one of {sorted(PROFILES)}")
    build, default_batch, default_seq, _ = PROFILES[name]
    batch = default_batch if batch is None else check_int("--batch", batch, 1)
    seq = default_seq if seq is None or not default_seq else check_int("--seq-len", seq, 1)
    return build(device or DeviceModel(), batch, seq)
