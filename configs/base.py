"""The base config of every experiment family, one function each: what all of a family's config files
share, before they set their model and their variants. The config files (configs/*.py) build on these;
the trainer's own sections come from lm/train/options.py (run_options, optimizer_options, train_options).

  language_model(dataset)      experiments/language_model.py: Tiny Shakespeare characters (the baby GPT,
                               configs/gpt_shakespeare.py), token files or a document source (configs/gpt2.py)
  translation()                experiments/translation.py: Multi30k de -> en or a source's sentence pairs
                               (configs/translate_*.py add the model; translation_test_sizes gives their
                               `test` variants)
  image_classification()       experiments/image_classification.py: CIFAR-10 (configs/vit_cifar10.py adds
                               the model)
  masked_lm(size)              experiments/masked_lm.py: BERT pretraining of one BERT_SIZES encoder, on
                               the shipped corpus or a source's documents (configs/bert.py)
  finetune(task)               experiments/finetune.py: one task of the fine-tuning table (lm/data/tasks
                               TASKS: its kind of head, row length and steps; configs/bert_finetune.py adds
                               the encoder)
"""


import ml_collections

from lm import sharding
from lm.data import tasks, tokens
from lm.layers.options import FRACTION, SHARE_BELOW_ONE, Range, at_least, declare, option
from lm.models.bert import bert_options
from lm.models.config import transformer_options
from lm.train.options import eval_every_option, mesh_options, optimizer_options, run_options, train_options


def add_mesh(config: ml_collections.ConfigDict) -> None:
    """Mesh axis sizes (-1: all remaining devices; one device is a 1x1x1x1x1 mesh) and the rules that map
    logical axis names onto them: see lm/sharding.py."""
    config.mesh = mesh_options()
    declare(config, sharding_rules=option(sharding.DEFAULT_RULES, "(logical axis name, mesh axes) pairs, in "
                                                                  "priority order (lm/sharding.py)"))


LABEL_SMOOTHING = "the share of each target's probability spread evenly over all the classes (0: none)"


# --- language model ----------------------------------------------------------------------------------


def text_data(dataset: str) -> ml_collections.ConfigDict:
    """A text corpus (lm/data/text.py DATASETS), character level, split train/val."""
    return declare(
        ml_collections.ConfigDict(),
        dataset=option(dataset, "the text corpus (lm/data/text.py DATASETS), read as characters"),
        context_length=option(64, "characters per training window", bounds=at_least(1)),
        train_fraction=option(0.9, "the first part of the text trained on; the rest is the val split", bounds=FRACTION),
    )


def token_file_data() -> ml_collections.ConfigDict:
    """Pre-tokenised ids (nanoGPT's train.bin / val.bin, or `lm prepare`'s), GPT-2 BPE by default; or the
    documents of a source (files, TFDS, Hugging Face: lm/data/sources.py), tokenised when the run starts."""
    return declare(
        ml_collections.ConfigDict(),
        dataset=option("token_file", "token_file: read train_file and val_file; synthetic: uniformly random ids; "
                                     "source: the documents of data.source or data.mixture, tokenised with "
                                     "data.tokenizer (a source or mixture set selects it over token_file); a key "
                                     "the chosen dataset does not read, set away from its default, is an error",
                       choices=("token_file", "synthetic", "source")),
        source=option("", "the training documents (setting it selects dataset=source): files:GLOB (.txt, .jsonl, "
                          ".jsonl.gz, .parquet), tfds:NAME[/CONFIG][:SPLIT], hf:NAME_OR_DIR[:CONFIG][:SPLIT] or "
                          "tokens:DIR (docs/data.md)"),
        mixture=option("", "instead of source, several sources drawn by weight (shares of the rows): "
                           "SPEC=WEIGHT,SPEC=WEIGHT,... (lm/data/mixture.py)"),
        val_source=option("", "the validation documents, as source ('' = the last val_fraction of source's, or "
                              "of each mixture source's)"),
        val_fraction=option(0.01, "without val_source, the share of source's documents (the last ones) held out "
                                  "for validation", bounds=Range(0, 1, low_open=True, high_open=True)),
        text_field=option("text", "the field of a record holding its document (jsonl, parquet, TFDS, Hugging Face)"),
        packing=option("documents", "documents: whole documents best-fit into rows, no attention or loss across "
                                    "them; concat: documents joined by end-of-text, cut into windows",
                       choices=("documents", "concat")),
        skip_bad_records=option(False, "skip (and count) the source records that give no document instead of "
                                       "stopping at the first"),
        train_file=option("openwebtext/train.bin", "training token ids, absolute or relative to $LM_DATA_DIR"),
        val_file=option("openwebtext/val.bin", "validation token ids, absolute or relative to $LM_DATA_DIR"),
        token_dtype=option("uint16", "the files' id type (uint32 for vocabularies past 65,536)",
                           choices=tuple(tokens.TOKEN_DTYPES)),
        vocab_size=option(0, "ids in the vocabulary; 0: data.tokenizer's (50257, GPT-2's BPE, for ids without a "
                             "tokenizer)", bounds=at_least(1, 0)),
        # Saved into the run, so that lm sample prints text.
        tokenizer=option("", "the tokenizer.json the token files were made with (or source is tokenised with), "
                             "absolute or relative to $LM_DATA_DIR, gpt2 (GPT-2's own, $LM_DATA_DIR/vocab) or bytes "
                             "(an id a UTF-8 byte, 257 ids); '': with init_from=RUN the run's, else gpt2 for a source "
                             "and none (ids only) for token files"),
        context_length=option(1024, "tokens per training window (left at 1024 with init_from=RUN: the run's)",
                              bounds=at_least(1)),
    )


