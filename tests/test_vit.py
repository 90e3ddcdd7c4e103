"""ViT on CIFAR-10: patch embedding, permutation (in)variance, overfitting, augmentation, the split,
missing data and the trainer end to end."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lm.cli.resolve import build_experiment
from lm.data import images as cifar
from lm.errors import UserError
from lm.layers.transformer import MoeConfig, TransformerConfig
from lm.models.vit import PatchEmbedding, ViT, ViTConfig, patchify, stack_position, unpatchify


def tiny_vit(pool="gap", position="none", patch_size=4, embed_dim=32, num_layers=2, **blocks) -> ViT:
    transformer = TransformerConfig(num_layers=num_layers, embed_dim=embed_dim, num_heads=4, num_kv_heads=4,
                                    position=stack_position(position), **blocks)
    return ViT(ViTConfig(transformer=transformer, patch_size=patch_size, pool=pool, position=position))


@pytest.fixture(scope="module")
def cifar_train(data_dir):
    """The real training images and labels (50k, read once)."""
    return cifar.load_cifar10("train")


def test_patch_embedding_shapes():
    images = jax.random.normal(jax.random.key(0), (2, 32, 32, 3))
    patches = patchify(images, 4)
    assert patches.shape == (2, 64, 48)
    # Patch 1 is the second 4 x 4 block of the first patch row, flattened (row, column, channel).
    np.testing.assert_array_equal(patches[:, 1], images[:, 0:4, 4:8].reshape(2, 48))
    np.testing.assert_array_equal(unpatchify(patches, 4, 32), images)
    module = PatchEmbedding(patch_size=4, embed_dim=24)
    variables = module.init(jax.random.key(1), images)
    assert module.apply(variables, images).shape == (2, 64, 24)
    assert patchify(images, 8).shape == (2, 16, 192)


@pytest.mark.parametrize("position, invariant", [("none", True), ("learned", False), ("sincos2d", False)])
def test_patch_permutation(position, invariant):
    """Mean pooling without positions sees a set of patches: permuting them leaves the logits as they
    are; with position embeddings they change."""
    model = tiny_vit(pool="gap", position=position)
    images = jax.random.normal(jax.random.key(0), (2, 32, 32, 3))
    params = nn.unbox(model.init(jax.random.key(1), images))["params"]
    params["head"]["kernel"] = jax.random.normal(jax.random.key(2), params["head"]["kernel"].shape)  # not zero
    order = np.random.default_rng(0).permutation(64)
    permuted = unpatchify(patchify(images, 4)[:, order], 4, 32)
    logits = model.apply({"params": params}, images)
    permuted_logits = model.apply({"params": params}, permuted)
    assert logits.shape == (2, 10)
    assert float(jnp.abs(logits).max()) > 1e-3
    if invariant:
        np.testing.assert_allclose(permuted_logits, logits, atol=1e-5)
    else:
        assert float(jnp.abs(permuted_logits - logits).max()) > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("switches", [
    dict(pool="cls", position="learned"),
    dict(position="rope", norm="rms", norm_position="post", mlp="swiglu"),
    dict(position="alibi", moe=MoeConfig(num_experts=4)),
    dict(position="sinusoidal", pool="cls", mlp="relu"),
])
def test_block_switches(switches):
    model = tiny_vit(**switches)
    images = jnp.ones((2, 32, 32, 3))
    variables = model.init(jax.random.key(0), images)
    logits, _ = model.apply(variables, images, mutable=["moe"])
    assert logits.shape == (2, 10) and bool(jnp.isfinite(logits).all())


def test_bad_model_options():
    with pytest.raises(UserError, match="model.pool"):
        tiny_vit(pool="max")
    with pytest.raises(UserError, match="model.position"):
        tiny_vit(position="sincos3d")
    with pytest.raises(UserError, match="patch_size"):
        tiny_vit(patch_size=5)


@pytest.mark.slow
def test_overfits_128_images(cifar_train):
    """A tiny ViT reaches 100% training accuracy on 128 real CIFAR-10 images."""
    train_images, train_labels = cifar_train
    rows = np.random.default_rng(0).choice(len(train_labels), 128, replace=False)
    x, y = jnp.asarray(cifar.normalize(train_images[rows])), jnp.asarray(train_labels[rows])
    model = tiny_vit(pool="gap", position="sincos2d", patch_size=8, embed_dim=64)
    params = nn.unbox(model.init(jax.random.key(0), x[:1]))["params"]
    optimizer = optax.adam(3e-3)

    @jax.jit
    def step(params, opt_state):
        def loss_fn(p):
            logits = model.apply({"params": p}, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), logits

        (_, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, jnp.mean(jnp.argmax(logits, -1) == y)

    opt_state = optimizer.init(params)
    accuracy = 0.0
    for _ in range(300):
        params, opt_state, accuracy = step(params, opt_state)
        if accuracy == 1.0:
            break
    final = jax.jit(lambda p: jnp.mean(jnp.argmax(model.apply({"params": p}, x), -1) == y))(params)
    assert float(final) == 1.0, f"training accuracy {float(final):.3f} (last step {float(accuracy):.3f})"


def test_train_val_split(cifar_train):
    _, labels = cifar_train
    train_rows, val_rows = cifar.train_val_split(len(labels), 5000, seed=0)
    assert len(train_rows) == 45000 and len(val_rows) == 5000
    assert not np.intersect1d(train_rows, val_rows).size
    np.testing.assert_array_equal(np.union1d(train_rows, val_rows), np.arange(50000))
    assert np.bincount(labels[val_rows], minlength=10).min() > 400  # shuffled: every class, not a sorted cut
    np.testing.assert_array_equal(cifar.train_val_split(50000, 5000, seed=0)[1], val_rows)
    assert not np.array_equal(cifar.train_val_split(50000, 5000, seed=1)[1], val_rows)


def denormalize(x: np.ndarray) -> np.ndarray:
    return np.rint((x * cifar.STD + cifar.MEAN) * 255).astype(np.int64)


def test_crop_and_flip_keep_labels_aligned(cifar_train):
    """Every augmented row is its own (index) image, shifted by at most 4 pixels and maybe mirrored,
    and carries that image's label."""
    train_images, train_labels = cifar_train
    batches = cifar.TrainBatches(train_images, train_labels, batch_size=8, seed=3,
                                 augmentation=cifar.Augmentation(crop_padding=4, flip=True))
    batch = batches[5]
    np.testing.assert_array_equal(batch["label"], train_labels[batch["index"]])
    np.testing.assert_array_equal(batch["targets"].argmax(1), batch["label"])
    for image, index in zip(denormalize(batch["image"]), batch["index"], strict=True):
        padded = np.pad(train_images[index].astype(np.int64), ((4, 4), (4, 4), (0, 0)))
        candidates = [padded[dy : dy + 32, dx : dx + 32] for dy in range(9) for dx in range(9)]
        assert any(np.array_equal(image, c) or np.array_equal(image, c[:, ::-1]) for c in candidates)


