"""Fields every credit-model config shares, with their defaults (one comment per field).

`base_config()` is the experiments' starting point (configs/NAME.py) and, with
data.labels_dir set, the config `hindsight train` runs by default (`generic_config`).
"""

from ml_collections import ConfigDict

from hindsight.labeling.config import label_node


def base_config() -> ConfigDict:
  c = ConfigDict()
  c.seed = 0  # root of every key: the split, the initialisation, dropout, the batch order
  # Ensemble member m > 0: the same split, its own initialisation, dropout and batch order
  # (`hindsight eval --checkpoint A,B,C` scores the members as one ensemble).
  c.member = 0
  # Fine-tune: start from the model of this run's workdir, the step its report scored (its
  # parameters, model config and DataSpec; a fresh optimizer and schedule). "" = fresh.
  c.init_from = ""

  c.data = ConfigDict()
  c.data.labels_dir = ""  # label dataset (the --out of `hindsight label`); "" = WORKDIR/labels
  # The labeling job that makes WORKDIR/labels when it is missing: its env, episodes and
  # seed, and every field of the LabelConfig it labels with, under LabelConfig's own names
  # (num_rollouts: K branches per arm and step; replacement: q(a'|s, a); gamma, exact,
  # decorative_tolerance, confidence, stratify: hindsight.labeling.config.LabelConfig).
  c.data.label = label_node(num_rollouts=32)
  c.data.label.env = ""  # env spec (`hindsight label --env`); "" = labels must exist already
  c.data.label.episodes = 0  # episodes to label
  c.data.label.seed = 0  # the labeling job's seed
  c.data.mix_labels_dir = ""  # a second label dataset appended to the first ("" = none)
  c.data.mix_episodes = 0  # ... its first N episodes (0 = all)
  c.data.validation_fraction = 0.1  # share of episodes held out for checkpoint selection
  c.data.test_fraction = 0.1  # share of episodes held out for the report
  c.data.num_buckets = 4  # length buckets (padded shapes, so compiled programs)
  # The step encoder (hindsight.model.encoders): "" = the data's kind (discrete ids, float
  # vectors, text steps), or a registered kind by name (a plug-in's own).
  c.data.encoder = ""
  c.data.batch_size = 32  # episodes per global batch (a multiple of the device count)

  c.model = ConfigDict()
  c.model.width = 64  # token width
  c.model.depth = 2  # transformer blocks
  c.model.num_heads = 4  # attention heads
  c.model.mlp_ratio = 4  # block MLP hidden size / width
  c.model.dropout = 0.0  # dropout on attention and MLP outputs (training only)
  c.model.compute_dtype = ""  # "bfloat16": blocks compute in bf16, parameters float32

  c.optim = ConfigDict()
  c.optim.learning_rate = 1e-3  # peak AdamW learning rate
  c.optim.warmup_steps = 100  # linear warmup from 0
  c.optim.final_lr_ratio = 0.01  # cosine decay ends at this share of the peak
  c.optim.weight_decay = 1e-4  # AdamW decoupled weight decay
  c.optim.clip_norm = 1.0  # global gradient norm clip
  c.optim.b1 = 0.9  # Adam beta1
  c.optim.b2 = 0.99  # Adam beta2

  c.loss = ConfigDict()
  c.loss.class_weight = 0.1  # weight of the klass cross-entropy beside the Gaussian NLL
  c.loss.beta = 0.5  # beta-NLL exponent: 0 = plain NLL, 0.5 keeps rare large credits fitted
  c.loss.zero_weight = 0.1  # weight of the P(credit exactly 0) cross-entropy
  c.loss.agent_weight = 1.0  # weight of the agent-level Shapley NLL (multi-agent datasets)
  c.loss.no_label_noise = False  # True: labels treated as exact (no e_t^2 in the NLL; ablation)
  # True: P(credit exactly 0) also learns labels whose K branch pairs all tied, not only the
  # steps that cannot differ (stderr 0). Right where the truth ties too (key_to_door: the
  # K=1024 reference ties on the same steps); where credits are continuous a tie is an
  # artifact of K (at K=8 most steps tie, and the median would be 0 everywhere).
  c.loss.zero_ties = False
  # True: the NLL's label noise e_t is the label's plain sample stderr, not its honest stderr,
  # which is a conservative tie bound where fewer than 5 of K branches left the largest tie.
  # Text and agent labels (independent arms of 0/1 outcomes at K = 2-16) are all bounded, so
  # the bound (about twice their noise) would leave the model's own spread nothing to explain
  # (docs/agents-text.md, "The credit model on agent traces"). The symbolic configs keep the
  # bound (paired branches: there a bound marks a rare event the sample stderr misses).
  c.loss.sample_noise = False

  c.train = ConfigDict()
  c.train.steps = 2000  # optimizer steps
  c.train.log_every = 50  # steps between training metrics (TensorBoard, progress bar)
  c.train.eval_every = 250  # steps between validation + checkpoint
  # Stop once the validation loss has not improved for this many steps (checked at each
  # validation; 0: train all train.steps). The learning-rate schedule stays the one of
  # train.steps; the report says where the run stopped.
  c.train.patience = 0
  c.train.progress = True  # console progress bars

  c.checkpoint = ConfigDict()
  c.checkpoint.keep = 3  # latest checkpoints kept (the best by validation loss is kept too)
  c.checkpoint.fallback = False  # on a damaged checkpoint, resume from the previous good one
  # The checkpoint scored on the test split and loaded by eval, serve, score and audit by
  # default: "last" (the cosine schedule's end, where the learning rate is 1% of its peak)
  # or "best" (lowest validation loss). "best" picks among a plateau's checkpoints by noise
  # whose ordering float rounding decides, so another CPU picks another model.
  c.checkpoint.evaluate = "last"

  c.mesh = ConfigDict()
  c.mesh.devices = -1  # devices to use, the first N of jax.devices() (-1: all)
  c.mesh.data = -1  # devices on the data axis (-1: all that fsdp leaves)
  c.mesh.fsdp = 1  # devices parameters are sharded over (1 = replicated)
  c.mesh.tp = 1  # devices a language model's heads and MLP are split over (Tunix's tp axis)
  c.mesh.min_fsdp_size = 2**14  # arrays smaller than this stay replicated

  c.distributed = ConfigDict()
  c.distributed.coordinator = ""  # host:port of process 0; "" = a single process
  c.distributed.num_processes = 1  # processes in the run
  c.distributed.process_id = 0  # this process's index
  return c


