"""Per-GPU training memory of a config, and the smallest GPU count that fits it (pure Python, no torch).

``estimate_memory`` adds up what one training process holds at its peak (parameters, gradients and
AdamW state, FSDP gathers or DDP buckets, activations with or without checkpointing, logits, a fixed
GPU overhead); ``plan_memory`` searches GPU counts and micro-batch sizes for the smallest layout that
fits a GPU. Parameter counts come from ``diffsweep.model.counting`` (the same table as the module
tree). The bytes of each term are in ``estimate_memory``'s docstring, those autograd saves per layer
in ``layer_bytes_per_token``'s.

See docs/distributed.md, 'Multi-GPU runs under `diffsweep launch`'.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffsweep.config import Parallel, Precision, ResolvedConfig
from diffsweep.config.kinds import kind_spec
from diffsweep.model import counting

GIB = 1024**3
# Fixed overhead on a GPU (none on CPU): CUDA context ~0.5 GiB, cuBLAS/cuDNN workspaces, NCCL buffers,
# caching-allocator slack.
GPU_OVERHEAD_BYTES = int(1.5 * GIB)
USABLE_FRACTION = 0.9  # of a GPU's memory that the estimate may fill (allocator fragmentation)
FP32 = 4
BF16 = 2
MAX_NODES = 128  # plan_memory stops searching here


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU bytes of one training process at its peak (see ``estimate_memory``)."""

    world_size: int
    micro_batch_size: int
    activation_checkpointing: bool
    compute_bytes: int  # 4 (fp32) or 2 (bf16)
    params: int
    grads: int
    optimizer: int
    fsdp_gather: int  # unsharded units during forward/backward (FSDP, W > 1)
    grad_buckets: int  # DDP gradient buckets (W > 1)
    weight_copies: int  # autocast's bf16 weight copies (bf16 without FSDP)
    optimizer_step_temp: int  # AdamW foreach temporary (GPU)
    activation_per_layer: int  # bytes per layer for this micro-batch, without checkpointing
    activations_full: int  # all layers, without checkpointing
    activations_checkpointed: int  # block inputs + one block, with checkpointing
    logits: int
    overhead: int
    gpu_memory_bytes: int

    @property
    def state(self) -> int:
        """Parameters, gradients, optimizer state and the parallelism's buffers."""
        return self.params + self.grads + self.optimizer + self.fsdp_gather + self.grad_buckets + self.weight_copies

    @property
    def activations(self) -> int:
        """Activations under this estimate's checkpointing setting."""
        return self.activations_checkpointed if self.activation_checkpointing else self.activations_full

    @property
    def total(self) -> int:
        return self.state + max(self.activations + self.logits, self.optimizer_step_temp) + self.overhead

    @property
    def fits(self) -> bool:
        return self.total <= USABLE_FRACTION * self.gpu_memory_bytes


@dataclass(frozen=True)
class MemoryPlan:
    """The smallest layout that fits (``fits``), or why none does (``reason``)."""

    fits: bool
    world_size: int
    nodes: int
    gpus_per_node: int
    micro_batch_size: int
    activation_checkpointing: bool
    estimate: MemoryEstimate  # of the chosen layout, or of the last one tried
    reason: str | None = None

    def describe(self) -> str:
        if not self.fits:
            return f"does not fit: {self.reason}"
        where = f"{self.world_size} GPU" + ("s" if self.world_size != 1 else "")
        if self.nodes > 1:
            where += f" on {self.nodes} nodes"
        ckpt = ", activation checkpointing" if self.activation_checkpointing else ""
        return f"{gb(self.estimate.total)}/GPU on {where}, micro-batch {self.micro_batch_size}{ckpt}"


def gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def compute_bytes(config: ResolvedConfig, device: str) -> int:
    p = config.train.precision
    if p is Precision.BF16 or (p is Precision.AUTO and device != "cpu"):
        return BF16
    return FP32


def _attention_bytes_per_token(config: ResolvedConfig, c: int) -> int:
    """Saved bytes per token of one attention module (after its input norm's output): its kind's
    ``KindSpec.saved_bytes`` plus ``wo``'s contiguous input."""
    a = config.model.attention
    spec = kind_spec(a.kind)
    return spec.saved_bytes(a, c) + c * a.num_heads * spec.v_width * a.head_dim


def _norm_bytes_per_token(d_model: int, readers: int, c: int) -> int:
    """An RMSNorm: fp32 input + normalised tensor, and its output as the reading matmuls save it."""
    return 2 * FP32 * d_model + (FP32 * d_model if c == FP32 else c * d_model * readers)


