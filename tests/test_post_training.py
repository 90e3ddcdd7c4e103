"""Supervised fine-tuning and DPO (experiments/sft.py, experiments/dpo.py): chat templates mark the assistant's
tokens, which alone carry the loss in the packed rows; long conversations and pairs are cut or dropped by the
stated rule; bad input is one line; the DPO loss is TRL's formula, and a run's reference is its starting point."""

import json
import math
import pathlib

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from configs import dpo as dpo_config
from configs import sft as sft_config
from experiments import dpo, sft
from lm.data import chat, packing
from lm.data.bpe import END_OF_TEXT, BPETokenizer
from lm.errors import UserError
from lm.losses import dpo_loss
from lm.sharding import MESH_AXES, make_mesh

SYSTEM = {"role": "system", "content": "Be brief."}
CONVERSATIONS = [
    [SYSTEM, {"role": "user", "content": "What is two plus two?"}, {"role": "assistant", "content": "Four."},
     {"role": "user", "content": "And times three?"}, {"role": "assistant", "content": "Twelve, of course."}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}],
    [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi there!"},
     {"role": "user", "content": "Thanks."}],  # the last turn the user's: nothing after it to learn
]
# A Hugging Face folder's template (Zephyr's shape) with a role check, and its special tokens as AddedToken objects
HF_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% if message['role'] not in ['system', 'user', "
               "'assistant'] %}{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
               "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    """A byte-level BPE of 300 ids (<|endoftext|> = 0), trained on the test texts: built in a blink."""
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    texts = [message["content"] for conversation in CONVERSATIONS for message in conversation]
    BPETokenizer.train(texts * 20, 300).save(path)
    return path


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def sft_config_for(tokenizer_path, source, **data):
    config = sft_config.get_config("test")
    config.data.update(**{"source": f"files:{source}", "val_source": f"files:{source}", "max_records": 0,
                          "tokenizer": str(tokenizer_path), "vocab_size": 300, "context_length": 32, **data})
    return config


def hf_folder(folder):
    config = {"chat_template": HF_TEMPLATE, "bos_token": "", "eos_token": {"content": END_OF_TEXT, "lstrip": False}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize("template", ["chatml", "plain", "hf"])
def test_every_assistant_token_has_weight_1_and_every_other_token_0(template, tokenizer_path, tmp_path):
    """Each conversation's segment of the packed training rows: its targets of weight 1 decode to the
    assistant's turns (and their end-of-turn markers) and nothing else, its other targets to the rest of the
    rendered conversation (every system, user and template token has weight 0)."""
    conversations = CONVERSATIONS
    source = write_jsonl(tmp_path / "chats.jsonl", [{"messages": c} for c in conversations])
    spec = hf_folder(tmp_path) if template == "hf" else template
    built = sft.build(sft_config_for(tokenizer_path, source, messages_field="messages", chat_template=spec,
                                     context_length=256))
    tokenizer, rows = built.tokenizer, built.train_rows[0]
    pieces = {built.chat_template.render(c): built.chat_template.pieces(c) for c in conversations}
    weights = packing.examples(rows)["weights"]  # (R, W - 1): weight of the target at position j + 1
    seen = 0
    for row, segment in {(r, rows.segment_ids[r, c]) for r, c in zip(*np.nonzero(rows.segment_ids), strict=True)}:
        where = np.flatnonzero(rows.segment_ids[row] == segment)  # the conversation's positions in the row
        conversation = pieces[tokenizer.decode(rows.tokens[row, where])]
        scored = weights[row, where[1:] - 1]
        assert set(np.unique(scored)) <= {0.0, 1.0}
        assert tokenizer.decode(rows.tokens[row, where[1:]][scored == 1]) == "".join(
            text for text, assistant in conversation if assistant) != ""
        unscored = [rows.tokens[row, where[0]], *rows.tokens[row, where[1:]][scored == 0]]
        assert tokenizer.decode(unscored) == "".join(text for text, assistant in conversation if not assistant)
        seen += 1
    assert seen == len(conversations)


def test_weights_travel_with_their_tokens_into_packed_rows():
    """Documents cut into row-sized pieces and packed best-fit: every token keeps its own weight, padding 0."""
    documents = [np.arange(1, 11, dtype=np.int32), np.arange(101, 104, dtype=np.int32)]
    weight_of = {token: float(token % 3 == 0) for document in documents for token in document.tolist()}
    rows = packing.pack_documents(documents, 5, weights=[np.array([weight_of[t] for t in d.tolist()], np.float32)
                                                         for d in documents])
    assert rows.tokens.shape == (3, 6) and set(rows.tokens[rows.segment_ids == 0].tolist()) <= {0}
    np.testing.assert_array_equal(rows.weights, [[weight_of.get(t, 0.0) for t in row] for row in rows.tokens.tolist()])
    examples = packing.examples(rows)
    boundary = packing.examples(packing.PackedRows(rows.tokens, rows.segment_ids, rows.positions))["weights"]
    np.testing.assert_array_equal(examples["weights"], boundary * rows.weights[:, 1:])


def test_the_template_pieces_tell_prompt_from_response():
    """The pieces of a multi-turn conversation: prompts (system, user turns, generation prompts) unmarked, each
    assistant turn with its end marker marked, a trailing user turn unmarked; joined, the whole rendering."""
    tokenizer = BPETokenizer.train(["x"], 300)
    template = chat.ChatTemplate.load("chatml", tokenizer)
    pieces = template.pieces(CONVERSATIONS[0])
    assert [text for text, assistant in pieces if assistant] == ["Four.<|im_end|>\n", "Twelve, of course.<|im_end|>\n"]
    assert "".join(text for text, _ in pieces) == template.render(CONVERSATIONS[0])
    assert pieces[0] == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is two plus two?"
                         "<|im_end|>\n<|im_start|>assistant\n", False)
    plain = chat.ChatTemplate.load("plain", tokenizer)
    assert plain.pieces(chat.pair_messages("2+2?", "4")) == [("Question: 2+2?\nAnswer:", False),
                                                            (f" 4{END_OF_TEXT}", True)]
    ids, marks = chat.encode_pieces(tokenizer, [plain.pieces(chat.pair_messages("2+2?", "4"))])[0]
    assert tokenizer.decode(ids[marks == 1]) == f" 4{END_OF_TEXT}" and ids[-1] == tokenizer.end_of_text_id


def test_train_on_prompt_scores_every_token_and_the_held_out_loss_the_answers(tokenizer_path, tmp_path):
    source = write_jsonl(tmp_path / "pairs.jsonl", [{"question": "Name a colour.", "answer": "Blue."},
                                                    {"question": "Say hi.", "answer": "Hi there!"}])
    built = sft.build(sft_config_for(tokenizer_path, source, train_on_prompt=True))
    train, val = packing.examples(built.train_rows[0]), packing.examples(built.val_rows)
    continues = (train["segment_ids"] > 0) & (np.roll(train["segment_ids"], -1, axis=1) == train["segment_ids"])
    np.testing.assert_array_equal(train["weights"][:, :-1], continues[:, :-1])  # every next token of a conversation
    assert 0 < val["weights"].sum() < continues.sum()  # held out: the answers alone


def test_lm_sample_chat_sends_the_prompt_as_the_users_turn_with_the_assistants_opened(tokenizer_path, tmp_path):
    source = write_jsonl(tmp_path / "pairs.jsonl", [{"question": "Name a colour.", "answer": "Blue."}])
    built = sft.build(sft_config_for(tokenizer_path, source, chat_template="chatml"))
    assert built.chat_prompt("Say hi.") == "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"


def test_a_conversation_longer_than_a_row_is_cut_from_the_left_or_dropped(tokenizer_path, tmp_path, capsys):
    ids, marks = np.arange(10, dtype=np.int32), np.array([0, 0, 0, 1, 1, 0, 0, 1, 1, 1], np.float32)
    assert sft.fit_to_row((ids, marks), 10)[0] is ids  # fits
    kept_ids, kept_marks = sft.fit_to_row((ids, marks), 4)  # the last response (3 tokens) and the token before it
    np.testing.assert_array_equal(kept_ids, [6, 7, 8, 9])
    np.testing.assert_array_equal(kept_marks, [0, 1, 1, 1])
    assert sft.fit_to_row((ids, marks), 3) is None  # the response leaves no token before it: dropped
    long_answer = " ".join(["Blue."] * 40)
    source = write_jsonl(tmp_path / "pairs.jsonl", [{"question": "Name a colour. " * 20, "answer": "Blue."},
                                                    {"question": "Say hi.", "answer": long_answer},
                                                    {"question": "Say hi.", "answer": "Hi there!"}])
    sft.build(sft_config_for(tokenizer_path, source))
    assert "data.source: 3 conversations; 1 longer than a row of 33 tokens cut from the left (their last assistant " \
           "response kept whole), 1 dropped" in capsys.readouterr().out


@pytest.mark.parametrize("records, data, fragments", [
    ([{"question": "q", "reply": "a"}], {}, ["line 1: has no field 'answer'", "data.response_field"]),
    ([{"messages": [{"role": "user"}]}], {"messages_field": "messages"},
     ["line 1: message 1 of field 'messages' is not a {role, content} object"]),
    ([{"messages": [{"role": "user", "content": "q"}]}], {"messages_field": "messages"},
     ["line 1: data.chat_template=plain fails on it", "no assistant message"]),
    ([{"messages": [{"role": "tool", "content": "q"}]}], {"messages_field": "messages", "chat_template": "hf"},
     ["line 1: data.chat_template=", "TemplateError: unknown role tool", "skip_bad_records"]),
    ([{"question": "q", "answer": "a"}], {"chat_template": "{{ oops"}, ["no such built-in or path", "chatml"]),
])
def test_a_bad_conversation_record_or_template_is_one_line(records, data, fragments, tokenizer_path, tmp_path):
    source = write_jsonl(tmp_path / "bad.jsonl", records)
    if data.get("chat_template") == "hf":
        data["chat_template"] = hf_folder(tmp_path)
    with pytest.raises(UserError) as raised:
        sft.build(sft_config_for(tokenizer_path, source, **data))
    assert "\n" not in str(raised.value)
    for fragment in fragments:
        assert fragment in str(raised.value)


def test_a_template_that_does_not_parse_is_one_line_and_bad_records_can_be_skipped(tokenizer_path, tmp_path, capsys):
    (tmp_path / "broken.jinja").write_text("{% for m in messages %}{{ m.content }")
    with pytest.raises(UserError, match=r"broken.jinja: the template does not parse \(TemplateSyntaxError"):
        chat.ChatTemplate.load(str(tmp_path / "broken.jinja"), BPETokenizer.train(["x"], 300))
    source = write_jsonl(tmp_path / "mixed.jsonl", [{"messages": CONVERSATIONS[1]}, {"messages": [SYSTEM]}])
    sft.build(sft_config_for(tokenizer_path, source, messages_field="messages", skip_bad_records=True))
    assert "warning: skipped 1 conversations of data.source" in capsys.readouterr().err


def test_dpo_loss_is_trls_sigmoid_formula():
    """Against numpy on fixed sequence log-probabilities: TRL's sigmoid DPO loss (label smoothing 0) and rewards."""
    policy_chosen, policy_rejected = np.array([-12.0, -30.5, -7.25, -3.0]), np.array([-14.0, -28.0, -7.25, -9.5])
    reference_chosen, reference_rejected = np.array([-13.0, -29.0, -8.0, -3.5]), np.array([-13.5, -29.0, -7.0, -4.0])
    beta = 0.1
    logits = (policy_chosen - policy_rejected) - (reference_chosen - reference_rejected)
    expected = -np.log(1 / (1 + np.exp(-beta * logits)))
    losses, chosen, rejected = dpo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta)
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
    np.testing.assert_allclose(chosen, beta * (policy_chosen - reference_chosen), rtol=1e-6)
    np.testing.assert_allclose(rejected, beta * (policy_rejected - reference_rejected), rtol=1e-6)
    np.testing.assert_allclose(dpo_loss(*[np.zeros(2)] * 4, beta)[0], [math.log(2)] * 2, rtol=1e-6)