def with_variant(c: ConfigDict, arg: str, smoke_episodes: int = 64) -> ConfigDict:
  """`get_config(arg)`'s variants: "" (the config as is) or "smoke"."""
  if arg == "smoke":
    return smoke(c, smoke_episodes)
  if arg:
    raise ValueError(f"unknown variant {arg!r} (expected '' or 'smoke')")
  return c


def smoke(c: ConfigDict, episodes: int = 64) -> ConfigDict:
  """A tiny variant for tests: few episodes and rollouts, a small model, a few steps."""
  c.data.label.episodes = episodes
  c.data.label.num_rollouts = 8
  c.data.batch_size = 8
  c.data.num_buckets = 2
  c.model.width = 16
  c.model.depth = 1
  c.model.num_heads = 2
  c.model.mlp_ratio = 2
  c.optim.warmup_steps = 5
  c.train.steps = 40
  c.train.log_every = 10
  c.train.eval_every = 10
  c.train.progress = False
  return c


def generic_config(arg: str = "") -> ConfigDict:
  """The credit model on any label dataset (data.labels_dir, required), as
  configs/generic.py and `hindsight train` without --config."""
  c = base_config()
  c.data.labels_dir = ""  # required: set with --labels DIR or --config.data.labels_dir=DIR
  return with_variant(c, arg)
