"""Image classification with a ViT (lm/models/vit.py) on CIFAR-10 or any prepared TFDS image dataset.

Data: CIFAR-10 (data.dataset; the local copy is decoded from JPEG, which costs about 2-3 points of accuracy
against the original pixels: docs/data-files.md), or data.source=tfds:NAME[/CONFIG][:SPLIT] (its
data.image_field images, of model.image_size, and data.label_field ClassLabel; the head gets its number of
classes). Validation (scored during training): data.val_split, else a seeded data.num_val images held out of
the training split (CIFAR-10: 45k/5k). The data.test_split is scored once at the end (results.json: top-1
and per-class accuracy; in the workdir a confusion-matrix PNG and an attention-rollout PNG of a test image
of each of the first ATTENTION_CLASSES classes).
Loss: softmax cross-entropy against the batch's soft targets (one-hot, or mixed by mixup/cutmix)
smoothed by train.label_smoothing, over the valid rows only; plus the mixture-of-experts auxiliary
losses. Logged: `cross_entropy` (unsmoothed) and `accuracy` (argmax against the hard label).
"""

import functools
import pathlib

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from lm.data import images
from lm.distributed import is_primary
from lm.errors import UserError
from lm.layers.transformer import sown_per_layer
from lm.losses import masked_accuracy, masked_cross_entropy, moe_objective
from lm.models.config import transformer_config
from lm.models.vit import ViT, ViTConfig, flops_per_image, stack_position
from lm.plots import save_confusion_matrix, save_image_attention
from lm.train.experiment import Experiment

CONFUSION_MATRIX_FILE = "confusion_matrix.png"
ATTENTION_FILE = "attention_rollout.png"
ATTENTION_CLASSES = 10  # the attention figure's columns: a test image of each of the first so many classes


def num_classes(config: ml_collections.ConfigDict) -> int:
    """model.num_classes; where it is 0, the dataset's: CIFAR-10's 10 without data.source (a data.source's
    build reads from its metadata and records in config). A run saved before these options was CIFAR-10's."""
    if config.model.get("num_classes"):
        return config.model.num_classes
    if config.data.get("source"):
        raise ValueError("model.num_classes is 0 with a data.source: build() reads it from the dataset")
    return images.NUM_CLASSES


def vit_config(model: ml_collections.ConfigDict, classes: int) -> ViTConfig:
    """The ViT of a config's `model` section with a head of `classes`: the shared block options plus
    image_size (32 for a run saved before the option), patch_size, pool, position."""
    blocks = model.copy_and_resolve_references()
    blocks.position = stack_position(model.position)  # rope/alibi act in attention; the rest in vit.py
    return ViTConfig(
        transformer=transformer_config(blocks),
        num_classes=classes,
        image_size=model.get("image_size", images.IMAGE_SHAPE[0]),
        channels=images.IMAGE_SHAPE[2],
        patch_size=model.patch_size,
        pool=model.pool,
        position=model.position,
    )


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """(K, K) int64 counts: row = true class, column = predicted class."""
    matrix = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(matrix, (labels, predictions), 1)
    return matrix


def attention_rollout(layers: list[np.ndarray]) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema, 2020): per-layer attention [(B, T, T)] (mean over heads, first
    layer first) -> (B, T, T), row t = how much token t's output draws on each input token, counting the
    residual path as half of every layer: R = A'_L ... A'_1 with A' = (A + I) / 2 (rows sum to 1)."""
    identity = np.eye(layers[0].shape[-1])
    rollout = np.broadcast_to(identity, layers[0].shape)
    for weights in layers:
        rollout = 0.5 * (weights + identity) @ rollout
    return rollout


