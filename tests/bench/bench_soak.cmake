# bench_soak: load and soak -- 1,000,000 calls from 4 caller actors to 16 echo
# actors, or a whole job (--job), with every process's RSS sampled; fails on
# growth after warm-up (issue 12 item 6; a program, not a test). See README.md.
#   build/tests/bench/bench_soak [--calls N] > figures.jsonl
#   tests/bench/soak_job.sh            # the 10-minute calculator job
add_executable(bench_soak ${CMAKE_CURRENT_LIST_DIR}/bench_soak.c)
target_link_libraries(bench_soak PRIVATE manta PkgConfig::ZMQ)
