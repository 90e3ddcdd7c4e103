"""LoRA adapters as a peft folder: out (lm export --adapters) and in (init_from_adapters=DIR).

A peft LoRA folder holds adapter_config.json (r, lora_alpha, target_modules, ...) and
adapter_model.safetensors with, for each adapted module M of the base model (its Hugging Face name),
base_model.model.M.lora_A.weight (r, in) and base_model.model.M.lora_B.weight (out, r); peft adds
(lora_alpha / r) B A to M's weight (rank_pattern and alpha_pattern set r and lora_alpha per module).

The architecture's rules (lm/hf/gpt2.py, llama.py) pair the modules: a rule between M.weight and lm kernels
makes lm's projections of those kernels M's. lm's lora_a (in..., r) is A transposed, lora_b (r, out...) B
transposed; a difference in scale between the folder and the run (alpha / r) is folded into B.

GPT-2's c_attn is query, key and value fused along its output (one rule, three lm kernels). lm adapts the
three apart, and k of them (k adapters of rank r) are exactly one adapter of rank k r on c_attn: A the k A's
stacked, B block-diagonal. The export writes that, with rank_pattern and alpha_pattern giving c_attn rank
k r and alpha k alpha (the same scale). Read back, a c_attn adapter of rank k r in that block form gives
the k adapters again, and one of rank r (peft's own, trained on c_attn) gives each of them its A and its
rows of B; any other rank, or a change to a projection the run's targets leave out, is one error line. So is a
folder that disagrees with itself where peft would refuse or ignore it (weights of another rank than its r or
rank_pattern, of modules its target_modules leave out), and an adapter of a module that is no projection of lm's
Transformer (lm_head, the embeddings): peft can merge those into the base first.
"""

import dataclasses
import json
import math
import pathlib
import re

import jax
import ml_collections
import numpy as np
from flax import traverse_util
from safetensors.numpy import load_file

from lm.errors import UserError
from lm.hf import LANGUAGE_MODELS
from lm.hf.export import hf_architecture, unrolled
from lm.hf.files import save_safetensors
from lm.hf.mapping import Rule
from lm.layers.lora import TARGETS, LoraConfig
from lm.layers.options import from_section

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_R, PEFT_ALPHA = 8, 8  # peft's LoraConfig defaults, for an adapter_config.json without them
PREFIX = "base_model.model."  # peft's name of the wrapped model (a ...ForCausalLM, whose names follow)
TASK_TYPES = dict.fromkeys(LANGUAGE_MODELS, "CAUSAL_LM")  # lm experiment -> peft's task type


@dataclasses.dataclass(frozen=True)
class Projection:
    """A Hugging Face module and the lm projections its weight holds, in order along its output."""

    hf: str  # e.g. "model.layers.0.self_attn.q_proj"
    lm: tuple[str, ...]  # e.g. ("decoder/block_0/attention/query",)


def projections(rules: list[Rule]) -> list[Projection]:
    """Every module whose weight a rule maps to lm kernels: M.weight <-> one or several (fused) X/kernel."""
    return [Projection(rule.hf[0].removesuffix(".weight"), tuple(name.removesuffix("/kernel") for name in rule.lm))
            for rule in rules
            if len(rule.hf) == 1 and rule.hf[0].endswith(".weight") and all(n.endswith("/kernel") for n in rule.lm)]


def lora_options(config: ml_collections.ConfigDict) -> LoraConfig:
    return from_section(LoraConfig, config.model.get("lora") or {})


def architecture_projections(config: ml_collections.ConfigDict, vocab_size: int) -> tuple[dict, list[Projection]]:
    """(config.json of the architecture the run exports as, its projections); vocab_size: the model's vocabulary
    (a character-level run's is its tokenizer's, not in its config). A run of another experiment than a language
    model is a UserError."""
    if config.experiment not in TASK_TYPES:
        raise UserError(f"peft adapters are written and read for language models (GPT2LMHeadModel, "
                        f"LlamaForCausalLM); this run's experiment is {config.experiment}")
    module, hf = hf_architecture(config, vocab_size)
    return hf, projections(module.rules(hf, hf["architectures"][0], config))


def short_name(module: str) -> str:
    return module.rsplit(".", 1)[-1]


