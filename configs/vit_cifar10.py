r"""ViT on CIFAR-10 (patch 4: 8 x 8 = 64 patches of a 32 x 32 image).

Variants (pick one after the colon):

  cpu   4 layers, 4 heads, 128 wide (MLP 256), global average pooling, 2-D sin-cos positions,
        batch 128, 5000 steps (14 epochs), random crop + flip, label smoothing 0.1: ~0.55M parameters.
        lm train --config=configs/vit_cifar10.py:cpu --workdir=runs/vit_cpu
        Measured on a 2-core CPU: 71.8% test accuracy after 27.1 minutes of training (val passed 70% at
        21.9 minutes; ~410 images/s), on the JPEG-decoded copy (docs/vit.md: the time-to-accuracy table).
  full  7 layers, 12 heads, 384 wide (MLP 384), [CLS] token, learned positions, batch 128, 200 epochs
        (70,300 steps), RandAugment (2 ops, magnitude 9), mixup 0.2 / CutMix 1.0, label smoothing 0.1:
        ~6.3M parameters, the shape of the best-known small ViT trained from scratch (91.0%, 200 epochs).
        lm train --config=configs/vit_cifar10.py:full --workdir=runs/vit_full
        For an accelerator; goal >= 91% test accuracy; not yet run (no accelerator so far).
  test  2 layers, 32 wide, patch 8, a few steps, for tests.
        lm train --config=configs/vit_cifar10.py:test --workdir=/tmp/vit_test

The data is $LM_DATA_DIR/cifar10/{train,test}.npz, decoded from JPEG (about 2-3 points below the
original pixels: say so next to any accuracy reported). Any prepared TFDS image dataset of one square RGB
size takes its place (docs/vit.md), e.g. CIFAR-100 (its test split scored at the end, a head of its 100
classes); not run here, where no network is to prepare it (`tfds build cifar100 --file_format=array_record`,
once, where one is):
        lm train --config=configs/vit_cifar10.py:cpu --workdir=runs/vit_cifar100 \
            --config.data.source=tfds:cifar100

Switches: --config.model.pool=cls|gap,
--config.model.position=learned|sincos2d|sinusoidal|rope|alibi|none, --config.model.patch_size=8,
every shared block option (--config.model.norm=rms, --config.model.norm_position=post,
--config.model.mlp=swiglu, --config.model.moe.num_experts=4, ...), and the augmentation in data.*
(randaugment_ops, randaugment_magnitude, mixup_alpha, cutmix_alpha, crop_padding, flip, num_workers: -1 for
the host's cores less two).
"""

import ml_collections

from configs import base
from lm.layers.options import at_least, declare, option
from lm.models.config import transformer_options
from lm.models.vit import POOLS, VIT_POSITIONS


def get_config(variant: str = "cpu") -> ml_collections.ConfigDict:
    config = base.image_classification()
    # The block options (norm, mlp, moe, init, ...) are shared with every Transformer experiment
    # (lm/models/config.py); position takes the ViT kinds of lm/models/vit.py.
    config.model = transformer_options(num_layers=4, num_heads=4, num_kv_heads=4, embed_dim=128, mlp_ratio=2.0)
    declare(
        config.model,
        position=option("sincos2d", "position scheme (lm/models/vit.py; rope and alibi act in the attention)",
                        choices=VIT_POSITIONS),
        patch_size=option(4, "pixels per side of a square patch; it must divide model.image_size",
                          bounds=at_least(1)),
        image_size=option(32, "pixels per side of the square RGB images the model takes: the data's own size "
                              "(images are not resized)", bounds=at_least(1)),
        num_classes=option(0, "classes of the classifier head; 0: the dataset's (CIFAR-10's 10, or data.source's "
                              "label ClassLabel, which the run's config.json then records)", bounds=at_least(0)),
        pool=option("gap", "the classifier reads the [CLS] token (cls) or the patches' mean (gap)", choices=POOLS),
    )

    if variant == "cpu":
        config.train.update(batch_size=128, num_steps=5000, log_every=100, checkpoint_every=1000)
        config.optimizer.update(learning_rate=1e-3, warmup_fraction=0.06, weight_decay=0.05)
        config.eval.update(every=500)
    elif variant == "full":
        config.model.update(num_layers=7, num_heads=12, num_kv_heads=12, embed_dim=384, mlp_ratio=1.0,
                            position="learned", pool="cls")
        config.data.update(randaugment_ops=2, randaugment_magnitude=9.0, mixup_alpha=0.2, cutmix_alpha=1.0,
                           num_workers=-1)  # the cores less two: see lm/data/images.py worker_count
        steps = 200 * 45000 // 128  # 200 epochs
        config.train.update(batch_size=128, num_steps=steps, log_every=200, checkpoint_every=5000)
        # warmup over 5 epochs, whatever the run's length
        config.optimizer.update(learning_rate=1e-3, warmup_steps=5 * 45000 // 128, weight_decay=0.05)
        config.eval.update(every=5000)
    elif variant == "test":
        config.model.update(num_layers=2, num_heads=2, num_kv_heads=2, embed_dim=32)
        config.model.patch_size = 8
        config.train.update(batch_size=32, num_steps=10, log_every=5, checkpoint_every=10)
        config.optimizer.update(learning_rate=3e-3, warmup_fraction=0.2)
        config.eval.update(every=5, batch_size=1000)
    else:
        raise ValueError(f"unknown variant {variant!r} of configs/vit_cifar10.py: use cpu, full or test")
    return config
