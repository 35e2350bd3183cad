# bench_runtime: actor calls, latency and objects against raw libzmq and Redis
# (issue 2 section 10; a program, not a test). See README.md.
#   build/tests/bench/bench_runtime [--quick] > figures.jsonl
add_executable(bench_runtime ${CMAKE_CURRENT_LIST_DIR}/bench_runtime.c)
target_link_libraries(bench_runtime PRIVATE manta PkgConfig::ZMQ PkgConfig::HIREDIS)
