# bench_tok: encode MB/s of libmanta_tok against tokenizers (Rust) on one
# thread, measured in the same run (a program, not a test). See bench_tok.c.
#   MANTA_PYTHON=/path/to/python build/tests/bench/bench_tok [--reps N] > figures.jsonl
add_executable(bench_tok ${CMAKE_CURRENT_LIST_DIR}/bench_tok.c)
target_link_libraries(bench_tok PRIVATE manta_tok)
target_compile_definitions(bench_tok PRIVATE
  SOURCE_DIR="${PROJECT_SOURCE_DIR}"
  BENCH_TOK_SCRIPT="${CMAKE_CURRENT_LIST_DIR}/bench_tok.py")