HH = [{"chosen": "\n\nHuman: Hi?\n\nAssistant: Hello.\n\nHuman: Tea?\n\nAssistant: Yes, brew it hot.",
       "rejected": "\n\nHuman: Hi?\n\nAssistant: Hello.\n\nHuman: Tea?\n\nAssistant: No."}]


def dpo_config_for(tokenizer_path, source, **data):
    config = dpo_config.get_config("test")
    config.data.update(**{"source": f"files:{source}", "val_source": f"files:{source}", "max_records": 0,
                          "tokenizer": str(tokenizer_path), "vocab_size": 300, "context_length": 24, **data})
    return config


def test_hh_pairs_split_at_the_last_assistant_turn_into_rows_of_the_responses(tokenizer_path, tmp_path, capsys):
    prompt, chosen, rejected = dpo.split_transcripts(HH[0]["chosen"], HH[0]["rejected"], "\n\nAssistant:")
    assert (prompt.endswith("Tea?\n\nAssistant:"), chosen, rejected) == (True, " Yes, brew it hot.", " No.")
    source = write_jsonl(tmp_path / "hh.jsonl", HH * 2)
    built = dpo.build(dpo_config_for(tokenizer_path, source))
    rows, tokenizer = built.rows["train"], built.tokenizer
    for side, response in enumerate([chosen, rejected]):
        marked = rows.tokens[0, side][rows.response[0, side] == 1]
        assert tokenizer.decode(marked) == response + END_OF_TEXT  # the response, whole, and its end
        assert prompt.endswith(tokenizer.decode(rows.tokens[0, side][:np.argmax(rows.response[0, side])]))
    assert "2 pairs; 2 longer than a row of 25 tokens with their prompt cut from the left" in capsys.readouterr().out
    examples = dpo.pair_examples(rows, np.zeros((1, 2), np.float32))
    np.testing.assert_array_equal(examples["chosen_weights"][0], rows.response[0, 0, 1:])  # weights on targets


