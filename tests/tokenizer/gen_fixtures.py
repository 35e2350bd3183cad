#!/usr/bin/env python3
"""Generates the reference fixtures for tests/tokenizer (run by hand).

    /work/venv/bin/python tests/tokenizer/gen_fixtures.py   # writes tests/tokenizer/fixtures/

Needs the `tokenizers` and `transformers` packages; the C tests do not: what
this script writes is committed.

1. corpus.bin: the multilingual test corpus (English, code, CJK, emoji,
   combining marks, whitespace runs, special-token text, invalid UTF-8), one
   record per case: the decimal byte length, "\n", the bytes, "\n".
2. {gpt2,llama3,qwen2}.json: small byte-level BPE tokenizers trained here with
   the tokenizers library, using each family's pre-tokenizer settings, special
   tokens, normalizer and post-processor.
3. expect_{name}.json: for every corpus case, what tokenizers does with it:
   "ids" (encode, add_special_tokens=False), "ids_special" (=True; absent
   when equal to "ids"), "decoded" (decode(ids); absent when equal to the
   text, which is then the round trip byte for byte), "decoded_skip" (decode(ids_special,
   skip_special_tokens=True)), "invalid": whether the bytes are not UTF-8, and
   "nfc_changes": whether the normalizer changes the text (then decoding
   gives back the normalised text, not the input).
   Invalid cases are fed to tokenizers as bytes.decode("utf-8", "replace")
   (Rust and Python take only valid text); the C side must refuse them by
   default and, with MTOK_UTF8_REPLACE, give exactly these ids.
4. chat_{chatml,llama3}.json: conversations and transformers'
   apply_chat_template rendering of each with the Qwen2.5 and Llama 3.1
   templates (quoted below), with and without tools and a generation prompt;
   tools and tool-call arguments also as the JSON text a C caller passes.
"""
import json
import os

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")

LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "Hello, world! This is a test.",
    "The quick brown fox jumps over the lazy dog. I'm sure you'll see it's FINE, we've DONE it, THEY'D say.",
    "Numbers: 1234567890, 3.14159, -42, 1e10, 2024-11-30, ١٢٣٤ and ４５６.",
    "    indented\n\tTabbed line\r\nWindows line\n\n\nthree newlines   \n  trailing   ",
    "          ",
    "\n",
    "a",
    "",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n\nclass C:\n    pass\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 1 << 3); return 0; }\n",
    "for (i = 0; i < n; ++i) a[i] += b[i] * c; /* loop */ x->y = &z; s != t && u || v;",
    "中文测试：你好，世界！我们在这里测试分词器。",
    "日本語のテキスト、ひらがなとカタカナ。東京は晴れです。",
    "한국어 텍스트입니다. 안녕하세요!",
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✅",
    "Combining: e\u0301 a\u0300 o\u0308 n\u0303 \u1100\u1161\u11a8 A\u030a \u212b café naïve",
    "Ελληνικά κείμενα, русский текст, עברית, العربية, हिन्दी, ไทย.",
    "Whitespace kinds:\u00a0nbsp\u3000ideographic\u2028line\u2029para\u0085nel\u180emvs\u200bzwsp\u202fnarrow\u205fmath\x1cfs\x0bvt\x0cff",
    "Apostrophes: 'S 'T 'RE 'Ve 'm 'LL 'd 'x ’s don’t 'ſ",
    "Special tokens: <|endoftext|> in text, <|im_start|>user\nhi<|im_end|>\n<|begin_of_text|><|start_header_id|>system<|end_header_id|>",
    "Tool text: <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call><tool_response>ok</tool_response> <think>hmm</think>",
    "Mixed: abc123def 中文abc 😀abc abc😀 !!!??? ... --- === +++ @@@ ### $$$ %%%",
    "URLs https://example.com/path?q=1&r=2#frag and emails someone@example.org",
    "   leading spaces and trailing spaces   ",
    "a\u0301\u0302\u0303\u0304 stacked marks, zalgo: z\u0351\u0350a\u0352l\u0353g\u0354o",
    "Long word: " + "supercalifragilisticexpialidocious" * 3 + " " + "x" * 300,
    "Symbols: © ® ™ € £ ¥ § ¶ • … ‰ ← → ↑ ↓ ∀ ∃ ∅ ∞ ≠ ≤ ≥ √ ∑ ∫",
    "Math: x² + y² = z², α β γ δ ε, ℕ ℤ ℚ ℝ ℂ",
    "Fullwidth ＡＢＣ ａｂｃ and ligature ﬁ ﬂ and roman Ⅳ and circled ①",
    "\r\n\r\n\t\t  \n \n",
    "Normalized added token: caf\u00e9, cafe\u0301, CAF\u00c9, cafeteria",
]
# Invalid UTF-8: lone continuation, truncated sequences, overlong, surrogate,
# out of range, bytes that never occur.
INVALID = [
    b"bad \x80 byte",
    b"truncated \xe4\xb8 end",
    b"overlong \xc0\xaf and \xe0\x80\xaf",
    b"surrogate \xed\xa0\x80 here",
    b"too big \xf4\x90\x80\x80 and \xf5\xff",
    b"\xff\xfe\xfd",
    b"mixed \xe4\xb8\xad\xe6\x96 and \xf0\x9f\x98 emoji",
    b"end with lead \xc3",
]


