#!/usr/bin/env python3
"""Live equality with tokenizers, beyond the committed fixtures (ctest
tok_live_equality; skipped, exit 77, without Python or tokenizers).

    check_live.py TOK_IDS_BINARY

Trains larger tokenizers (vocab 4000) with the GPT-2, Llama 3 and Qwen2
settings of gen_fixtures.py, then encodes with tokenizers and with
libmanta_tok (through the tok_ids helper) the repository's own text files and
2000 fresh random strings of tricky characters: every id must be equal.
"""
import os
import subprocess
import sys
import tempfile

try:
    import tokenizers  # noqa: F401
except ImportError:
    print("check_live: the tokenizers module is not installed; skipped")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import gen_fixtures as g  # noqa: E402


def repo_texts():
    out = []
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(x for x in dirs if not x.startswith((".", "build")) and x != "fixtures")
        for f in sorted(files):
            if f.endswith((".c", ".h", ".md", ".py")):
                with open(os.path.join(d, f), "rb") as fh:
                    raw = fh.read()
                try:
                    out.append(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    pass
    return out


def main():
    tool = sys.argv[1]
    docs = repo_texts() + g.random_cases(n=2000, seed=7) + g.CORPUS
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        docs_path = os.path.join(tmp, "docs.bin")
        with open(docs_path, "wb") as f:
            for d in docs:
                b = d.encode("utf-8")
                f.write(b"%d\n" % len(b) + b + b"\n")
        toks = {
            "gpt2": g.byte_level_bpe(None, None, ["<|endoftext|>"], None, False, None, 4000,
                                     specials_normalized=True),
            "llama3": g.byte_level_bpe(g.LLAMA3_PAT, None, ["<|begin_of_text|>", "<|eot_id|>"],
                                       None, True, "<|begin_of_text|>", 4000),
            "qwen2": g.byte_level_bpe(g.QWEN2_PAT, g.normalizers.NFC(),
                                      ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None,
                                      False, None, 4000),
        }
        for name, tok in toks.items():
            path = os.path.join(tmp, name + ".json")
            tok.save(path)
            out = subprocess.run([tool, path, docs_path], capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{name}: tok_ids failed: {out.stderr}")
                return 1
            lines = out.stdout.split("\n")
            for i, d in enumerate(docs):
                want = " ".join(map(str, tok.encode(d, add_special_tokens=False).ids)) + " | " + \
                    " ".join(map(str, tok.encode(d, add_special_tokens=True).ids))
                if lines[i] != want:
                    bad += 1
                    if bad <= 5:
                        print(f"{name}: document {i} differs: {d[:80]!r}\n got  {lines[i][:200]}\n"
                              f" want {want[:200]}")
            print(f"{name}: {len(docs)} documents compared, vocab {tok.get_vocab_size()}")
    print("check_live: all ids equal" if not bad else f"check_live: {bad} documents differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
