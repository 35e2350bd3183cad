# bench_rl: the RL system's figures against same-run baselines (a program, not
# a test): eta 4 vs eta 0 trained tokens/s under heavy-tailed tool latency,
# rollout scaling 1/2/4/8 with tool latency dominating, learner idle
# fraction, weight-sync bandwidth vs a raw ZeroMQ transfer. Jobs start
# through the job library (manta_job).
#   build/tests/bench/bench_rl [--quick] > figures.jsonl
add_executable(bench_rl ${CMAKE_CURRENT_LIST_DIR}/bench_rl.c)
target_link_libraries(bench_rl PRIVATE rl_calc_server manta_actors manta_job PkgConfig::ZMQ
                                       PkgConfig::CJSON)
target_compile_definitions(bench_rl PRIVATE SOURCE_DIR="${PROJECT_SOURCE_DIR}")