# Random strings over characters where engines and Unicode tables could
# disagree (case folding in (?i:'s), White_Space, marks, numbers, added-token
# text), seeded so the corpus is the same on every run.
PALETTE = (list("abcXYZ019 .,;'!?-_()[]{}<>|/\\\"") + ["  ", "   ", "\t", "\n", "\r\n", "\n\n"] +
           ["'s", "'S", "'ll", "'LL", "'d", "'re", "'ve", "'m", "'t", "'\u017f", "'\u212a"] +
           ["\u00a0", "\u3000", "\u2028", "\u0085", "\u180e", "\u200b", "\u2009", "\x1c", "\x0b"] +
           ["\u0301", "\u0308", "e\u0301", "\u00e9", "\u1100\u1161", "\u212b", "\u0130", "\u0131",
            "\u03c3", "\u03a3", "\u03c2", "\u00df", "\u1e9e", "\ufb01"] +
           ["\u4e2d\u6587", "\u3042", "\ud55c", "\u0663", "\uff14", "\u2167", "\u00b2", "\u2460"] +
           ["\U0001F600", "\u200d", "\U0001F1EB", "\u2764\ufe0f", "\U0001F44D\U0001F3FD"] +
           ["<|endoftext|>", "<|im_start|>", "<|eot_id|>", "<tool_call>", "<|begin_of_text|>",
            "caf\u00e9", "cafe\u0301", "hello", "world", "the", "ing", "tion", "1234", "3.14"])


def random_cases(n=48, seed=20261130):
    import random
    r = random.Random(seed)
    return ["".join(r.choice(PALETTE) for _ in range(r.randint(1, 40))) for _ in range(n)]


def corpus_bytes():
    return [c.encode("utf-8") for c in CORPUS + random_cases()] + INVALID


def training_text():
    text = list(CORPUS) * 3
    # Some prose and code so merges cover common words and indentation.
    src_dirs = [os.path.join(HERE, "..", "..", d) for d in ("README.md", "runtime/README.md", "kernels/README.md")]
    for p in src_dirs:
        if os.path.exists(p):
            with open(p, encoding="utf-8") as f:
                text.append(f.read())
    with open(os.path.abspath(__file__), encoding="utf-8") as f:
        text.append(f.read())
    return text


def byte_level_bpe(split_pat, normalizer, specials, added, ignore_merges, bos, vocab_size,
                   specials_normalized=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    if split_pat is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split_pat), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(training_text(), trainer=trainer)
    if specials_normalized:  # GPT-2's own file marks <|endoftext|> normalized
        from tokenizers import AddedToken
        tok.add_special_tokens([AddedToken(t, special=True, normalized=True) for t in specials])
    if added:
        tok.add_tokens(added)
    if bos is None:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                          special_tokens=[(bos, tok.token_to_id(bos))]),
        ])
    return tok


def make_tokenizers():
    from tokenizers import AddedToken
    llama_specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                      "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                      "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                      "<|python_tag|>"]
    qwen_specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    qwen_added = [AddedToken(t, special=False, normalized=False) for t in
                  ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                   "<think>", "</think>")]
    # A normalized added token: matched after NFC, in its NFC form.
    qwen_added.append(AddedToken("cafe\u0301", special=False, normalized=True))
    return {
        "gpt2": byte_level_bpe(None, None, ["<|endoftext|>"], None, False, None, 1200,
                               specials_normalized=True),
        "llama3": byte_level_bpe(LLAMA3_PAT, None, llama_specials, None, True,
                                 "<|begin_of_text|>", 1200),
        "qwen2": byte_level_bpe(QWEN2_PAT, normalizers.NFC(), qwen_specials, qwen_added, False,
                                None, 1200),
    }


def expectations(tok):
    cases = []
    for raw in corpus_bytes():
        try:
            text = raw.decode("utf-8")
            invalid = False
        except UnicodeDecodeError:
            text = raw.decode("utf-8", "replace")
            invalid = True
        ids = tok.encode(text, add_special_tokens=False).ids
        ids_sp = tok.encode(text, add_special_tokens=True).ids
        # NFC (Qwen2) changes some text: decode then gives the NFC form back.
        nfc_changes = tok.normalizer is not None and tok.normalizer.normalize_str(text) != text
        case = {"invalid": invalid, "nfc_changes": nfc_changes, "ids": ids}
        # Left out when equal to "ids" / to the input text, to keep files small.
        if ids_sp != ids:
            case["ids_special"] = ids_sp
        decoded = tok.decode(ids, skip_special_tokens=False)
        if decoded != text or invalid:
            case["decoded"] = decoded
        case["decoded_skip"] = tok.decode(ids_sp, skip_special_tokens=True)
        cases.append(case)
    return cases


