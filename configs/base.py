"""The base config of every experiment family, one function each: what all of a family's config files
share, before they set their model and their variants. The config files (configs/*.py) build on these;
the trainer's own sections come from lm/train/options.py (run_options, optimizer_options, train_options).

  language_model(dataset)      experiments/language_model.py: Tiny Shakespeare characters (the baby GPT,
                               configs/gpt_shakespeare.py) or token files (configs/gpt2.py)
  translation()                experiments/translation.py: Multi30k de -> en (configs/translate_*.py add the
                               model; translation_test_sizes gives their `test` variants)
  image_classification()       experiments/image_classification.py: CIFAR-10 (configs/vit_cifar10.py adds
                               the model)
  masked_lm(size)              experiments/masked_lm.py: BERT pretraining of one BERT_SIZES encoder
                               (configs/bert.py)
  finetune(task)               experiments/finetune.py: one task of the fine-tuning table (lm/data/tasks
                               TASKS: its kind of head, row length and steps; configs/bert_finetune.py adds
                               the encoder)
"""


import ml_collections

from lm import sharding
from lm.data import tasks
from lm.models.bert import bert_options
from lm.models.config import transformer_options
from lm.train.options import optimizer_options, run_options, train_options


def add_mesh(config: ml_collections.ConfigDict) -> None:
    """Mesh axis sizes (-1: all remaining devices; one device is a 1x1x1x1 mesh) and the rules that map
    logical axis names onto them: see lm/sharding.py."""
    config.mesh = sharding.mesh_options()
    config.sharding_rules = sharding.DEFAULT_RULES


# --- language model ----------------------------------------------------------------------------------


def text_data(dataset: str) -> ml_collections.ConfigDict:
    """A text corpus (lm/data/text.py DATASETS), character level, split train/val."""
    data = ml_collections.ConfigDict()
    data.dataset = dataset
    data.context_length = 64
    data.train_fraction = 0.9
    return data


def token_file_data() -> ml_collections.ConfigDict:
    """Pre-tokenised ids (nanoGPT's train.bin / val.bin, or `lm prepare`'s), GPT-2 BPE by default."""
    data = ml_collections.ConfigDict()
    data.dataset = "token_file"  # token_file | synthetic
    data.train_file = "openwebtext/train.bin"
    data.val_file = "openwebtext/val.bin"
    data.token_dtype = "uint16"
    data.vocab_size = 50257  # GPT-2 BPE
    # The tokenizer.json the token files were made with ("": none, only ids): absolute or relative to
    # $LM_DATA_DIR. Saved into the run, so that lm sample prints text; its vocabulary must be vocab_size.
    data.tokenizer = ""
    data.context_length = 1024
    return data


def language_model(dataset: str = "tinyshakespeare") -> ml_collections.ConfigDict:
    """Next-token prediction with a GPT: dataset "token_file" reads token ids (token_file_data), any
    other names a text corpus (text_data). The model is the baby GPT (4 layers, 4 heads, 128 wide) with
    nanoGPT's Shakespeare optimiser."""
    config = run_options("language_model")
    config.data = token_file_data() if dataset == "token_file" else text_data(dataset)

    # The block options (norm, mlp, position, moe, init, ...) are shared with every Transformer
    # experiment: see lm/models/config.py.
    config.model = transformer_options(num_layers=4, num_heads=4, num_kv_heads=4, embed_dim=128)
    config.model.tie_embeddings = True
    config.model.vocab_multiple = 64  # pad the vocabulary so it divides the 'tensor' mesh axis
    config.model.scale_embeddings = False  # token embeddings times sqrt(D) (Vaswani et al. 3.4)
    config.model.loss_chunk = 0  # positions per cross-entropy chunk (0: the whole (B, T, V) logits at once)

    config.optimizer = optimizer_options(min_learning_rate=1e-4, b2=0.99, weight_decay=0.1)
    config.train = train_options(batch_size=12, num_steps=2000, log_every=50)  # batch_size in windows

    config.eval = ml_collections.ConfigDict()
    config.eval.every = 250
    config.eval.batch_size = 48
    config.eval.num_batches = 8
    config.eval.context_lengths = ()  # val lengths scored after training, e.g. (128,): 2x the training one

    config.sample = ml_collections.ConfigDict()
    config.sample.prompt = "\n"
    config.sample.max_new_tokens = 300
    config.sample.temperature = 0.8
    config.sample.top_k = 40

    add_mesh(config)
    return config


