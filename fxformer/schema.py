"""Every config field, with its default: the paper's base model, optimizer and data (sections 3,
5, 6). One home for the fields: the configs in configs/ start from `defaults()` and override some,
and a workdir's config.json written before a field existed gets it from here
(`fxformer.config.upgrade`). A new field is one line here, plus, if some of its values cannot
run, one check in `fxformer.config.validate`.
"""

import ml_collections


def defaults() -> ml_collections.ConfigDict:
    """The paper's base model, optimizer and data, and fxformer's defaults for the rest."""
    config = ml_collections.ConfigDict()
    config.model = model_section()
    config.data = data_section()
    config.label_smoothing = 0.1  # eps_ls
    config.warmup_steps = 4000
    config.learning_rate_scale = 1.0  # multiplies d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    config.adam_b1 = 0.9
    config.adam_b2 = 0.98
    config.adam_eps = 1e-9
    # True: Adam's update over every parameter as one flat vector (optax.flatten): a few large
    # element-wise kernels instead of several per parameter; the moments are then one vector too, so
    # a checkpoint of one layout does not resume with the other
    config.flat_update = False
    config.grad_accum_steps = 1  # micro-batches per step, to reach the paper's batch on fewer devices
    config.loss_chunk_tokens = 0  # > 0: output projection and loss this many target tokens at a time (memory)

    config.num_train_steps = 100_000
    config.checkpoint_every_steps = 1500  # ~10 minutes at the paper's 0.4 s/step, on any hardware
    config.checkpoint_every_minutes = 10.0  # the paper averages checkpoints 10 minutes apart (0 = off)
    config.keep_checkpoints = 20
    config.log_every_steps = 100
    config.eval_every_steps = 5000
    config.eval_batches = 0  # dev batches per periodic evaluation (0 = the whole split)
    config.seed = 0
    config.dev_bleu_every_steps = 0  # beam-search BLEU on the dev split's first sentences (0 = off; slow)
    config.dev_bleu_sentences = 200  # how many (0 = the whole dev split)
    config.best_metric = "dev_ppl"  # dev_ppl, dev_loss, dev_nll, dev_accuracy, dev_bleu: best kept in W/best ("" = off)
    config.early_stopping_patience = 0  # stop after this many dev evaluations without a better best_metric
    config.early_stopping_min_delta = 0.0  # better counts only by this share of the last improvement (0.01: 1%)
    config.train_minutes = 0.0  # stop (saving, exit 75) after this many minutes of training (0 = no limit)
    config.divergence_factor = 4.0  # stop above 4x the run's best and best + 2 nats, or 3 ln(V) (0 = only non-finite)
    config.decode = decode_section()  # how evaluate, translate and dev BLEU search (section 6.1)
    config.average_last = 5  # checkpoints averaged for the final evaluation
    # smoothed weights: an exponential moving average of the parameters kept in the state with this
    # decay ("0" = off; "0.9999", Marian's smoothing 1e-4; several "0.9999,0.999"), evaluated as --step=ema
    config.ema_decay = "0"
    return config


def model_section() -> ml_collections.ConfigDict:
    """The Transformer (section 3): sizes, dropout, positions, and the named departures."""
    section = ml_collections.ConfigDict()
    section.num_layers = 6  # N
    section.d_model = 512
    section.d_ff = 2048
    section.num_heads = 8  # h
    section.d_k = 0  # 0: d_model / h (64); resolved when the config is loaded
    section.d_v = 0  # 0: d_model / h (64)
    section.dropout_rate = 0.1  # P_drop
    section.attention_dropout_rate = 0.0  # departure when > 0
    section.relu_dropout_rate = 0.0  # departure when > 0
    section.positional = "sinusoidal"  # or "learned" (Table 3 row E)
    section.max_len = 512  # positional table size; >= data.max_length
    section.norm = "post"  # or "pre" (departure)
    section.attention_bias = False  # the paper's W^Q, W^K, W^V, W^O have no biases (True: departure)
    # Departures a Marian (OPUS-MT) model needs, each named (docs/interop.md):
    section.activation = "relu"  # the feed-forward's max(0, .); "swish" (SiLU) or "gelu" (the exact, erf form)
    section.sinusoid_layout = "interleaved"  # sin at even features, cos at odd; "halves": sines, then cosines
    section.layer_norm_epsilon = 1e-6  # every LayerNorm's eps (the paper names none; Marian's is 1e-5)
    section.output_bias = False  # True: a bias on the vocabulary logits (Marian's final_logits_bias)
    section.scale_embedding = True  # embeddings times sqrt(d_model) (3.4); False: unscaled
    section.dtype = "float32"  # or "bfloat16" compute with float32 parameters
    section.attention_impl = "xla"  # or "cudnn" (fused, GPU, bfloat16, d_k == d_v) or "auto"
    # the kernel options below compute the same model (tests/test_kernels.py); the defaults keep the step as it was
    section.segment_attention = "mask"  # "cudnn_offsets" / "pallas": packed rows' attention skips what no segment sees
    section.segment_block_k = 64  # segment_attention=pallas: keys per tile (a power of two, 16 or more)
    section.qkv_projection = "separate"  # "merged": self-attention's Q, K, V projections as one product
    section.dropout_bits = 32  # 8: dropout masks from bytes, a quarter of the random-number work (keep 230/256 at 0.1)
    # "fused": post-norm's LayerNorm(x + Dropout(y)) with its own one-pass gradient; "pallas": the
    # dropout, the sum and the norm in one kernel, the mask from counters in it (the ReLU's dropout too)
    section.residual_norm = "flax"
    # "one_pass": the loss's four sums in one pass over the [tokens, vocab] logits; "fused": the
    # pre-softmax projection and the loss in one kernel, the logits never written to memory
    section.loss_impl = "reductions"
    return section


