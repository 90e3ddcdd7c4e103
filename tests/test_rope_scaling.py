"""RoPE scaling (RopeScaling in lm/layers/positions.py, the model.rope_* options): each kind's frequencies against
a reference written channel by channel from its formula, and the properties that define it (linear divides the
positions, ntk changes the base keeping the fastest channel, YaRN keeps the fast channels, interpolates the slow
ones and scales the scores by its attention factor squared, Llama 3.1 splits by wavelength); KV-cache decoding;
Hugging Face Llama folders with scaled RoPE (Llama 3.1's llama3 and a YaRN config, made by transformers with
tests/fixtures/hf/make_fixtures.py): transformers' logits within 1e-4 and its greedy tokens, and an export whose
config.json holds the folder's RoPE parameters; what lm cannot run is one line."""

import functools
import json
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm.decode.generate import generate
from lm.errors import UserError
from lm.hf import llama
from lm.hf.export import export
from lm.hf.source import HFSource, following
from lm.layers.attention import MultiHeadAttention
from lm.layers.options import check_declared
from lm.layers.positions import RopeScaling, apply_rope, rope_frequencies
from lm.models.config import transformer_config, transformer_options
from tests.test_hf import FIXTURES, TOLERANCE, architecture, base_config, edited_folder, lm_outputs, load

RNG = np.random.default_rng(0)
SCALED_FIXTURES = ("llama31", "llama_yarn")


