/*
 * rl_keys.c - every spec key the RL classes read, declared once.
 *
 * One table per section (model, rl, task, reward, tools) and one for a
 * group's own settings. The same tables serve three readers:
 *   - the spec loader (runtime/spec, manta_spec_options.sections), which
 *     checks a spec against them before anything starts: an unknown key or
 *     a wrong type is an error at file:line:col with a "did you mean";
 *   - the arg readers of rl_util.c (rl_arg_int ...), which refuse to read a
 *     key that is not declared here, or with another type, default or range
 *     than declared (an internal error, so a test fails on the first run);
 *   - the documentation: `manta help spec` prints them as Markdown, and
 *     docs/spec-keys.md is that output (tests/spec checks it is current).
 * A default in parentheses is computed at run time and described, not
 * compared. To add a key: add a row here, read it with rl_arg_*, and
 * regenerate the docs (`./build/manta help spec > docs/spec-keys.md`).
 */
#include "rl_util.h"

#include <math.h>
#include <stdint.h>

#define END                                                                                        \
    {                                                                                              \
        NULL, 0, 0, 0, NULL, NULL, NULL, NULL, 0                                                   \
    }
#define I MANTA_SPEC_K_INT
#define N MANTA_SPEC_K_NUM
#define S MANTA_SPEC_K_STR
#define B MANTA_SPEC_K_BOOL
#define M MANTA_SPEC_K_MAP
#define L MANTA_SPEC_K_LIST

/* The policy (policy.c). Two ways to name it: model.path, or the size of a
 * fresh GPT-2 (n_layer ... seed); the two are exclusive. */
