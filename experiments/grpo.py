"""Online reinforcement learning with verifiable rewards: GRPO (DeepSeekMath), Dr. GRPO and DAPO, on a GPT
(language_model's) from its starting parameters (init_from: an SFT run, or hf:DIR) (configs/grpo.py).

Prompts: the records of data.source (any source of the data layer), each its data.prompt_field as the user's
message, rendered by the chat template (data.chat_template) with the assistant's turn opened and tokenised with
data.tokenizer; the record's fields (data.prompt_field and data.answer_field) reach the reward functions. The
held-out prompts: data.val_source's, or the last data.val_fraction of source's.

A step (Experiment.rollout, on the host between the jitted train steps; the trainer's loop calls it):
  1. the batch's train.batch_size prompts, each repeated rl.group_size (G) times, are sampled with the KV cache
     (lm/decode/rollout.py: temperature, top-k, top-p, up to rl.max_new_tokens tokens, ending at the end-of-text
     id), with the key fold_in(seed's sampling key, step): a resumed run samples what the first attempt did;
  2. the completions (text, cut after the first of rl.stop's strings) are scored by rl.rewards (lm/rewards.py), the
     weighted sum of the functions' values each completion's reward;
  3. advantages: each reward minus its group's mean, divided by the group's std (+1e-4) except under dr_grpo
     (lm/losses.py group_advantages);
  4. the rows prompt + completion (padded; the completion's tokens, its end-of-text id included, the only targets)
     go to the train step, with the sampling policy's log-probabilities of the completions when rl.inner_steps > 1
     and the reference's (the starting parameters') when rl.kl_beta > 0.
The train step then takes rl.inner_steps updates on those rows (train.steps_per_dispatch = rl.inner_steps: one
dispatch per batch of completions), each the clipped policy-gradient loss of rl.loss with the k3 KL penalty
(lm/losses.py policy_loss): ratios pi / pi_old of per-token log-probabilities at rl.temperature, as TRL's
GRPOTrainer computes them. The first update's pi_old is pi itself (the ratio 1, its gradient the policy
gradient's), so one inner step needs no second forward pass.

Logged each step (train): the loss, clip fractions and KL of the updates; the mean and std of each reward
(reward_<name>, reward_<name>_std) and of their sum (reward, reward_std: the mean std within groups), accuracy
(the `answer` reward's mean, where rl.rewards has it), completion lengths, the share of completions cut at
rl.max_new_tokens, sampling tokens/s and the seconds a rollout takes; the trainer adds tokens/s overall and of the
train step alone. Every evaluation decodes eval.num_prompts held-out prompts greedily and scores them
(heldout_accuracy, heldout_reward, ...), writing them to completions/step_<N>.jsonl; after training every
held-out prompt is (val_accuracy, ...; completions.jsonl).

The reference for rl.kl_beta > 0 is a copy of the step-0 parameters (with LoRA, the whole model: the base and the
adapters as they started), kept on the devices and saved in the run folder (REFERENCE_FILE) for a resumed run.
"""

import dataclasses
import functools
import itertools
import json
import pathlib
import sys
import time

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.language_model import LanguageModel, post_training_data
from experiments.sft import from_workdir, saved_template  # noqa: F401 (from_workdir: a run samples, exports as SFT)
from lm import rewards as reward_functions
from lm import runs, sharding
from lm.data import bpe, chat, sources
from lm.decode.rollout import sample_completions
from lm.distributed import host_local, is_primary
from lm.errors import UserError
from lm.layers.options import left_at_default
from lm.losses import cross_entropy, group_advantages, moe_objective, policy_loss
from lm.models.gpt import flops_per_token
from lm.train.experiment import Evaluator

REFERENCE_FILE = "reference_params.npz"  # in the run folder: the starting parameters, for rl.kl_beta > 0
COMPLETIONS_DIR = "completions"  # in the run folder: the held-out completions of each evaluation, step_<N>.jsonl
SAMPLING_STREAM = 1  # the sampling keys' stream: fold_in(key(seed), 1), apart from the train step's dropout keys
STD_SCALED = {"grpo": True, "dr_grpo": False, "dapo": True}  # rl.loss -> advantages divided by the group's std


@dataclasses.dataclass(frozen=True)
class Prompts:
    """N prompts: ids (N, P) int32 right-padded with zeros, lengths (N,) int32, their rendered texts and their
    records (the fields the reward functions get), and where each came from (a source's record name)."""

    ids: np.ndarray
    lengths: np.ndarray
    texts: list[str]
    records: list[dict[str, str]]
    where: list[str]


