"""Image classification on any prepared TFDS dataset (data.source=tfds:NAME[/CONFIG][:SPLIT]): a tiny
builder prepared here (array_record, no network) read back exactly, the number of classes from its
ClassLabel into the model and the run's config, and the one-line errors of bad input."""

import json

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest

from lm.data import images
from lm.errors import UserError

CLASS_NAMES = ("cat", "dog", "eel")
NUM_IMAGES, NUM_TRAIN = 10, 7  # images 0-6 train, 7-9 test


def pixels(i: int) -> np.ndarray:
    """Image i, (8, 8, 3) uint8: random from seed i, its first byte i (so a read image names its number)."""
    image = np.random.default_rng(i).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    image[0, 0, 0] = i
    return image


def label(i: int) -> int:
    return i % len(CLASS_NAMES)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The folder where lm_test_images (registered once, here) is prepared: features image (8 x 8 RGB),
    wide (6 x 8 RGB), label (ClassLabel of CLASS_NAMES) and score (an integer)."""
    import PIL.Image
    import tensorflow_datasets as tfds

    class LmTestImages(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(8, 8, 3)),
                "wide": tfds.features.Image(shape=(6, 8, 3)),
                "label": tfds.features.ClassLabel(names=CLASS_NAMES),
                "score": np.int64,
            }))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(0, NUM_TRAIN), "test": self._generate_examples(NUM_TRAIN,
                                                                                                   NUM_IMAGES)}

        def _generate_examples(self, start, stop):
            for i in range(start, stop):  # PIL images: tfds encodes them without TensorFlow
                yield i, {"image": PIL.Image.fromarray(pixels(i)), "wide": PIL.Image.fromarray(pixels(i)[:6]),
                          "label": label(i), "score": i}

    folder = tmp_path_factory.mktemp("tfds")
    LmTestImages(data_dir=str(folder), file_format="array_record").download_and_prepare()
    return folder


@pytest.fixture
def tfds_dir(prepared, monkeypatch):
    monkeypatch.setenv("TFDS_DATA_DIR", str(prepared))
    return prepared


def check_split(split: tuple[np.ndarray, np.ndarray], numbers: range) -> None:
    """The split holds images `numbers` once each, every one with its own pixels and label."""
    images_, labels = split
    assert images_.dtype == np.uint8 and labels.dtype == np.int32 and images_.shape[1:] == (8, 8, 3)
    read = images_[:, 0, 0, 0].tolist()
    assert sorted(read) == list(numbers)
    for row, i in enumerate(read):
        np.testing.assert_array_equal(images_[row], pixels(i))
        assert labels[row] == label(i)


def test_reads_the_images_and_labels_the_builder_wrote(tfds_dir):
    dataset = images.open_tfds_images("tfds:lm_test_images")
    assert dataset.class_names == CLASS_NAMES and dataset.num_classes == 3 and dataset.image_shape == (8, 8, 3)
    assert dataset.train_split == "train"
    check_split(dataset.read("train"), range(NUM_TRAIN))
    check_split(dataset.read("test"), range(NUM_TRAIN, NUM_IMAGES))
    train = dataset.read("train")
    half = images.open_tfds_images("tfds:lm_test_images:train[:3]")
    assert half.train_split == "train[:3]"
    np.testing.assert_array_equal(half.read(half.train_split)[1], train[1][:3])  # a slice, in the same order


def tiny_config(**data) -> ml_collections.ConfigDict:
    from configs.vit_cifar10 import get_config

    config = get_config("test")
    config.data.update({"source": "tfds:lm_test_images", "num_val": 2, **data})
    config.model.update(image_size=8, patch_size=4)
    config.eval.batch_size = 4
    return config


def test_the_head_takes_the_number_of_classes_from_the_metadata_and_the_run_config_records_it(tfds_dir):
    from experiments import image_classification
    from lm.hf.vit import hf_config

    config = tiny_config()
    experiment = image_classification.build(config)
    assert config.model.num_classes == 3 and experiment.class_names == CLASS_NAMES
    sizes = [len(experiment.splits[split][1]) for split in ("train", "val", "test")]
    assert sizes == [NUM_TRAIN - 2, 2, NUM_IMAGES - NUM_TRAIN]
    check_split(experiment.splits["test"], range(NUM_TRAIN, NUM_IMAGES))
    batch = next(iter(experiment.train_data(4, seed=0, shard=(0, 1), start_step=0)))
    assert batch["image"].shape == (4, 8, 8, 3) and batch["targets"].shape == (4, 3)
    params = nn.unbox(jax.eval_shape(experiment.init, jax.random.key(0)))["params"]  # shapes only: no compute
    assert params["head"]["kernel"].shape == (32, 3)  # embed_dim 32 -> the 3 classes
    eval_batch = experiment.eval_data("test")[0]
    assert eval_batch["targets"].shape == (4, 3) and eval_batch["valid"].tolist() == [1, 1, 1, 0]

    saved = ml_collections.ConfigDict(json.loads(config.to_json_best_effort()))  # as lm eval / export read it
    assert image_classification.from_workdir(saved, tfds_dir).model.config.num_classes == 3
    exported = hf_config(saved)
    assert exported["id2label"] == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"} and exported["image_size"] == 8

    config = tiny_config(val_split="test")  # a split of the dataset for validation: the training split whole
    experiment = image_classification.build(config)
    check_split(experiment.splits["train"], range(NUM_TRAIN))
    check_split(experiment.splits["val"], range(NUM_TRAIN, NUM_IMAGES))


@pytest.mark.parametrize("fields, message", [
    ({"source": "files:x"}, r"^data.source=files:x: use tfds:NAME\[/CONFIG\]\[:SPLIT\], a prepared TFDS image "),
    ({"image_field": "pixels"}, r"has no feature 'pixels' \(its features: image, wide, label, score\): set "
                                r"--config.data.image_field$"),
    ({"image_field": "score"}, r"its feature 'score' is Tensor\(shape=\(\), dtype=int64\), not an image: set "
                               r"--config.data.image_field to one of its images \(image, wide\)$"),
    ({"image_field": "wide"}, r"its 'wide' images are 6 x 8 x 3 uint8: lm reads RGB images of one square size"),
    ({"label_field": "score"}, r"its feature 'score' is Tensor.*, not a ClassLabel .* to one of its ClassLabel "
                               r"features \(label\)$"),
    ({"test_split": "validation"}, r"has no split 'validation' .*; its splits: train, test$"),
    ({"num_val": 7}, r"^data.num_val=7 must be in \[0, 7\)$"),
])
def test_bad_input_is_one_line(tfds_dir, fields, message):
    from experiments import image_classification

    with pytest.raises(UserError, match=message) as error:
        image_classification.build(tiny_config(**fields))
    assert "\n" not in str(error.value)


def test_the_image_size_and_the_number_of_classes_must_be_the_datasets(tfds_dir):
    from experiments import image_classification

    config = tiny_config()
    config.model.image_size = 32
    with pytest.raises(UserError, match=r"^data.source=tfds:lm_test_images: its images are 8 x 8, not "
                                        r"model.image_size=32: set --config.model.image_size=8 "):
        image_classification.build(config)
    config = tiny_config()
    config.model.num_classes = 10
    with pytest.raises(UserError, match=r"has 3 classes, model.num_classes=10: drop the override"):
        image_classification.build(config)


def test_a_dataset_not_prepared_says_how_to_prepare_it(prepared, tmp_path, monkeypatch):
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
    with pytest.raises(UserError, match=rf"^data.source=tfds:lm_test_images: the TFDS dataset lm_test_images is "
                                        rf"not prepared in {tmp_path}: prepare it once where a network is: tfds "
                                        rf"build lm_test_images --data_dir={tmp_path} --file_format=array_record"):
        images.open_tfds_images("tfds:lm_test_images")