class ImageClassification(Experiment):
    unit = "images"

    def __init__(self, config: ml_collections.ConfigDict,
                 splits: dict[str, tuple[np.ndarray, np.ndarray]] | None = None, class_names: tuple[str, ...] = ()):
        """splits: {"train", "val", "test"} -> (images (N, S, S, 3) uint8, labels (N,) int32), S =
        model.image_size; class_names: the K classes' names (for the final results)."""
        super().__init__(config)
        self.splits = splits or {}
        self.class_names = class_names
        self.model = ViT(vit_config(config.model, num_classes(config)))

    def init(self, rng: jax.Array) -> dict:
        cfg = self.model.config
        return self.model.init({"params": rng}, jnp.zeros((1, cfg.image_size, cfg.image_size, cfg.channels)))

    def loss(self, params, batch, rng, train: bool):
        logits, collections = self.model.apply(
            {"params": params}, batch["image"], train=train, rngs={"dropout": rng}, mutable=["moe"]
        )  # (B, K)
        valid = batch["valid"]
        targets = batch["targets"]  # (B, K), rows sum to 1 (0 for dummy rows)
        loss = masked_cross_entropy(logits, targets, valid, self.config.train.label_smoothing)
        cross_entropy = masked_cross_entropy(logits, targets, valid)
        accuracy = masked_accuracy(logits, batch["label"], valid)
        moe = self.model.config.transformer.moe
        aux_loss, moe_metrics = moe_objective(collections.get("moe", {}), moe.load_balance_weight,
                                              moe.router_z_weight)
        return loss + aux_loss, {"cross_entropy": cross_entropy, "accuracy": accuracy, **moe_metrics}

    def augmentation(self) -> images.Augmentation:
        d = self.config.data
        return images.Augmentation(
            crop_padding=d.crop_padding, flip=d.flip, randaugment_ops=d.randaugment_ops,
            randaugment_magnitude=d.randaugment_magnitude, mixup_alpha=d.mixup_alpha, cutmix_alpha=d.cutmix_alpha,
        )

    def train_data(self, batch_size: int, seed: int, shard: tuple[int, int], start_step: int):
        return images.train_batches(*self.splits["train"], batch_size, seed, shard, self.augmentation(),
                                    self.config.data.num_workers, start_step, self.model.config.num_classes)

    def eval_data(self, split: str = "val"):
        return images.eval_batches(*self.splits[split], self.config.eval.batch_size, self.model.config.num_classes)

    def eval_weight(self, batch) -> jax.Array:
        return jnp.sum(batch["valid"].astype(jnp.float32))  # the real images

    def flops_per_example(self, active_params: int) -> float:
        return flops_per_image(self.model.config, active_params)

    @functools.partial(jax.jit, static_argnums=0)
    def _predict(self, params, image: jax.Array) -> jax.Array:
        """image (B, H, W, C) -> predicted classes (B,)."""
        return jnp.argmax(self.model.apply({"params": params}, image), axis=-1)

    def eval_outputs(self, params, batch) -> dict[str, jax.Array]:
        """Per image of the eval pass: its predicted class, its label and whether it is real, (B,) each
        (for the confusion matrix of the final results: no second pass over the test split)."""
        return {"predicted": self._predict(params, batch["image"]), "label": batch["label"], "valid": batch["valid"]}

    @functools.partial(jax.jit, static_argnums=0)
    def _attention_weights(self, params, image: jax.Array) -> dict:
        """image (B, H, W, C) -> the attention weights every layer sows, {module path: ((B, heads, T, T),)}."""
        _, sown = self.model.apply({"params": params}, image, capture_weights=True, mutable=["intermediates"])
        return sown["intermediates"]

    def patch_attention(self, params, image: np.ndarray) -> np.ndarray:
        """image (B, H, W, C) uint8 -> (B, grid, grid): the attention rollout from the pooled output to
        each patch (the [CLS] token's row, or the mean of all rows for average pooling); sums to 1 per
        image, less what [CLS] keeps from itself."""
        sown = self._attention_weights(params, images.normalize(image))
        layers = {}  # layer index -> (B, T, T), mean over heads
        for path, (weights,) in flax.traverse_util.flatten_dict(sown).items():
            for layer, layer_weights in sown_per_layer(path, weights, self.model.config.transformer):
                layers[layer] = np.asarray(layer_weights, np.float64).mean(axis=1)
        rollout = attention_rollout([layers[i] for i in sorted(layers)])
        cfg = self.model.config
        pooled = rollout[:, 0, 1:] if cfg.pool == "cls" else rollout.mean(axis=1)  # (B, N)
        return pooled.reshape(-1, cfg.grid_size, cfg.grid_size)

    def final_results(self, params, evaluate, workdir: pathlib.Path) -> dict[str, float]:
        """Test top-1 accuracy and cross-entropy, per-class accuracy and workdir/confusion_matrix.png (all
        from one pass of the trainer's eval step), and workdir/attention_rollout.png for the first test image
        of each of the first ATTENTION_CLASSES classes."""
        evaluation = evaluate(self.eval_data("test"))
        results = {"test_accuracy": evaluation["accuracy"], "test_cross_entropy": evaluation["cross_entropy"]}
        real = evaluation.outputs["valid"].astype(bool)
        names = self.class_names
        matrix = confusion_matrix(evaluation.outputs["label"][real], evaluation.outputs["predicted"][real],
                                  len(names))
        per_class = np.diag(matrix) / np.maximum(matrix.sum(axis=1), 1)
        for name, accuracy in zip(names, per_class, strict=True):
            results[f"test_accuracy_{name}"] = float(accuracy)
        test_images, test_labels = self.splits["test"]
        present = [k for k in range(min(len(names), ATTENTION_CLASSES)) if (test_labels == k).any()]
        rows = [np.flatnonzero(test_labels == k)[0] for k in present]
        pixels = test_images[rows]  # the first test image of each of those classes, (n, H, W, C) uint8
        predicted = np.asarray(self._predict(params, images.normalize(pixels)))
        titles = [f"{names[test_labels[r]]}\n-> {names[p]}" for r, p in zip(rows, predicted, strict=True)]
        attention = self.patch_attention(params, pixels)
        if is_primary():
            save_confusion_matrix(workdir / CONFUSION_MATRIX_FILE, matrix, names)
            save_image_attention(workdir / ATTENTION_FILE, pixels, attention, titles)
        return results


