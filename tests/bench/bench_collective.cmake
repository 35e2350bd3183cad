# bench_collective: broadcast and reduce-scatter + all-gather against raw
# ZeroMQ measured in the same run (a program, not a test).
#   build/tests/bench/bench_collective [--quick]
add_executable(bench_collective ${CMAKE_CURRENT_LIST_DIR}/bench_collective.c)
target_link_libraries(bench_collective PRIVATE manta_collective)