QWEN25_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

LLAMA31_TEMPLATE = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather at a place, now. Ünïcödé ok \"quoted\"",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7.5, "enum": [1, 2, 3]},
        "flags": {"type": "array", "items": {}, "default": [], "extra": None, "on": True}},
        "required": ["city"]}}}
CALC_TOOL = {"type": "function", "function": {"name": "calc", "description": "Evaluate",
                                             "parameters": {"type": "object", "properties": {}}}}


def tool_call(name, args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


CONVERSATIONS = [
    {"messages": [{"role": "user", "content": "Hello!"}]},
    {"messages": [{"role": "system", "content": "  You are terse.\n"},
                  {"role": "user", "content": "What is 2+2?  "},
                  {"role": "assistant", "content": "4"},
                  {"role": "user", "content": "\tAnd 3+3?\u3000"}]},
    {"messages": [{"role": "system", "content": "Use tools."},
                  {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [tool_call("get_weather", {"city": "Paris", "days": 2,
                                                            "unit": "°C", "x": [1.5, None, True],
                                                            "q": "a\"b\\c\nd\te\u0001"})]},
                  {"role": "tool", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
                  {"role": "assistant", "content": "It is 21 °C and clear in Paris."}],
     "tools": [WEATHER_TOOL, CALC_TOOL]},
    {"messages": [{"role": "user", "content": "Compute both."},
                  {"role": "assistant", "content": "Sure.",
                   "tool_calls": [tool_call("calc", {"expr": "1+1"})]},
                  {"role": "tool", "content": "2"},
                  {"role": "tool", "content": "line1\nline2 \"q\" 中文"},
                  {"role": "user", "content": "Thanks 😀"}],
     "tools": [CALC_TOOL]},
    {"messages": [{"role": "user", "content": "first"},
                  {"role": "assistant", "content": "second"},
                  {"role": "system", "content": "late system"},
                  {"role": "user", "content": "third"}]},
    {"messages": [{"role": "system", "content": "Only system."}]},
    {"messages": [{"role": "user", "content": "Nested args"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [tool_call("calc", {"a": {"b": {"c": []}}, "n": -0.001,
                                                     "big": 12345678901234567890, "e": 1e21,
                                                     "f": 0.1, "z": {}})]}],
     "tools": [CALC_TOOL]},
]


def chat_fixtures(tokenizers_by_name):
    from transformers import PreTrainedTokenizerFast
    out = {}
    for fmt, name, template, bos in (("chatml", "qwen2", QWEN25_TEMPLATE, None),
                                      ("llama3", "llama3", LLAMA31_TEMPLATE, "<|begin_of_text|>")):
        hf = PreTrainedTokenizerFast(tokenizer_object=tokenizers_by_name[name], bos_token=bos)
        hf.chat_template = template
        cases = []
        for conv in CONVERSATIONS:
            for gen in (False, True):
                kw = {"tools": conv["tools"]} if "tools" in conv else {}
                # Llama 3.1's template refuses several tool calls in one turn and a
                # conversation with tools but no user message; those are skipped.
                try:
                    text = hf.apply_chat_template(conv["messages"], tokenize=False,
                                                  add_generation_prompt=gen, **kw)
                except Exception as e:  # the template raised: record the refusal
                    text = None
                    print(f"{fmt}: template refused: {e}")
                # What a C caller passes: tools and arguments as JSON text (indented
                # here, so the C side's re-serialisation is what is tested).
                msgs = [dict(m) for m in conv["messages"]]
                for m in msgs:
                    for tc in m.get("tool_calls", []):
                        tc["arguments_json"] = json.dumps(tc["function"]["arguments"], indent=2,
                                                          ensure_ascii=True)
                tools_json = json.dumps(conv["tools"], indent=1) if "tools" in conv else None
                cases.append({"messages": msgs, "tools_json": tools_json,
                              "add_generation_prompt": gen, "text": text})
        out[fmt] = cases
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "corpus.bin"), "wb") as f:
        for raw in corpus_bytes():
            f.write(b"%d\n" % len(raw) + raw + b"\n")
    toks = make_tokenizers()
    for name, tok in toks.items():
        tok.save(os.path.join(OUT, f"{name}.json"), pretty=False)
        # Reload from the file, as the C side will.
        tok = Tokenizer.from_file(os.path.join(OUT, f"{name}.json"))
        with open(os.path.join(OUT, f"expect_{name}.json"), "w", encoding="utf-8") as f:
            json.dump({"cases": expectations(tok)}, f, ensure_ascii=False)
    for fmt, cases in chat_fixtures(toks).items():
        with open(os.path.join(OUT, f"chat_{fmt}.json"), "w", encoding="utf-8") as f:
            json.dump({"cases": cases}, f, ensure_ascii=False, indent=1)
    for n in sorted(os.listdir(OUT)):
        print(f"{n}: {os.path.getsize(os.path.join(OUT, n))} bytes")


if __name__ == "__main__":
    main()
