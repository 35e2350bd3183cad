# bench_launch: time to launch and make ready 1..64 actors and to scale a group
# 4 -> 32, against bare fork+exec'd ZeroMQ processes (issue 4 section 6; a
# program, not a test). See README.md.
#   build/tests/bench/bench_launch [--quick] [--reps N] [--no-cli] > figures.jsonl
add_executable(bench_launch ${CMAKE_CURRENT_LIST_DIR}/bench_launch.c)
target_link_libraries(bench_launch PRIVATE manta PkgConfig::ZMQ)
