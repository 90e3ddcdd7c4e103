"""Direct preference optimisation (DPO): a GPT (language_model's) taught to prefer each pair's chosen response to
its rejected one, against a frozen reference: the run's starting parameters (init_from's) (configs/dpo.py).

Pairs: the records of data.source (any source of the data layer), each a chosen and a rejected text
(data.chosen_field, data.rejected_field) that answer one prompt: with data.prompt_field, the prompt is that field
and the two fields are the responses alone; without it (hh-rlhf), the two are whole transcripts and the prompt is
their common start up to the last data.response_marker ("\\n\\nAssistant:") of the chosen one, the responses what
follows it in each. The prompt and each response are tokenised on their own (data.tokenizer), each response
followed by the end-of-text id where the tokenizer has one (the model learns where to stop). A pair gives two rows
of context_length + 1 tokens, prompt + chosen and prompt + rejected, padded; the rows' weights mark the
responses' tokens (as targets), so a sequence's log-probability log pi(y | x) is the sum over its response alone.

Loss (lm/losses.py dpo_loss, TRL's sigmoid loss): -log sigmoid(dpo.beta * ((pi_c - ref_c) - (pi_r - ref_r))), with
the implicit rewards beta * (pi - ref). Logged beside it: reward_accuracy (the share of pairs whose chosen reward
is above the rejected one's), reward_margin, chosen_reward and rejected_reward (means), and the policy's mean
sequence log-probabilities; held out (eval_* during training, val_* after it over every held-out pair).

The reference: the log-probabilities ref_c and ref_r of every pair are computed once, when a run starts, with its
step-0 parameters (prepare: the fresh initialisation with init_from loaded, LoRA adapters as loaded, fresh ones
being zero: the base), and kept in the batches; so the reference costs no copy of the weights, with or without
LoRA, and no forward pass in the train step. They are saved in the run folder (REFERENCE_FILE) for a resumed run
and lm eval. At step 0 the policy is the reference: the loss is log 2 and every reward 0.

Truncation: a pair whose prompt and longer response exceed a row is cut from the left of its prompt (the same cut
for both rows), keeping both responses whole; a pair whose longer response alone leaves no room for one prompt
token is dropped; both are counted and printed. Bad records (one error line naming the record, or with
data.skip_bad_records skipped and counted): a record without the fields named, a transcript without the response
marker, chosen and rejected transcripts whose prompts differ, a pair whose chosen and rejected responses are
identical (nothing to prefer), a response of no tokens.
"""

import dataclasses
import itertools
import pathlib
import sys

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.language_model import TOKENIZER_FILE, LanguageModel, post_training_data
from experiments.sft import every_row
from lm import runs, sharding
from lm.data import bpe, packing, run_cache, sources
from lm.distributed import host_local, is_primary
from lm.errors import UserError
from lm.losses import dpo_loss, masked_mean, moe_objective
from lm.models.gpt import flops_per_token

REFERENCE_FILE = "reference_logprobs.npz"  # in the run folder: the reference's log-probabilities of every pair
SIDES = ("chosen", "rejected")


@dataclasses.dataclass(frozen=True)
class PairRows:
    """P pairs as rows of width W = context_length + 1: tokens (P, 2, W) int32, prompt then response then padding
    (side 0 chosen, 1 rejected); response (P, 2, W) float32, 1 on the response's tokens."""

    tokens: np.ndarray
    response: np.ndarray


def split_transcripts(chosen: str, rejected: str, marker: str) -> tuple[str, str, str]:
    """(prompt, chosen response, rejected response) of two transcripts that share their prompt: the chosen one up
    to (and with) its last marker; a ValueError saying what is wrong otherwise."""
    cut = chosen.rfind(marker)
    if cut < 0:
        raise ValueError(f"the chosen transcript has no {marker!r} before its response: set data.response_marker, "
                         "or data.prompt_field for records with a prompt of their own")
    prompt = chosen[:cut + len(marker)]
    if not rejected.startswith(prompt):
        raise ValueError(f"the chosen and rejected transcripts do not share the prompt up to the chosen one's last "
                         f"{marker!r}")
    return prompt, chosen[len(prompt):], rejected[len(prompt):]


def checked_pair(values: tuple[str, ...], data: ml_collections.ConfigDict) -> tuple[str, str, str]:
    """(prompt, chosen response, rejected response) of a record's field values; a ValueError for a bad pair."""
    prompt, chosen, rejected = (values if data.prompt_field else
                                split_transcripts(*values, data.response_marker))
    if chosen == rejected:
        raise ValueError("its chosen and rejected responses are identical: the pair prefers nothing")
    return prompt, chosen, rejected


