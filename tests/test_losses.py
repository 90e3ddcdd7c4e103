"""lm/losses.py against direct numpy formulas: cross-entropy (integer and soft targets, label
smoothing), masking and weights, accuracy, z-loss, mean squared error."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm.losses import (
    cross_entropy,
    masked_accuracy,
    masked_cross_entropy,
    masked_mean,
    mean_squared_error,
    smooth_targets,
    z_loss,
)

RNG = np.random.default_rng(0)
LOGITS = (3 * RNG.standard_normal((3, 5, 7))).astype(np.float32)  # (B, T, V)
IDS = RNG.integers(0, 7, (3, 5))
MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], np.float32)


def np_log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def np_one_hot(ids: np.ndarray, size: int) -> np.ndarray:
    return np.eye(size)[ids]


def np_cross_entropy(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """targets: distributions (..., V)."""
    return -(targets * np_log_softmax(logits)).sum(-1)


def test_integer_targets_give_minus_log_probability_of_the_target():
    expected = -np.take_along_axis(np_log_softmax(LOGITS), IDS[..., None], -1)[..., 0]
    np.testing.assert_allclose(cross_entropy(jnp.asarray(LOGITS), jnp.asarray(IDS)), expected, rtol=1e-5)


def test_its_gradient_is_softmax_minus_one_hot():
    grad = jax.grad(lambda x: cross_entropy(x, jnp.asarray(IDS)).sum())(jnp.asarray(LOGITS))
    expected = np.exp(np_log_softmax(LOGITS)) - np_one_hot(IDS, 7)
    np.testing.assert_allclose(grad, expected, atol=1e-6)


@pytest.mark.parametrize("smoothing", [0.1, 0.3])
def test_label_smoothing_mixes_the_one_hot_with_uniform(smoothing):
    smoothed = (1 - smoothing) * np_one_hot(IDS, 7) + smoothing / 7
    np.testing.assert_allclose(cross_entropy(jnp.asarray(LOGITS), jnp.asarray(IDS), smoothing),
                               np_cross_entropy(LOGITS, smoothed), rtol=1e-5)
    np.testing.assert_allclose(smooth_targets(jnp.asarray(np_one_hot(IDS, 7)), smoothing), smoothed, rtol=1e-6)


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_soft_targets(smoothing):
    soft = np.exp(np_log_softmax(RNG.standard_normal((3, 5, 7))))  # rows sum to 1 (mixup, distillation)
    expected = np_cross_entropy(LOGITS, (1 - smoothing) * soft + smoothing / 7)
    np.testing.assert_allclose(cross_entropy(jnp.asarray(LOGITS), jnp.asarray(soft, jnp.float32), smoothing),
                               expected, rtol=1e-5)


def test_a_one_hot_soft_target_equals_the_integer_target():
    np.testing.assert_allclose(cross_entropy(jnp.asarray(LOGITS), jnp.asarray(np_one_hot(IDS, 7), jnp.float32)),
                               cross_entropy(jnp.asarray(LOGITS), jnp.asarray(IDS)), rtol=1e-5)


def test_targets_of_another_shape_are_refused():
    with pytest.raises(ValueError, match="neither ids"):
        cross_entropy(jnp.asarray(LOGITS), jnp.zeros((3, 5, 6)))


def test_masked_cross_entropy_averages_over_real_positions_only():
    per_token = -np.take_along_axis(np_log_softmax(LOGITS), IDS[..., None], -1)[..., 0]
    expected = per_token[MASK == 1].mean()
    np.testing.assert_allclose(masked_cross_entropy(jnp.asarray(LOGITS), jnp.asarray(IDS), jnp.asarray(MASK)),
                               expected, rtol=1e-5)
    garbage = np.where(MASK[..., None] == 1, LOGITS, 1e4)  # what padding holds does not count
    np.testing.assert_allclose(masked_cross_entropy(jnp.asarray(garbage), jnp.asarray(IDS), jnp.asarray(MASK)),
                               expected, rtol=1e-5)
    smoothed = np_cross_entropy(LOGITS, 0.9 * np_one_hot(IDS, 7) + 0.1 / 7)[MASK == 1].mean()
    np.testing.assert_allclose(
        masked_cross_entropy(jnp.asarray(LOGITS), jnp.asarray(IDS), jnp.asarray(MASK), label_smoothing=0.1),
        smoothed, rtol=1e-5)


def test_masked_mean_weights_and_empty_mask():
    values = RNG.standard_normal((3, 5)).astype(np.float32)
    weights = RNG.uniform(0.5, 2.0, (3, 5)).astype(np.float32)  # sum > 1: the weighted mean
    np.testing.assert_allclose(masked_mean(jnp.asarray(values), jnp.asarray(weights)),
                               (values * weights).sum() / weights.sum(), rtol=1e-5)
    np.testing.assert_allclose(masked_mean(jnp.asarray(values), jnp.asarray(MASK.astype(bool))),
                               values[MASK == 1].mean(), rtol=1e-5)
    assert float(masked_mean(jnp.asarray(values), jnp.zeros((3, 5)))) == 0.0


def test_masked_accuracy():
    labels = np.argmax(LOGITS, -1)
    labels[0, 0] = (labels[0, 0] + 1) % 7  # one wrong among the 9 real positions
    labels[0, 4] = (labels[0, 4] + 1) % 7  # and one wrong at padding, which does not count
    np.testing.assert_allclose(masked_accuracy(jnp.asarray(LOGITS), jnp.asarray(labels), jnp.asarray(MASK)), 8 / 9,
                               rtol=1e-6)


def test_z_loss_is_the_squared_log_normaliser():
    x = LOGITS.astype(np.float64)
    expected = np.log(np.exp(x).sum(-1)) ** 2
    np.testing.assert_allclose(z_loss(jnp.asarray(LOGITS)), expected, rtol=1e-5)
    assert float(z_loss(jnp.log(jnp.full((4,), 0.25)))) == pytest.approx(0.0, abs=1e-12)  # normaliser 1: no loss


def test_mean_squared_error():
    predictions, targets = RNG.standard_normal((2, 6)), RNG.standard_normal((2, 6))
    weights = (RNG.uniform(size=(2, 6)) > 0.4).astype(np.float32)
    np.testing.assert_allclose(mean_squared_error(jnp.asarray(predictions), jnp.asarray(targets)),
                               ((predictions - targets) ** 2).mean(), rtol=1e-5)
    np.testing.assert_allclose(
        mean_squared_error(jnp.asarray(predictions), jnp.asarray(targets), jnp.asarray(weights)),
        ((predictions - targets) ** 2)[weights == 1].mean(), rtol=1e-5)
