/*
 * chat.c - the ChatML (Qwen2.5) and Llama 3.1 chat formats, without Jinja.
 *
 * Each function below is its template written out as C, branch for branch,
 * so the text is the one transformers' apply_chat_template renders (the
 * templates are quoted in tests/tokenizer/gen_fixtures.py, and the tests
 * compare against their renderings).  Where a template raises, this refuses
 * (MTOK_EINVAL); where a template would silently drop a turn (a role it does
 * not know), this refuses too, since a dropped turn is text the model never
 * sees.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

static const char QWEN_DEFAULT_SYSTEM[] =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

static const char *content(const mtok_message *m)
{
    return m->content ? m->content : "";
}

static bool role_is(const mtok_message *m, const char *r)
{
    return m->role && strcmp(m->role, r) == 0;
}

/* Appends each element of the JSON array `tools`, re-serialised as Python
 * would (indent < 0: none), between sep_before and sep_after; *n counts them.
 * The array is walked at its top level only (strings and nesting skipped),
 * each element's text handed to mtok__pyjson, which checks it. */
static int each_tool(const char *tools, mtok_buf *out, int indent, const char *sep_before,
                     const char *sep_after, size_t *n)
{
    size_t len = strlen(tools), i = 0, depth = 0, start = 0;
    bool in_str = false;
    int rc = 0;
    *n = 0;
    while (i < len && strchr(" \t\r\n", tools[i])) i++;
    if (i >= len || tools[i] != '[') return mtok__fail(MTOK_EINVAL, "tools_json: not a JSON array");
    for (i++; i < len; i++) {
        char c = tools[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
            continue;
        }
        if (c == '"') in_str = true;
        if (!depth && !strchr(" \t\r\n,]", c) && !start) start = i;
        if (c == '{' || c == '[') depth++;
        if ((c == '}' || c == ']') && depth) {
            depth--;
            continue;
        }
        if (!depth && (c == ',' || c == ']')) {
            if (start) {
                if ((rc = mtok__buf_puts(out, sep_before))) return rc;
                if ((rc = mtok__pyjson(out, tools + start, i - start, indent, "tools_json")))
                    return rc;
                if ((rc = mtok__buf_puts(out, sep_after))) return rc;
                (*n)++;
            }
            start = 0;
            if (c == ']') return 0;
        }
    }
    return mtok__fail(MTOK_EINVAL, "tools_json: unterminated array");
}

static int check_roles(const mtok_message *msgs, size_t n)
{
    static const char *const known[] = {"system", "user", "assistant", "tool", "ipython"};
    for (size_t i = 0; i < n; i++) {
        bool ok = false;
        for (size_t k = 0; k < 5; k++) ok |= role_is(&msgs[i], known[k]);
        if (!ok)
            return mtok__fail(MTOK_EINVAL,
                              "chat: message %zu has role '%s'; the template would drop it", i,
                              msgs[i].role ? msgs[i].role : "(null)");
        if (msgs[i].n_tool_calls && !msgs[i].tool_calls)
            return mtok__fail(MTOK_EINVAL, "chat: message %zu: n_tool_calls without tool_calls", i);
    }
    return 0;
}

