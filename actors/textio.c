/*
 * textio.c - the text a policy reads and writes: the byte-level task
 * vocabulary or a Hugging Face tokenizer with a chat format.
 *
 * Both implementations are const tables of the same functions (text_ops);
 * rl_text_* dispatch to the one the spec chose (textio.h says what each
 * does). The mtok implementation never encodes what the policy wrote: a
 * sampled id is decoded on its own (byte-level BPE decodes token by token)
 * and appended to the turn's text, where the stop strings are looked for; the
 * ids themselves stay as sampled. What is encoded is given text only: the
 * prompt, observations and demonstrations, each rendered by the chat format
 * (mtok_chat_render) as transformers' apply_chat_template would.
 *
 * An observation is "what the template writes between the end of a tool call
 * and the next assistant turn": the conversation [user, assistant(call)] is
 * rendered without, and [user, assistant(call), tool(text)] with, the
 * generation prompt; the second must extend the first, and the observation is
 * the first's text after the call's closing string (ChatML "</tool_call>",
 * Llama 3 "<|eot_id|>") followed by the extension. In ChatML that is
 * "<|im_end|>\n<|im_start|>user\n<tool_response>\nTEXT\n</tool_response>
 * <|im_end|>\n<|im_start|>assistant\n". It begins with a special token, so
 * encoding it alone gives the ids it has in the whole text.
 */
#include "textio.h"

#include <manta_tok.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct text_ops {
    const char *kind, *call_format;
    int (*open)(rl_text *x, const rl_model_spec *ms);
    void (*close)(rl_text *x);
    int (*prompt)(rl_text *x, const char *prompt, int32_t **ids, size_t *n);
    int (*observation)(rl_text *x, const char *text, size_t len, int32_t **ids, size_t *n);
    int (*step)(rl_text *x, rl_turn *t, int32_t tok);
    void (*answer)(rl_text *x, const rl_traj *t, char *out, size_t cap);
    int (*demo)(rl_text *x, const char *prompt, const cJSON *segs, int32_t **tok, uint8_t **mask,
                size_t *n);
} text_ops;

struct rl_text {
    const text_ops *ops;
    int32_t vocab;
    /* mtok */
    mtok *tok;
    mtok_chat_format fmt;
    const char *const *ends; /* end-of-turn strings */
    const char *call_open;   /* NULL: the whole turn is the call (Llama 3) */
    const char *call_close;  /* the string that ends a call's text */
    char tools_json[2048];
    char tool_name[32], tool_arg[32];
    char system[1024]; /* the system message, "" for the template's default */
};

/* ---- growing arrays of ids and masks ---- */

typedef struct idbuf {
    int32_t *tok;
    uint8_t *mask;
    size_t n, cap;
} idbuf;

static int idbuf_push(idbuf *b, const int32_t *ids, size_t n, uint8_t mask)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) cap *= 2;
        int32_t *t = realloc(b->tok, cap * sizeof *t);
        if (t) b->tok = t;
        uint8_t *m = realloc(b->mask, cap);
        if (m) b->mask = m;
        if (!t || !m) return rl_fail(MANTA_ENOMEM, "text: out of memory at %zu tokens", b->n);
        b->cap = cap;
    }
    memcpy(b->tok + b->n, ids, n * sizeof *ids);
    memset(b->mask + b->n, mask, n);
    b->n += n;
    return 0;
}

static void idbuf_free(idbuf *b)
{
    free(b->tok), free(b->mask);
    memset(b, 0, sizeof *b);
}

static int turn_append(rl_turn *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + n + 1) cap *= 2;
        char *p = realloc(t->text, cap);
        if (!p) return rl_fail(MANTA_ENOMEM, "text: out of memory for a turn of %zu bytes", t->len);
        t->text = p, t->cap = cap;
    }
    memcpy(t->text + t->len, s, n);
    t->len += n;
    t->text[t->len] = 0;
    return 0;
}

void rl_turn_reset(rl_turn *t)
{
    t->len = 0, t->in_call = 0, t->call_start = 0;
    if (t->text) t->text[0] = 0;
    free(t->call);
    t->call = NULL;
}

void rl_turn_destroy(rl_turn *t)
{
    free(t->text), free(t->call);
    memset(t, 0, sizeof *t);
}

