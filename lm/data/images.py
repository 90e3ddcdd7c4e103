"""Labelled images: CIFAR-10, or any prepared TFDS image dataset (data.source=tfds:NAME[/CONFIG][:SPLIT]);
the seeded train/val split, augmentation (numpy) and Grain pipelines of batches.

A split is held whole in memory as images (N, H, W, 3) uint8 and labels (N,) int32 in [0, K). A batch
(B rows) is a dict of numpy arrays:
    image    (B, H, W, 3) float32  per-channel normalised: (x / 255 - MEAN) / STD (CIFAR-10's statistics,
                               for every dataset)
    label    (B,)     int32    the hard label of the row's own image (0 for a dummy row)
    targets  (B, K)   float32  soft labels: one-hot, or mixed by mixup/cutmix (rows sum to 1);
                               all zero for a dummy row. Label smoothing is the loss's business.
    index    (B,)     int32    the example's position in its split's arrays; -1 for a dummy row
    valid    (B,)     int32    1 for a real example, 0 for a dummy row (only the last eval batch has any)
Training batches come from an endless seeded sequence: epoch e is a permutation of the training
examples (rng seeded by (seed, e)) cut into N // G global batches of G = B * count rows (the last
N mod G examples of each epoch's permutation sit that epoch out); process `index` takes rows
[index * B, (index + 1) * B) of each. Batch `step` is augmented with an rng seeded by
(seed, step, index), so the stream depends only on the seed, never on timing or worker count.
"""

import dataclasses
import functools
import os
import pickle
import tarfile
import zipfile
from typing import Any

import grain
import numpy as np

from lm.data import sources
from lm.data.files import find_file
from lm.errors import UserError

CIFAR10_DIR = "cifar10"  # $LM_DATA_DIR/cifar10/{train,test}.npz: x (N, 32, 32, 3) uint8, y (N,) int32
# The canonical archive (lossless pixels), downloaded into the cache when nothing else is there.
CIFAR10_ARCHIVE = "cifar10/cifar-10-python.tar.gz"
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
ARCHIVE_BATCHES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
SPLITS = ("train", "test")
IMAGE_SHAPE = (32, 32, 3)  # (H, W, C) of a CIFAR-10 image
CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
NUM_CLASSES = len(CLASS_NAMES)
MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32)  # the usual CIFAR-10 channel statistics
STD = np.array([0.2470, 0.2435, 0.2616], np.float32)
Batch = dict[str, np.ndarray]

# ---------------------------------------------------------------------------------------------
# Loading and splitting
# ---------------------------------------------------------------------------------------------


def _tfds_arrays(split: str) -> tuple[np.ndarray, np.ndarray] | str:
    """CIFAR-10 from a prepared TFDS copy (tfds.data_source, no download), or why there is none."""
    try:
        import tensorflow_datasets as tfds

        source = tfds.data_source("cifar10", split=split, download=False)
        records = [source[i] for i in range(len(source))]
    except Exception as e:  # not installed, not prepared, or broken: all mean "no TFDS copy"
        data_dir = os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets")
        return f"no prepared TFDS cifar10 in {data_dir} ({e.__class__.__name__})"
    images = np.stack([r["image"] for r in records]).astype(np.uint8)
    labels = np.array([r["label"] for r in records], np.int32)
    return images, labels