def peft_adapters(config: ml_collections.ConfigDict, params: dict, base_model: str | None,
                  vocab_size: int) -> tuple[dict, dict]:
    """(adapter_config.json, {tensor name: float32 array}) of the run's adapters (params: the run's, holding
    them); base_model: base_model_name_or_path (None for a base that is no Hugging Face model: the run's own);
    vocab_size: the model's vocabulary (the experiment's export_vocabulary)."""
    lora = lora_options(config)
    hf, found = architecture_projections(config, vocab_size)
    flat = traverse_util.flatten_dict(unrolled(jax.tree.map(np.asarray, params)), sep="/")  # on the host
    tensors, ranks, adapted_modules = {}, {}, []
    for projection in found:
        adapted = [name for name in projection.lm if f"{name}/lora_a" in flat]
        if not adapted:
            continue
        rank = lora.rank * len(adapted)
        a = np.concatenate([flat[f"{name}/lora_a"].reshape(-1, lora.rank).T for name in adapted])
        sizes = [flat[f"{name}/kernel"].size // a.shape[1] for name in projection.lm]
        b = np.zeros((sum(sizes), rank), np.float32)
        starts = np.cumsum([0, *sizes])
        for j, name in enumerate(adapted):
            i = projection.lm.index(name)
            b[starts[i]:starts[i + 1], j * lora.rank:(j + 1) * lora.rank] = \
                flat[f"{name}/lora_b"].reshape(lora.rank, -1).T
        tensors[f"{PREFIX}{projection.hf}.lora_A.weight"] = a.astype(np.float32)
        tensors[f"{PREFIX}{projection.hf}.lora_B.weight"] = b
        adapted_modules.append(projection.hf)
        if rank != lora.rank:
            ranks[short_name(projection.hf)] = rank
    if not tensors:
        raise UserError("this run has no adapters on a projection its Hugging Face architecture holds")
    every = [projection.hf for projection in found]
    targets = sorted({short_name(m) if all(n in adapted_modules for n in every if short_name(n) == short_name(m))
                      else m for m in adapted_modules})
    adapter_config = {
        "peft_type": "LORA", "task_type": TASK_TYPES[config.experiment], "base_model_name_or_path": base_model,
        "r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout, "target_modules": targets,
        "rank_pattern": ranks,
        "alpha_pattern": {name: lora.alpha * (rank // lora.rank) for name, rank in ranks.items()},
        "fan_in_fan_out": hf["model_type"] == "gpt2",  # GPT-2's Conv1D stores its weights (in, out)
        "bias": "none", "use_rslora": False, "use_dora": False, "modules_to_save": None, "init_lora_weights": True,
        "inference_mode": True, "layers_to_transform": None, "layers_pattern": None, "revision": None,
    }
    return adapter_config, tensors


def write_adapters(out: pathlib.Path, adapter_config: dict, tensors: dict[str, np.ndarray]) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    (out / ADAPTER_CONFIG).write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    save_safetensors({name: np.ascontiguousarray(value) for name, value in tensors.items()}, out / ADAPTER_WEIGHTS)
    return [ADAPTER_CONFIG, ADAPTER_WEIGHTS]


def pattern_value(pattern: dict, module: str, default):
    """peft's rank_pattern / alpha_pattern lookup: the first key that is the module's name or a dotted suffix
    of it (a regular expression, as peft reads it), else default."""
    return next((value for key, value in pattern.items() if re.match(rf"(.*\.)?({key})$", module)), default)


class PeftSource:
    """The adapters of a peft LoRA folder as lm parameters (lora_a, lora_b under this model's names, in the
    unrolled layout), for a run of config whose parameters are abstract_params: a ParamSource
    (lm/train/init_from.py). The folder is small: it is read, checked and mapped here, whole."""

    def __init__(self, directory: str, config: ml_collections.ConfigDict, abstract_params: dict):
        location = f"init_from_adapters={directory}"
        folder = pathlib.Path(directory).expanduser()
        if not (folder / ADAPTER_CONFIG).is_file() or not (folder / ADAPTER_WEIGHTS).is_file():
            raise UserError(f"{location}: a peft LoRA folder holds {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}; "
                            f"{folder} lacks them")
        settings = json.loads((folder / ADAPTER_CONFIG).read_text())
        unsupported = {"peft_type": (settings.get("peft_type"), "LORA"), "bias": (settings.get("bias", "none"), "none"),
                       "use_dora": (settings.get("use_dora", False), False)}
        for key, (value, wanted) in unsupported.items():
            if value != wanted:
                raise UserError(f"{location}: its {ADAPTER_CONFIG} has {key}={value!r}; lm reads LoRA adapters with "
                                f"{key}={wanted!r}")
        lora = lora_options(config)
        if not lora.rank:
            raise UserError(f"{location} needs adapters in this run: set --config.model.lora.rank "
                            f"(the folder's r is {settings.get('r')})")
        shapes = traverse_util.flatten_dict(jax.eval_shape(unrolled, abstract_params), sep="/")
        vocab_size = config.data.get("vocab_size") or shapes["token_embed/embedding"].shape[0]  # (no adapter reads it)
        _, found = architecture_projections(config, vocab_size)
        stored = load_file(folder / ADAPTER_WEIGHTS)
        modules = {name.removeprefix(PREFIX).rsplit(".lora_", 1)[0] for name in stored}
        check_targets(settings.get("target_modules"), modules, location)
        adaptable = [p for p in found if all(name.rsplit("/", 1)[-1] in TARGETS for name in p.lm)]
        others = sorted(modules - {projection.hf for projection in adaptable})
        if others:
            raise UserError(f"{location}: it adapts {', '.join(others[:3])}{' ...' if len(others) > 3 else ''}, "
                            f"which lm's LoRA does not adapt (it adapts the Transformer's projections: "
                            f"{', '.join(TARGETS)}); merge the folder's adapters into its base with peft "
                            "(merge_and_unload, then save_pretrained) and start from that folder (init_from=hf:DIR)")
        r, lora_alpha = settings.get("r", PEFT_R), settings.get("lora_alpha", PEFT_ALPHA)
        arrays = {}
        for projection in adaptable:
            if projection.hf not in modules:
                continue
            a, b = (stored[f"{PREFIX}{projection.hf}.lora_{x}.weight"].astype(np.float32) for x in "AB")
            rank = pattern_value(settings.get("rank_pattern") or {}, projection.hf, r)
            check_shapes(projection, a, b, rank, shapes, location)
            alpha = pattern_value(settings.get("alpha_pattern") or {}, projection.hf, lora_alpha)
            scale = alpha / (math.sqrt(rank) if settings.get("use_rslora") else rank)
            arrays.update(adapters_of(projection, a, b, scale / lora.scale, lora.rank, shapes, location))
        self.arrays = traverse_util.unflatten_dict(arrays, sep="/")
        self.description = f"{location} (peft LoRA, r={r})"

    def abstract_params(self) -> dict:
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), self.arrays)

    def load_params(self, shardings: dict) -> dict:
        return jax.tree.map(jax.device_put, self.arrays, shardings)


def target_matches(target_modules: list[str] | str, module: str) -> bool:
    """Whether peft's target_modules name module: a regular expression matching the whole name, 'all-linear', or
    a list of names each equal to the module's or a dotted suffix of it."""
    if isinstance(target_modules, str):
        return target_modules == "all-linear" or re.fullmatch(target_modules, module) is not None
    return any(module == name or module.endswith(f".{name}") for name in target_modules)


def check_targets(target_modules: list[str] | str | None, modules: set[str], location: str) -> None:
    """Every module the folder's weights adapt is one its target_modules name (peft ignores the others'
    weights); else a UserError naming both. A folder without target_modules (peft fills them in) is not checked."""
    if target_modules is None:
        return
    left_out = sorted(module for module in modules if not target_matches(target_modules, module))
    if left_out:
        raise UserError(f"{location}: its {ADAPTER_WEIGHTS} adapts {', '.join(left_out[:3])}"
                        f"{' ...' if len(left_out) > 3 else ''}, which its {ADAPTER_CONFIG}'s target_modules="
                        f"{target_modules!r} leave out (peft would not load those weights); fix one to fit the other")


def check_shapes(projection: Projection, a: np.ndarray, b: np.ndarray, rank: int, shapes: dict,
                 location: str) -> None:
    """A module's lora_A (r, in) and lora_B (out, r) agree with the r its adapter_config.json gives it (r, or
    its rank_pattern) and with the module's weight (out x in); else a UserError naming both values."""
    module = projection.hf
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
        raise UserError(f"{location}: its adapter of {module} has lora_A {a.shape} and lora_B {b.shape}; peft's are "
                        "(r, in) and (out, r)")
    if a.shape[0] != rank:
        raise UserError(f"{location}: its {ADAPTER_CONFIG} gives {module} r={rank}, its weights have rank "
                        f"{a.shape[0]} (lora_A {a.shape}); peft refuses such a folder: set r (or its rank_pattern) "
                        f"to {a.shape[0]}")
    weight = sum(math.prod(shapes[f"{name}/kernel"].shape) for name in projection.lm)
    if a.shape[1] * b.shape[0] != weight:
        raise UserError(f"{location}: its adapter of {module} is for a {b.shape[0]} x {a.shape[1]} weight; this "
                        f"model's {module} has {weight:,} entries (is the folder for another base model?)")


def adapters_of(projection: Projection, a: np.ndarray, b: np.ndarray, ratio: float, rank: int, shapes: dict,
                location: str) -> dict[str, np.ndarray]:
    """{lm name: array} of the lora_a and lora_b of the lm projections a module's adapter a (R, in), b (out, R)
    holds (see the module docstring); ratio: the folder's scale over the run's, folded into lora_b."""
    module = projection.hf
    adapted = [name for name in projection.lm if f"{name}/lora_a" in shapes]
    sizes = [math.prod(shapes[f"{name}/kernel"].shape) // a.shape[1] for name in projection.lm]
    starts = np.cumsum([0, *sizes])
    rows = {name: slice(starts[i], starts[i + 1]) for i, name in enumerate(projection.lm)}
    for name in projection.lm:
        if name not in adapted and np.any(b[rows[name]]):
            target = name.rsplit("/", 1)[-1]
            raise UserError(f"{location}: its adapter of {module} changes lm's {target} projection, which "
                            f"model.lora.targets leave out; add {target!r} to them")
    k, folder_rank = len(adapted), a.shape[0]
    def off_block(j: int, name: str) -> np.ndarray:  # name's rows of b outside the j-th block of rank columns
        return np.delete(b[rows[name]], np.s_[j * rank:(j + 1) * rank], axis=1)

    if folder_rank == rank:
        pieces = {name: (a, b[rows[name]]) for name in adapted}
    elif folder_rank == k * rank and not any(np.any(off_block(j, name)) for j, name in enumerate(adapted)):
        pieces = {name: (a[j * rank:(j + 1) * rank], b[rows[name], j * rank:(j + 1) * rank])
                  for j, name in enumerate(adapted)}
    else:
        fits = f"--config.model.lora.rank={folder_rank}" + (f" (or {folder_rank // k}, lm's export of {k} fused "
                                                             "projections)" if k > 1 and folder_rank % k == 0 else "")
        raise UserError(f"{location}: its adapter of {module} has rank {folder_rank}, this run's model.lora.rank is "
                        f"{rank}; run with {fits}")
    arrays = {}
    for name, (piece_a, piece_b) in pieces.items():
        arrays[f"{name}/lora_a"] = piece_a.T.reshape(shapes[f"{name}/lora_a"].shape)
        arrays[f"{name}/lora_b"] = (piece_b.T * ratio).reshape(shapes[f"{name}/lora_b"].shape)
    return arrays


class WithAdapters:
    """A ParamSource: base's parameters with those of adapters (a PeftSource) added, or put in place of base's."""

    def __init__(self, base, adapters: PeftSource):
        self.base, self.adapters = base, adapters
        self.description = f"{base.description} with the adapters of {adapters.description}"

    def abstract_params(self) -> dict:
        return merge(self.base.abstract_params(), self.adapters.abstract_params())

    def load_params(self, shardings: dict) -> dict:
        def part(source):
            names = traverse_util.flatten_dict(source.abstract_params(), sep="/")
            flat = traverse_util.flatten_dict(shardings, sep="/")
            return traverse_util.unflatten_dict({name: flat[name] for name in names}, sep="/")

        return merge(self.base.load_params(part(self.base)), self.adapters.load_params(part(self.adapters)))


def merge(tree: dict, added: dict) -> dict:
    """tree with added's leaves put in (nested dicts)."""
    flat = traverse_util.flatten_dict(tree, sep="/")
    flat.update(traverse_util.flatten_dict(added, sep="/"))
    return traverse_util.unflatten_dict(flat, sep="/")