def language_model(dataset: str = "tinyshakespeare") -> ml_collections.ConfigDict:
    """Next-token prediction with a GPT: dataset "token_file" reads token ids or a document source
    (token_file_data), any other names a text corpus (text_data). The model is the baby GPT (4 layers,
    4 heads, 128 wide) with nanoGPT's Shakespeare optimiser."""
    config = run_options("language_model")
    config.data = token_file_data() if dataset == "token_file" else text_data(dataset)

    # The block options (norm, mlp, position, moe, init, ...) are shared with every Transformer
    # experiment: see lm/models/config.py.
    config.model = transformer_options(num_layers=4, num_heads=4, num_kv_heads=4, embed_dim=128)
    declare(
        config.model,
        tie_embeddings=option(True, "the output layer is the token embedding table (transposed)"),
        vocab_multiple=option(64, "the vocabulary padded to a multiple of this, so it divides the 'tensor' mesh axis",
                              bounds=at_least(1)),
        scale_embeddings=option(False, "token embeddings times sqrt(D) (Vaswani et al. 3.4)"),
        loss_chunk=option(-1, "positions per cross-entropy chunk (0: the whole (B, T, V) logits at once; -1: "
                              "chunks of at most 2^24 logits a row where a row has more, e.g. 256 positions for "
                              "GPT-2's 1024 x 50304: lm/models/gpt.py derived_loss_chunk)",
                          bounds=at_least(0, -1)),
    )

    config.optimizer = optimizer_options(min_learning_rate=1e-4, b2=0.99, weight_decay=0.1)
    config.train = train_options(batch_size=12, num_steps=2000, log_every=50)  # batch_size in windows
    declare(config.train, z_loss=option(0.0, "weight of the output z-loss, the mean of logsumexp(logits)^2 over the "
                                             "loss's tokens (PaLM: 1e-4); 0: off (z_loss and logsumexp still logged)",
                                        bounds=at_least(0)))

    config.eval = declare(
        ml_collections.ConfigDict(),
        every=eval_every_option("val loss evaluations"),
        batch_size=option(48, "val windows per eval batch", bounds=at_least(1)),
        num_batches=option(8, "val batches per evaluation (the same ones every time)", bounds=at_least(1)),
        context_lengths=option((), "val lengths scored after training, e.g. (128,): twice the training one"),
        position_bands=option((), "with context_lengths: the ends of position bands whose val loss each length "
                                  "also gives, e.g. (128,256,512): val_cross_entropy_ctx512_pos0_128, ..."),
        benchmarks=option("", "zero-shot tasks scored at every eval, task:N (its first N documents), comma-separated, "
                              "e.g. hellaswag:500,arc_easy:200: logged as hellaswag_acc_norm, ... (BPE runs; "
                              "docs/evaluation.md); '' = none"),
    )

    config.sample = declare(
        ml_collections.ConfigDict(),
        prompt=option("\n", "the text that the sample printed after training continues"),
        max_new_tokens=option(300, "tokens the sample after training adds to the prompt", bounds=at_least(0)),
        temperature=option(0.8, "the sample's logits are divided by this (0: greedy)", bounds=at_least(0)),
        top_k=option(40, "sample among the k likeliest tokens only (0: all)", bounds=at_least(0)),
    )

    add_mesh(config)
    return config