static int render_chatml(const mtok_message *m, size_t n, const mtok_chat_opts *o, mtok_buf *b)
{
    int rc = 0;
    mtok_buf tools = {0};
    size_t n_tools = 0;
    if (o->tools_json && (rc = each_tool(o->tools_json, &tools, -1, "\n", "", &n_tools))) goto out;
    if (n_tools) {
        rc = mtok__buf_puts(b, "<|im_start|>system\n");
        if (!rc)
            rc = mtok__buf_puts(b, role_is(&m[0], "system") ? content(&m[0]) : QWEN_DEFAULT_SYSTEM);
        if (!rc)
            rc = mtok__buf_puts(b, "\n\n# Tools\n\nYou may call one or more functions to assist "
                                   "with the user query.\n\nYou are provided with function "
                                   "signatures within <tools></tools> XML tags:\n<tools>");
        if (!rc) rc = mtok__buf_put(b, tools.p, tools.len);
        if (!rc)
            rc = mtok__buf_puts(b, "\n</tools>\n\nFor each function call, return a json object "
                                   "with function name and arguments within "
                                   "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
                                   "<function-name>, \"arguments\": "
                                   "<args-json-object>}\n</tool_call><|im_end|>\n");
    } else if (role_is(&m[0], "system")) {
        rc = mtok__buf_puts(b, "<|im_start|>system\n");
        if (!rc) rc = mtok__buf_puts(b, content(&m[0]));
        if (!rc) rc = mtok__buf_puts(b, "<|im_end|>\n");
    } else {
        rc = mtok__buf_puts(b, "<|im_start|>system\n");
        if (!rc) rc = mtok__buf_puts(b, QWEN_DEFAULT_SYSTEM);
        if (!rc) rc = mtok__buf_puts(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n && !rc; i++) {
        const mtok_message *x = &m[i];
        if (role_is(x, "ipython")) {
            rc = mtok__fail(MTOK_EINVAL, "chat: message %zu: role 'ipython' is Llama 3's", i);
        } else if (role_is(x, "user") || (role_is(x, "system") && i > 0) ||
                   (role_is(x, "assistant") && !x->n_tool_calls)) {
            rc = mtok__buf_puts(b, "<|im_start|>");
            if (!rc) rc = mtok__buf_puts(b, x->role);
            if (!rc) rc = mtok__buf_putc(b, '\n');
            if (!rc) rc = mtok__buf_puts(b, content(x));
            if (!rc) rc = mtok__buf_puts(b, "<|im_end|>\n");
        } else if (role_is(x, "assistant")) {
            rc = mtok__buf_puts(b, "<|im_start|>assistant");
            if (!rc && content(x)[0]) rc = mtok__buf_putc(b, '\n');
            if (!rc && content(x)[0]) rc = mtok__buf_puts(b, content(x));
            for (size_t k = 0; k < x->n_tool_calls && !rc; k++) {
                const mtok_tool_call *tc = &x->tool_calls[k];
                const char *args = tc->arguments ? tc->arguments : "{}";
                rc = mtok__buf_puts(b, "\n<tool_call>\n{\"name\": \"");
                if (!rc) rc = mtok__buf_puts(b, tc->name ? tc->name : "");
                if (!rc) rc = mtok__buf_puts(b, "\", \"arguments\": ");
                if (!rc) rc = mtok__pyjson(b, args, strlen(args), -1, "tool_call.arguments");
                if (!rc) rc = mtok__buf_puts(b, "}\n</tool_call>");
            }
            if (!rc) rc = mtok__buf_puts(b, "<|im_end|>\n");
        } else if (role_is(x, "tool")) {
            if (i == 0 || !role_is(&m[i - 1], "tool")) rc = mtok__buf_puts(b, "<|im_start|>user");
            if (!rc) rc = mtok__buf_puts(b, "\n<tool_response>\n");
            if (!rc) rc = mtok__buf_puts(b, content(x));
            if (!rc) rc = mtok__buf_puts(b, "\n</tool_response>");
            if (!rc && (i + 1 == n || !role_is(&m[i + 1], "tool")))
                rc = mtok__buf_puts(b, "<|im_end|>\n");
        }
    }
    if (!rc && o->add_generation_prompt) rc = mtok__buf_puts(b, "<|im_start|>assistant\n");
out:
    free(tools.p);
    return rc;
}

/* Jinja's trim: Python's str.strip(). */
static int put_trimmed(mtok_buf *b, const char *s)
{
    size_t len = strlen(s), a = 0, z = len;
    while (a < len) {
        int k;
        uint32_t cp = mtok__utf8_next(s + a, &k);
        if (!mtok__py_isspace(cp)) break;
        a += (size_t)k;
    }
    while (z > a) {
        size_t p = z - 1;
        while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
        int k;
        if (!mtok__py_isspace(mtok__utf8_next(s + p, &k))) break;
        z = p;
    }
    return mtok__buf_put(b, s + a, z - a);
}

static int render_llama3(const mtok_message *m, size_t n, const mtok_chat_opts *o, mtok_buf *b)
{
    static const char FN_PROMPT[] =
        "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument "
        "name and its value}.Do not use variables.\n\n";
    int rc = mtok__buf_puts(b, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n");
    bool tools = o->tools_json != NULL;
    size_t i = 0;
    const char *sys = "";
    if (role_is(&m[0], "system")) sys = content(&m[0]), i = 1;
    if (!rc && tools) rc = mtok__buf_puts(b, "Environment: ipython\n");
    if (!rc) rc = mtok__buf_puts(b, "Cutting Knowledge Date: December 2023\nToday Date: ");
    if (!rc) rc = mtok__buf_puts(b, o->date_string ? o->date_string : "26 Jul 2024");
    if (!rc) rc = mtok__buf_puts(b, "\n\n");
    if (!rc) rc = put_trimmed(b, sys);
    if (!rc) rc = mtok__buf_puts(b, "<|eot_id|>");
    if (!rc && tools) {
        if (i == n)
            return mtok__fail(MTOK_EINVAL, "chat: Llama 3 puts tools in the first user message, "
                                           "and there is no first user message");
        size_t nt;
        rc = mtok__buf_puts(b, "<|start_header_id|>user<|end_header_id|>\n\nGiven the following "
                               "functions, please respond with a JSON for a function call with "
                               "its proper arguments that best answers the given prompt.\n\n");
        if (!rc) rc = mtok__buf_puts(b, FN_PROMPT);
        if (!rc) rc = each_tool(o->tools_json, b, 4, "", "\n\n", &nt);
        if (!rc) rc = put_trimmed(b, content(&m[i]));
        if (!rc) rc = mtok__buf_puts(b, "<|eot_id|>");
        i++;
    }
    for (; i < n && !rc; i++) {
        const mtok_message *x = &m[i];
        if (x->n_tool_calls) {
            if (x->n_tool_calls != 1)
                return mtok__fail(MTOK_EINVAL,
                                  "chat: message %zu: Llama 3 supports one tool call "
                                  "per turn, not %zu",
                                  i, x->n_tool_calls);
            const mtok_tool_call *tc = &x->tool_calls[0];
            const char *args = tc->arguments ? tc->arguments : "{}";
            rc =
                mtok__buf_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"");
            if (!rc) rc = mtok__buf_puts(b, tc->name ? tc->name : "");
            if (!rc) rc = mtok__buf_puts(b, "\", \"parameters\": ");
            if (!rc) rc = mtok__pyjson(b, args, strlen(args), -1, "tool_call.arguments");
            if (!rc) rc = mtok__buf_puts(b, "}<|eot_id|>");
        } else if (role_is(x, "tool") || role_is(x, "ipython")) {
            /* A string "is iterable" in Jinja, so the template JSON-quotes it. */
            rc = mtok__buf_puts(b, "<|start_header_id|>ipython<|end_header_id|>\n\n");
            if (!rc) rc = mtok__pyjson_str(b, content(x), strlen(content(x)));
            if (!rc) rc = mtok__buf_puts(b, "<|eot_id|>");
        } else {
            rc = mtok__buf_puts(b, "<|start_header_id|>");
            if (!rc) rc = mtok__buf_puts(b, x->role);
            if (!rc) rc = mtok__buf_puts(b, "<|end_header_id|>\n\n");
            if (!rc) rc = put_trimmed(b, content(x));
            if (!rc) rc = mtok__buf_puts(b, "<|eot_id|>");
        }
    }
    if (!rc && o->add_generation_prompt)
        rc = mtok__buf_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return rc;
}

int mtok_chat_format_parse(const char *name, mtok_chat_format *out)
{
    static const struct {
        const char *name;
        mtok_chat_format f;
    } names[] = {{"auto", MTOK_CHAT_AUTO},
                 {"chatml", MTOK_CHAT_CHATML},
                 {"qwen", MTOK_CHAT_CHATML},
                 {"llama3", MTOK_CHAT_LLAMA3}};
    if (!out) return mtok__fail(MTOK_EINVAL, "mtok_chat_format_parse: out is NULL");
    for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].f;
            return 0;
        }
    return mtok__fail(MTOK_EINVAL, "chat format '%s' is unknown (auto, chatml, qwen or llama3)",
                      name ? name : "(null)");
}