def read_cifar10_archive(path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 32, 32, 3) uint8, labels (N,) int32) from the canonical cifar-10-python.tar.gz:
    pickled batches whose b'data' rows are 3072 bytes, the red, green and blue 32 x 32 planes in turn."""
    with tarfile.open(path) as archive:
        batches = [pickle.load(archive.extractfile(f"cifar-10-batches-py/{name}"), encoding="bytes")
                   for name in ARCHIVE_BATCHES[split]]
    rows = np.concatenate([np.asarray(b[b"data"], np.uint8) for b in batches])  # (N, 3072)
    images = rows.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # (N, 32, 32, 3)
    labels = np.concatenate([np.asarray(b[b"labels"], np.int32) for b in batches])
    return np.ascontiguousarray(images), labels


@functools.lru_cache(maxsize=len(SPLITS))
def load_cifar10(split: str) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 32, 32, 3) uint8, labels (N,) int32) of the train (50k) or test (10k) split, read-only.

    From $LM_DATA_DIR/cifar10/<split>.npz (decoded from JPEG: see docs/data-files.md), else a
    prepared TFDS cifar10, else the canonical archive ($LM_DATA_DIR/cifar10/cifar-10-python.tar.gz,
    or downloaded into the cache unless $LM_OFFLINE is set); else UserError naming the paths looked
    at. Cached per process."""
    if split not in SPLITS:
        raise UserError(f"unknown CIFAR-10 split {split!r}: use one of {list(SPLITS)}")
    try:
        path = find_file(f"{CIFAR10_DIR}/{split}.npz")
    except UserError as missing:
        found = _tfds_arrays(split)
        if isinstance(found, str):
            try:
                found = read_cifar10_archive(find_file(CIFAR10_ARCHIVE, CIFAR10_URL, CIFAR10_MD5), split)
            except UserError as no_archive:
                raise UserError(f"{missing}; {found}; {no_archive}") from None
        images, labels = found
    else:
        try:
            with np.load(path) as arrays:
                images, labels = arrays["x"], arrays["y"].astype(np.int32)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            raise UserError(f"{path} cannot be read as a CIFAR-10 .npz with arrays x and y ({type(e).__name__}: "
                            f"{e}); replace it (see docs/data-files.md)") from e
    if images.shape[1:] != (32, 32, 3) or images.dtype != np.uint8 or labels.shape != images.shape[:1]:
        raise UserError(f"CIFAR-10 {split}: expected x (N, 32, 32, 3) uint8 and y (N,), got x {images.shape} "
                        f"{images.dtype} and y {labels.shape}")
    images.flags.writeable = False
    labels.flags.writeable = False
    return images, labels