/* S may be NULL when N is 0: a call opened and closed before the turn had
 * any text. */
static int set_call(rl_turn *t, const char *s, size_t n)
{
    free(t->call);
    t->call = n ? strndup(s, n) : strdup("");
    return t->call ? RL_TURN_CALL : rl_fail(MANTA_ENOMEM, "text: out of memory for a call");
}

static void trim_into(const char *s, size_t n, char *out, size_t cap)
{
    while (n && (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r')) s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
    if (n >= cap) n = cap - 1;
    memcpy(out, s, n);
    out[n] = 0;
}

/* ---- bytes: the byte-level task vocabulary ---- */

static int bytes_open(rl_text *x, const rl_model_spec *ms)
{
    (void)ms;
    x->vocab = RL_VOCAB;
    return 0;
}

static void bytes_close(rl_text *x)
{
    (void)x;
}

static int bytes_of(int32_t first, const char *s, size_t len, int32_t last, int32_t **ids,
                    size_t *n)
{
    size_t k = 0;
    *ids = malloc((len + 2) * sizeof **ids);
    if (!*ids) return rl_fail(MANTA_ENOMEM, "text: out of memory for %zu bytes", len);
    if (first >= 0) (*ids)[k++] = first;
    for (size_t i = 0; i < len; i++) (*ids)[k++] = (unsigned char)s[i];
    if (last >= 0) (*ids)[k++] = last;
    *n = k;
    return 0;
}

static int bytes_prompt(rl_text *x, const char *prompt, int32_t **ids, size_t *n)
{
    (void)x;
    return bytes_of(RL_TOK_BOS, prompt, strlen(prompt), -1, ids, n);
}

static int bytes_observation(rl_text *x, const char *text, size_t len, int32_t **ids, size_t *n)
{
    (void)x;
    return bytes_of(-1, text, len, '\n', ids, n);
}

/* <call> opens a call, </call> closes an open one (its text: the bytes in
 * between), <eos> ends the answer; bytes join the turn's text. */
static int bytes_step(rl_text *x, rl_turn *t, int32_t tok)
{
    (void)x;
    if (tok < 0 || tok >= RL_VOCAB) return RL_TURN_FOREIGN;
    if (tok == RL_TOK_EOS) return RL_TURN_END;
    if (tok == RL_TOK_CALL) {
        t->in_call = 1, t->call_start = t->len;
        return RL_TURN_MORE;
    }
    if (tok == RL_TOK_END && t->in_call) {
        t->in_call = 0;
        return set_call(t, t->text ? t->text + t->call_start : NULL, t->len - t->call_start);
    }
    if (tok < 256) {
        char c = (char)tok;
        int rc = turn_append(t, &c, 1);
        if (rc) return rc;
    }
    return RL_TURN_MORE;
}

static void bytes_answer(rl_text *x, const rl_traj *t, char *out, size_t cap)
{
    (void)x;
    rl_traj_final_text(t, out, cap);
}

/* The prompt as given bytes after <bos>; in policy text <call> and </call>
 * are the call tokens; tool text is followed by '\n' as the rollout does;
 * <eos> ends the last policy segment. */
static int bytes_demo(rl_text *x, const char *prompt, const cJSON *segs, int32_t **tok,
                      uint8_t **mask, size_t *n)
{
    (void)x;
    idbuf b = {0};
    int32_t one = RL_TOK_BOS;
    int rc = idbuf_push(&b, &one, 1, 0);
    for (const char *c = prompt; !rc && *c; c++) {
        one = (unsigned char)*c;
        rc = idbuf_push(&b, &one, 1, 0);
    }
    const cJSON *seg;
    cJSON_ArrayForEach(seg, segs)
    {
        if (rc) break;
        const cJSON *kind = cJSON_GetArrayItem(seg, 0), *text = cJSON_GetArrayItem(seg, 1);
        if (!cJSON_IsString(kind) || !cJSON_IsString(text)) {
            rc = MANTA_EINVAL;
            break;
        }
        int pol = !strcmp(kind->valuestring, "policy");
        if (!pol && strcmp(kind->valuestring, "tool")) {
            rc = MANTA_EINVAL;
            break;
        }
        for (const char *c = text->valuestring; !rc && *c;) {
            if (pol && !strncmp(c, "<call>", 6)) {
                one = RL_TOK_CALL, c += 6;
            } else if (pol && !strncmp(c, "</call>", 7)) {
                one = RL_TOK_END, c += 7;
            } else {
                one = (unsigned char)*c, c++;
            }
            rc = idbuf_push(&b, &one, 1, (uint8_t)pol);
        }
        one = '\n';
        if (!pol && !rc) rc = idbuf_push(&b, &one, 1, 0);
    }
    one = RL_TOK_EOS;
    if (!rc) rc = idbuf_push(&b, &one, 1, 1);
    if (rc) {
        idbuf_free(&b);
        return rc;
    }
    *tok = b.tok, *mask = b.mask, *n = b.n;
    return 0;
}

static const text_ops bytes_ops = {"bytes",     "text",       bytes_open,
                                   bytes_close, bytes_prompt, bytes_observation,
                                   bytes_step,  bytes_answer, bytes_demo};

/* ---- mtok: a tokenizer and a chat format ---- */

static const char *const chatml_ends[] = {"<|im_end|>", "<|endoftext|>", NULL};
static const char *const llama3_ends[] = {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", NULL};

static int mtok_err(int rc, const char *what)
{
    return rl_fail(rc == MTOK_ENOMEM ? MANTA_ENOMEM : MANTA_EINVAL, "text: %s: %s", what,
                   mtok_last_error());
}

static int mt_open(rl_text *x, const rl_model_spec *ms)
{
    int rc = rl_tok_load(ms->tokenizer, &x->tok);
    if (rc) return mtok_err(rc, "model.tokenizer");
    x->vocab = (int32_t)mtok_vocab_size(x->tok);
    x->fmt = (mtok_chat_format)ms->chat_format;
    if (x->fmt == MTOK_CHAT_AUTO && (rc = mtok_chat_detect(x->tok, &x->fmt)))
        return mtok_err(rc, "model.chat_format");
    if (x->fmt == MTOK_CHAT_CHATML) {
        x->ends = chatml_ends, x->call_open = "<tool_call>", x->call_close = "</tool_call>";
    } else {
        x->ends = llama3_ends, x->call_open = NULL, x->call_close = "<|eot_id|>";
    }
    if (ms->tools_in_system) snprintf(x->tools_json, sizeof x->tools_json, "%s", ms->tools_json);
    snprintf(x->system, sizeof x->system, "%s", ms->system);
    snprintf(x->tool_name, sizeof x->tool_name, "%s", ms->tool_name[0] ? ms->tool_name : "calc");
    snprintf(x->tool_arg, sizeof x->tool_arg, "%s", ms->tool_arg[0] ? ms->tool_arg : "expression");
    return 0;
}

static void mt_close(rl_text *x)
{
    mtok_free(x->tok);
}

static int render(rl_text *x, const mtok_message *m, size_t n, int gen, char **text, size_t *len)
{
    mtok_chat_opts o = {.format = x->fmt,
                        .add_generation_prompt = gen,
                        .tools_json = x->tools_json[0] ? x->tools_json : NULL};
    int rc = mtok_chat_render(x->tok, m, n, &o, text, len);
    return rc ? mtok_err(rc, "chat template") : 0;
}

static int encode(rl_text *x, const char *s, size_t len, int32_t **ids, size_t *n)
{
    int rc = mtok_encode(x->tok, s, len, MTOK_UTF8_REPLACE, ids, n);
    return rc ? mtok_err(rc, "encode") : 0;
}

/* The conversation's opening: the system message when the task gives one,
 * then the user's prompt. Returns the number of messages written to m. */
static size_t opening(const rl_text *x, const char *prompt, mtok_message *m)
{
    size_t n = 0;
    if (x->system[0]) m[n++] = (mtok_message){.role = "system", .content = x->system};
    m[n++] = (mtok_message){.role = "user", .content = prompt};
    return n;
}

static int mt_prompt(rl_text *x, const char *prompt, int32_t **ids, size_t *n)
{
    mtok_message m[2];
    char *text;
    size_t len;
    int rc = render(x, m, opening(x, prompt, m), 1, &text, &len);
    if (rc) return rc;
    rc = encode(x, text, len, ids, n);
    free(text);
    return rc;
}

/* The last occurrence of needle in s[0, n), or NULL. */
static const char *last_of(const char *s, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = n >= k ? n - k + 1 : 0; i-- > 0;)
        if (!memcmp(s + i, needle, k)) return s + i;
    return NULL;
}

/* What the template writes after a tool call: see the opening comment. */
static int mt_observation(rl_text *x, const char *text, size_t len, int32_t **ids, size_t *n)
{
    char *obs = strndup(text, len);
    if (!obs) return rl_fail(MANTA_ENOMEM, "text: out of memory for an observation");
    mtok_tool_call call = {.name = x->tool_name, .arguments = "{}"};
    mtok_message m[3] = {{.role = "user", .content = "?"},
                         {.role = "assistant", .tool_calls = &call, .n_tool_calls = 1},
                         {.role = "tool", .content = obs}};
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    int rc = render(x, m, 2, 0, &a, &na);
    if (!rc) rc = render(x, m, 3, 1, &b, &nb);
    const char *tail = rc ? NULL : last_of(a, na, x->call_close);
    if (!rc && (nb < na || memcmp(a, b, na) || !tail))
        rc = rl_fail(MANTA_EINVAL,
                     "text: the chat format's tool turn does not extend the conversation "
                     "before it (cannot tell the observation's tokens)");
    if (!rc) {
        tail += strlen(x->call_close);
        size_t nt = (size_t)(a + na - tail);
        memmove(a, tail, nt); /* the template's text after the call ... */
        char *s = realloc(a, nt + (nb - na) + 1);
        if (!s) {
            rc = rl_fail(MANTA_ENOMEM, "text: out of memory for an observation");
        } else {
            a = s; /* ... then the tool turn and the generation prompt */
            memcpy(a + nt, b + na, nb - na);
            rc = encode(x, a, nt + (nb - na), ids, n);
        }
    }
    free(a), free(b), free(obs);
    return rc;
}

/* The earliest of the stop strings (the end strings and `also`, if not
 * NULL) that ends past s[old] in s[0, n): the string, its position in *at. */
static const char *first_stop(const rl_text *x, const char *s, size_t n, size_t old,
                              const char *also, size_t *at)
{
    const char *best = NULL;
    for (int i = also ? -1 : 0; i < 0 || x->ends[i]; i++) {
        const char *st = i < 0 ? also : x->ends[i];
        size_t k = strlen(st), from = old + 1 >= k ? old + 1 - k : 0;
        for (size_t p = from; p + k <= n; p++)
            if (!memcmp(s + p, st, k)) {
                if (!best || p < *at) best = st, *at = p;
                break;
            }
    }
    return best;
}

/* Llama 3: a turn that is one JSON object with a "name" is a call. */
static int is_json_call(const char *s, size_t n)
{
    char *c = strndup(s, n);
    cJSON *j = c ? cJSON_Parse(c) : NULL;
    int yes = cJSON_IsObject(j) && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "name"));
    cJSON_Delete(j);
    free(c);
    return yes;
}

