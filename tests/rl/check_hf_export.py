#!/usr/bin/env python3
"""check_hf_export.py RUN_DIR GGUF -- the Hugging Face folder a SmolLM2 run
wrote (RUN_DIR/model) against transformers:

1. AutoTokenizer loads it and tokenises like transformers' own GGUF loader
   on the file the run started from;
2. apply_chat_template, with the template the folder carries, renders the
   conversations Manta renders (the task's system message is its default);
3. AutoModelForCausalLM loads the weights, and a greedy replay of every
   held-out conversation of the final evaluation (RUN_DIR/eval_final.jsonl;
   the calculator's own code answers the calls, as its server did) gives the
   answers Manta's rollouts gave.

Replays whose tool call is not a well-formed calc call are not compared
(the env's message for those quotes parser positions); at least half must be
compared.  Exits 1 naming the first difference.
"""
import importlib.util
import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))


def fail(msg):
    sys.exit("check_hf_export: " + msg)


def main():
    run, gguf = sys.argv[1], sys.argv[2]
    folder = os.path.join(run, "model")
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(folder)
    ref = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
    texts = ["What is 237*82?", "A box holds 12 pencils. How many pencils are in 345 boxes?",
             '<tool_call>\n{"name": "calc", "arguments": {"expression": "824*26+491"}}\n</tool_call>',
             "<|im_start|>user\nHéllo, wörld! 12,345.6<|im_end|>\n"]
    for t in texts:
        a, b = tok(t).input_ids, ref(t).input_ids
        if a != b:
            fail(f"tokenizer.json ids differ from transformers' GGUF tokenizer on {t!r}: {a} vs {b}")
    # The rendering: the system message is the template's default.
    rows = [json.loads(line) for line in open(os.path.join(run, "eval_final.jsonl"))]
    spec_sys = None
    tmpl = json.load(open(os.path.join(folder, "tokenizer_config.json")))["chat_template"]
    for line in open(os.path.join(SRC, "examples", "smollm2_calc.yaml")):
        if line.strip().startswith("system:"):
            spec_sys = json.loads(line.split("system:", 1)[1].strip())
    if spec_sys is None or json.dumps(spec_sys)[1:-1] not in tmpl:
        fail("the chat template's default system message is not the spec's task.system")
    q = rows[0]["prompt"]
    want = (f"<|im_start|>system\n{spec_sys}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n"
            "<|im_start|>assistant\n")
    got = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                  add_generation_prompt=True)
    if got != want:
        fail(f"apply_chat_template: {got!r}, Manta renders {want!r}")
    conv = [{"role": "user", "content": q},
            {"role": "assistant", "tool_calls": [{"type": "function", "function": {
                "name": "calc", "arguments": {"expression": "1+2"}}}]},
            {"role": "tool", "content": "3"}]
    got = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    want_tail = ('<|im_start|>assistant\n<tool_call>\n{"name": "calc", "arguments": '
                 '{"expression": "1+2"}}\n</tool_call><|im_end|>\n<|im_start|>user\n'
                 "<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    if not got.endswith(want_tail):
        fail(f"apply_chat_template with a tool call: {got!r}")
    # The greedy replay.
    spec = importlib.util.spec_from_file_location("calc_server",
                                                  os.path.join(SRC, "examples", "calc_server.py"))
    calc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(calc)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    compared = same = 0
    for r in rows:
        text = tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False,
                                       add_generation_prompt=True)
        ids = tok(text).input_ids
        answer, skip = None, False
        for turn in range(2):  # rl.max_turns
            out, new = list(ids), []
            with torch.no_grad():
                for _ in range(40):  # rl.max_new_tokens
                    logits = model(torch.tensor([out])).logits[0, -1]
                    t = int(torch.argmax(logits))
                    out.append(t), new.append(t)
                    s = tok.decode(new)
                    if t == eos or "</tool_call>" in s:
                        break
            s = tok.decode(new)
            if "<tool_call>" in s and "</tool_call>" in s and turn == 0:
                body = s.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0]
                try:
                    call = json.loads(body)
                    expr = call["arguments"]["expression"]
                    assert call["name"] == "calc" and isinstance(expr, str)
                except Exception:
                    skip = True
                    break
                res, err = calc.call_tool("calc", {"expression": expr})
                obs = "error: ETOOL" if err else res
                ids = out + tok("<|im_end|>\n<|im_start|>user\n<tool_response>\n" + obs +
                                "\n</tool_response><|im_end|>\n<|im_start|>assistant\n").input_ids
                continue
            answer = tok.decode(new, skip_special_tokens=True).strip()
            break
        if skip:
            continue
        compared += 1
        if (answer or "") != r["answer"]:
            fail(f"{r['prompt']!r}: transformers answers {answer!r}, Manta answered {r['answer']!r}")
        same += 1
    if compared * 2 < len(rows):
        fail(f"only {compared} of {len(rows)} replays were well-formed calc calls")
    print(f"check_hf_export: tokenizer and chat template equal; greedy answers equal on "
          f"{same} of {len(rows)} held-out problems ({len(rows) - compared} not compared)")


if __name__ == "__main__":
    main()