@pytest.mark.parametrize("record, fragments", [
    ({"chosen": "\n\nHuman: Hi?\n\nAssistant: Same.", "rejected": "\n\nHuman: Hi?\n\nAssistant: Same."},
     ["line 1: its chosen and rejected responses are identical"]),
    ({"chosen": "Hi? Hello.", "rejected": "Hi? Bye."}, ["line 1: the chosen transcript has no '\\n\\nAssistant:'"]),
    ({"chosen": "\n\nHuman: A\n\nAssistant: x", "rejected": "\n\nHuman: B\n\nAssistant: y"}, ["do not share"]),
    ({"chosen": "x"}, ["line 1: has no field 'rejected'", "data.rejected_field"]),
])
def test_a_bad_pair_is_one_line(record, fragments, tokenizer_path, tmp_path):
    source = write_jsonl(tmp_path / "bad.jsonl", [record])
    with pytest.raises(UserError) as raised:
        dpo.build(dpo_config_for(tokenizer_path, source))
    assert "\n" not in str(raised.value) and "skip_bad_records" in str(raised.value)
    for fragment in fragments:
        assert fragment in str(raised.value)


def test_the_reference_is_the_starting_point_and_is_kept_for_a_resumed_run(tokenizer_path, tmp_path):
    """prepare (the trainer calls it at step 0) scores every pair with the starting parameters: with those
    parameters the DPO loss is log 2 and every reward 0; the scores are saved in the run folder and read back by
    build for a resumed run, but not for other pairs (then the run folder's batches are refused)."""
    source = write_jsonl(tmp_path / "hh.jsonl", HH * 4)
    config = dpo_config_for(tokenizer_path, source)
    config.model.update(num_layers=1, embed_dim=16)
    built = dpo.build(config, tmp_path)
    mesh = make_mesh({axis: 1 for axis in MESH_AXES}, jax.devices()[:1])
    params = jax.jit(lambda rng: nn.unbox(built.init(rng)["params"]))(jax.random.key(0))
    params = jax.device_put(params, NamedSharding(mesh, PartitionSpec()))  # (as the trainer's: on a mesh)
    built.prepare(params, tmp_path)
    batch = sft.every_row(built.examples("train"), 4)[0]
    loss, metrics = jax.jit(built.loss, static_argnames="train")(params, batch, jax.random.key(0), train=False)
    assert float(loss) == pytest.approx(math.log(2), abs=1e-6)
    assert (metrics["reward_accuracy"], metrics["reward_margin"]) == (0, 0) and metrics["chosen_logprob"] < 0
    resumed = dpo.build(config, tmp_path)
    np.testing.assert_array_equal(resumed.reference["train"], built.reference["train"])
    config.data.context_length = 20  # other rows
    with pytest.raises(UserError, match="holds no reference log-probabilities of these pairs"):
        dpo.build(config, tmp_path).examples("train")


