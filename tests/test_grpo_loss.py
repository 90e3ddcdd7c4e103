"""lm/losses.py's GRPO family (group_advantages, k3_kl, policy_loss) against TRL's GRPOTrainer: fixtures written by
TRL itself (tests/fixtures/make_grpo_fixtures.py, in float64) and direct numpy formulas.

The functions run in float32, as in training. The fixtures' inputs are float32-representable, so the only
difference from TRL's float64 numbers is float32 rounding of O(1) values summed over at most 30 tokens (measured:
under 5e-8), well inside the 1e-6 tolerance, which a wrong normaliser, clip edge, std or KL term fails.
"""

from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm.losses import RL_LOSSES, group_advantages, k3_kl, policy_loss

FIXTURES = Path(__file__).parent / "fixtures" / "grpo"
LOSSES = dict(np.load(FIXTURES / "losses.npz"))
ADVANTAGES = dict(np.load(FIXTURES / "advantages.npz"))
CASES = range(len(LOSSES["loss"]))
METRICS = ("clip_ratio_low", "clip_ratio_high", "clip_ratio_region", "clip_ratio_low_min", "clip_ratio_high_max")
TOLERANCE = {"rtol": 0, "atol": 1e-6}


def case_id(case: int) -> str:
    fields = {key: LOSSES[key][case] for key in ("loss_type", "beta", "clip_high", "kl_weighted", "on_policy")}
    return ("{loss_type}-beta{beta}-clip0.2:{clip_high}" + "-kl_weighted" * bool(fields["kl_weighted"])
            + "-on_policy" * bool(fields["on_policy"])).format(**fields)


def f32(name: str) -> jax.Array:
    return jnp.asarray(LOSSES[name], jnp.float32)