def record_fields(data: ml_collections.ConfigDict) -> sources.Fields:
    answer = {"data.answer_field": data.answer_field} if data.answer_field else {}
    return {"data.prompt_field": data.prompt_field, **answer}


def read_prompts(source: sources.Source, data: ml_collections.ConfigDict, template: chat.ChatTemplate,
                 tokenizer: bpe.BPETokenizer, room: int) -> Prompts:
    """The prompts of source's records (its first data.max_records), rendered and tokenised; one that renders to
    no token or to more than room tokens (the context less rl.max_new_tokens) is a UserError naming it, or with
    data.skip_bad_records skipped, counted and printed."""
    names = list(record_fields(data).values())
    read = list(itertools.islice(source, data.max_records or None))
    texts, failed = [], {}
    for row, (_, values) in enumerate(read):
        try:
            texts.append(template.render(chat.pair_messages(values[0], "")[:1], add_generation_prompt=True))
        except Exception as e:  # noqa: BLE001 (a template fails with whatever its expressions raise)
            texts.append("")
            failed[row] = f"data.chat_template={template.name} fails on it ({type(e).__name__}: {e})"
    ids = tokenizer.encode_batch(texts) if texts else []
    kept, skipped, first = [], 0, None
    for row, ((where, values), text, prompt) in enumerate(zip(read, texts, ids, strict=True)):
        problem = failed.get(row) or (None if len(prompt) else "its prompt renders to no token") or (
            None if len(prompt) <= room else f"its prompt is {len(prompt)} tokens, more than the {room} that "
            "data.context_length leaves beside rl.max_new_tokens: raise data.context_length or lower "
            "rl.max_new_tokens")
        if problem is None:
            kept.append((where, dict(zip(names, values, strict=True)), text, prompt))
            continue
        if not data.skip_bad_records:
            raise UserError(f"{source.name}: {where}: {problem}; {sources.SKIP_HINT}")
        skipped, first = skipped + 1, first or f"{where}: {problem}"
    if first:
        print(f"warning: skipped {skipped} prompts of {source.name} (the first: {first})", file=sys.stderr)
    if not kept:
        raise UserError(f"{source.name} gives no prompt: check data.source and data.prompt_field")
    width = max(len(prompt) for *_, prompt in kept)
    padded = np.zeros((len(kept), width), np.int32)
    for row, (*_, prompt) in enumerate(kept):
        padded[row, :len(prompt)] = prompt
    return Prompts(padded, np.array([len(p) for *_, p in kept], np.int32), [t for _, _, t, _ in kept],
                   [r for _, r, _, _ in kept], [w for w, *_ in kept])


def tempered_logprobs(temperature: float, logits: jax.Array, targets: jax.Array) -> jax.Array:
    """log softmax(logits / temperature)[target] (B, T): the sampling policy's log-probabilities (TRL's)."""
    return -cross_entropy(logits.astype(jnp.float32) / temperature, targets)


def cut_at_stop(tokenizer: bpe.BPETokenizer, ids: np.ndarray, stops: tuple[str, ...]) -> tuple[str, int]:
    """(the completion's text, its tokens kept): ids (n,) decoded, cut after the first of stops; the tokens kept are
    the fewest whose text holds that stop string (a binary search over prefixes: log n decodes)."""
    text = tokenizer.decode(ids)
    found = [(text.find(stop) + len(stop), stop) for stop in stops if stop and stop in text]
    if not found:
        return text, len(ids)
    end, stop = min(found)
    low, high = 1, len(ids)  # the fewest tokens whose text holds the stop string: in (low - 1, high]
    while low < high:
        middle = (low + high) // 2
        if stop in tokenizer.decode(ids[:middle]):
            high = middle
        else:
            low = middle + 1
    return text[:end], high