def build(config: ml_collections.ConfigDict, workdir: pathlib.Path | None = None) -> ImageClassification:
    """Reads CIFAR-10 or data.source (its metadata checked first: the image size against model.image_size, the
    number of classes against model.num_classes) and makes the train, val and test splits: val is
    data.val_split, else data.num_val images of the training split held out (seeded by data.split_seed).
    A data.source's number of classes goes into config.model.num_classes, so that the run's config.json
    records it for eval, export and resume. The workdir (where the other experiments keep what they fit and
    tokenise) is not needed: images are read as they are."""
    d, m = config.data, config.model
    if d.source:
        dataset = images.open_tfds_images(d.source, d.image_field, d.label_field)
        name, read, train_split = dataset.name, dataset.read, dataset.train_split
        class_names, image_shape = dataset.class_names, dataset.image_shape
    elif d.dataset != "cifar10":
        raise UserError(f"data.dataset={d.dataset!r}: only 'cifar10' is supported (or give a data.source)")
    else:
        name, read, train_split = f"data.dataset={d.dataset}", images.load_cifar10, "train"
        class_names, image_shape = images.CLASS_NAMES, images.IMAGE_SHAPE
    if image_shape[0] != m.image_size:
        raise UserError(f"{name}: its images are {image_shape[0]} x {image_shape[1]}, not model.image_size="
                        f"{m.image_size}: set --config.model.image_size={image_shape[0]} (and a model.patch_size "
                        "that divides it)")
    if m.num_classes not in (0, len(class_names)):
        raise UserError(f"{name} has {len(class_names)} classes, model.num_classes={m.num_classes}: drop the "
                        "override (0 takes the dataset's)")
    train_images, train_labels = read(train_split)
    if d.val_split:
        splits = {"train": (train_images, train_labels), "val": read(d.val_split)}
    else:
        train_rows, val_rows = images.train_val_split(len(train_labels), d.num_val, d.split_seed)
        splits = {"train": (train_images[train_rows], train_labels[train_rows]),
                  "val": (train_images[val_rows], train_labels[val_rows])}
    splits["test"] = read(d.test_split)
    if d.source:
        m.num_classes = len(class_names)
    return ImageClassification(config, splits, class_names)


def from_workdir(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> ImageClassification:
    """The experiment for predicting with a trained model: no data needed (config.json records a data.source's
    number of classes)."""
    return ImageClassification(config)