@dataclasses.dataclass(frozen=True)
class TfdsImages:
    """A prepared TFDS dataset of labelled images whose metadata open_tfds_images checked: read(split) gives a
    split's (images (N, H, W, 3) uint8, labels (N,) int32), whole, in the order of its prepared files."""

    name: str  # the option and its spec, for messages: data.source=tfds:cifar100
    dataset: str  # NAME[/CONFIG]
    train_split: str  # the spec's SPLIT (default train)
    builder: Any  # its tfds.core.DatasetBuilder
    image_field: str
    label_field: str
    class_names: tuple[str, ...]  # the label's ClassLabel names (the class indices as text where it has none)
    image_shape: tuple[int, int, int]  # (H, W, 3) of every image

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def read(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """A split (a name, or a slice: train[:90%]) read whole, read-only. A UserError where the builder has
        no such split, it is empty, or a label is not one of the classes (a split without labels)."""
        source = sources.tfds_split(self.builder, self.dataset, split, self.name)
        count = len(source)
        if not count:
            raise UserError(f"{self.name}: its split {split!r} is empty")
        images = np.empty((count, *self.image_shape), np.uint8)
        labels = np.empty(count, np.int32)
        for start in range(0, count, sources.TFDS_CHUNK):
            rows = range(start, min(start + sources.TFDS_CHUNK, count))
            for row, record in zip(rows, source.__getitems__(list(rows)), strict=True):
                images[row], labels[row] = record[self.image_field], record[self.label_field]
        outside = np.flatnonzero((labels < 0) | (labels >= self.num_classes))
        if len(outside):
            raise UserError(f"{self.name}: record {outside[0]} of split {split!r} has {self.label_field} "
                            f"{labels[outside[0]]}, not one of its {self.num_classes} classes (a split without "
                            "labels?): use a labelled split")
        images.flags.writeable = False
        labels.flags.writeable = False
        return images, labels


def open_tfds_images(spec: str, image_field: str = "image", label_field: str = "label") -> TfdsImages:
    """The dataset of data.source=spec, tfds:NAME[/CONFIG][:SPLIT] (SPLIT: the training split, default train),
    prepared (lm/data/sources.py prepared_tfds: no download), its metadata checked.
    A one-line UserError where it is not prepared or lacks a field, where image_field is not an Image feature
    of one square RGB uint8 size (images are read as they are, never resized), or where label_field is not
    a ClassLabel (the classes' number and names come from it)."""
    import tensorflow_datasets as tfds

    name = f"data.source={spec}"
    kind, _, rest = spec.partition(":")
    if kind != "tfds" or not rest:
        raise UserError(f"{name}: use tfds:NAME[/CONFIG][:SPLIT], a prepared TFDS image dataset (docs/vit.md)")
    dataset, _, split = rest.partition(":")
    builder = sources.prepared_tfds(dataset, {"data.image_field": image_field, "data.label_field": label_field},
                                    name)
    features = builder.info.features
    image, label = features[image_field], features[label_field]
    if not isinstance(image, tfds.features.Image):
        found = [key for key, feature in features.items() if isinstance(feature, tfds.features.Image)]
        raise UserError(f"{name}: its feature {image_field!r} is {image!r}, not an image: set "
                        f"--config.data.image_field to one of its images ({', '.join(found) or 'it has none'})")
    shape = tuple(image.shape)
    if len(shape) != 3 or None in shape or shape[0] != shape[1] or shape[2] != 3 or image.np_dtype != np.uint8:
        size = " x ".join("?" if side is None else str(side) for side in shape)
        varies = " ('?': the size varies)" if None in shape else ""
        raise UserError(f"{name}: its {image_field!r} images are {size} {np.dtype(image.np_dtype).name}{varies}: lm "
                        "reads RGB images of one square size (H x H x 3, uint8) as they are, without resizing: use "
                        "a dataset (or a config of one) of such images")
    if not isinstance(label, tfds.features.ClassLabel):
        found = [key for key, feature in features.items() if isinstance(feature, tfds.features.ClassLabel)]
        raise UserError(f"{name}: its feature {label_field!r} is {label!r}, not a ClassLabel (which gives the "
                        f"number of classes): set --config.data.label_field to one of its ClassLabel features "
                        f"({', '.join(found) or 'it has none'})")
    return TfdsImages(name, dataset, split or "train", builder, image_field, label_field, tuple(label.names),
                      shape)


def train_val_split(num_examples: int, num_val: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, val indices), each sorted: a seeded random num_val for validation, the rest
    for training (the npz is sorted by class, so a plain cut would hold out whole classes)."""
    if not 0 <= num_val < num_examples:
        raise UserError(f"data.num_val={num_val} must be in [0, {num_examples})")
    order = np.random.default_rng(seed).permutation(num_examples)
    return np.sort(order[num_val:]), np.sort(order[:num_val])


# ---------------------------------------------------------------------------------------------
# Augmentation: numpy on uint8 images (B, H, W, C), randomness from a Generator
# ---------------------------------------------------------------------------------------------


def random_crop(images: np.ndarray, rng: np.random.Generator, padding: int = 4) -> np.ndarray:
    """Each image zero-padded by `padding` pixels on every side, then cropped back to (H, W) at a
    random offset (per image)."""
    batch, height, width, _ = images.shape
    padded = np.pad(images, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    top = rng.integers(0, 2 * padding + 1, batch)  # (B,)
    left = rng.integers(0, 2 * padding + 1, batch)
    rows = (top[:, None] + np.arange(height))[:, :, None]  # (B, H, 1)
    cols = (left[:, None] + np.arange(width))[:, None, :]  # (B, 1, W)
    return padded[np.arange(batch)[:, None, None], rows, cols]  # (B, H, W, C)


def random_flip(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each image mirrored left-right with probability 1/2."""
    flip = rng.random(len(images)) < 0.5
    out = images.copy()
    out[flip] = images[flip, :, ::-1]
    return out


def _affine(image: np.ndarray, matrix: np.ndarray, fill: int = 128) -> np.ndarray:
    """image (H, W, C) warped with nearest-neighbour sampling: output pixel (x, y), relative to the
    centre, reads input pixel matrix @ (x, y, 1); pixels from outside are grey."""
    height, width = image.shape[:2]
    ys, xs = np.mgrid[0:height, 0:width]
    cy, cx = (height - 1) / 2, (width - 1) / 2
    source = np.asarray(matrix, np.float64) @ np.stack([xs.ravel() - cx, ys.ravel() - cy, np.ones(xs.size)])
    sx, sy = np.rint(source[0] + cx).astype(int), np.rint(source[1] + cy).astype(int)  # (H*W,)
    inside = (sx >= 0) & (sx < width) & (sy >= 0) & (sy < height)
    out = np.full_like(image, fill).reshape(height * width, -1)
    out[inside] = image[sy[inside], sx[inside]]
    return out.reshape(image.shape)


def _blend(image: np.ndarray, degenerate: np.ndarray | float, factor: float) -> np.ndarray:
    """degenerate + factor * (image - degenerate), clipped to uint8 (PIL ImageEnhance)."""
    out = degenerate + factor * (image.astype(np.float32) - degenerate)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def _grey(image: np.ndarray) -> np.ndarray:
    """(H, W, 1) luminance (ITU-R 601)."""
    return (image.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32))[..., None]