static int mt_step(rl_text *x, rl_turn *t, int32_t tok)
{
    if (tok < 0 || tok >= x->vocab) return RL_TURN_FOREIGN;
    char *s;
    size_t len, old = t->len;
    int rc = mtok_decode(x->tok, &tok, 1, MTOK_DECODE_BYTES, &s, &len);
    if (rc) return mtok_err(rc, "decode");
    rc = turn_append(t, s, len);
    free(s);
    if (rc) return rc;
    size_t at = 0;
    const char *st = first_stop(x, t->text, t->len, old, x->call_open ? x->call_close : NULL, &at);
    if (!st) return RL_TURN_MORE;
    if (st == x->call_close && x->call_open) { /* ChatML: <tool_call>TEXT</tool_call> */
        const char *open = last_of(t->text, at, x->call_open);
        if (!open) return RL_TURN_MORE; /* a stray closing tag: text like any other */
        const char *body = open + strlen(x->call_open);
        return set_call(t, body, (size_t)(t->text + at - body));
    }
    if (!x->call_open && is_json_call(t->text, at)) return set_call(t, t->text, at);
    return RL_TURN_END;
}

static void mt_answer(rl_text *x, const rl_traj *t, char *out, size_t cap)
{
    out[0] = 0;
    if (t->n_seg == 0 || t->seg_kind[t->n_seg - 1] != RL_SEG_POLICY) return;
    int from = t->seg_start[t->n_seg - 1];
    char *s;
    size_t len;
    if (mtok_decode(x->tok, t->tok + from, (size_t)(t->n - from), MTOK_SKIP_SPECIAL, &s, &len))
        return;
    size_t at = len;
    first_stop(x, s, len, 0, NULL, &at); /* an end string that is not a special token */
    trim_into(s, at, out, cap);
    free(s);
}