# --- translation -------------------------------------------------------------------------------------


def translation() -> ml_collections.ConfigDict:
    """Multi30k de -> en (or the sentence pairs of data.source): data, optimiser, trainer, eval and mesh
    sections (configs/translate_*.py add the model)."""
    config = run_options("translation")

    config.data = declare(
        ml_collections.ConfigDict(),
        source_lang=option("de", "the language translated from (lm/data/translation.py LANGUAGES)"),
        target_lang=option("en", "the language translated into (lm/data/translation.py LANGUAGES)"),
        tokenizer=option("sentencepiece", "sentencepiece, or word: lowercased words, as the PyTorch tutorials",
                         choices=("sentencepiece", "word")),
        vocab_size=option(8000, "pieces per language, for sentencepiece", bounds=at_least(1)),
        sentencepiece_model=option("unigram", "the sentencepiece model type", choices=("unigram", "bpe")),
        min_freq=option(2, "for word: rarer words become <unk>", bounds=at_least(1)),
        buckets=option((16, 24, 32, 48, 64), "padded lengths; longer training pairs are dropped"),
        max_train_pairs=option(0, "the first so many training pairs (tokenizers fitted on them too; 0: all)",
                               bounds=at_least(0)),
        source=option("", "the training pairs ('' = Multi30k's, source_lang -> target_lang): the records of "
                          "files:GLOB (.jsonl, .jsonl.gz, .parquet), tfds:NAME[/CONFIG][:SPLIT] or "
                          "hf:NAME_OR_DIR[:CONFIG][:SPLIT], each a source_field and a target_field (docs/data.md)"),
        val_source=option("", "with source, the val pairs, as source ('' = held_out_pairs of source's)"),
        test_source=option("", "with source, the test pairs, as source ('' = the last held_out_pairs of source's)"),
        held_out_pairs=option(1000, "with source, the pairs held out from its end for a split without its own "
                                    "source: the last ones for test, the ones before them for val",
                              bounds=at_least(1)),
        source_field=option("de", "with source, the field of a record holding the sentence to translate"),
        target_field=option("en", "with source, the field of a record holding its translation"),
        skip_bad_records=option(False, "skip (and count) the source records that give no pair instead of "
                                       "stopping at the first"),
    )

    config.optimizer = optimizer_options(warmup_fraction=0.08, b2=0.98)
    # 128 sentences a step: 2500 steps are 11 epochs of the 29k training pairs.
    config.train = train_options(num_steps=2500, checkpoint_every=500)
    declare(config.train, label_smoothing=option(0.1, LABEL_SMOOTHING, bounds=SHARE_BELOW_ONE))

    config.eval = declare(
        ml_collections.ConfigDict(),
        every=eval_every_option("val loss evaluations"),
        bleu_every=option(500, "steps between greedy sacreBLEU scores of the val split (val_bleu); 0: off",
                          bounds=at_least(0)),
        batch_size=option(128, "sentences per eval batch, also for decoding", bounds=at_least(1)),
        test_split=option("", "the split scored once after training (results.json); '' = the data's test split: "
                              "Multi30k's test_2016_flickr, data.source's test"),
        beam_sizes=option((1, 4), "the beam widths the test split is decoded with (1 = greedy)"),
        length_penalty=option(0.6, "GNMT alpha for beam search", bounds=at_least(0)),
    )

    add_mesh(config)
    return config