static const manta_spec_key model_keys[] = {
    {"path", S, 0, 0, NULL,
     "a Hugging Face model folder (config.json and safetensors) or a GGUF file (llama "
     "architecture; F32, F16, BF16, Q8_0, Q4_0, Q4_1, dequantised to F32) to start from; "
     "exclusive with n_layer, n_head, n_embd, block_size and seed",
     NULL, NULL, 0},
    {"tokenizer", S, 0, 0, "auto",
     "bytes (the byte-level vocabulary), a tokenizer.json or GGUF path, or auto (a GGUF file's "
     "own tokenizer; the folder's tokenizer.json when it has one; else bytes)",
     NULL, NULL, 0},
    {"chat_format", S, 0, 0, "auto",
     "the chat template of a tokenizer: auto (from its special tokens), chatml or llama3", NULL,
     NULL, 0},
    {"context", I, 4, 1 << 24, "(min(block_size, 2048))",
     "KV-cache positions per rollout slot (prompt and answer); at most the model's block_size",
     NULL, NULL, 0},
    {"max_seq", I, 2, 1 << 24, "(model.context)",
     "the learner's longest training sequence; at most the model's block_size", NULL, NULL, 0},
    {"device", S, 0, 0, "cpu",
     "where rollouts and learners run the policy: cpu, or cuda (the CUDA back-end, "
     "libmanta_cuda.so; each actor uses the GPUs its node agent gave it: a learner or rollout "
     "group without resources.gpu then gets 1/N of one GPU, N the replicas of all such groups, "
     "rounded down to a thousandth, so that they share one device; a resources.gpu given wins)",
     "cpu|cuda", NULL, 0},
    {"matmul", S, 0, 0, "fp32",
     "how the CUDA back-end's float matrix products multiply (mk_backend_set_math): fp32, or "
     "tf32 / bf16: parameters, gradients, activations and AdamW state stay float (FP32 master "
     "weights) and each product rounds its operands to TF32 or bfloat16 for the tensor cores, "
     "with float sums (mixed precision); learners and rollouts alike.  Needs device: cuda",
     "fp32|tf32|bf16", NULL, 0},
    {"bf16_weights", B, 0, 0, "false",
     "rollouts decode with bfloat16 copies of the product weights (the kernels' "
     "MK_MODEL_BF16_WEIGHTS; float activations and sums): on the CPU about 1.5-2x the tokens/s "
     "of a big model, whose decoding is bound by reading its weights; behaviour log-probs then "
     "differ from the learner's float recomputation by the weights' rounding, which the "
     "importance ratios absorb",
     NULL, NULL, 0},
    {"bf16_train", B, 0, 0, "false",
     "learners train in mixed precision with bfloat16 storage (the kernels' "
     "MK_MODEL_BF16_TRAIN): the product weights are used as bfloat16 copies remade from the "
     "float master weights after each step, the products' inputs are kept for the backward "
     "pass in bfloat16 only (half their memory), and every product multiplies bfloat16 "
     "operands with float sums, forward and backward, as PyTorch's autocast does; gradients, "
     "AdamW state, norms, attention and the loss stay float.  On cuda, cuBLAS bfloat16 GEMMs "
     "on the tensor cores; on the CPU the same numerics, slower than float",
     NULL, NULL, 0},
    {"bf16_products", B, 0, 0, "false",
     "rollouts' products also round their activations to bfloat16 and sum the bfloat16 "
     "products in float (the kernels' MK_MODEL_BF16_PRODUCTS, as PyTorch's bfloat16 models "
     "and tensor cores do; implies bf16_weights): on a CPU with AMX (Intel Sapphire Rapids "
     "on) the products run on its tile unit, about 1.4x the tokens/s of bf16_weights (2x "
     "PyTorch bf16) at 16 slots of a 0.5B model; without AMX slower than bf16_weights (the same "
     "numerics in float); on cuda, "
     "cuBLAS bfloat16 GEMMs.  Behaviour log-probs move a little further from the learner's "
     "float recomputation",
     NULL, NULL, 0},
    {"kv_cache", S, 0, 0, "f32",
     "what rollouts' decoders keep their key and value caches in: f32, or bf16 (the kernels' "
     "MK_MODEL_BF16_KV: keys and values rounded to bfloat16 as they are stored, widened "
     "exactly as attention reads them; queries, scores, softmax and sums stay float): half the "
     "cache memory and half the cache traffic of attention, which dominates decoding at long "
     "contexts.  Behaviour log-probs move a little from the learner's float recomputation "
     "(relative 2^-9 rounding of each cached value)",
     "f32|bf16", NULL, 0},
    {"n_layer", I, 1, 1024, "2",
     "fresh GPT-2 (vocabulary 260, or the tokenizer's size): transformer layers", NULL, NULL, 0},
    {"n_head", I, 1, 1024, "4", "fresh GPT-2: attention heads (n_embd must be a multiple)", NULL,
     NULL, 0},
    {"n_embd", I, 1, 1 << 16, "64", "fresh GPT-2: embedding width", NULL, NULL, 0},
    {"block_size", I, 4, 1 << 20, "64", "fresh GPT-2: longest sequence (positions)", NULL, NULL, 0},
    {"seed", I, 0, (double)INT64_MAX, "1", "fresh GPT-2: the initialisation seed", NULL, NULL, 0},
    END};

/* rl.warmup: until when the supervised warm-up on task.demos runs. */
static const manta_spec_key warmup_keys[] = {
    {"until_loss", N, 0, INFINITY, NULL, "stop once the demonstrations' mean loss is at most this",
     NULL, NULL, 0},
    {"until_success", N, 0, 1, NULL,
     "stop once this share of the demonstrations is reproduced by greedy decoding", NULL, NULL, 0},
    {"max_steps", I, 1, 1 << 30, "1000", "stop after this many steps whatever the rule says", NULL,
     NULL, 0},
    END};

