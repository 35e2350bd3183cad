/*
 * textio.h - the text a policy reads and writes (internal to actors/).
 *
 * The rollout and the controller's warm-up turn text into token ids through
 * one rl_text, built from the model spec (policy.c resolved model.tokenizer
 * and model.chat_format). Two implementations sit behind one const table in
 * textio.c:
 *   - bytes: the byte-level task vocabulary of manta_actors.h (<bos> prompt
 *     bytes; <call>text</call> tool calls; observations as bytes and '\n';
 *     <eos>), the calculator example's;
 *   - mtok: a Hugging Face tokenizer (libmanta_tok) and a chat format
 *     (ChatML or Llama 3): the prompt is the rendered conversation with its
 *     generation prompt, the end of a tool call or of the answer is found by
 *     stop strings on the decoded text of the policy's turn, an observation
 *     is the rendered tool turn.
 * The one rule (issue 10): a trajectory keeps the ids the policy sampled as
 * they were sampled; nothing here re-tokenises the policy's text. Only given
 * text (prompt, observations, demonstrations) is encoded.
 *
 * Errors: 0 or a negative MANTA_E* code, the message in rl_last_error().
 * Ownership: arrays returned through ** are malloc'd, the caller frees them.
 * An rl_text is used by one thread (its tokenizer caches).
 */
#ifndef RL_TEXTIO_H
#define RL_TEXTIO_H

#include "manta_actors.h"
#include "rl_util.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rl_text rl_text;

/* The text of model spec *ms (after rl_model_read). 0, or MANTA_EINVAL /
 * MANTA_ENOMEM (a tokenizer that does not load). */
int rl_text_new(const rl_model_spec *ms, rl_text **out);
void rl_text_free(rl_text *x);
/* "bytes" or "mtok". */
const char *rl_text_kind(const rl_text *x);
/* Token ids the task may hold: [0, vocab). */
int32_t rl_text_vocab(const rl_text *x);
/* How the env is to read a tool call: "text" (bytes: "name:input" or the
 * input of the first tool) or "json" ({"name": ..., "arguments": {...}}). */
const char *rl_text_call_format(const rl_text *x);

/* The prompt as given ids: bytes "<bos>prompt"; mtok the conversation
 * [user: prompt] (with the spec's tools) and the generation prompt. */
int rl_text_prompt(rl_text *x, const char *prompt, int32_t **ids, size_t *n);
/* An observation (len bytes) as given ids: bytes "text\n"; mtok what the
 * chat format writes after a tool call and before the next assistant turn
 * (the end of the call's turn, the tool turn, the generation prompt). */
int rl_text_observation(rl_text *x, const char *text, size_t len, int32_t **ids, size_t *n);

/* One policy turn being generated: its decoded text (the stop strings are
 * looked for there) and the call it made. */
typedef struct rl_turn {
    char *text; /* decoded bytes of the turn so far (NUL-terminated) */
    size_t len, cap;
    size_t call_start; /* bytes: where the call text starts */
    int in_call;       /* bytes: inside <call> ... </call> */
    char *call;        /* after RL_TURN_CALL: the call's text, owned */
} rl_turn;
void rl_turn_reset(rl_turn *t);
void rl_turn_destroy(rl_turn *t);

enum {
    RL_TURN_MORE = 0,    /* keep generating */
    RL_TURN_CALL = 1,    /* the turn closed a tool call: t->call holds its text */
    RL_TURN_END = 2,     /* the turn ended the answer (<eos>, end of turn) */
    RL_TURN_FOREIGN = 3, /* an id outside the task's vocabulary (not to be kept) */
};
/* The sampled id tok joins the turn: one of RL_TURN_*, or MANTA_ENOMEM. */
int rl_text_step(rl_text *x, rl_turn *t, int32_t tok);

/* The answer the reward rules read: the text of the trajectory's last
 * policy segment without special tokens, trimmed; "" when the last segment
 * is not the policy's. */
/* The episode after its prompt as text, for a log line: the tokenizer's
 * decoding with its special tokens, or rl_traj_render for bytes; cut to
 * cap - 1 bytes. */
void rl_text_render(rl_text *x, const rl_traj *t, char *out, size_t cap);
void rl_text_answer(rl_text *x, const rl_traj *t, char *out, size_t cap);

/* A demonstration {"prompt": str, "segments": [["policy"|"tool", text]]}
 * as ids and loss mask (1: policy tokens): what the rollout would hold had
 * the policy written the policy segments. In policy text "<call>X</call>"
 * is the tool call (bytes: its tokens; mtok: a call of the spec's first tool,
 * or of tool N for "N:X", with {arg: X}). MANTA_EINVAL for a bad segment. */
int rl_text_demo(rl_text *x, const char *prompt, const cJSON *segs, int32_t **tok, uint8_t **mask,
                 size_t *n);

#endif