@pytest.mark.slow
def test_an_sft_run_samples_through_its_chat_template_and_exports_it_for_transformers(tokenizer_path, tmp_path,
                                                                                      capsys):
    """lm sample --chat renders the prompt as the run's own samples are; lm export writes the template into
    tokenizer_config.json, where transformers' apply_chat_template (and lm's loader of a folder) finds it."""
    from test_cli import main_in_process

    from lm.cli import export as export_cli
    from lm.cli import sample as sample_cli
    from lm.cli.resolve import build_experiment
    from lm.train.loop import train

    source = write_jsonl(tmp_path / "pairs.jsonl", [{"question": f"Name colour {i}.", "answer": "Blue."}
                                                    for i in range(8)])
    config = sft_config_for(tokenizer_path, source, chat_template="chatml")
    config.train.update(num_steps=2, log_every=1, checkpoint_every=2)
    config.eval.every = 2
    workdir, folder = tmp_path / "run", tmp_path / "hf"
    train(config, str(workdir), build_experiment, jax.devices()[:1])
    capsys.readouterr()  # the run's output
    config.data.chat_template = str(tmp_path / "moved")  # the run folder holds its template: none is read again
    (workdir / "config.json").write_text(config.to_json())
    sampled = main_in_process(capsys, sample_cli, f"--workdir={workdir}", "--chat", "--prompt=Say hi.",
                              "--max_new_tokens=4", "--temperature=0")
    assert sampled.returncode == 0, sampled.stderr[-2000:]
    assert sampled.stdout.startswith("<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n")
    exported = main_in_process(capsys, export_cli, f"--workdir={workdir}", f"--out={folder}")
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert json.loads((folder / "tokenizer_config.json").read_text())["chat_template"] == chat.BUILT_IN["chatml"]
    tokenizer = BPETokenizer.load(tokenizer_path)
    for conversation in CONVERSATIONS:
        assert (chat.ChatTemplate.load(str(folder), tokenizer).render(conversation)
                == chat.ChatTemplate.load("chatml", tokenizer).render(conversation))