/* The training loop (controller.c, learner.c, rollout.c). */
static const manta_spec_key rl_keys[] = {
    {"group_size", I, 1, 1 << 16, "8", "episodes sampled per prompt (a GRPO group)", NULL, NULL, 0},
    {"batch_episodes", I, 1, 1 << 24, "64",
     "episodes per training batch (a multiple of group_size)", NULL, NULL, 0},
    {"eta", I, 0, 1 << 20, "2",
     "staleness bound: an episode sampled with policy version v trains version <= v + eta", NULL,
     NULL, 0},
    {"lr", N, 0, 1e3, "0.001", "AdamW learning rate of the RL steps", NULL, NULL, 0},
    {"beta1", N, 0, 1, "0.9", "AdamW beta1", NULL, NULL, 0},
    {"beta2", N, 0, 1, "0.99", "AdamW beta2", NULL, NULL, 0},
    {"weight_decay", N, 0, 1e3, "0", "AdamW weight decay", NULL, NULL, 0},
    {"grad_clip", N, 0, 1e9, "1", "clip the gradient's global norm to this (0: no clipping)", NULL,
     NULL, 0},
    {"clip_low", N, 0, 1, "0.2", "PPO ratio clip below 1 (1 - clip_low)", NULL, NULL, 0},
    {"clip_high", N, 0, 1e3, "0.28", "PPO ratio clip above 1 (1 + clip_high; DAPO's clip-higher)",
     NULL, NULL, 0},
    {"ratio_cap", N, 0, 1e9, "3",
     "dual-clip constant: with a negative advantage the loss is at most -ratio_cap * A (0: none)",
     NULL, NULL, 0},
    {"entropy_coef", N, -1e3, 1e3, "0", "entropy bonus coefficient", NULL, NULL, 0},
    {"bucket_mb", N, 1e-3, 1 << 20, "4",
     "largest weight bucket (MiB): a learner shard publishes its slice of the weights in buckets "
     "of this size",
     NULL, NULL, 0},
    {"warmup", M, 0, 0, "({until_success: 0.9})",
     "supervised warm-up on task.demos until the demo loss is <= until_loss and/or the share of "
     "demonstrations reproduced is >= until_success (both given: both), at most max_steps; with "
     "neither threshold exactly max_steps; the default applies when task.demos is given and "
     "neither warmup nor warmup_steps is (actors/README.md, \"Choosing the settings for a new "
     "task\")",
     NULL, warmup_keys, 0},
    {"warmup_steps", I, 0, 1 << 30, "(none)",
     "exactly this many warm-up steps (0: none); when given, rl.warmup is not used (the log says "
     "so)",
     NULL, NULL, 0},
    {"warmup_lr", N, 0, 1e3, "(rl.lr)", "learning rate of the warm-up steps", NULL, NULL, 0},
    {"warmup_batch", I, 1, 1 << 24, "64", "demonstrations per warm-up step", NULL, NULL, 0},
    {"dynamic_sampling", B, 0, 0, "true",
     "drop groups whose rewards are all equal (ledger reason no_signal) and fill the batch with "
     "others; false trains on them with advantage 0",
     NULL, NULL, 0},
    {"no_reward_warn_versions", I, 0, 1 << 30, "50",
     "warn once N x batch_episodes training episodes in a row were scored with reward <= 0, on the "
     "terminal, in metrics.jsonl and summary.json (0: never)",
     NULL, NULL, 0},
    {"temperature", N, 0, 1e3, "1",
     "sampling temperature of the rollouts (evaluation episodes are greedy)", NULL, NULL, 0},
    {"top_p", N, 0, 1, "1", "nucleus sampling: keep the smallest set of tokens with this mass",
     NULL, NULL, 0},
    {"max_new_tokens", I, 1, 1 << 20, "32", "tokens the policy may write per turn", NULL, NULL, 0},
    {"max_turns", I, 0, 1 << 20, "2", "tool calls per episode (one more ends it)", NULL, NULL, 0},
    {"slots", I, 1, 1 << 16, "32", "episodes a rollout actor decodes at once", NULL, NULL, 0},
    {"max_versions", I, 0, 1 << 30, "100", "stop after this many policy versions", NULL, NULL, 0},
    {"max_time_s", N, 0, 1e9, "600", "stop after this many seconds", NULL, NULL, 0},
    {"eval_every", I, 0, 1 << 30, "10",
     "measure held-out success every N versions (0: only at "
     "the start and the end)",
     NULL, NULL, 0},
    {"eval_problems", I, 0, 1 << 30, "200", "held-out problems per measurement", NULL, NULL, 0},
    {"stop_at", N, 0, 1e9, "2", "stop once held-out success reaches this (the default 2: never)",
     NULL, NULL, 0},
    {"max_missing_s", N, 0, 1e9, "30",
     "how long episodes may be dropped for \"no reward actor\" or \"no env actor\" with no actor "
     "of that group at work before the run fails naming the group",
     NULL, NULL, 0},
    {"checkpoint_every", I, 0, 1 << 30, "20",
     "write a checkpoint (weights, AdamW state, data position, ledger) to RUN_DIR/checkpoints "
     "every this many versions, and at version 0 (0: never)",
     NULL, NULL, 0},
    {"checkpoint_keep", I, 1, 1 << 20, "2", "how many of the newest checkpoints are kept", NULL,
     NULL, 0},
    {"resume", MANTA_SPEC_K_ANY, 0, 0, "false",
     "true: continue from the newest checkpoint of rl.run_dir; a folder: from that run or "
     "checkpoint folder (manta run SPEC --resume [RUN_DIR] sets it)",
     NULL, NULL, 0},
    {"max_error_drop_rate", N, 0, 1, "0.5",
     "fail the run when more than this share of a window of 4 x batch_episodes training "
     "episodes is dropped for errors",
     NULL, NULL, 0},
    {"collective", S, 0, 0, "auto",
     "how learner shards sum gradients and gather parameters: host (ZeroMQ, host memory; "
     "parameters and gradients on a GPU go through the host), nccl (NCCL on the GPUs' memory: "
     "needs model.device cuda and libmanta_nccl.so), auto (nccl when the learners run on cuda, "
     "there are 2 or more and libmanta_nccl.so loads; host otherwise)",
     NULL, NULL, 0},
    {"bucket_dtype", S, 0, 0, "f32",
     "what weight buckets carry: f32 (the learners' float parameters as they are), or bf16 "
     "(each rounded to bfloat16, nearest even: half the bytes to publish, fetch and check, and "
     "rollouts widen them back; for rollouts that decode with bf16_weights, whose products use "
     "rounded weights anyway, the extra rounding is that of the embeddings, norms and biases). "
     "Device-to-device copies (weight_sync auto) stay float",
     "f32|bf16", NULL, 0},
    {"weight_sync", S, 0, 0, "auto",
     "how rollouts get new weights: buckets (host copies fetched as objects, from any machine), "
     "auto (also device to device, CUDA IPC, when a learner shard and a rollout are on cuda on "
     "one machine and the GPU driver allows it; buckets otherwise and as the fallback)",
     NULL, NULL, 0},
    {"collective_timeout_s", N, 0.1, 86400, "60",
     "a learner shard later than this in a collective (or in joining the group) has failed: the "
     "step fails",
     NULL, NULL, 0},
    {"micro_batch", I, 0, 1 << 24, "0",
     "sequences per forward/backward pass in a learner shard; their gradients add up to the "
     "batch's (0: the shard's whole batch at once)",
     NULL, NULL, 0},
    {"step_timeout_s", N, 1, 86400, "600",
     "deadline of one learner step (warm-up or RL); a step past it counts as failed", NULL, NULL,
     0},
    {"max_step_failures", I, 1, 1 << 30, "10",
     "stop after this many failed training steps in a "
     "row",
     NULL, NULL, 0},
    {"run_dir", S, 0, 0, "(runs/JOB)",
     "where summary.json, metrics.jsonl, the ledger and checkpoints go; the learners' save, "
     "checkpoint and restore take only paths inside it",
     NULL, NULL, 0},
    END};