def _autocontrast(image: np.ndarray) -> np.ndarray:
    low, high = image.min(axis=(0, 1)).astype(np.float32), image.max(axis=(0, 1)).astype(np.float32)  # (C,)
    scale = np.where(high > low, 255 / np.maximum(high - low, 1), 1.0)
    return np.clip(np.rint((image - np.where(high > low, low, 0)) * scale), 0, 255).astype(np.uint8)


def _equalize(image: np.ndarray) -> np.ndarray:
    """Per-channel histogram equalisation."""
    out = np.empty_like(image)
    for c in range(image.shape[-1]):
        cdf = np.cumsum(np.bincount(image[..., c].ravel(), minlength=256))
        lookup = np.clip(np.rint((cdf - cdf.min()) * 255 / max(cdf[-1] - cdf.min(), 1)), 0, 255).astype(np.uint8)
        out[..., c] = lookup[image[..., c]]
    return out


def _rotation(degrees: float) -> np.ndarray:
    a = np.deg2rad(degrees)
    return np.array([[np.cos(a), np.sin(a), 0], [-np.sin(a), np.cos(a), 0]])


# Each op takes an image (H, W, C) uint8 and a signed strength v in [-1, 1] (magnitude / 10, random
# sign); ranges follow RandAugment (Cubuk et al. 2019) with translations scaled to the image size.
RANDAUGMENT_OPS = {
    "identity": lambda im, v: im,
    "autocontrast": lambda im, v: _autocontrast(im),
    "equalize": lambda im, v: _equalize(im),
    "rotate": lambda im, v: _affine(im, _rotation(30 * v)),
    "shear_x": lambda im, v: _affine(im, [[1, 0.3 * v, 0], [0, 1, 0]]),
    "shear_y": lambda im, v: _affine(im, [[1, 0, 0], [0.3 * v, 1, 0]]),
    "translate_x": lambda im, v: _affine(im, [[1, 0, 0.3 * v * im.shape[1]], [0, 1, 0]]),
    "translate_y": lambda im, v: _affine(im, [[1, 0, 0], [0, 1, 0.3 * v * im.shape[0]]]),
    "brightness": lambda im, v: _blend(im, 0.0, 1 + 0.9 * v),
    "contrast": lambda im, v: _blend(im, float(_grey(im).mean()), 1 + 0.9 * v),
    "color": lambda im, v: _blend(im, _grey(im), 1 + 0.9 * v),
    "solarize": lambda im, v: np.where(im >= 256 - 256 * abs(v), 255 - im, im).astype(np.uint8),
    "posterize": lambda im, v: im & np.uint8(256 - 2 ** int(4 * abs(v))),  # keep 8 - 4|v| bits
}


def randaugment(images: np.ndarray, rng: np.random.Generator, num_ops: int, magnitude: float) -> np.ndarray:
    """Each image gets num_ops ops drawn uniformly (with replacement) from RANDAUGMENT_OPS, at
    strength magnitude / 10 (magnitude in [0, 10]) with a random sign. num_ops 0: unchanged."""
    if num_ops <= 0:
        return images
    ops = list(RANDAUGMENT_OPS.values())
    choices = rng.integers(0, len(ops), (len(images), num_ops))
    strengths = magnitude / 10 * rng.choice([-1.0, 1.0], (len(images), num_ops))
    out = images.copy()
    for i in range(len(images)):
        for op, v in zip(choices[i], strengths[i], strict=True):
            out[i] = ops[op](out[i], v)
    return out