def translation_test_sizes(config: ml_collections.ConfigDict) -> None:
    """The data, schedule and eval of the translation configs' `test` variants: the first 5000 training
    pairs, a 500-piece vocabulary, two bucket shapes (two compilations), 20 steps, greedy and beam-2
    scoring (on the whole val and test splits); seconds on a CPU."""
    config.data.update(max_train_pairs=5000, vocab_size=500, buckets=(16, 32))
    config.train.update(batch_size=16, num_steps=20, log_every=5, checkpoint_every=10)
    config.optimizer.update(learning_rate=3e-3, warmup_fraction=0.1)
    config.eval.update(every=10, bleu_every=0, batch_size=256, beam_sizes=(1, 2))


# --- image classification ----------------------------------------------------------------------------


def image_classification() -> ml_collections.ConfigDict:
    """CIFAR-10 (or data.source, a prepared TFDS image dataset): data (and augmentation), optimiser, trainer, eval
    and mesh sections (configs/vit_cifar10.py adds the model)."""
    config = run_options("image_classification")

    config.data = declare(
        ml_collections.ConfigDict(),
        dataset=option("cifar10", "without data.source, the image dataset ($LM_DATA_DIR/cifar10)",
                       choices=("cifar10",)),
        source=option("", "a prepared TFDS image dataset, tfds:NAME[/CONFIG][:SPLIT] (SPLIT: the training split, "
                          "default train; docs/vit.md); '': data.dataset"),
        image_field=option("image", "data.source's image feature (square RGB images of model.image_size)"),
        label_field=option("label", "data.source's label feature, a ClassLabel (it gives the number of classes)"),
        val_split=option("", "the split scored during training (e.g. 'validation', 'test'); '': data.num_val "
                             "images held out of the training split"),
        test_split=option("test", "the split scored once at the end (results.json)"),
        num_val=option(5000, "without data.val_split, the training images held out for validation (seeded)",
                       bounds=at_least(1)),
        split_seed=option(0, "seeds which training images are held out", bounds=at_least(0)),
        crop_padding=option(4, "pixels of zero padding before a random crop (0: no crop)", bounds=at_least(0)),
        flip=option(True, "random horizontal flips"),
        randaugment_ops=option(0, "RandAugment ops per image (0: off)", bounds=at_least(0)),
        randaugment_magnitude=option(9.0, "RandAugment magnitude, 0..10", bounds=Range(0, 10)),
        mixup_alpha=option(0.0, "mixup's Beta(alpha, alpha) (0: off)", bounds=at_least(0)),
        cutmix_alpha=option(0.0, "CutMix's Beta(alpha, alpha) (0: off; both > 0: one or the other per batch)",
                            bounds=at_least(0)),
        num_workers=option(0, "0: augment in a background thread; > 0: worker processes; -1: the cores less two",
                           bounds=at_least(0, -1)),
    )

    config.optimizer = optimizer_options(weight_decay=0.05)
    config.train = train_options(num_steps=10000)  # batch_size in images
    declare(config.train, label_smoothing=option(0.1, LABEL_SMOOTHING, bounds=SHARE_BELOW_ONE))

    config.eval = declare(
        ml_collections.ConfigDict(),
        every=eval_every_option("val loss and accuracy evaluations"),
        batch_size=option(1000, "images per eval batch, global (the 5k val and 10k test splits)", bounds=at_least(1)),
    )

    add_mesh(config)
    return config


# --- masked LM (BERT pretraining) --------------------------------------------------------------------