/* The task's data (controller.c). */
static const manta_spec_key task_keys[] = {
    {"train", S, 0, 0, NULL, "training problems, one JSON object a line: {prompt, answer}", NULL,
     NULL, 0},
    {"heldout", S, 0, 0, NULL, "held-out problems, same format, never trained on", NULL, NULL, 0},
    {"demos", S, 0, 0, NULL,
     "demonstrations for the warm-up: {prompt, segments: [[policy|tool, text] ...]} a line", NULL,
     NULL, 0},
    {"system", S, 0, 0, NULL,
     "the system message of every conversation (needs a tokenizer and chat format); none: the "
     "template's default",
     NULL, NULL, 0},
    {"tools_in_system", B, 0, 0, "true",
     "the chat template lists the tools' definitions in the system message (ChatML: Qwen2.5's "
     "tool block); false leaves them out (task.system then says how to call)",
     NULL, NULL, 0},
    END};

/* How an answer is scored (reward.c). */
static const manta_spec_key reward_keys[] = {
    {"rule", S, 0, 0, "exact",
     "exact (the answer equals the reference), numeric (within a relative tolerance) or http (POST "
     "to url)",
     "exact|numeric|http", NULL, 0},
    {"tolerance", N, 0, 1e300, "1e-06", "numeric: the largest difference that scores 1", NULL, NULL,
     0},
    {"url", S, 0, 0, NULL,
     "http: where to POST {\"response\", \"reference\"}; the answer is {\"reward\": x}", NULL, NULL,
     0},
    END};