def fixture_loss(case: int, logprobs: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """policy_loss with the case's settings, as the trainer would call it (no reference model when beta is 0)."""
    beta = float(LOSSES["beta"][case])
    return policy_loss(logprobs, None if LOSSES["on_policy"][case] else f32("old_logprobs"),
                       f32("ref_logprobs") if beta else None, f32("advantages"), f32("mask"),
                       str(LOSSES["loss_type"][case]), float(LOSSES["clip_low"][case]),
                       float(LOSSES["clip_high"][case]), beta, int(LOSSES["max_completion_length"]),
                       kl_importance_weighted=bool(LOSSES["kl_weighted"][case]))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_policy_loss_its_gradient_and_metrics_are_trls(case):
    (loss, metrics), grad = jax.value_and_grad(partial(fixture_loss, case), has_aux=True)(f32("logprobs"))
    np.testing.assert_allclose(loss, LOSSES["loss"][case], **TOLERANCE)
    np.testing.assert_allclose(grad, LOSSES["grad"][case], **TOLERANCE)
    for name in METRICS:
        np.testing.assert_allclose(metrics[name], LOSSES[name][case], **TOLERANCE, err_msg=name)
    if LOSSES["beta"][case]:
        np.testing.assert_allclose(metrics["kl"], LOSSES["kl"][case], **TOLERANCE)
    else:
        assert "kl" not in metrics


def test_the_fixtures_cover_every_loss_type_and_exercise_clipping():
    assert set(LOSSES["loss_type"]) == set(RL_LOSSES)
    assert LOSSES["clip_ratio_low"].max() > 0 and LOSSES["clip_ratio_high"].max() > 0
    assert (LOSSES["mask"].sum(1) == 0).any()  # an all-masked row


def test_the_loss_jits():
    jitted = jax.jit(fixture_loss, static_argnums=0)
    np.testing.assert_allclose(jitted(1, f32("logprobs"))[0], fixture_loss(1, f32("logprobs"))[0], rtol=1e-6)


@pytest.mark.parametrize("group_size", [4, 2, 1])
@pytest.mark.parametrize("scale_by_std", [True, False])
def test_group_advantages_are_trls_and_numpys(group_size, scale_by_std):
    rewards = ADVANTAGES["rewards"]
    advantages, metrics = group_advantages(jnp.asarray(rewards, jnp.float32), group_size, scale_by_std)
    expected = ADVANTAGES[f"advantages_g{group_size}_{'group' if scale_by_std else 'none'}"]
    np.testing.assert_allclose(advantages, expected, **TOLERANCE)
    groups = rewards.reshape(-1, group_size)
    centred = groups - groups.mean(1, keepdims=True)
    std = groups.std(1, ddof=1, keepdims=True) if group_size > 1 else np.zeros_like(groups[:, :1])
    np.testing.assert_allclose(advantages, (centred / (std + 1e-4) if scale_by_std else centred).ravel(), **TOLERANCE)
    np.testing.assert_allclose(metrics["frac_reward_zero_std"], ADVANTAGES[f"frac_reward_zero_std_g{group_size}"])
    np.testing.assert_allclose(metrics["reward"], ADVANTAGES["reward"], **TOLERANCE)
    np.testing.assert_allclose(metrics["reward_std"], ADVANTAGES["reward_std"], **TOLERANCE)


def test_group_advantages_reject_a_batch_of_partial_groups():
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(jnp.zeros(8), 3, True)


def test_k3_is_the_direct_formula_and_zero_where_policy_and_reference_agree():
    logprobs, ref = LOSSES["logprobs"], LOSSES["ref_logprobs"]
    np.testing.assert_allclose(k3_kl(f32("logprobs"), f32("ref_logprobs")),
                               np.exp(ref - logprobs) - (ref - logprobs) - 1, rtol=1e-5, atol=1e-7)
    assert float(jnp.min(k3_kl(f32("logprobs"), f32("ref_logprobs")))) >= 0
    np.testing.assert_array_equal(k3_kl(f32("logprobs"), f32("logprobs")), 0.0)


@pytest.mark.parametrize("loss_type", RL_LOSSES)
def test_on_policy_the_loss_is_minus_the_advantage_weighted_mean_and_its_gradient_minus_the_advantage(loss_type):
    """ratio 1 (old == logp) and no KL: every completion token's loss is -A, so each loss type's mean of -A."""
    advantages, mask, length = LOSSES["advantages"], LOSSES["mask"], 8
    tokens = mask.sum(1)
    normaliser = {"grpo": len(tokens) * np.maximum(tokens, 1), "dr_grpo": len(tokens) * length,
                  "dapo": tokens.sum()}[loss_type]  # per row or for all
    loss_fn = partial(policy_loss, ref_logprobs=None, advantages=f32("advantages"), mask=f32("mask"),
                      loss_type=loss_type, clip_low=0.2, clip_high=0.28, kl_beta=0.0, max_completion_length=length)
    loss, _ = loss_fn(f32("logprobs"), f32("logprobs"))
    np.testing.assert_allclose(loss, -np.sum(advantages * tokens / normaliser), rtol=1e-6)
    grad = jax.grad(lambda logprobs: loss_fn(logprobs, None)[0])(f32("logprobs"))
    expected = -advantages[:, None] * mask / (normaliser[:, None] if loss_type == "grpo" else normaliser)
    np.testing.assert_allclose(grad, expected, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("loss_type", RL_LOSSES)
@pytest.mark.parametrize("all_masked", [False, True], ids=["row 3 masked", "all masked"])
def test_all_masked_rows_and_batches_give_a_finite_loss_and_gradient(loss_type, all_masked):
    mask = f32("mask") * (not all_masked)

    def loss_of(logprobs):
        return policy_loss(logprobs, f32("old_logprobs"), f32("ref_logprobs"), f32("advantages"), mask,
                           loss_type, 0.2, 0.2, 0.04, 8)[0]

    loss, grad = jax.value_and_grad(loss_of)(f32("logprobs"))
    assert np.isfinite(loss) and np.isfinite(grad).all()
    np.testing.assert_array_equal(grad[3], 0.0)  # row 3 has no completion tokens


def test_an_unknown_loss_type_or_a_kl_without_reference_is_a_value_error():
    arguments = (f32("logprobs"), f32("old_logprobs"), None, f32("advantages"), f32("mask"))
    with pytest.raises(ValueError, match="unknown loss_type 'ppo'"):
        policy_loss(*arguments, "ppo", 0.2, 0.2, 0.0, 8)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        policy_loss(*arguments, "grpo", 0.2, 0.2, 0.04, 8)