def layer_bytes_per_token(config: ResolvedConfig, c: int) -> int:
    """Bytes autograd saves per token in one block.

    Counted from what autograd saves for the backward in this code base's modules (checked with
    ``torch.autograd.graph.saved_tensors_hooks`` on a block: the formulas reproduce those bytes
    exactly for every kind in fp32 and bf16). D = d_model, F = ffn_hidden, h = heads, h_kv = K/V
    heads, d = head_dim, c = compute bytes (4 fp32, 2 bf16). The residual stream is fp32 in both
    precisions (the embedding output is fp32 and autocast promotes the residual adds):

    - each RMSNorm saves its fp32 input and the normalised tensor (8·D); its output is saved by the
      matmuls reading it: once (4·D) in fp32, once per reading matmul (2·D each) in bf16, where
      autocast casts it for each of them (attention: wq, wk, wv and V2's wλ; feed-forward: 2);
    - attention saves (each kind's ``KindSpec.saved_bytes``) the rotated Q and K, V, the SDPA outputs
      and a log-sum-exp per query head (fp32), and the contiguous input of ``wo`` (h·v_width·d):
      transformer: Q h·d, K/V h_kv·d each, output h·d (+ per-head RMSNorm: 4·h·d fp32, 8·h·d bf16);
      diff_v1: Q 2h·d, K 2h_kv·d, V 2h_kv·d; two maps each with an output of h·2d (the SDPA backend
      splits V into two QK-wide chunks: four fused calls, each saving its output); the second
      map's output again in fp32 for dλ (4·h·2d); the per-head RMSNorm's fp32 input and normalised
      tensor (8·h·2d);
      diff_v2: Q 2h·d, K/V h_kv·d each, output 2h·d, λ (h per token, fp32 and once cast);
    - SwiGLU saves gate, silu(gate), up and their product: 4·F·c.

    No T×T score matrix is stored (fused SDPA/flash kernels); the ``reference`` backend is not modelled.
    """
    m = config.model
    attn_readers = kind_spec(m.attention.kind).input_readers(m.attention)
    return (_norm_bytes_per_token(m.d_model, attn_readers, c) + _attention_bytes_per_token(config, c)
            + _norm_bytes_per_token(m.d_model, 2, c) + 4 * c * m.ffn_hidden)


def _largest_fsdp_unit(config: ResolvedConfig) -> int:
    m = config.model
    shapes = counting.parameter_shapes(m)
    block = sum(p.numel for name, p in shapes.items() if name.startswith("layers.0."))
    root = sum(p.numel for name, p in shapes.items() if not name.startswith("layers."))
    return max(block, root)


def _matmul_params(config: ResolvedConfig) -> int:
    m = config.model
    head = m.vocab_size * m.d_model  # the output head is a matmul, tied or not (not flagged in the table)
    return sum(p.numel for p in counting.parameter_shapes(m).values() if p.matmul) + head