def masked_lm(size: str) -> ml_collections.ConfigDict:
    """BERT pretraining of the `size` encoder (lm/models/bert.py BERT_SIZES) on sentence pairs of the
    English corpus, with bert-base-uncased's vocabulary and BERT-Base's schedule."""
    config = run_options("masked_lm")

    config.data = declare(
        ml_collections.ConfigDict(),
        corpus=option(("gutenberg_books", "us_presidential_speeches"), "the corpus files, "
                                                                        "$LM_DATA_DIR/corpus/<name>.txt.gz"),
        source=option("", "the documents instead of corpus's ('' = corpus): each record's text_field one document, "
                          "one paragraph a line, of files:GLOB (.txt, .jsonl, .jsonl.gz, .parquet), "
                          "tfds:NAME[/CONFIG][:SPLIT] or hf:NAME_OR_DIR[:CONFIG][:SPLIT] (docs/data.md)"),
        text_field=option("text", "with source, the field of a record holding its document (jsonl, parquet, TFDS, "
                                  "Hugging Face)"),
        skip_bad_records=option(False, "skip (and count) the source records that give no document instead of "
                                       "stopping at the first"),
        max_documents=option(0, "per corpus file (or of source), the first so many documents (0: all)",
                             bounds=at_least(0)),
        eval_documents=option(6, "documents held out for eval, drawn with seed 0 from all of them", bounds=at_least(1)),
        vocab=option("bert-base-uncased", "a vocab.txt name or path, or a run's tokenizer folder (RUN/tokenizer); "
                                          "'' trains one of vocab_size pieces"),
        vocab_size=option(0, "WordPiece pieces to train when vocab is ''", bounds=at_least(0)),
        max_seq_len=option(128, "[CLS] A [SEP] B [SEP], padded to this many tokens", bounds=at_least(1)),
        short_seq_prob=option(0.1, "the share of pairs shorter than max_seq_len, drawn at random (as BERT's data)",
                              bounds=FRACTION),
        mask_prob=option(0.15, "the share of the non-special tokens masked", bounds=FRACTION),
        max_predictions=option(20, "masked positions per sequence the head predicts (BERT's per 128)",
                               bounds=at_least(1)),
    )

    # BERT's block options (post-norm, erf GELU, LayerNorm eps 1e-12, N(0, 0.02)) and the encoder size.
    config.model = bert_options(size)

    config.optimizer = optimizer_options(learning_rate=1e-4, min_learning_rate=1e-5, warmup_fraction=0.01,
                                         weight_decay=0.01)
    config.train = train_options(batch_size=256, num_steps=100_000, log_every=100, checkpoint_every=5000)

    config.eval = declare(
        ml_collections.ConfigDict(),
        every=eval_every_option("held-out masked-LM and NSP evaluations"),
        batch_size=option(64, "sequence pairs per eval batch", bounds=at_least(1)),
        num_batches=option(8, "eval batches per evaluation (the same ones every time)", bounds=at_least(1)),
    )

    add_mesh(config)
    return config


# --- fine-tuning -------------------------------------------------------------------------------------


def finetune(task: str) -> ml_collections.ConfigDict:
    """BERT fine-tuning on one task of tasks.TASKS: data, optimiser, trainer, eval and mesh sections
    at the task's sizes (configs/bert_finetune.py adds the encoder)."""
    sizes = tasks.TASKS[task]
    config = run_options("finetune")
    declare(config, task=option(task, "the fine-tuning task (lm/data/tasks TASKS)", choices=tuple(tasks.TASKS)))

    config.data = declare(
        ml_collections.ConfigDict(),
        vocab=option("", "a vocab.txt name or path, or a run's tokenizer folder; '' = the init_from run's "
                         "tokenizer, else bert-base-uncased"),
        max_seq_len=option(sizes.max_seq_len, "every row padded (or cut) to this many tokens", bounds=at_least(1)),
        max_train_examples=option(0, "so many training examples, drawn at random with the run's seed (the same for "
                                   "every arm of a seed; a larger draw holds a smaller; 0: all)", bounds=at_least(0)),
        max_eval_examples=option(0, "the first so many examples of each scored split (0: all)", bounds=at_least(0)),
        doc_stride=option(128, "SQuAD: pieces between the starts of a long context's windows", bounds=at_least(1)),
        max_query_length=option(64, "SQuAD: the question's pieces kept", bounds=at_least(1)),
        max_answer_length=option(30, "SQuAD: the longest answer span decoded, in pieces", bounds=at_least(1)),
        n_best=option(20, "SQuAD: start and end candidates per window", bounds=at_least(1)),
    )

    config.optimizer = optimizer_options(learning_rate=1e-4, min_learning_rate=0.0, warmup_fraction=0.1,
                                         weight_decay=0.01)
    config.train = train_options(batch_size=32, num_steps=sizes.num_steps, log_every=50, checkpoint_every=500)

    config.eval = declare(
        ml_collections.ConfigDict(),
        every=eval_every_option("the dev split's loss and the task's scores (dev_*)"),
        batch_size=option(128, "rows per eval batch", bounds=at_least(1)),
    )

    add_mesh(config)
    return config