/* One policy segment of a demonstration as the assistant message *m: plain
 * text, or "<call>X</call>" (text before it the content) as a call of the
 * first tool (or of tool N for "N:X") with {tool_arg: X}. Strings in *own. */
static int demo_message(rl_text *x, const char *text, mtok_message *m, mtok_tool_call *call,
                        char **own)
{
    const char *o = strstr(text, "<call>"), *c = o ? strstr(o, "</call>") : NULL;
    memset(m, 0, sizeof *m);
    m->role = "assistant";
    if (!c) {
        m->content = text;
        return 0;
    }
    own[0] = strndup(text, (size_t)(o - text));
    own[1] = strndup(o + 6, (size_t)(c - o - 6));
    if (!own[0] || !own[1]) return rl_fail(MANTA_ENOMEM, "text: out of memory for a demonstration");
    const char *arg = own[1];
    call->name = x->tool_name;
    const char *colon = strchr(arg, ':');
    if (colon && colon > arg && (size_t)(colon - arg) < 32) { /* "name:input" */
        own[1][colon - arg] = 0;
        call->name = own[1], arg = colon + 1;
    }
    cJSON *a = cJSON_CreateObject();
    if (a) cJSON_AddStringToObject(a, x->tool_arg, arg);
    own[2] = a ? cJSON_PrintUnformatted(a) : NULL;
    cJSON_Delete(a);
    if (!own[2]) return rl_fail(MANTA_ENOMEM, "text: out of memory for a demonstration");
    call->arguments = own[2];
    m->content = own[0][0] ? own[0] : NULL;
    m->tool_calls = call, m->n_tool_calls = 1;
    return 0;
}