def record_fields(data: ml_collections.ConfigDict) -> sources.Fields:
    prompt = {"data.prompt_field": data.prompt_field} if data.prompt_field else {}
    return {**prompt, "data.chosen_field": data.chosen_field, "data.rejected_field": data.rejected_field}


def read_pairs(source: sources.Source, data: ml_collections.ConfigDict) -> list[tuple[str, str, str]]:
    """The (prompt, chosen, rejected) texts of source's records (its first data.max_records); a bad pair is a
    UserError naming it, or with data.skip_bad_records skipped, counted and printed."""
    pairs, skipped, first = [], 0, None
    for where, values in itertools.islice(source, data.max_records or None):
        try:
            pairs.append(checked_pair(values, data))
        except ValueError as e:
            if not data.skip_bad_records:
                raise UserError(f"{source.name}: {where}: {e}; {sources.SKIP_HINT}") from None
            skipped, first = skipped + 1, first or f"{where}: {e}"
    if first:
        print(f"warning: skipped {skipped} pairs of {source.name} (the first: {first})", file=sys.stderr)
    if not pairs:
        raise UserError(f"{source.name} gives no pair: check data.source and the fields it names")
    return pairs


def encoded_pairs(pairs: list[tuple[str, str, str]], tokenizer: bpe.BPETokenizer
                  ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(prompt ids, chosen ids, rejected ids) of each pair, each text tokenised on its own (in parallel), the
    responses followed by the end-of-text id where the tokenizer has one."""
    ids = tokenizer.encode_batch([text for pair in pairs for text in pair])
    end = np.array([] if tokenizer.end_of_text_id is None else [tokenizer.end_of_text_id], np.int32)
    return [(ids[i], np.concatenate([ids[i + 1], end]), np.concatenate([ids[i + 2], end]))
            for i in range(0, len(ids), 3)]


def pair_rows(pairs: list[tuple[np.ndarray, np.ndarray, np.ndarray]], width: int, option: str) -> PairRows:
    """The pairs as rows of width tokens (module docstring: the prompt cut from the left to fit, a pair whose
    longer response leaves no room for a prompt token dropped; the counts printed). A UserError where a response
    has no tokens, or where every pair is dropped."""
    kept, truncated = [], 0
    for index, (prompt, chosen, rejected) in enumerate(pairs):
        if not len(chosen) or not len(rejected):
            raise UserError(f"{option}: pair {index}: a response encodes to no token ids (the tokenizer has no "
                            "end-of-text id to end it with): drop such pairs, or use a tokenizer with one")
        room = width - max(len(chosen), len(rejected))
        if room < 1:
            continue
        truncated += len(prompt) > room
        kept.append((prompt[len(prompt) - min(room, len(prompt)):], chosen, rejected))
    print(f"{option}: {len(pairs)} pairs; {truncated} longer than a row of {width} tokens with their prompt cut from "
          f"the left (both responses kept whole), {len(pairs) - len(kept)} dropped (a response leaves no room for "
          "the prompt)")
    if not kept:
        raise UserError(f"{option}: every pair is dropped: no response fits a row of data.context_length + 1 = "
                        f"{width} tokens with its prompt; raise data.context_length")
    tokens = np.zeros((len(kept), 2, width), np.int32)
    response = np.zeros((len(kept), 2, width), np.float32)
    for row, (prompt, *responses) in enumerate(kept):
        for side, ids in enumerate(responses):
            tokens[row, side, :len(prompt) + len(ids)] = np.concatenate([prompt, ids])
            response[row, side, len(prompt):len(prompt) + len(ids)] = 1
    return PairRows(tokens, response)


def pair_examples(rows: PairRows, reference: np.ndarray) -> dict[str, np.ndarray]:
    """The model's examples of the pairs, each (P, ...): <side>_inputs, <side>_targets (P, context_length) int32,
    <side>_weights (P, context_length) float32 (1 where the target is a response token), reference_<side> (P,)
    the reference's log-probabilities (reference (P, 2)), and pair_weights (P,) ones (the rows of zeros that fill
    up an eval batch count in no mean)."""
    examples = {"pair_weights": np.ones(len(rows.tokens), np.float32)}
    for side, name in enumerate(SIDES):
        examples.update({f"{name}_inputs": rows.tokens[:, side, :-1], f"{name}_targets": rows.tokens[:, side, 1:],
                         f"{name}_weights": rows.response[:, side, 1:], f"reference_{name}": reference[:, side]})
    return examples


class DPO(LanguageModel):
    """The language model on preference pairs (module docstring): rows {"train": PairRows, "val": PairRows};
    reference {"train": (P, 2), "val": (P_val, 2)} log-probabilities, or None until prepare() (or a saved
    REFERENCE_FILE) gives them; reference_key: the digest of the pairs they score."""

    def __init__(self, config: ml_collections.ConfigDict, tokenizer: bpe.BPETokenizer, rows: dict[str, PairRows],
                 reference_key: str, workdir: pathlib.Path | None, data_cache: run_cache.DataCache | None = None):
        super().__init__(config, tokenizer, data_cache=data_cache)
        self.rows, self.reference_key, self.workdir = rows, reference_key, workdir
        self.reference = load_reference(workdir, reference_key)
        self.units_per_example = 2 * config.data.context_length  # tokens: both rows of a pair

    def sequence_logprobs(self, params, batch, rng, train: bool):
        """(policy log-probabilities of the chosen responses (B,), of the rejected ones (B,), the moe collection):
        both rows of each pair in one forward pass (2B, T)."""
        inputs, targets, weights = (jnp.concatenate([batch[f"{side}_{key}"] for side in SIDES])
                                    for key in ("inputs", "targets", "weights"))
        token_losses, collections = self.model.apply({"params": params}, inputs, train=train, targets=targets,
                                                     rngs={"dropout": rng}, mutable=["moe"])  # (2B, T)
        logprobs = -(token_losses * weights).sum(axis=-1)
        return *jnp.split(logprobs, 2), collections.get("moe", {})

    def loss(self, params, batch, rng, train: bool):
        chosen, rejected, moe_stats = self.sequence_logprobs(params, batch, rng, train)
        losses, chosen_rewards, rejected_rewards = dpo_loss(chosen, rejected, batch["reference_chosen"],
                                                            batch["reference_rejected"], self.config.dpo.beta)
        pairs = batch["pair_weights"]
        moe = self.model.config.transformer.moe
        aux_loss, moe_metrics = moe_objective(moe_stats, moe.load_balance_weight, moe.router_z_weight)
        dpo = masked_mean(losses, pairs)
        metrics = {
            "dpo_loss": dpo,
            "reward_accuracy": masked_mean((chosen_rewards > rejected_rewards).astype(jnp.float32), pairs),
            "reward_margin": masked_mean(chosen_rewards - rejected_rewards, pairs),
            "chosen_reward": masked_mean(chosen_rewards, pairs),
            "rejected_reward": masked_mean(rejected_rewards, pairs),
            "chosen_logprob": masked_mean(chosen, pairs),
            "rejected_logprob": masked_mean(rejected, pairs),
        }
        return dpo + aux_loss, {**metrics, **moe_metrics}

    def eval_weight(self, batch) -> jax.Array:
        """The batch's real pairs: the eval means are per pair."""
        return batch["pair_weights"].sum()

    def examples(self, split: str) -> dict[str, np.ndarray]:
        """The split's pair_examples, with the reference's log-probabilities: a UserError for a run folder that lacks
        them (a resumed run whose REFERENCE_FILE is gone or for other pairs); NaN outside a run (the dry run
        compiles with the batches' shapes alone)."""
        if self.reference is None and self.workdir is not None:
            raise UserError(f"{self.workdir / REFERENCE_FILE} holds no reference log-probabilities of these pairs "
                            "(written when the run started, with its starting parameters): start the run again in "
                            "a new --workdir")
        reference = self.reference[split] if self.reference else np.full((len(self.rows[split].tokens), 2), np.nan,
                                                                         np.float32)
        return pair_examples(self.rows[split], reference)

    def prepare(self, params, workdir: pathlib.Path) -> None:
        """The reference's log-probabilities of every pair: the step-0 params' (sharded as in training), batches of
        eval.batch_size pairs; saved in workdir."""
        mesh = jax.tree.leaves(params)[0].sharding.mesh
        score = jax.jit(lambda params, batch: jnp.stack(self.sequence_logprobs(params, batch, jax.random.key(0),
                                                                               False)[:2], axis=-1))
        reference = {}
        for split, rows in self.rows.items():
            nan = np.full((len(rows.tokens), 2), np.nan, np.float32)
            batches = every_row(pair_examples(rows, nan), self.config.eval.batch_size)
            scores = [host_local(score(params, sharding.place_batch(batch, mesh))) for batch in batches]
            reference[split] = np.concatenate(jax.device_get(scores))[:len(rows.tokens)]
        self.reference = reference
        print(f"reference log-probabilities of {', '.join(f'{len(r)} {s}' for s, r in reference.items())} pairs: "
              f"the starting parameters' (mean chosen {reference['train'][:, 0].mean():.2f}, rejected "
              f"{reference['train'][:, 1].mean():.2f})")
        if is_primary():
            save_reference(workdir, self.reference_key, reference)

    def train_data(self, batch_size: int, seed: int, shard: tuple[int, int], start_step: int):
        """Endless batches of pairs, the semantics of packing.train_batches (each pair once per epoch, shuffled)."""
        index, count = shard
        order = grain.MapDataset.range(len(self.rows["train"].tokens)).shuffle(seed=seed).repeat()
        chosen = packing.ExampleRows(self.examples("train"), index * batch_size, (index + 1) * batch_size)
        return order.batch(batch_size * count, drop_remainder=True)[start_step:].map(chosen).to_iter_dataset()

    def eval_data(self):
        e = self.config.eval
        return every_row(self.examples("val"), e.batch_size)[:e.num_batches]

    def final_results(self, params, evaluate, workdir: pathlib.Path) -> dict[str, float]:
        """Over every held-out pair: val_reward_accuracy, val_reward_margin, val_dpo_loss."""
        metrics = evaluate(every_row(self.examples("val"), self.config.eval.batch_size))
        return {f"val_{name}": metrics[name] for name in ("reward_accuracy", "reward_margin", "dpo_loss")}

    def flops_per_example(self, active_params: int) -> float:
        return 2 * flops_per_token(self.model.config, active_params) * self.config.data.context_length