class GRPO(LanguageModel):
    """The language model trained on its own scored completions (module docstring): prompts {"train": Prompts,
    "val": Prompts}; rewards: lm.rewards's parsed rl.rewards; workdir: the run folder (None outside a run)."""

    def __init__(self, config: ml_collections.ConfigDict, tokenizer: bpe.BPETokenizer, template: chat.ChatTemplate,
                 prompts: dict[str, Prompts], rewards: list, workdir: pathlib.Path | None):
        super().__init__(config, tokenizer, chat_template=template)
        self.prompts, self.rewards, self.workdir = prompts, rewards, workdir
        rl = config.rl
        self.width = prompts["train"].ids.shape[1] + rl.max_new_tokens  # a row: the longest prompt + a completion
        self.units_per_example = rl.group_size * (self.width - 1)  # tokens trained per prompt
        self.reference = None  # the starting parameters (rl.kl_beta > 0): prepare() or REFERENCE_FILE
        self.step = None  # the step of the params the evaluators see: the last rollout's end (None: no training)
        sample = functools.partial(sample_completions, self.model, max_new_tokens=rl.max_new_tokens,
                                   top_k=rl.top_k, top_p=rl.top_p, end_id=tokenizer.end_of_text_id)
        self.sample_policy = functools.partial(sample, temperature=rl.temperature)
        self.sample_greedy = functools.partial(sample, temperature=0.0, rng=jax.random.key(0))
        self.score_rows = jax.jit(self.token_logprobs)

    def token_logprobs(self, params, batch) -> jax.Array:
        """The log-probabilities (N, T) of the rows' targets at rl.temperature, in eval mode."""
        return self.model.apply({"params": params}, batch["inputs"], targets=batch["targets"],
                                logits_reduce=functools.partial(tempered_logprobs, self.config.rl.temperature))

    def loss(self, params, batch, rng, train: bool):
        rl = self.config.rl
        logprobs, collections = self.model.apply(
            {"params": params}, batch["inputs"], train=train, targets=batch["targets"], rngs={"dropout": rng},
            mutable=["moe"], logits_reduce=functools.partial(tempered_logprobs, rl.temperature))  # (N, T)
        # Without old_logprobs (one inner step) pi_old is pi itself, its gradient stopped.
        loss, metrics = policy_loss(logprobs, batch.get("old_logprobs"), batch.get("ref_logprobs"),
                                    batch["advantages"], batch["weights"], rl.loss, rl.clip_low, rl.clip_high,
                                    rl.kl_beta, rl.max_new_tokens, kl_importance_weighted=rl.kl_importance_weighted)
        moe = self.model.config.transformer.moe
        aux_loss, moe_metrics = moe_objective(collections.get("moe", {}), moe.load_balance_weight, moe.router_z_weight)
        return loss + aux_loss, {**metrics, "policy_loss": loss, **moe_metrics}

    def train_data(self, batch_size: int, seed: int, shard: tuple[int, int], start_step: int):
        """Endless batches of prompts: each prompt once per epoch, shuffled; the steps of one rollout (rl.inner_steps
        of them) get the same batch. Rows: prompt (B, P) int32, prompt_length (B,) int32, record (B,) int32 (the
        prompt's index)."""
        index, count = shard
        prompts, inner = self.prompts["train"], self.config.rl.inner_steps
        order = grain.MapDataset.range(len(prompts.ids)).shuffle(seed=seed).repeat()
        rollouts = order.batch(batch_size * count, drop_remainder=True)  # prompt indices (B * count,) each

        def rows(step: int) -> dict[str, np.ndarray]:
            chosen = rollouts[step // inner][index * batch_size:(index + 1) * batch_size]
            return {"prompt": prompts.ids[chosen], "prompt_length": prompts.lengths[chosen],
                    "record": chosen.astype(np.int32)}

        return grain.MapDataset.range(start_step, sys.maxsize).map(rows).to_iter_dataset()

    def batch_variants(self, batch):
        """The rows of prompt x group_size completions the train step gets (rollout) from a batch of prompts."""
        rl, prompt = self.config.rl, batch["prompt"]
        rows, length = prompt.shape[0] * rl.group_size, self.width - 1

        def shaped(shape, dtype):
            return jax.ShapeDtypeStruct(shape, dtype, sharding=prompt.sharding)

        variant = {"inputs": shaped((rows, length), jnp.int32), "targets": shaped((rows, length), jnp.int32),
                   "weights": shaped((rows, length), jnp.float32), "advantages": shaped((rows,), jnp.float32)}
        variant.update({key: shaped((rows, length), jnp.float32) for key in self.logprob_keys()})
        return [variant]

    def logprob_keys(self) -> list[str]:
        """The log-probabilities a rollout adds to its rows: the sampling policy's for inner steps after the first,
        the reference's for the KL penalty."""
        rl = self.config.rl
        return (["old_logprobs"] if rl.inner_steps > 1 else []) + (["ref_logprobs"] if rl.kl_beta > 0 else [])

    def completions(self, params, prompts: Prompts, indices: np.ndarray, rng: jax.Array | None,
                    repeat: int = 1) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
        """Completions of the prompts at indices, each repeat times, sampled (rng) or greedy (None): (tokens (N, W),
        completion mask (N, W): 1 on the completion's tokens up to its end or stop string, texts, token counts)."""
        ids = np.repeat(prompts.ids[indices], repeat, axis=0)  # (N, width - max_new_tokens): both splits' width
        lengths = np.repeat(prompts.lengths[indices], repeat)
        if rng is None:
            tokens, mask = self.sample_greedy(params, ids, lengths)
        else:
            tokens, mask = self.sample_policy(params, ids, lengths, rng=rng)
        tokens, mask = (np.array(x) for x in jax.device_get(host_local((tokens, mask))))
        texts, counts = [], np.zeros(len(tokens), np.int32)
        end = self.tokenizer.end_of_text_id
        for row in range(len(tokens)):
            start = lengths[row]
            completion = tokens[row, start:start + int(mask[row].sum())]
            body = completion[:-1] if len(completion) and completion[-1] == end else completion  # the text's tokens
            text, kept = cut_at_stop(self.tokenizer, body, tuple(self.config.rl.stop))
            if kept < len(body):
                mask[row, start + kept:] = 0  # the tokens after the stop string are not the policy's to answer for
            texts.append(text)
            counts[row] = int(mask[row].sum())
        return tokens, mask, texts, counts

    def scored(self, prompts: Prompts, indices: np.ndarray, texts: list[str], repeat: int
               ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(each completion's reward (N,), each reward function's values (N,) by name)."""
        rows = np.repeat(indices, repeat)
        return reward_functions.score(self.rewards, [prompts.texts[i] for i in rows], texts,
                                      [prompts.records[i] for i in rows])

    def rollout(self, params, batches, step: int):
        """Samples, scores and lays out the completions of the batch's prompts (module docstring); the same rows for
        every step of the dispatch (train.steps_per_dispatch = rl.inner_steps)."""
        rl, mesh = self.config.rl, batches[0]["prompt"].sharding.mesh
        jax.block_until_ready(params)  # (the previous dispatch's time is not the rollout's)
        start = time.perf_counter()
        indices = np.asarray(jax.device_get(host_local(batches[0]["record"])))
        rng = jax.random.fold_in(jax.random.fold_in(jax.random.key(self.config.seed), SAMPLING_STREAM), step)
        tokens, mask, texts, counts = self.completions(params, self.prompts["train"], indices, rng, rl.group_size)
        sampled = time.perf_counter()
        total, values = self.scored(self.prompts["train"], indices, texts, rl.group_size)
        advantages, group_metrics = group_advantages(jnp.asarray(total, jnp.float32), rl.group_size,
                                                     STD_SCALED[rl.loss])
        rows = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": mask[:, 1:],
                "advantages": np.asarray(advantages, np.float32)}
        placed = sharding.place_batch(rows, mesh)
        for key in self.logprob_keys():  # laid out as the train step takes its rows
            scored = self.score_rows(self.reference_params(params) if key == "ref_logprobs" else params, placed)
            placed[key] = jax.device_put(scored, sharding.batch_sharding(mesh))
        metrics = {**reward_metrics(total, values, rl.group_size), **completion_metrics(counts, rl.max_new_tokens),
                   "frac_reward_zero_std": float(group_metrics["frac_reward_zero_std"]),
                   "sample_tokens_per_second": float(mask.sum()) / (sampled - start),
                   "rollout_seconds": time.perf_counter() - start}
        self.step = step + len(batches)
        return (placed,) * len(batches), metrics

    def reference_params(self, params):
        """The starting parameters, in params' shardings: prepare()'s copy, or REFERENCE_FILE's (a resumed run)."""
        if self.reference is None:
            path = self.workdir / REFERENCE_FILE if self.workdir else None
            if path is None or not path.is_file():
                raise UserError(f"{path} is missing: it holds the starting parameters that rl.kl_beta > 0 keeps the "
                                "policy near (written when the run started); start the run again in a new --workdir")
            with np.load(path) as saved:
                leaves = jax.tree_util.tree_leaves_with_path(params)
                self.reference = jax.tree.unflatten(jax.tree.structure(params), [
                    jax.device_put(saved[jax.tree_util.keystr(key)], leaf.sharding) for key, leaf in leaves])
        return self.reference

    def prepare(self, params, workdir: pathlib.Path) -> None:
        """With rl.kl_beta > 0: the step-0 params copied as the reference, and saved in workdir (REFERENCE_FILE)."""
        self.step = 0  # (training starts: the evaluators write their completions)
        if self.config.rl.kl_beta <= 0:
            return
        self.reference = jax.tree.map(jnp.copy, params)
        local = jax.device_get(host_local(params))
        if is_primary():
            arrays = {jax.tree_util.keystr(key): leaf for key, leaf in jax.tree_util.tree_leaves_with_path(local)}
            runs.write_arrays(workdir / REFERENCE_FILE, arrays)

    def eval_data(self):
        return []  # the held-out prompts are decoded and scored by the heldout evaluator

    def evaluators(self) -> list[Evaluator]:
        prompts = self.prompts["val"]
        shown = np.arange(min(self.config.eval.num_prompts, len(prompts.ids)))
        def out() -> pathlib.Path | None:  # during training: the completions of the params of self.step
            return None if self.step is None else self.workdir / COMPLETIONS_DIR / f"step_{self.step}.jsonl"

        return [Evaluator("heldout", self.config.eval.every, lambda params: self.held_out(params, shown, out()))]

    def held_out(self, params, indices: np.ndarray, out: pathlib.Path | None) -> dict[str, float]:
        """The greedy completions of the held-out prompts at indices scored (accuracy, reward, reward_<name>,
        completion_length), eval.batch_size prompts at a time; written to out (JSON lines) when given."""
        prompts, size = self.prompts["val"], self.config.eval.batch_size
        texts, counts = [], []
        for start in range(0, len(indices), size):
            chosen = indices[start:start + size]
            filled = np.resize(chosen, size)  # a full batch: one compiled shape
            _, _, batch_texts, batch_counts = self.completions(params, prompts, filled, None)
            texts += batch_texts[:len(chosen)]
            counts.append(batch_counts[:len(chosen)])
        total, values = self.scored(prompts, indices, texts, 1)
        if out is not None and is_primary():
            out.parent.mkdir(parents=True, exist_ok=True)
            lines = [json.dumps({"where": prompts.where[i], "prompt": prompts.texts[i], "completion": text,
                                 "reward": float(total[row]), **{k: float(v[row]) for k, v in values.items()}})
                     for row, (i, text) in enumerate(zip(indices, texts, strict=True))]
            runs.write_whole(out, "".join(line + "\n" for line in lines))
        counts = np.concatenate(counts)
        return {**{k: v for k, v in reward_metrics(total, values, 1).items() if not k.endswith("_std")},
                "completion_length": float(counts.mean())}

    def final_results(self, params, evaluate, workdir: pathlib.Path) -> dict[str, float]:
        """Every held-out prompt decoded greedily and scored: val_accuracy, val_reward, ...; completions.jsonl."""
        del evaluate  # (no loss pass: the scores are the rewards')
        everything = np.arange(len(self.prompts["val"].ids))
        return {f"val_{k}": v for k, v in self.held_out(params, everything, workdir / "completions.jsonl").items()}

    def flops_per_example(self, active_params: int) -> float:
        """The train step's: a prompt's group_size rows, forward and backward (the sampling is not counted)."""
        return self.units_per_example * flops_per_token(self.model.config, active_params)


def reward_metrics(total: np.ndarray, values: dict[str, np.ndarray], group_size: int) -> dict[str, float]:
    """reward (the mean), reward_std (the mean std within groups: how much a group has to learn from), and of each
    function reward_<name> and reward_<name>_std; accuracy: the `answer` reward's mean, where there is one."""
    metrics = {"reward": float(total.mean()), "reward_std": float(total.reshape(-1, group_size).std(axis=1).mean())}
    for name, value in values.items():
        metrics.update({f"reward_{name}": float(value.mean()), f"reward_{name}_std": float(value.std())})
    if reward_functions.ACCURACY in values:
        metrics["accuracy"] = float(values[reward_functions.ACCURACY].mean())
    return metrics


def completion_metrics(counts: np.ndarray, max_new_tokens: int) -> dict[str, float]:
    """The completions' mean, min and max length in tokens, and the share cut at max_new_tokens."""
    return {"completion_length": float(counts.mean()), "completion_length_min": float(counts.min()),
            "completion_length_max": float(counts.max()), "truncated": float((counts >= max_new_tokens).mean())}


def checked(config: ml_collections.ConfigDict) -> None:
    """What the config's options cannot say alone: one dispatch per rollout, and intervals that fall on them."""
    rl, t = config.rl, config.train
    if t.steps_per_dispatch != rl.inner_steps:
        raise UserError(f"train.steps_per_dispatch={t.steps_per_dispatch} must equal rl.inner_steps={rl.inner_steps} "
                        f"(one dispatch per batch of completions): pass --config.train.steps_per_dispatch="
                        f"{rl.inner_steps}")
    intervals = {"train.num_steps": t.num_steps, "train.log_every": t.log_every,
                 "train.checkpoint_every": t.checkpoint_every, "eval.every": max(config.eval.every, 0)}
    for name, value in intervals.items():
        if value % rl.inner_steps:
            raise UserError(f"{name}={value} is not a multiple of rl.inner_steps={rl.inner_steps}: a rollout's "
                            "updates are not split; make it one")


def build(config: ml_collections.ConfigDict, workdir: pathlib.Path | None = None) -> GRPO:
    """The prompts of data.source (and of data.val_source, or else the last data.val_fraction of source's) read,
    rendered and tokenised; the reward functions imported."""
    config, tokenizer = post_training_data(config)  # (the run's config: init_from's tokenizer, its vocabulary)
    checked(config)
    d, rl = config.data, config.rl
    template = chat_template(config, tokenizer)
    rewards = reward_functions.parse_rewards(rl.rewards, settings=reward_settings(config))
    if not d.answer_field and any(reward.name == reward_functions.ACCURACY for reward in rewards):
        raise UserError(f"rl.rewards={rl.rewards}: the answer reward checks the record's data.answer_field, which is "
                        "''; name the field holding the answers, or drop the answer reward")
    room = d.context_length - rl.max_new_tokens
    if room < 1:
        raise UserError(f"rl.max_new_tokens={rl.max_new_tokens} leaves no room for a prompt in data.context_length="
                        f"{d.context_length}: lower it, or raise data.context_length")
    named = [(d.source, "data.source")] + ([(d.val_source, "data.val_source")] if d.val_source else [])
    read = [read_prompts(sources.Source(spec, record_fields(d), d.skip_bad_records, option), d, template, tokenizer,
                         room) for spec, option in named]
    if d.val_source:
        prompts = {"train": read[0], "val": read[1]}
    else:
        if len(read[0].ids) < 2:
            raise UserError(f"data.source={d.source} gives 1 prompt: too few to hold some out; give more, or "
                            "data.val_source")
        cut = len(read[0].ids) - max(1, int(len(read[0].ids) * d.val_fraction))
        prompts = {"train": subset(read[0], slice(0, cut)), "val": subset(read[0], slice(cut, None))}
    width = max(p.ids.shape[1] for p in prompts.values())
    prompts = {split: widened(p, width) for split, p in prompts.items()}
    print(f"prompts: {len(prompts['train'].ids)} to train on, {len(prompts['val'].ids)} held out; the longest "
          f"{width} tokens, completions of up to {rl.max_new_tokens}")
    return GRPO(config, tokenizer, template, prompts, rewards, workdir)


def chat_template(config: ml_collections.ConfigDict, tokenizer: bpe.BPETokenizer) -> chat.ChatTemplate:
    """data.chat_template's; left at its default with init_from=RUN (an SFT run), the run's own (printed)."""
    location = config.get("init_from", "")
    folder = runs.run_folder(location) if location and not location.startswith("hf:") else None
    saved = saved_template(folder) if folder and left_at_default(config.data, "chat_template") else None
    if saved is None:
        return chat.ChatTemplate.load(config.data.chat_template, tokenizer)
    print(f"init_from={location}: its chat template ({saved.name}; set data.chat_template to override)")
    return saved


def reward_settings(config: ml_collections.ConfigDict) -> reward_functions.Settings:
    """The built-in rewards' settings from the config (lm/rewards.py)."""
    rl = config.rl
    limit = rl.length_limit or 4 * rl.max_new_tokens
    return reward_functions.Settings(answer_field=config.data.answer_field, format_pattern=rl.format_pattern,
                                     length_limit=limit, length_buffer=rl.length_buffer or max(1, limit // 4))


def subset(prompts: Prompts, rows: slice) -> Prompts:
    return Prompts(prompts.ids[rows], prompts.lengths[rows], prompts.texts[rows], prompts.records[rows],
                   prompts.where[rows])


def widened(prompts: Prompts, width: int) -> Prompts:
    """prompts with their ids padded to width columns (both splits share one row width)."""
    ids = np.zeros((len(prompts.ids), width), np.int32)
    ids[:, :prompts.ids.shape[1]] = prompts.ids
    return dataclasses.replace(prompts, ids=ids)
