"""Device meshes and logical-axis sharding.

The mesh has five axes, (data, fsdp, expert, context, tensor); the config gives their sizes (-1 = the
rest of the devices; an axis the sizes leave out is 1). Parameters and activations carry logical axis
names; the config's rules map them onto mesh axes, so data parallel, FSDP, expert parallel, context
parallel (the activations' sequence dimension, 'length', split over 'context') and tensor parallel
are config changes.
The batch is split over data, fsdp and expert: devices along the expert axis hold different tokens
for the dense layers and different experts for the mixture-of-experts layers.
"""

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lm.errors import UserError

MESH_AXES = ("data", "fsdp", "expert", "context", "tensor")
BATCH_MESH_AXES = ("data", "fsdp", "expert")  # the mesh axes the batch dimension is split over

Rules = Sequence[tuple[str, str | tuple[str, ...] | None]]

# Logical axis -> mesh axes, in priority order (a mesh axis is used once per array; a later rule for
# the same name is the fallback when an earlier one's mesh axes are taken).
DEFAULT_RULES = (
    ("expert", "expert"),
    ("batch", ("data", "fsdp", "expert")),
    ("batch", ("data", "fsdp")),  # arrays whose expert axis already takes the 'expert' mesh axis
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("embed", "fsdp"),
    ("length", "context"),
)


def fake_devices(needed: int, num_devices: int, on_cpu: bool) -> str:
    """How to fake the CPU devices a mesh lacks, as the end of its error message ('' if none lack)."""
    if not on_cpu or needed <= num_devices:
        return ""
    return (f"; on a CPU, fake {needed} devices: XLA_FLAGS=--xla_force_host_platform_device_count={needed} "
            "before the command (docs/launching.md)")


def mesh_shape(sizes: dict[str, int], num_devices: int, on_cpu: bool = False) -> tuple[int, ...]:
    """Resolves -1 (at most one) so the product of the axis sizes is num_devices; on_cpu: a mesh that
    needs more devices says how to fake them. An axis that sizes lacks is 1."""
    shape = [int(sizes.get(axis, 1)) for axis in MESH_AXES]
    described = ", ".join(f"{a}={s}" for a, s in zip(MESH_AXES, shape, strict=True))
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        raise UserError(f"mesh {described}: give positive sizes, with at most one -1")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if num_devices % known:
            raise UserError(f"mesh {described} does not divide the {num_devices} devices"
                            + fake_devices(known, num_devices, on_cpu))
        shape[shape.index(-1)] = num_devices // known
    if math.prod(shape) != num_devices:
        raise UserError(
            f"mesh {described} needs {math.prod(shape)} devices but {num_devices} are available; "
            "set one axis to -1 to use all of them" + fake_devices(math.prod(shape), num_devices, on_cpu)
        )
    return tuple(shape)


def make_mesh(sizes: dict[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The mesh of axis sizes (mesh_shape) over devices (default: all); on CPUs, a mesh larger than the
    devices says how to fake more of them."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(sizes, len(devices), on_cpu=devices[0].platform == "cpu")
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def batch_shards(mesh: Mesh) -> int:
    return math.prod(mesh.shape[a] for a in BATCH_MESH_AXES)


def check_batch(batch_size: int, grad_accum_steps: int, mesh: Mesh) -> None:
    shards = batch_shards(mesh)
    if grad_accum_steps < 1 or batch_size % grad_accum_steps:
        raise UserError(
            f"train.batch_size={batch_size} is not divisible by "
            f"train.grad_accum_steps={grad_accum_steps}"
        )
    micro = batch_size // grad_accum_steps
    if micro % shards:
        raise UserError(
            f"micro-batch {micro} (train.batch_size / train.grad_accum_steps) is not divisible by "
            f"the {shards} batch shards of mesh data x fsdp x expert; change the batch size or the mesh"
        )
    if batch_size % jax.process_count():
        raise UserError(f"train.batch_size={batch_size} is not divisible by {jax.process_count()} hosts")


def check_context(length: int | None, mesh: Mesh, per_device: int = 1) -> None:
    """Raises UserError where the sequence length (None: a model whose length its attention checks when traced)
    does not split over the mesh's context axis into per_device chunks on each device (2: the zig-zag layout of
    model.context_parallel=ring_zigzag)."""
    shards = mesh.shape["context"]
    pieces = shards * per_device if shards > 1 else 1
    if length is not None and length % pieces:
        chunks = f" as {per_device} chunks each" if per_device > 1 else ""
        raise UserError(f"data.context_length={length} cannot be split over the {shards} devices of mesh.context"
                        f"{chunks}; make it a multiple of {pieces} or change mesh.context")


def logical_rules(config_rules) -> list[tuple]:
    """The config's rules (tuples, or lists after a JSON round trip) as Flax wants them."""
    return [(name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in config_rules]


def logical_shardings(abstract_tree, mesh: Mesh, rules: Rules):
    """NamedShardings for a tree of (possibly logically partitioned) abstract values."""
    specs = nn.get_partition_spec(abstract_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


def spec_axes(entry: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """One PartitionSpec entry (None, a mesh axis, or a tuple of them) as a tuple of mesh axes."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def check_divisible(shapes, shardings) -> None:
    """Raises UserError for the first array whose dimension its mesh axes do not divide evenly."""
    flat_shardings = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    for (path, shape), named in zip(jax.tree_util.tree_flatten_with_path(shapes)[0], flat_shardings, strict=True):
        for size, axes in zip(shape.shape, named.spec, strict=False):
            axes = spec_axes(axes)
            parts = math.prod(named.mesh.shape[a] for a in axes)
            if size % parts:
                raise UserError(
                    f"{jax.tree_util.keystr(path)} {tuple(shape.shape)}: a dimension of {size} cannot be split over "
                    f"mesh axes {'x'.join(axes)} ({parts} devices); change config.mesh or the model's sizes"
                )


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(BATCH_MESH_AXES))


def process_batch_shard(mesh: Mesh) -> tuple[int, int]:
    """(index, count): this process's devices hold rows [index * G / count, (index + 1) * G / count)
    of every global batch of G rows, so that is all it loads. (0, 1) on one process; (i, n) for n
    processes each holding their own rows; processes that share rows (a 'tensor' axis across hosts)
    share an index."""
    shards = batch_shards(mesh)
    rows = batch_sharding(mesh).addressable_devices_indices_map((shards,)).values()  # one per device
    held = sorted({index[0].start or 0 for index in rows})
    first, width = held[0], len(held)
    if held != list(range(first, first + width)) or first % width:
        raise UserError(
            f"this process's devices hold batch shards {held} of {shards}, not one aligned block: order "
            "the mesh axes so each host's devices are neighbours along data x fsdp x expert"
        )
    return first // width, shards // width


def assemble_batch(local_batch: dict[str, np.ndarray], mesh: Mesh, batch_size: int) -> dict[str, jax.Array]:
    """Global arrays of batch_size rows, split over data x fsdp x expert, from each process's rows
    (its process_batch_shard)."""
    sharding = batch_sharding(mesh)
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(sharding, x, (batch_size, *x.shape[1:])), local_batch
    )


def place_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Global arrays split over data x fsdp x expert from a whole batch that every process holds
    (eval batches): each process puts its devices' rows."""
    sharding = batch_sharding(mesh)
    return jax.tree.map(lambda x: jax.make_array_from_callback(x.shape, sharding, lambda index: x[index]), batch)