/* The ids of assistant message m[n-1] as the policy would write them: the
 * rendering of m[0..n) less that of m[0..n-1) with the generation prompt,
 * up to and with the string that ends the turn (the call's close, or the
 * end of turn). */
static int demo_turn(rl_text *x, const mtok_message *m, size_t n, idbuf *b)
{
    char *prev = NULL, *with = NULL;
    size_t np = 0, nw = 0, at = 0;
    int rc = render(x, m, n - 1, 1, &prev, &np);
    if (!rc) rc = render(x, m, n, 0, &with, &nw);
    if (!rc && (nw < np || memcmp(prev, with, np)))
        rc = rl_fail(MANTA_EINVAL, "text: an assistant turn does not extend the conversation");
    const char *st = NULL;
    if (!rc) {
        int call = m[n - 1].n_tool_calls > 0 && x->call_open;
        st = first_stop(x, with + np, nw - np, 0, call ? x->call_close : NULL, &at);
        if (!st || (call && st != x->call_close))
            rc = rl_fail(MANTA_EINVAL, "text: the chat format's assistant turn has no stop string");
    }
    int32_t *ids = NULL;
    size_t k = 0;
    if (!rc) rc = encode(x, with + np, at + strlen(st), &ids, &k);
    if (!rc) rc = idbuf_push(b, ids, k, 1);
    free(ids), free(prev), free(with);
    return rc;
}