def data_section() -> ml_collections.ConfigDict:
    """The corpus, its tokenizer and the batches (section 5.1)."""
    section = ml_collections.ConfigDict()
    section.dataset = "wmt14_translate/de-en"  # TFDS name; "embedded", "embedded2" or "text" for the others
    section.source_lang = "en"
    section.target_lang = "de"
    section.tfds_data_dir = ""  # TFDS data directory ("" = TFDS default, ~/tensorflow_datasets)
    section.manual_dir = ""  # TFDS manual-download directory for WMT files
    section.num_train = 40_000  # embedded corpus: pairs per split, and the grammar's seed
    section.num_validation = 1_000
    section.num_test = 1_000
    section.corpus_seed = 0
    section.source_file = ""  # dataset "text": line-aligned source and target files (plain or .gz)
    section.target_file = ""
    section.validation_source_file = ""  # dataset "text": separate validation and test files
    section.validation_target_file = ""  # (the usual valid.en / valid.de, test.en / test.de)
    section.test_source_file = ""
    section.test_target_file = ""
    section.heldout = 1000  # dataset "text" without those files: the last 2 x heldout pairs are validation, test
    section.train_pairs = 0  # dataset "text": train on the first this many training pairs only (0 = all)
    section.train_split = "train"
    section.eval_split = "validation"  # newstest2013
    section.test_split = "test"  # newstest2014
    section.vocab_size = 37000  # one shared source-target BPE vocabulary
    section.tokenizer_sentences = 2_000_000  # sentencepiece training sample cap
    section.max_length = 256  # tokens per side, before packing
    section.overlong = "drop"  # or "truncate"
    section.tokens_per_batch = 25_000  # per side, global, per step (paper: ~25,000 + 25,000)
    section.eval_batch_size = 64  # sentences per evaluation batch, global
    section.shuffle_seed = 0
    section.workers = 0  # grain processes making training batches (0 = in the training process)
    section.device_prefetch = 0  # training batches placed on the devices ahead of their step (0 = off)
    section.num_shards = 0  # training-data shards (0 = one per process); a fixed count makes the
    # data order independent of the process count (a run still resumes only on as many processes)
    return section


def decode_section() -> ml_collections.ConfigDict:
    """How evaluate, translate and dev BLEU search (section 6.1): beam search with a length penalty."""
    section = ml_collections.ConfigDict()
    section.strategy = "beam"  # beam, greedy or sample
    section.beam_size = 4
    section.alpha = 0.6  # GNMT length penalty ((5 + |Y|) / 6)^alpha
    section.beam_variant = "live"  # live (fxformer's) or t2t (tensor2tensor's, the paper's code: 2k candidates, k live)
    section.max_extra = 50  # maximum output length = input length + 50
    section.nbest = 1  # translations per input (beam: at most beam_size; sample: samples per input)
    section.temperature = 1.0  # sampling: softmax(log p / temperature)
    section.top_k = 0  # sampling: only the k most probable tokens (0 = all)
    section.seed = 0  # sampling: the same seed gives the same samples
    return section
