/*
 * calc_server.h - the calc tool server (examples/calc_server.py) as a child
 * process on a free port, for the RL tests and benchmarks. The jobs
 * themselves start through the job library (runtime/job/manta_job.h) with
 * no_services set: the spec's `services:` entry has a fixed port, and tests
 * that run at the same time need a free one each.
 */
#ifndef RL_CALC_SERVER_H
#define RL_CALC_SERVER_H

/* Start `python3 SCRIPT --port 0 EXTRA` (EXTRA e.g. "--latency-ms 50
 * --latency-dist lognormal"; may be NULL) and read the port it prints
 * ("PORT N"). Returns its pid and writes *port; -1 on failure. */
int rl_start_calc_server(const char *script, const char *extra, int *port);
/* SIGTERM and reap; pid <= 0 is a no-op. */
void rl_stop_process(int pid);

#endif