int mtok_chat_detect(const mtok *t, mtok_chat_format *out)
{
    if (!t || !out) return mtok__fail(MTOK_EINVAL, "mtok_chat_detect: NULL argument");
    if (mtok_token_id(t, "<|im_start|>") >= 0 && mtok_token_id(t, "<|im_end|>") >= 0) {
        *out = MTOK_CHAT_CHATML;
        return 0;
    }
    if (mtok_token_id(t, "<|start_header_id|>") >= 0 && mtok_token_id(t, "<|eot_id|>") >= 0) {
        *out = MTOK_CHAT_LLAMA3;
        return 0;
    }
    return mtok__fail(MTOK_ENOTFOUND,
                      "%s: no chat format: the tokenizer has neither <|im_start|>/<|im_end|> "
                      "(ChatML) nor <|start_header_id|>/<|eot_id|> (Llama 3); name one",
                      t->name);
}

int mtok_chat_render(const mtok *t, const mtok_message *msgs, size_t n, const mtok_chat_opts *opts,
                     char **text, size_t *len)
{
    if (!text) return mtok__fail(MTOK_EINVAL, "mtok_chat_render: text is NULL");
    *text = NULL;
    if (len) *len = 0;
    if (!opts || (!msgs && n)) return mtok__fail(MTOK_EINVAL, "mtok_chat_render: NULL argument");
    if (n == 0) return mtok__fail(MTOK_EINVAL, "mtok_chat_render: no messages");
    mtok_chat_format f = opts->format;
    int rc;
    if (f == MTOK_CHAT_AUTO) {
        if (!t) return mtok__fail(MTOK_EINVAL, "mtok_chat_render: format AUTO needs a tokenizer");
        if ((rc = mtok_chat_detect(t, &f))) return rc;
    }
    if ((rc = check_roles(msgs, n))) return rc;
    mtok_buf b = {0};
    if (f == MTOK_CHAT_CHATML)
        rc = render_chatml(msgs, n, opts, &b);
    else if (f == MTOK_CHAT_LLAMA3)
        rc = render_llama3(msgs, n, opts, &b);
    else
        rc = mtok__fail(MTOK_EINVAL, "mtok_chat_render: unknown format %d", (int)f);
    if (!rc && !b.p) rc = mtok__buf_put(&b, "", 0);
    if (rc) {
        free(b.p);
        return rc;
    }
    *text = b.p;
    if (len) *len = b.len;
    return 0;
}