def save_reference(workdir: pathlib.Path, key: str, reference: dict[str, np.ndarray]) -> None:
    """reference into workdir/REFERENCE_FILE with its key, whole or not at all."""
    runs.write_arrays(workdir / REFERENCE_FILE, {"key": np.array(key), **reference})


def load_reference(workdir: pathlib.Path | None, key: str) -> dict[str, np.ndarray] | None:
    """The reference log-probabilities saved in workdir under key, or None (none saved, or for other pairs)."""
    path = workdir / REFERENCE_FILE if workdir else None
    if path is None or not path.is_file():
        return None
    with np.load(path) as saved:
        return {split: saved[split] for split in ("train", "val")} if str(saved["key"]) == key else None


def build(config: ml_collections.ConfigDict, workdir: pathlib.Path | None = None) -> DPO:
    """The pairs of data.source (and of data.val_source, or else the last data.val_fraction of source's) read,
    checked, tokenised (cached in the run folder) and laid into rows."""
    config, tokenizer = post_training_data(config)  # (the run's config: init_from's tokenizer, its vocabulary)
    d = config.data
    cache = run_cache.DataCache(workdir)
    key = run_cache.digest({name: d[name] for name in d.keys() if name != "context_length"},
                           tokenizer.tokenizer.to_str())  # what the tokenised pairs depend on

    def read() -> dict[str, list]:
        named = [(d.source, "data.source")] + ([(d.val_source, "data.val_source")] if d.val_source else [])
        opened = [sources.Source(spec, record_fields(d), d.skip_bad_records, option) for spec, option in named]
        encoded = [encoded_pairs(read_pairs(source, d), tokenizer) for source in opened]
        if d.val_source:
            return {"train": encoded[0], "val": encoded[1]}
        if len(encoded[0]) < 2:
            raise UserError(f"data.source={d.source} gives 1 pair: too few to hold some out; give more, or "
                            "data.val_source")
        cut = len(encoded[0]) - max(1, int(len(encoded[0]) * d.val_fraction))
        return {"train": encoded[0][:cut], "val": encoded[0][cut:]}

    pairs = cache.get("pairs", key, read)
    width = d.context_length + 1
    rows = {"train": pair_rows(pairs["train"], width, "data.source"),
            "val": pair_rows(pairs["val"], width, "data.val_source" if d.val_source else "the held-out pairs")}
    # The saved scores are the run's own (made at its start; a resumed run ignores init_from): keyed by its pairs.
    return DPO(config, tokenizer, rows, run_cache.digest(key, d.context_length), workdir, data_cache=cache)


def from_workdir(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> LanguageModel:
    """The language model of a trained run, for sampling and export: its saved tokenizer, no data."""
    return LanguageModel(config, run_cache.load_saved(workdir / TOKENIZER_FILE, bpe.BPETokenizer.load))