def reference(head_dim: int, base: float, s: RopeScaling) -> tuple[list[float], float]:
    """(theta_i for i < head_dim / 2, the factor on cos and sin), one channel at a time in float64 from the formulas
    of Chen et al. (linear), bloc97 (NTK-aware), Peng et al. (YaRN, its ramp over the channel index as in
    transformers) and Llama 3.1."""
    kind, factor, context = s.kind, s.factor, s.original_context
    if kind == "ntk":
        base *= factor ** (head_dim / (head_dim - 2))
    thetas = [base ** (-2 * i / head_dim) for i in range(head_dim // 2)]
    if kind == "linear":
        return [theta / factor for theta in thetas], 1.0
    if kind == "yarn":
        def channel(turns):  # the i at which context * theta_i / (2 pi) == turns
            return head_dim * math.log(context / (2 * math.pi * turns)) / (2 * math.log(base))

        low, high = channel(s.beta_fast), channel(s.beta_slow)
        if s.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        if low == high:
            high += 0.001
        scaled = []
        for i, theta in enumerate(thetas):
            share = min(max((i - low) / (high - low), 0.0), 1.0)  # of the interpolated frequency
            scaled.append((1 - share) * theta + share * theta / factor)
        return scaled, s.attention_factor or (0.1 * math.log(factor) + 1 if factor > 1 else 1.0)
    if kind == "llama3":
        scaled = []
        for theta in thetas:
            wavelength = 2 * math.pi / theta
            if wavelength < context / s.high_freq_factor:
                scaled.append(theta)
            elif wavelength > context / s.low_freq_factor:
                scaled.append(theta / factor)
            else:
                smooth = (context / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
                scaled.append((1 - smooth) * theta / factor + smooth * theta)
        return scaled, 1.0
    return thetas, 1.0


CASES = [
    (8, 10000.0, RopeScaling()),
    (8, 10000.0, RopeScaling("linear", 4.0)),
    (16, 500.0, RopeScaling("linear", 2.5)),
    (8, 10000.0, RopeScaling("ntk", 4.0)),
    (64, 500000.0, RopeScaling("ntk", 8.0)),
    (16, 10000.0, RopeScaling("yarn", 4.0, 2048, beta_fast=24.0, beta_slow=2.0)),
    (64, 10000.0, RopeScaling("yarn", 16.0, 4096)),  # transformers' defaults: beta 32 and 1
    (64, 150000.0, RopeScaling("yarn", 32.0, 4096, truncate=False, attention_factor=1.3)),  # gpt-oss style
    (16, 10000.0, RopeScaling("yarn", 4.0, 64, beta_fast=40.0, beta_slow=30.0)),  # a ramp of zero width
    (16, 10000.0, RopeScaling("yarn", 1.0, 2048)),  # factor 1: RoPE itself
    (16, 500000.0, RopeScaling("llama3", 8.0, 8192, low_freq_factor=1.0, high_freq_factor=4.0)),
    (128, 500000.0, RopeScaling("llama3", 32.0, 8192, low_freq_factor=1.0, high_freq_factor=4.0)),  # Llama 3.2
    (64, 10000.0, RopeScaling("llama3", 2.0, 512, low_freq_factor=2.0, high_freq_factor=16.0)),
]


@pytest.mark.parametrize("head_dim, base, scaling", CASES)
def test_the_frequencies_follow_each_formula(head_dim, base, scaling):
    theta, magnitude = rope_frequencies(head_dim, base, scaling)
    expected, expected_magnitude = reference(head_dim, base, scaling)
    assert theta.dtype == np.float32 and theta.shape == (head_dim // 2,)
    np.testing.assert_allclose(theta, expected, rtol=1e-6)
    assert magnitude == pytest.approx(expected_magnitude, rel=1e-12)


def test_linear_scaling_divides_the_positions():
    x, positions = jnp.asarray(RNG.standard_normal((2, 7, 3, 8)), jnp.float32), jnp.arange(7) * 5
    scaled = apply_rope(x, positions, 500.0, RopeScaling("linear", 4.0))
    np.testing.assert_allclose(scaled, apply_rope(x, positions / 4.0, 500.0), atol=1e-5)
    assert not np.allclose(scaled, apply_rope(x, positions, 500.0), atol=1e-2)


def test_ntk_is_rope_with_a_larger_base_keeping_the_fastest_channel_and_dividing_the_slowest():
    head_dim, base, factor = 16, 10000.0, 8.0
    theta, _ = rope_frequencies(head_dim, base, RopeScaling("ntk", factor))
    plain, _ = rope_frequencies(head_dim, base)
    np.testing.assert_array_equal(theta, rope_frequencies(head_dim, base * factor ** (16 / 14))[0])
    assert theta[0] == plain[0] == 1.0
    assert theta[-1] == pytest.approx(plain[-1] / factor, rel=1e-6)
    assert np.all(np.diff(theta / plain) < 0)  # ever more slowed down


def test_yarn_keeps_the_fast_channels_interpolates_the_slow_ones_and_scales_the_scores():
    """Without truncate, channels turning more than beta_fast times over the original context keep theta_i,
    those under beta_slow take theta_i / factor; q.k grows by the attention factor squared."""
    scaling = RopeScaling("yarn", 8.0, 1024, beta_fast=32.0, beta_slow=1.0, truncate=False)
    plain, _ = rope_frequencies(64, 10000.0)
    theta, magnitude = rope_frequencies(64, 10000.0, scaling)
    turns = 1024 * plain.astype(np.float64) / (2 * math.pi)
    np.testing.assert_allclose(theta[turns > 32], plain[turns > 32], rtol=1e-6)
    np.testing.assert_allclose(theta[turns < 1], plain[turns < 1] / 8, rtol=1e-6)
    between = (turns <= 32) & (turns >= 1)
    assert between.sum() >= 3 and np.all((theta[between] <= plain[between]) & (theta[between] >= plain[between] / 8))
    assert magnitude == pytest.approx(0.1 * math.log(8) + 1)
    q, k = (jnp.asarray(RNG.standard_normal((1, 1, 1, 64)), jnp.float32) for _ in range(2))
    position = jnp.array([0])  # no rotation: the magnitude alone
    score = jnp.sum(apply_rope(q, position, 10000.0, scaling) * apply_rope(k, position, 10000.0, scaling))
    assert float(score) == pytest.approx(float(jnp.sum(q * k)) * magnitude**2, rel=1e-5)


def test_llama3_splits_the_channels_by_wavelength():
    context, low, high, factor = 8192, 1.0, 4.0, 8.0
    scaling = RopeScaling("llama3", factor, context, low_freq_factor=low, high_freq_factor=high)
    plain, _ = rope_frequencies(128, 500000.0)
    theta, _ = rope_frequencies(128, 500000.0, scaling)
    wavelength = 2 * math.pi / plain.astype(np.float64)
    short, long = wavelength < context / high, wavelength > context / low
    assert short.sum() and long.sum() and (~short & ~long).sum()  # all three kinds occur
    np.testing.assert_array_equal(theta[short], plain[short])
    np.testing.assert_allclose(theta[long], plain[long] / factor, rtol=1e-6)
    assert np.all(np.diff(theta / plain) <= 1e-7)  # from 1 down to 1 / factor, never back up


@pytest.mark.parametrize("scaling", [RopeScaling("yarn", 4.0, 16, beta_fast=8.0), RopeScaling("llama3", 4.0, 16)])
def test_kv_cache_decoding_equals_full_attention_with_scaled_rope(scaling):
    x = jnp.asarray(RNG.standard_normal((2, 8, 16)), jnp.float32)
    layer = functools.partial(MultiHeadAttention, num_heads=2, num_kv_heads=1, head_dim=8, causal=True,
                              position="rope", kernel_init=nn.initializers.normal(0.5))  # scores far from uniform
    module = layer(rope_scaling=scaling)
    params = module.init(jax.random.key(0), x)["params"]
    full = module.apply({"params": params}, x)
    plain = layer()
    assert np.abs(full - plain.apply({"params": params}, x)).max() > 0.05 * np.abs(full).max()  # it is scaled
    cache = jax.tree.map(jnp.zeros_like, module.init(jax.random.key(0), x, cache_index=0)["cache"])
    outputs = []
    for start, stop in [(0, 3), (3, 4), (4, 8)]:
        y, variables = module.apply({"params": params, "cache": cache}, x[:, start:stop],
                                    cache_index=jnp.asarray(start), mutable=["cache"])
        cache = variables["cache"]
        outputs.append(y)
    np.testing.assert_allclose(jnp.concatenate(outputs, axis=1), full, atol=1e-5)


def test_the_options_reach_the_attention():
    model = transformer_config(transformer_options(
        position="rope", rope_scaling="yarn", rope_scaling_factor=4.0, rope_original_context=2048,
        rope_yarn_beta_fast=24.0, rope_yarn_beta_slow=2.0, rope_yarn_attention_factor=1.2, rope_yarn_truncate=False))
    assert model.rope == RopeScaling("yarn", 4.0, 2048, 24.0, 2.0, 1.2, False)
    model = transformer_config(transformer_options(position="rope", rope_scaling="llama3", rope_scaling_factor=8.0,
                                                   rope_original_context=8192, rope_llama3_high_freq_factor=8.0))
    assert model.rope == RopeScaling("llama3", 8.0, 8192, low_freq_factor=1.0, high_freq_factor=8.0)
    assert transformer_config(transformer_options()).rope == RopeScaling()


@pytest.mark.parametrize("overrides, message", [
    (dict(rope_scaling="linear", rope_scaling_factor=2.0),
     r"^model.rope_scaling=linear scales RoPE, and model.position=learned: use position=rope, or rope_scaling=none$"),
    (dict(position="rope", rope_scaling="yarn", rope_scaling_factor=2.0),
     r"^model.rope_scaling=yarn needs model.rope_original_context, the context length the model was trained on"),
    (dict(position="rope", rope_scaling="llama3", rope_scaling_factor=8.0),
     r"^model.rope_scaling=llama3 needs model.rope_original_context"),
    (dict(position="rope", rope_scaling_factor=2.0),
     r"^model.rope_scaling_factor=2.0 needs a model.rope_scaling \(linear, ntk, yarn, llama3\)"),
    (dict(position="rope", rope_scaling="yarn", rope_original_context=64, rope_yarn_beta_fast=1.0,
          rope_yarn_beta_slow=32.0), r"^model.rope_yarn_beta_fast=1.0 is below model.rope_yarn_beta_slow=32.0"),
    (dict(position="rope", rope_scaling="llama3", rope_original_context=64, rope_llama3_low_freq_factor=4.0),
     r"^model.rope_llama3_high_freq_factor=4.0 must exceed model.rope_llama3_low_freq_factor=4.0$"),
    (dict(position="rope", rope_scaling="ntk", num_heads=2, num_kv_heads=2, embed_dim=4),
     r"^model.rope_scaling=ntk changes the base by factor\^\(Dh/\(Dh-2\)\), and the head dimension is 2"),
    (dict(rope_scaling="dynamic"), r"^model.rope_scaling='dynamic': use one of \('none', 'linear', 'ntk', 'yarn'"),
])
def test_a_bad_combination_is_one_line(overrides, message):
    with pytest.raises(UserError, match=message) as raised:
        transformer_config(transformer_options(**overrides))
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("key, value", [("rope_scaling_factor", 0.5), ("rope_yarn_beta_slow", 0.0),
                                        ("rope_llama3_low_freq_factor", -1.0), ("rope_original_context", -1)])
def test_an_out_of_range_parameter_is_one_line(key, value):
    section = transformer_options(position="rope", rope_scaling="linear")
    section[key] = value
    with pytest.raises(UserError, match=rf"^model.{key}={value!r} is out of range: use "):
        check_declared(section, "model.")


@pytest.fixture(scope="module")
def loaded():
    """Each scaled fixture loaded once."""
    return {name: load(FIXTURES / name) for name in SCALED_FIXTURES}


@pytest.mark.parametrize("name", SCALED_FIXTURES)
def test_scaled_rope_folders_give_transformers_logits_and_greedy_tokens(loaded, name):
    """Llama 3.1's rope_parameters (factor 8 over 8192 positions, low 1, high 4: of 8 frequencies, 4 kept, one
    smoothed, 3 divided) and YaRN's (factor 4 over 2048, beta_fast 24, beta_slow 2: 3 kept, 2 on the ramp,
    3 interpolated, cos and sin times 1.139): transformers' fp32 logits within 1e-4, and its greedy continuation
    (decoding with the KV cache) token for token."""
    config, experiment, params, _ = loaded[name]
    fixture = json.loads((FIXTURES / name / "config.json").read_text())["rope_parameters"]
    assert config.model.rope_scaling == fixture["rope_type"]
    assert config.model.rope_scaling_factor == fixture["factor"]
    arrays = dict(np.load(FIXTURES / name / "expected.npz"))
    logits = lm_outputs(experiment, params, arrays, architecture(FIXTURES / name))
    np.testing.assert_allclose(logits, arrays["expected"], atol=TOLERANCE, rtol=0)
    tokens = generate(experiment.model, params, arrays["prompt"].astype(np.int32),
                      arrays["greedy"].shape[1] - arrays["prompt"].shape[1], jax.random.key(0), temperature=0.0)
    np.testing.assert_array_equal(tokens, arrays["greedy"])


def test_the_fixtures_need_their_scaling(loaded):
    """Run as plain RoPE, the same weights miss transformers' logits by far more than the tolerance."""
    from experiments.language_model import LanguageModel

    for name in SCALED_FIXTURES:
        config, _, params, _ = loaded[name]
        config = config.copy_and_resolve_references()
        config.model.update(rope_scaling="none", rope_scaling_factor=1.0)
        arrays = dict(np.load(FIXTURES / name / "expected.npz"))
        logits = lm_outputs(LanguageModel(config, None), params, arrays, architecture(FIXTURES / name))
        assert np.abs(logits - arrays["expected"]).max() > 50 * TOLERANCE, name


@pytest.mark.parametrize("name", SCALED_FIXTURES)
def test_an_export_writes_the_folders_rope_parameters_back(loaded, tmp_path, name):
    config, _, params, _ = loaded[name]
    export(config, params, config.data.vocab_size, tmp_path / name)
    written = json.loads((tmp_path / name / "config.json").read_text())
    fixture = json.loads((FIXTURES / name / "config.json").read_text())["rope_parameters"]
    assert written["rope_parameters"] == fixture
    assert written["rope_scaling"] == {key: value for key, value in fixture.items() if key != "rope_theta"}
    assert written["rope_theta"] == fixture["rope_theta"]
    assert written["max_position_embeddings"] == round(fixture["factor"] * fixture["original_max_position_embeddings"])
    again = following(str(tmp_path / name), base_config("language_model"))
    assert {key: again.model[key] for key in again.model if key.startswith("rope")} == \
           {key: config.model[key] for key in config.model if key.startswith("rope")}


def test_an_ntk_run_exports_only_as_the_plain_rope_it_equals(loaded, tmp_path):
    """ntk is RoPE of base * factor^(Dh/(Dh-2)): the export names that run's flags, which give the same logits."""
    config, experiment, params, _ = loaded["llama_yarn"]
    config = config.copy_and_resolve_references()
    config.model.update(rope_scaling="ntk", rope_scaling_factor=4.0)
    base = 10000.0 * 4.0 ** (16 / 14)
    with pytest.raises(UserError, match=rf"LlamaForCausalLM needs model.rope_base={base!r} \(this run: 10000.0\), "
                                        r"model.rope_scaling=none \(this run: ntk\), model.rope_scaling_factor=1.0 "
                                        r"\(this run: 4.0\)$") as raised:
        export(config, params, config.data.vocab_size, tmp_path / "ntk")
    assert "\n" not in str(raised.value)
    from experiments.language_model import LanguageModel

    arrays = dict(np.load(FIXTURES / "llama_yarn" / "expected.npz"))
    ntk = lm_outputs(LanguageModel(config, None), params, arrays, "LlamaForCausalLM")
    config.model.update(rope_scaling="none", rope_scaling_factor=1.0, rope_base=base)
    np.testing.assert_allclose(lm_outputs(LanguageModel(config, None), params, arrays, "LlamaForCausalLM"), ntk,
                               atol=1e-5)


def test_transformers_4_configs_read_as_5s_and_its_parameter_rules_hold():
    """rope_scaling beside a top-level rope_theta (with 'type' for rope_type) reads as rope_parameters do; YaRN's
    factor from max_position_embeddings when absent, its attention factor from mscale / mscale_all_dim, the original
    context from a top-level original_max_position_embeddings first."""
    size = dict(hidden_size=32, num_attention_heads=2, intermediate_size=72, num_hidden_layers=2, vocab_size=150)
    parameters = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}
    new = llama.lm_fields({**size, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **parameters}})
    old = llama.lm_fields({**size, "rope_theta": 500000.0, "rope_scaling": {"type": "llama3", **parameters}})
    assert {key: value for key, (value, _) in new.items()} == {key: value for key, (value, _) in old.items()}
    assert new["model.rope_llama3_high_freq_factor"] == (4.0, "rope_parameters.high_freq_factor")
    assert old["model.rope_scaling"] == ("llama3", "rope_scaling.rope_type")
    yarn = llama.lm_fields({**size, "max_position_embeddings": 16384, "original_max_position_embeddings": 4096,
                            "rope_scaling": {"rope_type": "yarn", "mscale": 0.707, "mscale_all_dim": 1.0,
                                             "original_max_position_embeddings": 1024}})
    mscale = (0.1 * 0.707 * math.log(4) + 1) / (0.1 * math.log(4) + 1)
    assert yarn["model.rope_scaling_factor"][0] == 4.0 and yarn["model.rope_original_context"][0] == 4096
    assert yarn["model.rope_yarn_attention_factor"][0] == pytest.approx(mscale)
    assert (yarn["model.rope_yarn_beta_fast"][0], yarn["model.rope_yarn_beta_slow"][0]) == (32.0, 1.0)
    assert llama.lm_fields({**size, "rope_scaling": {"rope_type": "linear", "factor": 2.0}})["model.rope_base"] == (
        10000.0, "rope_theta")


@pytest.mark.parametrize("rope_parameters, message", [
    ({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 500.0},
     r"rope_type='dynamic', which lm cannot represent: transformers' dynamic NTK grows the base with each call's "
     r"sequence length; lm's rope_scaling=ntk is a fixed base \* factor\^\(Dh/\(Dh-2\)\)$"),
    ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0], "rope_theta": 500.0},
     r"rope_type='longrope', which lm cannot represent: lm scales RoPE as transformers' linear, yarn and llama3 do$"),
    ({"rope_type": "linear", "rope_theta": 500.0}, r"rope_parameters.factor=None, which lm cannot represent: "
                                                    r"rope_type=linear needs a factor$"),
])
def test_a_rope_type_lm_cannot_run_is_one_line(tmp_path, rope_parameters, message):
    folder = edited_folder(tmp_path, "llama", rope_parameters=rope_parameters)
    with pytest.raises(UserError, match=message) as raised:
        HFSource(str(folder), base_config("language_model"))
    assert "\n" not in str(raised.value)


def test_a_run_differing_from_the_folders_scaling_names_the_flags():
    config = following(str(FIXTURES / "llama31"), base_config("language_model"))
    config.model.update(rope_scaling="yarn", rope_llama3_high_freq_factor=2.0)
    with pytest.raises(UserError, match=r"model.rope_scaling=yarn \(config.json rope_parameters.rope_type=llama3\), "
                                        r"model.rope_llama3_high_freq_factor=2.0 \(config.json "
                                        r"rope_parameters.high_freq_factor=4.0\); run with "
                                        r"--config.model.rope_scaling=llama3 "
                                        r"--config.model.rope_llama3_high_freq_factor=4.0, or with"):
        HFSource(str(FIXTURES / "llama31"), config)