/* ---- the same rendering as a Jinja template ------------------------------ */

/* The ChatML template, in two parts around the default system message (a
 * Jinja string literal). It mirrors render_chatml above line by line. */
static const char JINJA_CHATML_HEAD[] = "{%- set default_system = \"";
static const char JINJA_CHATML_BODY[] =
    "\" %}\n"
    "{%- if tools %}\n"
    "{{- '<|im_start|>system\\n' }}\n"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content }}"
    "{%- else %}{{- default_system }}{%- endif %}\n"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user "
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML "
    "tags:\\n<tools>' }}\n"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}\n"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}\n"
    "{%- elif messages and messages[0].role == 'system' %}\n"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "{{- '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}\n"
    "{%- elif message.role == 'assistant' %}\n"
    "{{- '<|im_start|>assistant' }}\n"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}\n"
    "{%- for tc in message.tool_calls %}\n"
    "{%- if tc.function is defined %}{%- set tc = tc.function %}{%- endif %}\n"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tc.name + '\", \"arguments\": ' }}\n"
    "{%- if tc.arguments is string %}{{- tc.arguments }}{%- else %}{{- tc.arguments | tojson }}"
    "{%- endif %}\n"
    "{{- '}\\n</tool_call>' }}\n"
    "{%- endfor %}\n"
    "{{- '<|im_end|>\\n' }}\n"
    "{%- elif message.role == 'tool' %}\n"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}"
    "{%- endif %}\n"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}\n"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n";

int mtok_chat_template_jinja(mtok_chat_format f, const char *default_system, char **tmpl)
{
    if (!tmpl) return mtok__fail(MTOK_EINVAL, "mtok_chat_template_jinja: NULL argument");
    *tmpl = NULL;
    if (f != MTOK_CHAT_CHATML)
        return mtok__fail(MTOK_EINVAL, "chat: a Jinja template is written for chatml only");
    const char *sys = default_system ? default_system : QWEN_DEFAULT_SYSTEM;
    mtok_buf b = {0};
    int rc = mtok__buf_puts(&b, JINJA_CHATML_HEAD);
    for (const unsigned char *p = (const unsigned char *)sys; !rc && *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\')
            snprintf(esc, sizeof esc, "\\%c", *p);
        else if (*p == '\n')
            snprintf(esc, sizeof esc, "\\n");
        else if (*p < 0x20 || *p == 0x7f)
            snprintf(esc, sizeof esc, "\\x%02x", *p);
        else
            esc[0] = (char)*p, esc[1] = 0;
        rc = mtok__buf_puts(&b, esc);
    }
    if (!rc) rc = mtok__buf_puts(&b, JINJA_CHATML_BODY);
    if (!rc) rc = mtok__buf_putc(&b, 0);
    if (rc) {
        free(b.p);
        return rc;
    }
    *tmpl = b.p;
    return 0;
}