def normalize(images: np.ndarray) -> np.ndarray:
    """uint8 (..., C) -> float32 (x / 255 - MEAN) / STD."""
    return (images.astype(np.float32) / 255 - MEAN) / STD


def one_hot(labels: np.ndarray, num_classes: int = NUM_CLASSES) -> np.ndarray:
    """(B,) -> (B, K) float32; a negative label gives an all-zero row."""
    return (labels[:, None] == np.arange(num_classes)).astype(np.float32)


def mix_batch(images: np.ndarray, targets: np.ndarray, rng: np.random.Generator, mixup_alpha: float,
              cutmix_alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Mixup or CutMix over a batch: row i is combined with row partner[i] (a random permutation)
    with weight lam ~ Beta(alpha, alpha) on its own image. With both alphas > 0, each batch picks
    one of the two with probability 1/2; both 0: unchanged (lam 1).
      mixup   image = lam x_i + (1 - lam) x_partner
      cutmix  a box of area (1 - lam) H W at a random centre (clipped to the image) comes from the
              partner; lam is then the exact uncovered fraction
    targets = lam t_i + (1 - lam) t_partner. images (B, H, W, C) float, targets (B, K).
    Returns (images, targets, partner (B,), lam)."""
    batch, height, width, _ = images.shape
    partner = rng.permutation(batch)
    if mixup_alpha <= 0 and cutmix_alpha <= 0:
        return images, targets, np.arange(batch), 1.0
    use_cutmix = cutmix_alpha > 0 and (mixup_alpha <= 0 or rng.random() < 0.5)
    alpha = cutmix_alpha if use_cutmix else mixup_alpha
    lam = float(rng.beta(alpha, alpha))
    if use_cutmix:
        cut_h, cut_w = int(height * np.sqrt(1 - lam)), int(width * np.sqrt(1 - lam))
        cy, cx = rng.integers(0, height), rng.integers(0, width)
        top, bottom = np.clip([cy - cut_h // 2, cy + cut_h // 2], 0, height)
        left, right = np.clip([cx - cut_w // 2, cx + cut_w // 2], 0, width)
        images = images.copy()
        images[:, top:bottom, left:right] = images[partner, top:bottom, left:right]
        lam = 1 - (bottom - top) * (right - left) / (height * width)
    else:
        images = lam * images + (1 - lam) * images[partner]
    return images, lam * targets + (1 - lam) * targets[partner], partner, lam


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """The training augmentation (config.data): crop, flip, RandAugment, then normalise, then mixup/cutmix."""

    crop_padding: int = 4  # 0: no random crop
    flip: bool = True
    randaugment_ops: int = 0  # ops per image; 0: off
    randaugment_magnitude: float = 9.0  # 0..10
    mixup_alpha: float = 0.0  # 0: off
    cutmix_alpha: float = 0.0  # 0: off


def augmented_batch(images: np.ndarray, labels: np.ndarray, rng: np.random.Generator, aug: Augmentation,
                    num_classes: int = NUM_CLASSES) -> Batch:
    """images (B, H, W, C) uint8, labels (B,) in [0, num_classes) -> a training batch (see the module
    docstring; index all 0)."""
    if aug.crop_padding > 0:
        images = random_crop(images, rng, aug.crop_padding)
    if aug.flip:
        images = random_flip(images, rng)
    images = randaugment(images, rng, aug.randaugment_ops, aug.randaugment_magnitude)
    x, targets, _, _ = mix_batch(normalize(images), one_hot(labels, num_classes), rng, aug.mixup_alpha,
                                 aug.cutmix_alpha)
    return {
        "image": x.astype(np.float32),
        "label": labels.astype(np.int32),
        "targets": targets.astype(np.float32),
        "index": np.zeros(len(labels), np.int32),
        "valid": np.ones(len(labels), np.int32),
    }


# ---------------------------------------------------------------------------------------------
# Pipelines
# ---------------------------------------------------------------------------------------------


class TrainBatches:
    """Random access to the endless training sequence: self[step] is this process's batch number
    `step` (see the module docstring for the order and the seeding)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int,
                 shard: tuple[int, int] = (0, 1), augmentation: Augmentation = Augmentation(),
                 num_classes: int = NUM_CLASSES):
        index, count = shard
        if not 0 <= index < count:
            raise ValueError(f"shard index {index} is not in [0, {count})")
        self.images, self.labels = images, labels
        self.batch_size, self.global_batch_size = batch_size, batch_size * count
        self.seed, self.shard, self.augmentation, self.num_classes = seed, shard, augmentation, num_classes
        self.steps_per_epoch = len(labels) // self.global_batch_size
        if self.steps_per_epoch == 0:
            raise UserError(f"{len(labels)} training images are fewer than one global batch of "
                            f"{self.global_batch_size}")
        self._order: tuple[int, np.ndarray] | None = None  # (epoch, its permutation)

    def __len__(self) -> int:
        return self.steps_per_epoch

    def epoch_order(self, epoch: int) -> np.ndarray:
        """(N,) the permutation of the training examples for one epoch (the latest is cached)."""
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self.labels)))
        return self._order[1]

    def __getitem__(self, step: int) -> Batch:
        epoch, position = divmod(int(step), self.steps_per_epoch)
        index, _ = self.shard
        start = position * self.global_batch_size + index * self.batch_size
        rows = self.epoch_order(epoch)[start : start + self.batch_size]  # (B,)
        rng = np.random.default_rng([self.seed, 1, int(step), index])  # 1: apart from the epoch permutations
        batch = augmented_batch(self.images[rows], self.labels[rows], rng, self.augmentation, self.num_classes)
        batch["index"] = rows.astype(np.int32)
        return batch

    def at_step(self, step: int, _) -> Batch:  # for MapDataset.map_with_index (picklable, unlike a lambda)
        return self[step]