def test_mixup_and_cutmix_mix_the_right_labels():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 32, 32, 3)).astype(np.float32)
    labels = rng.integers(0, 10, 16)
    targets = cifar.one_hot(labels)
    mixed, soft, partner, lam = cifar.mix_batch(x, targets, np.random.default_rng(1), mixup_alpha=0.4, cutmix_alpha=0)
    assert 0 < lam < 1
    np.testing.assert_allclose(soft.sum(1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(soft, lam * targets + (1 - lam) * targets[partner], atol=1e-6)
    np.testing.assert_allclose(mixed, lam * x + (1 - lam) * x[partner], atol=1e-5)
    differ = labels != labels[partner]
    assert differ.any()
    np.testing.assert_allclose(soft[differ, labels[differ]], lam, atol=1e-6)  # own label keeps weight lam

    mixed, soft, partner, lam = cifar.mix_batch(x, targets, np.random.default_rng(2), mixup_alpha=0, cutmix_alpha=1.0)
    np.testing.assert_allclose(soft.sum(1), 1.0, rtol=1e-6)
    own = np.mean(mixed == x, axis=(1, 2, 3))  # the fraction of pixels outside the pasted box
    moved = partner != np.arange(16)
    np.testing.assert_allclose(own[moved], lam, atol=1e-6)
    np.testing.assert_allclose(soft, lam * targets + (1 - lam) * targets[partner], atol=1e-6)


def test_randaugment_ops_keep_shape_and_dtype():
    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    changed = 0
    for name, op in cifar.RANDAUGMENT_OPS.items():
        for v in (-0.9, 0.9):
            out = op(image, v)
            assert out.shape == image.shape and out.dtype == np.uint8, name
            changed += not np.array_equal(out, image)
    assert changed >= 2 * (len(cifar.RANDAUGMENT_OPS) - 1) - 2  # all but identity (posterize may keep a few)


def test_pipeline_deterministic_resumable_and_seeded():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (100, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 100).astype(np.int32)
    aug = cifar.Augmentation(randaugment_ops=2, randaugment_magnitude=9, mixup_alpha=0.2, cutmix_alpha=1.0)

    def first(seed, n, start_step=0):
        it = iter(cifar.train_batches(images, labels, 16, seed, augmentation=aug, start_step=start_step))
        return [next(it) for _ in range(n)]

    batches = first(0, 8)  # 6 steps per epoch: crosses into epoch 2
    again = first(0, 8)
    other = first(1, 8)
    for a, b in zip(batches, again, strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(batches[0]["image"], other[0]["image"])
    resumed = first(0, 3, start_step=5)
    for a, b in zip(batches[5:], resumed, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])
    epoch_1 = np.concatenate([b["index"] for b in batches[:6]])
    assert len(set(epoch_1.tolist())) == 96  # 100 // 16 batches, no example twice in an epoch


def test_eval_batches_pad_the_last_batch():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (10, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(10, dtype=np.int32) % 10
    batches = cifar.eval_batches(images, labels, batch_size=4)
    assert len(batches) == 3
    np.testing.assert_array_equal(batches[-1]["valid"], [1, 1, 0, 0])
    np.testing.assert_array_equal(batches[-1]["index"], [8, 9, -1, -1])
    np.testing.assert_array_equal(np.concatenate([b["label"][b["valid"] == 1] for b in batches]), labels)
    assert batches[-1]["targets"][2:].sum() == 0 and batches[-1]["image"][2:].sum() == 0


def test_missing_data_names_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("LM_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
    monkeypatch.setattr("lm.data.files.CACHE_DIR", tmp_path / "cache")
    cifar.load_cifar10.cache_clear()
    try:
        with pytest.raises(UserError, match="LM_DATA_DIR") as error:
            cifar.load_cifar10("test")
        assert str(tmp_path / "cifar10" / "test.npz") in str(error.value)
        assert str(tmp_path / "cifar10" / "cifar-10-python.tar.gz") in str(error.value)  # nor the archive
    finally:
        cifar.load_cifar10.cache_clear()


def write_canonical_archive(path, rng) -> dict[str, np.ndarray]:
    """A small cifar-10-python.tar.gz in the canonical layout (3 images per batch); returns its rows."""
    import io
    import pickle
    import tarfile

    rows = {}
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as archive:
        for split, names in cifar.ARCHIVE_BATCHES.items():
            rows[split] = rng.integers(0, 256, (3 * len(names), 3072), dtype=np.uint8)
            for i, name in enumerate(names):
                batch = {b"data": rows[split][3 * i: 3 * i + 3], b"labels": [i, (i + 1) % 10, 9]}
                data = pickle.dumps(batch)
                info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return rows


def test_the_canonical_archive_is_read_when_there_is_no_npz(tmp_path, monkeypatch):
    """Pixel (y, x) of channel c is byte c * 1024 + y * 32 + x of the row; the 5 train batches in order."""
    rows = write_canonical_archive(tmp_path / "cifar10" / "cifar-10-python.tar.gz", np.random.default_rng(0))
    monkeypatch.setenv("LM_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
    cifar.load_cifar10.cache_clear()
    try:
        images, labels = cifar.load_cifar10("train")
    finally:
        cifar.load_cifar10.cache_clear()
    assert images.shape == (15, 32, 32, 3) and images.dtype == np.uint8
    expected = np.array([[[[row[c * 1024 + y * 32 + x] for c in range(3)] for x in range(32)] for y in range(32)]
                         for row in rows["train"]])
    np.testing.assert_array_equal(images, expected)
    np.testing.assert_array_equal(labels, [0, 1, 9, 1, 2, 9, 2, 3, 9, 3, 4, 9, 4, 5, 9])
    test_images, test_labels = cifar.read_cifar10_archive(tmp_path / "cifar10" / "cifar-10-python.tar.gz", "test")
    assert test_images.shape == (3, 32, 32, 3) and list(test_labels) == [0, 1, 9]


def test_downloads_are_checked_against_their_md5(tmp_path, monkeypatch):
    """find_file's download path (a file:// URL here: tests never touch the network)."""
    from lm.data import files

    source = tmp_path / "source.bin"
    source.write_bytes(b"pixels")
    monkeypatch.delenv("LM_OFFLINE")
    monkeypatch.setenv("LM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(files, "CACHE_DIR", tmp_path / "cache")
    with pytest.raises(UserError, match="md5 is not 0123"):
        files.find_file("d/a.bin", source.as_uri(), md5="0123")
    assert not list((tmp_path / "cache").rglob("*.bin*"))  # nothing half-checked is kept
    import hashlib

    path = files.find_file("d/a.bin", source.as_uri(), md5=hashlib.md5(b"pixels").hexdigest())
    assert path == tmp_path / "cache" / "d" / "a.bin" and path.read_bytes() == b"pixels"


@pytest.mark.slow
def test_trainer_end_to_end(tmp_path, data_dir):
    from configs.vit_cifar10 import get_config
    from lm.train.loop import train

    summary = train(get_config("test"), str(tmp_path), build_experiment, devices=jax.devices()[:1])
    results = json.loads((tmp_path / "results.json").read_text())
    assert 0.0 <= results["test_accuracy"] <= 1.0
    assert results["test_accuracy"] > 0.12  # above chance after 10 steps
    per_class = [results[f"test_accuracy_{name}"] for name in cifar.CLASS_NAMES]
    np.testing.assert_allclose(np.mean(per_class), results["test_accuracy"], atol=1e-6)  # 1000 per class
    assert (tmp_path / "confusion_matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "attention_rollout.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "eval_accuracy" in summary
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any("images_per_second" in r for r in records)


def test_attention_rollout_against_the_formula():
    """R = A'_2 A'_1 with A' = (A + I) / 2, per image; rows stay distributions."""
    from experiments.image_classification import attention_rollout

    rng = np.random.default_rng(0)
    layers = [rng.dirichlet(np.ones(5), size=(3, 5)) for _ in range(2)]  # (B, T, T), rows sum to 1
    rollout = attention_rollout(layers)
    for b in range(3):
        first, second = ((a[b] + np.eye(5)) / 2 for a in layers)
        np.testing.assert_allclose(rollout[b], second @ first)
    np.testing.assert_allclose(rollout.sum(-1), 1.0)
    identity = np.broadcast_to(np.eye(4), (2, 4, 4))
    np.testing.assert_allclose(attention_rollout([identity]), identity)


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["gap", "cls"])
def test_patch_attention_is_a_distribution_over_the_patches(pool, tmp_path):
    """With average pooling the rollout to the patches sums to 1; with [CLS] to 1 less what [CLS] keeps."""
    from configs.vit_cifar10 import get_config
    from experiments.image_classification import ImageClassification
    from lm.plots import save_image_attention

    config = get_config("test")
    config.model.pool = pool
    experiment = ImageClassification(config)
    params = experiment.init(jax.random.key(0))["params"]
    params = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.key(1), x.shape), params)  # not uniform
    pixels = np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    maps = experiment.patch_attention(params, pixels)
    assert maps.shape == (3, 4, 4) and (maps >= 0).all()  # patch 8: a 4 x 4 grid
    if pool == "gap":
        np.testing.assert_allclose(maps.sum((1, 2)), 1.0, rtol=1e-6)
    else:
        assert ((maps.sum((1, 2)) > 0.05) & (maps.sum((1, 2)) < 1.0)).all()
    assert not np.allclose(maps[0], maps[0].mean())  # the weights differ across patches
    size = save_image_attention(tmp_path / "a.png", pixels, maps, ["a", "b", "c"])
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and size[0] > size[1]