static int mt_demo(rl_text *x, const char *prompt, const cJSON *segs, int32_t **tok, uint8_t **mask,
                   size_t *n)
{
    int ns = cJSON_GetArraySize(segs);
    mtok_message *m = calloc((size_t)ns + 2, sizeof *m);
    mtok_tool_call *calls = calloc((size_t)ns + 1, sizeof *calls);
    char **own = calloc(3 * (size_t)ns + 1, sizeof *own);
    idbuf b = {0};
    int32_t *ids = NULL;
    size_t k = 0, nm = 0;
    int rc = m && calls && own ? 0 : rl_fail(MANTA_ENOMEM, "text: out of memory");
    if (!rc) rc = mt_prompt(x, prompt, &ids, &k);
    if (!rc) rc = idbuf_push(&b, ids, k, 0);
    free(ids);
    if (!rc) nm = opening(x, prompt, m);
    for (int i = 0; !rc && i < ns; i++) {
        const cJSON *seg = cJSON_GetArrayItem(segs, i);
        const cJSON *kind = cJSON_GetArrayItem(seg, 0), *text = cJSON_GetArrayItem(seg, 1);
        if (!cJSON_IsString(kind) || !cJSON_IsString(text)) {
            rc = MANTA_EINVAL;
        } else if (!strcmp(kind->valuestring, "policy")) {
            rc = demo_message(x, text->valuestring, &m[nm], &calls[i], own + 3 * i);
            if (!rc) rc = demo_turn(x, m, ++nm, &b);
        } else if (!strcmp(kind->valuestring, "tool")) {
            ids = NULL;
            rc = mt_observation(x, text->valuestring, strlen(text->valuestring), &ids, &k);
            if (!rc) rc = idbuf_push(&b, ids, k, 0);
            free(ids);
            m[nm++] = (mtok_message){.role = "tool", .content = text->valuestring};
        } else {
            rc = MANTA_EINVAL;
        }
    }
    for (int i = 0; own && i < 3 * ns; i++) free(own[i]);
    free(own), free(calls), free(m);
    if (rc) {
        idbuf_free(&b);
        return rc;
    }
    *tok = b.tok, *mask = b.mask, *n = b.n;
    return 0;
}

static const text_ops mtok_ops = {"mtok",         "json",  mt_open,   mt_close, mt_prompt,
                                  mt_observation, mt_step, mt_answer, mt_demo};

/* ---- dispatch ---- */

int rl_text_new(const rl_model_spec *ms, rl_text **out)
{
    rl_text *x = calloc(1, sizeof *x);
    *out = NULL;
    if (!x) return rl_fail(MANTA_ENOMEM, "text: out of memory");
    x->ops = ms->tokenizer[0] ? &mtok_ops : &bytes_ops;
    int rc = x->ops->open(x, ms);
    if (rc) {
        rl_text_free(x);
        return rc;
    }
    *out = x;
    return 0;
}

void rl_text_free(rl_text *x)
{
    if (!x) return;
    x->ops->close(x);
    free(x);
}

const char *rl_text_kind(const rl_text *x)
{
    return x->ops->kind;
}

int32_t rl_text_vocab(const rl_text *x)
{
    return x->vocab;
}

const char *rl_text_call_format(const rl_text *x)
{
    return x->ops->call_format;
}

int rl_text_prompt(rl_text *x, const char *prompt, int32_t **ids, size_t *n)
{
    return x->ops->prompt(x, prompt, ids, n);
}

int rl_text_observation(rl_text *x, const char *text, size_t len, int32_t **ids, size_t *n)
{
    return x->ops->observation(x, text, len, ids, n);
}

int rl_text_step(rl_text *x, rl_turn *t, int32_t tok)
{
    return x->ops->step(x, t, tok);
}

void rl_text_answer(rl_text *x, const rl_traj *t, char *out, size_t cap)
{
    if (cap) x->ops->answer(x, t, out, cap);
}

int rl_text_demo(rl_text *x, const char *prompt, const cJSON *segs, int32_t **tok, uint8_t **mask,
                 size_t *n)
{
    return x->ops->demo(x, prompt, segs, tok, mask, n);
}

void rl_text_render(rl_text *x, const rl_traj *t, char *out, size_t cap)
{
    if (!cap) return;
    if (x->ops != &mtok_ops) {
        rl_traj_render(t, out, cap);
        return;
    }
    out[0] = 0;
    int from = t->n_seg > 1 ? t->seg_start[1] : 0;
    char *s;
    size_t len;
    if (from >= t->n || mtok_decode(x->tok, t->tok + from, (size_t)(t->n - from), 0, &s, &len))
        return;
    size_t k = len < cap - 1 ? len : cap - 1;
    for (size_t i = 0; i < k; i++) out[i] = s[i] == '\n' ? '|' : s[i];
    out[k] = 0;
    free(s);
}