# --- translation -------------------------------------------------------------------------------------


def translation() -> ml_collections.ConfigDict:
    """Multi30k de -> en: data, optimiser, trainer, eval and mesh sections (configs/translate_*.py add
    the model)."""
    config = run_options("translation")

    config.data = ml_collections.ConfigDict()
    config.data.source_lang = "de"
    config.data.target_lang = "en"
    config.data.tokenizer = "sentencepiece"  # sentencepiece | word (lowercased, as the PyTorch tutorials)
    config.data.vocab_size = 8000  # per language, for sentencepiece
    config.data.sentencepiece_model = "unigram"  # unigram | bpe
    config.data.min_freq = 2  # for word: rarer words become <unk>
    config.data.buckets = (16, 24, 32, 48, 64)  # padded lengths; longer training pairs are dropped
    config.data.max_train_pairs = 0  # the first so many training pairs (tokenizers fitted on them too; 0: all)

    config.optimizer = optimizer_options(warmup_steps=200, decay_steps=2500, b2=0.98)
    # 128 sentences a step: 2500 steps are 11 epochs of the 29k training pairs.
    config.train = train_options(num_steps=2500, checkpoint_every=500, label_smoothing=0.1)

    config.eval = ml_collections.ConfigDict()
    config.eval.every = 500
    config.eval.bleu_every = 500  # greedy sacreBLEU on the val split during training (val_bleu); 0: off
    config.eval.batch_size = 128  # sentences, also for decoding
    config.eval.test_split = "test_2016_flickr"  # scored once after training (results.json)
    config.eval.beam_sizes = (1, 4)  # 1 = greedy
    config.eval.length_penalty = 0.6  # GNMT alpha for beam search

    add_mesh(config)
    return config


def translation_test_sizes(config: ml_collections.ConfigDict) -> None:
    """The data, schedule and eval of the translation configs' `test` variants: the first 5000 training
    pairs, a 500-piece vocabulary, two bucket shapes (two compilations), 20 steps, greedy and beam-2
    scoring (on the whole val and test splits); seconds on a CPU."""
    config.data.update(max_train_pairs=5000, vocab_size=500, buckets=(16, 32))
    config.train.update(batch_size=16, num_steps=20, log_every=5, checkpoint_every=10)
    config.optimizer.update(learning_rate=3e-3, warmup_steps=2, decay_steps=20)
    config.eval.update(every=10, bleu_every=0, batch_size=256, beam_sizes=(1, 2))


# --- image classification ----------------------------------------------------------------------------


def image_classification() -> ml_collections.ConfigDict:
    """CIFAR-10: data (and augmentation), optimiser, trainer, eval and mesh sections (configs/vit_cifar10.py
    adds the model)."""
    config = run_options("image_classification")

    config.data = ml_collections.ConfigDict()
    config.data.dataset = "cifar10"
    config.data.num_val = 5000  # held out of the 50k training images, seeded by split_seed
    config.data.split_seed = 0
    config.data.crop_padding = 4  # random crop after zero padding; 0: off
    config.data.flip = True  # random horizontal flip
    config.data.randaugment_ops = 0  # RandAugment ops per image; 0: off
    config.data.randaugment_magnitude = 9.0  # 0..10
    config.data.mixup_alpha = 0.0  # 0: off
    config.data.cutmix_alpha = 0.0  # 0: off (both > 0: one or the other per batch)
    config.data.num_workers = 0  # 0: augment in a background thread; > 0: worker processes; -1: cores less two

    config.optimizer = optimizer_options(warmup_steps=500, decay_steps=10000, weight_decay=0.05)
    config.train = train_options(num_steps=10000, label_smoothing=0.1)  # batch_size in images

    config.eval = ml_collections.ConfigDict()
    config.eval.every = 1000
    config.eval.batch_size = 1000  # images, global (the 5k val and 10k test splits)

    add_mesh(config)
    return config