def worker_count(cpus: int | None = None) -> int:
    """Worker processes for num_workers=-1: the host's cores less two (the trainer's own thread and the
    device prefetch), at least 1. On an H100 host's 16 cores RandAugment + mixup/CutMix batches of 128
    came at 13.8k images/s from 4 workers and 18.4k from 12, about what the ViT full step takes."""
    return max(1, (cpus or os.cpu_count() or 1) - 2)


def train_batches(images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int, shard: tuple[int, int] = (0, 1),
                  augmentation: Augmentation = Augmentation(), num_workers: int = 0,
                  start_step: int = 0, num_classes: int = NUM_CLASSES) -> grain.IterDataset:
    """Endless, deterministic augmented training batches of batch_size rows per process, from
    batch number start_step on. num_workers 0: built in this process by one background thread
    (overlapping the train step); > 0: by that many worker processes (Grain mp_prefetch), each
    building every num_workers-th batch; -1: worker_count() of them. The sequence is the same either way."""
    batches = TrainBatches(images, labels, batch_size, seed, shard, augmentation, num_classes)
    ds = grain.MapDataset.range(len(batches)).repeat().map_with_index(batches.at_step)[start_step:]
    num_workers = worker_count() if num_workers < 0 else num_workers
    if num_workers > 0:
        return ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)).mp_prefetch(
            grain.MultiprocessingOptions(num_workers=num_workers, per_worker_buffer_size=2))
    return ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2))


def eval_batches(images: np.ndarray, labels: np.ndarray, batch_size: int,
                 num_classes: int = NUM_CLASSES) -> list[Batch]:
    """A split in order, unaugmented, as ceil(N / batch_size) fixed global batches: batch i holds
    examples [i * batch_size, (i + 1) * batch_size); the last is filled with dummy rows (zero image,
    label 0, zero targets, index -1, valid 0)."""
    out = []
    for start in range(0, len(labels), batch_size):
        rows = np.arange(start, start + batch_size)  # (B,)
        valid = rows < len(labels)
        safe = np.where(valid, rows, 0)
        x = np.where(valid[:, None, None, None], normalize(images[safe]), 0.0).astype(np.float32)
        label = np.where(valid, labels[safe], 0).astype(np.int32)
        out.append({
            "image": x,
            "label": label,
            "targets": one_hot(np.where(valid, label, -1), num_classes),
            "index": np.where(valid, rows, -1).astype(np.int32),
            "valid": valid.astype(np.int32),
        })
    return out