def estimate_memory(config: ResolvedConfig, *, world_size: int, gpu_memory_bytes: int, device: str = "cuda",
             micro_batch_size: int | None = None, activation_checkpointing: bool | None = None) -> MemoryEstimate:
    """Per-GPU peak training memory of ``config`` on ``world_size`` processes.

    ``device="cpu"`` drops the GPU overhead and the foreach temporary and reads ``precision: auto``
    as fp32. ``micro_batch_size`` and ``activation_checkpointing`` override the config's.

    Bytes per element: fp32 = 4, bf16 = 2. ``precision: auto`` is bf16 on a GPU, fp32 on CPU. bf16
    is autocast with fp32 master weights, so parameters, gradients and AdamW state are fp32 in both.

    Training state (P = parameters, W = world size; FSDP2 shards all three over W, DDP replicates):

    - params 4·P, grads 4·P, optimizer 8·P (AdamW: exp_avg and exp_avg_sq in fp32), each / W with FSDP;
    - FSDP (W > 1): the unsharded unit being computed plus the next one prefetched, in the gathered
      dtype (bf16 under bf16, else fp32), plus its unsharded fp32 gradient before the reduce-scatter:
      (2·gather_bytes + 4)·U, U = the largest FSDP unit (one block, or the root: embeddings + final norm);
    - DDP (W > 1): gradient buckets ≈ the gradients again (4·P; ``gradient_as_bucket_view`` off);
    - bf16 without FSDP: autocast's bf16 copies of every matmul weight (output head included), cached
      for the whole forward and saved for the backward: 2 bytes per matmul parameter;
    - AdamW's step on a GPU (``foreach``) makes a parameter-sized fp32 temporary (4·P, / W with
      FSDP). It happens after the backward, when activations are gone, so the total takes the larger
      of the two, not their sum.

    Activations, per micro-batch of b sequences of T tokens (tokens = b·T), with per-layer the bytes
    of ``layer_bytes_per_token``:

    - without checkpointing: L · per-layer · tokens;
    - with activation checkpointing (per block): L block inputs (4·D fp32 each) plus one block's
      activations recomputed in the backward;
    - plus the final RMSNorm (8·D + the head's input, like a norm read by one matmul).

    Logits (b·T·V elements): the model's logits in the compute dtype, kept by the training loop
    (c), the fp32 log-softmax the loss saves (4), and in the backward its gradient and the logits'
    gradient (4 + 4); under bf16 also the fp32 copy ``logits.float()`` (4): 16 bytes (fp32) or 18
    (bf16) per element.

    Fixed overhead: ``GPU_OVERHEAD_BYTES`` (1.5 GiB) on a GPU; none on CPU. ``plan_memory`` further
    keeps ``USABLE_FRACTION`` of the GPU (fragmentation).

    The total assumes gradients from earlier micro-batches are alive while a later one runs its
    forward (gradient accumulation), so state and activations add up.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    m, t = config.model, config.train
    micro = t.micro_batch_size if micro_batch_size is None else micro_batch_size
    ckpt = t.activation_checkpointing if activation_checkpointing is None else activation_checkpointing
    c = compute_bytes(config, device)
    gpu = device != "cpu"
    P = counting.num_params(m)
    fsdp = t.parallel is Parallel.FSDP and world_size > 1
    shard = world_size if fsdp else 1
    params, grads, optimizer = -(-FP32 * P // shard), -(-FP32 * P // shard), -(-2 * FP32 * P // shard)
    fsdp_gather = (2 * c + FP32) * _largest_fsdp_unit(config) if fsdp else 0
    grad_buckets = FP32 * P if (t.parallel is Parallel.DDP and world_size > 1) else 0
    weight_copies = BF16 * _matmul_params(config) if (c == BF16 and not fsdp) else 0
    step_temp = -(-FP32 * P // shard) if gpu else 0

    tokens = micro * t.seq_len
    per_layer = layer_bytes_per_token(config, c) * tokens
    final_norm = _norm_bytes_per_token(m.d_model, 1, c) * tokens
    full = m.n_layers * per_layer + final_norm
    checkpointed = m.n_layers * FP32 * m.d_model * tokens + per_layer + final_norm
    logits = tokens * m.vocab_size * (c + FP32 + 2 * FP32 + (FP32 if c == BF16 else 0))
    return MemoryEstimate(
        world_size=world_size, micro_batch_size=micro, activation_checkpointing=ckpt, compute_bytes=c,
        params=params, grads=grads, optimizer=optimizer, fsdp_gather=fsdp_gather, grad_buckets=grad_buckets,
        weight_copies=weight_copies, optimizer_step_temp=step_temp, activation_per_layer=per_layer,
        activations_full=full, activations_checkpointed=checkpointed, logits=logits,
        overhead=GPU_OVERHEAD_BYTES if gpu else 0, gpu_memory_bytes=gpu_memory_bytes,
    )


def _divisors_desc(n: int) -> list[int]:
    return [k for k in range(n, 0, -1) if n % k == 0]


def world_sizes(gpus_per_node: int, max_nodes: int = MAX_NODES) -> list[int]:
    """GPU counts tried, smallest first: 1..gpus_per_node on one node, then whole nodes."""
    return list(range(1, gpus_per_node + 1)) + [n * gpus_per_node for n in range(2, max_nodes + 1)]


def plan_memory(config: ResolvedConfig, gpu_memory_bytes: int, gpus_per_node: int, *,
                max_nodes: int = MAX_NODES) -> MemoryPlan:
    """The fewest GPUs (whole nodes beyond one) and, for them, the largest micro-batch that fit.

    A layout is valid when the global batch's sequences (``batch_tokens / seq_len``) divide by
    world size × micro-batch. The config's ``activation_checkpointing`` is kept if set; if not,
    it is switched on only where nothing fits without it at that GPU count (the plan says so).
    """
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    t = config.train
    sequences = t.batch_tokens // t.seq_len
    modes = (True,) if t.activation_checkpointing else (False, True)
    last = None
    for world in world_sizes(gpus_per_node, max_nodes):
        if sequences % world:
            continue
        for ckpt in modes:
            for micro in _divisors_desc(sequences // world):
                e = estimate_memory(config, world_size=world, gpu_memory_bytes=gpu_memory_bytes, micro_batch_size=micro,
                             activation_checkpointing=ckpt)
                if e.fits:
                    nodes = -(-world // gpus_per_node)
                    return MemoryPlan(True, world, nodes, min(world, gpus_per_node), micro, ckpt, e)
                last = e
        if t.parallel is Parallel.DDP and last is not None:
            break  # DDP replicates everything: more GPUs do not lower the per-GPU need
    if last is None:
        last = estimate_memory(config, world_size=1, gpu_memory_bytes=gpu_memory_bytes, micro_batch_size=1,
                        activation_checkpointing=True)
    if t.parallel is Parallel.DDP:
        why = (f"needs {gb(last.total)} per GPU even with activation checkpointing and micro-batch 1 "
               f"(DDP keeps a full replica on every GPU; try train.parallel=fsdp); "
               f"usable per GPU: {gb(USABLE_FRACTION * gpu_memory_bytes)}")
    else:
        why = (f"needs {gb(last.total)} per GPU even with activation checkpointing and micro-batch "
               f"{last.micro_batch_size} on {last.world_size} GPUs ({-(-last.world_size // gpus_per_node)} nodes); "
               f"usable per GPU: {gb(USABLE_FRACTION * gpu_memory_bytes)}")
    return MemoryPlan(False, last.world_size, -(-last.world_size // gpus_per_node), min(last.world_size, gpus_per_node),
                      last.micro_batch_size, last.activation_checkpointing, last, reason=why)