def gpt2_folder_of_300_ids(folder):
    """tests/fixtures/hf/gpt2 (2 layers, 32 wide, 32 positions) with its token table grown to the 300 ids of
    tokenizer_path: a Hugging Face GPT-2 folder these runs' tokenizer fits."""
    from safetensors.numpy import load_file, save_file

    fixture = pathlib.Path(__file__).parent / "fixtures" / "hf" / "gpt2"
    folder.mkdir()
    tensors = load_file(fixture / "model.safetensors")
    table = tensors["transformer.wte.weight"]
    rows = np.random.default_rng(0).normal(0, 0.02, (300 - len(table), table.shape[1])).astype(table.dtype)
    tensors["transformer.wte.weight"] = np.concatenate([table, rows])
    save_file(tensors, folder / "model.safetensors")
    hf = json.loads((fixture / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**hf, "vocab_size": 300}))
    return folder


@pytest.mark.parametrize("experiment", ["sft", "dpo"])
def test_sft_and_dpo_start_from_a_hugging_face_gpt2_folder(experiment, tokenizer_path, tmp_path, capsys):
    """init_from=hf:DIR (with init_from_config=True: the model of its config.json) loads every parameter of a
    GPT-2 folder into an SFT or DPO run (the README's command), as into a pretraining run."""
    from lm.train import init_from

    folder = gpt2_folder_of_300_ids(tmp_path / "gpt2")
    source = write_jsonl(tmp_path / "records.jsonl", HH * 4 if experiment == "dpo" else
                         [{"question": f"Name colour {i}.", "answer": "Blue."} for i in range(4)])
    config = (dpo_config_for if experiment == "dpo" else sft_config_for)(tokenizer_path, source)
    config.update(init_from=f"hf:{folder}", init_from_config=True)
    config = init_from.model_from_source(config)
    built = (dpo if experiment == "dpo" else sft).build(config)
    abstract = nn.unbox(jax.eval_shape(built.init, jax.random.key(0))["params"])
    plan = init_from.prepare(config.init_from, "", abstract, None, config)
    assert plan.initialised == [] and plan.dropped == [] and len(plan.loaded) == 36
    assert "a GPT2LMHeadModel; this run's config agrees with its config.json" in capsys.readouterr().out