# --- masked LM (BERT pretraining) --------------------------------------------------------------------


def masked_lm(size: str) -> ml_collections.ConfigDict:
    """BERT pretraining of the `size` encoder (lm/models/bert.py BERT_SIZES) on sentence pairs of the
    English corpus, with bert-base-uncased's vocabulary and BERT-Base's schedule."""
    config = run_options("masked_lm")

    config.data = ml_collections.ConfigDict()
    config.data.corpus = ("gutenberg_books", "us_presidential_speeches")  # $LM_DATA_DIR/corpus/<name>.txt.gz
    config.data.max_documents = 0  # per corpus file, the first ones (0: all)
    config.data.eval_documents = 6  # held out for eval, drawn with seed 0 from all the documents
    config.data.vocab = "bert-base-uncased"  # a vocab.txt name or path; "" trains one of vocab_size pieces
    config.data.vocab_size = 0
    config.data.max_seq_len = 128  # [CLS] A [SEP] B [SEP], padded
    config.data.short_seq_prob = 0.1  # pairs shorter than max_seq_len, drawn at random (as BERT's data)
    config.data.mask_prob = 0.15  # of the non-special tokens
    config.data.max_predictions = 20  # masked positions per sequence the head predicts (BERT's per 128)

    # BERT's block options (post-norm, erf GELU, LayerNorm eps 1e-12, N(0, 0.02)) and the encoder size.
    config.model = bert_options(size)

    config.optimizer = optimizer_options(learning_rate=1e-4, min_learning_rate=1e-5, warmup_steps=1000,
                                         decay_steps=100_000, weight_decay=0.01)
    config.train = train_options(batch_size=256, num_steps=100_000, log_every=100, checkpoint_every=5000)

    config.eval = ml_collections.ConfigDict()
    config.eval.every = 1000
    config.eval.batch_size = 64
    config.eval.num_batches = 8

    add_mesh(config)
    return config


# --- fine-tuning -------------------------------------------------------------------------------------


def finetune(task: str) -> ml_collections.ConfigDict:
    """BERT fine-tuning on one task of tasks.TASKS: data, optimiser, trainer, eval and mesh sections
    at the task's sizes (configs/bert_finetune.py adds the encoder)."""
    sizes = tasks.TASKS[task]
    config = run_options("finetune")
    config.task = task  # a key of tasks.TASKS

    config.data = ml_collections.ConfigDict()
    config.data.vocab = ""  # "": the init_from run's tokenizer (else bert-base-uncased); or a vocab.txt name/path
    config.data.max_seq_len = sizes.max_seq_len  # every row padded (or cut) to this
    config.data.max_train_examples = 0  # the first so many training examples (0: all)
    config.data.max_eval_examples = 0  # the first so many of each scored split (0: all)
    config.data.doc_stride = 128  # SQuAD: pieces between the starts of a long context's windows
    config.data.max_query_length = 64  # SQuAD: the question's pieces kept
    config.data.max_answer_length = 30  # SQuAD: the longest answer span decoded, in pieces
    config.data.n_best = 20  # SQuAD: start and end candidates per window

    config.optimizer = optimizer_options(learning_rate=1e-4, min_learning_rate=0.0,
                                         warmup_steps=sizes.num_steps // 10, decay_steps=sizes.num_steps,
                                         weight_decay=0.01)
    config.train = train_options(batch_size=32, num_steps=sizes.num_steps, log_every=50, checkpoint_every=500)

    config.eval = ml_collections.ConfigDict()
    config.eval.every = 250  # the trainer's loss on the dev split, and the task's scores (dev_*)
    config.eval.batch_size = 128

    add_mesh(config)
    return config