/* One tool (env.c, mcp.c; policy.c renders them for a chat template). */
static const manta_spec_key tool_keys[] = {
    {"url", S, 0, 0, NULL, "the MCP server's streamable-HTTP endpoint", NULL, NULL,
     MANTA_SPEC_REQUIRED},
    {"name", S, 0, 0, "calc", "the name the policy calls the tool by (<call> tag, chat template)",
     NULL, NULL, 0},
    {"tool", S, 0, 0, "(name)", "the MCP tool to call on the server", NULL, NULL, 0},
    {"arg", S, 0, 0, "(from inputSchema)",
     "the argument the call's text goes to; absent: the tool's one required string property", NULL,
     NULL, 0},
    {"timeout_ms", I, 0, 3600000, "10000", "one call's deadline", NULL, NULL, 0},
    {"max_connections", I, 1, 1024, "16",
     "requests on the wire at once to this server (kept-alive connections)", NULL, NULL, 0},
    {"retries", I, 0, 100, "5",
     "retries of a transport failure (refused, reset, timeout, HTTP 5xx), with back-off from "
     "backoff_ms doubling up to backoff_max_ms; then the episode is dropped with its reason",
     NULL, NULL, 0},
    {"backoff_ms", I, 1, 600000, "250", "first retry delay, doubled each time", NULL, NULL, 0},
    {"backoff_max_ms", I, 1, 3600000, "4000", "the longest retry delay", NULL, NULL, 0},
    END};

const manta_spec_key rl_spec_sections[] = {
    {"model", M, 0, 0, NULL, "the policy: a Hugging Face folder, or a fresh GPT-2 of a given size",
     NULL, model_keys, MANTA_SPEC_IN_SETTINGS},
    {"rl", M, 0, 0, NULL, "the training loop: sampling, optimiser, warm-up, stopping", NULL,
     rl_keys, MANTA_SPEC_IN_SETTINGS},
    {"task", M, 0, 0, NULL, "the task's data files (relative to the current folder)", NULL,
     task_keys, MANTA_SPEC_IN_SETTINGS},
    {"reward", M, 0, 0, NULL, "how the reward actor scores an answer", NULL, reward_keys,
     MANTA_SPEC_IN_SETTINGS},
    {"tools", L, 0, 0, NULL, "the MCP tools the env actors call (at most 8)", NULL, tool_keys, 0},
    END};

const manta_spec_key rl_settings_keys[] = {
    {"controller", S, 0, 0, "controller-0", "rollout: the controller actor's name", NULL, NULL, 0},
    {"env_group", S, 0, 0, "env", "rollout: the group of env actors", NULL, NULL, 0},
    {"reward_group", S, 0, 0, "reward", "rollout: the group of reward actors", NULL, NULL, 0},
    {"learner_group", S, 0, 0, "learner", "controller: the group of learner shards", NULL, NULL, 0},
    {"learners", I, 0, 1024, "0", "controller: learner shards to use (0: every replica)", NULL,
     NULL, 0},
    {"threads", I, 0, 4096, "1", "rollout, learner: kernel threads (0: all cores)", NULL, NULL, 0},
    END};
